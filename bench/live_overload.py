"""Live overload with heavy-tailed reasoning: vLLM's OpenAI server (CPU build) serving the tiny
reasoner under aiperf, past its knee, in several arms side by side — stock vLLM, stock with vLLM's
own load valve (``--max-num-queued-reqs``, sized as vLLM's docs advise: every seat plus the queue
that drains within the tightest TTFT target at the measured rate), vLLM's priority scheduler with
the same valve, and Meridian with its middleware and defaults.

The rate is calibrated on the machine first, per placement (a stock server's completions under a
burst of the same length family, ``measure_capacity_rps``) and each load is a multiple of it. Every round runs a
fresh server; the arms rotate (round k starts with arm k mod n), so each goes first equally often.
Per load and arm the table gives the medians over rounds of the requests meeting every target of
their class (a refusal — Meridian's shed or the valve's 503 — is a miss), per class, with the
rounds' range, the refusals and their notice times, failures and output tokens/s; the ratios are
Meridian's medians over each baseline's, measured side by side in one run, and round by round:
the worst round's ratio and the rounds Meridian met more in (every class at least as many too).

Both placements by default (``--placements``), their rounds interleaved, each in a folder of its
own: ``pinned`` (the engine on one core, the API server and aiperf on the other: a few per cent
between rounds) and ``unpinned`` (where the OS puts them, as a default server runs: the engine's
step times wander with the front end's and the client's load). A speed probe (a fixed loop on
the engine's core) runs before and after every arm.

    .venv/bin/python bench/live_overload.py [--lengths servegen] [--loads 1.2,1.5,2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
# See bench/live_ab.py: the server keeps idle connections longer than aiperf's pool does.
os.environ.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "60")

from meridian.demo.loadgen import (  # noqa: E402
    LENGTH_FAMILIES,
    Arm,
    RoundSettings,
    Workload,
    add_round_arguments,
    little_law_queue_cap,
    measure_capacity_rps,
    pack_round,
    read_packed_round,
    round_settings,
    run_round,
)

REPO = Path(__file__).resolve().parent.parent
#: The arms, by the names the command line takes. ``+cap``: vLLM's valve at the Little's-law cap.
ARM_POLICIES = {"stock": "stock", "fcfs+cap": "stock", "priority+cap": "vllm-priority", "meridian": "meridian",
                "priority": "vllm-priority"}
DEFAULT_ARMS = ("stock", "fcfs+cap", "priority+cap", "meridian")


def make_arms(names: list[str], cap: int, variants: dict[str, dict[str, Any]]) -> list[Arm]:
    """The arms by name; ``meridian:NAME`` is Meridian with the variant ``NAME`` of ``--variant``."""
    arms = []
    for name in names:
        if name.startswith("meridian:"):
            variant = name.split(":", 1)[1]
            if variant not in variants:
                raise ValueError(f"arm {name!r} names no --variant {variant}=JSON")
            arms.append(Arm(name, "meridian", meridian_config=variants[variant]))
            continue
        base, _, explicit = name.partition("=")
        if base not in ARM_POLICIES:
            raise ValueError(f"unknown arm {name!r}: expected one of {', '.join(ARM_POLICIES)}, a valve arm at an "
                             f"explicit cap (priority+cap=60) or meridian:VARIANT")
        if explicit and not base.endswith("+cap"):
            raise ValueError(f"arm {name!r}: only a valve arm (+cap) takes a cap")
        arms.append(Arm(name, ARM_POLICIES[base], (int(explicit) if explicit else cap) if base.endswith("+cap") else None))
    return arms


def placements(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names or any(p not in ("pinned", "unpinned") for p in names) or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"--placements {text!r}: expected pinned, unpinned or both, comma-separated")
    return names


def default_placements() -> list[str]:
    return ["pinned", "unpinned"] if len(os.sched_getaffinity(0)) >= 2 else ["unpinned"]


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    name, _, config = text.partition("=")
    return name, json.loads(config)


def rotated(arms: list[Arm], k: int) -> list[Arm]:
    """Round ``k``'s order: the arms rotated by ``k``, so each goes first equally often."""
    return arms[k % len(arms):] + arms[: k % len(arms)]


