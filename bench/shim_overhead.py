"""Per-step scheduler overhead: MeridianScheduler against stock vLLM's AsyncScheduler.

Both schedulers run the same steady decode batch (``--running`` requests, default 512, all past
prefill, nobody finishing) with no KV pressure. Each step calls ``schedule()`` and
``update_from_output()`` with one sampled token per request, exactly as the engine core would;
only those two calls are timed. Rounds of steps alternate between the two schedulers so machine
noise hits both alike. Prints the median per-step time of each, the ratio, and the added µs.

    python bench/shim_overhead.py [--running 512] [--rounds 10] [--steps-per-round 20]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent




def build(cls: type[Any], model: Path, running: int, metrics: bool = False) -> Any:
    from meridian.offline.engine import EngineSpec, build_scheduler

    spec = EngineSpec(
        model_dir=model,
        num_blocks=running * 12 + 1,
        block_size=16,
        max_num_seqs=running,
        max_num_batched_tokens=max(8192, running),
        max_model_len=4096,
        # A fixed step-time model: here a "step" is only the scheduler's own time, which the
        # online fit would learn and answer with a smaller budget, scheduling less work than stock.
        additional_config={"meridian": {"step_time": {"online_fit": False}, "metrics": metrics}},
    )
    return build_scheduler(cls, spec)


def fill(scheduler: Any, running: int) -> None:
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    from meridian.offline.tiny import EOS, WORD_IDS

    init_none_hash(sha256)
    hasher = get_request_block_hasher(scheduler.block_size, sha256)
    now = time.time()
    for i in range(running):
        params = SamplingParams(max_tokens=3000, temperature=0.0)
        params.update_from_generation_config({}, EOS)
        prompt = [WORD_IDS[(i + j) % len(WORD_IDS)] for j in range(64)]
        scheduler.add_request(
            Request(request_id=f"r{i}", prompt_token_ids=prompt, sampling_params=params, pooling_params=None,
                    arrival_time=now, block_hasher=hasher)
        )


def step(scheduler: Any) -> tuple[float, int]:
    """One engine step; returns the time spent in the two scheduler calls and the batch size."""
    from vllm.v1.outputs import ModelRunnerOutput

    from meridian.offline.tiny import WORD_IDS

    t0 = time.perf_counter()
    output = scheduler.schedule()
    t1 = time.perf_counter()
    req_ids = list(output.num_scheduled_tokens)
    sampled = [[] if scheduler.requests[r].is_prefill_chunk else [WORD_IDS[0]] for r in req_ids]
    runner_output = ModelRunnerOutput(
        req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)}, sampled_token_ids=sampled,
        logprobs=None, prompt_logprobs_dict={}, pooler_output=[],
    )
    t2 = time.perf_counter()
    scheduler.update_from_output(output, runner_output)
    t3 = time.perf_counter()
    return (t1 - t0) + (t3 - t2), len(req_ids)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps-per-round", type=int, default=20)
    args = parser.parse_args()

    from meridian.offline.engine import offline_environment
    from meridian.offline.tiny import tiny_model_dir

    offline_environment(REPO / ".cache")
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from meridian.vllm import MeridianScheduler

    model = tiny_model_dir(REPO / ".cache")
    schedulers = {"vllm-fcfs": build(AsyncScheduler, model, args.running),
                  "meridian": build(MeridianScheduler, model, args.running),
                  "meridian+metrics": build(MeridianScheduler, model, args.running, metrics=True)}
    for s in schedulers.values():
        fill(s, args.running)
        for _ in range(30):  # prefill everything, then settle into decode
            step(s)
        assert step(s)[1] == args.running, "every request must decode each step"

    times: dict[str, list[float]] = {name: [] for name in schedulers}
    for _ in range(args.rounds):
        for name, s in schedulers.items():
            times[name].extend(step(s)[0] for _ in range(args.steps_per_round))
    stock = statistics.median(times["vllm-fcfs"]) * 1e6
    ours = statistics.median(times["meridian"]) * 1e6
    print(f"per-step schedule()+update_from_output() at {args.running} running requests "
          f"(median of {args.rounds * args.steps_per_round} steps, interleaved):")
    print(f"  stock vLLM AsyncScheduler : {stock:9.1f} us")
    print(f"  MeridianScheduler         : {ours:9.1f} us")
    print(f"  ratio                     : {ours / stock:9.2f} x   (+{ours - stock:.1f} us per step)")
    # Publishing refreshes the gauges every 0.25 s (and observes histograms as requests finish):
    # its cost shows in the mean, not the median. This batch never finishes a request.
    plain, published = (statistics.fmean(times[n]) * 1e6 for n in ("meridian", "meridian+metrics"))
    refresh_us = time_refresh(schedulers["meridian+metrics"]) * 1e6
    shutil.rmtree(schedulers["meridian+metrics"].metrics.directory, ignore_errors=True)
    print(f"Meridian's series on /metrics (mean per step, {len(times['meridian'])} steps each):")
    print(f"  without / with publishing : {plain:9.1f} / {published:.1f} us   ({(published / plain - 1) * 100:+.1f} %)")
    print(f"  one refresh of the gauges : {refresh_us:9.1f} us   (at most every 0.25 s: "
          f"{refresh_us / 250_000 * 100:.3f} % of the engine's time)")
    return 0


def time_refresh(scheduler: Any, repeats: int = 50) -> float:
    """Median seconds of one forced refresh of the gauges and counters at this batch."""
    samples = []
    for _ in range(repeats):
        scheduler.metrics._last_gauges_s = float("-inf")
        t0 = time.perf_counter()
        scheduler._refresh_metrics()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


if __name__ == "__main__":
    raise SystemExit(main())
