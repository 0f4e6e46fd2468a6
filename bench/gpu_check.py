"""Kernel check and timing for a lent GPU (run through bench/gpu_check.sh; about 2 minutes).

1. Ceiling: device-to-device copy bandwidth (bytes read + written), measured here.
2. Correctness: ``logits_stats`` (fp32 and bf16, vector and scalar paths, odd vocabularies,
   masked tokens, an all -inf row) against the NumPy float64 reference on fresh random inputs; outputs are poisoned first, so an unwritten element fails.
3. Timing: median of CUDA-event-timed launches over rotating input buffers larger than L2, as
   achieved read bandwidth against the copy ceiling (target ≥ 80% at 256 × 151,936 fp32).
4. Side stream: a proxy decode step (bf16 GEMMs of an 8B-class layer stack) with and without
   the statistics kernel launched on a second stream after an event (target: < 1% added).
A table comes last; the full numbers also go to $OUT/gpu_check.json when OUT is set.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import numpy as np
import torch

from meridian.kernels import logits_stats_reference
from meridian.kernels.launch import DeviceLogitsStats, logits_stats

DEV = torch.device("cuda", 0)
ROWS = []  # (name, value, note) for the final table
FAILED = []


def record(name: str, value: str, note: str = "") -> None:
    ROWS.append((name, value, note))
    print(f"{name:<44} {value:>16}  {note}", flush=True)


def time_ms(fn, *, warmup: int = 3, iters: int = 30, sleep_cycles: int = 100_000_000) -> float:
    """Mean device time of ``fn`` over ``iters`` back-to-back calls. A spin kernel first keeps the
    GPU busy (~50 ms) while the host enqueues every call, so host launch cost stays out of the
    number and the launches run back to back."""
    for _ in range(warmup):
        fn(0)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(sleep_cycles)
    start.record()
    for i in range(iters):
        fn(i)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def host_launch_us(fn, iters: int = 200) -> float:
    """Host time per call of ``fn`` (the launch path's Python and driver cost)."""
    fn(0)
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    t0 = time.perf_counter()
    for i in range(iters):
        fn(i)
    host = (time.perf_counter() - t0) / iters * 1e6
    torch.cuda.synchronize()
    return host


def copy_ceiling_gbs() -> float:
    n = 1 << 29  # 2 GiB of fp32
    a = torch.randn(n, device=DEV)
    b = torch.empty_like(a)
    t = time_ms(lambda i: b.copy_(a), iters=20, sleep_cycles=10_000_000)
    del a, b
    return 2 * n * 4 / (t * 1e-3) / 1e9


def random_logits(rows: int, vocab: int, dtype: torch.dtype, *, stride: int | None = None, offset: int = 0,
                  masked: bool = True, all_masked_row: bool = False) -> torch.Tensor:
    """Fresh random logits in ``dtype``, laid out with the given row stride and element offset."""
    stride = stride or vocab
    scale = float(np.random.uniform(1.0, 6.0))
    base = (torch.randn(rows * stride + offset, device=DEV) * scale).to(dtype)
    x = base[offset:].as_strided((rows, vocab), (stride, 1))
    if masked:
        idx = torch.randint(0, vocab, (max(1, vocab // 100),), device=DEV)
        x[0, idx] = -float("inf")
    if all_masked_row and rows > 1:
        x[rows - 1] = -float("inf")
    return x


def check_logits_stats(rows: int, vocab: int, dtype: torch.dtype, num_targets: int = 2, **kw: object) -> None:
    x = random_logits(rows, vocab, dtype, **kw)  # type: ignore[arg-type]
    targets = torch.randint(0, vocab, (num_targets,), device=DEV, dtype=torch.int32)
    out = DeviceLogitsStats.empty(rows, num_targets, DEV)
    for t in (out.lse, out.entropy, out.target_prob):
        t.fill_(float("nan"))
    out.target_rank.fill_(-7)
    logits_stats(x, targets, out=out)
    torch.cuda.synchronize()
    ref = logits_stats_reference(x.float().cpu().numpy().astype(np.float64), targets.cpu().numpy())
    got_lse, got_ent = out.lse.cpu().numpy(), out.entropy.cpu().numpy()
    got_p, got_r = out.target_prob.cpu().numpy(), out.target_rank.cpu().numpy()
    written = not (np.isnan(got_lse).any() or np.isnan(got_ent).any() or np.isnan(got_p).any() or (got_r < 0).any())
    finite = np.isfinite(ref.lse)
    def rel(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
    err_lse = rel(got_lse[finite], ref.lse[finite])
    lse_inf_ok = bool(np.all(np.isneginf(got_lse[~finite])))
    err_ent = rel(got_ent, ref.entropy)
    err_p = rel(got_p, ref.target_prob)
    ranks_ok = bool(np.array_equal(got_r, ref.target_rank))
    ok = written and lse_inf_ok and ranks_ok and max(err_lse, err_ent, err_p) < 1e-4
    name = f"stats {rows}x{vocab} {str(dtype).split('.')[-1]} t={num_targets} {kw or ''}"
    record(name, "ok" if ok else "FAIL", f"rel lse {err_lse:.1e} ent {err_ent:.1e} prob {err_p:.1e} ranks {'exact' if ranks_ok else 'DIFF'}")
    if not ok:
        FAILED.append(name)


def check_meter(dtype: torch.dtype) -> None:
    """The logits processor's side-stream path (``CudaMeter``): tagged rows come back once,
    without a device sync, and match the reference."""
    from meridian.kernels.meter import CudaMeter

    rng = np.random.default_rng()
    logits = random_logits(48, 151_936, dtype, masked=False)
    rows = sorted(rng.choice(48, 20, replace=False).tolist())
    end_id = int(rng.integers(0, 151_936))
    meter = CudaMeter(DEV)
    meter.submit(logits, rows, [("row", r) for r in rows], end_id)
    got: list = []
    deadline = time.monotonic() + 5.0
    while len(got) < len(rows) and time.monotonic() < deadline:
        got.extend(meter.collect())
        time.sleep(0.001)
    ref = logits_stats_reference(logits[rows].float().cpu().numpy(), [end_id])
    by_row = {tag[1]: values for tag, values in got}
    ok = sorted(by_row) == rows and len(got) == len(rows) and not meter.collect()
    worst = 0.0
    for i, row in enumerate(rows):
        if row not in by_row:
            continue
        entropy, prob, rank = by_row[row]
        worst = max(worst, abs(entropy - ref.entropy[i]) / max(1.0, abs(ref.entropy[i])), abs(prob - ref.target_prob[i, 0]))
        ok = ok and rank == int(ref.target_rank[i, 0])
    ok = ok and worst < 1e-5
    name = "f32" if dtype == torch.float32 else "bf16"
    record(f"side-stream meter {name} 20 of 48 rows", "ok" if ok else "FAIL", f"max rel diff {worst:.1e}")
    if not ok:
        FAILED.append(f"meter {name}")


def time_logits_stats(rows: int, vocab: int, dtype: torch.dtype, ceiling_gbs: float) -> dict[str, float]:
    buffers = [random_logits(rows, vocab, dtype, masked=False) for _ in range(3)]
    targets = torch.tensor([7, 151_000 % vocab], device=DEV, dtype=torch.int32)
    out = DeviceLogitsStats.empty(rows, 2, DEV)
    launch = lambda i: logits_stats(buffers[i % 3], targets, out=out)  # noqa: E731
    t = time_ms(launch, iters=50)
    nbytes = rows * vocab * buffers[0].element_size()
    gbs = nbytes / (t * 1e-3) / 1e9
    name = f"time stats {rows}x{vocab} {str(dtype).split('.')[-1]}"
    record(name, f"{t * 1e3:.1f} us", f"{gbs:.0f} GB/s = {100 * gbs / ceiling_gbs:.0f}% of copy")
    host = host_launch_us(launch)
    record("  host cost per launch", f"{host:.1f} us", "CuPy launch path")
    return {"us": t * 1e3, "gbs": gbs, "fraction_of_copy": gbs / ceiling_gbs, "host_us": host}


def side_stream_overhead() -> dict[str, float]:
    # Proxy decode step of an 8B-class model for 256 requests: 32 layers of attention-projection
    # and MLP GEMMs in bf16, then the LM head producing fp32 logits [256 × 151,936].
    batch, hidden, inter, vocab = 256, 4096, 14336, 151_936
    h = torch.randn(batch, hidden, device=DEV, dtype=torch.bfloat16)
    w_qkvo = torch.randn(hidden, 4 * hidden, device=DEV, dtype=torch.bfloat16) / 64
    w_up = torch.randn(hidden, 2 * inter, device=DEV, dtype=torch.bfloat16) / 64
    w_down = torch.randn(inter, hidden, device=DEV, dtype=torch.bfloat16) / 128
    w_head = torch.randn(hidden, vocab, device=DEV, dtype=torch.bfloat16) / 64
    targets = torch.tensor([7], device=DEV, dtype=torch.int32)
    side = torch.cuda.Stream(DEV)
    out = DeviceLogitsStats.empty(batch, 1, DEV)

    def step(mode: str) -> None:
        x = h
        for _ in range(32):
            x = (x @ w_qkvo)[:, :hidden]
            x = (x @ w_up)[:, :inter] @ w_down
        logits = (x @ w_head).float()
        if mode == "side":
            ready = torch.cuda.Event()
            ready.record()
            side.wait_event(ready)
            logits_stats(logits, targets, out=out, stream=side)
            logits.record_stream(side)
        elif mode == "same":
            logits_stats(logits, targets, out=out)

    # Interleaved repeats: the numbers are close, so take medians of several alternating runs.
    runs: dict[str, list[float]] = {"none": [], "side": [], "same": []}
    for _ in range(5):
        for mode in runs:
            runs[mode].append(time_ms(lambda i, m=mode: step(m), iters=10))
    torch.cuda.synchronize()
    base, with_stats, same = (statistics.median(runs[m]) for m in ("none", "side", "same"))
    added = (with_stats - base) / base
    spread = (max(runs["none"]) - min(runs["none"])) / base
    record("proxy decode step (8B, 256 reqs)", f"{base:.2f} ms", f"bf16 GEMMs + LM head; run-to-run spread {100 * spread:.1f}%")
    record("  + stats kernel on a side stream", f"{with_stats:.2f} ms", f"added {100 * added:+.2f}%")
    record("  + stats kernel on the same stream", f"{same:.2f} ms", f"added {100 * (same - base) / base:+.2f}%")
    return {"step_ms": base, "with_stats_ms": with_stats, "same_stream_ms": same, "added_fraction": added,
            "runs": runs}


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(DEV)
    print(f"device: {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}", flush=True)
    started = time.monotonic()
    ceiling = copy_ceiling_gbs()
    record("copy ceiling (read + write)", f"{ceiling:.0f} GB/s", "2 GiB device-to-device")
    for dtype in (torch.float32, torch.bfloat16):
        check_logits_stats(256, 151_936, dtype)
        check_logits_stats(33, 50_257, dtype, all_masked_row=True)
        check_logits_stats(5, 1001, dtype, stride=1003)
        check_logits_stats(3, 129, dtype, offset=1)
        check_logits_stats(17, 151_936, dtype, num_targets=5)
        check_logits_stats(4, 4099, dtype, num_targets=8, offset=1)
    check_meter(torch.float32)
    check_meter(torch.bfloat16)
    timings = {
        "f32_256x151936": time_logits_stats(256, 151_936, torch.float32, ceiling),
        "bf16_256x151936": time_logits_stats(256, 151_936, torch.bfloat16, ceiling),
        "f32_64x151936": time_logits_stats(64, 151_936, torch.float32, ceiling),
    }
    overhead = side_stream_overhead()
    print(f"\n=== summary ({time.monotonic() - started:.0f} s) ===")
    for name, value, note in ROWS:
        print(f"{name:<44} {value:>16}  {note}")
    print("FAILED: " + ", ".join(FAILED) if FAILED else "all checks passed")
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "gpu_check.json"), "w") as f:
            json.dump({"device": props.name, "copy_gbs": ceiling, "timings": timings, "side_stream": overhead,
                       "rows": ROWS, "failed": FAILED}, f, indent=2)
    return 1 if FAILED else 0


if __name__ == "__main__":
    raise SystemExit(main())