def server_notices(out: Path, name: str, targets: dict[str, float]) -> dict[str, Any] | None:
    """A Meridian round's shed notices as its server measured them (its request log: arrival to
    the shed's end, for the requests the engine shed before their first token; a refusal at
    arrival is answered within the request's own handling): per class the count, p99 and how many
    came after the class's TTFT target. ``None`` for a round without a request log (stock vLLM)."""
    import gzip

    import numpy as np

    path = out / f"requests-{name}.jsonl.gz"
    if not path.exists():
        return None
    with gzip.open(path, "rt") as f:
        # Shed before its first token (a 503 to its client); one shed while thinking has streamed.
        shed = [e for line in f if '"aborted"' in line and (e := json.loads(line))["ttft_ms"] is None]
    out_: dict[str, Any] = {}
    for c, ttft_ms in targets.items():
        ms = [e["e2e_ms"] for e in shed if e["slo_class"] == c and e["e2e_ms"] is not None]
        out_[c] = {"engine_sheds": len(ms), "notice_p99_ms": float(np.percentile(ms, 99)) if ms else None,
                   "past_ttft_target": sum(m > ttft_ms for m in ms)}
    return out_


def summarize(rows: list[dict[str, Any]], arms: list[Arm], class_names: list[str]) -> dict[str, Any]:
    """Per arm: medians over rounds (all and per class), their range; Meridian over each other arm."""
    out: dict[str, Any] = {}
    for arm in arms:
        mine = [r for r in rows if r["policy"] == arm.name]
        good = [r["good_requests"] for r in mine]
        per_class = {c: [r["per_class"][c]["good"] for r in mine] for c in class_names}
        shed = [r["shed"] for r in mine]
        out[arm.name] = {
            "rounds": len(mine), "good": statistics.median(good), "good_range": [min(good), max(good)],
            "good_per_round": good,
            "per_class": {c: {"median": statistics.median(v), "range": [min(v), max(v)]} for c, v in per_class.items()},
            "shed_median": statistics.median(shed),
            # Meridian's engine sheds, as its server timed them (arrival to the shed).
            "server_notice_p99_ms": max((n[c]["notice_p99_ms"] for r in mine if (n := r.get("server_notices"))
                                         for c in class_names if n[c]["notice_p99_ms"] is not None), default=None),
            "server_notices_past_ttft_target": sum(n[c]["past_ttft_target"] for r in mine
                                                   if (n := r.get("server_notices")) for c in class_names),
            # aiperf's error summary and its records count the same failures: the larger of the two.
            "failed": sum(max(r["errors"], r["failed_in_records"]) for r in mine),
            "output_tok_s": statistics.median([r["output_tok_s"] for r in mine if r.get("output_tok_s") is not None] or [0.0]),
            "speed_probe_ms": [r["speed_probe_ms"] for r in mine],
        }
    if "meridian" in out:
        ours = out["meridian"]
        out["meridian_over"] = {
            arm.name: {
                "good": ours["good"] / out[arm.name]["good"] if out[arm.name]["good"] else None,
                **round_by_round(rows, arm.name, class_names),
                **{c: (ours["per_class"][c]["median"] / out[arm.name]["per_class"][c]["median"]
                       if out[arm.name]["per_class"][c]["median"] else None) for c in class_names},
                "output_tok_s": ours["output_tok_s"] / out[arm.name]["output_tok_s"] if out[arm.name]["output_tok_s"] else None,
            }
            for arm in arms if arm.name != "meridian"
        }
    return out


