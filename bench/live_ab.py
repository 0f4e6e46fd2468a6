"""Live A/B with a real load generator: vLLM's OpenAI server (CPU build) serving a trained fixture
with the stock scheduler and with ``MeridianScheduler``, driven by aiperf replaying one seeded,
timestamped, three-class reasoning workload open-loop (``meridian.demo.loadgen``), in rounds that
alternate which policy goes first (ABBA BAAB ...), a fresh server each round.

What keeps rounds comparable (issue 12): every round starts a fresh server on a fresh port after the
previous one's whole process group has exited, waits ``--cooldown-s``, and sends a few untimed
warm-up requests before the timed load; with ``--pin`` (default on two or more cores) the
engine-core process — every thread of it — runs alone on the last core while the API server and
aiperf share the others. The table gives per round and per policy the medians over rounds, the
spread of TTFO p50 ((max − min) / median) and the order effect (median TTFO p50 of the rounds a
policy ran first over those it ran second); the ratios are Meridian's medians over stock's,
measured side by side in one run. Greedy outputs are compared prompt by prompt between two untimed rounds (one per policy, same
load) with aiperf's raw export, which holds the text; the timed rounds run without it (a JSON dump
of every chunk loads the generator's core: at 6 requests/s it lagged its schedule by 9 s).

``--sweep RATE,RATE,...`` instead runs the stock server once per rate (the first should be light
enough to count as unloaded) and reports TTFO p99 against the first: the saturating rate is the
lowest with TTFO p99 at least 5× the unloaded one.

    .venv/bin/python bench/live_ab.py [--model tiny|compute] [--rounds 4] [--rate R] [--requests N]
    .venv/bin/python bench/live_ab.py --model compute --sweep 0.5,4,6,8,12,16
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
# The client-side failures of earlier runs ("Can not write request body", ClientOSError: "Cannot
# write to closing transport"): the API server (uvicorn) closes a keep-alive connection after 5 s
# idle (vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE), aiohttp keeps idle pooled connections for 15 s, so
# under bursty open-loop arrivals the generator writes a request into a connection the server is
# closing. A server keep-alive longer than the client's closes that window; it is a property of
# the HTTP stack, not of either scheduler (it hit the stock server first, in the round's bursts).
os.environ.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "60")

from meridian.demo.loadgen import (  # noqa: E402
    RecordTimes,
    RoundSettings,
    Workload,
    add_round_arguments,
    outputs_by_prompt,
    pack_round,
    round_settings,
    run_round,
    spread,
)

REPO = Path(__file__).resolve().parent.parent
#: Round metrics summarized as medians (per policy) and ratios (Meridian over stock).
TABLE_METRICS = ["ttfo_p50_ms", "ttfo_p99_ms", "ttft_p50_ms", "ttft_p99_ms", "itl_p99_ms", "answer_itl_p50_ms", "answer_itl_p99_ms",
                 "output_tok_s", "goodput_rps", "good_requests", "preemptions", "sched_lag_p99_ms"]


def round_order(num_rounds: int) -> list[str]:
    """ABBA BAAB ...: each policy goes first and second equally often."""
    pattern = ["stock", "meridian", "meridian", "stock", "meridian", "stock", "stock", "meridian"]
    return [pattern[i % len(pattern)] for i in range(num_rounds)]


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per policy: medians over rounds, TTFO p50 spread, order effect; Meridian over stock."""
    out: dict[str, Any] = {}
    for policy in ("stock", "meridian"):
        mine = [r for r in rows if r["policy"] == policy]
        med = {m: statistics.median(v) for m in TABLE_METRICS if (v := [r[m] for r in mine if r.get(m) is not None])}
        p50s = [r["ttfo_p50_ms"] for r in mine]
        first = [r["ttfo_p50_ms"] for r in mine if r["pair_position"] == 0]
        second = [r["ttfo_p50_ms"] for r in mine if r["pair_position"] == 1]
        out[policy] = {
            "median": med, "ttfo_p50_spread": spread(p50s), "rounds": len(mine),
            "order_effect_first_over_second": statistics.median(first) / statistics.median(second) if first and second else None,
            "failed_requests": sum(r["errors"] + r["failed_in_records"] for r in mine),
            "empty_responses": sum(r["empty_responses"] for r in mine),
            # The machine's own speed in those rounds (before and after each): a policy whose
            # rounds ran on a slower machine is not slower for it.
            "speed_probe_ms": [r["speed_probe_ms"] for r in mine if "speed_probe_ms" in r],
        }
    stock, ours = out["stock"]["median"], out["meridian"]["median"]
    out["meridian_over_stock"] = {m: ours[m] / stock[m] for m in ours if m in stock and stock[m]}
    return out


def greedy_check(records: list[RecordTimes]) -> dict[str, Any]:
    """Prompts whose greedy output differed between any two rounds (policies included)."""
    outputs = outputs_by_prompt(records)
    differing = {p: sorted(t)[:3] for p, t in outputs.items() if len(t) > 1}
    return {"prompts": len(outputs), "differing": len(differing), "examples": dict(list(differing.items())[:3])}


