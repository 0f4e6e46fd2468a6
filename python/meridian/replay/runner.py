"""The replay as an operator runs it: build the workload, replay every policy at every load, and
write the table, the JSON file and the plots.

It owns the workload pipeline (load → window → reasoning lengths → classes → rate scale → limit,
in that order, each step seeded and stated in the report), the fan-out of (load, policy) runs
over worker processes, and the progress bar. The tuned valve (``TUNED_VALVE``) fans out into one
run per cap of its grid at each load, then one per cap of a refinement around the best
(``refined_queue_caps``), and reports the best of them. Invariant: every policy at a given load
replays the very same request list, on the same profile and with the same class targets.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meridian._core import Config
from meridian.offline.engine import TransferCost, offline_environment
from meridian.replay import reasoning, traces
from meridian.replay.disaggregated import Split, add_pd_fields, pd_table, replay_disaggregated, split_policy
from meridian.replay.noise import StepNoise
from meridian.replay.policies import (
    POLICIES,
    TUNED_VALVE,
    TUNED_VALVE_BASE,
    HostTier,
    ReplayResult,
    WorkloadMeans,
    best_queue_cap,
    check_policy_name,
    effective_seats,
    policy_spec,
    queue_cap_grid,
    refined_queue_caps,
    replay_engine,
    replay_policy,
    with_queue_cap,
    with_sized_window,
)
from meridian.replay.profiles import Profile
from meridian.replay.report import PolicyRun, plot_cdfs, plot_load_sweep, policy_run, table, write_json
from meridian.replay.workload import model_dir_for, offline_requests

#: The bundled trace excerpt ``meridian replay`` and the demo use when no trace is given.
DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_TRACES = (
    DATA_DIR / "AzureLLMInferenceTrace_code_excerpt.csv",
    DATA_DIR / "AzureLLMInferenceTrace_conv_excerpt.csv",
)
#: How the default excerpt maps its two sources onto SLO classes.
DEFAULT_CLASS_RULE = "by-source:code=interactive,conv=standard"
DEFAULT_PROFILE = "h200-qwen3-32b"
#: Class targets a replay uses unless given a config: TTFAT targets sized for reasoning models
#: (thinking runs to thousands of tokens), answer TPOT at or above reading speed. They are the
#: replay's own, not the core's defaults (what a server gets without ``classes``, in
#: ``meridian-core``'s ``config.rs``, ``default_classes``): the same three classes and ranks, the
#: same TPOT targets and batch class, but looser TTFT and TTFAT targets for ``interactive`` (2 s /
#: 45 s against 1 s / 15 s) and ``standard`` (5 s / 120 s against 3 s / 60 s): the replay's
#: requests think at production lengths (the ServeGen DeepSeek-R1 prior's p90 is 2,327 tokens,
#: ~43 s of decode alone on ``DEFAULT_PROFILE``'s 18.3 ms batch-1 step), past the core's 15 s
#: interactive TTFAT even on an idle server. ``corpus.TARGET_SETS["default"]`` reads this file.
DEFAULT_CLASSES_FILE = DATA_DIR / "reasoning_classes.json"


def default_meridian_config() -> dict[str, Any]:
    """The ``meridian`` block a replay runs with by default (``DEFAULT_CLASSES_FILE``)."""
    value: dict[str, Any] = json.loads(DEFAULT_CLASSES_FILE.read_text(encoding="utf-8"))
    return value


@dataclass
class ReplayOptions:
    """Everything a replay takes; the CLI fills it from flags."""

    traces: Sequence[Path] = DEFAULT_TRACES
    trace_format: str | None = None
    reasoning: str = "auto"  # auto: "trace" when the trace has a split, else "servegen"
    servegen_dir: Path | None = None
    classes: str | None = None  # None: DEFAULT_CLASS_RULE for the bundled excerpt, else "trace"
    rate_scales: Sequence[float] = (1.0,)
    start_s: float = 0.0
    duration_s: float | None = None
    limit: int | None = None
    profile: str = DEFAULT_PROFILE
    policies: Sequence[str] = tuple(POLICIES)
    meridian_config: dict[str, Any] = field(default_factory=default_meridian_config)
    seed: int = 0
    #: Host memory of the KV tier every policy runs with (GiB; 0: no tier).
    host_tier_gib: float = 0.0
    jobs: int = 0  # 0: one per core, at most one per run
    progress: bool = True
    cache_dir: Path = Path(".cache")
    #: Engines behind a router (``meridian.replay.fleet``); 1: one engine, no router.
    fleet: int = 1
    #: The fleet's router model (``fleet.ROUTERS``) and its attempts in all per request.
    router: str = "round_robin"
    retry_attempts: int = 3
    #: A prefill/decode split ``"P:D"`` (``meridian.replay.disaggregated``): every policy then
    #: runs colocated on P + D engines and disaggregated on P prefill and D decode engines, both
    #: behind ``router``; ``None``: no split.
    disaggregated: str | None = None
    #: The hand-off link's bandwidth (GB/s) and fixed latency (ms); ``None``: the profile's.
    transfer_gbps: float | None = None
    transfer_latency_ms: float | None = None
    #: A step-noise model's JSON file (``meridian.replay.noise``; seeded with ``seed``): every
    #: engine's steps wander around the profile's cost as it says; ``None``: they do not.
    step_noise: Path | None = None

    def with_cache_dir(self, cache_dir: Path) -> ReplayOptions:
        return dataclasses.replace(self, cache_dir=cache_dir)


#: The demo's replay part: a 25-second window of the bundled excerpt at 8 % of its arrival rate
#: (enough load for queues to form: stock FCFS meets about two thirds of its targets), every
#: scheduler (vLLM's load valve and cache-aware admission left out: the demo's timing and text
#: were set without them; the excerpt shares no prefixes, so the latter would be FCFS anyway);
#: about 75 s of replay on two cores, under two minutes with vLLM's import.
DEMO_OPTIONS = ReplayOptions(
    duration_s=25.0,
    rate_scales=(0.08,),
    progress=False,
    policies=tuple(name for name, spec in POLICIES.items() if not spec.valve and not spec.cache_aware),
)


@dataclass
class ReplayReport:
    """A finished replay: what was replayed and every policy's results per load."""

    workload: dict[str, Any]
    profile: Profile
    runs: list[PolicyRun]

    def at(self, rate_scale: float) -> list[PolicyRun]:
        return [r for r in self.runs if r.rate_scale == rate_scale]

    @property
    def rate_scales(self) -> list[float]:
        return sorted({r.rate_scale for r in self.runs})

    def to_json(self) -> dict[str, Any]:
        sweep = {str(scale): {r.policy: r.summary for r in self.at(scale)} for scale in self.rate_scales}
        single = self.at(self.rate_scales[0]) if len(self.rate_scales) == 1 else None
        payload: dict[str, Any] = {"workload": self.workload, "profile": self.profile.to_json()}
        if single is not None:
            payload["policies"] = {r.policy: r.summary for r in single}
        payload["load_sweep"] = sweep
        return payload