def round_by_round(rows: list[dict[str, Any]], other: str, class_names: list[str]) -> dict[str, Any]:
    """Meridian against ``other`` round by round (the two arms of a round ran minutes apart on the
    same machine): the worst round's ratio of requests meeting every target, how many rounds
    Meridian met more in, and in how many it met at least as many of every class."""
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_round.setdefault(r["round"], {})[r["policy"]] = r
    pairs = [(b["meridian"], b[other]) for b in by_round.values() if "meridian" in b and other in b]
    ratios = [m["good_requests"] / o["good_requests"] for m, o in pairs if o["good_requests"]]
    return {
        "good_worst_round": min(ratios) if ratios else None,
        "rounds_ahead": f"{sum(m['good_requests'] > o['good_requests'] for m, o in pairs)}/{len(pairs)}",
        "rounds_every_class_at_least": f"{sum(all(m['per_class'][c]['good'] >= o['per_class'][c]['good'] for c in class_names) for m, o in pairs)}/{len(pairs)}",
    }


def print_round(load: float, k: int, row: dict[str, Any], class_names: list[str]) -> None:
    per = " ".join(f"{c[:5]} {row['per_class'][c]['good']}/{row['per_class'][c]['requests']}" for c in class_names)
    print(f"load {load:g}x round {k} {row['policy']:13s} good {row['good_requests']:3d}/{row['requests']:.0f} ({per})  "
          f"shed {row['shed']}  failed {max(row['errors'], row['failed_in_records'])}  {row['output_tok_s']:.0f} tok/s  "
          f"lag p99 {row['sched_lag_p99_ms'] or 0:.0f} ms  probe {row['speed_probe_ms']['before']:.0f}/"
          f"{row['speed_probe_ms']['after']:.0f} ms", flush=True)


def print_summary(load: float, summary: dict[str, Any], arms: list[Arm], class_names: list[str]) -> None:
    print(f"== load {load:g}x: requests meeting every target of their class, medians [range] over rounds")
    for arm in arms:
        s = summary[arm.name]
        per = "  ".join(f"{c} {s['per_class'][c]['median']:g} [{s['per_class'][c]['range'][0]}-{s['per_class'][c]['range'][1]}]"
                        for c in class_names)
        print(f"  {arm.name:13s} all {s['good']:g} [{s['good_range'][0]}-{s['good_range'][1]}]  {per}  shed {s['shed_median']:g}  "
              f"failed {s['failed']}  engine sheds past TTFT target {s['server_notices_past_ttft_target']}  {s['output_tok_s']:.0f} tok/s")
    for name, ratios in summary.get("meridian_over", {}).items():
        print(f"  meridian / {name}: " + "  ".join(f"{k} {v:.2f}x" if isinstance(v, float) else f"{k} {v}"
                                                   for k, v in ratios.items() if v is not None))


def markdown(result: dict[str, Any], class_names: list[str]) -> str:
    """Per load, the medians [range] over rounds of each arm, and Meridian's ratios, as Markdown."""
    lines = [f"Capacity (stock, burst): {result['capacity_rps']:.1f} req/s; docs-sized valve cap {result['cap']}.", ""]
    for load, entry in result["loads"].items():
        summary = entry["summary"]
        arms = [a for a in summary if a != "meridian_over"]
        lines += [f"### {load}x ({entry['rate_rps']:g} req/s)", "",
                  "| arm | " + " | ".join(class_names) + " | all | worst round | refused | failed | tok/s |",
                  "|---|" + "---|" * (len(class_names) + 5)]
        for arm in arms:
            a = summary[arm]
            per = " | ".join(f"{a['per_class'][c]['median']:g} [{a['per_class'][c]['range'][0]}–{a['per_class'][c]['range'][1]}]"
                             for c in class_names)
            lines.append(f"| {arm} | {per} | **{a['good']:g}** [{a['good_range'][0]}–{a['good_range'][1]}] | "
                         f"{a['good_range'][0]} | {a['shed_median']:g} | {a['failed']} | {a['output_tok_s']:.0f} |")
        for name, ratios in summary.get("meridian_over", {}).items():
            lines.append(f"| Meridian / {name} | " + " | ".join(
                f"{ratios[c]:.2f}×" if ratios.get(c) else "–" for c in class_names)
                + f" | **{ratios['good']:.2f}×** | {worst(ratios)} | | | {ratios['output_tok_s']:.2f}× |")
        lines.append("")
    return "\n".join(lines)


