"""The replay soak: one engine per policy kept running for as many steps as asked, fed random
trace mixes back to back, with the engine's invariants checked after every step and what the
core holds sampled each time the engine drains.

A *segment* is a random draw: a trace family (the bundled Azure excerpt, and the public Azure and
Mooncake traces when given the folder that holds them), a window of it, a rate scale (from a quiet
engine to one past its capacity, where triage sheds and degrades), a class rule and the seed of
its reasoning lengths. Segments are submitted one after another, each after the previous one
has drained, so a single scheduler (and its Meridian core) lives through thousands of requests,
as a server's does. Checked after every step: no request ends twice or outputs after its end,
nothing unknown comes out, vLLM's scheduler and Meridian's core track the same requests, the
KV cache never hands out more blocks than it has. Checked at each drain: every submitted request
has ended, every KV block is free again, the cores track nothing; the cores' footprints and the
process's RSS are sampled there, so growth with finished requests shows as a slope. Invariant:
a soak with the same seed, steps and policy replays the very same segments and steps.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from meridian._core import Config, Meridian
from meridian.offline.engine import REFUSED, OfflineEngine, offline_environment
from meridian.replay import reasoning, traces
from meridian.replay.policies import policy_spec, replay_engine
from meridian.replay.profiles import Profile
from meridian.replay.runner import DEFAULT_TRACES, default_meridian_config
from meridian.replay.workload import model_dir_for, offline_requests

#: Violations kept verbatim per soak (all are counted).
MAX_VIOLATIONS_KEPT = 20
#: Virtual time between the end of one segment and the first arrival of the next.
SEGMENT_GAP_MS = 1_000.0


@dataclass(frozen=True)
class Family:
    """A trace family a segment can be drawn from."""

    name: str
    paths: tuple[Path, ...]
    #: Class rules a segment of it draws from (sources differ per family).
    class_rules: tuple[str, ...]
    #: Rate scales, log-uniform between these: a quiet engine to one past its capacity.
    rate_scale_range: tuple[float, float]
    window_s_range: tuple[float, float] = (5.0, 25.0)


_MIX_RULES = ("mix:interactive=0.3,standard=0.5,batch=0.2", "fixed:standard", "fixed:interactive")


def families(shared: Path | None = None) -> list[Family]:
    """The bundled excerpt always; the public traces when ``shared`` has them."""
    out = [
        Family(
            "azure-excerpt",
            tuple(DEFAULT_TRACES),
            ("by-source:code=interactive,conv=standard", *_MIX_RULES),
            (0.05, 0.6),
        )
    ]
    if shared is None:
        return out
    azure = tuple(shared / "azure_llm_2023" / f"AzureLLMInferenceTrace_{k}.csv" for k in ("code", "conv"))
    if all(p.exists() for p in azure):
        out.append(Family("azure", azure, ("by-source:code=interactive,conv=standard", *_MIX_RULES), (0.03, 0.4)))
    mooncake = shared / "mooncake" / "synthetic_trace.jsonl"
    if mooncake.exists():
        out.append(Family("mooncake", (mooncake,), _MIX_RULES, (0.1, 1.2)))
    return out


def soak_config() -> dict[str, Any]:
    """The replay's default classes with every triage and the replayable thinking control on:
    interactive sheds, standard degrades (its thinking ends early), batch queues and runs under
    a load-aware thinking budget."""
    config = default_meridian_config()
    classes = config["classes"]
    classes["interactive"]["on_overload"] = "shed"
    classes["standard"]["on_overload"] = "degrade"
    classes["batch"]["on_overload"] = "queue"
    classes["batch"]["thinking_control"] = {"load_aware": {"budget_tokens": 4096}}
    return config


@dataclass
class FootprintSample:
    """What was held at one drain."""

    step: int
    num_finished: int
    #: The scheduler's Meridian core (None under stock vLLM) and the engine's observer core.
    core_heap_bytes: int | None
    #: Its slots (the most requests live at once so far) and the prefix blocks it indexes (the
    #: device cache keeps a drained engine's blocks, free but cached): what its heap scales with.
    core_num_slots: int | None
    core_num_indexed_blocks: int | None
    observer_heap_bytes: int
    rss_bytes: int


@dataclass
class SoakReport:
    """One policy's soak."""

    policy: str
    seed: int
    #: Steps that scheduled tokens, and those that scheduled none (paced answers, an idle tick).
    num_steps: int = 0
    num_idle_steps: int = 0
    num_segments: int = 0
    num_submitted: int = 0
    finish_reasons: Counter[str] = field(default_factory=Counter)
    num_violations: int = 0
    violations: list[str] = field(default_factory=list)
    samples: list[FootprintSample] = field(default_factory=list)
    segments: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def num_finished(self) -> int:
        return sum(self.finish_reasons.values())

    def violation(self, message: str) -> None:
        self.num_violations += 1
        if len(self.violations) < MAX_VIOLATIONS_KEPT:
            self.violations.append(f"step {self.num_steps}: {message}")

    def to_json(self) -> dict[str, Any]:
        payload = dataclasses.asdict(self)
        payload["finish_reasons"] = dict(self.finish_reasons)
        payload["num_finished"] = self.num_finished
        payload["memory"] = memory_summary(self.samples)
        return payload


