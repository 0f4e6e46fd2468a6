"""CUDA kernels without a GPU: every bundled `.cu` compiles with NVRTC for sm_90 (CuPy's low-level
binding needs no device), and the NumPy reference — the kernels' oracle — matches direct float64
computations on random logits and on edge rows."""

from __future__ import annotations

import numpy as np
import pytest

from meridian._core import kernel_source
from meridian.kernels import KERNEL_FILES, logits_stats_reference
from meridian.kernels.launch import NVRTC_OPTIONS


@pytest.mark.parametrize("name", KERNEL_FILES)
def test_kernel_compiles_for_sm90_with_nvrtc(name: str) -> None:
    # `cupy.cuda.nvrtc` is an attribute alias of this module; CuPy's binding needs no device.
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    source = kernel_source(name)
    program = nvrtc.createProgram(source, name, [], [])
    try:
        nvrtc.compileProgram(program, ["--gpu-architecture=compute_90", *NVRTC_OPTIONS[name]])
    except nvrtc.NVRTCError as exc:  # pragma: no cover - the log is the useful part
        pytest.fail(f"{name} does not compile:\n{nvrtc.getProgramLog(program)}\n{exc}")
    ptx = nvrtc.getPTX(program)
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    entries = {
        "logits_stats.cu": [
            f"logits_stats_{dtype}{path}_k{k}" for dtype in ("f32", "bf16") for path in ("", "_scalar") for k in (2, 8)
        ],
    }[name]
    # Local memory in these kernels means the per-thread accumulators spilled: a 5x slowdown.
    assert ".local" not in ptx, "kernel uses local memory"
    for entry in entries:
        assert f".entry {entry}(" in ptx, entry


def test_reference_matches_direct_float64_on_random_logits() -> None:
    rng = np.random.default_rng()
    for rows, vocab in [(5, 1000), (3, 32_003), (1, 7)]:
        x = rng.standard_normal((rows, vocab)) * rng.uniform(0.5, 8.0)
        x[0, rng.integers(vocab, size=max(1, vocab // 10))] = -np.inf  # masked tokens
        targets = rng.integers(vocab, size=3)
        got = logits_stats_reference(x, targets)
        for r in range(rows):
            row = x[r][np.isfinite(x[r])]
            lse = np.log(np.sum(np.exp(row - row.max()))) + row.max()
            p = np.exp(row - lse)
            entropy = -np.sum(p * np.log(p))
            assert got.lse[r] == pytest.approx(lse, rel=1e-6)
            assert got.entropy[r] == pytest.approx(entropy, rel=1e-6)
            for k, t in enumerate(targets):
                want = np.exp(x[r, t] - lse) if np.isfinite(x[r, t]) else 0.0
                assert got.target_prob[r, k] == pytest.approx(want, rel=1e-6, abs=1e-300)
                assert got.target_rank[r, k] == int(np.sum(x[r] > x[r, t]))


def test_reference_edge_rows() -> None:
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, 0.0, 0.0], [100.0, -np.inf, 0.0]])
    got = logits_stats_reference(x, [0, 2])
    assert got.lse[0] == -np.inf and got.entropy[0] == 0.0 and list(got.target_prob[0]) == [0.0, 0.0]
    assert got.entropy[1] == pytest.approx(np.log(3.0)) and got.target_rank[1].tolist() == [0, 0]
    assert got.target_prob[2, 0] == pytest.approx(1.0) and got.target_rank[2].tolist() == [0, 1]
    with pytest.raises(ValueError, match="target ids"):
        logits_stats_reference(x, [3])