def worst(ratios: dict[str, Any]) -> str:
    """The worst round's ratio, the rounds Meridian met more in and those where every class met at least as many."""
    if ratios.get("good_worst_round") is None:
        return "–"
    return (f"{ratios['good_worst_round']:.2f}× (ahead {ratios['rounds_ahead']}, "
            f"every class {ratios['rounds_every_class_at_least']})")


def recover_rounds(folder: Path, result: dict[str, Any], classes: Any) -> None:
    """Adds to ``result`` the packed rounds in ``folder`` it has no row for (a run interrupted
    before a load's summary, or rounds added by a later ``--first-round`` run into the same
    folder), rebuilt from aiperf's summary and the round's records (marked ``from_records``:
    without the server's metrics and speed probes, which only the live run saw)."""
    known = {f"{r['load']:g}x-{r['round']}-{r['policy']}" for e in result["loads"].values() for r in e["rounds"]}
    for path in sorted(folder.glob("records-*.jsonl.gz")):
        name = path.name[len("records-"):-len(".jsonl.gz")]
        load_text, round_text, policy = name.split("-", 2)
        if name in known or not load_text.endswith("x") or not round_text.isdigit():
            continue
        load = float(load_text[:-1])
        row = read_packed_round(folder, name, classes, valve="+cap" in policy)
        rate = round(load * result["capacity_rps"], 2)
        row.update({"policy": policy, "round": int(round_text), "load": load, "rate_rps": rate,
                    "speed_probe_ms": None, "from_records": True})
        entry = result["loads"].setdefault(f"{load:g}", {"rate_rps": rate, "rounds": [], "summary": {}})
        entry["rounds"].append(row)
        print(f"recovered round {name} from its records", file=sys.stderr)