# ---- the workload ------------------------------------------------------------------------------


def build_workload(options: ReplayOptions) -> tuple[list[traces.TraceRequest], dict[str, Any]]:
    """The request list (before rate scaling) and a description of how it was made."""
    requests = traces.load_traces(list(options.traces), options.trace_format)
    if options.start_s or options.duration_s is not None:
        requests = traces.window(requests, options.start_s, options.duration_s)
    source = options.reasoning
    if source == "auto":
        source = "trace" if requests and all(r.num_think_tokens is not None for r in requests) else "servegen"
    servegen = None
    if source.startswith("servegen"):
        servegen = (
            reasoning.ServeGenLengths.load(options.servegen_dir)
            if options.servegen_dir
            else reasoning.ServeGenLengths.default()
        )
    requests = reasoning.apply_reasoning_lengths(requests, source, seed=options.seed, servegen=servegen)
    rule = options.classes or (DEFAULT_CLASS_RULE if tuple(options.traces) == DEFAULT_TRACES else "trace")
    requests = traces.assign_classes(requests, rule, options.seed)
    if options.limit is not None:
        requests = traces.limit(requests, options.limit)
    workload = {
        "traces": [str(p) for p in options.traces],
        "window_s": [options.start_s, options.duration_s],
        "num_requests": len(requests),
        "reasoning_lengths": reasoning.describe(source, options.seed, servegen),
        "class_rule": rule,
        "seed": options.seed,
    }
    return requests, workload


