"""The sweep behind the default ``late_think_ttfat_factor``: Meridian alone on the development
workloads of ``bench/replay_ab.py`` at its FCFS ~50 % load, with the running side's tail bound at
several factors, beside stock FCFS.

A running thinker that can no longer make its TTFAT target yields its decode to prompt chunks
until it has been in the system (1 + factor) × its class's TTFAT target. Factor 0: it never
yields (late thinkers decode at full speed, prompts stream in slower); 1e9: it always yields (the
order before the rule). The default is the factor with the most goodput whose per-class TTFAT
and TTFT p99 stay at or under FCFS's, judged on both workloads. Virtual time.

    .venv/bin/python bench/replay_late_think_sweep.py [--factors 0 0.25 1 1e9] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from development import HALF_LOAD, replay_variants, workloads, write_results  # noqa: E402
from meridian.replay.runner import default_meridian_config  # noqa: E402


def tails(summary: dict) -> str:
    return "  ".join(
        f"{name} TTFT/TTFAT p99 {c['ttft_ms']['p99'] / 1e3:.1f}/{c['ttfat_ms']['p99'] / 1e3:.0f} s"
        for name, c in sorted(summary["per_class"].items())
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=None)
    parser.add_argument("--factors", nargs="+", type=float, default=[0.0, 0.25, 1.0, 1e9])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    available = workloads(0)
    results: dict[str, object] = {}
    for name in args.workloads or list(available):
        started = time.monotonic()
        rows = replay_variants(name, {f"meridian, factor {factor:g}":
                                      {**default_meridian_config(), "late_think_ttfat_factor": factor}
                                      for factor in args.factors})
        fcfs = rows["vllm-fcfs"]
        print(f"\n=== {name} at ×{HALF_LOAD[name]:.3g} ({time.monotonic() - started:.0f} s wall)")
        for label, s in rows.items():
            print(f"  {label:<24} goodput {s['goodput_rps']:.3f} ({s['goodput_rps'] / fcfs['goodput_rps']:.2f}× FCFS)  "
                  f"{tails(s)}")
        results[name] = {"rate_scale": HALF_LOAD[name], "policies": rows}
    write_results(results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