def run_ab(args: argparse.Namespace, settings: RoundSettings) -> dict[str, Any]:
    dataset = args.out / "workload.jsonl"
    dataset.write_text(Workload(args.requests, args.rate, settings.model.classes).jsonl())
    rows, records = [], []
    for k, policy in enumerate(round_order(args.rounds)):
        row, recs = run_round(f"{k}-{policy}", policy, dataset, args.out, settings)
        pack_round(args.out, f"{k}-{policy}", recs)
        row.update({"round": k, "pair_position": k % 2})
        rows.append(row)
        records += recs
        print_round(row)
    # Greedy outputs: one untimed round per policy with aiperf's raw export (the text of every
    # request), under the same load; the timed rounds run without it (it loads the generator).
    raw_settings = dataclasses.replace(settings, raw=True)
    for policy in ("stock", "meridian") if args.greedy else ():
        _, recs = run_round(f"greedy-{policy}", policy, dataset, args.out, raw_settings)
        pack_round(args.out, f"greedy-{policy}", recs)
        records += recs
    return {"rounds": rows, "summary": summarize(rows), "greedy": greedy_check(records)}


def run_sweep(args: argparse.Namespace, settings: RoundSettings) -> dict[str, Any]:
    rows = []
    for k, rate in enumerate(args.sweep):
        dataset = args.out / f"workload-sweep-{k}.jsonl"
        # The unloaded point needs few requests; the loaded ones the full set.
        dataset.write_text(Workload(args.requests if k else min(args.requests, 40), rate, settings.model.classes).jsonl())
        row, recs = run_round(f"sweep{k}-stock", "stock", dataset, args.out, settings)
        pack_round(args.out, f"sweep{k}-stock", recs)
        row["rate_rps"] = rate
        rows.append(row)
        print_round(row)
    unloaded = rows[0]["ttfo_p99_ms"]
    for row in rows:
        row["ttfo_p99_over_unloaded"] = row["ttfo_p99_ms"] / unloaded
    print("rate  TTFO p99 / unloaded  duration")
    for row in rows:
        print(f"{row['rate_rps']:5.2f}  {row['ttfo_p99_over_unloaded']:6.2f}×  {row['duration_s']:.0f} s")
    return {"sweep": rows}


def print_round(row: dict[str, Any]) -> None:
    cost = row.get("meridian_cost")
    print(f"{row.get('round', row.get('rate_rps'))} {row['policy']:8s} TTFO p50/p99 {row['ttfo_p50_ms']:.0f}/{row['ttfo_p99_ms']:.0f} ms  "
          f"TTFT p50 {row['ttft_p50_ms']:.0f} ms  answer ITL p99 {row['answer_itl_p99_ms']:.1f} ms  "
          f"{row['output_tok_s']:.0f} tok/s  good {row['good_requests']}/{row['requests']:.0f}  "
          f"failed {row['errors'] + row['failed_in_records']}  lag p99 {row['sched_lag_p99_ms'] or 0:.0f} ms  "
          f"CPU busy " + "/".join(f"{v:.0f}%" for v in row["cpu_busy_pct"].values())
          + (f"  speed probe {row['speed_probe_ms']['before']:.0f}/{row['speed_probe_ms']['after']:.0f} ms" if "speed_probe_ms" in row else "")
          + (f"  Meridian {cost['meridian_share_of_step_time']:.1%} of step time" if cost else ""), flush=True)


def print_summary(result: dict[str, Any]) -> None:
    summary = result["summary"]
    for policy in ("stock", "meridian"):
        s = summary[policy]
        sp = "-" if s["ttfo_p50_spread"] is None else f"{s['ttfo_p50_spread']:.0%}"
        order = "-" if s["order_effect_first_over_second"] is None else f"{s['order_effect_first_over_second']:.2f}"
        print(f"{policy:8s} median over {s['rounds']} rounds: " + "  ".join(f"{m} {v:.1f}" for m, v in s["median"].items())
              + f"  TTFO p50 spread {sp}  first/second {order}  failed {s['failed_requests']}  empty {s['empty_responses']}")
    print("meridian / stock: " + "  ".join(f"{m} {v:.2f}×" for m, v in summary["meridian_over_stock"].items()))
    g = result["greedy"]
    print(f"greedy outputs: {g['prompts']} prompts, {g['differing']} differ between rounds")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_round_arguments(parser)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--sweep", type=lambda s: [float(x) for x in s.split(",")], default=None,
                        help="comma-separated rates: a stock-only saturation sweep instead of the A/B")
    parser.add_argument("--greedy", action=argparse.BooleanOptionalAction, default=True,
                        help="the two untimed rounds that compare greedy outputs")
    parser.add_argument("--meridian-config", type=json.loads, default={},
                        help="JSON merged into Meridian's config, e.g. '{\"answer_kv_reserve\": false}'")
    args = parser.parse_args()
    try:
        settings = round_settings(args, REPO, "live_ab", meridian_config=args.meridian_config)
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 2
    model = settings.model
    result = run_sweep(args, settings) if args.sweep else run_ab(args, settings)
    if not args.sweep:
        print_summary(result)
    saved = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    name = "sweep.json" if args.sweep else "results.json"
    (args.out / name).write_text(json.dumps({"settings": saved, "model": model.name, **result}, indent=2, default=str) + "\n")
    print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