def check_classes(requests: Sequence[traces.TraceRequest], meridian_config: dict[str, Any]) -> None:
    """Every class the workload names must be defined by the config the replay runs with, and
    every class's thinking control must be one the replay can model (no logits, no signals)."""
    config = Config.from_json(json.dumps(meridian_config))
    for name in config.class_names:
        control = config.thinking_control(name)
        if control.wants_eat_probes() or control.wants_end_token_stats() or control.wants_token_entropy():
            raise ValueError(
                f"class {name}: thinking_control rules eat, proxy and rpdi read a model's logits, which the "
                "replay does not have; it models budget_tokens and load_aware only"
            )
    defined = set(config.class_names)
    unknown = sorted({r.slo_class for r in requests if r.slo_class is not None} - defined)
    if unknown:
        raise ValueError(
            f"the workload names SLO classes the config does not define: {', '.join(unknown)}; "
            f"defined: {', '.join(sorted(defined))} (add them under `classes` in --config, or change --classes)"
        )


# ---- running ----------------------------------------------------------------------------------


def _run_one(
    policy: str,
    rate_scale: float,
    requests: list[traces.TraceRequest],
    profile: Profile,
    meridian_config: dict[str, Any],
    cache_dir: Path,
    host_tier: HostTier | None,
    tick: Callable[[int], None],
    fleet: tuple[int, str, int] = (1, "round_robin", 3),
    disaggregated: tuple[Split, TransferCost] | None = None,
) -> PolicyRun:
    scaled = traces.scale_rate(requests, rate_scale)
    config = Config.from_json(json.dumps(meridian_config))
    offline = offline_requests(scaled, profile, config)
    engine_options: dict[str, Any] = dict(
        meridian_config=meridian_config, model_dir=model_dir_for(profile, cache_dir), progress=tick, host_tier=host_tier
    )
    num_engines, router, attempts = fleet
    if disaggregated is not None:
        return _run_disaggregated(policy, rate_scale, offline, profile, engine_options, disaggregated, fleet)
    spec = policy_spec(policy)
    if num_engines <= 1:
        return policy_run(replay_policy(spec, offline, profile, **engine_options), rate_scale)
    from meridian.replay.fleet import Retries, Router, replay_fleet

    # A window sized for the workload is sized on the whole of it: an engine sees its share one by one.
    spec = with_sized_window(spec, offline, profile, meridian_config)
    engines = [replay_engine(spec, [], profile, noise_stream=i, **engine_options) for i in range(num_engines)]
    run = replay_fleet(engines, offline, Router(router, num_engines, seed=0), Retries(attempts=attempts))
    result = policy_run(
        ReplayResult(spec.name, run.client_run(), cache_aware_window=spec.cache_aware_window), rate_scale
    )
    result.summary.update(
        fleet=num_engines, router=router, retries=run.num_retries, good_per_engine=result.summary["good"] / num_engines
    )
    return result


