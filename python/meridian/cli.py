"""The ``meridian`` command: argparse and dispatch, nothing else.

``meridian demo`` runs stock vLLM and Meridian side by side (``meridian.demo``);
``meridian replay`` replays a trace through stock vLLM's schedulers and Meridian's policies in
virtual time on a hardware profile (``meridian.replay``); ``meridian fit-profile`` fits a replay
profile to a real run's step log; ``meridian check-config`` validates a ``--additional-config``
value without starting vLLM. Nothing here loads vLLM or torch until a command needs them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from meridian._core import __version__
from meridian.demo import PARTS as DEMO_PARTS
from meridian.errors import MeridianError
from meridian.replay.fleet import ROUTERS as FLEET_ROUTERS
from meridian.replay.policies import POLICIES, TUNED_VALVE
from meridian.replay.runner import DEFAULT_PROFILE

_Number = TypeVar("_Number", int, float)

DEFAULT_CACHE = Path(".cache")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except (MeridianError, ValueError, OSError) as exc:
        print(f"meridian: error: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meridian", description="Meridian: phase- and SLO-aware scheduling for reasoning models on vLLM."
    )
    parser.add_argument("--version", action="version", version=f"meridian {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_demo(sub)
    _add_replay(sub)
    _add_fit_profile(sub)
    _add_disaggregated(sub)
    check = sub.add_parser("check-config", help="validate a --additional-config JSON value")
    check.add_argument("additional_config", help="the JSON given to vLLM's --additional-config")
    check.set_defaults(handler=_check_config)
    return parser


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser("demo", help="stock vLLM vs Meridian: scripted, replay, live and thinking-control parts")
    demo.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1, 2], help="scripted scenario seeds (default: 0 1 2)"
    )
    demo.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where vLLM caches and the tiny model live")
    demo.add_argument("--json", type=Path, help="also write the metrics to this JSON file")
    demo.add_argument(
        "--parts", nargs="+", choices=DEMO_PARTS, default=list(DEMO_PARTS), help="which parts to run (default: all)"
    )
    demo.add_argument(
        "--model",
        type=Path,
        default=None,
        help="model folder for the live parts (default: tests/fixtures/tiny-reasoner)",
    )
    demo.add_argument(
        "--live-requests",
        type=_positive_int,
        default=None,
        help="requests aiperf replays in the live part (default: 20 s of arrivals at the live rate)",
    )
    demo.add_argument(
        "--live-rate",
        type=_positive,
        default=None,
        help="arrivals per second in the live part "
        "(default: 1.5x the stock server's capacity, measured first with a burst)",
    )
    demo.set_defaults(handler=_demo)


def _add_disaggregated(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pd = sub.add_parser(
        "disaggregated",
        help="a prefill and a decode vllm serve with Meridian, NIXL between them, vllm-router (P/D) in front",
        description="Starts a prefill and a decode `vllm serve` on 127.0.0.1, both with Meridian's scheduler "
        "and middleware, the prompt's KV handed over by vLLM's NixlConnector (UCX over TCP on loopback), and "
        "vllm-router in P/D mode in front; prints the router's URL and runs until Ctrl-C or SIGTERM. "
        "See docs/operations/disaggregated.md.",
    )
    pd.add_argument(
        "--model",
        type=Path,
        default=Path("tests/fixtures/tiny-reasoner"),
        help="model folder (default: the tiny fixture)",
    )
    pd.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where vLLM caches (default: .cache)")
    pd.add_argument(
        "--log-dir", type=Path, default=Path("disaggregated"), help="servers', router's and Meridian's logs"
    )
    pd.add_argument(
        "--meridian",
        default="{}",
        help="the 'meridian' block of --additional-config for both sides, as JSON (the request and step logs "
        "are set per side in --log-dir)",
    )
    pd.add_argument(
        "serve_args",
        nargs=argparse.REMAINDER,
        help="after --: vllm serve flags both sides get (default: the tiny fixture's; Meridian's scheduler, "
        "middleware and the connector are added)",
    )
    pd.set_defaults(handler=_disaggregated)


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"rate scales must be positive numbers, got {text!r}")
    return values


def _parsed(text: str, convert: Callable[[str], _Number], what: str) -> _Number:
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def _non_negative(text: str) -> float:
    value = _parsed(text, float, "a number")
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _positive(text: str) -> float:
    value = _non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    value = _parsed(text, int, "a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _add_replay(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replay = sub.add_parser(
        "replay",
        help="replay a trace through stock vLLM and Meridian in virtual time",
        description="Replays a trace through vLLM's own schedulers and Meridian's policies, driven like vLLM's "
        "engine core, in virtual time on a hardware profile. Without --trace: the bundled Azure LLM 2023 "
        "excerpt (code + conversation, CC-BY-4.0) with ServeGen reasoning lengths.",
    )
    replay.add_argument(
        "--trace",
        type=Path,
        action="append",
        default=None,
        help="trace file (Mooncake JSONL, Azure LLM CSV, Meridian JSONL); repeat to merge several",
    )
    replay.add_argument(
        "--format",
        choices=["mooncake", "azure", "meridian"],
        default=None,
        help="trace format (default: inferred from the file)",
    )
    replay.add_argument(
        "--reasoning",
        choices=["auto", "trace", "servegen", "servegen-ratio", "none"],
        default="auto",
        help="thinking/answer split: from the trace, sampled from ServeGen's DeepSeek-R1 "
        "distributions (whole output, or the trace's output split by a sampled ratio), or none "
        "(default auto: the trace's split when it has one, else servegen)",
    )
    replay.add_argument(
        "--servegen-dir",
        type=Path,
        default=None,
        help="ServeGen data/reason/deepseek-r1 folder (default: the bundled summary)",
    )
    replay.add_argument(
        "--classes", default=None, help="SLO class rule: trace | fixed:NAME | mix:a=0.2,b=0.8 | by-source:code=A,conv=B"
    )
    replay.add_argument(
        "--rate-scale",
        type=_floats,
        default=None,
        help="arrival-rate multipliers, comma-separated; several give a load sweep "
        "(default 1; the demo's 0.08 for the bundled excerpt)",
    )
    replay.add_argument("--start-s", type=float, default=0.0, help="start of the trace window in seconds")
    replay.add_argument(
        "--duration-s",
        type=float,
        default=None,
        help="length of the trace window in seconds (default: all; the demo's window for the bundled excerpt)",
    )
    replay.add_argument("--limit", type=int, default=None, help="replay at most this many requests")
    replay.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help=f"hardware/model profile: a bundled name or a JSON file (default {DEFAULT_PROFILE})",
    )
    replay.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"comma-separated policies (default all: {', '.join(POLICIES)}); a valve policy "
        "takes an explicit cap as vllm-fcfs+cap=N (default: sized as vLLM's docs advise), and "
        f"{TUNED_VALVE} is FCFS behind the valve at the best cap of a grid, searched per load "
        "(about ten replays each)",
    )
    replay.add_argument(
        "--config",
        default=None,
        help="Meridian config (the `meridian` block) as JSON or @file: classes, targets, knobs",
    )
    replay.add_argument("--seed", type=int, default=0, help="seed of every sampled quantity (default 0)")
    replay.add_argument(
        "--host-tier-gib",
        type=_non_negative,
        default=0.0,
        help="host memory of a KV tier (vLLM's OffloadingConnector, loads at the profile's host link) "
        "every policy runs with, in GiB (default 0: none)",
    )
    replay.add_argument(
        "--fleet",
        type=_positive_int,
        default=1,
        help="engines behind a router, each with the policy's own scheduler (default 1: no router)",
    )
    replay.add_argument(
        "--router",
        choices=FLEET_ROUTERS,
        default="round_robin",
        help="the fleet's router model (vllm-router's round_robin and power_of_two on /get_load, "
        "least requests, or per-class saturation); default round_robin",
    )
    replay.add_argument(
        "--retry-attempts",
        type=_positive_int,
        default=3,
        help="the router's attempts in all per request on sheds (1: no retry; default 3)",
    )
    replay.add_argument(
        "--disaggregated",
        metavar="P:D",
        default=None,
        help="a prefill pool of P and a decode pool of D engines (vLLM's NixlConnector, vllm-router's P/D "
        "mode): every policy runs colocated on P+D engines and disaggregated; a policy PREFILL/DECODE "
        "(e.g. vllm-fcfs/meridian) runs those on the two sides",
    )
    replay.add_argument(
        "--transfer-gbps",
        type=float,
        default=None,
        help="with --disaggregated: the hand-off link's bandwidth in GB/s (default: the profile's)",
    )
    replay.add_argument(
        "--transfer-latency-ms",
        type=float,
        default=None,
        help="with --disaggregated: a hand-off's fixed latency in ms (default: the profile's)",
    )
    replay.add_argument(
        "--step-noise",
        type=Path,
        default=None,
        help="a step-noise model (JSON, `meridian fit-profile --noise-out`): every engine's step times "
        "wander around the profile's as a real engine's did, seeded with --seed (default: no noise)",
    )
    replay.add_argument("--jobs", type=int, default=0, help="worker processes (default: one per core)")
    replay.add_argument("--json", type=Path, default=None, help="write the metrics to this JSON file")
    replay.add_argument("--report-dir", type=Path, default=None, help="write PNG plots and replay.json here")
    replay.add_argument("--no-progress", action="store_true", help="no progress bar")
    replay.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where vLLM's caches live")
    replay.add_argument(
        "--corpus",
        action="store_true",
        help="instead of one trace: the scenario corpus built from the shared public traces (many "
        "windows, ServeGen-shaped arrivals, class mixes and target sets, each at the loads where "
        "FCFS meets ~90/70/50 %% of requests), every --policies column, geometric mean and worst "
        "scenario per load; --report-dir gets report.md, corpus.json and a plot per load",
    )
    replay.add_argument(
        "--corpus-per-family", type=int, default=6, help="corpus scenarios per trace family (default 6)"
    )
    replay.add_argument(
        "--capacity",
        action="store_true",
        help="with --corpus: also search each policy's capacity (80 %% of requests meeting every target)",
    )
    replay.set_defaults(handler=_replay)


def _add_fit_profile(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    fit = sub.add_parser("fit-profile", help="fit a replay profile to the step log of a real vLLM run")
    fit.add_argument("step_log", type=Path, help="the JSONL file Meridian wrote with `step_log_path` set")
    fit.add_argument(
        "--base",
        default="h200-qwen3-8b",
        help="profile (name or JSON) whose KV capacity and batch limits the fit keeps",
    )
    fit.add_argument("--name", default="fitted", help="name of the new profile")
    fit.add_argument("--out", type=Path, required=True, help="where to write the profile JSON")
    fit.add_argument(
        "--noise-out",
        type=Path,
        default=None,
        help="also write the log's step-time noise around the fitted profile here (for replay --step-noise)",
    )
    fit.set_defaults(handler=_fit_profile)


# ---- dispatch ----------------------------------------------------------------------------------


def _demo(args: argparse.Namespace) -> int:
    from meridian.demo import run_demo

    run_demo(
        args.parts,
        seeds=args.seeds,
        cache_dir=args.cache_dir,
        model=args.model,
        live_requests=args.live_requests,
        live_rate_rps=args.live_rate,
        json_path=args.json,
    )
    return 0


def _replay(args: argparse.Namespace) -> int:
    if args.corpus:
        from meridian.replay.corpus import corpus_command

        return corpus_command(
            per_family=args.corpus_per_family,
            seed=args.seed,
            policies=args.policies,
            config=args.config,
            capacity=args.capacity,
            jobs=args.jobs,
            cache_dir=args.cache_dir,
            report_dir=args.report_dir,
            progress=not args.no_progress,
        )
    from meridian.replay.runner import replay_command

    return replay_command(
        traces_given=args.trace,
        trace_format=args.format,
        reasoning_source=args.reasoning,
        servegen_dir=args.servegen_dir,
        classes=args.classes,
        rate_scales=args.rate_scale,
        start_s=args.start_s,
        duration_s=args.duration_s,
        limit=args.limit,
        profile=args.profile,
        policies=args.policies,
        config=args.config,
        seed=args.seed,
        jobs=args.jobs,
        progress=not args.no_progress,
        cache_dir=args.cache_dir,
        json_path=args.json,
        report_dir=args.report_dir,
        host_tier_gib=args.host_tier_gib,
        fleet=args.fleet,
        router=args.router,
        retry_attempts=args.retry_attempts,
        disaggregated=args.disaggregated,
        transfer_gbps=args.transfer_gbps,
        transfer_latency_ms=args.transfer_latency_ms,
        step_noise=args.step_noise,
    )


def _fit_profile(args: argparse.Namespace) -> int:
    from meridian.replay.profiles import write_fitted_profile

    print(write_fitted_profile(args.step_log, args.base, args.name, args.out, args.noise_out))
    return 0


def _disaggregated(args: argparse.Namespace) -> int:
    import json

    from meridian.demo.disaggregated import TINY_SERVER_ARGS, Disaggregated, serve_until_stopped
    from meridian.vllm.config import config_from_additional
    from meridian.vllm.names import CONFIG_KEY

    # Checked here, before two servers start only to fail on it: the core's own check, naming the key.
    try:
        meridian = json.loads(args.meridian)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--meridian is not valid JSON: {exc}") from exc
    if not isinstance(meridian, dict):
        raise ValueError(f"--meridian: expected a JSON object, got {args.meridian!r}")
    config_from_additional({CONFIG_KEY: meridian})
    serve_args = args.serve_args[1:] if args.serve_args[:1] == ["--"] else args.serve_args
    serve_args = serve_args or list(TINY_SERVER_ARGS)
    deployment = Disaggregated(
        args.model.resolve(), serve_args, args.log_dir.resolve(), args.cache_dir.resolve(), meridian=meridian
    )
    try:
        return serve_until_stopped(deployment)
    except RuntimeError as exc:  # a server or the router exited while starting: its log is named
        print(f"meridian: error: {exc}", file=sys.stderr)
        return 1


def _check_config(args: argparse.Namespace) -> int:
    from meridian.vllm.config import check_additional_config

    print(check_additional_config(args.additional_config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
