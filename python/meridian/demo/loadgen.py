"""The live A/B's measurement with a real load generator: a seeded, timestamped, three-class
reasoning workload that aiperf replays open-loop against ``vllm serve`` (CPU build) with the stock
scheduler or with ``MeridianScheduler``, and the numbers read back from aiperf's own exports.

It owns the workload file, the server arguments of both policies, the aiperf command line, the
placement of the processes on the cores, and the reading of aiperf's exports: time to first token
(TTFT), time to first output token (TTFO, aiperf's name for the first answer token), inter-token
latency and throughput from its summary; per-class goodput against the class targets and the answer's
inter-token latency from its per-request export, the generated text from its raw export (aiperf's ``--goodput``
takes one SLO set for all requests, the workload has three classes). ``bench/live_ab.py`` runs many
rounds of this; ``meridian demo``'s live part one round per policy. aiperf is the benchmark's
dependency, not the product's: ``make bench-live-setup`` installs the version pinned in
``bench/requirements-live.txt`` into ``.venv-bench``, and ``find_aiperf`` looks there, then at
``$AIPERF``, then on ``PATH``. Invariant: the two policies get the same server arguments but the
scheduler's, the same dataset file, the same placement, and are measured by one definition.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gzip
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meridian._core import SHED_MARKER
from meridian.demo.server import VllmServer, stream_chat
from meridian.offline.tiny import MAX_ANSWER, MAX_THINK, task_prompt
from meridian.replay.policies import MERIDIAN, POLICIES, STOCK, additional_config
from meridian.vllm.names import MIDDLEWARE, SCHEDULER_CLS

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from meridian.replay.profiles import Profile
    from meridian.replay.traces import TraceRequest

#: aiperf's export names of the summary metrics a round reports, with the statistic taken.
SUMMARY_METRICS = {
    "ttft_p50_ms": ("time_to_first_token", "p50"),
    "ttft_p99_ms": ("time_to_first_token", "p99"),
    "ttfo_p50_ms": ("time_to_first_output_token", "p50"),
    "ttfo_p99_ms": ("time_to_first_output_token", "p99"),
    "itl_p99_ms": ("inter_token_latency", "p99"),
    "output_tok_s": ("output_token_throughput", "avg"),
    "requests": ("request_count", "avg"),
    "duration_s": ("benchmark_duration", "avg"),
    "sched_lag_p99_ms": ("replay_sched_lag_p99", "avg"),
}
#: vLLM's ``--max-num-seqs`` and block size for every live model.
MAX_NUM_SEQS = 16
BLOCK_SIZE_TOKENS = 32


@dataclass(frozen=True)
class ClassTargets:
    """One SLO class of the live workload: its share of requests and its targets (ms)."""

    name: str
    share: float
    ttft_ms: float
    ttfat_ms: float
    answer_tpot_ms: float
    rank: int


@dataclass(frozen=True)
class LiveModel:
    """A trained fixture the live A/B serves, and the class targets scaled to its speed."""

    name: str
    folder: str
    kv_cache_tokens: int
    classes: tuple[ClassTargets, ...]
    #: The load of the A/B: the lowest swept rate at which the stock server's TTFO p99 was at
    #: least 5x its unloaded value, and enough requests for 30 s of arrivals at that rate.
    rate_rps: float
    num_requests: int
    #: The longest countdown the fixture follows exactly (its task's largest number).
    max_think: int = MAX_THINK
    #: vLLM's ``--max-model-len``: the prompt and the longest completion.
    max_model_len: int = 256
    #: vLLM's ``--stream-interval``: tokens per streamed chunk after the first (sent at once).
    #: Thousands of tokens a second streamed one a chunk saturate the core the API server and the
    #: load generator share (measured: 88-98 % busy, TTFT ~1 s at an idle engine), so the long
    #: model batches four — a first answer token arrives up to three decode steps late, alike for
    #: every arm.
    stream_interval: int = 1

    @property
    def max_tokens(self) -> int:
        """Every request's ``max_tokens``: what the context leaves after the longest prompt."""
        return self.max_model_len - 56

    def path(self, repo: Path) -> Path:
        return repo / self.folder

    def kv_cache_bytes(self, repo: Path) -> int:
        """``kv_cache_tokens`` of float32 K and V in every layer (vLLM's ``--kv-cache-memory-bytes``)."""
        config = json.loads((self.path(repo) / "config.json").read_text())
        per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"] * 4
        return int(self.kv_cache_tokens * per_token)

    def meridian_classes(self) -> dict[str, dict[str, float]]:
        return {
            c.name: {"ttft_ms": c.ttft_ms, "ttfat_ms": c.ttfat_ms, "answer_tpot_ms": c.answer_tpot_ms, "rank": c.rank}
            for c in self.classes
        }


def _classes(scale: float) -> tuple[ClassTargets, ...]:
    """The three classes, their targets ``scale`` times those of a model whose unloaded TTFO is
    about 0.5 s at the median and 1 s at p99 (both fixtures, pinned): an interactive class that
    must see its answer within 2.5 s, a standard one within 6 s, a batch one that only needs to
    finish."""
    return (
        ClassTargets("interactive", 0.3, 1_000.0 * scale, 2_500.0 * scale, 30.0 * scale, 0),
        ClassTargets("standard", 0.5, 3_000.0 * scale, 6_000.0 * scale, 60.0 * scale, 1),
        ClassTargets("batch", 0.2, 30_000.0 * scale, 60_000.0 * scale, 500.0 * scale, 2),
    )


#: ``tiny``: a decode step is mostly vLLM's own Python; ``compute``: mostly matrix products
#: (``meridian.offline.tiny.MODEL_SHAPES``). A small KV cache makes KV the binding limit, as long
#: reasoning contexts make it on a GPU, and saturates the engine at a rate the API server's core
#: still serves (``bench/results/live_sweep_*``): 512 tokens (15 usable blocks of 32, four or five
#: requests at full length) for ``compute``; ``tiny`` is so fast that at 512 tokens even 20
#: requests/s left its TTFO p99 under 2x unloaded, so it gets 320 (9 usable blocks).
LIVE_MODELS = {
    "tiny": LiveModel(
        "tiny",
        "tests/fixtures/tiny-reasoner",
        kv_cache_tokens=320,
        classes=_classes(1.0),
        rate_rps=14.0,
        num_requests=420,
    ),
    "compute": LiveModel(
        "compute",
        "tests/fixtures/compute-reasoner",
        kv_cache_tokens=512,
        classes=_classes(1.0),
        rate_rps=12.0,
        num_requests=360,
    ),
    # ``long``: the tiny model's shape, wider, counting down from up to 990 (its task's 999 less
    # the top few it was rarely trained on): heavy-tailed reasoning of up to ~1,000 tokens. Its
    # cache holds two of the longest requests, or sixteen of the median one several times over.
    "long": LiveModel(
        "long",
        "tests/fixtures/long-reasoner",
        kv_cache_tokens=2_048,
        classes=_classes(1.0),
        rate_rps=20.0,
        num_requests=480,
        max_think=990,
        max_model_len=1_088,
        stream_interval=4,
    ),
}