def _run_disaggregated(
    policy: str,
    rate_scale: float,
    offline: list[Any],
    profile: Profile,
    engine_options: dict[str, Any],
    disaggregated: tuple[Split, TransferCost],
    fleet: tuple[int, str, int],
) -> PolicyRun:
    """``policy`` (``A`` or ``A/B``: prefill A, decode B) on a prefill and a decode pool."""
    from meridian.replay.fleet import Retries, Router

    split, cost = disaggregated
    _num_engines, router, attempts = fleet
    prefill_spec, decode_spec = (policy_spec(name) for name in split_policy(policy))
    prefill = [
        replay_engine(
            prefill_spec, [], profile, kv_role="kv_producer", transfer_cost=cost, noise_stream=i, **engine_options
        )
        for i in range(split.num_prefill)
    ]
    decode = [
        replay_engine(
            decode_spec,
            [],
            profile,
            kv_role="kv_consumer",
            transfer_cost=cost,
            noise_stream=split.num_prefill + i,
            **engine_options,
        )
        for i in range(split.num_decode)
    ]
    run = replay_disaggregated(
        prefill,
        decode,
        offline,
        Router(router, split.num_prefill, seed=0),
        Router(router, split.num_decode, seed=1),
        Retries(attempts=attempts),
    )
    result = policy_run(ReplayResult(pd_label(policy, split), run.client_run()), rate_scale)
    add_pd_fields(result.summary, run)
    result.summary.update(router=router, fleet=split.num_engines)
    return result


def pd_label(policy: str, split: Split) -> str:
    """A disaggregated run's row: the policy (or prefill/decode pair) and the split."""
    return f"{policy} P/D {split}"


# Worker state, set in the parent before forking (so workers inherit it without pickling).
_WORK: dict[str, Any] = {}


def _worker(job: tuple[str, float, bool]) -> PolicyRun:
    queue = _WORK["queue"]
    policy, scale, disaggregated = job
    return _run_one(
        policy,
        scale,
        _WORK["requests"],
        _WORK["profile"],
        _WORK["config"],
        _WORK["cache_dir"],
        _WORK["host_tier"],
        queue.put,
        _WORK["fleet"],
        _WORK["disaggregated"] if disaggregated else None,
    )


def run_replay(options: ReplayOptions) -> ReplayReport:
    """Replays every policy at every rate scale; see the module docs."""
    offline_environment(options.cache_dir)
    profile = Profile.load(options.profile)
    if options.step_noise is not None:
        profile = profile.with_noise(StepNoise.load(options.step_noise, seed=options.seed))
    disaggregated = check_disaggregated(options, profile)  # and every policy name, before any work
    host_tier = HostTier.of(profile, options.host_tier_gib)  # fails on a profile without a host link
    if host_tier is not None and disaggregated is not None:
        raise ValueError("--host-tier-gib and --disaggregated: an engine takes one KV connector, not both")
    requests, workload = build_workload(options)
    check_classes(requests, options.meridian_config)
    fleet = check_fleet(options)
    if disaggregated is not None:
        split, cost = disaggregated
        fleet = (split.num_engines, options.router, options.retry_attempts)
        workload["disaggregated"] = {
            "split": str(split),
            "transfer_ms_per_token": cost.ms_per_token,
            "transfer_latency_ms": cost.latency_ms,
        }
    if fleet[0] > 1:
        workload["fleet"] = {"engines": fleet[0], "router": options.router, "attempts": options.retry_attempts}
    workload["rate_scales"] = list(options.rate_scales)
    workload["step_noise"] = None if profile.noise is None else profile.noise.to_json()
    workload["host_tier"] = (
        None
        if host_tier is None
        else {
            "gib": options.host_tier_gib,
            "num_blocks": host_tier.num_blocks,
            "load_ms_per_token": host_tier.load_ms_per_token,
        }
    )
    plain = [
        (policy, scale, pd)
        for scale in options.rate_scales
        for policy in options.policies
        if policy != TUNED_VALVE
        for pd in _layouts(policy, disaggregated is not None)
    ]
    grid = tuned_valve_caps(requests, profile, options.meridian_config) if TUNED_VALVE in options.policies else []
    valve = POLICIES[TUNED_VALVE_BASE]
    # A disaggregated run ticks twice per request: once on each side.
    ticks = sum(2 if pd else 1 for _, _, pd in plain) + len(grid) * len(options.rate_scales)
    bar = _progress_bar(len(requests) * ticks, options.progress)

    def execute(jobs: list[tuple[str, float, bool]]) -> list[PolicyRun]:
        num_workers = min(len(jobs), options.jobs or (os.cpu_count() or 1))
        if num_workers <= 1:
            return [
                _run_one(
                    p,
                    s,
                    requests,
                    profile,
                    options.meridian_config,
                    options.cache_dir,
                    host_tier,
                    bar.update,
                    fleet,
                    disaggregated if pd else None,
                )
                for p, s, pd in jobs
            ]
        return _run_parallel(jobs, requests, profile, host_tier, options, num_workers, bar.update, fleet, disaggregated)

    try:
        runs = execute(plain)
        # The tuned valve: its grid at every load, then one round of refinement around each best.
        tuned: dict[float, dict[int, PolicyRun]] = {scale: {} for scale in options.rate_scales}
        caps_of = {scale: list(grid) for scale in options.rate_scales}
        for _round in range(2 if grid else 0):
            jobs = [(with_queue_cap(valve, c).name, scale, False) for scale, caps in caps_of.items() for c in caps]
            for (_name, scale, _pd), run, cap in zip(
                jobs, execute(jobs), [c for caps in caps_of.values() for c in caps]
            ):
                tuned[scale][cap] = run
            caps_of = {
                scale: refined_queue_caps({c: int(r.summary["good"]) for c, r in tuned[scale].items()})
                for scale in options.rate_scales
            }
    finally:
        bar.close()
    return ReplayReport(workload=workload, profile=profile, runs=_in_order(runs, tuned, options))


