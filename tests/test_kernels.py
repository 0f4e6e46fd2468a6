"""CUDA kernels without a GPU: every bundled `.cu` compiles with NVRTC for sm_90 (CuPy's low-level
binding needs no device), and the NumPy reference — the CPU path and the kernels' oracle —
matches direct float64 computations on random logits and hand-made signal sequences."""

from __future__ import annotations

import numpy as np
import pytest

from meridian._core import kernel_source
from meridian.kernels import KERNEL_FILES, SignalState, logits_stats_reference, update_signals_reference
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
        "signals.cu": ["update_signals"],
    }[name]
    # Local memory in these kernels means the per-thread accumulators spilled: a 5x slowdown.
    assert ".local" not in ptx, "kernel uses local memory"
    for entry in entries:
        assert f".entry {entry}(" in ptx, entry
    if name == "signals.cu":
        # Fused multiply-adds round differently from the CPU path's separate multiply and add.
        assert "fma.rn.f32" not in ptx, "signals.cu must compile without FMA contraction"


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


def test_signal_reference_on_a_hand_made_sequence() -> None:
    state = SignalState.zeros(4)
    # Slot 2: probe 1.0, token 0.5, probe 3.0, token 2.0 (high), in one step; slot 0: one token.
    update_signals_reference(state, [1.0, 0.5, 3.0, 2.0, 5.0], [1, 0, 1, 0, 0], [2, 0], [0, 4, 5],
                             eat_alpha=0.5, high_entropy_nats=1.0, rpdi_alpha=0.25)
    # EAT: first probe sets mean 1, var 0; second: d = 2, mean = 2, var = 0.5 * (0 + 0.5 * 4) = 1.
    assert (state.eat_mean[2], state.eat_var[2], state.eat_count[2]) == (2.0, 1.0, 2)
    # RPDI: 0.5 is low, 2.0 is high: local = 0 → 0 → 0.25.
    assert (state.rpdi_num_tokens[2], state.rpdi_num_high[2], state.rpdi_local_rate[2]) == (2, 1, 0.25)
    assert (state.rpdi_num_tokens[0], state.rpdi_num_high[0], state.rpdi_local_rate[0]) == (1, 1, 0.25)
    assert state.eat_count[1] == 0 and state.rpdi_num_tokens[3] == 0
    with pytest.raises(ValueError, match="distinct"):
        update_signals_reference(state, [1.0, 1.0], [0, 0], [1, 1], [0, 1, 2],
                                 eat_alpha=0.5, high_entropy_nats=1.0, rpdi_alpha=0.25)


def test_signal_reference_skips_non_finite_and_impossible_entropies() -> None:
    state = SignalState.zeros(1)
    update_signals_reference(state, [1.0, np.nan, np.inf, 40.0, 3.0, np.nan], [1, 1, 0, 0, 1, 0], [0], [0, 6],
                             eat_alpha=0.5, high_entropy_nats=1.0, rpdi_alpha=0.25)
    # Only the probes 1.0 and 3.0 count: mean 2, var 1; no ordinary row survives.
    assert (state.eat_mean[0], state.eat_var[0], state.eat_count[0]) == (2.0, 1.0, 2)
    assert (state.rpdi_num_tokens[0], state.rpdi_num_high[0], state.rpdi_local_rate[0]) == (0, 0, 0.0)
