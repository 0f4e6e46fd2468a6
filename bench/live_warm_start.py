"""Warm start, live: how a restarted or newly added Meridian server fares in its first minute
against one that has been running, under the same heavy-tailed load past its knee.

Each round runs three servers in turn on the same one-minute workload (``--seconds`` of arrivals
at ``--load`` × the burst-measured capacity): a **long-running** one that first served
``--preload-s`` of another seed's traffic of the same family (untimed), a **warm-started** one —
fresh, its predictors learnt at start from the long-running server's request log of that earlier
traffic (``warm_start_path``; the lines of the timed minute are left out, so it learns nothing of
the requests it is measured on) — and a **cold** one, fresh from the production priors. Requests
meeting every target of their class, and the warm and cold servers' over the long-running one's,
per round and as medians.

    .venv/bin/python bench/live_warm_start.py [--rounds 3] [--load 1.2] [--capacity-rps R]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "60")

from meridian.demo.loadgen import (  # noqa: E402
    LENGTH_FAMILIES,
    Arm,
    Workload,
    add_round_arguments,
    measure_capacity_rps,
    pack_round,
    round_settings,
    run_round,
)

REPO = Path(__file__).resolve().parent.parent


def earlier_lines(log: Path, out: Path) -> int:
    """Copies the lines of ``log`` that arrived before its largest arrival gap (the preload's,
    before the timed minute's) to ``out``; returns how many."""
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    arrivals = sorted(e["arrival_ms"] for e in entries)
    gaps = [(b - a, b) for a, b in zip(arrivals, arrivals[1:])]
    split_ms = max(gaps)[1] if gaps else float("inf")
    kept = [e for e in entries if e["arrival_ms"] < split_ms]
    out.write_text("".join(json.dumps(e) + "\n" for e in kept))
    return len(kept)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_round_arguments(parser)
    parser.set_defaults(model="long")
    parser.add_argument("--lengths", choices=LENGTH_FAMILIES, default="servegen")
    parser.add_argument("--load", type=float, default=1.2, help="arrival rate over the measured capacity")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of timed arrivals")
    parser.add_argument("--preload-s", type=float, default=90.0, help="seconds of traffic the long-running server serves first")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--capacity-rps", type=float, default=None)
    args = parser.parse_args()
    try:
        settings = round_settings(args, REPO, f"live_warm_start_{args.lengths}")
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 2
    model = settings.model
    capacity = args.capacity_rps or measure_capacity_rps("stock", args.out, settings, lengths=args.lengths)
    rate = round(args.load * capacity, 2)

    def workload(seconds: float, seed: int) -> Workload:
        return Workload(max(1, round(rate * seconds)), rate, model.classes, seed=seed, lengths=args.lengths,
                        max_think=model.max_think, max_tokens=model.max_tokens)

    timed, preload = args.out / "workload-timed.jsonl", args.out / "workload-preload.jsonl"
    timed.write_text(workload(args.seconds, seed=7).jsonl())
    preload.write_text(workload(args.preload_s, seed=100).jsonl())
    print(f"capacity {capacity:.1f} req/s; {rate:g} req/s for {args.seconds:g} s (preload {args.preload_s:g} s)", flush=True)
    rows: list[dict[str, Any]] = []
    for k in range(args.rounds):
        name = f"{k}-long-running"
        row, recs = run_round(name, Arm("long-running", "meridian"), timed, args.out,
                              dataclasses.replace(settings, preload=preload))
        source = args.out / f"warm-source-{k}.jsonl"
        learnt = earlier_lines(args.out / f"requests-{name}.jsonl", source)
        pack_round(args.out, name, recs)
        rows.append({**row, "round": k})
        warm = Arm("warm-started", "meridian", meridian_config={"warm_start_path": str(source)})
        for arm in (warm, Arm("cold", "meridian")):
            name = f"{k}-{arm.name}"
            row, recs = run_round(name, arm, timed, args.out, settings)
            pack_round(args.out, name, recs)
            rows.append({**row, "round": k, "warm_start_lines": learnt if arm is warm else 0})
        by_arm = {r["policy"]: r["good_requests"] for r in rows if r["round"] == k}
        print(f"round {k}: good long-running {by_arm['long-running']}  warm-started {by_arm['warm-started']} "
              f"({learnt} lines learnt)  cold {by_arm['cold']}  of {rows[-1]['requests']:.0f}", flush=True)
    summary: dict[str, Any] = {}
    for arm in ("long-running", "warm-started", "cold"):
        good = [r["good_requests"] for r in rows if r["policy"] == arm]
        summary[arm] = {"good_median": statistics.median(good), "good_per_round": good}
    ratios = {arm: [w / l if l else None for w, l in zip(summary[arm]["good_per_round"],
                                                           summary["long-running"]["good_per_round"])]
              for arm in ("warm-started", "cold")}
    summary["over_long_running"] = {arm: {"per_round": r, "median": statistics.median([x for x in r if x is not None])}
                                    for arm, r in ratios.items()}
    for arm, r in summary["over_long_running"].items():
        print(f"{arm} / long-running: median {r['median']:.3f}, per round " + ", ".join(f"{x:.3f}" for x in r["per_round"]))
    (args.out / "results.json").write_text(json.dumps({"settings": {k: str(v) if isinstance(v, Path) else v
                                                                    for k, v in vars(args).items()},
                                                       "capacity_rps": capacity, "rate_rps": rate,
                                                       "rounds": rows, "summary": summary}, indent=2, default=str) + "\n")
    print(f"wrote {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
