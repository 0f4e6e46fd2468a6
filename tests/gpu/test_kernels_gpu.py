"""The CUDA kernels against the NumPy reference on a real device (skipped without CUDA; the full
check with timings is bench/gpu_check.sh)."""

from __future__ import annotations

import numpy as np
import pytest

from meridian.kernels import logits_stats_reference

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize(("rows", "vocab", "num_targets", "offset"), [(64, 151_936, 2, 0), (7, 50_257, 5, 1)])
def test_logits_stats_matches_reference(dtype_name: str, rows: int, vocab: int, num_targets: int, offset: int) -> None:
    import torch

    from meridian.kernels.launch import DeviceLogitsStats, logits_stats

    dtype = getattr(torch, dtype_name)
    base = (torch.randn(rows * vocab + offset, device="cuda") * 4).to(dtype)
    x = base[offset:].view(rows, vocab)
    x[0, torch.randint(0, vocab, (vocab // 50,), device="cuda")] = -float("inf")
    targets = torch.randint(0, vocab, (num_targets,), device="cuda", dtype=torch.int32)
    out = DeviceLogitsStats.empty(rows, num_targets, x.device)
    out.entropy.fill_(float("nan"))
    out.target_rank.fill_(-1)
    logits_stats(x, targets, out=out)
    torch.cuda.synchronize()
    ref = logits_stats_reference(x.float().cpu().numpy().astype(np.float64), targets.cpu().numpy())
    np.testing.assert_allclose(out.lse.cpu().numpy(), ref.lse, rtol=1e-5)
    np.testing.assert_allclose(out.entropy.cpu().numpy(), ref.entropy, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(out.target_prob.cpu().numpy(), ref.target_prob, rtol=1e-4, atol=1e-12)
    np.testing.assert_array_equal(out.target_rank.cpu().numpy(), ref.target_rank)
