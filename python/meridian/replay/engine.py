"""The replay engine: one scheduler class driven through vLLM's engine-core call sequence in
virtual time.

It owns the loop that stands in for ``EngineCore.run_busy_loop`` with ``step_with_batch_queue``
(async scheduling: step N+1 is scheduled before step N's output is applied), the "model" that
emits each request's next token from its trace lengths (thinking tokens, the reasoning-end token,
answer tokens, EOS), the virtual device clock (each executed step occupies the device for the
profile's step time, starting when it was scheduled or when the previous step finished), and the
per-token timestamps. Metrics come from one Meridian core used as a pure observer, fed the same
token streams whatever the scheduler, so every policy is measured by one definition (DESIGN §4).
Thinking control: the signal-free rules of the config's ``thinking_control`` (``budget_tokens``,
``load_aware``) apply to every policy alike, through the core's own ``ThinkingStream`` — the
model's reasoning ends where the rule fires (the closing text counted as one token per word), the
load-aware budget reading the observer's recent class attainment. The signal rules (EAT, proxy,
RPDI) need a real model's logits and are refused by the runner.
Invariant: the engine only calls the public scheduler interface, in vLLM's order; it never looks
at a policy's decisions except through what vLLM itself would see (outputs, preemptions).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from meridian._core import Config, FinishedRequest, Meridian, ThinkingControl, ThinkingStream
from meridian.replay.profiles import Profile, StepBatch
from meridian.replay.traces import TraceRequest
from meridian.testing.harness import (
    ANSWER_IDS,
    EOS,
    THINK_END,
    THINK_START,
    TOOL_CALL,
    WORD_IDS,
    EngineSpec,
    build_scheduler,
    runner_output,
    sampled_tokens,
)
from meridian.testing.tiny_model import write_tiny_model
from meridian.vllm import convert

#: First token id of synthetic prompt text: above every marker of the tiny tokenizer, so prompt
#: text can never be mistaken for a reasoning or tool-call marker.
PROMPT_TOKEN_BASE = 1_000
#: Distinct synthetic prompt token ids.
PROMPT_TOKEN_RANGE = 100_000
#: Virtual time that passes when the scheduler holds requests but schedules nothing and nothing
#: is in flight (e.g. every running answer is paced): the engine polls again after this.
IDLE_TICK_MS = 1.0
#: vLLM's batch queue depth under async scheduling with one GPU (``batch_queue_size``).
BATCH_QUEUE_SIZE = 2


@dataclass(frozen=True)
class PolicySpec:
    """A scheduler to replay: stock vLLM or Meridian in one of its policy modes."""

    name: str
    description: str
    meridian_policy: str | None  # None: vLLM's own AsyncScheduler
    vllm_policy: str = "fcfs"


POLICIES: dict[str, PolicySpec] = {
    p.name: p
    for p in (
        PolicySpec("vllm-fcfs", "stock vLLM AsyncScheduler, first come first served", None, "fcfs"),
        PolicySpec("vllm-priority", "stock vLLM AsyncScheduler, priority = SLO class rank", None, "priority"),
        PolicySpec("meridian", "Meridian: dual queue, slack, step budget, admission reserve, tiers", "meridian"),
        PolicySpec("meridian-answer-first", "ablation: answering first, FCFS otherwise, nothing else", "answer_first"),
        PolicySpec("pascal", "reasoning first, answers paced at their TPOT target (PASCAL)", "pascal"),
    )
}


def policy_spec(name: str) -> PolicySpec:
    """The policy called ``name``, or a ``ValueError`` listing the known ones."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None


@dataclass
class Timeline:
    """What one request went through: its token timestamps and the observer's report."""

    req_id: str
    slo_class: str
    arrival_ms: float
    token_times_ms: array[float] = field(default_factory=lambda: array("d"))
    finish_reason: str | None = None
    report: FinishedRequest | None = None
    #: The thinking-control rule that ended the reasoning, if one did.
    thinking_stopped_by: str | None = None