#: The reasoning-length families of the live workload (``Workload.lengths``). ``uniform``: think
#: 20–99 countdown steps and answer 5–26 letters, no tail (the A/B's first workload). The two
#: heavy-tailed ones are production-shaped and scaled onto the tiny model's range: each draws
#: (thinking, answer) tokens from its source and multiplies both by one factor per family, chosen
#: so that the family's thinking p99 becomes the model's longest countdown (``LiveModel.max_think``
#: tokens: 99 for ``tiny``, 990 for ``long``) — the shape (p99/p50, the modes) is the source's,
#: the scale the model's. ``servegen``: production DeepSeek-R1 traffic (ServeGen's client-windows, REASONING.md
#: §1a, thinking p99/p50 ≈ 18). ``benchmark``: a math "reasoning app" mix, 80 % MATH-500-like and
#: 20 % AIME-like requests (log-normal fits of §1c's DeepSeek-R1-Distill-32B quantiles: thinking
#: p50 430 / p90 4,200 and p50 5,300 / p90 11,400 tokens; answers p50 360 / p90 530). The two
#: heavy families come from different sources, so a default tuned on one is checked on the other.
LENGTH_FAMILIES = ("uniform", "servegen", "benchmark")
#: Draws behind each heavy family's scale factor (its thinking p99), from a fixed seed.
_SCALE_SAMPLES = 20_000


def _lognormal(rng: np.random.Generator, n: int, p50: float, p90: float) -> npt.NDArray[np.float64]:
    """``n`` log-normal draws with the given median and 90th percentile."""
    import numpy as np

    sigma = math.log(p90 / p50) / 1.2815515655446004
    return np.asarray(rng.lognormal(math.log(p50), sigma, n), dtype=np.float64)