def resummarize(folder: Path) -> int:
    """The summaries of an earlier run, recomputed from its rounds (and Meridian's request logs)."""
    from meridian.demo.loadgen import LIVE_MODELS

    result = json.loads((folder / "results.json").read_text())
    model = LIVE_MODELS[result["settings"]["model"]]
    class_names = [c.name for c in model.classes]
    targets = {c.name: c.ttft_ms for c in model.classes}
    recover_rounds(folder, result, model.classes)
    for entry in result["loads"].values():
        for row in entry["rounds"]:
            row["server_notices"] = server_notices(folder, f"{row['load']:g}x-{row['round']}-{row['policy']}", targets)
        order = result["settings"].get("arms") or []
        names = sorted(dict.fromkeys(r["policy"] for r in entry["rounds"]),
                       key=lambda n: order.index(n) if n in order else len(order))
        arms = [Arm(name, "meridian" if name.startswith("meridian") else "stock") for name in names]
        entry["summary"] = summarize(entry["rounds"], arms, class_names)
    (folder / "results.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (folder / "summary.md").write_text(markdown(result, class_names))
    print((folder / "summary.md").read_text())
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_round_arguments(parser)
    parser.set_defaults(model="long")
    parser.add_argument("--lengths", choices=LENGTH_FAMILIES, default="servegen", help="reasoning-length family")
    parser.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")], default=[1.2, 1.5, 2.0],
                        help="arrival rates as multiples of the measured capacity")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per arm and load")
    parser.add_argument("--first-round", type=int, default=0,
                        help="the first round's number (its arm order and file names): to add rounds to an earlier run")
    parser.add_argument("--arms", type=lambda s: s.split(","), default=list(DEFAULT_ARMS))
    parser.add_argument("--capacity-rps", type=float, default=None, help="skip the calibration burst")
    parser.add_argument("--cap", type=int, default=None, help="the valve's cap (default: Little's law)")
    parser.add_argument("--seed", type=int, default=0, help="the workloads' seed (each load adds its index)")
    parser.add_argument("--schedule-s", type=float, default=20.0,
                        help="seconds of arrivals per round (the request count follows the rate; --requests fixes it)")
    parser.add_argument("--variant", type=parse_variant, action="append", default=[],
                        help="NAME=JSON: a Meridian config variant, run as the arm meridian:NAME")
    parser.add_argument("--meridian-config", type=json.loads, default={},
                        help="JSON merged into Meridian's config, e.g. '{\"overload\": {...}}'")
    parser.add_argument("--placements", type=placements, default=default_placements(),
                        help="pinned (engine on one core, front end and aiperf on the other), unpinned (where the OS "
                             "puts them, as a default server runs), or both, each round in turn (default: both where "
                             "two cores allow, else unpinned); --pin is ignored")
    parser.add_argument("--resummarize", type=Path, default=None,
                        help="recompute the summaries of an earlier run's folder from its rounds and logs")
    args = parser.parse_args()
    if args.resummarize is not None:
        return resummarize(args.resummarize)
    args.requests_given = args.requests
    try:
        settings: RoundSettings = round_settings(args, REPO, f"live_overload_{args.lengths}",
                                                 meridian_config=args.meridian_config)
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 2
    classes = settings.model.classes
    class_names = [c.name for c in classes]
    # One folder per placement (the format of a one-placement run each); the placements' rounds
    # interleave, so both meet the machine's drift alike. Each placement's load is a multiple of
    # its own capacity: unpinned, the front end and aiperf take much of the machine, so one rate
    # for both would put the placements at different points past their knees.
    folders = {p: args.out / p if len(args.placements) > 1 else args.out for p in args.placements}
    placed = {p: dataclasses.replace(settings, pin=p == "pinned") for p in folders}
    capacity: dict[str, float] = {}
    cap: dict[str, int] = {}
    for placement, folder in folders.items():
        folder.mkdir(parents=True, exist_ok=True)
        capacity[placement] = args.capacity_rps or measure_capacity_rps(
            "stock", folder, placed[placement], lengths=args.lengths)
        cap[placement] = args.cap or little_law_queue_cap(capacity[placement], min(c.ttft_ms for c in classes))
        print(f"[{placement}] capacity {capacity[placement]:.1f} req/s (stock, burst of the {args.lengths} family); "
              f"valve cap {cap[placement]}", flush=True)
    arms = {p: make_arms(args.arms, cap[p], dict(args.variant)) for p in folders}
    results: dict[str, dict[str, Any]] = {
        p: {"settings": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                         "pin": p == "pinned", "placement": p, "out": str(folder)},
            "capacity_rps": capacity[p], "cap": cap[p], "loads": {}}
        for p, folder in folders.items()
    }
    for i, load in enumerate(args.loads):
        rates = {p: round(load * capacity[p], 2) for p in folders}
        rows: dict[str, list[dict[str, Any]]] = {p: [] for p in folders}
        for placement, folder in folders.items():
            num_requests = args.requests_given or max(1, round(rates[placement] * args.schedule_s))
            workload = Workload(num_requests, rates[placement], classes, seed=args.seed + i, lengths=args.lengths,
                                max_think=settings.model.max_think, max_tokens=settings.model.max_tokens).jsonl()
            (folder / f"workload-{load:g}x.jsonl").write_text(workload)
        for k in range(args.first_round, args.first_round + args.rounds):
            for placement, folder in folders.items():
                for arm in rotated(arms[placement], k):
                    name = f"{load:g}x-{k}-{arm.name}"
                    row, recs = run_round(name, arm, folder / f"workload-{load:g}x.jsonl", folder, placed[placement])
                    pack_round(folder, name, recs)
                    row.update({"round": k, "load": load, "rate_rps": rates[placement], "placement": placement,
                                "server_notices": server_notices(folder, name, {c.name: c.ttft_ms for c in classes})})
                    rows[placement].append(row)
                    print(f"[{placement}] ", end="")
                    print_round(load, k, row, class_names)
        for placement, folder in folders.items():
            summary = summarize(rows[placement], arms[placement], class_names)
            print(f"[{placement}]")
            print_summary(load, summary, arms[placement], class_names)
            results[placement]["loads"][f"{load:g}"] = {"rate_rps": rates[placement], "rounds": rows[placement],
                                                         "summary": summary}
            (folder / "results.json").write_text(json.dumps(results[placement], indent=2, default=str) + "\n")
            (folder / "summary.md").write_text(markdown(results[placement], class_names))
    print(f"wrote {args.out / 'results.json'} ({time.strftime('%H:%M')})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
