"""Replay: the host KV tier on the H200 profiles — stock vLLM and Meridian, each without and with
a host tier (vLLM's OffloadingConnector, its loads priced at the profile's host link), on the
development workloads of ``bench/replay_ab.py`` at their FCFS ~50 % load and at twice it (more
KV pressure). Reports goodput, preemptions, how many preempted requests came back by a load (of all of
them, and of those whose blocks the tier held when they were preempted: ``stored→ld``), the share
of resumed requests' tokens that came back without a recompute (vLLM's own statistics: found in
the device's prefix cache or loaded from the tier: ``kept``), and
Meridian's restore-or-recompute choices (hits it loaded, hits it recomputed because the extra
step cost more). Virtual time: the numbers do not depend on this machine's speed.

    .venv/bin/python bench/replay_kv_tier.py [--workloads azure mooncake] [--host-tier-gib 128] [--json PATH]
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
from meridian.replay.runner import run_replay  # noqa: E402

POLICIES = ("vllm-fcfs", "meridian")
LOAD_FACTORS = (1.0, 2.0)


def row(summary: dict[str, object], label: str, base: dict[str, object] | None) -> str:
    tier = summary["kv_tier"]
    pre = summary["preemptions"]
    num_preempted = sum(pre.values())
    plans = tier.get("restore_plans") or {}
    ratio = summary["goodput_rps"] / base["goodput_rps"] if base and base["goodput_rps"] else float("nan")
    restored = f"{tier['restored_resumes']}/{num_preempted}" if num_preempted else "-"
    resumed = tier.get("resumed_tokens", 0)
    kept = (f"{(tier['resumed_device_hit_tokens'] + tier['resumed_tier_hit_tokens']) / resumed * 100:.0f}%"
            if resumed else "-")
    stored = tier.get("stored_preemptions", 0)
    stored_restored = f"{tier.get('stored_restored_resumes', 0)}/{stored}" if stored else "-"
    choices = (f"{plans.get('num_restores', 0)} loaded / {plans.get('num_recomputes', 0)} recomputed"
               if plans else "-")
    return (f"{label:<22} {summary['goodput_rps']:>9.3f} {ratio:>6.2f} {summary['attainment'] * 100:>5.0f}% "
            f"{summary['throughput_tok_s']:>8.0f} {pre['think']:>7} {restored:>10} {stored_restored:>10} {kept:>7} "
            f"{tier['loaded_tokens']:>12,}  {choices}")


def run(name: str, host_tier_gib: float) -> dict[str, object]:
    options = workloads(0)[name].options
    out: dict[str, object] = {}
    for factor in LOAD_FACTORS:
        scale = HALF_LOAD[name] * factor
        rows: dict[str, dict[str, object]] = {}
        for gib in (0.0, host_tier_gib):
            report = run_replay(replace(options, rate_scales=(scale,), policies=POLICIES, host_tier_gib=gib, jobs=2))
            for r in report.runs:
                rows[f"{r.policy}{' +tier' if gib else ''}"] = r.summary
        print(f"\n=== {name} ×{scale:.4g} (FCFS ~50 % load × {factor:g}), profile {options.profile}, "
              f"tier {host_tier_gib:g} GiB")
        print(f"{'policy':<22} {'goodput/s':>9} {'×same':>6} {'attain':>6} {'tok/s':>8} {'think pre':>7} "
              f"{'restored':>10} {'stored→ld':>10} {'kept':>7} {'loaded tok':>12}  Meridian's choices")
        for label, summary in rows.items():
            base = rows[label.replace(" +tier", "")]
            print(row(summary, label, base))
        out[f"x{factor:g}"] = {"rate_scale": scale, "rows": rows}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["azure", "mooncake"])
    parser.add_argument("--host-tier-gib", type=float, default=128.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    started = time.time()
    results: dict[str, object] = {"host_tier_gib": args.host_tier_gib}
    for name in args.workloads:
        results[name] = run(name, args.host_tier_gib)
    print(f"\n({time.time() - started:.0f} s wall)")
    write_results(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