def _since_last_change(samples: Sequence[FootprintSample], value: Any) -> dict[str, int]:
    """The step of the last drain at which ``value(sample)`` changed, and the requests finished
    since then: a heap that grew with finished requests never stays the same for long."""
    changed = samples[0]
    for before, after in zip(samples, samples[1:]):
        if value(after) != value(before):
            changed = after
    return {"step": changed.step, "requests_since": samples[-1].num_finished - changed.num_finished}


def memory_summary(samples: Sequence[FootprintSample]) -> dict[str, Any]:
    """Growth of what the cores and the process hold, from the first drain past the first tenth
    of the run (warm-up: maps and slot tables reach their size) to the last one, and when each
    core's heap last changed (it grows when the peak of live requests or of indexed blocks rises,
    or once when a map with tombstones doubles; never with finished requests)."""
    if len(samples) < 2:
        return {}
    warm = samples[min(len(samples) - 1, max(1, len(samples) // 10))]
    last = samples[-1]

    def growth(a: int | None, b: int | None) -> float | None:
        return None if a is None or b is None or a == 0 else b / a - 1.0

    return {
        "core_heap_last_change": (
            None if last.core_heap_bytes is None else _since_last_change(samples, lambda s: s.core_heap_bytes)
        ),
        "observer_heap_last_change": _since_last_change(samples, lambda s: s.observer_heap_bytes),
        "warm_step": warm.step,
        "last_step": last.step,
        "requests_between": last.num_finished - warm.num_finished,
        "core_heap_bytes": [
            warm.core_heap_bytes,
            last.core_heap_bytes,
            max((s.core_heap_bytes or 0) for s in samples) or None,
        ],
        "core_heap_growth": growth(warm.core_heap_bytes, last.core_heap_bytes),
        "observer_heap_bytes": [warm.observer_heap_bytes, last.observer_heap_bytes],
        "observer_heap_growth": growth(warm.observer_heap_bytes, last.observer_heap_bytes),
        "rss_bytes": [warm.rss_bytes, last.rss_bytes],
        "rss_growth": growth(warm.rss_bytes, last.rss_bytes),
    }


class _Checker:
    """The per-step and per-drain checks of one soak engine."""

    def __init__(self, engine: OfflineEngine, report: SoakReport) -> None:
        self.engine = engine
        self.report = report
        self.block_pool = engine.scheduler.kv_cache_manager.block_pool
        self.num_blocks = self.block_pool.get_num_free_blocks()
        core = getattr(engine.scheduler, "meridian", None)
        self.core = core if isinstance(core, Meridian) else None
        self.submitted: set[str] = set()
        self.ended: set[str] = set()

    def after_step(self, engine_outputs: Mapping[int, Any], num_scheduled_tokens: int) -> None:
        report = self.report
        if num_scheduled_tokens:
            report.num_steps += 1
        else:
            report.num_idle_steps += 1
        for batch in engine_outputs.values():
            for out in batch.outputs:
                self._check_output(out)
        scheduler = self.engine.scheduler
        num_tracked = len(scheduler.requests)
        if num_tracked != self.engine.num_in_flight:
            report.violation(
                f"vLLM tracks {num_tracked} requests, the engine has {self.engine.num_in_flight} in flight"
            )
        if self.core is not None and self.core.num_requests != num_tracked:
            report.violation(f"Meridian's core tracks {self.core.num_requests} requests, vLLM {num_tracked}")
        num_free = self.block_pool.get_num_free_blocks()
        if not 0 <= num_free <= self.num_blocks:
            report.violation(f"{num_free} free KV blocks of {self.num_blocks}")

    def _check_output(self, out: Any) -> None:
        req_id = out.request_id
        if req_id not in self.submitted:
            self.report.violation(f"output for {req_id!r}, never submitted")
        elif req_id in self.ended:
            self.report.violation(f"output for {req_id!r} after its end")
        elif out.finish_reason is not None:
            self.ended.add(req_id)
            self.report.finish_reasons[str(out.finish_reason)] += 1

    def submit(self, requests: Sequence[Any]) -> None:
        for request in requests:
            if request.req_id in self.submitted:
                self.report.violation(f"segment reuses request id {request.req_id!r}")
            self.submitted.add(request.req_id)
            self.engine.submit(request)
        self.report.num_submitted += len(requests)

    def at_drain(self) -> None:
        """Every submitted request ended, every block free, nothing tracked; then a sample, and
        the engine's per-request records dropped (they are the run's, not the scheduler's)."""
        report, engine = self.report, self.engine
        run = engine.result
        # Requests that never reached the scheduler end on arrival: rejected (no room to
        # generate) or refused by an arrival gate (a load valve).
        for reason in ("rejected", REFUSED):
            ended = [t.req_id for t in run.timelines.values() if t.finish_reason == reason]
            if ended or reason == "rejected":
                report.finish_reasons[reason] += len(ended)
            self.ended.update(ended)
        missing = self.submitted - self.ended
        if missing:
            report.violation(f"{len(missing)} requests never ended, e.g. {sorted(missing)[:3]}")
        num_free = self.block_pool.get_num_free_blocks()
        if num_free != self.num_blocks:
            report.violation(f"{self.num_blocks - num_free} KV blocks still held after the drain")
        for name, core in (("Meridian's core", self.core), ("the observer", engine.observer)):
            if core is not None and core.num_requests != 0:
                report.violation(f"{name} still tracks {core.num_requests} requests after the drain")
        self.submitted.clear()
        self.ended.clear()
        run.timelines.clear()
        run.scheduled_tokens_per_step.clear()
        run.token_budget_per_step.clear()
        report.samples.append(self._sample())

    def _sample(self) -> FootprintSample:
        import psutil

        core = self.core.footprint() if self.core is not None else None
        return FootprintSample(
            step=self.report.num_steps,
            num_finished=self.report.num_finished,
            core_heap_bytes=core["heap_bytes"] if core is not None else None,
            core_num_slots=core["num_slots"] if core is not None else None,
            core_num_indexed_blocks=core["num_indexed_blocks"] if core is not None else None,
            observer_heap_bytes=self.engine.observer.footprint()["heap_bytes"],
            rss_bytes=psutil.Process().memory_info().rss,
        )


@dataclass(frozen=True)
class Segment:
    """One random draw of a soak (see the module docs)."""

    index: int
    family: Family
    start_s: float
    window_s: float
    rate_scale: float
    class_rule: str
    seed: int

    def describe(self) -> dict[str, Any]:
        return {
            "family": self.family.name,
            "start_s": round(self.start_s, 1),
            "window_s": round(self.window_s, 1),
            "rate_scale": round(self.rate_scale, 4),
            "class_rule": self.class_rule,
            "seed": self.seed,
        }


class _Segments:
    """Draws segments and builds their requests (traces loaded once per family)."""

    def __init__(self, seed: int, profile: Profile, config: Config, shared: Path | None) -> None:
        self.rng = np.random.default_rng(seed)
        self.families = families(shared)
        self.profile = profile
        self.config = config
        self._loaded: dict[str, list[traces.TraceRequest]] = {}
        self.servegen = reasoning.ServeGenLengths.default()

    def _trace(self, family: Family) -> list[traces.TraceRequest]:
        if family.name not in self._loaded:
            self._loaded[family.name] = traces.load_traces(list(family.paths))
        return self._loaded[family.name]

    def draw(self, index: int) -> Segment:
        rng = self.rng
        family = self.families[int(rng.integers(len(self.families)))]
        span_s = self._trace(family)[-1].arrival_ms / 1000.0
        window_s = float(rng.uniform(*family.window_s_range))
        low, high = family.rate_scale_range
        return Segment(
            index=index,
            family=family,
            start_s=float(rng.uniform(0.0, max(0.0, span_s - window_s))),
            window_s=window_s,
            rate_scale=float(math.exp(rng.uniform(math.log(low), math.log(high)))),
            class_rule=family.class_rules[int(rng.integers(len(family.class_rules)))],
            seed=int(rng.integers(2**31)),
        )

    def requests(self, segment: Segment, offset_ms: float) -> list[Any]:
        """The segment's requests, ids prefixed by its index, arrivals from ``offset_ms``."""
        requests = traces.window(self._trace(segment.family), segment.start_s, segment.window_s)
        requests = reasoning.apply_reasoning_lengths(requests, "servegen", seed=segment.seed, servegen=self.servegen)
        requests = traces.assign_classes(requests, segment.class_rule, segment.seed)
        requests = traces.scale_rate(requests, segment.rate_scale)
        requests = [
            dataclasses.replace(r, req_id=f"s{segment.index}-{r.req_id}", arrival_ms=r.arrival_ms + offset_ms)
            for r in requests
        ]
        return offline_requests(requests, self.profile, self.config)


def run_soak(
    policy: str,
    num_steps: int,
    *,
    seed: int = 0,
    profile: str = "h200-qwen3-32b",
    cache_dir: Path = Path(".cache"),
    shared: Path | None = None,
    scheduler_cls: type[Any] | None = None,
) -> SoakReport:
    """Soaks one policy for at least ``num_steps`` engine steps (it stops at the first drain
    past them); ``shared``: the folder of the public traces (``../shared/traces``), else the
    bundled excerpt only; ``scheduler_cls``: a subclass of the policy's scheduler class to soak
    instead. See the module docs."""
    import time

    if num_steps < 1:
        raise ValueError(f"num_steps must be at least 1, got {num_steps}")
    offline_environment(cache_dir)
    spec = policy_spec(policy)
    loaded = Profile.load(profile)
    meridian_config = soak_config()
    config = Config.from_json(json.dumps(meridian_config))
    report = SoakReport(policy=policy, seed=seed)
    started = time.perf_counter()
    engine = replay_engine(
        spec,
        [],
        loaded,
        meridian_config=meridian_config,
        model_dir=model_dir_for(loaded, cache_dir),
        scheduler_cls=scheduler_cls,
    )
    checker = _Checker(engine, report)
    engine.after_step = checker.after_step
    segments = _Segments(seed, loaded, config, shared)
    while report.num_steps < num_steps:
        segment = segments.draw(report.num_segments)
        requests = segments.requests(segment, engine.now_ms + SEGMENT_GAP_MS)
        report.num_segments += 1
        report.segments.append({**segment.describe(), "num_requests": len(requests), "from_step": report.num_steps})
        checker.submit(requests)
        engine.finish()
        checker.at_drain()
    report.wall_s = time.perf_counter() - started
    return report
