"""Replay A/B: stock vLLM and Meridian side by side on the development workloads, at the load
where stock FCFS attains about half of its requests within target.

Workloads (``../shared/traces/README.md``; the bundled excerpt stands in when that folder is
absent):
  * ``azure``    — Azure LLM inference 2023, code + conversation merged by timestamp as two classes
                   (code → interactive, conversation → standard), H200 / Qwen3-32B-class profile;
  * ``mooncake`` — Mooncake FAST'25 synthetic trace (Poisson arrivals, real prefix-block reuse),
                   30 % interactive / 70 % standard, H200 / Qwen3-8B-class profile (its prompts
                   average 15k tokens).
Both: real arrivals + production-derived reasoning lengths (ServeGen DeepSeek-R1, seeded). Class
targets: the replay's defaults, ``python/meridian/replay/data/reasoning_classes.json``.

For each workload the script replays stock FCFS over a grid of rate scales and two refinements
of the bracket around 50 % attainment, picks the probed scale closest to 50 %, then replays every
policy there and prints the table and the targets' verdicts. The policies include vLLM's own load
valve (``--max-num-queued-reqs``) in front of stock vLLM, at the cap vLLM's docs advise
(``vllm-fcfs+cap``, ``vllm-priority+cap``) and at the best cap of a grid searched at that load
(``vllm-fcfs+cap*``: an oracle, generous to the baseline). A second point (``--second-point``,
on by default): the scale where FCFS attains about 70 % (the same search), FCFS and Meridian
there, and Meridian's TTFAT p50 against the unloaded TTFAT p50 — Meridian replayed at 1 % of that
rate on the first ``UNLOADED_REQUESTS`` requests (alone on the engine, each runs as if the server
were idle; the full list at 1 % would take a million steps for the same number). Virtual time:
the numbers do not depend on this machine's speed.

    .venv/bin/python bench/replay_ab.py [--workloads azure mooncake] [--seed 0] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from development import Workload, workloads, write_results  # noqa: E402
from meridian.replay.policies import POLICIES, TUNED_VALVE  # noqa: E402
from meridian.replay.report import table  # noqa: E402
from meridian.replay.runner import run_replay  # noqa: E402


def _fcfs_attainment(workload: Workload, scales: tuple[float, ...]) -> list[dict[str, float]]:
    report = run_replay(replace(workload.options, policies=("vllm-fcfs",), rate_scales=scales))
    return [{"rate_scale": r.rate_scale, "attainment": r.summary["attainment"]} for r in report.runs]


def fcfs_load_at(
    workload: Workload, target: float, probes: list[dict[str, float]] | None = None, rounds: int = 2
) -> tuple[float, list[dict[str, float]]]:
    """The probed rate scale whose FCFS attainment is closest to ``target``: a grid (unless
    ``probes`` from an earlier search are given), then ``rounds`` refinements, each probing two
    points inside the bracket around ``target`` (two workers)."""
    probes = list(probes) if probes else _fcfs_attainment(workload, workload.scales)
    for _ in range(rounds):
        probes.sort(key=lambda p: p["rate_scale"])
        above = [p for p in probes if p["attainment"] >= target]
        below = [p for p in probes if p["attainment"] < target]
        if not above or not below or min(abs(p["attainment"] - target) for p in probes) <= 0.05:
            break
        lo, hi = math.log(max(p["rate_scale"] for p in above)), math.log(min(p["rate_scale"] for p in below))
        inner = tuple(math.exp(lo + f * (hi - lo)) for f in (1 / 3, 2 / 3))
        probes += _fcfs_attainment(workload, inner)
    probes.sort(key=lambda p: p["rate_scale"])
    best = min(probes, key=lambda p: abs(p["attainment"] - target))
    return best["rate_scale"], probes


#: Requests of the unloaded reference replay (the first ones of the window, at 1 % of the rate).
UNLOADED_REQUESTS = 300
#: The second point's target: Meridian's TTFAT p50 at most this × the unloaded TTFAT p50.
UNLOADED_TTFAT_RATIO = 1.3


def second_point(workload: Workload, probes: list[dict[str, float]]) -> dict[str, object]:
    """FCFS and Meridian where FCFS attains ~70 % (one refinement of the search), and Meridian
    unloaded (1 % of that rate)."""
    scale, probes = fcfs_load_at(workload, 0.7, probes, rounds=1)
    report = run_replay(replace(workload.options, policies=("vllm-fcfs", "meridian"), rate_scales=(scale,)))
    summaries = {r.policy: r.summary for r in report.runs}
    unloaded = run_replay(replace(workload.options, policies=("meridian",), rate_scales=(scale / 100,),
                                  limit=UNLOADED_REQUESTS)).runs[0].summary
    loaded_p50, idle_p50 = summaries["meridian"]["ttfat_ms"]["p50"], unloaded["ttfat_ms"]["p50"]
    ratio = loaded_p50 / idle_p50 if loaded_p50 and idle_p50 else math.inf
    print(f"    second point: FCFS ~70 % at ×{scale:.3g}")
    print(table(list(summaries.values())))
    print(f"    Meridian TTFAT p50 {loaded_p50 / 1e3:.1f} s vs unloaded {idle_p50 / 1e3:.1f} s (×{scale / 100:.3g}, "
          f"first {UNLOADED_REQUESTS} requests): {ratio:.2f}× (target ≤ {UNLOADED_TTFAT_RATIO}) "
          f"{'met' if ratio <= UNLOADED_TTFAT_RATIO else 'MISSED'}")
    return {"rate_scale": scale, "fcfs_probes": probes, "policies": summaries, "unloaded": unloaded,
            "ttfat_p50_vs_unloaded": ratio}


def tails_within_fcfs(summary: dict, fcfs: dict) -> bool:
    """Every class's TTFT p99 and TTFAT p99 at or under FCFS's (issue 11's tail rule)."""
    return all(
        summary["per_class"][name][metric]["p99"] is not None
        and summary["per_class"][name][metric]["p99"] <= fcfs["per_class"][name][metric]["p99"]
        for name in fcfs["per_class"] for metric in ("ttft_ms", "ttfat_ms")
    )


def verdicts(summaries: dict[str, dict]) -> list[str]:
    fcfs, ours = summaries["vllm-fcfs"], summaries["meridian"]
    others = [s for name, s in summaries.items() if name not in ("meridian",)]
    best_other = max(others, key=lambda s: s["goodput_rps"])
    keeping_tails = [s for s in others if s is fcfs or tails_within_fcfs(s, fcfs)]
    best_keeping_tails = max(keeping_tails, key=lambda s: s["goodput_rps"])

    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else math.inf

    g_fcfs = ratio(ours["goodput_rps"], fcfs["goodput_rps"])
    t_fcfs = ratio(ours["throughput_tok_s"], fcfs["throughput_tok_s"])
    g_best = ratio(ours["goodput_rps"], best_other["goodput_rps"])
    lines = [
        f"goodput vs FCFS          {g_fcfs:5.2f}×  (target ≥ 1.5)  {'met' if g_fcfs >= 1.5 else 'MISSED'}",
        f"throughput vs FCFS       {t_fcfs:5.3f}×  (target ≥ 0.99) {'met' if t_fcfs >= 0.99 else 'MISSED'}",
        f"answer-phase stalls      {ours['stalls']:5d}   (target 0)      {'met' if ours['stalls'] == 0 else 'MISSED'}",
        f"goodput vs best baseline {g_best:5.2f}×  ({best_other['policy']}; target ≥ 1.2) {'met' if g_best >= 1.2 else 'MISSED'}",
        *_against_scorpio_and_valve(summaries),
        f"goodput vs best baseline whose tails stay within FCFS's "
        f"{ratio(ours['goodput_rps'], best_keeping_tails['goodput_rps']):5.2f}×  ({best_keeping_tails['policy']}; "
        f"baselines that keep them: {', '.join(s['policy'] for s in keeping_tails) or 'none'})",
    ]
    # The tail: no class's TTFT p99 or TTFAT p99 worse than FCFS's.
    for name in sorted(ours["per_class"]):
        mine, base = ours["per_class"][name], fcfs["per_class"][name]
        for metric in ("ttft_ms", "ttfat_ms"):
            got, ref = mine[metric]["p99"], base[metric]["p99"]
            ok = got is not None and ref is not None and got <= ref
            lines.append(f"{name:<12} {metric[:-3]:>5} p99 {got / 1e3 if got else float('nan'):7.1f} s vs FCFS "
                         f"{ref / 1e3 if ref else float('nan'):7.1f} s  {'met' if ok else 'MISSED'}")
    return lines


def _against_scorpio_and_valve(summaries: dict[str, dict]) -> list[str]:
    """Requests meeting every target, Meridian's over the better of SCORPIO and the tuned valve
    (when both ran), with the cap the valve's search picked."""
    if not {"meridian", "scorpio", TUNED_VALVE} <= set(summaries):
        return []
    ours, scorpio, valve = summaries["meridian"], summaries["scorpio"], summaries[TUNED_VALVE]
    best = max((scorpio, valve), key=lambda s: s["good"])
    ratio = ours["good"] / best["good"] if best["good"] else math.inf
    return [f"good vs best of SCORPIO and the tuned valve {ratio:5.2f}×  ({ours['good']} vs {best['policy']} "
            f"{best['good']}; SCORPIO {scorpio['good']}, valve {valve['good']} at cap {valve.get('queue_cap')}, "
            f"{valve.get('refused', 0)} refused)"]


def render(results: dict[str, dict]) -> int:
    """The tables and verdicts of a saved run."""
    for name, result in results.items():
        summaries = result["policies"]
        print(f"\n=== {name}: {result['workload']['num_requests']} requests at ×{result['rate_scale']:.3g}")
        print(table(list(summaries.values())))
        for line in verdicts(summaries):
            print("    " + line)
        second = result.get("second_point")
        if second:
            print(f"    second point: FCFS ~70 % at ×{second['rate_scale']:.3g}")
            print(table(list(second["policies"].values())))
            print(f"    Meridian TTFAT p50 vs unloaded: {second['ttfat_p50_vs_unloaded']:.2f}× "
                  f"(target ≤ {UNLOADED_TTFAT_RATIO})")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=None, help="azure, mooncake (default: all available)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--policies", nargs="+", default=[*POLICIES, TUNED_VALVE],
                        help=f"policies to replay (default: all, and {TUNED_VALVE}, the valve at its best cap)")
    parser.add_argument("--probes-from", type=Path, default=None,
                        help="an earlier run's JSON: start each FCFS search from its probes (the same "
                             "workload and seed replay identically in virtual time)")
    parser.add_argument("--render", type=Path, default=None,
                        help="print the tables and verdicts of an earlier run's JSON, replaying nothing")
    parser.add_argument("--no-second-point", dest="second_point", action="store_false",
                        help="skip the FCFS ~70 %% point and the unloaded reference")
    args = parser.parse_args()
    if args.render:
        return render(json.loads(args.render.read_text()))
    available = workloads(args.seed)
    names = args.workloads or list(available)
    results: dict[str, object] = {}
    for name in names:
        if name not in available:
            print(f"workload {name!r} is not available here (needs ../shared/traces)", file=sys.stderr)
            return 2
        workload = available[name]
        started = time.monotonic()
        earlier = json.loads(args.probes_from.read_text())[name]["fcfs_probes"] if args.probes_from else None
        scale, probes = fcfs_load_at(workload, 0.5, earlier)
        probe_text = ", ".join(f"×{p['rate_scale']:.3g}: {p['attainment']:.0%}" for p in probes)
        report = run_replay(replace(workload.options, policies=tuple(args.policies), rate_scales=(scale,)))
        summaries = {r.policy: r.summary for r in report.runs}
        print(f"\n=== {name}: {report.workload['num_requests']} requests, profile {workload.options.profile}")
        print(f"    {report.workload['reasoning_lengths']}")
        print(f"    FCFS attainment by rate scale: {probe_text} → replaying at ×{scale:.3g}")
        print(table(list(summaries.values())))
        for line in verdicts(summaries):
            print("    " + line)
        results[name] = {"rate_scale": scale, "fcfs_probes": probes, "workload": report.workload, "policies": summaries}
        if args.second_point:
            results[name]["second_point"] = second_point(workload, probes)
        print(f"    ({time.monotonic() - started:.0f} s wall)")
    write_results(results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
