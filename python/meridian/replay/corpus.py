"""The scenario corpus: an evaluation of the policies that no single trace or seed can overfit.

This module owns the corpus's scenarios and everything run over them. A scenario is built only
from the shared public traces (``../shared/traces``): a window of one trace family (Azure code,
Azure conversation, Mooncake) supplies the prompts (and Mooncake's prefix blocks); the arrivals are
the trace's own or ServeGen-shaped (one bursty 10-minute slice of ServeGen's day, or a diurnal
span of hours, ``meridian.replay.arrivals``); the reasoning lengths are ServeGen DeepSeek-R1's for
an hour of its day (the whole output, or the trace's own output split by a sampled ratio); a class
mix and a target set pick each request's SLO class and what it must meet. Arrivals are normalised
to one request per second, so a load is a rate in requests per second. Each scenario is replayed
at three loads — where stock vLLM FCFS meets about 90 %, 70 % and 50 % of the requests (found by
search, ``calibrate``) — under every policy; capacity is DistServe's goodput, the highest rate at
which 80 % of the requests meet every target of their class (``capacities``). vLLM's load valve
comes as columns too: at its docs-sized cap (``vllm-fcfs+cap``, ``vllm-priority+cap``) and tuned
(``vllm-fcfs+cap*``: at every scenario and rate, the cap of ``queue_cap_grid``, refined once
around the best (``refined_queue_caps``), that meets every target for the most requests). A cap at or above the stock policy's peak of unfinished requests
at that scenario and rate refuses nothing, so it takes that policy's result without a replay.

Invariants: a scenario's requests depend only on its fields (same fields, same requests, whatever
the policy or the process); every policy at a load replays the very same requests; a result is
cached under a key of everything that determines it (the scenario, the rate, the policy, its
``meridian`` config, a valve's cap and, for the policies that run the core, the core's build), so
a cached number is always the number a fresh run gives.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import multiprocessing
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from meridian._core import Config
from meridian.errors import TraceError
from meridian.offline.engine import offline_environment
from meridian.replay import reasoning, traces
from meridian.replay.arrivals import ServeGenArrivals, retime
from meridian.replay.noise import StepNoise
from meridian.replay.policies import (
    CACHE_AWARE,
    POLICIES,
    TUNED_VALVE,
    TUNED_VALVE_BASE,
    PolicySpec,
    WorkloadMeans,
    best_queue_cap,
    cache_aware_window_for,
    effective_seats,
    policy_spec,
    queue_cap_for,
    queue_cap_grid,
    refined_queue_caps,
    replay_policy,
    unvalved_policy,
    with_queue_cap,
)
from meridian.replay.profiles import Profile, StepBatch
from meridian.replay.report import policy_run
from meridian.replay.runner import default_meridian_config
from meridian.replay.workload import model_dir_for, offline_requests

__all__ = [
    "ATTAINMENT_TARGET",
    "FAMILIES",
    "LOAD_POINTS",
    "TARGET_SETS",
    "Corpus",
    "Job",
    "Scenario",
    "make_corpus",
    "scenario_config",
    "scenario_requests",
    "traces_dir",
]

#: The loads each scenario is replayed at: where stock vLLM FCFS meets this share of requests.
LOAD_POINTS = (0.9, 0.7, 0.5)
#: Capacity: the highest rate at which this share of requests meets every target (DistServe).
ATTAINMENT_TARGET = 0.8
#: A calibrated load is accepted when FCFS's attainment there is this close to its target.
LOAD_TOLERANCE = 0.03


def traces_dir() -> Path:
    """``$MERIDIAN_TRACES_DIR`` when set, else the shared traces folder beside the checkout."""
    override = os.environ.get("MERIDIAN_TRACES_DIR", "").strip()
    return Path(override) if override else reasoning.servegen_dir().parent


@dataclass(frozen=True)
class Family:
    """A trace family: the files its prompts (and own arrivals) come from, and the profiles it
    is replayed on with the number of requests a scenario takes on each."""

    files: tuple[str, ...]  # relative to ``traces_dir()``
    #: Profile → requests per scenario: enough that the backlog at the heaviest load outlasts
    #: what the engine holds at once (about 300 Azure requests fit the 8B profile's KV cache,
    #: 100 the 32B's, 60 Mooncake prompts the 8B's), so overload is sustained, not one burst.
    profiles: dict[str, int]
    #: The trace's reasoning split sources that make sense for it: "servegen-ratio" keeps the
    #: trace's own output lengths, which only conversation-like traces have.
    length_sources: tuple[str, ...]


FAMILIES: dict[str, Family] = {
    "azure-code": Family(
        ("azure_llm_2023/AzureLLMInferenceTrace_code.csv",),
        {"h200-qwen3-8b": 1500, "h200-qwen3-32b": 800},
        ("servegen",),
    ),
    "azure-conv": Family(
        ("azure_llm_2023/AzureLLMInferenceTrace_conv.csv",),
        {"h200-qwen3-8b": 1500, "h200-qwen3-32b": 800},
        ("servegen", "servegen-ratio"),
    ),
    # Its prompts average 15k tokens: only the 8B profile's KV holds a useful batch of them.
    "mooncake": Family(("mooncake/synthetic_trace.jsonl",), {"h200-qwen3-8b": 600}, ("servegen", "servegen-ratio")),
}

#: Class targets: the replay's defaults (``runner.DEFAULT_CLASSES_FILE``, read from that one file)
#: and two sets around them, so no default is tuned to one.
TARGET_SETS: dict[str, dict[str, dict[str, float]]] = {
    "default": default_meridian_config()["classes"],
    "tight": {
        "interactive": {"ttft_ms": 1000, "ttfat_ms": 30000, "answer_tpot_ms": 40, "rank": 0},
        "standard": {"ttft_ms": 3000, "ttfat_ms": 90000, "answer_tpot_ms": 80, "rank": 1},
        "batch": {"ttft_ms": 30000, "ttfat_ms": 900000, "answer_tpot_ms": 500, "rank": 2},
    },
    "relaxed": {
        "interactive": {"ttft_ms": 3000, "ttfat_ms": 60000, "answer_tpot_ms": 60, "rank": 0},
        "standard": {"ttft_ms": 10000, "ttfat_ms": 180000, "answer_tpot_ms": 120, "rank": 1},
        "batch": {"ttft_ms": 120000, "ttfat_ms": 3600000, "answer_tpot_ms": 1000, "rank": 2, "e2e_ms": 7200000},
    },
}

CLASS_MIXES = (
    "mix:interactive=0.3,standard=0.7",
    "mix:interactive=0.2,standard=0.5,batch=0.3",
    "mix:interactive=0.5,standard=0.3,batch=0.2",
    "mix:interactive=0.1,standard=0.3,batch=0.6",
)
ARRIVALS = ("trace", "bursty", "diurnal")
#: ServeGen spans: one 10-minute row (bursty), six hours (diurnal).
ARRIVAL_SPANS_S = {"bursty": 600.0, "diurnal": 6 * 3600.0}


@dataclass(frozen=True)
class Scenario:
    """One workload of the corpus; its requests are ``scenario_requests(self)``."""

    name: str
    family: str
    #: Where in the family's trace the requests start (s).
    trace_start_s: float
    #: ``trace`` (the trace's own arrivals), ``bursty`` or ``diurnal`` (ServeGen-shaped).
    arrivals: str
    #: Time of ServeGen's day the arrivals (bursty, diurnal) and the lengths are drawn from (s).
    day_start_s: float
    #: ``servegen`` (ServeGen output and ratio) or ``servegen-ratio`` (the trace's output, a
    #: ServeGen ratio).
    lengths: str
    class_mix: str
    targets: str
    profile: str
    num_requests: int
    seed: int

    def describe(self) -> str:
        hour = self.day_start_s / 3600.0
        return (
            f"{self.family} from {self.trace_start_s:.0f} s, {self.arrivals} arrivals, {self.lengths} lengths "
            f"at {hour:04.1f} h, {self.class_mix.removeprefix('mix:')}, {self.targets} targets, {self.profile}"
        )


def make_corpus(
    per_family: int = 6, *, seed: int = 0, request_scale: float = 1.0, families: Sequence[str] = tuple(FAMILIES)
) -> list[Scenario]:
    """``per_family`` scenarios per family, drawn with ``seed``: every arrival kind in turn, the
    other dimensions (trace window, hour of ServeGen's day, length source, class mix, target set,
    profile, sampling seed) drawn at random; ``request_scale`` scales the requests per scenario
    (tests use small corpora)."""
    if per_family < 1 or not request_scale > 0:
        raise TraceError(f"a corpus needs per_family >= 1 and request_scale > 0, got {per_family}, {request_scale}")
    scenarios = []
    for f_index, name in enumerate(families):
        family = FAMILIES[name]
        rng = np.random.default_rng([seed, f_index])
        span_s = _trace_span_s(name)
        for i in range(per_family):
            arrivals = ARRIVALS[i % len(ARRIVALS)]
            profile = str(rng.choice(sorted(family.profiles)))
            scenarios.append(
                Scenario(
                    name=f"{name}-{i:02d}",
                    family=name,
                    # Leave room for the requests after the start (the densest trace, conv, needs ~60 s).
                    trace_start_s=float(np.round(rng.uniform(0.0, max(span_s - 900.0, 1.0)), 1)),
                    arrivals=arrivals,
                    day_start_s=float(rng.integers(0, 144) * 600),
                    lengths=str(rng.choice(family.length_sources)),
                    class_mix=str(rng.choice(CLASS_MIXES)),
                    targets=str(rng.choice(list(TARGET_SETS))),
                    profile=profile,
                    num_requests=max(2, round(family.profiles[profile] * request_scale)),
                    seed=int(rng.integers(0, 2**31)),
                )
            )
    return scenarios


def _family_paths(family: str) -> list[Path]:
    try:
        files = FAMILIES[family].files
    except KeyError:
        raise TraceError(f"unknown trace family {family!r}; known: {', '.join(FAMILIES)}") from None
    paths = [traces_dir() / f for f in files]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise TraceError(
            f"trace family {family!r} needs {', '.join(missing)} (the shared traces folder; set "
            "MERIDIAN_TRACES_DIR to where it is)"
        )
    return paths


@functools.cache
def _family_requests(family: str) -> tuple[traces.TraceRequest, ...]:
    return tuple(traces.load_traces(_family_paths(family)))


def _trace_span_s(family: str) -> float:
    return _family_requests(family)[-1].arrival_ms / 1000.0


@functools.cache
def _servegen_lengths() -> reasoning.ServeGenLengths:
    folder = reasoning.servegen_dir()
    if any(folder.glob("chunk-*-dataset.json")):
        return reasoning.ServeGenLengths.load(folder)
    return reasoning.ServeGenLengths.default()


def scenario_requests(s: Scenario) -> list[traces.TraceRequest]:
    """The scenario's requests, arrivals normalised to one request per second on average."""
    window = traces.limit(traces.window(list(_family_requests(s.family)), s.trace_start_s, None), s.num_requests)
    if len(window) < s.num_requests:
        raise TraceError(
            f"scenario {s.name}: the trace holds {len(window)} requests after {s.trace_start_s:g} s, "
            f"{s.num_requests} asked for"
        )
    if s.arrivals == "trace":
        arrivals_ms = np.asarray([r.arrival_ms for r in window], dtype=np.float64)
    elif s.arrivals in ARRIVAL_SPANS_S:
        arrivals_ms = ServeGenArrivals.default().sample(
            s.day_start_s, ARRIVAL_SPANS_S[s.arrivals], s.num_requests, s.seed
        )
    else:
        raise TraceError(f"scenario {s.name}: unknown arrivals {s.arrivals!r}; expected one of {', '.join(ARRIVALS)}")
    # One request per second on average: the last arrival at num_requests - 1 seconds.
    span_ms = float(arrivals_ms[-1] - arrivals_ms[0]) or 1.0
    arrivals_ms = (arrivals_ms - arrivals_ms[0]) * ((s.num_requests - 1) * 1000.0 / span_ms)
    requests = retime(window, arrivals_ms)
    requests = reasoning.apply_reasoning_lengths(
        requests, s.lengths, seed=s.seed, servegen=_servegen_lengths(), hour_of_day=s.day_start_s / 3600.0
    )
    return traces.assign_classes(requests, s.class_mix, s.seed)


