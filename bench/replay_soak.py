"""Replay soak (issue 25, part 2): a million engine steps of random trace mixes, every policy, the
engine's invariants checked after every step and the cores' footprints sampled at every drain
(``meridian.replay.soak``).

The steps are split evenly over the policies; each policy soaks in its own process (steps that scheduled tokens; the
idle ones, paced answers waiting, are counted apart) (one engine, one scheduler, one core for the whole run), two at a time on two cores. Every segment draws its
family from the bundled Azure excerpt and, where ``../shared/traces`` has them, the public Azure
and Mooncake traces. Prints one line per policy and writes ``summary.json`` (and each policy's
full report) under ``--out``. Exit status 1 when any invariant was violated.

    .venv/bin/python bench/replay_soak.py [--steps 1000000] [--seed 0] [--policies ...]
        [--jobs 2] [--out bench/results/replay_soak_DATE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from meridian.replay.policies import POLICIES  # noqa: E402
from meridian.replay.soak import run_soak  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"


def _one(job: tuple[str, int, int, str]) -> dict[str, Any]:
    policy, num_steps, seed, out = job
    report = run_soak(policy, num_steps, seed=seed, cache_dir=REPO / ".cache", shared=SHARED if SHARED.is_dir() else None)
    payload = report.to_json()
    (Path(out) / f"{policy}.json").write_text(json.dumps(payload, indent=1) + "\n")
    return payload


def _since(memory: dict[str, Any], core: str) -> str:
    last = memory.get(f"{core}_heap_last_change")
    return "-" if not last else f"{last['requests_since']:,} requests"


def _line(p: dict[str, Any]) -> str:
    memory = p["memory"]

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:+.2f} %"

    return (f"{p['policy']:<14} {p['num_steps']:>9,} steps (+{p['num_idle_steps']:,} idle) {p['num_segments']:>4} segments {p['num_finished']:>7,} requests "
            f"{p['num_steps'] / p['wall_s']:>6,.0f} steps/s  violations {p['num_violations']}  "
            f"core heap {pct(memory.get('core_heap_growth'))} (same for the last {_since(memory, 'core')})  "
            f"observer heap {pct(memory.get('observer_heap_growth'))} (same for the last {_since(memory, 'observer')})  "
            f"RSS {pct(memory.get('rss_growth'))}  {dict(sorted(p['finish_reasons'].items()))}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1_000_000, help="engine steps in all, split over the policies")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / f"replay_soak_{datetime.date.today()}")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    per_policy = -(-args.steps // len(args.policies))
    jobs = [(policy, per_policy, args.seed, str(args.out)) for policy in args.policies]
    started = time.perf_counter()
    import vllm  # noqa: F401 - imported once (~20 s) so forked workers inherit it

    with multiprocessing.get_context("fork").Pool(min(args.jobs, len(jobs)), maxtasksperchild=1) as pool:
        results = []
        for payload in pool.imap_unordered(_one, jobs):
            print(_line(payload), flush=True)
            results.append(payload)
    wall_s = time.perf_counter() - started
    total_steps = sum(p["num_steps"] for p in results)
    total_violations = sum(p["num_violations"] for p in results)
    summary = {
        "steps_asked": args.steps, "seed": args.seed, "steps": total_steps, "wall_s": round(wall_s, 1),
        "requests": sum(p["num_finished"] for p in results), "violations": total_violations,
        "policies": {p["policy"]: {k: v for k, v in p.items() if k not in ("samples", "segments")} for p in results},
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{total_steps:,} steps, {summary['requests']:,} requests, {total_violations} violations in {wall_s:.0f} s "
          f"({total_steps / wall_s:,.0f} steps/s on {min(args.jobs, len(jobs))} processes); wrote {args.out}")
    return 1 if total_violations else 0


if __name__ == "__main__":
    sys.exit(main())
