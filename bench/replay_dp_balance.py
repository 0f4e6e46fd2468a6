"""Replay: vLLM's internal data-parallel load balancer over two ranks — its own count-based rule
against a phase-weighted one — on the reasoning traces.

Two ranks, each a Meridian engine (its own scheduler and core, its own virtual H200) on one
virtual clock; every request goes to a rank at its arrival (``meridian.replay.dp``):

- ``count``: vLLM 0.32's ``DPLBAsyncMPClient`` rule, max(client_count × in-flight, waiting +
  running) + waiting × 6 × max(0, KV usage − 0.5), lowest wins, ties rotate;
- ``phase_weighted``: the same client ranking ranks by their core's ``phase_weighted_queue``
  (expected remaining output in fresh requests: a request past its thinking weighs less).

Both see what vLLM's DP coordinator publishes, every ``--stats-interval-ms`` (100, vLLM's; 0:
exact state at every arrival), through ``--api-servers`` API servers (2: what ``vllm serve
--data-parallel-size 2`` starts). ``--reference [SEED ...]`` adds stock vLLM ranks (FCFS) under
``count`` at those seeds (default: the first).
Workloads and profiles are ``bench/replay_ab.py``'s (azure: H200 / Qwen3-32B-class, mooncake:
H200 / Qwen3-8B-class), at twice a single engine's FCFS ~50 % load (two ranks) and at twice that;
each seed draws other reasoning lengths (and, on mooncake, other class labels) for the same
arrivals. Virtual time: the numbers do not depend on this machine's speed.

    .venv/bin/python bench/replay_dp_balance.py [--workloads azure mooncake] [--seeds 0 1 2]
        [--load-factors 1 2] [--stats-interval-ms 100] [--api-servers 2] [--reference [SEED ...]]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from development import HALF_LOAD, workloads, write_results  # noqa: E402
from meridian._core import Config  # noqa: E402
from meridian.offline.engine import offline_environment  # noqa: E402
from meridian.replay import traces  # noqa: E402
from meridian.replay.dp import dp_summary, replay_ranks  # noqa: E402
from meridian.replay.policies import policy_spec  # noqa: E402
from meridian.replay.profiles import Profile  # noqa: E402
from meridian.replay.runner import build_workload, check_classes  # noqa: E402
from meridian.replay.workload import model_dir_for, offline_requests  # noqa: E402

NUM_RANKS = 2
#: (rank policy, balancer): the comparison, then the optional stock reference.
ROWS = (("meridian", "count"), ("meridian", "phase_weighted"))
REFERENCE = ("vllm-fcfs", "count")

# Set in the parent before forking (workers inherit it): (workload, seed) -> (requests, options).
_WORK: dict[Any, Any] = {}


def label(policy: str, balancer: str) -> str:
    return f"{policy}/{balancer}"


def run_job(job: tuple[str, int, float, str, str]) -> tuple[tuple[str, int, float, str, str], dict[str, Any], float]:
    name, seed, factor, policy, balancer = job
    started = time.monotonic()
    requests, options = _WORK[(name, seed)]
    profile = Profile.load(options.profile)
    scaled = traces.scale_rate(requests, HALF_LOAD[name] * NUM_RANKS * factor)
    config = options.meridian_config
    run = replay_ranks(
        policy_spec(policy), offline_requests(scaled, profile, Config.from_json(json.dumps(config))), profile,
        balancer, num_ranks=NUM_RANKS, meridian_config=config, model_dir=model_dir_for(profile, options.cache_dir),
        stats_interval_ms=_WORK["stats_interval_ms"], num_api_servers=_WORK["api_servers"],
    )
    summary = dp_summary(run, label(policy, balancer))
    summary.pop("first_minute", None)
    return job, summary, time.monotonic() - started


def _s(ms: float | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.1f}"


def row(text: str, s: dict[str, Any], count: dict[str, Any] | None) -> str:
    ratio = s["goodput_rps"] / count["goodput_rps"] if count and count["goodput_rps"] else float("nan")
    ranks = "/".join(str(r["submitted"]) for r in s["ranks"])
    pre = s["preemptions"]
    return (f"{text:<34} {ranks:>9} {s['goodput_rps']:>9.3f} {ratio:>6.3f} {s['attainment'] * 100:>6.1f}% "
            f"{_s(s['ttfat_ms']['p50']):>9} {_s(s['ttfat_ms']['p90']):>8} {pre['think']:>6}/{pre['answer']:<4} "
            f"{s['throughput_tok_s']:>7.0f}")


HEADER = (f"{'seed  ranks/balancer':<34} {'per rank':>9} {'goodput/s':>9} {'×count':>6} {'attain':>7} "
          f"{'TTFAT p50':>9} {'p90 (s)':>8} {'preempt t/a':>11} {'tok/s':>7}")


def render(results: dict[str, Any]) -> None:
    for name, by_load in results.items():
        if name == "settings":
            continue
        for key, load in by_load.items():
            print(f"\n=== {name} ×{load['rate_scale']:.4g} (two ranks, single-engine FCFS ~50 % load × 2 × "
                  f"{key[1:]}), profile {load['profile']}, {load['num_requests']} requests")
            print(HEADER)
            ratios: dict[str, list[float]] = {}
            for seed, rows in load["seeds"].items():
                count = rows.get(label("meridian", "count"))
                for text, s in rows.items():
                    print(row(f"{seed:>4}  {text}", s, count))
                    if count and count["goodput_rps"]:
                        ratios.setdefault(text, []).append(s["goodput_rps"] / count["goodput_rps"])
            for text, values in ratios.items():
                if text == label("meridian", "count"):
                    continue
                spread = f"{min(values):.3f}-{max(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"
                print(f"      {text}: goodput ×count mean {statistics.fmean(values):.3f} over {len(values)} "
                      f"seeds (range {spread})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["azure", "mooncake"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--load-factors", nargs="+", type=float, default=[1.0, 2.0],
                        help="× (two ranks at single-engine FCFS ~50 %% load)")
    parser.add_argument("--stats-interval-ms", type=float, default=100.0,
                        help="the DP coordinator's publication interval (vLLM: 100); 0: exact state")
    parser.add_argument("--api-servers", type=int, default=2,
                        help="API servers, each with its own balancer (vllm serve --data-parallel-size 2: 2)")
    parser.add_argument("--duration-s", type=float, default=None, help="trace window length (default: replay_ab's)")
    parser.add_argument("--reference", nargs="*", type=int, default=None, metavar="SEED",
                        help="add stock vLLM FCFS ranks under count, at these seeds (none named: the first)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--render", type=Path, default=None, help="print the tables of an earlier run's JSON")
    args = parser.parse_args()
    if args.render:
        render(json.loads(args.render.read_text()))
        return 0
    started = time.time()
    available = workloads(0)
    reference_seeds = set(args.reference or args.seeds[:1]) if args.reference is not None else set()
    _WORK.update(stats_interval_ms=args.stats_interval_ms, api_servers=args.api_servers)
    results: dict[str, Any] = {"settings": {
        "num_ranks": NUM_RANKS, "stats_interval_ms": args.stats_interval_ms, "api_servers": args.api_servers,
        "seeds": args.seeds, "load_factors": args.load_factors, "half_load": HALF_LOAD,
        "reference_seeds": sorted(reference_seeds),
    }}
    jobs = []
    for name in args.workloads:
        for seed in args.seeds:
            options = replace(available[name].options, seed=seed)
            if args.duration_s is not None:
                options = replace(options, duration_s=args.duration_s)
            offline_environment(options.cache_dir)
            requests, workload = build_workload(options)
            check_classes(requests, options.meridian_config)
            _WORK[(name, seed)] = (requests, options)
            for factor in args.load_factors:
                load = results.setdefault(name, {}).setdefault(f"x{factor:g}", {
                    "rate_scale": HALF_LOAD[name] * NUM_RANKS * factor, "profile": options.profile,
                    "window_s": [options.start_s, options.duration_s], "num_requests": len(requests),
                    "reasoning_lengths": workload["reasoning_lengths"], "seeds": {}})
                load["seeds"][str(seed)] = {}
                rows = ROWS + ((REFERENCE,) if seed in reference_seeds else ())
                jobs += [(name, seed, factor, policy, balancer) for policy, balancer in rows]
    # The heaviest first, so the two workers finish together.
    jobs.sort(key=lambda j: -j[2])
    import vllm  # noqa: F401 - imported once here so forked workers inherit it

    context = multiprocessing.get_context("fork")
    with context.Pool(min(args.jobs, len(jobs))) as pool:
        for (name, seed, factor, policy, balancer), summary, wall_s in pool.imap_unordered(run_job, jobs):
            results[name][f"x{factor:g}"]["seeds"][str(seed)][label(policy, balancer)] = summary
            print(f"  done {name} seed {seed} ×{factor:g} {label(policy, balancer)}: goodput "
                  f"{summary['goodput_rps']:.3f}/s, ranks {[r['submitted'] for r in summary['ranks']]} "
                  f"({wall_s:.0f} s)", file=sys.stderr, flush=True)
    for name in args.workloads:  # rows in a fixed order whatever finished first
        for load in results[name].values():
            for seed, by_label in load["seeds"].items():
                load["seeds"][seed] = {label(p, b): by_label[label(p, b)] for p, b in (*ROWS, REFERENCE)
                                       if label(p, b) in by_label}
    render(results)
    print(f"\n({time.time() - started:.0f} s wall)")
    write_results(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