#: A variant key that is not a config key: every class's ``on_overload`` (a mode name, or a
#: ``{class: mode}`` object), since the classes themselves come from the scenario's target set.
ON_OVERLOAD = "on_overload"


def scenario_config(s: Scenario, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``meridian`` block a scenario runs with: its target set's classes, then ``overrides``
    (a policy variant's knobs; ``on_overload`` sets the classes' triage)."""
    try:
        classes = TARGET_SETS[s.targets]
    except KeyError:
        raise TraceError(
            f"scenario {s.name}: unknown target set {s.targets!r}; known: {', '.join(TARGET_SETS)}"
        ) from None
    config: dict[str, Any] = {"classes": {k: dict(v) for k, v in classes.items()}, "default_class": "standard"}
    overrides = dict(overrides or {})
    triage = overrides.pop(ON_OVERLOAD, None)
    if triage is not None:
        for name, targets in config["classes"].items():
            mode = triage.get(name) if isinstance(triage, Mapping) else triage
            if mode is not None:
                targets["on_overload"] = mode
    config.update(overrides)
    return config


# ---- jobs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One replay: a scenario at a rate (requests per second) under a policy, with a variant of
    Meridian's knobs (``overrides``) for the policies that run the core, and for a policy behind
    vLLM's load valve the cap it runs with (resolved when the job is made: the docs-sized cap of
    the scenario unless one is given)."""

    scenario: Scenario
    rate: float
    policy: str
    variant: str = "default"
    overrides: tuple[tuple[str, str], ...] = ()  # (key, JSON value), sorted
    queue_cap: int | None = None
    step_noise: StepNoise | None = None  # the noise its engine's steps meet (``Corpus.step_noise``)

    @staticmethod
    def of(
        scenario: Scenario,
        rate: float,
        policy: str,
        variant: str = "default",
        overrides: Mapping[str, Any] | None = None,
        queue_cap: int | None = None,
    ) -> Job:
        spec = policy_spec(policy)
        encoded = tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in (overrides or {}).items()))
        if queue_cap is not None:
            spec = with_queue_cap(spec, queue_cap)  # checks the cap and that the policy has a valve
        if spec.valve:
            config_json = json.dumps(scenario_config(scenario, {k: json.loads(v) for k, v in encoded}), sort_keys=True)
            queue_cap = spec.queue_cap if spec.queue_cap is not None else docs_queue_cap(scenario, config_json)
            policy = policy.partition("=")[0]
        return Job(scenario, float(rate), policy, variant, encoded, queue_cap)

    def config(self) -> dict[str, Any]:
        return scenario_config(self.scenario, {k: json.loads(v) for k, v in self.overrides})

    def spec(self) -> Any:
        """The policy this job replays, at its cap for a valve policy."""
        spec = policy_spec(self.policy)
        return with_queue_cap(spec, self.queue_cap) if self.queue_cap is not None else spec

    def key(self, core_build: str) -> str:
        spec = policy_spec(self.policy)
        runs_core = spec.meridian_policy is not None
        payload = {
            "scenario": asdict(self.scenario),
            "rate": round(self.rate, 9),
            "policy": self.policy,
            "config": self.config(),
            "core": core_build if runs_core else None,
            "v": RESULT_VERSION if runs_core else STOCK_RESULT_VERSION,
        }
        if self.queue_cap is not None:
            payload["queue_cap"] = self.queue_cap
        if self.step_noise is not None:
            payload["step_noise"] = {**self.step_noise.to_json(), "seed": self.step_noise.seed}
        if spec.cache_aware:
            # The window it runs with (docs-sized on the scenario unless the name gives it).
            payload["cache_aware_window"] = scenario_cache_aware_window(
                self.scenario, spec, json.dumps(self.config(), sort_keys=True)
            )
        if spec.vllm_policy != "fcfs":
            # vLLM's priority queue orders by arrival stamp, which now comes from the trace
            # (it was the step the engine added the request at); its FCFS queue never reads it.
            payload["arrival_stamp"] = "trace"
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