def family_tokens(
    family: str, rng: np.random.Generator, n: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(thinking, answer) tokens of ``n`` requests of a heavy family, at the source's scale."""
    import numpy as np

    if family == "servegen":
        from meridian.replay.reasoning import ServeGenLengths

        think, answer = ServeGenLengths.default().sample_many(rng, n)
        return think.astype(np.float64), answer.astype(np.float64)
    if family == "benchmark":
        hard = rng.random(n) < 0.2
        bimodal = np.asarray(
            np.where(hard, _lognormal(rng, n, 5_300.0, 11_400.0), _lognormal(rng, n, 430.0, 4_200.0)), dtype=np.float64
        )
        return bimodal, _lognormal(rng, n, 360.0, 530.0)
    raise ValueError(f"unknown length family {family!r}: expected one of {', '.join(LENGTH_FAMILIES)}")


@functools.cache
def family_p99_tokens(family: str) -> float:
    """A heavy family's thinking p99 in source tokens (from a fixed seed)."""
    import numpy as np

    think, _ = family_tokens(family, np.random.default_rng(12345), _SCALE_SAMPLES)
    return float(np.percentile(think, 99))


def task_lengths(family: str, n: int, seed: int, max_think: int = MAX_THINK) -> list[tuple[int, int]]:
    """(countdown steps, answer letters) of ``n`` requests of a length family, seeded, for a model
    that counts down from up to ``max_think``: a heavy family's thinking p99 becomes that."""
    if family == "uniform":
        rng = random.Random(seed)
        return [(rng.randint(20, 99), rng.randint(5, 26)) for _ in range(n)]
    import numpy as np

    think, answer = family_tokens(family, np.random.default_rng(seed), n)
    # Countdown steps per source token. Greedy decoding never picks a filler (each is drawn with
    # probability 0.35 in training), so a step is one token and the answer is scaled alike.
    scale = max_think / family_p99_tokens(family)
    steps = np.clip(np.rint(think * scale), 1, max_think).astype(int)
    letters = np.clip(np.rint(answer * scale), 1, MAX_ANSWER).astype(int)
    return list(zip(steps.tolist(), letters.tolist(), strict=True))


@dataclass(frozen=True)
class Workload:
    """Seeded open-loop reasoning requests: Poisson arrivals at ``rate_rps``, reasoning and answer
    lengths from a family of ``LENGTH_FAMILIES``, classes drawn by their shares."""

    num_requests: int
    rate_rps: float
    classes: tuple[ClassTargets, ...]
    seed: int = 0
    lengths: str = "uniform"
    #: The model's longest countdown (``LiveModel.max_think``): a heavy family's p99 maps onto it.
    max_think: int = MAX_THINK
    #: Every request's ``max_tokens``: one value for all, above the longest completion, so that
    #: no scheduler learns a request's length from its limit.
    max_tokens: int = 200

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError(f"a live workload needs at least one request, got num_requests={self.num_requests}")
        if not self.rate_rps > 0:
            raise ValueError(f"a live workload needs a positive arrival rate, got rate_rps={self.rate_rps}")
        if self.lengths not in LENGTH_FAMILIES:
            raise ValueError(
                f"unknown length family lengths={self.lengths!r}: expected one of {', '.join(LENGTH_FAMILIES)}"
            )

    def entries(self) -> list[dict[str, Any]]:
        rng = random.Random(self.seed)
        # The uniform family keeps its original draws (lengths, then class, then gap, per request).
        lengths = (
            None
            if self.lengths == "uniform"
            else task_lengths(self.lengths, self.num_requests, self.seed, self.max_think)
        )
        t_ms, out = 0.0, []
        names, shares = [c.name for c in self.classes], [c.share for c in self.classes]
        ranks = {c.name: c.rank for c in self.classes}
        for k in range(self.num_requests):
            think, answer = (rng.randint(20, 99), rng.randint(5, 26)) if lengths is None else lengths[k]
            cls = rng.choices(names, shares)[0]
            # ``priority`` for vLLM's priority scheduler (the class's rank); Meridian reads the class.
            out.append(
                {
                    "text": task_prompt(think, answer),
                    "timestamp": round(t_ms, 1),
                    "output_length": self.max_tokens,
                    "extra": {"temperature": 0.0, "priority": ranks[cls], "vllm_xargs": {"meridian_class": cls}},
                }
            )
            t_ms += rng.expovariate(self.rate_rps) * 1000.0
        return out

    def jsonl(self) -> str:
        return "".join(json.dumps(e) + "\n" for e in self.entries())


def find_aiperf(repo: Path) -> Path:
    """aiperf's executable: ``$AIPERF``, then ``.venv-bench``, then ``PATH``; a clear error if none."""
    candidates = [os.environ.get("AIPERF"), str(repo / ".venv-bench" / "bin" / "aiperf"), shutil.which("aiperf")]
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            return Path(candidate)
    raise FileNotFoundError("no aiperf found ($AIPERF, .venv-bench/bin/aiperf, PATH): run `make bench-live-setup`")


#: vLLM's own load valve (``--max-num-queued-reqs``, 0.32+): its 503 answer's message, which
#: carries no ``Retry-After`` and names no class.
VALVE_MESSAGE = "The engine is currently busy and cannot accept new requests"


@dataclass(frozen=True)
class Arm:
    """One server configuration a live benchmark compares: a policy (``stock`` / ``vllm-fcfs``,
    ``vllm-priority`` for vLLM's own scheduler, ``meridian``) and, for vLLM's, optionally its own
    load valve (``--max-num-queued-reqs``: HTTP 503 once that many requests are unfinished)."""

    name: str
    policy: str
    max_num_queued_reqs: int | None = None
    #: For ``meridian``: keys merged over the round's Meridian config (a variant under test).
    meridian_config: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.policy not in (MERIDIAN.name, STOCK.name, "stock", "vllm-priority"):
            raise ValueError(
                f"unknown live policy {self.policy!r}: expected {MERIDIAN.name!r}, {STOCK.name!r}, "
                f"'stock' or 'vllm-priority'"
            )
        if self.max_num_queued_reqs is not None and self.max_num_queued_reqs < 1:
            raise ValueError(f"arm {self.name!r}: max_num_queued_reqs={self.max_num_queued_reqs} must be at least 1")


def little_law_queue_cap(capacity_rps: float, ttft_target_ms: float, max_num_seqs: int = MAX_NUM_SEQS) -> int:
    """The valve's cap as vLLM's docs size it: every seat (``max_num_seqs``) plus the queue that
    drains within the tightest TTFT target at the measured completion rate (Little's law)."""
    if not capacity_rps > 0 or not ttft_target_ms > 0:
        raise ValueError(
            f"sizing a queue cap needs a positive rate and target, got {capacity_rps} req/s, {ttft_target_ms} ms"
        )
    return max_num_seqs + max(1, round(capacity_rps * ttft_target_ms / 1000.0))


def server_args(
    policy: str | Arm,
    model: LiveModel,
    repo: Path,
    *,
    step_log: Path | None = None,
    request_log: Path | None = None,
    meridian_config: dict[str, Any] | None = None,
) -> list[str]:
    """``vllm serve`` arguments after the model; only the scheduler (and an arm's valve) differs
    between arms. ``policy``: an ``Arm``, or a policy name (``meridian``, ``stock`` / ``vllm-fcfs``,
    ``vllm-priority``) for that policy without a valve."""
    arm = policy if isinstance(policy, Arm) else Arm(policy, policy)
    if arm.policy == "vllm-priority":
        spec = POLICIES["vllm-priority"]
    else:
        spec = MERIDIAN if arm.policy == MERIDIAN.name else STOCK
    args = [
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        str(model.max_model_len),
        "--block-size",
        str(BLOCK_SIZE_TOKENS),
        "--kv-cache-memory-bytes",
        str(model.kv_cache_bytes(repo)),
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--reasoning-parser",
        "deepseek_r1",
        "--scheduling-policy",
        spec.vllm_policy,
    ]
    if model.stream_interval != 1:
        args += ["--stream-interval", str(model.stream_interval)]
    if arm.max_num_queued_reqs is not None:
        args += ["--max-num-queued-reqs", str(arm.max_num_queued_reqs)]
    if spec.meridian_policy is not None:
        config: dict[str, Any] = {
            "classes": model.meridian_classes(),
            "default_class": "standard",
            **(meridian_config or {}),
            **(arm.meridian_config or {}),
        }
        if step_log is not None:
            config["step_log_path"] = str(step_log)
        if request_log is not None:
            config["request_log_path"] = str(request_log)
        # With the middleware, as the README serves it: a request triage sheds before its first
        # token is answered 429 + Retry-After, which aiperf records as an error naming the notice.
        args += [
            "--scheduler-cls",
            SCHEDULER_CLS,
            "--middleware",
            MIDDLEWARE,
            "--additional-config",
            json.dumps(additional_config(spec, config)),
        ]
    return args


#: Process titles vLLM gives the engine side: the engine core (scheduler) and, under the
#: multiprocessing executor the CPU build uses, the worker that runs the model.
ENGINE_PROCESS_TITLES = ("VLLM::EngineCore", "VLLM::Worker")


def pin(server: VllmServer, engine_cpu: int | None = None, *, front_anywhere: bool = False) -> dict[str, Any]:
    """The engine core and its model worker (every thread) alone on one CPU (``engine_cpu``, by
    default the last this process may use); the API server on the others (the load generator is
    started there too, by ``aiperf_command``'s caller), or with ``front_anywhere`` on any CPU.
    Two servers on two CPUs: each engine on its own, the API servers where the kernel finds room
    (held to the other engine's CPU, one API server was seen passing no request on for 15 s while
    that engine ran flat out)."""
    import psutil

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise RuntimeError(f"pinning needs two or more CPUs; this process may use {cpus}")
    engine = cpus[-1] if engine_cpu is None else engine_cpu
    if engine not in cpus:
        raise RuntimeError(f"CPU {engine} is not one this process may use ({cpus})")
    engine_cpus, front_cpus = {engine}, set(cpus) if front_anywhere else set(cpus) - {engine}
    assert server.process is not None
    root = psutil.Process(server.process.pid)
    placed: dict[str, Any] = {"engine_core": [], "front": []}
    for proc in [root, *root.children(recursive=True)]:
        title = " ".join(proc.cmdline()) + " " + proc.name()
        is_engine = any(t in title or t[:15] in title for t in ENGINE_PROCESS_TITLES)
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            os.sched_setaffinity(int(tid), engine_cpus if is_engine else front_cpus)
        placed["engine_core" if is_engine else "front"].append(proc.pid)
    if not placed["engine_core"]:
        raise RuntimeError("no EngineCore process found under the server; cannot pin it")
    return {**placed, "engine_cpus": sorted(engine_cpus), "front_cpus": sorted(front_cpus)}


def aiperf_command(
    aiperf: Path,
    model_path: Path,
    url: str,
    dataset: Path,
    artifacts: Path,
    *,
    workers: int = 2,
    goodput: ClassTargets | None = None,
    raw: bool = False,
) -> list[str]:
    """aiperf replaying ``dataset`` on its timestamps, streaming, with its per-request export
    (``raw``: every chunk and the text too — a JSON dump per chunk that loads the generator's
    core, so for untimed rounds only). Its server-metrics scraper and GPU telemetry are off: they
    would load the API server's core during the timed run."""
    cmd = [
        str(aiperf),
        "profile",
        "--model",
        str(model_path),
        "--tokenizer",
        str(model_path),
        "--url",
        url,
        "--endpoint-type",
        "chat",
        "--streaming",
        "--input-file",
        str(dataset),
        "--custom-dataset-type",
        "single_turn",
        "--fixed-schedule",
        "--fixed-schedule-auto-offset",
        "--random-seed",
        "0",
        "--artifact-dir",
        str(artifacts),
        "--ui-type",
        "none",
        "--workers-max",
        str(workers),
        "--record-processor-service-count",
        "1",
        "--no-server-metrics",
        "--no-gpu-telemetry",
        "--export-level",
        "raw" if raw else "records",
    ]
    if goodput is not None:
        cmd += ["--goodput", f"time_to_first_output_token:{goodput.ttfat_ms:g} time_to_first_token:{goodput.ttft_ms:g}"]
    return cmd


# ---- reading aiperf's exports ---------------------------------------------------------------


@dataclass
class RecordTimes:
    """One request as aiperf's per-request export saw it (times in ms from its send). The answer
    ITL is aiperf's inter-token latency restricted to the answer: (request latency − TTFO) over
    the answer tokens after the first."""

    meridian_class: str
    prompt: str
    ok: bool
    ttft_ms: float | None
    ttfo_ms: float | None
    answer_itl_ms: float | None
    num_output_tokens: int
    #: The generated text, from the raw export only (``parse_raw_record``); ``None`` otherwise.
    text: str | None = None
    #: Refused under load before its first token (Meridian's HTTP 429 with the shed notice, or
    #: vLLM's valve's 503): a missed request, not a failure.
    shed: bool = False
    #: For a refused request: ms from its send to the refusal's arrival (the notice time).
    notice_ms: float | None = None
    #: Refused by vLLM's valve inside a 200 stream (see ``VALVE_IN_STREAM``); counted in ``shed``.
    refused_in_stream: bool = False
    #: The error aiperf recorded, cut short (``None`` for a request that succeeded).
    error: str | None = None
    #: ms from its send to its last byte (aiperf's request latency), for a completed request.
    latency_ms: float | None = None
    #: Its line in the workload file (aiperf's session number under a fixed schedule).
    session: int | None = None
    #: Thinking and answer tokens the server reported (aiperf's usage counts; ``None`` unknown).
    num_think_tokens: int | None = None
    num_answer_tokens: int | None = None


def is_shed_error(error: Any) -> bool:
    """Whether an aiperf error record (``ErrorDetails``, as JSON) is a refusal under load: Meridian's
    shed answer, or vLLM's own valve's 503 (``--max-num-queued-reqs``). A refusal is a missed
    request, not a failure."""
    if not isinstance(error, dict):
        return False
    message = str(error.get("message") or "")
    return SHED_MARKER in message or (error.get("code") == 503 and VALVE_MESSAGE in message)


def _metric(metrics: dict[str, Any], name: str) -> Any:
    value = metrics.get(name)
    return value.get("value") if isinstance(value, dict) else None


def _session_number(conversation_id: Any) -> int | None:
    """``session_000029`` → 29: under ``--fixed-schedule`` the workload file's line."""
    text = str(conversation_id or "")
    digits = text.rsplit("_", 1)[-1]
    return int(digits) if text.startswith("session_") and digits.isdigit() else None


def parse_record(record: dict[str, Any], payloads: dict[str, dict[str, Any]]) -> RecordTimes:
    """A line of aiperf's ``profile_export.jsonl``, its request read back from ``inputs.json``
    (``payloads``: conversation id → the request body aiperf sent)."""
    metrics = record.get("metrics") or {}
    payload = payloads.get(str(record["metadata"].get("conversation_id")), {})
    latency_ms, ttfo_ms = _metric(metrics, "request_latency"), _metric(metrics, "time_to_first_output_token")
    answer_tokens = int(_metric(metrics, "output_token_count") or 0)
    answer_itl_ms = None
    if latency_ms is not None and ttfo_ms is not None and answer_tokens > 1:
        answer_itl_ms = (latency_ms - ttfo_ms) / (answer_tokens - 1)
    shed = is_shed_error(record.get("error"))
    metadata = record.get("metadata") or {}
    notice_ms = None
    # aiperf stamps an error record's end with its start (0.13): no notice time then.
    if shed and int(metadata.get("request_end_ns") or 0) > int(metadata.get("request_start_ns") or 0):
        notice_ms = (int(metadata["request_end_ns"]) - int(metadata["request_start_ns"])) * 1e-6
    think_tokens = _metric(metrics, "reasoning_token_count")
    return RecordTimes(
        meridian_class=str((payload.get("vllm_xargs") or {}).get("meridian_class", "")),
        prompt=str(((payload.get("messages") or [{}])[-1]).get("content", "")),
        ok=record.get("error") is None,
        shed=shed,
        ttft_ms=_metric(metrics, "time_to_first_token"),
        ttfo_ms=ttfo_ms,
        answer_itl_ms=answer_itl_ms,
        num_output_tokens=int(_metric(metrics, "output_sequence_length") or 0),
        notice_ms=notice_ms,
        session=_session_number(record["metadata"].get("conversation_id")),
        error=None if record.get("error") is None else str((record["error"] or {}).get("message"))[:200],
        latency_ms=latency_ms if record.get("error") is None else None,
        num_think_tokens=None if think_tokens is None else int(think_tokens),
        num_answer_tokens=answer_tokens if record.get("error") is None else None,
    )


def parse_raw_record(record: dict[str, Any]) -> RecordTimes:
    """A line of aiperf's raw export (``--export-level raw``): the request body, every SSE chunk's
    arrival, the generated text. The raw export costs the generator a JSON dump of every chunk,
    so only untimed rounds use it (the greedy-output check)."""
    payload = record.get("payload") or {}
    messages = payload.get("messages") or [{}]
    start_ns = int(record["start_perf_ns"])
    first_any: int | None = None
    answer_ns: list[int] = []
    text: list[str] = []
    for response in record.get("responses") or []:
        for packet in response.get("packets") or []:
            if packet.get("name") != "data" or not packet.get("value") or packet["value"] == "[DONE]":
                continue
            for choice in json.loads(packet["value"]).get("choices") or []:
                delta = choice.get("delta") or {}
                reasoning = delta.get("reasoning") or delta.get("reasoning_content") or ""
                content = delta.get("content") or ""
                if reasoning or content:
                    first_any = response["perf_ns"] if first_any is None else first_any
                    text.append(reasoning + content)
                if content:
                    answer_ns.append(response["perf_ns"])
    to_ms = 1e-6
    return RecordTimes(
        meridian_class=str((payload.get("vllm_xargs") or {}).get("meridian_class", "")),
        prompt=str(messages[-1].get("content", "")),
        ok=record.get("error") is None and record.get("status") in (None, 200),
        shed=is_shed_error(record.get("error")),
        ttft_ms=None if first_any is None else (first_any - start_ns) * to_ms,
        ttfo_ms=None if not answer_ns else (answer_ns[0] - start_ns) * to_ms,
        answer_itl_ms=(answer_ns[-1] - answer_ns[0]) * to_ms / (len(answer_ns) - 1) if len(answer_ns) > 1 else None,
        num_output_tokens=len(text),  # chunks with text: vLLM streams one token a chunk
        text="".join(text),
    )


def read_records(artifacts: Path) -> list[RecordTimes]:
    """Every request of a round from aiperf's per-request export (or its raw export, if written)."""
    raw = sorted(artifacts.rglob("profile_export_raw.jsonl"))
    if raw:
        return [parse_raw_record(json.loads(line)) for line in raw[0].read_text().splitlines() if line.strip()]
    found, inputs = sorted(artifacts.rglob("profile_export.jsonl")), sorted(artifacts.rglob("inputs.json"))
    if not found or not inputs:
        raise RuntimeError(f"aiperf wrote no per-request export (profile_export.jsonl, inputs.json) under {artifacts}")
    sessions = json.loads(inputs[0].read_text())["data"]
    payloads = {str(s["session_id"]): (s.get("payloads") or [{}])[0] for s in sessions}
    return [parse_record(json.loads(line), payloads) for line in found[0].read_text().splitlines() if line.strip()]


def is_good(r: RecordTimes, c: ClassTargets) -> bool:
    """docs/request-life.md §4: a request is good when it met every target of its class."""
    if not r.ok or r.ttft_ms is None or r.ttfo_ms is None:
        return False
    return r.ttft_ms <= c.ttft_ms and r.ttfo_ms <= c.ttfat_ms and (r.answer_itl_ms or 0.0) <= c.answer_tpot_ms


def record_metrics(records: list[RecordTimes], classes: Iterable[ClassTargets], duration_s: float) -> dict[str, Any]:
    """Goodput against each class's targets, the answer ITL tail, per-class TTFO tails."""
    import numpy as np

    by_name = {c.name: c for c in classes}
    itl = [r.answer_itl_ms for r in records if r.answer_itl_ms is not None]
    good = [r.meridian_class in by_name and is_good(r, by_name[r.meridian_class]) for r in records]
    per_class: dict[str, Any] = {}
    for name in by_name:
        mine = [(r, g) for r, g in zip(records, good) if r.meridian_class == name]
        ttfo = [r.ttfo_ms for r, _ in mine if r.ttfo_ms is not None]
        notices = [r.notice_ms for r, _ in mine if r.notice_ms is not None]
        per_class[name] = {
            "requests": len(mine),
            "good": sum(g for _, g in mine),
            "shed": sum(r.shed for r, _ in mine),
            "ttfo_p50_ms": float(np.percentile(ttfo, 50)) if ttfo else None,
            "ttfo_p99_ms": float(np.percentile(ttfo, 99)) if ttfo else None,
            "notice_p99_ms": float(np.percentile(notices, 99)) if notices else None,
            "notices_past_ttft_target": sum(n > by_name[name].ttft_ms for n in notices),
        }
    return {
        "good_requests": sum(good),
        "goodput_rps": sum(good) / duration_s if duration_s > 0 else None,
        "answer_itl_p50_ms": float(np.percentile(itl, 50)) if itl else None,
        "answer_itl_p99_ms": float(np.percentile(itl, 99)) if itl else None,
        "failed_in_records": sum(not r.ok and not r.shed for r in records),
        "shed": sum(r.shed for r in records),
        "shed_in_stream": sum(r.refused_in_stream for r in records),
        "empty_responses": sum(r.ok and r.num_output_tokens == 0 for r in records),
        "per_class": per_class,
    }


#: What aiperf records for a 200 stream that carried no token but an error event: how vLLM 0.32's
#: valve answers a streaming request it refuses after the request passed its pre-flight check —
#: concurrent arrivals race between the two checks (seen: ``data: {"error": {... "code": 503}}``
#: in a 200 response, for 7 of 10 simultaneous requests against a cap of 2). A router sees a 200.
VALVE_IN_STREAM = "No responses with actual content"


def read_export(
    artifacts: Path, classes: Iterable[ClassTargets], *, valve: bool = False
) -> tuple[dict[str, Any], list[RecordTimes]]:
    """One round's row from aiperf's summary and per-request exports, and its records. ``valve``:
    the server ran vLLM's valve, so an empty stream is its refusal (``VALVE_IN_STREAM``), a shed."""
    records = read_records(artifacts)
    if valve:
        records = [
            dataclasses.replace(r, shed=True, refused_in_stream=True)
            if not r.ok and not r.shed and VALVE_IN_STREAM in (r.error or "")
            else r
            for r in records
        ]
    return summary_row(artifacts, records, classes, valve=valve), records


def read_packed_records(out: Path, name: str) -> list[RecordTimes]:
    """A packed round's per-request records (``pack_round``'s ``records-NAME.jsonl.gz``)."""
    with gzip.open(out / f"records-{name}.jsonl.gz", "rt") as f:
        return [RecordTimes(**json.loads(line)) for line in f if line.strip()]


def read_packed_round(out: Path, name: str, classes: Iterable[ClassTargets], *, valve: bool = False) -> dict[str, Any]:
    """A packed round's row (``pack_round``: aiperf's summary and ``records-NAME.jsonl.gz``), for
    a round whose row a run did not write (it was interrupted before the load's summary)."""
    return summary_row(out / f"aiperf-{name}", read_packed_records(out, name), classes, valve=valve)


def summary_row(
    artifacts: Path, records: list[RecordTimes], classes: Iterable[ClassTargets], *, valve: bool
) -> dict[str, Any]:
    """aiperf's summary metrics and error kinds under ``artifacts``, with ``records``' goodput."""
    found = sorted(artifacts.rglob("profile_export_aiperf.json"))
    if not found:
        raise RuntimeError(f"aiperf wrote no profile_export_aiperf.json under {artifacts}")
    export = json.loads(found[0].read_text())
    row: dict[str, Any] = {}
    for name, (metric, stat) in SUMMARY_METRICS.items():
        value = export.get(metric)
        row[name] = value.get(stat) if isinstance(value, dict) else None
    errors = export.get("error_summary") or []
    # Shed requests are answered 429 (or 503) on purpose: counted in ``shed`` (from the records), not here.
    in_stream = [e for e in errors if valve and VALVE_IN_STREAM in str((e.get("error_details") or {}).get("message"))]
    errors = [e for e in errors if not is_shed_error(e.get("error_details")) and e not in in_stream]
    row["errors"] = sum(int(e.get("count", 1)) for e in errors)
    row["error_kinds"] = [str(e.get("error_details", e))[:200] for e in errors]
    row.update(record_metrics(records, classes, row["duration_s"] or 0.0))
    return row


def outputs_by_prompt(records: Iterable[RecordTimes]) -> dict[str, set[str]]:
    """Every distinct text each prompt produced (greedy decoding: one each, whatever the policy);
    records without text (not from a raw export) are left out.

    Compared as word sequences: vLLM's streaming reasoning parser keeps or drops the space around
    ``</think>`` depending on how the detokenizer grouped tokens into SSE chunks, which follows
    step timing, not the tokens (seen in CI: ``"1  a b"`` against ``"1 a b"`` for the same ids).
    The fixtures' tokens are whitespace-separated words, so a different token still shows."""
    out: dict[str, set[str]] = {}
    for r in records:
        if r.ok and r.text is not None:
            out.setdefault(r.prompt, set()).add(" ".join(r.text.split()))
    return out


def pack_round(out: Path, name: str, records: list[RecordTimes]) -> None:
    """Keeps a round's evidence small enough to commit: aiperf's per-request export and Meridian's
    logs gzipped, the per-request times read from the raw export (class, TTFT, TTFO, answer gaps,
    text) as ``records-NAME.jsonl.gz``; the raw export itself (every SSE chunk) is dropped."""
    artifacts = out / f"aiperf-{name}"
    with gzip.open(out / f"records-{name}.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(dataclasses.asdict(r)) + "\n" for r in records)
    for path in [*artifacts.rglob("profile_export_raw.jsonl"), *artifacts.rglob("inputs.json")]:
        path.unlink()
    for path in [*artifacts.rglob("profile_export.jsonl"), out / f"steps-{name}.jsonl", out / f"requests-{name}.jsonl"]:
        if path.exists():
            with path.open("rb") as src, gzip.open(f"{path}.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            path.unlink()


def spread(xs: list[float]) -> float | None:
    """(max − min) / median of a metric over rounds: how far apart they fell (``None`` for one)."""
    import statistics

    return (max(xs) - min(xs)) / statistics.median(xs) if len(xs) > 1 and statistics.median(xs) else None


# ---- one round -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoundSettings:
    model: LiveModel
    repo: Path
    cache_dir: Path
    aiperf: Path
    pin: bool = True
    cooldown_s: float = 5.0
    warmup: int = 3
    workers: int = 2
    timeout_s: float = 900.0
    meridian_config: dict[str, Any] | None = None
    #: Untimed: aiperf's raw export on, for the generated text (``outputs_by_prompt``).
    raw: bool = False
    #: ``vllm serve`` arguments after ``server_args``' (e.g. ``--kv-transfer-config``), for either policy.
    extra_server_args: tuple[str, ...] = ()
    #: Samples of ``/metrics`` (e.g. ``vllm:kv_offload_load_bytes_total``) read just before the
    #: timed load and once settled after it; the row's ``server_metrics`` holds their increase.
    server_metrics: tuple[str, ...] = ()
    #: A workload aiperf replays, untimed, before the timed one on the same server: the timed load
    #: then meets a server that has run for a while (a long-running replica).
    preload: Path | None = None


def run_round(
    name: str,
    policy: str | Arm,
    dataset: Path,
    out: Path,
    settings: RoundSettings,
    on_phase: Callable[[str], None] = lambda phase: None,
    on_tick: Callable[[float], None] = lambda elapsed_s: None,
) -> tuple[dict[str, Any], list[RecordTimes]]:
    """A fresh server for ``policy``, a few untimed warm-up requests, aiperf's timed replay of
    ``dataset``; the round's row and raw records. ``on_phase`` hears each phase's name,
    ``on_tick`` the seconds aiperf has run, twice a second. The server's whole process group has exited when
    this returns, so the next round starts from nothing."""
    model_path = settings.model.path(settings.repo).resolve()
    step_log, request_log = out / f"steps-{name}.jsonl", out / f"requests-{name}.jsonl"
    for log in (step_log, request_log):
        log.unlink(missing_ok=True)
    args = server_args(
        policy,
        settings.model,
        settings.repo,
        step_log=step_log,
        request_log=request_log,
        meridian_config=settings.meridian_config,
    ) + list(settings.extra_server_args)
    on_phase("starting the server")
    with VllmServer(model_path, args, log_path=out / f"serve-{name}.log", cache_dir=settings.cache_dir) as srv:
        placement = pin(srv) if settings.pin else None
        on_phase("cooling down")
        time.sleep(settings.cooldown_s)
        engine_cpus = None if placement is None else placement["engine_cpus"]
        speed_before_ms = speed_probe_ms(engine_cpus)
        on_phase("warming up")
        for i in range(settings.warmup):
            stream_chat(srv.base_url, str(model_path), task_prompt(20 + i, 5), max_tokens=200)
        if settings.preload is not None:
            on_phase("preloading")
            preload = out / f"aiperf-{name}-preload"
            shutil.rmtree(preload, ignore_errors=True)
            cmd = aiperf_command(
                settings.aiperf, model_path, srv.base_url, settings.preload, preload, workers=settings.workers
            )
            if placement is not None:
                cmd = ["taskset", "-c", ",".join(map(str, placement["front_cpus"])), *cmd]
            returncode = run_logged(
                cmd, out / f"aiperf-{name}-preload.log", settings.timeout_s, lambda: None, env=aiperf_environment()
            )
            if returncode != 0:
                raise RuntimeError(
                    f"aiperf's preload exited with {returncode}; log: {out / f'aiperf-{name}-preload.log'}"
                )
            shutil.rmtree(preload, ignore_errors=True)
        artifacts = out / f"aiperf-{name}"
        shutil.rmtree(artifacts, ignore_errors=True)
        cmd = aiperf_command(
            settings.aiperf,
            model_path,
            srv.base_url,
            dataset,
            artifacts,
            workers=settings.workers,
            goodput=settings.model.classes[0],
            raw=settings.raw,
        )
        if placement is not None:
            cmd = ["taskset", "-c", ",".join(map(str, placement["front_cpus"])), *cmd]
        metrics_before = metric_sums(srv.base_url, settings.server_metrics) if settings.server_metrics else {}
        on_phase("load")
        started = time.monotonic()
        busy = CpuBusy()

        def tick() -> None:
            busy.sample()
            on_tick(time.monotonic() - started)

        returncode = run_logged(
            cmd,
            out / f"aiperf-{name}.log",
            settings.timeout_s,
            tick,
            env=aiperf_environment(),
        )
        if returncode != 0:
            raise RuntimeError(f"aiperf exited with {returncode}; log: {out / f'aiperf-{name}.log'}")
        wall_s = time.monotonic() - started
        preemptions = metric_sum(srv.base_url, "vllm:num_preemptions_total")
        metrics_after = settled_metric_sums(srv.base_url, settings.server_metrics) if settings.server_metrics else {}
        speed_after_ms = speed_probe_ms(engine_cpus)
        row, records = read_export(
            artifacts, settings.model.classes, valve=isinstance(policy, Arm) and policy.max_num_queued_reqs is not None
        )
        row.update(
            {
                "policy": policy.name if isinstance(policy, Arm) else policy,
                "wall_s": wall_s,
                "placement": placement,
                "preemptions": preemptions,
                "cpu_busy_pct": busy.mean(),
                "speed_probe_ms": {"before": speed_before_ms, "after": speed_after_ms},
            }
        )
        if settings.server_metrics:
            row["server_metrics"] = {
                name: metrics_after[name] - metrics_before[name] for name in settings.server_metrics
            }
    row["meridian_cost"] = meridian_cost(step_log)
    row["preemptions_by_phase"] = preemptions_by_phase(request_log)
    return row, records


#: The burst that measures a server's capacity: enough requests for several seconds of standing
#: queue at the tiny engine's ~20/s (2026-12-05), few enough for one short round.
CAPACITY_BURST_REQUESTS = 120
#: The burst of a heavy-tailed family: its longest requests run on for seconds after the queue
#: has drained, so a short burst measures its tail, not the engine (120 requests of the long
#: model read 19/s where the engine sustained over 36/s; 480 read 30/s).
HEAVY_BURST_REQUESTS = 480
#: Arrivals of the burst per second: all of them within a fraction of a second.
CAPACITY_BURST_RATE_RPS = 1_000.0


def measure_capacity_rps(
    policy: str,
    out: Path,
    settings: RoundSettings,
    num_requests: int | None = None,
    on_phase: Callable[[str], None] = lambda phase: None,
    lengths: str = "uniform",
) -> float:
    """Requests per second a fresh ``policy`` server completes with a standing queue: aiperf sends
    ``num_requests`` of the workload's mix (another seed than the timed load's) at once, and the
    completed ones are divided by aiperf's benchmark duration. A rate is past the knee when it
    exceeds this; the machine's speed moves it (1.6x between 2026-12-01 and 2026-12-05), so a
    fixed rate is not. ``lengths``: the workload's length family (``LENGTH_FAMILIES``); a heavy one
    gets a longer burst (``HEAVY_BURST_REQUESTS``) unless ``num_requests`` is given."""
    if num_requests is None:
        num_requests = CAPACITY_BURST_REQUESTS if lengths == "uniform" else HEAVY_BURST_REQUESTS
    dataset = out / "capacity-burst.jsonl"
    dataset.write_text(
        Workload(
            num_requests,
            CAPACITY_BURST_RATE_RPS,
            settings.model.classes,
            seed=1,
            lengths=lengths,
            max_think=settings.model.max_think,
            max_tokens=settings.model.max_tokens,
        ).jsonl()
    )
    row, records = run_round(f"capacity-{policy}", policy, dataset, out, settings, on_phase=on_phase)
    completed = sum(1 for r in records if r.ok and r.ttfo_ms is not None)
    if not completed or not row["duration_s"]:
        raise RuntimeError(f"the capacity burst completed no request ({row['error_kinds']}); logs under {out}")
    return completed / float(row["duration_s"])


#: A fixed single-threaded load for the speed probe: interpreter work (what the tiny model's
#: step mostly is) and a small float32 matmul (what the compute model's step mostly is).
SPEED_PROBE = """
import time, numpy as np
a = np.random.default_rng(0).random((128, 128), dtype=np.float32)
best = float("inf")
for _ in range(5):
    t = time.perf_counter()
    d = {}
    for i in range(200000):
        d[i % 97] = d.get(i % 97, 0) + i
    for _ in range(2000):
        a = (a @ a) / 128.0
    best = min(best, time.perf_counter() - t)
print(best * 1e3)
"""


def speed_probe_ms(cpus: Iterable[int] | None) -> float:
    """How long the fixed probe takes on the engine's CPU right now (the best of five). The
    machine's speed drifts by up to ~1.8× between minutes (the same four-request decode step took
    4.0 ms in one round and 7.3 ms in the next, with no steal time reported): rounds are only
    comparable alongside this."""
    cmd = [sys.executable, "-c", SPEED_PROBE]
    if cpus is not None:
        cmd = ["taskset", "-c", ",".join(map(str, cpus)), *cmd]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=True)
    return float(done.stdout.strip())


class CpuBusy:
    """Mean busy share of each CPU over the samples taken while aiperf ran: which core was the
    bottleneck (the engine's, or the one the API server and the generator share)."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        psutil.cpu_percent(percpu=True)  # the first call only starts the interval
        self._samples: list[list[float]] = []

    def sample(self) -> None:
        self._samples.append(self._psutil.cpu_percent(percpu=True))

    def mean(self) -> dict[str, float]:
        if not self._samples:
            return {}
        cpus = range(len(self._samples[0]))
        return {str(c): sum(s[c] for s in self._samples) / len(self._samples) for c in cpus}


def aiperf_environment() -> dict[str, str]:
    """The environment aiperf runs in: ours without ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``.
    aiperf 0.13's tokenizer loader takes a local model folder for a hub repo id when either is
    set (``HFValidationError: Repo id must be in the form …``); without them it reads the folder
    and touches no network."""
    return {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}


def run_logged(
    cmd: list[str], log_path: Path, timeout_s: float, tick: Callable[[], object], env: dict[str, str] | None = None
) -> int:
    """Runs ``cmd`` with its output in ``log_path``, calling ``tick`` twice a second; kills it
    past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    with open(log_path, "wb") as log, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env) as proc:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise TimeoutError(f"{cmd[0]} ran past {timeout_s:.0f}s; log: {log_path}")
            tick()
            time.sleep(0.5)
        return proc.returncode


def metric_sum(base_url: str, sample_name: str) -> float:
    """The sum of one sample (e.g. ``vllm:num_preemptions_total``) over its label sets on a vLLM
    server's ``/metrics``, read with prometheus-client's parser."""
    return metric_sums(base_url, [sample_name])[sample_name]


def metric_sums(base_url: str, sample_names: Iterable[str]) -> dict[str, float]:
    """``metric_sum`` of several samples from one read of ``/metrics`` (0 for a sample not there)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    sums = dict.fromkeys(sample_names, 0.0)
    text = httpx.get(f"{base_url}/metrics", timeout=10.0).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in sums:
                sums[sample.name] += sample.value
    return sums


def settled_metric_sums(base_url: str, sample_names: Iterable[str], timeout_s: float = 10.0) -> dict[str, float]:
    """``metric_sums`` once the engine's last stats have reached the API server's registry: read
    until two reads a second apart agree (or ``timeout_s`` has passed)."""
    names = list(sample_names)
    deadline, last = time.monotonic() + timeout_s, metric_sums(base_url, names)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = metric_sums(base_url, names)
        if now == last:
            break
        last = now
    return last


def meridian_cost(step_log: Path) -> dict[str, float] | None:
    """Meridian's own per-step cost in the live server, from its step log: the median of
    ``meridian_ms`` and its share of the summed step time (``None`` for stock vLLM: no log)."""
    import numpy as np

    if not step_log.exists():
        return None
    records = [json.loads(line) for line in step_log.read_text().splitlines() if line.strip()]
    if not records:
        return None
    step_ms = np.array([r["step_ms"] for r in records])
    meridian_ms = np.array([r["meridian_ms"] for r in records])
    return {
        "num_steps": len(records),
        "median_meridian_ms": float(np.median(meridian_ms)),
        "median_step_ms": float(np.median(step_ms)),
        "meridian_share_of_step_time": float(meridian_ms.sum() / step_ms.sum()) if step_ms.sum() else 0.0,
    }


def preemptions_by_phase(request_log: Path) -> dict[str, int] | None:
    """Preemptions by the victim's phase, from Meridian's request log (``None`` for stock vLLM)."""
    if not request_log.exists():
        return None
    ledger = [json.loads(line) for line in request_log.read_text().splitlines() if line.strip()]
    return {phase: sum(int(e[f"num_preemptions_{phase}"]) for e in ledger) for phase in ("prefill", "think", "answer")}


def add_round_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every live benchmark shares: the model and its KV cache, the load, and how the
    rounds run."""
    parser.add_argument("--model", choices=sorted(LIVE_MODELS), default="tiny")
    parser.add_argument(
        "--kv-cache-tokens", type=int, default=None, help="KV cache size in tokens (default: the model's)"
    )
    parser.add_argument(
        "--rate", type=float, default=None, help="arrivals per second (Poisson, seeded; default: the model's)"
    )
    parser.add_argument("--requests", type=int, default=None, help="default: the model's")
    parser.add_argument("--warmup", type=int, default=3, help="untimed requests before each round")
    parser.add_argument("--cooldown-s", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=2, help="aiperf's --workers-max")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=len(os.sched_getaffinity(0)) >= 2)
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument(
        "--out", type=Path, default=None, help="results folder (default: bench/results/<bench>_<model>_<date>)"
    )