@dataclass
class ReplayResult:
    """One policy's replay."""

    policy: str
    timelines: list[Timeline]
    num_steps: int
    clock_ms: float
    device_busy_ms: float
    num_rejected: int
    num_answer_preemption_alarms: int


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


def scheduler_config(meridian_config: dict[str, Any], spec: PolicySpec, profile: Profile) -> dict[str, Any]:
    """The ``meridian`` block a Meridian policy runs with: the operator's classes and knobs, the
    policy mode, and the profile's step-time seed unless the operator gave one."""
    config = dict(meridian_config)
    config["policy"] = spec.meridian_policy
    config.setdefault("step_time", meridian_seed_step_time(profile))
    return config


class ReplayEngine:
    """Replays ``requests`` through one scheduler; see the module docs."""

    def __init__(
        self,
        spec: PolicySpec,
        requests: Sequence[TraceRequest],
        profile: Profile,
        *,
        meridian_config: dict[str, Any],
        model_dir: Path,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        import json

        self.spec = spec
        self.profile = profile
        self.requests = sorted(requests, key=lambda r: r.arrival_ms)
        self.progress = progress or (lambda _n: None)
        self.observer_config = Config.from_json(json.dumps(meridian_config))
        self._classes = {name: self.observer_config.class_targets(name) for name in self.observer_config.class_names}
        self.now_ms = 0.0
        self.scheduler = self._build_scheduler(meridian_config, model_dir)
        if hasattr(self.scheduler, "clock_ms"):
            self.scheduler.clock_ms = lambda: self.now_ms
        self.observer = Meridian(
            self.observer_config,
            block_size=profile.block_size,
            max_num_batched_tokens=profile.max_num_batched_tokens,
            max_num_seqs=profile.max_num_seqs,
            reasoning_start_ids=[THINK_START],
            reasoning_end_ids=[THINK_END],
            tool_call_ids=[[TOOL_CALL]],
        )
        self.device_free_ms = 0.0
        self.device_busy_ms = 0.0
        self.batch_queue: deque[tuple[Any, dict[str, list[int]], float]] = deque()
        self._live: dict[str, tuple[TraceRequest, Timeline, int]] = {}
        self._controls = {name: self.observer_config.thinking_control(name) for name in self.observer_config.class_names}
        self._scripts: dict[str, ScriptedModel] = {}
        self._timelines: list[Timeline] = []
        self._num_rejected = 0
        self._alarms = 0
        self._num_steps = 0
        #: Passes of the busy loop so far (one ``step_with_batch_queue`` call each, plus idle
        #: jumps); arrivals are added at the top of a pass, as ``EngineCore`` does between steps.
        self.num_loop_passes = 0

    def _build_scheduler(self, meridian_config: dict[str, Any], model_dir: Path) -> Any:
        additional: dict[str, Any] = {}
        if self.spec.meridian_policy is None:
            from vllm.v1.core.sched.async_scheduler import AsyncScheduler

            scheduler_cls: type[Any] = AsyncScheduler
        else:
            from meridian.vllm import MeridianScheduler

            scheduler_cls = MeridianScheduler
            additional = {convert.CONFIG_KEY: scheduler_config(meridian_config, self.spec, self.profile)}
        engine = EngineSpec(
            model_dir=model_dir,
            num_blocks=self.profile.num_kv_blocks,
            block_size=self.profile.block_size,
            max_num_seqs=self.profile.max_num_seqs,
            max_num_batched_tokens=self.profile.max_num_batched_tokens,
            max_model_len=self.profile.max_model_len,
            policy=self.spec.vllm_policy,
            additional_config=additional,
        )
        return build_scheduler(scheduler_cls, engine)

    # ---- the engine loop ------------------------------------------------------------------

    def run(self) -> ReplayResult:
        """Runs until every admitted request has finished."""
        pending = deque(self.requests)
        while pending or self.scheduler.has_requests() or self.batch_queue:
            self.num_loop_passes += 1
            while pending and pending[0].arrival_ms <= self.now_ms:
                self._add(pending.popleft())
            if not self.scheduler.has_requests() and not self.batch_queue:
                if pending:
                    self.now_ms = max(self.now_ms, pending[0].arrival_ms)
                continue
            self._step()
        return ReplayResult(
            policy=self.spec.name,
            timelines=self._timelines,
            num_steps=self._num_steps,
            clock_ms=self.now_ms,
            device_busy_ms=self.device_busy_ms,
            num_rejected=self._num_rejected,
            num_answer_preemption_alarms=self._alarms,
        )

    def _step(self) -> None:
        """``EngineCore.step_with_batch_queue``: schedule ahead while the device is busy; apply the
        oldest batch once the queue is full or nothing more can be scheduled."""
        if self.scheduler.has_requests():
            output = self._schedule()
            executed = output.total_num_scheduled_tokens > 0
            finish_ms = self._execute(output) if executed else self.now_ms
            self.batch_queue.appendleft((output, self._model(output), finish_ms))
            if len(self.batch_queue) < BATCH_QUEUE_SIZE and (executed or self.scheduler.has_requests()):
                return
        if self.batch_queue:
            output, sampled, finish_ms = self.batch_queue.pop()
            self.now_ms = max(self.now_ms, finish_ms)
            self._apply(output, sampled)
            device_idle = all(queued.total_num_scheduled_tokens == 0 for queued, _, _ in self.batch_queue)
            if output.total_num_scheduled_tokens == 0 and device_idle and self.scheduler.has_requests():
                # Requests wait (e.g. paced answers) with the device idle: the real engine would
                # spin on the wall clock; the virtual one moves on a tick.
                self.now_ms = max(self.now_ms, self.device_free_ms) + IDLE_TICK_MS

    def _schedule(self) -> Any:
        # The observer "plans" the same running set only so that its preemption bookkeeping
        # (which phases were still running when a request lost its KV) applies to any scheduler.
        running = [self._live[r.request_id][2] for r in self.scheduler.running if r.request_id in self._live]
        self.observer.plan_step(self.now_ms, running, [], 0)
        output = self.scheduler.schedule()
        self._num_steps += 1
        for req_id in output.preempted_req_ids or ():
            self._observe_preemption(req_id)
        return output

    def _execute(self, output: Any) -> float:
        """Occupies the virtual device with the step; returns when its output is ready."""
        shape = convert.step_shape(output, self.scheduler.requests)
        step_ms = self.profile.step_time_ms(StepBatch(**shape))
        start_ms = max(self.now_ms, self.device_free_ms)
        self.device_free_ms = start_ms + step_ms
        self.device_busy_ms += step_ms
        return self.device_free_ms

    def _model(self, output: Any) -> dict[str, list[int]]:
        """The token each scheduled request samples: its trace script at the next position."""
        attainment = self.observer.recent_ttfat_attainment()
        return sampled_tokens(output, self.scheduler.requests, lambda req_id, pos: self._scripts[req_id].token(pos, attainment))

    def _apply(self, output: Any, sampled: dict[str, list[int]]) -> None:
        engine_outputs = self.scheduler.update_from_output(output, runner_output(sampled))
        handles: list[int] = []
        counts: list[int] = []
        flat: list[int] = []
        finished: list[tuple[str, str]] = []
        for batch in engine_outputs.values():
            for out in batch.outputs:
                entry = self._live.get(out.request_id)
                if entry is None:
                    continue
                if out.new_token_ids:
                    entry[1].token_times_ms.extend([self.now_ms] * len(out.new_token_ids))
                    handles.append(entry[2])
                    counts.append(len(out.new_token_ids))
                    flat.extend(out.new_token_ids)
                if out.finish_reason is not None:
                    finished.append((out.request_id, out.finish_reason.name.lower()))
        if handles:
            self.observer.on_tokens_batch(self.now_ms, handles, counts, flat)
        for req_id, reason in finished:
            self._finish(req_id, reason)

    # ---- requests -------------------------------------------------------------------------

    def _add(self, trace: TraceRequest) -> None:
        from vllm import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.request import Request

        # A request without a class gets the default; the runner has already rejected unknown ones.
        slo_class = trace.slo_class or self.observer_config.default_class
        timeline = Timeline(trace.req_id, slo_class, trace.arrival_ms)
        self._timelines.append(timeline)
        script = ScriptedModel(trace, slo_class, self._controls[slo_class])
        max_tokens = min(script.max_length, self.profile.max_model_len - trace.num_prompt_tokens)
        if max_tokens < 1:
            # vLLM's frontend rejects a prompt that leaves no room to generate: so does the replay.
            timeline.finish_reason = "rejected"
            self._num_rejected += 1
            self.progress(1)
            return
        init_none_hash(sha256)
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, extra_args={"meridian_class": slo_class})
        params.update_from_generation_config({}, EOS)
        rank = int(self._classes[slo_class]["rank"] or 0)
        prompt = prompt_token_ids(trace)
        request = Request(
            request_id=trace.req_id,
            prompt_token_ids=prompt,
            sampling_params=params,
            pooling_params=None,
            arrival_time=self.now_ms / 1000.0,
            priority=rank,
            block_hasher=get_request_block_hasher(self.profile.block_size, sha256),
        )
        handle = self.observer.add_request(trace.req_id, trace.arrival_ms, prompt, max_tokens, slo_class, rank)
        self._live[trace.req_id] = (trace, timeline, handle)
        self._scripts[trace.req_id] = script
        self.scheduler.add_request(request)

    def _observe_preemption(self, req_id: str) -> None:
        entry = self._live.get(req_id)
        if entry is not None:
            _phase, alarm = self.observer.on_preempted(self.now_ms, entry[2])
            self._alarms += alarm

    def _finish(self, req_id: str, reason: str) -> None:
        _trace, timeline, handle = self._live.pop(req_id)
        script = self._scripts.pop(req_id)
        timeline.thinking_stopped_by = script.stopped_by
        timeline.finish_reason = reason
        core_reason = {"stop": "stopped", "length": "length", "abort": "aborted"}.get(reason, "error")
        timeline.report = self.observer.finish(self.now_ms, handle, core_reason)
        self.progress(1)