#: Bump when what a result holds (``_result``) or how a scenario is built changes: the second for
#: results of stock vLLM (which never shed: a change to the shed fields leaves them as they were).
#: 4 / 2: results hold ``peak_in_flight``, ``refused``, ``shed_by`` and ``queue_cap``. 5 / 3: every
#: request's ``max_tokens`` is the context after its prompt (``offline_requests``), not its length.
RESULT_VERSION = 5
STOCK_RESULT_VERSION = 3


@functools.lru_cache(maxsize=64)
def _scenario_valve(s: Scenario, config_json: str) -> tuple[WorkloadMeans, int]:
    """The scenario's workload means and docs-sized valve cap under ``config_json`` (the
    offline requests they are read from are dropped: Mooncake's prompts are large)."""
    profile = Profile.load(s.profile)
    config = json.loads(config_json)
    offline = offline_requests(_scenario_requests_cached(s), profile, Config.from_json(config_json))
    cap = queue_cap_for(policy_spec(TUNED_VALVE_BASE), offline, profile, config)
    assert cap is not None  # a valve policy always has a cap
    return WorkloadMeans.of(offline, config), cap


def docs_queue_cap(s: Scenario, config_json: str) -> int:
    """The docs-sized valve cap of a scenario run with ``config_json`` (``queue_cap_for``: it
    depends on the profile, the requests' lengths and the tightest TTFT target, not the rate)."""
    return _scenario_valve(s, config_json)[1]


def scenario_cache_aware_window(s: Scenario, spec: PolicySpec, config_json: str) -> int | None:
    """The cache-aware window ``spec`` runs with on a scenario (``cache_aware_window_for``: its
    own, else docs-sized from the profile, the requests' lengths and the tightest TTFT target,
    not the rate)."""
    if spec.cache_aware_window is not None or not spec.cache_aware:
        return spec.cache_aware_window
    return _scenario_docs_window(s, config_json)


@functools.lru_cache(maxsize=64)
def _scenario_docs_window(s: Scenario, config_json: str) -> int | None:
    profile = Profile.load(s.profile)
    offline = offline_requests(_scenario_requests_cached(s), profile, Config.from_json(config_json))
    return cache_aware_window_for(POLICIES[CACHE_AWARE], offline, profile, json.loads(config_json))


def scenario_cap_grid(s: Scenario, never_binds_at: int | None = None) -> list[int]:
    """The caps the tuned valve tries on a scenario (``queue_cap_grid`` around the seats its KV
    cache holds); caps at or above ``never_binds_at`` (default: the number of requests) refuse
    nothing, and only the smallest of them is kept."""
    means, _cap = _scenario_valve(s, json.dumps(scenario_config(s), sort_keys=True))
    bound = s.num_requests if never_binds_at is None else min(never_binds_at, s.num_requests)
    return queue_cap_grid(effective_seats(Profile.load(s.profile), means), never_binds_at=max(bound, 1))


def _core_build() -> str:
    """A fingerprint of the core extension: results of policies that run it are only reused by
    the very same build."""
    import meridian._core as core

    path = Path(core.__file__ or "")
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else "unknown"


def _result(summary: dict[str, Any]) -> dict[str, Any]:
    """What the corpus keeps of a replay summary."""

    def tails(s: dict[str, Any]) -> dict[str, Any]:
        return {
            "submitted": s["submitted"],
            "good": s["good"],
            "completed": s["completed"],
            "attainment": s["attainment"],
            "shed": s.get("shed", 0),
            "refused": s.get("refused", 0),
            "shed_by": s.get("shed_by", {}),
            "shed_notice_ms": s.get("shed_notice_ms"),
            "shed_notice_ms_by_reason": s.get("shed_notice_ms_by_reason"),
            "ttft_ms": {k: s["ttft_ms"][k] for k in ("p50", "p99")},
            "ttfat_ms": {k: s["ttfat_ms"][k] for k in ("p50", "p99")},
        }

    out = tails(summary)
    out.update(
        throughput_tok_s=summary["throughput_tok_s"],
        duration_s=summary["duration_s"],
        stalls=summary["stalls"],
        answer_preemptions=summary["preemptions"]["answer"],
        num_steps=summary["num_steps"],
        peak_in_flight=summary.get("peak_in_flight"),
        queue_cap=summary.get("queue_cap"),
        **({"cache_aware_window": summary["cache_aware_window"]} if "cache_aware_window" in summary else {}),
        per_class={name: tails(c) for name, c in summary["per_class"].items()},
    )
    return out


