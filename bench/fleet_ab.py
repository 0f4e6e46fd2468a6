"""Fleet A/B at the client: two vLLM CPU replicas (each engine pinned to its own core) behind the
real ``vllm-router``, aiperf at the router, an open-loop three-class reasoning workload with
heavy-tailed thinking past the fleet's knee (the rate a stock fleet completes under a burst,
measured first on this machine, times ``--load``).

Arms, rotated over the rounds (round k starts with arm k mod n), a fresh fleet and router each:

- ``stock``: stock vLLM, router round robin;
- ``fcfs+cap``: stock vLLM with its own valve (``--max-num-queued-reqs`` at the Little's-law cap of
  one replica: its seats plus the queue that drains within the tightest TTFT target), round robin;
- ``fcfs+cap-nocb``: the same with the router's circuit breaker off (``--disable-circuit-breaker``),
  so the valve's 503s never eject a server (not in the default arms);
- ``meridian``: Meridian (scheduler and middleware, defaults: sheds answered 429), round robin;
- ``meridian+p2``: the same, the router's ``power_of_two`` on Meridian's ``GET /get_load``;
- ``meridian-noretry``: Meridian, round robin, the router's retries off;
- ``meridian-503``: Meridian answering sheds 503 (``overload.shed_status``), round robin: what the
  default's choice rests on.

Per class, at the client, across bounces (a retried request is one record timed from its first
send): requests meeting every target (a final shed is a miss), final sheds, failures (anything
else not 200), the router's retries, exhausted retries and circuit-breaker transitions, the
servers it left ejected, output tokens/s; medians and ranges over rounds, and each Meridian arm
over both baselines.

    .venv/bin/python bench/fleet_ab.py [--load 1.5] [--rounds 3] [--arms stock,fcfs+cap,meridian,...]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
# See bench/live_ab.py: the server keeps idle connections longer than aiperf's pool does.
os.environ.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "60")

from meridian.demo.fleet import FleetArm, measure_fleet_capacity_rps, run_fleet_round  # noqa: E402
from meridian.demo.loadgen import (  # noqa: E402
    HEAVY_BURST_REQUESTS,
    LENGTH_FAMILIES,
    Arm,
    Workload,
    add_round_arguments,
    little_law_queue_cap,
    pack_round,
    round_settings,
)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ARMS = ("stock", "fcfs+cap", "meridian", "meridian+p2", "meridian-noretry", "meridian-503")
BASELINES = ("stock", "fcfs+cap", "fcfs+cap-nocb")


def make_arm(name: str, cap: int) -> FleetArm:
    arms = {
        "stock": FleetArm("stock", Arm("stock", "stock")),
        "fcfs+cap": FleetArm("fcfs+cap", Arm("fcfs+cap", "stock", cap)),
        # The valve behind a router whose circuit breaker is off: its 503s then never eject a server.
        "fcfs+cap-nocb": FleetArm("fcfs+cap-nocb", Arm("fcfs+cap", "stock", cap), "round_robin",
                                  ("--disable-circuit-breaker",)),
        "meridian": FleetArm("meridian", Arm("meridian", "meridian")),
        "meridian+p2": FleetArm("meridian+p2", Arm("meridian", "meridian"), "power_of_two",
                                ("--worker-startup-check-interval", "1")),
        "meridian-noretry": FleetArm("meridian-noretry", Arm("meridian", "meridian"), "round_robin",
                                     ("--disable-retries",)),
        "meridian-503": FleetArm("meridian-503", Arm("meridian", "meridian",
                                                     meridian_config={"overload": {"shed_status": 503}})),
    }
    if name not in arms:
        raise ValueError(f"unknown fleet arm {name!r}: expected one of {', '.join(arms)}")
    return arms[name]


def rotated(arms: list[FleetArm], k: int) -> list[FleetArm]:
    return arms[k % len(arms):] + arms[: k % len(arms)]


def pack_replica_logs(out: Path, name: str, num_replicas: int) -> None:
    for i in range(num_replicas):
        for path in (out / f"requests-{name}-r{i}.jsonl", out / f"serve-{name}-r{i}.log"):
            if path.exists():
                with path.open("rb") as src, gzip.open(f"{path}.gz", "wb") as dst:
                    shutil.copyfileobj(src, dst)
                path.unlink()


def summarize(rows: list[dict[str, Any]], arms: list[FleetArm], class_names: list[str]) -> dict[str, Any]:
    """Per arm, medians and ranges over rounds; each Meridian arm over each baseline."""
    out: dict[str, Any] = {}
    for arm in arms:
        mine = [r for r in rows if r["policy"] == arm.name]
        if not mine:
            continue

        def med(values: list[float]) -> dict[str, Any]:
            return {"median": statistics.median(values), "range": [min(values), max(values)]}

        out[arm.name] = {
            "rounds": len(mine),
            "good": med([r["good_requests"] for r in mine]),
            "per_class": {c: med([r["per_class"][c]["good"] for r in mine]) for c in class_names},
            "shed_per_class": {c: med([r["per_class"][c]["shed"] for r in mine]) for c in class_names},
            "shed": med([r["shed"] for r in mine]),
            "failed": sum(max(r["errors"], r["failed_in_records"]) for r in mine),
            "retries": med([r["router"]["retries"] for r in mine]),
            "retries_exhausted": med([r["router"]["retries_exhausted"] for r in mine]),
            "cb_transitions": sum(r["router"]["cb_state_transitions"] for r in mine),
            "rounds_with_open_circuits": sum(bool(r["open_circuits_at_end"]) for r in mine),
            "replica_refusals": med([sum(sum(v.values()) for v in r["replicas"]) for r in mine]),
            "ttfo_p99_ms": {c: med([r["per_class"][c]["ttfo_p99_ms"] or 0.0 for r in mine]) for c in class_names},
            "output_tok_s": med([r["output_tok_s"] or 0.0 for r in mine]),
        }
    ratios: dict[str, Any] = {}
    for name, ours in out.items():
        if not name.startswith("meridian"):
            continue
        for base in BASELINES:
            if base not in out:
                continue
            theirs = out[base]

            def over(a: float, b: float) -> float | None:
                return a / b if b else None

            ratios[f"{name} / {base}"] = {
                "all": over(ours["good"]["median"], theirs["good"]["median"]),
                **{c: over(ours["per_class"][c]["median"], theirs["per_class"][c]["median"]) for c in class_names},
                "output_tok_s": over(ours["output_tok_s"]["median"], theirs["output_tok_s"]["median"]),
            }
    out["ratios"] = ratios
    return out


def print_round(k: int, row: dict[str, Any], class_names: list[str]) -> None:
    per = " ".join(f"{c[:5]} {row['per_class'][c]['good']}/{row['per_class'][c]['requests']}" for c in class_names)
    router = row["router"]
    print(f"round {k} {row['policy']:17s} good {row['good_requests']:4d}/{row['requests']:.0f} ({per})  "
          f"shed {row['shed']}  failed {max(row['errors'], row['failed_in_records'])}  retries {router['retries']:.0f} "
          f"(exhausted {router['retries_exhausted']:.0f})  cb {router['cb_state_transitions']:.0f} "
          f"open {row['open_circuits_at_end']}  {row['output_tok_s'] or 0:.0f} tok/s", flush=True)


def markdown(result: dict[str, Any], class_names: list[str]) -> str:
    s = result["summary"]
    lines = [f"Fleet capacity (stock, 2 replicas, round robin, burst): {result['capacity_rps']:.1f} req/s; load "
             f"{result['load']:g}× = {result['rate_rps']:g} req/s, {result['num_requests']} requests; valve cap "
             f"{result['cap']} per replica.", "",
             "Requests meeting every target of their class, medians [range] over rounds:", "",
             "| arm | " + " | ".join(class_names) + " | all | final sheds | failed | retries (exhausted) | "
             "circuit-breaker transitions | rounds ending with a server ejected | tok/s |",
             "|---|" + "---|" * (len(class_names) + 7)]
    for arm in result["settings"]["arms"]:
        if arm not in s:
            continue
        a = s[arm]

        def cell(m: dict[str, Any]) -> str:
            return f"{m['median']:g} [{m['range'][0]:g}–{m['range'][1]:g}]"

        lines.append(f"| {arm} | " + " | ".join(cell(a["per_class"][c]) for c in class_names)
                     + f" | **{cell(a['good'])}** | {cell(a['shed'])} | {a['failed']} | "
                     f"{a['retries']['median']:g} ({a['retries_exhausted']['median']:g}) | {a['cb_transitions']:g} | "
                     f"{a['rounds_with_open_circuits']} | {a['output_tok_s']['median']:.0f} |")
    lines += ["", "| ratio | " + " | ".join(class_names) + " | all | tok/s |", "|---|" + "---|" * (len(class_names) + 2)]
    for name, r in s["ratios"].items():
        lines.append(f"| {name} | " + " | ".join(f"{r[c]:.2f}×" if r.get(c) else "–" for c in class_names)
                     + f" | **{r['all']:.2f}×** | {r['output_tok_s']:.2f}× |" if r.get("all") else f"| {name} | – |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_round_arguments(parser)
    parser.set_defaults(model="long")
    parser.add_argument("--lengths", choices=LENGTH_FAMILIES, default="servegen", help="reasoning-length family")
    parser.add_argument("--load", type=float, default=1.5, help="arrival rate as a multiple of the fleet's capacity")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per arm")
    parser.add_argument("--arms", type=lambda s: s.split(","), default=list(DEFAULT_ARMS))
    parser.add_argument("--capacity-rps", type=float, default=None, help="skip the calibration burst")
    parser.add_argument("--cap", type=int, default=None, help="the valve's cap per replica (default: Little's law)")
    parser.add_argument("--schedule-s", type=float, default=15.0, help="seconds of arrivals per round")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    requests_given = args.requests
    try:
        settings = round_settings(args, REPO, "fleet_ab")
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 2
    classes = settings.model.classes
    class_names = [c.name for c in classes]
    num_replicas = 2
    try:
        for name in args.arms:  # a typo fails now, not after the calibration burst
            make_arm(name, 1)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    capacity = args.capacity_rps or measure_fleet_capacity_rps(args.out, settings, lengths=args.lengths,
                                                               num_requests=HEAVY_BURST_REQUESTS,
                                                               num_replicas=num_replicas)
    cap = args.cap or little_law_queue_cap(capacity / num_replicas, min(c.ttft_ms for c in classes))
    arms = [make_arm(name, cap) for name in args.arms]
    rate = round(args.load * capacity, 2)
    num_requests = requests_given or max(1, round(rate * args.schedule_s))
    print(f"fleet capacity {capacity:.1f} req/s; load {args.load:g}x = {rate} req/s, {num_requests} requests; "
          f"valve cap {cap} per replica", flush=True)
    dataset = args.out / f"workload-{args.load:g}x.jsonl"
    dataset.write_text(Workload(num_requests, rate, classes, seed=args.seed, lengths=args.lengths,
                                max_think=settings.model.max_think, max_tokens=settings.model.max_tokens).jsonl())
    result: dict[str, Any] = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                              "capacity_rps": capacity, "cap": cap, "load": args.load, "rate_rps": rate,
                              "num_requests": num_requests, "rounds": []}
    for k in range(args.rounds):
        for arm in rotated(arms, k):
            name = f"{k}-{arm.name}"
            row, records = run_fleet_round(name, arm, dataset, args.out, settings, num_replicas=num_replicas)
            pack_round(args.out, name, records)
            pack_replica_logs(args.out, name, num_replicas)
            row["round"] = k
            result["rounds"].append(row)
            print_round(k, row, class_names)
            result["summary"] = summarize(result["rounds"], arms, class_names)
            (args.out / "results.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
            (args.out / "summary.md").write_text(markdown(result, class_names))
    print((args.out / "summary.md").read_text())
    print(f"wrote {args.out / 'results.json'} ({time.strftime('%H:%M')})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