# ---- the scripted "model" ---------------------------------------------------------------------


class ScriptedModel:
    """One request's scripted output, token by token, with thinking control applied: the trace's
    thinking until a rule fires (the core's ``ThinkingStream`` decides, as in the logits
    processor), the forced closing words and ``</think>``, then the trace's answer and EOS."""

    def __init__(self, trace: TraceRequest, slo_class: str, control: ThinkingControl) -> None:
        self.trace = trace
        self.slo_class = slo_class
        self.tokens: list[int] = []
        self.end_position: int | None = None
        self.stream: ThinkingStream | None = None
        closing_words = len((control.closing_text or "").split())
        if trace.num_think_tokens is not None and control.is_enabled():
            forced = [WORD_IDS[i % len(WORD_IDS)] for i in range(closing_words)] + [THINK_END]
            self.stream = ThinkingStream(
                control, [THINK_START], start_ids=[THINK_START], end_ids=[THINK_END], forced_ids=forced
            )
        #: Upper bound of the output length (a forced closing text may add its words).
        self.max_length = script_length(trace) + closing_words

    @property
    def stopped_by(self) -> str | None:
        return self.stream.fired_reason if self.stream is not None else None

    def token(self, position: int, attainment: dict[str, float]) -> int:
        """The token at output ``position`` (asked in order; a repeated position gets the same)."""
        while len(self.tokens) <= position:
            self.tokens.append(self._next(attainment))
        return self.tokens[position]

    def _next(self, attainment: dict[str, float]) -> int:
        position = len(self.tokens)
        stream = self.stream
        if stream is not None:
            stream.set_ttfat_attainment(attainment.get(self.slo_class, float("nan")))
            forced = stream.forced_token()
            token = forced if forced is not None else self._scripted(position)
            stream.on_token(token, "")
        else:
            token = self._scripted(position)
        if token == THINK_END and self.end_position is None:
            self.end_position = position
        return token

    def _scripted(self, position: int) -> int:
        trace = self.trace
        if trace.num_think_tokens is None:
            return script_token(trace, position)
        if self.end_position is None:
            return WORD_IDS[position % len(WORD_IDS)] if position < trace.num_think_tokens else THINK_END
        offset = position - self.end_position - 1
        return ANSWER_IDS[offset % len(ANSWER_IDS)] if offset < answer_tokens(trace) else EOS