def round_settings(args: argparse.Namespace, repo: Path, bench: str, **extra: Any) -> RoundSettings:
    """The rounds' settings from ``add_round_arguments``' options; fills in ``args.rate``,
    ``args.requests`` and ``args.out`` (created) from the model's defaults. Raises
    ``FileNotFoundError`` when aiperf is not installed."""
    aiperf = find_aiperf(repo)
    model = LIVE_MODELS[args.model]
    if args.kv_cache_tokens is not None:
        model = dataclasses.replace(model, kv_cache_tokens=args.kv_cache_tokens)
    args.rate = model.rate_rps if args.rate is None else args.rate
    args.requests = model.num_requests if args.requests is None else args.requests
    args.out = args.out or repo / "bench" / "results" / f"{bench}_{args.model}_{time.strftime('%Y-%m-%d')}"
    args.out.mkdir(parents=True, exist_ok=True)
    return RoundSettings(
        model=model,
        repo=repo,
        cache_dir=repo / ".cache",
        aiperf=aiperf,
        pin=args.pin,
        cooldown_s=args.cooldown_s,
        warmup=args.warmup,
        workers=args.workers,
        timeout_s=args.timeout_s,
        **extra,
    )


# ---- the live workloads as the replay takes them ---------------------------------------------------

#: vLLM's ``max_num_batched_tokens`` on the live servers (the CPU build's default): the prompts
#: are a dozen tokens, so it never binds.
MAX_NUM_BATCHED_TOKENS = 2048