def _layouts(policy: str, disaggregated: bool) -> list[bool]:
    """Whether ``policy`` runs disaggregated, colocated or both: with a split, a policy runs both
    ways (the comparison at equal engine count) and a prefill/decode pair only disaggregated."""
    if not disaggregated:
        return [False]
    return [True] if "/" in policy else [False, True]


def check_disaggregated(options: ReplayOptions, profile: Profile) -> tuple[Split, TransferCost] | None:
    """Every policy name, and the split with its transfer cost when ``--disaggregated`` is given;
    a ``ValueError`` naming the bad flag or policy."""
    if options.disaggregated is None:
        for name in options.policies:
            if "/" in name:
                raise ValueError(f"policy {name!r}: a prefill/decode pair needs --disaggregated P:D")
            check_policy_name(name)
        if options.transfer_gbps is not None or options.transfer_latency_ms is not None:
            raise ValueError("--transfer-gbps and --transfer-latency-ms price a hand-off: they need --disaggregated")
        return None
    split = Split.parse(options.disaggregated)
    for name in options.policies:
        if name == TUNED_VALVE:
            raise ValueError(
                f"{TUNED_VALVE!r} searches one engine's valve cap; with --disaggregated give a valve policy at an "
                "explicit cap (e.g. vllm-fcfs+cap=96), which both sides then take"
            )
        for half in split_policy(name):
            check_policy_name(half)
    if options.fleet not in (1, split.num_engines):
        raise ValueError(
            f"--fleet {options.fleet} with --disaggregated {split}: the colocated comparison runs on "
            f"{split.num_engines} engines (leave --fleet out)"
        )
    if options.transfer_gbps is not None and not options.transfer_gbps > 0:
        raise ValueError(f"--transfer-gbps {options.transfer_gbps}: the link's bandwidth must be > 0 GB/s")
    if options.transfer_latency_ms is not None and not options.transfer_latency_ms >= 0:
        raise ValueError(f"--transfer-latency-ms {options.transfer_latency_ms}: must be >= 0")
    gbps = options.transfer_gbps
    return split, profile.transfer_cost(gbps * 1e9 if gbps is not None else None, options.transfer_latency_ms)


def check_fleet(options: ReplayOptions) -> tuple[int, str, int]:
    """The fleet options as ``_run_one`` takes them; a ``ValueError`` naming the bad one."""
    from meridian.replay.fleet import ROUTERS

    if options.fleet < 1:
        raise ValueError(f"--fleet {options.fleet}: a fleet needs at least one engine")
    if options.router not in ROUTERS:
        raise ValueError(f"--router {options.router!r}: expected one of {', '.join(ROUTERS)}")
    if options.retry_attempts < 1:
        raise ValueError(f"--retry-attempts {options.retry_attempts}: at least 1 (the first send)")
    return options.fleet, options.router, options.retry_attempts