def run_job(job: Job, cache_dir: Path) -> dict[str, Any]:
    """Replays one job (no cache)."""
    offline_environment(cache_dir)
    profile = Profile.load(job.scenario.profile).with_noise(job.step_noise)
    config = job.config()
    requests = traces.scale_rate(_scenario_requests_cached(job.scenario), job.rate)
    result = replay_policy(
        job.spec(),
        offline_requests(requests, profile, Config.from_json(json.dumps(config))),
        profile,
        meridian_config=config,
        model_dir=model_dir_for(profile, cache_dir),
    )
    return _result(policy_run(result, job.rate).summary)


@functools.lru_cache(maxsize=8)
def _scenario_requests_cached(s: Scenario) -> list[traces.TraceRequest]:
    return scenario_requests(s)


class ResultCache:
    """Finished jobs, one JSON line each, keyed by ``Job.key``."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}
        if path is not None and path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    entry = json.loads(line)
                    self.entries[entry["key"]] = entry["result"]

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def put(self, key: str, result: dict[str, Any]) -> None:
        self.entries[key] = result
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as out:
                out.write(json.dumps({"key": key, "result": result}) + "\n")


_POOL_CACHE_DIR: list[Path] = []


def _pool_job(job: Job) -> dict[str, Any]:
    return run_job(job, _POOL_CACHE_DIR[0])


@dataclass
class Corpus:
    """Runs jobs over worker processes, reusing cached results."""

    cache_dir: Path = Path(".cache")
    jobs: int = 0  # worker processes; 0: one per core
    use_cache: bool = True
    progress: Callable[[str], None] = lambda _line: None
    #: Step-time noise every job's engine meets (``meridian.replay.noise``); ``None``: none.
    step_noise: StepNoise | None = None
    cache: ResultCache = field(init=False)
    core_build: str = field(init=False)

    def __post_init__(self) -> None:
        self.cache = ResultCache(self.cache_dir / "corpus" / "results.jsonl" if self.use_cache else None)
        self.core_build = _core_build()

    def run(self, jobs: Iterable[Job]) -> list[dict[str, Any]]:
        """Each job's result, in order; the ones not cached run in parallel."""
        jobs = [dataclasses.replace(j, step_noise=self.step_noise) for j in jobs]
        keys = [j.key(self.core_build) for j in jobs]
        todo: dict[str, Job] = {}
        for job, key in zip(jobs, keys):
            if self.cache.get(key) is None and key not in todo:
                todo[key] = job
        if todo:
            self.progress(f"running {len(todo)} replays ({len(jobs) - len(todo)} cached)")
            for key, result in zip(todo, self._map(list(todo.values()))):
                self.cache.put(key, result)
        return [dict(self.cache.get(k) or {}) for k in keys]

    def _map(self, jobs: list[Job]) -> Iterable[dict[str, Any]]:
        workers = min(len(jobs), self.jobs or (os.cpu_count() or 1))
        if workers <= 1:
            # Lazily, so that ``run`` caches each result as it comes: an interrupted run keeps them.
            return (run_job(j, self.cache_dir) for j in jobs)
        import vllm  # noqa: F401 - imported once before forking (~20 s), inherited by the workers

        _POOL_CACHE_DIR[:] = [self.cache_dir]
        context = multiprocessing.get_context("fork")
        # Longest first: the expensive jobs (light loads, long runs) should not be left for last.
        order = sorted(range(len(jobs)), key=lambda i: jobs[i].rate)
        results: list[dict[str, Any] | None] = [None] * len(jobs)
        with context.Pool(workers, maxtasksperchild=20) as pool:
            for i, result in zip(order, pool.imap(_pool_job, [jobs[i] for i in order], chunksize=1)):
                results[i] = result
                cap = f"={jobs[i].queue_cap}" if jobs[i].queue_cap is not None else ""
                self.progress(
                    f"  {jobs[i].scenario.name} @ {jobs[i].rate:.3g}/s {jobs[i].policy}{cap}"
                    f"[{jobs[i].variant}]: {result['attainment']:.0%}"
                )
        return [r for r in results if r is not None]


# ---- calibration: the loads -------------------------------------------------------------------


@dataclass
class Calibration:
    """Where FCFS meets each load point's share of requests, for one scenario. Loads below
    ``floor_rate`` are not searched: a scenario whose requests miss their targets even nearly
    alone on the engine (tight targets, long thinking) has no 90 % point, and replaying it at a
    trickle would take a million steps to say so."""

    scenario: Scenario
    probes: list[tuple[float, float]] = field(default_factory=list)  # (rate, FCFS attainment)
    floor_rate: float = 0.0

    def add(self, rate: float, attainment: float) -> None:
        self.probes.append((rate, attainment))
        self.probes.sort()

    def closest(self, target: float) -> tuple[float, float]:
        """The probe (at or above the floor) whose attainment is closest to ``target``."""
        above_floor = [p for p in self.probes if p[0] >= self.floor_rate] or self.probes
        return min(above_floor, key=lambda p: (abs(p[1] - target), p[0]))

    def settled(self, target: float) -> bool:
        return bool(self.probes) and abs(self.closest(target)[1] - target) <= LOAD_TOLERANCE

    def next_probe(self, target: float) -> float | None:
        """The next rate to try for ``target`` (None when settled or when probing cannot help)."""
        if self.settled(target):
            return None
        above = [p for p in self.probes if p[1] >= target]  # low rates
        below = [p for p in self.probes if p[1] < target]  # high rates
        if not above:
            lowest = min(p[0] for p in self.probes)
            return lowest / 2.0 if lowest / 2.0 >= self.floor_rate else None
        if not below:
            return max(p[0] for p in self.probes) * 2.0
        lo, hi = max(above), min(below)
        if hi[0] / lo[0] < 1.02:
            return None  # bracketed as tightly as rates go: attainment jumps here
        # Interpolate attainment linearly in log rate, kept away from the bracket's ends.
        f = (lo[1] - target) / max(lo[1] - hi[1], 1e-9)
        f = min(max(f, 0.2), 0.8)
        return math.exp(math.log(lo[0]) + f * (math.log(hi[0]) - math.log(lo[0])))

    def rate_at(self, target: float) -> float:
        return self.closest(target)[0]

    def point(self, target: float) -> tuple[float, float] | None:
        """The probe standing for the load point ``target``: the closest, when it is within twice
        the search's tolerance (``None``: the scenario has no such load, e.g. FCFS never meets 90 %
        of it above the floor)."""
        if not self.probes:
            return None
        rate, attainment = self.closest(target)
        return (rate, attainment) if abs(attainment - target) <= 2 * LOAD_TOLERANCE else None


def estimated_capacity_rps(s: Scenario) -> float:
    """A rough saturated rate of the scenario's engine (requests per second), where the load
    search starts: as many requests as the KV cache holds at their mean mid-life size (at most
    ``max_num_seqs``) decoding together, each needing its mean output in steps, plus its prompt's
    share of prefill."""
    requests = _scenario_requests_cached(s)
    profile = Profile.load(s.profile)
    prompt = float(np.mean([r.num_prompt_tokens for r in requests]))
    output = float(np.mean([r.num_output_tokens for r in requests]))
    batch = max(1, min(profile.max_num_seqs, int(profile.kv_capacity_tokens / (prompt + output / 2))))
    prefill_per_step = round(batch * prompt / output)
    step_ms = profile.step_time_ms(StepBatch(prefill_per_step, batch, round(batch * (prompt + output / 2))))
    return batch / output / (step_ms / 1000.0)