def live_profile(model_name: str, kv_cache_tokens: int) -> Profile:
    """A live server's capacity (its KV blocks, seats and context) as a replay profile, with
    placeholder step times that a fit to the server's step log replaces (``fit_profile``)."""
    from meridian.replay.profiles import Profile

    model = LIVE_MODELS[model_name]
    capacity = {
        "block_size": BLOCK_SIZE_TOKENS,
        "num_kv_blocks": kv_cache_tokens // BLOCK_SIZE_TOKENS,
        "max_num_seqs": MAX_NUM_SEQS,
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
        "max_model_len": model.max_model_len,
    }
    costs = {"base_ms": 1.0, "per_prefill_token_ms": 0.01, "per_decode_request_ms": 0.1, "per_context_token_ms": 0.001}
    sources = {key: "the live server's arguments (meridian.demo.loadgen.server_args)" for key in capacity}
    sources.update({key: "placeholder, replaced by the fit" for key in costs})
    return Profile.from_json(
        {
            "name": f"live-{model_name}",
            "description": "the live CPU server",
            "model": "linear",
            **capacity,
            **costs,
            "sources": sources,
        }
    )


def workload_trace(path: Path) -> list[TraceRequest]:
    """A live workload file's requests as the replay takes them (request ``r<k>`` is line k): the
    fixture answers ``think N answer M`` with exactly N thinking tokens and M answer tokens."""
    from meridian.offline.tiny import prompt_words
    from meridian.replay.traces import TraceRequest

    out = []
    for k, line in enumerate(path.read_text().splitlines()):
        entry = json.loads(line)
        words = entry["text"].split()  # "think N answer M"
        think, answer = int(words[1]), int(words[3])
        out.append(
            TraceRequest(
                req_id=f"r{k}",
                arrival_ms=float(entry["timestamp"]),
                num_prompt_tokens=len(prompt_words(think, answer)),
                num_output_tokens=think + answer,
                num_think_tokens=think,
                num_answer_tokens=answer,
                slo_class=entry["extra"]["vllm_xargs"]["meridian_class"],
            )
        )
    return out
