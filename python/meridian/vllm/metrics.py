"""Meridian's series on the ``/metrics`` vLLM's OpenAI server already serves.

vLLM runs the scheduler in the engine-core process and serves ``/metrics`` from the API
server(s). The supported bridge between processes is Prometheus' multiprocess mode, which vLLM
itself turns on when it runs several API servers (``PROMETHEUS_MULTIPROC_DIR``: each process
writes its values to memory-mapped files there and ``/metrics`` collects every file). So the
engine core writes Meridian's series with ``prometheus_client`` into that directory, or, with
one API server (where vLLM serves its in-memory registry), into a directory of its own that
``MeridianMetricsCollector`` — a vLLM stat-logger plugin, loaded by every API server through the
``vllm.stat_logger_plugins`` entry point — adds to the registry vLLM serves. Counters and
histograms are written once, by the engine core that owns them, so several API servers read the
same numbers and never add them up twice. Gauges are refreshed at most every
``GAUGE_PERIOD_S`` while the engine steps, and on every change while it has nothing to step: when
it runs out of requests (so they read zero when idle) and while vLLM's scheduler is paused (an
arrival or abort then is followed by no step: the gauges show the queue the paused engine holds);
histograms are observed as requests finish; counters mirror the core's monotone counters.
Invariant: only Meridian's own metric objects write to files — the process' other
``prometheus_client`` metrics and its environment are left as they were — and nothing here
decides anything: every figure comes from the core or from vLLM.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, values
from prometheus_client.multiprocess import MultiProcessCollector

from meridian._core import SHED_REASONS, THINKING_STOP_RULES
from meridian.errors import ConfigError
from meridian.vllm._version import require_supported_vllm
from meridian.vllm.bus import bus_dir, private_dir
from meridian.vllm.config import runs_meridian_scheduler
from meridian.vllm.names import (
    BUS_DIR_ENV,
    CLASS_TARGETS,
    KV_HANDOFF_OUTCOMES,
    KV_TIER_DECISIONS,
    PREEMPTION_PHASES,
    REQUEST_STATES,
    SERIES,
    STEP_TIME_TERMS,
)

require_supported_vllm()

from vllm.v1.metrics.loggers import StatLoggerBase  # noqa: E402

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats

    from meridian._core import FinishedRequest, Meridian

logger = logging.getLogger("meridian")

#: prometheus_client's multiprocess directory variable (vLLM sets it for several API servers).
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Least seconds between two refreshes of the gauges while requests run.
GAUGE_PERIOD_S = 0.25
TTFAT_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
TPOT_BUCKETS_S = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
THINKING_TOKEN_BUCKETS = (0, 16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
#: Bucket edges of each histogram, by series key.
BUCKETS = {"ttfat": TTFAT_BUCKETS_S, "answer_tpot": TPOT_BUCKETS_S, "thinking_tokens": THINKING_TOKEN_BUCKETS}

_VALUE_CLASSES: dict[str, Any] = {}
_VALUE_LOCK = threading.Lock()


def served_model_name(vllm_config: VllmConfig) -> str:
    """The model name the server's series are labelled with (vLLM's first served name)."""
    name = vllm_config.model_config.served_model_name
    if isinstance(name, str):
        return name
    return name[0] if name else str(vllm_config.model_config.model)


def metrics_dir(vllm_config: VllmConfig) -> Path:
    """Where the engine core writes Meridian's series: vLLM's multiprocess directory when it
    runs one, else one per server (named by the configuration's ``instance_id``, which the API
    server and its engine cores share) in the bus folder, once it is checked to be this user's alone
    (``ConfigError`` otherwise: another user's files there would be served as Meridian's series)."""
    shared = os.environ.get(MULTIPROC_DIR_ENV)
    if shared:
        return Path(shared)
    return private_dir(bus_dir()) / f"meridian-metrics-{vllm_config.instance_id}"


@contextmanager
def _writing_to(directory: Path) -> Iterator[None]:
    # prometheus_client picks a metric value's storage when the value is created, from
    # `values.ValueClass` and the directory variable: both are set only while Meridian's own
    # values are created, so the rest of the process keeps its in-memory metrics.
    with _VALUE_LOCK:
        value_class = _VALUE_CLASSES.setdefault(str(directory), values.MultiProcessValue())
        saved_class, saved_dir = values.ValueClass, os.environ.get(MULTIPROC_DIR_ENV)
        values.ValueClass = value_class
        os.environ[MULTIPROC_DIR_ENV] = str(directory)
        try:
            yield
        finally:
            values.ValueClass = saved_class
            if saved_dir is None:
                del os.environ[MULTIPROC_DIR_ENV]
            else:
                os.environ[MULTIPROC_DIR_ENV] = saved_dir


class MeridianMetrics:
    """The engine core's writer of Meridian's series for one ``MeridianScheduler``."""

    def __init__(
        self,
        directory: Path,
        model_name: str,
        engine: int,
        class_targets: Mapping[str, Mapping[str, float | int | None]],
    ) -> None:
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"cannot create Meridian's metrics directory {str(directory)!r} ({exc}); point "
                f"{BUS_DIR_ENV} at a writable folder, or set `metrics: false`"
            ) from exc
        self.directory = directory
        self._base = {"model_name": model_name, "engine": str(engine)}
        self._class_names = list(class_targets)
        self._last_gauges_s = float("-inf")
        #: The core's counters as last mirrored, and the children made: keyed (series, *labels).
        self._mirrored: dict[tuple[Any, ...], float] = {}
        self._children: dict[tuple[Any, ...], Any] = {}
        self._make_series()
        for name, targets in class_targets.items():
            for target in CLASS_TARGETS:
                value = targets.get(f"{target}_ms")
                self._child(self.class_target, **{"class": name}, target=target).set(_seconds(value))

    def _make_series(self) -> None:
        def make(key: str) -> Any:
            series = SERIES[key]
            labels = ["model_name", "engine", *series.labels]
            if series.kind == "counter":
                # prometheus_client appends `_total` to a counter's exposed name.
                return Counter(series.name.removesuffix("_total"), series.help, labels, registry=None)
            if series.kind == "gauge":
                return Gauge(series.name, series.help, labels, registry=None, multiprocess_mode="mostrecent")
            return Histogram(series.name, series.help, labels, registry=None, buckets=BUCKETS[key])

        # The API server's series (``ArrivalMetrics``) are not the engine core's to create.
        self.ttfat = make("ttfat")
        self.answer_tpot = make("answer_tpot")
        self.thinking_tokens = make("thinking_tokens")
        self.requests_finished = make("requests_finished")
        self.preemptions = make("preemptions")
        self.answer_preemption_alarms = make("answer_preemption_alarms")
        self.arrival_preemptions = make("arrival_preemptions")
        self.shed_requests = make("shed_requests")
        self.thinking_stops = make("thinking_stops")
        self.kv_tier_resumes = make("kv_tier_resumes")
        self.kv_tier_resume_tokens = make("kv_tier_resume_tokens")
        self.kv_tier_failed_load_blocks = make("kv_tier_failed_load_blocks")
        self.kv_handoffs = make("kv_handoffs")
        self.kv_handoff_received_tokens = make("kv_handoff_received_tokens")
        self.num_requests = make("num_requests")
        self.least_slack = make("least_slack")
        self.ttfat_headroom = make("ttfat_headroom")
        self.recent_attainment = make("recent_ttfat_attainment")
        self.saturation = make("saturation")
        self.phase_weighted_queue = make("phase_weighted_queue")
        self.class_target = make("class_target")
        self.expected_output_tokens = make("expected_output_tokens")
        self.step_time_model = make("step_time_model")
        # Create every child now (each value's file is chosen when it is created).
        for name in self._class_names:
            for series in (
                self.ttfat,
                self.answer_tpot,
                self.thinking_tokens,
                self.arrival_preemptions,
                self.least_slack,
                self.ttfat_headroom,
                self.recent_attainment,
                self.saturation,
            ):
                self._child(series, **{"class": name})
            for reason in SHED_REASONS:
                self._child(self.shed_requests, **{"class": name}, reason=reason)
            for met in ("true", "false"):
                self._child(self.requests_finished, **{"class": name}, met_slo=met)
            for state in REQUEST_STATES:
                self._child(self.num_requests, **{"class": name}, state=state)
        for phase in PREEMPTION_PHASES:
            self._child(self.preemptions, phase=phase)
        for rule in THINKING_STOP_RULES:
            self._child(self.thinking_stops, rule=rule)
        for decision in KV_TIER_DECISIONS:
            self._child(self.kv_tier_resumes, decision=decision)
            self._child(self.kv_tier_resume_tokens, decision=decision)
        for outcome in KV_HANDOFF_OUTCOMES:
            self._child(self.kv_handoffs, outcome=outcome)
        for term in STEP_TIME_TERMS:
            self._child(self.step_time_model, term=term)
        for series in (
            self.answer_preemption_alarms,
            self.kv_tier_failed_load_blocks,
            self.kv_handoff_received_tokens,
            self.phase_weighted_queue,
            self.expected_output_tokens,
        ):
            self._child(series)

    # ---- per finished request -------------------------------------------------------------

    def on_finished(self, report: FinishedRequest) -> None:
        of_class = {"class": report.slo_class}
        if report.ttfat_ms is not None:
            self._child(self.ttfat, **of_class).observe(report.ttfat_ms / 1000.0)
        if report.answer_tpot_ms is not None:
            self._child(self.answer_tpot, **of_class).observe(report.answer_tpot_ms / 1000.0)
        if report.ttft_ms is not None:
            self._child(self.thinking_tokens, **of_class).observe(report.num_think_tokens)
        self._child(self.requests_finished, **of_class, met_slo="true" if report.met_all else "false").inc()

    # ---- refreshed with the gauges ----------------------------------------------------------

    def due(self, idle: bool) -> bool:
        """Whether to refresh now: every ``GAUGE_PERIOD_S`` while requests run, and when idle
        (vLLM counts no unfinished request while its paused scheduler has nothing to step)."""
        return idle or time.monotonic() - self._last_gauges_s >= GAUGE_PERIOD_S

    def refresh(self, core: Meridian, engine_load: tuple[dict[str, dict[str, int | float | None]], float]) -> None:
        """Sets the gauges from the core's view of the load (``MeridianScheduler.engine_load``) and
        mirrors its counters."""
        self._last_gauges_s = time.monotonic()
        classes, queue = engine_load
        attainment = core.recent_ttfat_attainment()
        for name, load in classes.items():
            of_class = {"class": name}
            for state in REQUEST_STATES:
                self._child(self.num_requests, **of_class, state=state).set(float(load[f"num_{state}"] or 0))
            self._child(self.least_slack, **of_class).set(_seconds(load["least_slack_ms"]))
            self._child(self.ttfat_headroom, **of_class).set(_seconds(load["ttfat_headroom_ms"]))
            self._child(self.recent_attainment, **of_class).set(attainment.get(name, float("nan")))
            self._child(self.saturation, **of_class).set(load["saturation"])
        self._child(self.phase_weighted_queue).set(queue)
        self._child(self.expected_output_tokens).set(
            sum(float(c["expected_output_tokens"] or 0) for c in classes.values())
        )
        for term, value in zip(STEP_TIME_TERMS, core.step_time_coefficients(), strict=True):
            self._child(self.step_time_model, term=term).set(value)
        self._mirror_counters(core)

    def _mirror_counters(self, core: Meridian) -> None:
        stats = core.stats()
        for phase in PREEMPTION_PHASES:
            self._advance(self.preemptions, stats[f"num_preemptions_{phase}"], phase=phase)
        self._advance(self.answer_preemption_alarms, stats["num_answer_preemption_alarms"])
        for name, counters in core.class_counters().items():
            self._advance(self.arrival_preemptions, counters["num_arrival_preemptions"], **{"class": name})
            for reason in SHED_REASONS:
                self._advance(self.shed_requests, counters[f"num_shed_{reason}"], **{"class": name}, reason=reason)
        tier = core.kv_tier_counters()
        self._advance(self.kv_tier_resumes, tier["num_restores"], decision="loaded")
        self._advance(self.kv_tier_resumes, tier["num_recomputes"], decision="recomputed")
        self._advance(self.kv_tier_resume_tokens, tier["num_restored_tokens"], decision="loaded")
        self._advance(self.kv_tier_resume_tokens, tier["num_recomputed_tokens"], decision="recomputed")
        self._advance(self.kv_tier_failed_load_blocks, tier["num_failed_load_blocks"])
        handoffs = core.handoff_counters()
        for outcome in KV_HANDOFF_OUTCOMES:
            self._advance(self.kv_handoffs, handoffs[f"num_{outcome}"], outcome=outcome)
        self._advance(self.kv_handoff_received_tokens, handoffs["num_received_tokens"])
        for rule, count in core.num_thinking_stops().items():
            self._advance(self.thinking_stops, count, rule=rule)

    def _advance(self, series: Counter, total: float, **labels: str) -> None:
        key = (id(series), *labels.values())
        step = total - self._mirrored.get(key, 0.0)
        if step > 0:
            self._mirrored[key] = total
            self._child(series, **labels).inc(step)

    def _child(self, series: Any, **labels: str) -> Any:
        # A child made after start (a thinking rule seen for the first time) gets its file the
        # same way the first ones did.
        key = (id(series), *labels.values())
        child = self._children.get(key)
        if child is None:
            with _writing_to(self.directory):
                child = self._children[key] = series.labels(**self._base, **labels)
        return child


class ArrivalMetrics:
    """The API server's writer of admission at arrival's series: the refusals it answers, counted
    into the directory the engine cores write theirs to, so one ``/metrics`` serves both (with one
    API server through ``MeridianMetricsCollector``, with several through vLLM's multiprocess
    collector, each API server's counts summed)."""

    def __init__(self, directory: Path, model_name: str, class_names: list[str]) -> None:
        series = SERIES["arrival_refusals"]
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.directory = directory
        with _writing_to(directory):
            counter = Counter(
                series.name.removesuffix("_total"), series.help, ["model_name", *series.labels], registry=None
            )
            # Every class's child now: a dashboard reads 0, not "no data", before the first refusal.
            self._refusals = {name: counter.labels(model_name=model_name, **{"class": name}) for name in class_names}

    def refused(self, slo_class: str) -> None:
        child = self._refusals.get(slo_class)
        if child is not None:
            child.inc()


def _seconds(ms: float | int | None) -> float:
    return float("nan") if ms is None else float(ms) / 1000.0


class MeridianMetricsCollector(StatLoggerBase):
    """vLLM stat-logger plugin (entry point ``vllm.stat_logger_plugins``): in an API server of a
    ``MeridianScheduler`` engine with one API server, adds the engine cores' Meridian directory
    to the registry vLLM serves on ``/metrics`` (with several, vLLM's multiprocess collector
    already reads it). Records nothing itself."""

    _registered: set[str] = set()

    def __init__(self, vllm_config: VllmConfig, engine_index: int = 0) -> None:
        if not runs_meridian_scheduler(vllm_config) or os.environ.get(MULTIPROC_DIR_ENV):
            return
        directory = metrics_dir(vllm_config)
        with _VALUE_LOCK:
            if str(directory) in self._registered:
                return
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            REGISTRY.register(MultiProcessCollector(None, path=str(directory)))
            self._registered.add(str(directory))
        atexit.register(shutil.rmtree, directory, ignore_errors=True)

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        pass

    def log_engine_initialized(self) -> None:
        pass