#: The lowest load searched, as a share of ``estimated_capacity_rps``.
FLOOR_CAPACITY_SHARE = 0.25


def calibrate(
    corpus: Corpus, scenarios: Sequence[Scenario], *, start: Sequence[float] = (1.0, 2.5), max_rounds: int = 8
) -> dict[str, Calibration]:
    """FCFS's load points for every scenario, searched in lockstep (one batch of probes per
    round, every scenario's at once), starting at ``start`` × ``estimated_capacity_rps``."""
    calibrations = {
        s.name: Calibration(s, floor_rate=FLOOR_CAPACITY_SHARE * estimated_capacity_rps(s)) for s in scenarios
    }
    pending = [Job.of(s, f * estimated_capacity_rps(s), "vllm-fcfs") for s in scenarios for f in start]
    for _round in range(max_rounds):
        if not pending:
            break
        for job, result in zip(pending, corpus.run(pending)):
            calibrations[job.scenario.name].add(job.rate, float(result["attainment"]))
        pending = []
        for c in calibrations.values():
            rates = {round(r, 6) for r in (c.next_probe(t) for t in LOAD_POINTS) if r is not None}
            pending += [Job.of(c.scenario, r, "vllm-fcfs") for r in sorted(rates)]
    return calibrations


def geometric_mean(values: Iterable[float]) -> float:
    logs = [math.log(v) for v in values if v > 0]
    return math.exp(sum(logs) / len(logs)) if logs else float("nan")


# ---- the whole corpus -------------------------------------------------------------------------

#: The baseline every ratio divides by.
BASELINE = "vllm-fcfs"


@dataclass(frozen=True)
class Column:
    """A column of the report: a policy, for Meridian a named variant of its knobs; ``tuned``:
    the valve policy at the best cap of its grid, searched at every scenario and rate."""

    label: str
    policy: str
    variant: str = "default"
    overrides: Mapping[str, Any] = field(default_factory=dict)
    tuned: bool = False

    def job(self, scenario: Scenario, rate: float, queue_cap: int | None = None) -> Job:
        return Job.of(scenario, rate, self.policy, self.variant, self.overrides, queue_cap)


def columns(policies: Sequence[str], variants: Mapping[str, Mapping[str, Any]] | None = None) -> list[Column]:
    """The stock baseline first, then ``policies`` (``TUNED_VALVE`` as a tuned column), then
    Meridian's ``variants`` (label → overrides, shown as ``meridian[label]``)."""
    out = [Column(BASELINE, BASELINE)]
    out += [
        Column(TUNED_VALVE, TUNED_VALVE_BASE, tuned=True) if p == TUNED_VALVE else Column(p, p)
        for p in policies
        if p != BASELINE
    ]
    out += [Column(f"meridian[{label}]", "meridian", label, dict(ov)) for label, ov in (variants or {}).items()]
    for c in out:
        policy_spec(c.policy)
    return out


