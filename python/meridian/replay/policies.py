"""The policies a replay compares, in one vocabulary, and how one is replayed.

A policy is stock vLLM (``vllm-fcfs``, ``vllm-priority``: vLLM's own ``AsyncScheduler`` under
that scheduling policy) or ``MeridianScheduler`` in one of the core's policy modes, named as the
config's ``policy`` key names them (``meridian``, ``answer_first``, ``pascal``, and the
published baselines ``uniboost`` and ``scorpio``). The demo's
scripted and live parts use the same names. Replaying one builds the scheduler the way
``EngineCore`` does, with the profile's KV capacity and batch limits, and runs it through the
offline engine loop with the profile's step time.

Stock vLLM also comes behind its own load valve (``vllm-fcfs+cap``, ``vllm-priority+cap``):
vLLM 0.32's ``--max-num-queued-reqs``, enforced in the API server, answers HTTP 503 (no
``Retry-After``) to a request that would make more than the cap unfinished. Here it is an arrival
gate of the engine loop (``LoadValve``). Its cap is by default what vLLM's docs advise
(``docs_sized_queue_cap``), or given (``vllm-fcfs+cap=96``); ``vllm-fcfs+cap*`` (``TUNED_VALVE``)
is the valve at the best cap of a grid, searched per workload and load (``queue_cap_grid``,
``best_queue_cap``, then ``refined_queue_caps`` around the best) — an oracle no operator has,
generous to the baseline.

And stock FCFS comes with vLLM 0.34's cache-aware admission (``vllm-fcfs+cache-aware``:
``--cache-aware-admission-window`` / ``--cache-aware-admission-threshold``; vLLM's own code on
0.34, ``meridian.replay.cache_aware``'s port on 0.32 and 0.33), its window sized for the workload
as vLLM's docs advise (``docs_sized_cache_aware_window``) or given (``vllm-fcfs+cache-aware=64``,
``vllm-fcfs+cache-aware=64:0.3`` for window and threshold).

Invariant: every policy replays through the very same engine loop and observer; only the
scheduler, and for a valve the arrival gate in front of it, differ.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meridian._core import Config, config_schema
from meridian.offline.engine import (
    ArrivalGate,
    EngineRun,
    EngineSpec,
    OfflineEngine,
    OfflineRequest,
    TransferCost,
    build_scheduler,
)
from meridian.offline.tiny import EOS
from meridian.replay.cache_aware import DEFAULT_THRESHOLD, cache_aware_scheduler, check_threshold, check_window
from meridian.replay.profiles import Profile, StepBatch
from meridian.vllm.names import CONFIG_KEY, POLICY_NAMES


@dataclass(frozen=True)
class PolicySpec:
    """A scheduler to replay: stock vLLM or Meridian in one of its policy modes."""

    name: str
    description: str
    #: The core's ``policy`` mode; ``None``: vLLM's own ``AsyncScheduler``.
    meridian_policy: str | None
    #: vLLM's ``--scheduling-policy``.
    vllm_policy: str = "fcfs"
    #: vLLM's load valve (``--max-num-queued-reqs``) in front of the engine (stock vLLM only).
    valve: bool = False
    #: The valve's cap; ``None``: sized for the workload as vLLM's docs advise
    #: (``docs_sized_queue_cap``).
    queue_cap: int | None = None
    #: vLLM 0.34's cache-aware admission (stock FCFS only; ``meridian.replay.cache_aware``).
    cache_aware: bool = False
    #: Its window (``--cache-aware-admission-window``); ``None``: sized for the workload as vLLM's
    #: docs advise (``docs_sized_cache_aware_window``).
    cache_aware_window: int | None = None
    #: Its KV usage threshold (``--cache-aware-admission-threshold``).
    cache_aware_threshold: float = DEFAULT_THRESHOLD

    def __post_init__(self) -> None:
        if self.queue_cap is not None:
            check_queue_cap(self.queue_cap)
            if not self.valve:
                raise ValueError(f"policy {self.name!r}: a queue cap ({self.queue_cap}) needs the valve")
        if self.valve and self.meridian_policy is not None:
            raise ValueError(f"policy {self.name!r}: the load valve is modelled for stock vLLM only")
        if self.cache_aware_window is not None:
            check_window(self.cache_aware_window)
        check_threshold(self.cache_aware_threshold)
        if (
            self.cache_aware_window is not None or self.cache_aware_threshold != DEFAULT_THRESHOLD
        ) and not self.cache_aware:
            raise ValueError(f"policy {self.name!r}: a cache-aware window or threshold needs cache-aware admission")
        if self.cache_aware and (self.meridian_policy is not None or self.vllm_policy != "fcfs" or self.valve):
            # vLLM keeps the window only under its FCFS policy (Scheduler.__init__).
            raise ValueError(f"policy {self.name!r}: cache-aware admission is modelled for stock vLLM FCFS only")


def check_queue_cap(cap: object) -> int:
    """``cap`` if it is a valve cap (a whole number of requests, at least 1), else a
    ``ValueError`` naming it (vLLM takes 0, which refuses every request: no baseline)."""
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"queue cap {cap!r}: expected a whole number of requests >= 1 (vLLM's --max-num-queued-reqs)")
    return cap


def _core_policy_descriptions() -> dict[str, str]:
    """Each core policy mode's description: its one doc comment in the core, which the core's
    JSON Schema carries (``$defs.Policy.oneOf``), so no description is written twice."""
    options = json.loads(config_schema())["$defs"]["Policy"]["oneOf"]
    return {str(o["const"]): " ".join(str(o["description"]).split()) for o in options}


_core_descriptions = _core_policy_descriptions()
#: Stock FCFS with vLLM 0.34's cache-aware admission at the docs-sized window.
CACHE_AWARE = "vllm-fcfs+cache-aware"
POLICIES: dict[str, PolicySpec] = {
    p.name: p
    for p in (
        PolicySpec("vllm-fcfs", "stock vLLM AsyncScheduler, first come first served", None, "fcfs"),
        PolicySpec("vllm-priority", "stock vLLM AsyncScheduler, priority = SLO class rank", None, "priority"),
        PolicySpec(
            "vllm-fcfs+cap",
            "stock vLLM FCFS behind its load valve (--max-num-queued-reqs), docs-sized cap",
            None,
            "fcfs",
            valve=True,
        ),
        PolicySpec(
            "vllm-priority+cap",
            "stock vLLM priority behind its load valve (--max-num-queued-reqs), docs-sized cap",
            None,
            "priority",
            valve=True,
        ),
        PolicySpec(
            CACHE_AWARE,
            "stock vLLM FCFS with vLLM 0.34's cache-aware admission (--cache-aware-admission-window, "
            "docs-sized; threshold 0.5)",
            None,
            "fcfs",
            cache_aware=True,
        ),
        *(PolicySpec(name, _core_descriptions[name], name) for name in POLICY_NAMES),
    )
}
#: The stock baseline and the product, the two the demo puts side by side.
STOCK, MERIDIAN = POLICIES["vllm-fcfs"], POLICIES["meridian"]
#: The valve at the cap of ``queue_cap_grid`` that meets every target for the most requests,
#: searched per workload and load: not one replay but a search, so not in ``POLICIES``.
TUNED_VALVE = "vllm-fcfs+cap*"
#: The valve policy the tuned search runs at each cap of its grid.
TUNED_VALVE_BASE = "vllm-fcfs+cap"


def with_queue_cap(spec: PolicySpec, cap: int) -> PolicySpec:
    """A valve policy at an explicit cap, named ``<policy>=<cap>`` (e.g. ``vllm-fcfs+cap=96``)."""
    if not spec.valve:
        raise ValueError(
            f"policy {spec.name!r} has no load valve to cap (valve policies: "
            f"{', '.join(n for n, p in POLICIES.items() if p.valve)})"
        )
    base = spec.name.partition("=")[0]
    return dataclasses.replace(spec, name=f"{base}={check_queue_cap(cap)}", queue_cap=cap)


def with_cache_aware(spec: PolicySpec, window: int, threshold: float | None = None) -> PolicySpec:
    """A cache-aware policy at an explicit window (and threshold), named
    ``<policy>=<window>`` or ``<policy>=<window>:<threshold>`` (e.g. ``vllm-fcfs+cache-aware=64``)."""
    if not spec.cache_aware:
        raise ValueError(f"policy {spec.name!r} has no cache-aware admission (it has: {CACHE_AWARE})")
    threshold = spec.cache_aware_threshold if threshold is None else check_threshold(threshold)
    base = spec.name.partition("=")[0]
    suffix = "" if threshold == DEFAULT_THRESHOLD else f":{threshold:g}"
    return dataclasses.replace(
        spec,
        name=f"{base}={check_window(window)}{suffix}",
        description=f"stock vLLM FCFS with vLLM 0.34's cache-aware admission, window {window}, threshold {threshold:g}",
        cache_aware_window=window,
        cache_aware_threshold=threshold,
    )


def _cache_aware_spec(name: str, base: str, text: str) -> PolicySpec:
    window_text, colon, threshold_text = text.partition(":")
    try:
        window = int(window_text)
    except ValueError:
        raise ValueError(
            f"policy {name!r}: cache-aware window {window_text!r}: expected a whole number of waiting requests >= 0 "
            "(vLLM's --cache-aware-admission-window)"
        ) from None
    threshold: float | None = None
    if colon:
        try:
            threshold = float(threshold_text)
        except ValueError:
            raise ValueError(
                f"policy {name!r}: cache-aware threshold {threshold_text!r}: expected a KV cache usage between 0 "
                "and 1 (vLLM's --cache-aware-admission-threshold)"
            ) from None
    try:
        return with_cache_aware(POLICIES[base], window, threshold)
    except ValueError as exc:
        raise ValueError(f"policy {name!r}: {exc}") from None


def policy_spec(name: str) -> PolicySpec:
    """The policy called ``name`` — one of ``POLICIES``, a valve policy at an explicit cap
    (``vllm-fcfs+cap=96``) or the cache-aware policy at an explicit window (and threshold:
    ``vllm-fcfs+cache-aware=64``, ``vllm-fcfs+cache-aware=64:0.3``) — or a ``ValueError`` naming
    what is wrong."""
    spec = POLICIES.get(name)
    if spec is not None:
        return spec
    base, eq, cap_text = name.partition("=")
    if eq and base in POLICIES and POLICIES[base].cache_aware:
        return _cache_aware_spec(name, base, cap_text)
    if eq and base in POLICIES and POLICIES[base].valve:
        try:
            return with_queue_cap(POLICIES[base], int(cap_text))
        except ValueError:
            raise ValueError(
                f"policy {name!r}: queue cap {cap_text!r}: expected a whole number of requests >= 1 "
                "(vLLM's --max-num-queued-reqs)"
            ) from None
    if name == TUNED_VALVE:
        raise ValueError(
            f"{TUNED_VALVE!r} is a search over valve caps, not one policy: replay it with "
            "meridian replay, the corpus or bench/replay_ab.py"
        )
    raise ValueError(
        f"unknown policy {name!r}; known: {', '.join(POLICIES)}, {TUNED_VALVE} (the tuned valve), "
        f"a valve policy at an explicit cap such as vllm-fcfs+cap=96, or {CACHE_AWARE} at an explicit window "
        f"such as {CACHE_AWARE}=64"
    )


def unvalved_policy(spec: PolicySpec) -> str:
    """The stock policy a valve policy puts its valve in front of (``vllm-fcfs+cap`` →
    ``vllm-fcfs``); the policy itself for one without a valve."""
    if not spec.valve:
        return spec.name
    return next(
        name
        for name, p in POLICIES.items()
        if not p.valve and not p.cache_aware and p.meridian_policy is None and p.vllm_policy == spec.vllm_policy
    )


def check_policy_name(name: str) -> None:
    """Raises ``ValueError`` unless ``name`` is a policy or ``TUNED_VALVE`` (what a replay takes)."""
    if name != TUNED_VALVE:
        policy_spec(name)


def scheduler_class(spec: PolicySpec, cache_aware_window: int | None = None) -> type[Any]:
    """The vLLM scheduler class a policy runs (a cache-aware policy's at its window: its own, else
    ``cache_aware_window``, which a policy with a docs-sized window needs)."""
    if spec.meridian_policy is None:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        if not spec.cache_aware:
            return AsyncScheduler
        window = spec.cache_aware_window if spec.cache_aware_window is not None else cache_aware_window
        if window is None:
            raise ValueError(f"policy {spec.name!r}: its cache-aware window is sized for a workload; none given")
        return cache_aware_scheduler(AsyncScheduler, window, spec.cache_aware_threshold)
    from meridian.vllm.scheduler import MeridianScheduler

    return MeridianScheduler


def additional_config(
    spec: PolicySpec, meridian_config: dict[str, Any], profile: Profile | None = None
) -> dict[str, Any]:
    """vLLM's ``additional_config`` for a policy: the operator's ``meridian`` block with the
    policy mode, and the profile's step-time seed unless the operator gave one; nothing for stock
    vLLM."""
    if spec.meridian_policy is None:
        return {}
    config = dict(meridian_config)
    config["policy"] = spec.meridian_policy
    if profile is not None:
        config.setdefault("step_time", meridian_seed_step_time(profile))
    return {CONFIG_KEY: config}


def meridian_seed_step_time(profile: Profile) -> dict[str, float]:
    """The linear step-time seed Meridian's config takes, read off ``profile`` — what an operator
    who knows the hardware would configure (Meridian refits it online from the steps anyway)."""
    base_ms = profile.step_time_ms(StepBatch(0, 1, 0))
    num_tokens = profile.max_num_batched_tokens
    per_prefill_ms = (profile.step_time_ms(StepBatch(num_tokens, 0, num_tokens)) - base_ms) / num_tokens
    num_decodes = min(profile.max_num_seqs, 256)
    per_decode_ms = (profile.step_time_ms(StepBatch(0, num_decodes, 0)) - base_ms) / (num_decodes - 1 or 1)
    num_context = 1_000_000
    per_context_ms = (profile.step_time_ms(StepBatch(0, 1, num_context)) - base_ms) / num_context
    # Meridian's seed wants a positive prompt-token cost; a flat profile gets a negligible one.
    return {
        "base_ms": max(base_ms, 0.0),
        "per_prefill_token_ms": max(per_prefill_ms, 1e-9),
        "per_decode_request_ms": max(per_decode_ms, 0.0),
        "per_context_token_ms": max(per_context_ms, 0.0),
    }


@dataclass(frozen=True)
class HostTier:
    """The host KV tier a replay models: vLLM's OffloadingConnector with this many blocks of host
    memory, loads priced at the profile's host link."""

    num_blocks: int
    load_ms_per_token: float

    @classmethod
    def of(cls, profile: Profile, host_gib: float) -> HostTier | None:
        """A tier of ``host_gib`` GiB of host memory on ``profile`` (None for 0)."""
        if host_gib <= 0:
            return None
        kv_bytes = getattr(profile.cost, "kv_bytes_per_token", None)
        load_ms_per_token = profile.host_load_ms_per_token()
        num_blocks = int(host_gib * 2**30 // (int(kv_bytes or 0) * profile.block_size))
        return cls(num_blocks=max(1, num_blocks), load_ms_per_token=load_ms_per_token)


def engine_spec(
    spec: PolicySpec,
    profile: Profile,
    meridian_config: dict[str, Any],
    model_dir: Path,
    host_tier: HostTier | None = None,
    kv_role: str | None = None,
    max_num_inflight_kv_loads: int | None = None,
) -> EngineSpec:
    """The vLLM engine a policy is replayed on: the profile's KV capacity and batch limits, and
    the host tier if one is modelled, or its side of a prefill/decode hand-off (``kv_role``; on a
    decode side vLLM 0.34's async KV-load cap, ``max_num_inflight_kv_loads``)."""
    return EngineSpec(
        model_dir=model_dir,
        num_blocks=profile.num_kv_blocks,
        block_size=profile.block_size,
        max_num_seqs=profile.max_num_seqs,
        max_num_batched_tokens=profile.max_num_batched_tokens,
        max_model_len=profile.max_model_len,
        policy=spec.vllm_policy,
        additional_config=additional_config(spec, meridian_config, profile),
        num_host_blocks=host_tier.num_blocks if host_tier is not None else 0,
        host_load_ms_per_token=host_tier.load_ms_per_token if host_tier is not None else 0.0,
        kv_role=kv_role,
        max_num_inflight_kv_loads=max_num_inflight_kv_loads,
    )


# ---- vLLM's load valve -------------------------------------------------------------------------

#: The reason a valve refusal is recorded under (``Timeline.shed_by``).
VALVE = "valve"
#: Factors of the seats the KV cache holds (``effective_seats``) that the tuned valve tries. The
#: ones below 0.5 were added when the corpus found a scenario (mooncake-03) whose best cap lay
#: below half the seats: a grid that stops short of the best cap would undersell the baseline.
TUNED_CAP_FACTORS = (0.125, 0.25, 0.375, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0)


@dataclass(frozen=True)
class LoadValve:
    """vLLM's ``--max-num-queued-reqs`` as an arrival gate: refuses a request when admitting it
    would make more than ``cap`` requests unfinished (added to the engine, not yet finished), as
    ``AsyncLLM.check_admission`` does in the API server (a request counts from when the server
    accepts it to its final output)."""

    cap: int

    def __post_init__(self) -> None:
        check_queue_cap(self.cap)

    def __call__(self, engine: OfflineEngine, request: OfflineRequest) -> str | None:
        return VALVE if engine.num_in_flight + 1 > self.cap else None


#: The reason a refusal by Meridian's admission at arrival is recorded under (``Timeline.shed_by``).
ARRIVAL = "arrival"


class MeridianAdmission:
    """Meridian's admission at arrival (``MeridianFrontend`` and the core's ``ArrivalGate``) as an
    arrival gate: the scheduler's core publishes its queue at most every ``WRITE_PERIOD_S`` of the
    engine's clock, as the live scheduler does, and the gate decides on the latest snapshot and
    what it admitted since — the very core functions the API server and the engine run."""

    def __init__(self, config: Config) -> None:
        from meridian._core import ArrivalGate as CoreArrivalGate
        from meridian.vllm.arrival import WRITE_PERIOD_S

        self._gate = CoreArrivalGate(config)
        self._period_ms = WRITE_PERIOD_S * 1000.0
        self._published_ms = -float("inf")

    @staticmethod
    def of(spec: PolicySpec, meridian_config: Mapping[str, Any]) -> MeridianAdmission | None:
        """The gate for a policy whose configuration admits at arrival, else ``None``."""
        if spec.meridian_policy is None:
            return None
        config = Config.from_json(json.dumps({**meridian_config, "policy": spec.meridian_policy}))
        return MeridianAdmission(config) if config.admits_at_arrival else None

    def __call__(self, engine: OfflineEngine, request: OfflineRequest) -> str | None:
        now_ms = engine.now_ms
        if now_ms - self._published_ms >= self._period_ms:
            self._published_ms = now_ms
            snapshot = published_snapshot(engine)
            if snapshot is not None:
                self._gate.set_snapshots([snapshot])
        waited_ms = request.waited_ms if request.reports_wait else 0.0
        _, _, refusal, _ = self._gate.decide(now_ms, request.slo_class, request.priority, waited_ms)
        return ARRIVAL if refusal is not None else None


def published_snapshot(engine: OfflineEngine) -> str | None:
    """The queue the engine's scheduler would publish now (``Meridian.arrival_snapshot``, the
    JSON text ``MeridianFrontend`` reads for admission and ``GET /get_load``); ``None`` for an
    engine without a Meridian core (stock vLLM publishes nothing)."""
    from meridian._core import Meridian
    from meridian.vllm.scheduler import HANDLE_ATTR

    scheduler = engine.scheduler
    core = getattr(scheduler, "meridian", None)
    if not isinstance(core, Meridian):
        return None

    def handles(requests: Any) -> list[int]:
        return [h for r in requests if (h := getattr(r, HANDLE_ATTR, None)) is not None]

    return core.arrival_snapshot(engine.now_ms, handles(scheduler.running), handles(scheduler.queued_requests()))


def chain_gates(*gates: ArrivalGate | None) -> ArrivalGate | None:
    """One gate asking each of ``gates`` in order; the first refusal wins (``None``: no gate)."""
    present = [g for g in gates if g is not None]
    if len(present) <= 1:
        return present[0] if present else None

    def gate(engine: OfflineEngine, request: OfflineRequest) -> str | None:
        for g in present:
            reason = g(engine, request)
            if reason is not None:
                return reason
        return None

    return gate


@dataclass(frozen=True)
class WorkloadMeans:
    """What an operator knows of a workload to size a valve: mean prompt and output tokens per
    request and the tightest TTFT target among its classes."""

    prompt_tokens: float
    output_tokens: float
    min_ttft_target_ms: float

    @classmethod
    def of(cls, requests: Sequence[OfflineRequest], meridian_config: Mapping[str, Any]) -> WorkloadMeans:
        """Means over the requests the engine would admit (``max_tokens`` >= 1), each one's
        output being what its model generates (``generated_tokens``)."""
        valid = [r for r in requests if r.max_tokens >= 1]
        if not valid:
            raise ValueError("sizing a valve needs at least one request with room to generate")
        config = Config.from_json(json.dumps(dict(meridian_config)))
        known = set(config.class_names)
        classes = {r.slo_class if r.slo_class in known else config.default_class for r in valid}
        ttfts = [float(t) for name in classes if (t := config.class_targets(name).get("ttft_ms")) is not None]
        if not ttfts:
            raise ValueError(f"sizing a valve needs a TTFT target; classes {sorted(classes)} have none")
        return cls(
            prompt_tokens=sum(len(r.prompt_token_ids) for r in valid) / len(valid),
            output_tokens=sum(generated_tokens(r) for r in valid) / len(valid),
            min_ttft_target_ms=min(ttfts),
        )


def generated_tokens(request: OfflineRequest) -> int:
    """The tokens a request's model generates — what an operator's logs give as its output
    length: for a replayed trace request its thinking, the reasoning-end token, its answer and
    EOS; for a fixed script its tokens; otherwise ``max_tokens``, the most it may generate (never
    the first choice: a request's ``max_tokens`` is a cap, often the whole context)."""
    script = request.script
    trace = getattr(script, "trace", None)
    if trace is not None:
        answer = trace.num_answer_tokens if trace.num_answer_tokens is not None else trace.num_output_tokens
        thinking = trace.num_think_tokens + 1 if trace.num_think_tokens is not None else 0
        return int(min(thinking + answer + 1, request.max_tokens))
    tokens = getattr(script, "tokens", None)
    if tokens is not None:
        ends = bool(tokens) and tokens[-1] == EOS  # the script's EOS ends it, else one follows
        return min(len(tokens) + (0 if ends else 1), request.max_tokens)
    return request.max_tokens


def valve_capacity_rps(profile: Profile, means: WorkloadMeans) -> float:
    """Requests per second the engine completes, estimated the way an operator can without
    running anything: a full batch (``max_num_seqs``) decodes, each request needing its mean
    output in decode steps of a full batch (context: every seat at its prompt plus half its
    output, at most the KV capacity), plus its prompt's prefill at the per-token cost of a full
    prefill chunk. The prefill term is added to the decode-only estimate because on these
    workloads it is not small: Mooncake's ~15k-token prompts cost several times a request's
    share of the decode steps."""
    seats = profile.max_num_seqs
    context = min(profile.kv_capacity_tokens, round(seats * (means.prompt_tokens + means.output_tokens / 2)))
    decode_step_ms = profile.step_time_ms(StepBatch(0, seats, context))
    chunk = profile.max_num_batched_tokens
    prefill_ms_per_token = profile.step_time_ms(StepBatch(chunk, 0, chunk)) / chunk
    engine_ms_per_request = means.output_tokens * decode_step_ms / seats + means.prompt_tokens * prefill_ms_per_token
    return 1000.0 / engine_ms_per_request


def docs_sized_queue_cap(*, max_num_seqs: int, capacity_rps: float, min_ttft_target_ms: float) -> int:
    """The valve's cap as vLLM's docs advise (``SchedulerConfig.max_num_queued_reqs``: "roughly
    data_parallel_size * max_num_seqs plus the desired queue depth"), one engine: every seat
    plus the queue that drains within the tightest TTFT target at the engine's capacity
    (Little's law), ``max_num_seqs + ceil(capacity_rps * min_ttft_target_s)``."""
    if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
        raise ValueError(f"sizing a valve: max_num_seqs {max_num_seqs!r} must be a whole number >= 1")
    if not (math.isfinite(capacity_rps) and capacity_rps > 0):
        raise ValueError(f"sizing a valve: capacity {capacity_rps!r} req/s must be a positive number")
    if not (math.isfinite(min_ttft_target_ms) and min_ttft_target_ms > 0):
        raise ValueError(f"sizing a valve: TTFT target {min_ttft_target_ms!r} ms must be a positive number")
    return max_num_seqs + math.ceil(capacity_rps * min_ttft_target_ms / 1000.0)


def queue_cap_for(
    spec: PolicySpec, requests: Sequence[OfflineRequest], profile: Profile, meridian_config: Mapping[str, Any]
) -> int | None:
    """The cap a policy's valve runs with on this workload: its own, else docs-sized
    (``docs_sized_queue_cap`` of ``valve_capacity_rps``); ``None`` for a policy without a valve."""
    if not spec.valve:
        return None
    if spec.queue_cap is not None:
        return spec.queue_cap
    means = WorkloadMeans.of(requests, meridian_config)
    return docs_sized_queue_cap(
        max_num_seqs=profile.max_num_seqs,
        capacity_rps=valve_capacity_rps(profile, means),
        min_ttft_target_ms=means.min_ttft_target_ms,
    )


# ---- vLLM 0.34's cache-aware admission -----------------------------------------------------------


def docs_sized_cache_aware_window(*, capacity_rps: float, min_ttft_target_ms: float) -> int:
    """The cache-aware window as vLLM's docs advise (``SchedulerConfig.cache_aware_admission_window``:
    "prefer the smallest window that spans the usual queue depth"), with the usual queue depth
    an operator plans for without running anything — the one the docs-sized valve plans for
    (``docs_sized_queue_cap``'s queue term): the requests that drain within the tightest TTFT
    target at the engine's capacity, ``ceil(capacity_rps * min_ttft_target_s)``, at least 2 (the
    reorder needs two requests to swap)."""
    if not (math.isfinite(capacity_rps) and capacity_rps > 0):
        raise ValueError(f"sizing a cache-aware window: capacity {capacity_rps!r} req/s must be a positive number")
    if not (math.isfinite(min_ttft_target_ms) and min_ttft_target_ms > 0):
        raise ValueError(
            f"sizing a cache-aware window: TTFT target {min_ttft_target_ms!r} ms must be a positive number"
        )
    return max(2, math.ceil(capacity_rps * min_ttft_target_ms / 1000.0))


def cache_aware_window_for(
    spec: PolicySpec, requests: Sequence[OfflineRequest], profile: Profile, meridian_config: Mapping[str, Any]
) -> int | None:
    """The window a cache-aware policy runs with on this workload: its own, else docs-sized
    (``docs_sized_cache_aware_window`` of ``valve_capacity_rps``); ``None`` for a policy without."""
    if not spec.cache_aware:
        return None
    if spec.cache_aware_window is not None:
        return spec.cache_aware_window
    if not requests:
        raise ValueError(
            f"policy {spec.name!r} sizes its window for the workload, and none was given (an engine behind a "
            f"router sees its requests one by one): give the window, e.g. {CACHE_AWARE}=64"
        )
    means = WorkloadMeans.of(requests, meridian_config)
    return docs_sized_cache_aware_window(
        capacity_rps=valve_capacity_rps(profile, means), min_ttft_target_ms=means.min_ttft_target_ms
    )


def with_sized_window(
    spec: PolicySpec, requests: Sequence[OfflineRequest], profile: Profile, meridian_config: Mapping[str, Any]
) -> PolicySpec:
    """``spec`` with its docs-sized cache-aware window resolved on ``requests`` (its name kept),
    for engines that see the workload one request at a time (a fleet's); ``spec`` itself when it
    has no window to size."""
    if not spec.cache_aware or spec.cache_aware_window is not None:
        return spec
    window = cache_aware_window_for(spec, requests, profile, meridian_config)
    return dataclasses.replace(spec, cache_aware_window=window)


def shared_first_blocks(requests: Sequence[OfflineRequest], block_size: int) -> int:
    """Requests whose first KV block (``block_size`` prompt tokens, and at least one token after
    it: vLLM recomputes a prompt's last token) some other request's prompt also starts with: the
    requests a prefix cache can serve from another's blocks. With none, cache-aware admission
    never moves anything (every waiting request's cached prefix is 0) and is FCFS exactly."""
    firsts: dict[tuple[int, ...], int] = {}
    for request in requests:
        tokens = request.prompt_token_ids
        if len(tokens) > block_size:
            key = tuple(tokens[:block_size])
            firsts[key] = firsts.get(key, 0) + 1
    return sum(n for n in firsts.values() if n > 1)


def effective_seats(profile: Profile, means: WorkloadMeans) -> int:
    """The requests that decode at once when the engine is full: ``max_num_seqs``, or fewer
    when the KV cache holds fewer requests at their mean mid-life size (prompt plus half the
    output). On the bundled profiles (1,024 seats) the KV cache is what binds."""
    per_request = max(means.prompt_tokens + means.output_tokens / 2, 1.0)
    return max(1, min(profile.max_num_seqs, int(profile.kv_capacity_tokens // per_request)))


def queue_cap_grid(
    seats: int, never_binds_at: int | None = None, factors: Sequence[float] = TUNED_CAP_FACTORS
) -> list[int]:
    """The caps the tuned valve tries: ``seats`` (``effective_seats``) × each factor, rounded,
    at least 1, ascending. Caps at or above ``never_binds_at`` (a run's ``peak_in_flight``
    without a valve, or the number of requests) never refuse anything there and give the run
    without a valve: only the smallest of them is kept."""
    if isinstance(seats, bool) or not isinstance(seats, int) or seats < 1:
        raise ValueError(f"a cap grid needs seats >= 1, got {seats!r}")
    caps = sorted({max(1, round(seats * f)) for f in factors})
    if never_binds_at is not None:
        inert = [c for c in caps if c >= never_binds_at]
        caps = [c for c in caps if c < never_binds_at] + inert[:1]
    return caps


def best_queue_cap(good_by_cap: Mapping[int, int]) -> int:
    """The cap whose run met every target for the most requests (on a tie the largest cap, the
    one that refuses the fewest)."""
    if not good_by_cap:
        raise ValueError("no caps to choose from")
    return max(good_by_cap, key=lambda cap: (good_by_cap[cap], cap))


def refined_queue_caps(good_by_cap: Mapping[int, int]) -> list[int]:
    """The tuned valve's second round: caps a third and two thirds of the way (geometrically)
    from the best cap so far to each of its neighbours in the grid, not tried yet. The grid's
    steps are up to 2× wide where the best caps were found (a peak between 40 and 80 seats, say),
    so one round of refinement keeps the search from underselling the baseline by its
    resolution."""
    caps = sorted(good_by_cap)
    best = best_queue_cap(good_by_cap)
    i = caps.index(best)
    out: set[int] = set()
    for neighbour in (caps[i - 1] if i > 0 else None, caps[i + 1] if i + 1 < len(caps) else None):
        if neighbour is None:
            continue
        for f in (1 / 3, 2 / 3):
            cap = round(math.exp(math.log(best) + f * (math.log(neighbour) - math.log(best))))
            if cap >= 1 and cap not in good_by_cap:
                out.add(cap)
    return sorted(out)


@dataclass
class ReplayResult:
    """One policy's replay."""

    policy: str
    run: EngineRun
    #: The valve's cap (``None``: no valve).
    queue_cap: int | None = None
    #: The cache-aware admission window (``None``: none).
    cache_aware_window: int | None = None


def replay_engine(
    spec: PolicySpec,
    requests: Sequence[OfflineRequest],
    profile: Profile,
    *,
    meridian_config: dict[str, Any],
    model_dir: Path,
    progress: Callable[[int], None] | None = None,
    scheduler_cls: type[Any] | None = None,
    engine_cls: type[OfflineEngine] = OfflineEngine,
    batch_queue_size: int | None = None,
    host_tier: HostTier | None = None,
    arrival_gate: ArrivalGate | None = None,
    kv_role: str | None = None,
    transfer_cost: TransferCost | None = None,
    max_num_inflight_kv_loads: int | None = None,
    noise_stream: int = 0,
) -> OfflineEngine:
    """The engine that replays ``requests`` under one policy on ``profile``, ready to run.
    ``scheduler_cls`` replaces the policy's scheduler class (a subclass of it, say), and
    ``engine_cls`` the engine loop's class. ``arrival_gate`` is asked for each arriving request
    (after the policy's own valve, if it has one) whether to refuse it. ``kv_role`` puts the
    engine on one side of a prefill/decode hand-off whose reads cost ``transfer_cost`` (a decode
    side may start its loads while its seats are full: ``max_num_inflight_kv_loads``, vLLM 0.34).
    ``noise_stream``: which of the profile's noise streams its steps meet (one per engine of a
    replay; every policy's engine ``i`` meets the same)."""
    cap = queue_cap_for(spec, requests, profile, meridian_config)
    gate = chain_gates(
        LoadValve(cap) if cap is not None else None, MeridianAdmission.of(spec, meridian_config), arrival_gate
    )
    window = cache_aware_window_for(spec, requests, profile, meridian_config)
    scheduler = build_scheduler(
        scheduler_cls or scheduler_class(spec, window),
        engine_spec(spec, profile, meridian_config, model_dir, host_tier, kv_role, max_num_inflight_kv_loads),
    )
    return engine_cls(
        scheduler,
        requests,
        observer_config=Config.from_json(json.dumps(meridian_config)),
        step_time_ms=profile.step_timer(noise_stream),
        batch_queue_size=batch_queue_size,
        keep_output_tokens=False,
        progress=progress,
        host_load_ms_per_token=host_tier.load_ms_per_token if host_tier is not None else 0.0,
        arrival_gate=gate,
        transfer_cost=transfer_cost,
    )


def replay_policy(
    spec: PolicySpec, requests: Sequence[OfflineRequest], profile: Profile, **options: Any
) -> ReplayResult:
    """Replays ``requests`` under one policy on ``profile`` (``options``: ``replay_engine``'s)."""
    run = replay_engine(spec, requests, profile, **options).run()
    config = options["meridian_config"]
    return ReplayResult(
        spec.name,
        run,
        queue_cap_for(spec, requests, profile, config),
        cache_aware_window_for(spec, requests, profile, config),
    )