def answer_tokens(trace: TraceRequest) -> int:
    """Visible answer tokens of ``trace`` (all of its output when it has no split)."""
    return trace.num_answer_tokens if trace.num_answer_tokens is not None else trace.num_output_tokens


def script_length(trace: TraceRequest) -> int:
    """Tokens the model generates: thinking, the reasoning-end token, the answer, EOS."""
    reasoning = trace.num_think_tokens + 1 if trace.num_think_tokens is not None else 0
    return reasoning + answer_tokens(trace) + 1


def script_token(trace: TraceRequest, position: int) -> int:
    """The token at output ``position``: thinking words, ``</think>``, answer tokens, EOS."""
    if trace.num_think_tokens is not None:
        if position < trace.num_think_tokens:
            return WORD_IDS[position % len(WORD_IDS)]
        if position == trace.num_think_tokens:
            return THINK_END
        position -= trace.num_think_tokens + 1
    if position < answer_tokens(trace):
        return ANSWER_IDS[position % len(ANSWER_IDS)]
    return EOS


def _mix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's finaliser: consecutive inputs give unrelated outputs."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    mixed: npt.NDArray[np.uint64] = x ^ (x >> np.uint64(31))
    return mixed


def prompt_token_ids(trace: TraceRequest) -> list[int]:
    """Synthetic prompt text whose blocks follow the trace's prefix block hashes: requests that
    share a hashed block share its tokens, so vLLM's own prefix cache sees the trace's reuse.
    A prompt without hashes gets text of its own. The prompt ends the way a chat template ends
    it: ``<think>`` opened for a reasoning request, an empty ``<think></think>`` otherwise."""
    n = trace.num_prompt_tokens
    if trace.prefix_block_hashes and trace.hash_block_size:
        size = trace.hash_block_size
        blocks = np.repeat(np.asarray(trace.prefix_block_hashes, dtype=np.uint64), size)[:n]
        offsets = np.tile(np.arange(size, dtype=np.uint64), len(trace.prefix_block_hashes))[:n]
    else:
        # Own text: a key no trace hash can take (hash ids are non-negative and far below 2**62).
        digest = hashlib.blake2b(trace.req_id.encode(), digest_size=7).digest()
        seed = np.uint64((1 << 62) + int.from_bytes(digest, "little"))
        blocks = np.full(n, seed, dtype=np.uint64)
        offsets = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        mixed = _mix64(blocks * np.uint64(0x9E3779B97F4A7C15) + offsets)
    tokens: list[int] = (mixed % np.uint64(PROMPT_TOKEN_RANGE) + np.uint64(PROMPT_TOKEN_BASE)).tolist()
    tail = [THINK_START] if trace.num_think_tokens is not None else [THINK_START, THINK_END]
    if n <= len(tail):
        return tail[-n:]
    return tokens[: n - len(tail)] + tail


def model_dir_for(profile: Profile, cache_dir: Path) -> Path:
    """A tokenizer/config folder vLLM's config classes accept for ``profile``'s context length
    (the replay never runs the model; vLLM reads its vocabulary and limits)."""
    return write_tiny_model(cache_dir / f"replay-model-{profile.max_model_len}", max_position_embeddings=profile.max_model_len)


def percentile_summary(values: Sequence[float]) -> dict[str, float | None]:
    """``{p50, p90, p99, mean}`` of ``values`` (``None`` each when empty)."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    arr = np.asarray(values, dtype=np.float64)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(arr.mean())}


__all__ = [
    "POLICIES",
    "PolicySpec",
    "ReplayEngine",
    "ReplayResult",
    "Timeline",
    "percentile_summary",
    "policy_spec",
    "prompt_token_ids",
    "script_token",
]