def evaluate(
    corpus: Corpus,
    items: Sequence[tuple[Column, Scenario, float]],
    unvalved: Mapping[tuple[str, float, str], Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Each (column, scenario, rate)'s result, the jobs run in batches. A tuned column runs its
    scenario's cap grid, then one round of refinement around the best cap
    (``refined_queue_caps``), and keeps the cap that met every target for the most requests
    (``best_queue_cap``; the result gains ``queue_cap`` and ``tuned_queue_caps``, cap → good).
    ``unvalved`` (scenario name, rate, stock policy) → that policy's result there without a
    valve: a valve whose cap is at or above its ``peak_in_flight`` refuses nothing and gives
    exactly that run, so it takes that result without a replay."""
    contexts = []
    for column, scenario, rate in items:
        spec = policy_spec(column.policy)
        base = (unvalved or {}).get((scenario.name, rate, unvalved_policy(spec))) if spec.valve else None
        peak = base.get("peak_in_flight") if base is not None else None
        contexts.append((column, scenario, rate, base, peak))

    def run_caps(wanted: Sequence[Sequence[int | None]]) -> list[dict[int | None, dict[str, Any]]]:
        """Per item, the results at the caps asked for (``None``: the column's own cap)."""
        jobs: list[Job] = []
        plans = []
        for (column, scenario, rate, base, peak), caps in zip(contexts, wanted):
            plan: list[tuple[int | None, int | None, Job | dict[str, Any]]] = []
            for cap in caps:
                job = column.job(scenario, rate, cap)
                if base is not None and peak is not None and job.queue_cap is not None and job.queue_cap >= peak:
                    plan.append((cap, job.queue_cap, {**base, "queue_cap": job.queue_cap}))
                else:
                    plan.append((cap, job.queue_cap, job))
                    jobs.append(job)
            plans.append(plan)
        ran = iter(corpus.run(jobs))
        return [{cap: dict(next(ran)) if isinstance(e, Job) else dict(e) for cap, _q, e in plan} for plan in plans]

    first = run_caps(
        [
            scenario_cap_grid(scenario, peak) if column.tuned else [None]
            for column, scenario, _rate, _base, peak in contexts
        ]
    )
    second = run_caps(
        [
            refined_queue_caps({c: int(r["good"]) for c, r in got.items() if c is not None}) if column.tuned else []
            for (column, *_rest), got in zip(contexts, first)
        ]
    )
    out = []
    for (column, *_rest), got, more in zip(contexts, first, second):
        if not column.tuned:
            out.append(got[None])
            continue
        caps = {c: r for c, r in {**got, **more}.items() if c is not None}
        cap = best_queue_cap({c: int(r["good"]) for c, r in caps.items()})
        out.append(
            {
                **caps[cap],
                "queue_cap": cap,
                "tuned_queue_caps": {str(c): int(r["good"]) for c, r in sorted(caps.items())},
            }
        )
    return out


@dataclass
class CorpusReport:
    """Every column's results on every scenario at every load point."""

    scenarios: list[Scenario]
    columns: list[Column]
    #: Scenario → load point → rate (requests/s) and FCFS's measured attainment there (absent
    #: where the scenario has no such load: FCFS never meets 90 % of it above the search floor).
    loads: dict[str, dict[float, tuple[float, float]]]
    #: (scenario, load point, column label) → ``_result``.
    results: dict[tuple[str, float, str], dict[str, Any]]
    #: Scenario → column label → capacity (requests/s), when measured.
    capacity: dict[str, dict[str, float]] | None = None
    #: The load points replayed (a subset of ``LOAD_POINTS``), lightest first.
    points: tuple[float, ...] = LOAD_POINTS

    def ratio(self, scenario: str, point: float, label: str) -> float:
        """The column's requests meeting every target over FCFS's, same requests."""
        base = self.results[(scenario, point, BASELINE)]["good"]
        mine = self.results[(scenario, point, label)]["good"]
        return mine / base if base else (math.inf if mine else 1.0)

    def at(self, point: float, scenarios: Sequence[Scenario] | None = None) -> list[Scenario]:
        """The scenarios (of ``scenarios``, default all) that have the load point."""
        return [s for s in (scenarios or self.scenarios) if point in self.loads[s.name]]

    def summary(self, point: float, label: str, scenarios: Sequence[Scenario] | None = None) -> dict[str, Any]:
        """Geometric mean and worst of the column's ratios at a load point (over ``scenarios``,
        default all, that have it)."""
        ratios = {s.name: self.ratio(s.name, point, label) for s in self.at(point, scenarios)}
        if not ratios:
            return {"geomean": math.nan, "worst": math.nan, "worst_scenario": None, "scenarios": 0}
        worst = min(ratios, key=lambda n: ratios[n])
        return {
            "geomean": geometric_mean(ratios.values()),
            "worst": ratios[worst],
            "worst_scenario": worst,
            "scenarios": len(ratios),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "scenarios": [asdict(s) for s in self.scenarios],
            "columns": [
                {"label": c.label, "policy": c.policy, "overrides": dict(c.overrides), "tuned": c.tuned}
                for c in self.columns
            ],
            "loads": {
                n: {str(p): {"rate": r, "fcfs_attainment": a} for p, (r, a) in pts.items()}
                for n, pts in self.loads.items()
            },
            "results": [{"scenario": n, "load_point": p, "column": c, **r} for (n, p, c), r in self.results.items()],
            "summary": {str(p): {c.label: self.summary(p, c.label) for c in self.columns} for p in self.points},
            "capacity": self.capacity,
            **(
                {
                    "meridian_vs_best_of_scorpio_tuned_valve": {
                        str(p): against_best(self, p, "meridian", ("scorpio", TUNED_VALVE)) for p in self.points
                    }
                }
                if {"meridian", "scorpio", TUNED_VALVE} <= {c.label for c in self.columns}
                else {}
            ),
        }


def run_corpus(
    corpus: Corpus,
    scenarios: Sequence[Scenario],
    cols: Sequence[Column],
    *,
    capacity: bool = False,
    points: Sequence[float] = LOAD_POINTS,
    known_loads: Mapping[str, Mapping[float, tuple[float, float]]] | None = None,
) -> CorpusReport:
    """Calibrates the loads (or takes ``known_loads``, an earlier report's, see ``loads_of``),
    replays every column at each of ``points`` (of ``LOAD_POINTS``), and (``capacity``, which
    needs the calibration's probes) searches each column's capacity."""
    unknown = [p for p in points if p not in LOAD_POINTS]
    if unknown or not points:
        raise TraceError(f"load points {list(points)!r}: each must be one of {list(LOAD_POINTS)}")
    points = tuple(p for p in LOAD_POINTS if p in points)
    if known_loads is not None:
        if capacity:
            raise TraceError("the capacity search needs the load calibration's probes: drop the known loads")
        missing = [s.name for s in scenarios if s.name not in known_loads]
        if missing:
            raise TraceError(f"the known loads have no scenario {', '.join(missing)} (another corpus size or seed?)")
        loads = {s.name: {p: known_loads[s.name][p] for p in points if p in known_loads[s.name]} for s in scenarios}
        calibrations: dict[str, Calibration] = {}
    else:
        calibrations = calibrate(corpus, scenarios)
        loads = {
            s.name: {p: found for p in points if (found := calibrations[s.name].point(p)) is not None}
            for s in scenarios
        }
    # The valve columns after every other: the stock policy's peak of unfinished requests at each
    # load tells which caps refuse nothing there.
    results: dict[tuple[str, float, str], dict[str, Any]] = {}
    for valve in (False, True):
        items = [
            (c, s, p) for s in scenarios for p in loads[s.name] for c in cols if policy_spec(c.policy).valve is valve
        ]
        unvalved = (
            {
                (s.name, loads[s.name][p][0], c.policy): results[(s.name, p, c.label)]
                for s in scenarios
                for p in loads[s.name]
                for c in cols
                if c.label == c.policy and not policy_spec(c.policy).valve
            }
            if valve
            else None
        )
        done = evaluate(corpus, [(c, s, loads[s.name][p][0]) for c, s, p in items], unvalved)
        results.update({(s.name, p, c.label): r for (c, s, p), r in zip(items, done)})
    report = CorpusReport(list(scenarios), list(cols), loads, results, points=points)
    if capacity:
        report.capacity = capacity_of(corpus, calibrations, cols)
    return report


def loads_of(path: Path) -> dict[str, dict[float, tuple[float, float]]]:
    """The calibrated loads of an earlier report (``corpus.json``'s ``loads``: scenario → load
    point → rate and FCFS's attainment there), so a rerun on the same scenarios skips the search
    (replays are deterministic: the same scenario, rate and policy give the same result). Raises
    ``TraceError`` naming the file and what is wrong with it."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))["loads"]
        loads = {
            str(name): {float(p): (float(v["rate"]), float(v["fcfs_attainment"])) for p, v in points.items()}
            for name, points in raw.items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TraceError(f"{path}: not a corpus report with calibrated loads ({type(exc).__name__}: {exc})") from None
    for name, points in loads.items():
        for point, (rate, attainment) in points.items():
            if point not in LOAD_POINTS or not (math.isfinite(rate) and rate > 0) or not 0 <= attainment <= 1:
                raise TraceError(
                    f"{path}: scenario {name!r}: load point {point} at rate {rate} "
                    f"(FCFS attainment {attainment}) is not a calibrated load"
                )
    return loads


def capacity_of(
    corpus: Corpus, calibrations: Mapping[str, Calibration], cols: Sequence[Column], max_rounds: int = 5
) -> dict[str, dict[str, float]]:
    """Per scenario and column, the highest rate at which ``ATTAINMENT_TARGET`` of the requests
    meet every target: FCFS's from the load search, every other column's searched from FCFS's
    (the probed rate that met it; the bracket is narrowed ``max_rounds`` times)."""
    searches = {
        (name, c.label): Calibration(cal.scenario, list(cal.probes) if c.label == BASELINE else [])
        for name, cal in calibrations.items()
        for c in cols
    }
    by_label = {c.label: c for c in cols}
    pending: list[tuple[tuple[str, str], float]] = []
    for name, label in searches:
        if label != BASELINE:
            start = calibrations[name].rate_at(ATTAINMENT_TARGET)
            pending += [((name, label), r) for r in (start, start * 1.25)]
    for round_ in range(max_rounds + 1):
        # A tuned column searches its cap at every probed rate (FCFS is not replayed there: its
        # grid keeps every cap below the number of requests).
        done = evaluate(corpus, [(by_label[key[1]], searches[key].scenario, rate) for key, rate in pending])
        for (key, rate), result in zip(pending, done):
            searches[key].add(rate, float(result["attainment"]))
        if round_ == max_rounds:
            break
        pending = []
        for key, search in searches.items():
            next_rate = search.next_probe(ATTAINMENT_TARGET)
            if next_rate is not None and key[1] != BASELINE:
                pending.append((key, next_rate))
    out: dict[str, dict[str, float]] = {}
    for (name, label), search in searches.items():
        met = [r for r, a in search.probes if a >= ATTAINMENT_TARGET]
        out.setdefault(name, {})[label] = max(met) if met else 0.0
    return out


def leave_one_family_out(
    report: CorpusReport, candidates: Sequence[str], default: str, point: float = 0.5
) -> list[dict[str, Any]]:
    """For each family: the candidate column with the best geometric mean on the other families,
    and how it and ``default`` do on the held-out one. A candidate is adopted as a default only
    if it beats the default on every held-out family it was picked on."""
    rows = []
    families = sorted({s.family for s in report.scenarios})
    for held_out in families:
        tuned = [s for s in report.scenarios if s.family != held_out]
        test = [s for s in report.scenarios if s.family == held_out]
        best = max(candidates, key=lambda c: report.summary(point, c, tuned)["geomean"])
        rows.append(
            {
                "held_out": held_out,
                "picked": best,
                "picked_on_tuned": report.summary(point, best, tuned)["geomean"],
                "picked_on_held_out": report.summary(point, best, test)["geomean"],
                "default_on_held_out": report.summary(point, default, test)["geomean"],
            }
        )
    return rows


def tails_worse(report: CorpusReport, point: float, label: str, stats: Sequence[str] = ("p99",)) -> list[str]:
    """``scenario/class/metric/stat`` where the column's served requests' latency is above FCFS's
    (TTFT and TTFAT; a class FCFS served none of is skipped)."""
    out = []
    for s in report.at(point):
        base = report.results[(s.name, point, BASELINE)]["per_class"]
        mine = report.results[(s.name, point, label)]["per_class"]
        for cls, theirs in base.items():
            for metric in ("ttft_ms", "ttfat_ms"):
                for stat in stats:
                    b, m = theirs[metric][stat], mine.get(cls, {}).get(metric, {}).get(stat)
                    if b is not None and m is not None and m > b:
                        out.append(f"{s.name}/{cls}/{metric.removesuffix('_ms')}/{stat}")
    return out


def late_notices(result: Mapping[str, Any], targets: Mapping[str, float]) -> list[str]:
    """The shed reasons whose clients heard past the deadline they were shed for (notice p99
    after the class's TTFT target for a TTFT shed, after its TTFAT target for a TTFAT shed)."""
    by_reason = result.get("shed_notice_ms_by_reason") or {}
    return [
        reason
        for reason, notice in by_reason.items()
        if (notice or {}).get("p99") is not None and notice["p99"] > targets[f"{reason}_ms"]
    ]


def tail_lines(report: CorpusReport) -> list[str]:
    """Per load point and column: the served requests' per-class TTFT and TTFAT p99 against FCFS's
    (and p50 at the lightest load, where no class's slack should be spent for another's), and the
    throughput and the time a shed request's client waited for its notice."""
    labels = [c.label for c in report.columns if c.label != BASELINE]
    lines = [
        "### Tails, throughput and shed notices",
        "",
        "| load | column | class tails above FCFS's (scenario/class/metric) | throughput × FCFS, geo. mean (min) "
        "| shed | notice p99 ≤ the deadline shed for |",
        "|---|---|---|---|---|---|",
    ]
    for point in report.points:
        stats = ("p50", "p99") if point == max(LOAD_POINTS) else ("p99",)
        for label in labels:
            worse = tails_worse(report, point, label, stats)
            tput = [
                report.results[(s.name, point, label)]["throughput_tok_s"]
                / report.results[(s.name, point, BASELINE)]["throughput_tok_s"]
                for s in report.at(point)
            ]
            shed = sum(report.results[(s.name, point, label)]["shed"] for s in report.at(point))
            late = [
                f"{s.name}/{cls}/{reason}"
                for s in report.at(point)
                for cls, c in report.results[(s.name, point, label)]["per_class"].items()
                for reason in late_notices(c, TARGET_SETS[s.targets][cls])
            ]
            shown = ", ".join(worse[:4]) + (f" … ({len(worse)} in all)" if len(worse) > 4 else "")
            lines.append(
                f"| {point:.0%} | {label} | {len(worse)} ({' and '.join(stats)}){': ' + shown if worse else ''} "
                f"| {geometric_mean(tput):.3f} ({min(tput, default=math.nan):.3f}) | {shed} | "
                f"{'yes' if not late else 'no: ' + ', '.join(sorted(set(late)))} |"
            )
    lines.append("")
    return lines


def against_best(report: CorpusReport, point: float, label: str, others: Sequence[str]) -> dict[str, Any]:
    """The column's requests meeting every target over the best of ``others`` per scenario (the
    best baseline there, which may differ from scenario to scenario): geometric mean and worst."""
    ratios = {}
    for s in report.at(point):
        best = max(report.results[(s.name, point, o)]["good"] for o in others)
        mine = report.results[(s.name, point, label)]["good"]
        ratios[s.name] = mine / best if best else (math.inf if mine else 1.0)
    if not ratios:
        return {"geomean": math.nan, "worst": math.nan, "worst_scenario": None, "scenarios": 0}
    worst = min(ratios, key=lambda n: ratios[n])
    return {
        "geomean": geometric_mean(ratios.values()),
        "worst": ratios[worst],
        "worst_scenario": worst,
        "scenarios": len(ratios),
    }


def against_best_lines(
    report: CorpusReport, label: str = "meridian", others: Sequence[str] = ("scorpio", TUNED_VALVE)
) -> list[str]:
    """``label`` against the best of ``others`` per scenario, at every load point (nothing when a
    column is missing)."""
    labels = {c.label for c in report.columns}
    if label not in labels or not all(o in labels for o in others):
        return []
    lines = [
        f"### {label} against the best of {', '.join(others)} per scenario",
        "",
        "| load | geo. mean | worst scenario |",
        "|---|---|---|",
    ]
    for point in report.points:
        b = against_best(report, point, label, others)
        lines.append(f"| {point:.0%} | {b['geomean']:.2f} | {b['worst']:.2f} ({b['worst_scenario']}) |")
    lines.append("")
    return lines


def valve_lines(report: CorpusReport) -> list[str]:
    """Per scenario and load point, the caps vLLM's load valve ran with (docs-sized; tuned), how
    many requests each refused, and FCFS's peak of unfinished requests there (a cap at or above
    it refuses nothing)."""
    valves = [c for c in report.columns if policy_spec(c.policy).valve]
    if not valves:
        return []
    lines = [
        "### vLLM's load valve: cap (requests refused at arrival)",
        "",
        "| load | scenario | FCFS peak unfinished | " + " | ".join(c.label for c in valves) + " |",
        "|---|---|---|" + "---|" * len(valves),
    ]
    for point in report.points:
        for s in report.at(point):
            base = report.results[(s.name, point, BASELINE)]
            cells = []
            for c in valves:
                r = report.results[(s.name, point, c.label)]
                tried = [int(k) for k in r.get("tuned_queue_caps") or {}]
                edge = " (the grid's lowest)" if tried and r.get("queue_cap") == min(tried) else ""
                cells.append(f"{r.get('queue_cap')} ({r.get('refused', 0)}){edge}")
            lines.append(f"| {point:.0%} | {s.name} | {base.get('peak_in_flight')} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def render(report: CorpusReport) -> str:
    """Markdown: per load point, a row per scenario (FCFS's attainment, each column's ratio), the
    geometric mean and the worst; per family; capacity when measured."""
    labels = [c.label for c in report.columns]
    lines = []
    for point in report.points:
        lines += [
            f"### Load where FCFS meets ~{point:.0%} of requests",
            "",
            "| scenario | rate (req/s) | FCFS met | "
            + " | ".join(label for label in labels if label != BASELINE)
            + " |",
            "|---|---|---|" + "---|" * (len(labels) - 1),
        ]
        for s in report.scenarios:
            if point not in report.loads[s.name]:
                lines.append(f"| {s.name} | — | — | " + " | ".join("—" for label in labels if label != BASELINE) + " |")
                continue
            rate, _ = report.loads[s.name][point]
            base = report.results[(s.name, point, BASELINE)]
            cells = [f"{report.ratio(s.name, point, label):.2f}" for label in labels if label != BASELINE]
            lines.append(f"| {s.name} | {rate:.3g} | {base['attainment']:.0%} | " + " | ".join(cells) + " |")
        for name, subset in [
            ("geometric mean", None),
            *[
                (f"geo. mean {f}", [s for s in report.scenarios if s.family == f])
                for f in sorted({s.family for s in report.scenarios})
            ],
        ]:
            cells = [f"{report.summary(point, label, subset)['geomean']:.2f}" for label in labels if label != BASELINE]
            lines.append(f"| **{name}** | | | " + " | ".join(cells) + " |")
        worst = [report.summary(point, label) for label in labels if label != BASELINE]
        lines.append(
            "| **worst** | | | " + " | ".join(f"{w['worst']:.2f} ({w['worst_scenario']})" for w in worst) + " |"
        )
        lines.append("")
    lines += tail_lines(report)
    lines += against_best_lines(report)
    lines += valve_lines(report)
    if report.capacity:
        lines += [
            "### Capacity (highest rate with ≥ 80 % of requests meeting every target), × FCFS",
            "",
            "| scenario | FCFS (req/s) | " + " | ".join(label for label in labels if label != BASELINE) + " |",
            "|---|---|" + "---|" * (len(labels) - 1),
        ]
        cap_ratios: dict[str, list[float]] = {label: [] for label in labels}
        for s in report.scenarios:
            caps = report.capacity[s.name]
            base_rate = caps[BASELINE]
            cells = []
            for label in labels:
                if label == BASELINE:
                    continue
                cap_ratio = caps[label] / base_rate if base_rate else math.nan
                cap_ratios[label].append(cap_ratio)
                cells.append(f"{cap_ratio:.2f}")
            lines.append(f"| {s.name} | {base_rate:.3g} | " + " | ".join(cells) + " |")
        lines.append(
            "| **geometric mean** | | "
            + " | ".join(f"{geometric_mean(cap_ratios[label]):.2f}" for label in labels if label != BASELINE)
            + " |"
        )
        lines.append("")
    return "\n".join(lines)


def plot(report: CorpusReport, out_dir: Path) -> list[Path]:
    """One PNG per load point: each column's per-scenario ratio to FCFS (a dot per scenario, the
    family by marker), its geometric mean as a bar; and the capacity ratios when measured."""
    from meridian.replay.report import _pyplot

    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = [c.label for c in report.columns if c.label != BASELINE]
    markers = dict(zip(sorted({s.family for s in report.scenarios}), "os^D"))

    def ratio_at(p: float) -> Callable[[Scenario, str], float]:
        return lambda s, label: report.ratio(s.name, p, label) if p in report.loads[s.name] else math.nan

    def geomean_at(p: float) -> Callable[[str], float]:
        return lambda label: float(report.summary(p, label)["geomean"])

    panels: list[tuple[str, str, Callable[[Scenario, str], float], Callable[[str], float]]] = [
        (
            f"load_{round(p * 100)}",
            f"requests meeting every target, × FCFS (FCFS ≈ {p:.0%})",
            ratio_at(p),
            geomean_at(p),
        )
        for p in report.points
    ]
    if report.capacity:
        cap = report.capacity

        def cap_ratio(s: Scenario, label: str) -> float:
            base = cap[s.name][BASELINE]
            return cap[s.name][label] / base if base else math.nan

        panels.append(
            (
                "capacity",
                "capacity at 80 % attainment, × FCFS",
                cap_ratio,
                lambda label: geometric_mean(cap_ratio(s, label) for s in report.scenarios),
            )
        )
    written = []
    for name, ylabel, ratio, mean in panels:
        fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(labels), 4.2))
        ax.bar(range(len(labels)), [mean(label) for label in labels], color="#d0d8e8", label="geometric mean")
        for family, marker in markers.items():
            for x, label in enumerate(labels):
                ys = [ratio(s, label) for s in report.scenarios if s.family == family]
                ax.scatter(
                    [x + 0.15 * (list(markers).index(family) - 1)] * len(ys),
                    ys,
                    marker=marker,
                    s=18,
                    color="#333333",
                    label=family if x == 0 else None,
                )
        ax.axhline(1.0, color="#aa3333", linewidth=1)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"corpus_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def corpus_command(
    *,
    per_family: int,
    seed: int,
    policies: str,
    config: str | None,
    capacity: bool,
    jobs: int,
    cache_dir: Path,
    report_dir: Path | None,
    progress: bool,
) -> int:
    """``meridian replay --corpus``: every policy over the corpus; prints the report, writes it
    (and ``corpus.json`` and the plots) to ``report_dir``. ``config`` (JSON or ``@file``, the
    ``meridian`` keys other than the classes, which each scenario's target set gives) runs
    Meridian as ``meridian[config]`` beside its defaults."""
    import sys
    import time

    from meridian.replay.report import write_json
    from meridian.replay.runner import load_config_arg

    started = time.monotonic()

    def say(line: str) -> None:
        if progress:
            print(f"[{time.monotonic() - started:7.0f} s] {line}", file=sys.stderr, flush=True)

    names = [p.strip() for p in policies.split(",") if p.strip()]
    variants = {}
    if config:
        overrides = load_config_arg(config)
        overrides.pop("classes", None)
        variants["config"] = overrides
    corpus = Corpus(cache_dir=cache_dir, jobs=jobs, progress=say)
    scenarios = make_corpus(per_family, seed=seed)
    report = run_corpus(corpus, scenarios, columns(names, variants), capacity=capacity)
    text = render(report)
    print(text)
    if report_dir is not None:
        report_dir.mkdir(parents=True, exist_ok=True)
        (report_dir / "report.md").write_text(text + "\n", encoding="utf-8")
        write_json(report_dir / "corpus.json", report.to_json())
        for path in plot(report, report_dir):
            print(f"wrote {path}")
    return 0
