"""The ``meridian`` command.

``meridian demo`` runs the KV-pressure scenario through stock vLLM's ``AsyncScheduler`` and
``MeridianScheduler`` side by side and prints DESIGN §4's metrics (latencies in engine steps).
``meridian replay`` replays a trace through stock vLLM's schedulers and Meridian's policies in
virtual time on a hardware profile (``meridian.replay``).
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
    demo.add_argument("--json", type=Path, help="also write the metrics to this JSON file")
    demo.add_argument("--parts", nargs="+", choices=["scripted", "replay", "live", "thinking"],
                      default=["scripted", "replay", "live", "thinking"], help="which parts to run (default: all)")
    demo.add_argument("--model", type=Path, default=None, help="model folder for the live part "
                      "(default: tests/fixtures/tiny-reasoner)")
    demo.add_argument("--live-requests", type=int, default=24, help="concurrent requests in the live burst")

    _add_replay_parser(sub)

    fit = sub.add_parser("fit-profile", help="fit a replay profile to the step log of a real vLLM run")
    fit.add_argument("step_log", type=Path, help="the JSONL file Meridian wrote with `step_log_path` set")
    fit.add_argument("--base", default="h200-qwen3-8b",
                     help="profile (name or JSON) whose KV capacity and batch limits the fit keeps")
    fit.add_argument("--name", default="fitted", help="name of the new profile")
    fit.add_argument("--out", type=Path, required=True, help="where to write the profile JSON")

    check = sub.add_parser("check-config", help="validate a --additional-config JSON value")
    check.add_argument("additional_config", help="the JSON given to vLLM's --additional-config")

    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            report: dict[str, object] = {}
            if "scripted" in args.parts:
                report["scripted"] = _demo(args.seeds, args.cache_dir)
            if "replay" in args.parts:
                report["replay"] = _replay_demo(args.cache_dir)
            if "live" in args.parts:
                report["live"] = _live_demo(args.model, args.cache_dir, args.live_requests)
            if "thinking" in args.parts:
                report["thinking"] = _thinking_demo(args.model, args.cache_dir)
            if args.json is not None:
                args.json.write_text(json.dumps(report, indent=2) + "\n")
                print(f"\nwrote {args.json}")
            return 0
        if args.command == "replay":
            return _replay(args)
        if args.command == "fit-profile":
            return _fit_profile(args)
        return _check_config(args.additional_config)
    except (MeridianError, ValueError, OSError) as exc:
        print(f"meridian: error: {exc}", file=sys.stderr)
        return 2


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"rate scales must be positive numbers, got {text!r}")
    return values


def _add_replay_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from meridian.replay.engine import POLICIES
    from meridian.replay.runner import DEFAULT_PROFILE

    replay = sub.add_parser(
        "replay",
        help="replay a trace through stock vLLM and Meridian in virtual time",
        description="Replays a trace through vLLM's own schedulers and Meridian's policies, driven like vLLM's "
        "engine core, in virtual time on a hardware profile. Without --trace: the bundled Azure LLM 2023 "
        "excerpt (code + conversation, CC-BY-4.0) with ServeGen reasoning lengths.",
    )
    replay.add_argument("--trace", type=Path, action="append", default=None,
                        help="trace file (Mooncake JSONL, Azure LLM CSV, Meridian JSONL); repeat to merge several")
    replay.add_argument("--format", choices=["mooncake", "azure", "meridian"], default=None,
                        help="trace format (default: inferred from the file)")
    replay.add_argument("--reasoning", choices=["auto", "trace", "servegen", "servegen-ratio", "none"], default="auto",
                        help="thinking/answer split: from the trace, sampled from ServeGen's DeepSeek-R1 "
                        "distributions (whole output, or the trace's output split by a sampled ratio), or none "
                        "(default auto: the trace's split when it has one, else servegen)")
    replay.add_argument("--servegen-dir", type=Path, default=None,
                        help="ServeGen data/reason/deepseek-r1 folder (default: the bundled summary)")
    replay.add_argument("--classes", default=None,
                        help="SLO class rule: trace | fixed:NAME | mix:a=0.2,b=0.8 | by-source:code=A,conv=B")
    replay.add_argument("--rate-scale", type=_floats, default=None,
                        help="arrival-rate multipliers, comma-separated; several give a load sweep "
                        "(default 1; the demo's 0.08 for the bundled excerpt)")
    replay.add_argument("--start-s", type=float, default=0.0, help="start of the trace window in seconds")
    replay.add_argument("--duration-s", type=float, default=None,
                        help="length of the trace window in seconds (default: all; the demo's window for the "
                        "bundled excerpt)")
    replay.add_argument("--limit", type=int, default=None, help="replay at most this many requests")
    replay.add_argument("--profile", default=DEFAULT_PROFILE,
                        help=f"hardware/model profile: a bundled name or a JSON file (default {DEFAULT_PROFILE})")
    replay.add_argument("--policies", default=",".join(POLICIES),
                        help=f"comma-separated policies (default all: {', '.join(POLICIES)})")
    replay.add_argument("--config", default=None,
                        help="Meridian config (the `meridian` block) as JSON or @file: classes, targets, knobs")
    replay.add_argument("--seed", type=int, default=0, help="seed of every sampled quantity (default 0)")
    replay.add_argument("--jobs", type=int, default=0, help="worker processes (default: one per core)")
    replay.add_argument("--json", type=Path, default=None, help="write the metrics to this JSON file")
    replay.add_argument("--report-dir", type=Path, default=None, help="write PNG plots and replay.json here")
    replay.add_argument("--no-progress", action="store_true", help="no progress bar")
    replay.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where vLLM's caches live")


def _replay(args: argparse.Namespace) -> int:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from meridian.replay.runner import (
        DEFAULT_TRACES,
        DEMO_OPTIONS,
        ReplayOptions,
        load_config_arg,
        render,
        run_replay,
        write_outputs,
    )

    # Without a trace, the bundled excerpt at the demo's window and load: the whole excerpt at its
    # real rate would overload a 32B-class GPU many times over and run for hours.
    bundled = not args.trace
    options = ReplayOptions(
        traces=tuple(args.trace) if args.trace else DEFAULT_TRACES,
        trace_format=args.format,
        reasoning=args.reasoning,
        servegen_dir=args.servegen_dir,
        classes=args.classes,
        rate_scales=args.rate_scale or (DEMO_OPTIONS.rate_scales if bundled else (1.0,)),
        start_s=args.start_s,
        duration_s=args.duration_s if args.duration_s is not None or not bundled else DEMO_OPTIONS.duration_s,
        limit=args.limit,
        profile=args.profile,
        policies=[p.strip() for p in args.policies.split(",") if p.strip()],
        meridian_config=load_config_arg(args.config),
        seed=args.seed,
        jobs=args.jobs,
        progress=not args.no_progress,
        cache_dir=args.cache_dir,
    )
    report = run_replay(options)
    print(render(report))
    for path in write_outputs(report, args.json, args.report_dir):
        print(f"wrote {path}")
    return 0


def _fit_profile(args: argparse.Namespace) -> int:
    from meridian.replay.profiles import Profile, fit_profile

    profile = fit_profile(args.step_log, Profile.load(args.base), args.name)
    args.out.write_text(json.dumps(profile.to_json(), indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {profile.sources['fit']}")
    return 0


def _replay_demo(cache_dir: Path) -> dict[str, object]:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from meridian.replay.runner import DEMO_OPTIONS, render, run_replay

    print("\nReplay: a bundled excerpt of the Azure LLM inference trace 2023 (Patel et al., Splitwise, ISCA '24; "
          "CC-BY-4.0), real arrivals + production-derived reasoning lengths (ServeGen DeepSeek-R1), on the "
          "H200 / 32B-class profile, every policy, virtual time.", flush=True)
    started = time.monotonic()
    report = run_replay(DEMO_OPTIONS.with_cache_dir(cache_dir))
    print(render(report))
    print(f"(replayed in {time.monotonic() - started:.0f} s)", flush=True)
    return report.to_json()


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


def _demo(seeds: list[int], cache_dir: Path) -> dict[str, object]:
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
    return {"seeds": seeds, "results": results}


LIVE_ROWS = [
    ("completed", "completed requests"),
    ("preemptions", "preemptions (vLLM /metrics)"),
    ("preemptions_think", "  of which thinking (Meridian ledger)"),
    ("preemptions_answer", "  of which answering (Meridian ledger)"),
    ("answer_stalls", "answer stalls (gap > 250 ms)"),
    ("answer_itl_p99_ms", "answer ITL p99 [ms]"),
    ("answer_itl_max_ms", "answer ITL max [ms]"),
    ("answer_tpot_mean_ms", "answer TPOT mean [ms]"),
    ("ttft_p50_ms", "TTFT p50 [ms]"),
    ("ttfat_p50_ms", "TTFAT p50 [ms]"),
    ("ttfat_p99_ms", "TTFAT p99 [ms]"),
    ("throughput_tok_s", "throughput [tokens/s]"),
]


def _live_demo(model: Path | None, cache_dir: Path, num_requests: int) -> dict[str, object]:
    from meridian.live import DEFAULT_MODEL, LiveWorkload, run_live

    workload = LiveWorkload(num_requests=num_requests)
    print(
        f"\nLive: vLLM's OpenAI server (CPU build) serving the tiny reasoning model, {num_requests} concurrent "
        "streaming requests (think 20-99, answer 5-26 tokens), 640-token KV cache; wall-clock latencies.",
        flush=True,
    )
    results: dict[str, dict[str, float]] = {}
    for policy in ("vllm", "meridian"):
        print(f"  {policy}: starting the server ...", flush=True)
        results[policy] = run_live(policy, workload, model or DEFAULT_MODEL, cache_dir, cache_dir / "live",
                                   progress=lambda line: print(line, flush=True))

    def fmt(v: float | None) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"

    width = max(len(label) for _, label in LIVE_ROWS) + 2
    print()
    print(f"{'metric':<{width}}{'stock vLLM':>14}{'Meridian':>14}")
    print("-" * (width + 28))
    for key, label in LIVE_ROWS:
        print(f"{label:<{width}}{fmt(results['vllm'].get(key)):>14}{fmt(results['meridian'].get(key)):>14}")
    return {"workload": workload.__dict__, "results": results}


def _thinking_demo(model: Path | None, cache_dir: Path) -> dict[str, object]:
    from meridian.live import DEFAULT_MODEL
    from meridian.thinking_demo import PROMPTS, render, run_thinking

    prompts = ", ".join(f"think {n} answer {m}" for n, m in PROMPTS)
    print(
        f"\nThinking control: vLLM's OpenAI server (CPU build) with MeridianScheduler and "
        f"MeridianThinkingProcessor; prompts {prompts}, one rule per request (vllm_xargs), thresholds "
        "set for the tiny model's countdown. The tiny model cannot judge accuracy: none is claimed.",
        flush=True,
    )
    results = run_thinking(model or DEFAULT_MODEL, cache_dir, cache_dir / "thinking",
                           progress=lambda line: print(line, flush=True))
    print()
    print(render(results))
    return results


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
