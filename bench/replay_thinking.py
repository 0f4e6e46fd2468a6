"""Replay: what thinking control does to goodput and TTFAT on the development workloads.

Stock FCFS and Meridian, each without thinking control, with a hard thinking budget and with the
load-aware budget (defaults: 4,096 tokens tightening toward 512 while the class's recent TTFAT
attainment is below 90 %), all at the load where FCFS without control attains about half of its
requests (the scale ``bench/replay_ab.py`` found; pass ``--scale`` to override). The control
applies to both schedulers alike, so each pair compares schedulers under the same truncation.
Shorter reasoning changes what is served: the table says how many thinking tokens each setting
removed, and nothing here can say what that costs in answer quality.

    .venv/bin/python bench/replay_thinking.py [--workloads azure mooncake] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from development import HALF_LOAD, workloads  # noqa: E402
from meridian.replay.report import table  # noqa: E402
from meridian.replay.runner import default_meridian_config, run_replay  # noqa: E402

#: FCFS ~50 % load per workload, from bench/results/replay_ab_2026-11-29.json.
SETTINGS = {
    "no control": None,
    "budget 2048": {"budget_tokens": 2048},
    "load-aware": {"load_aware": {}},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=None)
    parser.add_argument("--scale", type=float, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    available = workloads(0)
    results: dict[str, object] = {}
    for name in args.workloads or list(available):
        workload = available[name]
        scale = args.scale or HALF_LOAD[name]
        rows = []
        results[name] = {"rate_scale": scale, "settings": {}}
        for setting, control in SETTINGS.items():
            config = default_meridian_config()
            if control is not None:
                config["thinking_control"] = control
            started = time.monotonic()
            report = run_replay(replace(workload.options, policies=("vllm-fcfs", "meridian"), rate_scales=(scale,),
                                        meridian_config=config))
            for run in report.runs:
                summary = dict(run.summary, policy=f"{run.policy} / {setting}")
                rows.append(summary)
            results[name]["settings"][setting] = {r.policy: r.summary for r in report.runs}  # type: ignore[index]
            print(f"  {name} {setting}: {time.monotonic() - started:.0f} s", flush=True)
        base = next(r for r in rows if r["policy"] == "vllm-fcfs / no control")
        print(f"\n=== {name}: profile {workload.options.profile}, ×{scale}")
        print(table(rows, baseline="vllm-fcfs / no control"))
        for r in rows:
            saved = 1 - r["thinking_tokens"] / base["thinking_tokens"] if base["thinking_tokens"] else 0.0
            print(f"    {r['policy']:<28} thinking tokens {r['thinking_tokens']:>11,}  ({saved:.1%} fewer than FCFS without control)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
