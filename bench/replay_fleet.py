"""Fleet replay (``meridian.replay.fleet``): N engines behind a router model, in virtual time, with
the router's retries on sheds.

``live FOLDER``: the very workload of a ``bench/fleet_ab.py`` run through two engines on a profile
of this CPU (fitted to a live Meridian step log, its step times scaled by ``--scale``, or by the
factor that makes the stock arm's replay meet as many requests as its live rounds' median:
``--scale stock``), every arm of the run side by side, beside the live medians: does the replay
point the same way?

``traces``: corpus scenarios (the public traces) at N engines, each engine at the scenario's
FCFS-50 % rate on average (``--loads-from``) times ``--rate-factor``, ``--per-engine`` requests
per engine: requests meeting every target per engine, stock vLLM (also with vLLM 0.34's
cache-aware admission, its window docs-sized on the whole workload) and Meridian under each
router, with and without retries (``--arms`` picks some).

    .venv/bin/python bench/replay_fleet.py live bench/results/fleet_ab_long_2026-12-06 \\
        --step-log bench/results/live_overload_servegen_long_2026-12-06/steps-1.5x-0-meridian.jsonl.gz --scale stock
    .venv/bin/python bench/replay_fleet.py traces --scenarios azure-conv-01 mooncake-03 --engines 2,8,32 \\
        --loads-from bench/results/corpus_2026-12-03-final/corpus.json
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from meridian._core import Config
from meridian.demo.loadgen import LIVE_MODELS, live_profile, workload_trace
from meridian.offline.engine import OfflineRequest, offline_environment
from meridian.replay.fleet import Retries, Router, fleet_summary, replay_fleet
from meridian.replay.policies import policy_spec, replay_engine, with_sized_window
from meridian.replay.profiles import Profile, fit_profile
from meridian.replay.workload import model_dir_for, offline_requests

REPO = Path(__file__).resolve().parent.parent
#: A fleet A/B arm → (the replay's policy, router, attempts in all). ``meridian-503`` differs
#: from ``meridian`` only in the router's circuit breaker, which the replay does not model.
LIVE_ARMS = {
    "stock": ("vllm-fcfs", "round_robin", 3),
    "fcfs+cap": ("vllm-fcfs+cap={cap}", "round_robin", 3),
    "meridian": ("meridian", "round_robin", 3),
    "meridian+p2": ("meridian", "power_of_two", 3),
    "meridian-noretry": ("meridian", "round_robin", 1),
}
#: The traces mode's configurations: (label, policy, router, attempts in all).
TRACE_ARMS = [
    ("stock rr", "vllm-fcfs", "round_robin", 3),
    ("stock least", "vllm-fcfs", "least_requests", 3),
    ("stock cache-aware rr", "vllm-fcfs+cache-aware", "round_robin", 3),
    ("meridian rr", "meridian", "round_robin", 3),
    ("meridian rr, no retries", "meridian", "round_robin", 1),
    ("meridian least", "meridian", "least_requests", 3),
    ("meridian p2", "meridian", "power_of_two", 3),
    ("meridian saturation", "meridian", "saturation", 3),
]


def scaled(profile: Profile, factor: float) -> Profile:
    """``profile`` with every step-time coefficient times ``factor`` (a slower or faster engine)."""
    cost = profile.cost
    fields = {f.name: getattr(cost, f.name) * factor for f in dataclasses.fields(cost)}
    return dataclasses.replace(profile, cost=dataclasses.replace(cost, **fields), name=f"{profile.name}x{factor:.3g}")


def run_fleet(policy: str, router: str, attempts: int, requests: list[OfflineRequest], profile: Profile,
              config: dict[str, Any], num_engines: int, cache_dir: Path, seed: int = 0,
              batch_queue_size: int | None = None) -> dict[str, Any]:
    # vLLM's cache-aware window, docs-sized, is sized on the whole workload (each engine's share
    # has the same means): an engine behind the router sees its requests one by one.
    spec = with_sized_window(policy_spec(policy), requests, profile, config)
    engines = [replay_engine(spec, [], profile, meridian_config=config, model_dir=model_dir_for(profile, cache_dir),
                             batch_queue_size=batch_queue_size) for _ in range(num_engines)]
    run = replay_fleet(engines, requests, Router(router, num_engines, seed=seed), Retries(attempts=attempts))
    summary = fleet_summary(run, policy)
    if spec.cache_aware_window is not None:
        summary["cache_aware_window"] = spec.cache_aware_window
    return summary


def live_mode(args: argparse.Namespace) -> int:
    results = json.loads((args.folder / "results.json").read_text())
    settings = results["settings"]
    model = LIVE_MODELS[settings["model"]]
    kv_tokens = settings.get("kv_cache_tokens") or model.kv_cache_tokens
    step_log = args.step_log
    if args.scale not in (None, "stock"):
        try:
            if not float(args.scale) > 0:
                raise ValueError
        except ValueError:
            print(f"--scale {args.scale!r}: expected a positive factor or 'stock'", file=sys.stderr)
            return 2
    if step_log.suffix == ".gz":
        plain = args.cache_dir / f"replay-fleet-{step_log.stem}"
        with gzip.open(step_log, "rt") as src:
            plain.write_text(src.read())
        step_log = plain
    fitted = fit_profile(step_log, live_profile(settings["model"], kv_tokens), "live-fleet")
    config = {"classes": model.meridian_classes(), "default_class": "standard"}
    traces = workload_trace(args.folder / f"workload-{results['load']:g}x.jsonl")
    requests = [dataclasses.replace(r, max_tokens=model.max_tokens)
                for r in offline_requests(traces, fitted, Config.from_json(json.dumps(config)))]
    rounds = results["rounds"]
    live = {arm: statistics.median(r["good_requests"] for r in rounds if r["policy"] == arm)
            for arm in dict.fromkeys(r["policy"] for r in rounds)}

    def replay(arm: str, profile: Profile) -> dict[str, Any]:
        policy, router, attempts = LIVE_ARMS[arm]
        # vLLM's CPU build schedules synchronously: one step in flight, as live.
        return run_fleet(policy.format(cap=results["cap"]), router, attempts, requests, profile, config, 2,
                         args.cache_dir, batch_queue_size=1)

    factor = 1.0
    if args.scale == "stock":
        low, high = 0.5, 6.0
        for _ in range(8):  # bisection: the stock replay's count falls as the engines slow down
            factor = (low * high) ** 0.5
            good = replay("stock", scaled(fitted, factor))["good"]
            print(f"  scale {factor:.3f}: stock replay {good} vs live {live['stock']:g}", flush=True)
            if good > live["stock"]:
                low = factor
            else:
                high = factor
    elif args.scale is not None:
        factor = float(args.scale)
    profile = scaled(fitted, factor)
    out: dict[str, Any] = {"profile": profile.name, "fit": fitted.sources.get("fit"), "scale": factor, "arms": {}}
    for arm in LIVE_ARMS:
        if arm not in live:
            continue
        s = replay(arm, profile)
        out["arms"][arm] = {"replay_good": s["good"], "live_good_median": live[arm],
                            "replay_shed": s["shed"], "replay_retries": s["retries"],
                            "per_class_replay": {c: v["good"] for c, v in s["per_class"].items()}}
        print(f"  {arm:17s} replay {s['good']:4d}  live {live[arm]:g}  shed {s['shed']}  retries {s['retries']}", flush=True)
    for arm, a in out["arms"].items():
        if arm != "stock" and "stock" in out["arms"]:
            a["replay_over_stock"] = a["replay_good"] / max(out["arms"]["stock"]["replay_good"], 1)
            a["live_over_stock"] = a["live_good_median"] / max(out["arms"]["stock"]["live_good_median"], 1)
    (args.folder / "replay_fleet.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.folder / 'replay_fleet.json'}")
    return 0


def traces_mode(args: argparse.Namespace) -> int:
    from meridian.replay import traces as trace_ops
    from meridian.replay.corpus import loads_of, make_corpus, scenario_config, scenario_requests

    scenarios = {s.name: s for s in make_corpus(seed=args.seed)}
    loads = loads_of(args.loads_from)
    out: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    unknown = [name for name in args.scenarios if name not in scenarios or name not in loads]
    if unknown:
        print(f"unknown scenario(s) {', '.join(unknown)}: expected corpus scenarios with a calibrated load in "
              f"{args.loads_from} ({', '.join(sorted(loads))})", file=sys.stderr)
        return 2
    for name in args.scenarios:
        scenario = scenarios[name]
        rate_per_engine = loads[name][0.5][0] * args.rate_factor
        profile = Profile.load(scenario.profile)
        config = scenario_config(scenario)
        for n in args.engines:
            wanted = args.per_engine * n
            try:
                base = scenario_requests(dataclasses.replace(scenario, num_requests=wanted))
            except Exception as exc:  # noqa: BLE001 - a trace too short for this fleet: said, skipped
                print(f"{name} N={n}: {exc}", flush=True)
                continue
            requests = offline_requests(trace_ops.scale_rate(base, rate_per_engine * n), profile,
                                        Config.from_json(json.dumps(config)))
            for label, policy, router, attempts in TRACE_ARMS:
                key = f"{name} x{args.rate_factor:g} N={n} {label}"
                if key in out or (args.arms and label not in args.arms):
                    continue
                started = time.monotonic()
                s = run_fleet(policy, router, attempts, requests, profile, config, n, args.cache_dir, seed=args.seed)
                out[key] = {"scenario": name, "engines": n, "label": label, "rate_factor": args.rate_factor,
                            "rate_per_engine": rate_per_engine,
                            "requests": len(requests), "good": s["good"], "good_per_engine": s["good_per_engine"],
                            "shed": s["shed"], "retries": s["retries"], "throughput_tok_s": s["throughput_tok_s"],
                            "per_class": {c: v["good"] for c, v in s["per_class"].items()},
                            **({"cache_aware_window": s["cache_aware_window"]} if "cache_aware_window" in s else {}),
                            "wall_s": time.monotonic() - started}
                print(f"{key:48s} good {s['good']:6d} ({s['good_per_engine']:.1f}/engine)  shed {s['shed']:5d}  "
                      f"retries {s['retries']:5d}  ({time.monotonic() - started:.0f} s)", flush=True)
                args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".cache")
    sub = parser.add_subparsers(dest="mode", required=True)
    live = sub.add_parser("live", help="a fleet A/B run's workload, replayed")
    live.add_argument("folder", type=Path)
    live.add_argument("--step-log", type=Path, required=True, help="a live Meridian step log to fit the profile to")
    live.add_argument("--scale", default=None, help="a factor on the step times, or 'stock' to match the stock arm")
    tr = sub.add_parser("traces", help="corpus scenarios at N engines")
    tr.add_argument("--scenarios", nargs="+", required=True)
    tr.add_argument("--engines", type=lambda s: [int(x) for x in s.split(",")], default=[2, 8, 32])
    tr.add_argument("--per-engine", type=int, default=200, help="requests per engine")
    tr.add_argument("--rate-factor", type=float, default=1.0,
                    help="each engine's rate as a multiple of the scenario's FCFS-50 %% rate (a short run needs more "
                         "to build the queue the whole scenario builds)")
    tr.add_argument("--loads-from", type=Path, required=True, help="a corpus.json with the FCFS-50 %% rates")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--arms", nargs="+", default=None,
                    help=f"only these configurations (labels: {', '.join(a[0] for a in TRACE_ARMS)})")
    tr.add_argument("--out", type=Path, default=REPO / "bench" / "results" / f"replay_fleet_{time.strftime('%Y-%m-%d')}.json")
    args = parser.parse_args()
    offline_environment(args.cache_dir)
    return live_mode(args) if args.mode == "live" else traces_mode(args)


if __name__ == "__main__":
    sys.exit(main())
