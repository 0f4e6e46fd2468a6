"""Disaggregated prefill/decode in the replay: does splitting prefill and decode onto separate
engines pay for reasoning traffic, and do Meridian's phase rules still matter once prefill is out
of the decode engine?

On each development workload (``bench/development.py``: Azure LLM 2023 on the H200 / Qwen3-32B
profile, Mooncake on the H200 / Qwen3-8B profile, ServeGen DeepSeek-R1 reasoning lengths), with
four engines behind the router (round robin):

1. the load where colocated stock FCFS on four engines meets every target for about half of its
   requests: probes from six times the one-engine half load upward until one falls below half,
   one between the bracket's ends, the closest taken;
2. there, side by side on the same request list: colocated ×4 (stock FCFS, Meridian), P/D 1:3 with
   each side stock or Meridian (four pairs), P/D 2:2 (stock, Meridian), and P/D 1:3 on a slower
   link (``--transfer-gbps`` ``SLOW_LINK_GBPS``: 100 Gb/s Ethernet at 0.8) (stock, Meridian).

Virtual time: the numbers do not depend on this machine's speed. Results:
``bench/results/pd_replay_<date>/pd_replay.json`` and the printed tables.

    .venv/bin/python bench/pd_replay.py [--workloads azure mooncake] [--seed 0] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from development import HALF_LOAD, workloads, write_results  # noqa: E402
from meridian.replay.disaggregated import pd_table  # noqa: E402
from meridian.replay.runner import run_replay  # noqa: E402

NUM_ENGINES = 4
#: 100 Gb/s Ethernet (RoCE) at 0.8 of line rate, in GB/s: a slow hand-off link.
SLOW_LINK_GBPS = 10.0
#: First probes (× the one-engine half load), two at a time, growing by ``PROBE_STEP`` until one
#: falls below half; then one probe between the bracket's ends. Four engines behind a router
#: pool their seats: at four times one engine's half load they still meet ~80 %.
FIRST_PROBES = (6.0, 9.0)
PROBE_STEP = 2.25
MAX_PROBE_ROUNDS = 4


def _attainment(options, scales: tuple[float, ...]) -> list[dict[str, float]]:
    report = run_replay(replace(options, policies=("vllm-fcfs",), rate_scales=scales, fleet=NUM_ENGINES))
    return [{"rate_scale": r.rate_scale, "attainment": r.summary["attainment"]} for r in report.runs]


def half_load(options, name: str) -> tuple[float, list[dict[str, float]]]:
    """The probed rate scale where colocated FCFS on four engines meets about half its requests."""
    multiples = FIRST_PROBES
    probes: list[dict[str, float]] = []
    for _ in range(MAX_PROBE_ROUNDS):
        probes += _attainment(options, tuple(HALF_LOAD[name] * k for k in multiples))
        if min(p["attainment"] for p in probes) < 0.5:
            break
        multiples = tuple(k * PROBE_STEP for k in multiples)
    below = min((p for p in probes if p["attainment"] < 0.5), key=lambda p: p["rate_scale"], default=None)
    above = max((p for p in probes if p["attainment"] >= 0.5), key=lambda p: p["rate_scale"], default=None)
    if below is not None and above is not None:
        probes += _attainment(options, ((below["rate_scale"] * above["rate_scale"]) ** 0.5,))
    best = min(probes, key=lambda p: abs(p["attainment"] - 0.5))
    return best["rate_scale"], sorted(probes, key=lambda p: p["rate_scale"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results: dict[str, object] = {"engines": NUM_ENGINES, "router": "round_robin", "slow_link_gbps": SLOW_LINK_GBPS}
    for name, workload in workloads(args.seed).items():
        if args.workloads and name not in args.workloads:
            continue
        started = time.monotonic()
        options = replace(workload.options, jobs=2)
        scale, probes = half_load(options, name)
        print(f"{name}: colocated FCFS ×{NUM_ENGINES} probes {probes}; load ×{scale:g}", flush=True)
        at = replace(options, rate_scales=(scale,))
        runs = {}
        main_report = run_replay(
            replace(
                at,
                disaggregated="1:3",
                policies=("vllm-fcfs", "meridian", "vllm-fcfs/meridian", "meridian/vllm-fcfs"),
            )
        )
        runs.update({r.policy: r.summary for r in main_report.runs})
        even = run_replay(replace(at, disaggregated="2:2", policies=("vllm-fcfs/vllm-fcfs", "meridian/meridian")))
        runs.update({r.policy: r.summary for r in even.runs})
        slow = run_replay(
            replace(
                at,
                disaggregated="1:3",
                transfer_gbps=SLOW_LINK_GBPS,
                policies=("vllm-fcfs/vllm-fcfs", "meridian/meridian"),
            )
        )
        runs.update({f"{r.policy} @{SLOW_LINK_GBPS:g}GB/s": r.summary for r in slow.runs})
        summaries = [{**s, "policy": label} for label, s in runs.items()]
        print(pd_table(summaries), flush=True)
        results[name] = {
            "rate_scale": scale,
            "fcfs_probes": probes,
            "workload": main_report.workload,
            "transfer": {
                "default": main_report.workload["disaggregated"],
                "slow": slow.workload["disaggregated"],
            },
            "runs": runs,
            "wall_s": time.monotonic() - started,
        }
    write_results(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
