"""The ``meridian`` command.

``meridian demo`` runs the KV-pressure scenario through stock vLLM's ``AsyncScheduler`` and
``MeridianScheduler`` side by side and prints DESIGN §4's metrics (latencies in engine steps).
``meridian check-config`` validates a ``--additional-config`` value without starting vLLM.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from meridian._core import Config, __version__
from meridian.errors import MeridianError

DEFAULT_CACHE = Path(".cache")

#: (metric key, label, lower is better?)
DEMO_ROWS = [
    ("preemptions_prefill", "preemptions: prefill", True),
    ("preemptions_think", "preemptions: thinking", True),
    ("preemptions_answer", "preemptions: answering", True),
    ("answer_preemption_alarms", "answer preempted while thinking ran", True),
    ("answer_stalls", "answer stalls (gap > 5x TPOT target)", True),
    ("max_answer_gap", "longest answer gap [steps]", True),
    ("ttft_p50", "TTFT p50 [steps]", True),
    ("ttfat_mean", "TTFAT mean [steps]", True),
    ("ttfat_p50", "TTFAT p50 [steps]", True),
    ("ttfat_p99", "TTFAT p99 [steps]", True),
    ("answer_tpot_mean", "answer TPOT mean [steps]", True),
    ("goodput_frac", "met every target [fraction]", False),
    ("throughput_tok_per_step", "throughput [tokens/step]", False),
    ("steps", "steps to drain", True),
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="meridian", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"meridian {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="stock vLLM vs Meridian on the scripted KV-pressure scenario")
    demo.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="scenario seeds (default: 0 1 2)")
    demo.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where vLLM caches and the tiny model live")
    demo.add_argument("--json", type=Path, help="also write the per-seed metrics to this JSON file")

    check = sub.add_parser("check-config", help="validate a --additional-config JSON value")
    check.add_argument("additional_config", help="the JSON given to vLLM's --additional-config")

    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            return _demo(args.seeds, args.cache_dir, args.json)
        return _check_config(args.additional_config)
    except MeridianError as exc:
        print(f"meridian: error: {exc}", file=sys.stderr)
        return 2


def _check_config(text: str) -> int:
    try:
        additional = json.loads(text)
    except json.JSONDecodeError as exc:
        print(f"meridian: error: --additional-config is not valid JSON: {exc}", file=sys.stderr)
        return 2
    block = additional.get("meridian", {}) if isinstance(additional, dict) else additional
    config = Config.from_json(json.dumps(block))
    print(f"ok: classes {', '.join(config.class_names)} (default {config.default_class})")
    return 0


def _demo(seeds: list[int], cache_dir: Path, json_path: Path | None) -> int:
    # vLLM's start-up notes (Triton, CPU block size) would interleave with the progress lines.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from meridian.scripted import Scenario, run_scenario, summarize

    scenario = Scenario()
    print(
        f"Meridian {__version__} demo: {scenario.num_requests} reasoning requests "
        f"({scenario.think_tokens[0]}-{scenario.think_tokens[1]} thinking + "
        f"{scenario.answer_tokens[0]}-{scenario.answer_tokens[1]} answer tokens) arriving over "
        f"{scenario.arrival_window_steps} steps into a {scenario.kv_cache_tokens}-token KV cache.\n"
        "vLLM's real schedulers, scripted model outputs, virtual time (1 step = 1 ms); latencies in steps.",
        flush=True,
    )
    results: dict[str, list[dict[str, float]]] = {"vllm": [], "meridian": []}
    started = time.monotonic()
    total = len(seeds) * 2
    for i, seed in enumerate(seeds):
        for j, policy in enumerate(("vllm", "meridian")):
            done = i * 2 + j
            print(f"  [{done + 1}/{total}] seed {seed}: {policy:<8} ...", end="", flush=True)
            metrics = summarize(run_scenario(policy, seed, cache_dir, scenario))
            results[policy].append(metrics)
            print(f" {time.monotonic() - started:6.1f}s", flush=True)
    print()
    print(_table(results, seeds))
    if json_path is not None:
        json_path.write_text(json.dumps({"seeds": seeds, "results": results}, indent=2) + "\n")
        print(f"\nwrote {json_path}")
    return 0


def _table(results: dict[str, list[dict[str, float]]], seeds: list[int]) -> str:
    def fmt(v: float) -> str:
        if math.isnan(v):
            return "-"
        return f"{v:.0f}" if float(v).is_integer() else f"{v:.2f}"

    title = "metric (per seed: " + " / ".join(map(str, seeds)) + ")"
    rows = [(label, [" / ".join(fmt(m[key]) for m in results[p]) for p in ("vllm", "meridian")]) for key, label, _ in DEMO_ROWS]
    width = max(len(title), *(len(label) for label, _ in rows)) + 2
    cell = max(len("stock vLLM"), *(len(c) for _, cells in rows for c in cells)) + 3
    header = f"{title:<{width}}{'stock vLLM':>{cell}}{'Meridian':>{cell}}"
    lines = [header, "-" * len(header)]
    lines.extend(f"{label:<{width}}{cells[0]:>{cell}}{cells[1]:>{cell}}" for label, cells in rows)
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