def tuned_valve_caps(
    requests: Sequence[traces.TraceRequest], profile: Profile, meridian_config: dict[str, Any]
) -> list[int]:
    """The caps the tuned valve tries on this workload (``queue_cap_grid`` around the seats its
    KV cache holds; caps at or above the number of requests never bind, one of them is kept)."""
    offline = offline_requests(list(requests), profile, Config.from_json(json.dumps(meridian_config)))
    seats = effective_seats(profile, WorkloadMeans.of(offline, meridian_config))
    return queue_cap_grid(seats, never_binds_at=max(len(requests), 1))


def _in_order(
    runs: list[PolicyRun], tuned: dict[float, dict[int, PolicyRun]], options: ReplayOptions
) -> list[PolicyRun]:
    """The runs in ``options.policies`` order per load, the tuned valve's runs folded into one
    per load: the cap that met every target for the most requests (``best_queue_cap``)."""
    out: list[PolicyRun] = []
    split = options.disaggregated and Split.parse(options.disaggregated)
    for scale in options.rate_scales:
        for policy in options.policies:
            if policy != TUNED_VALVE:
                out += [r for r in runs if r.rate_scale == scale and r.policy == policy][:1]
                if split:
                    out += [r for r in runs if r.rate_scale == scale and r.policy == pd_label(policy, split)][:1]
                continue
            caps = tuned[scale]
            best = caps[best_queue_cap({cap: int(r.summary["good"]) for cap, r in caps.items()})]
            summary = {
                **best.summary,
                "policy": TUNED_VALVE,
                "tuned_queue_caps": {str(cap): int(r.summary["good"]) for cap, r in sorted(caps.items())},
            }
            out.append(dataclasses.replace(best, policy=TUNED_VALVE, summary=summary))
    return out


def _run_parallel(
    jobs: list[tuple[str, float, bool]],
    requests: list[traces.TraceRequest],
    profile: Profile,
    host_tier: HostTier | None,
    options: ReplayOptions,
    num_workers: int,
    tick: Callable[[int], None],
    fleet: tuple[int, str, int],
    disaggregated: tuple[Split, TransferCost] | None,
) -> list[PolicyRun]:
    import vllm  # noqa: F401 - imported once here (~20 s) so forked workers inherit it

    context = multiprocessing.get_context("fork")
    queue = context.SimpleQueue()
    _WORK.update(
        requests=requests,
        profile=profile,
        config=options.meridian_config,
        cache_dir=options.cache_dir,
        host_tier=host_tier,
        queue=queue,
        fleet=fleet,
        disaggregated=disaggregated,
    )
    done = threading.Event()

    def pump() -> None:
        while not done.is_set() or not queue.empty():
            if queue.empty():
                time.sleep(0.05)
                continue
            tick(queue.get())

    pumper = threading.Thread(target=pump, daemon=True)
    pumper.start()
    try:
        with context.Pool(num_workers) as pool:
            return pool.map(_worker, jobs, chunksize=1)
    finally:
        done.set()
        pumper.join(timeout=5)
        _WORK.clear()


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, enabled: bool) -> Any:
    if not enabled or not sys.stderr.isatty():
        return _NoBar()
    from tqdm import tqdm  # type: ignore[import-untyped]  # ships with vLLM, without stubs

    return tqdm(total=total, unit="req", desc="replay", smoothing=0.05)


# ---- output -----------------------------------------------------------------------------------


def write_outputs(report: ReplayReport, json_path: Path | None, report_dir: Path | None) -> list[Path]:
    """Writes the JSON file and the plots; returns the paths written."""
    written: list[Path] = []
    if json_path is not None:
        write_json(json_path, report.to_json())
        written.append(json_path)
    if report_dir is not None:
        for scale in report.rate_scales:
            suffix = "" if len(report.rate_scales) == 1 else f"_x{scale:g}"
            written += plot_cdfs(report.at(scale), report_dir, suffix)
        if len(report.rate_scales) > 1:
            written += plot_load_sweep({s: [r.summary for r in report.at(s)] for s in report.rate_scales}, report_dir)
        write_json(report_dir / "replay.json", report.to_json())
        written.append(report_dir / "replay.json")
    return written


def render(report: ReplayReport) -> str:
    """The terminal report: what was replayed, then one table per load."""
    lines = [
        f"workload: {report.workload['num_requests']} requests from {', '.join(Path(t).name for t in report.workload['traces'])}",
        f"          {report.workload['reasoning_lengths']}",
        f"          classes: {report.workload['class_rule']}",
        f"profile:  {report.profile.name} — {report.profile.description}",
    ]
    tier = report.workload.get("host_tier")
    if tier is not None:
        lines.append(
            f"host KV tier: {tier['gib']:g} GiB ({tier['num_blocks']} blocks), loads at "
            f"{tier['load_ms_per_token'] * 1000:.2f} µs per token"
        )
    pd = report.workload.get("disaggregated")
    if pd is not None:
        lines.append(
            f"disaggregated P/D {pd['split']} beside colocated ×{report.workload['fleet']['engines']}: hand-off "
            f"{pd['transfer_ms_per_token'] * 1000:.2f} µs per token + {pd['transfer_latency_ms']:g} ms"
        )
    for scale in report.rate_scales:
        lines += ["", f"rate scale ×{scale:g}", table([r.summary for r in report.at(scale)])]
        if pd is not None:
            lines.append(pd_table([r.summary for r in report.at(scale)]))
    return "\n".join(lines)


def replay_command(
    *,
    traces_given: Sequence[Path] | None,
    trace_format: str | None,
    reasoning_source: str,
    servegen_dir: Path | None,
    classes: str | None,
    rate_scales: Sequence[float] | None,
    start_s: float,
    duration_s: float | None,
    limit: int | None,
    profile: str,
    policies: str,
    config: str | None,
    seed: int,
    jobs: int,
    progress: bool,
    cache_dir: Path,
    json_path: Path | None,
    report_dir: Path | None,
    host_tier_gib: float = 0.0,
    fleet: int = 1,
    router: str = "round_robin",
    retry_attempts: int = 3,
    disaggregated: str | None = None,
    transfer_gbps: float | None = None,
    transfer_latency_ms: float | None = None,
    step_noise: Path | None = None,
) -> int:
    """``meridian replay``: runs the replay its flags describe, prints the table, writes outputs.
    Without a trace: the bundled excerpt at the demo's window and load (the whole excerpt at its
    real rate would overload a 32B-class GPU many times over and run for hours)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    bundled = not traces_given
    options = ReplayOptions(
        traces=tuple(traces_given) if traces_given else DEFAULT_TRACES,
        trace_format=trace_format,
        reasoning=reasoning_source,
        servegen_dir=servegen_dir,
        classes=classes,
        rate_scales=rate_scales or (DEMO_OPTIONS.rate_scales if bundled else (1.0,)),
        start_s=start_s,
        duration_s=duration_s if duration_s is not None or not bundled else DEMO_OPTIONS.duration_s,
        limit=limit,
        profile=profile,
        policies=[p.strip() for p in policies.split(",") if p.strip()],
        meridian_config=load_config_arg(config),
        seed=seed,
        host_tier_gib=host_tier_gib,
        jobs=jobs,
        progress=progress,
        cache_dir=cache_dir,
        fleet=fleet,
        router=router,
        retry_attempts=retry_attempts,
        disaggregated=disaggregated,
        transfer_gbps=transfer_gbps,
        transfer_latency_ms=transfer_latency_ms,
        step_noise=step_noise,
    )
    report = run_replay(options)
    print(render(report))
    for path in write_outputs(report, json_path, report_dir):
        print(f"wrote {path}")
    return 0


def load_config_arg(text: str | None) -> dict[str, Any]:
    """``--config``: inline JSON or ``@path`` to a JSON file (the ``meridian`` block); the
    default reasoning class targets without one."""
    if not text:
        return default_meridian_config()
    raw = Path(text[1:]).read_text(encoding="utf-8") if text.startswith("@") else text
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError("--config must be a JSON object (the `meridian` block of --additional-config)")
    return value
