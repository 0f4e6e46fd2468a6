"""Drive real vLLM schedulers offline with scripted model outputs.

``build_scheduler`` builds any vLLM scheduler class (stock ``AsyncScheduler``/``Scheduler`` or
``MeridianScheduler``) from vLLM's own config classes, with a local model folder and no model
hub (the recipe of vLLM's ``tests/v1/core/utils.py``). ``ScriptedEngine`` then runs it through
the same call sequence as vLLM's ``EngineCore`` — ``step_with_batch_queue`` under async
scheduling (step N+1 is scheduled before step N's output is applied), ``step`` otherwise — with a
"model" that emits each request's scripted tokens by position, the way greedy decoding would.
Time is virtual: each processed step advances the clock by ``step_time_ms(output)``.

Metrics come from one Meridian core used as a pure observer (no plans), fed the same token
streams for every scheduler, so stock and Meridian runs are measured by one definition
(DESIGN §4). Invariant: the harness never reaches into a scheduler's policy; it only calls the
public scheduler interface, exactly as the engine does.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meridian._core import Config, FinishedRequest, Meridian
from meridian.testing.tiny_model import vocabulary, write_tiny_model

#: Tokens of the tiny tokenizer the scripted scenarios use.
VOCAB = vocabulary()
THINK_START = VOCAB["<think>"]
THINK_END = VOCAB["</think>"]
TOOL_CALL = VOCAB["<tool_call>"]
EOS = VOCAB["<|im_end|>"]
WORD_IDS = [VOCAB[w] for w in ("count", "down", "next", "step", "ok", "so", "wait", "check")]
ANSWER_IDS = [VOCAB[str(i)] for i in range(10)]


def offline_environment(cache_dir: str | Path) -> None:
    """Points vLLM's caches into ``cache_dir`` and keeps it off the network and off Triton."""
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache / "vllm"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@dataclass
class EngineSpec:
    """The vLLM engine settings a scripted run uses."""

    model_dir: Path
    num_blocks: int = 49
    block_size: int = 16
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 256
    max_model_len: int = 2048
    reasoning_parser: str | None = "deepseek_r1"
    async_scheduling: bool = True
    enable_prefix_caching: bool = True
    policy: str = "fcfs"
    additional_config: dict[str, Any] = field(default_factory=dict)


def vllm_config_for(spec: EngineSpec, scheduler_cls: type[Any] | None = None) -> Any:
    """The ``VllmConfig`` an engine with ``spec`` runs under (``scheduler_cls`` recorded in it
    for ``EngineCore``, which builds its scheduler from the config)."""
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ReasoningConfig, SchedulerConfig, VllmConfig

    model_config = ModelConfig(
        model=str(spec.model_dir), max_model_len=spec.max_model_len, dtype="float32", seed=0
    )
    extra = {"scheduler_cls": scheduler_cls} if scheduler_cls is not None else {}
    scheduler_config = SchedulerConfig(
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_model_len=spec.max_model_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        async_scheduling=spec.async_scheduling,
        policy=spec.policy,
        **extra,
    )
    cache_config = CacheConfig(block_size=spec.block_size, enable_prefix_caching=spec.enable_prefix_caching)
    reasoning_config = ReasoningConfig(reasoning_parser=spec.reasoning_parser) if spec.reasoning_parser else None
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        reasoning_config=reasoning_config,
        device_config=DeviceConfig(device="cpu"),
        additional_config=spec.additional_config,
    )
    # vLLM's CPU platform turns async scheduling off ("not required on CPU"); the engines here
    # stand in for a GPU engine, whose batch queue of two is what they model.
    vllm_config.scheduler_config.async_scheduling = spec.async_scheduling
    return vllm_config


def build_scheduler(scheduler_cls: type[Any], spec: EngineSpec) -> Any:
    """Builds ``scheduler_cls`` the way ``EngineCore`` does, with ``spec.num_blocks`` KV blocks."""
    import torch
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    vllm_config = vllm_config_for(spec)
    cache_config = vllm_config.cache_config
    kv_cache_config = KVCacheConfig(
        num_blocks=spec.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(block_size=spec.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32),
            )
        ],
    )
    cache_config.num_gpu_blocks = spec.num_blocks
    register_all_kvcache_specs(vllm_config)
    return scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=spec.block_size,
        log_stats=True,
    )


@dataclass(frozen=True)
class ScriptedRequest:
    """A request and the exact tokens the "model" will produce for it (ending in EOS)."""

    req_id: str
    arrival_step: int
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    slo_class: str | None = None
    priority: int = 0

    @property
    def num_think_tokens(self) -> int:
        """Reasoning tokens including the end marker (0 when the script has none)."""
        try:
            return self.output_token_ids.index(THINK_END) + 1
        except ValueError:
            return 0


def runner_output(sampled: dict[str, list[int]]) -> Any:
    """The ``ModelRunnerOutput`` a model runner returns for ``sampled`` (tokens per request)."""
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(sampled)
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
        sampled_token_ids=[sampled[req_id] for req_id in req_ids],
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
    )


def sampled_tokens(output: Any, requests: dict[str, Any], token_at: Callable[[str, int], int]) -> dict[str, list[int]]:
    """What greedy decoding samples for a scheduled step, read right after ``schedule()``: one
    token per request whose prompt is complete — ``token_at(req_id, output position)`` — and
    nothing for a prompt chunk."""
    sampled: dict[str, list[int]] = {}
    for req_id in output.num_scheduled_tokens:
        request = requests[req_id]
        if request.is_prefill_chunk:
            sampled[req_id] = []
            continue
        sampled[req_id] = [token_at(req_id, request.num_computed_tokens - request.num_prompt_tokens)]
    return sampled


def reasoning_script(num_think: int, num_answer: int, *, seed: int = 0, tool_call: bool = False) -> list[int]:
    """``num_think`` reasoning words, ``</think>``, ``num_answer`` answer tokens, EOS."""
    think = [WORD_IDS[(seed + i) % len(WORD_IDS)] for i in range(num_think)]
    answer = [ANSWER_IDS[(seed * 7 + i) % len(ANSWER_IDS)] for i in range(num_answer)]
    if tool_call and answer:
        answer[0] = TOOL_CALL
    return think + [THINK_END] + answer + [EOS]


@dataclass
class RequestResult:
    """What one request got."""

    req_id: str
    output_token_ids: list[int]
    finish_reason: str | None
    report: FinishedRequest | None


@dataclass
class RunResult:
    """Everything a scripted run observed."""

    requests: dict[str, RequestResult]
    num_steps: int
    clock_ms: float
    num_answer_preemption_alarms: int
    scheduled_tokens_per_step: list[int]
    token_budget_per_step: list[int]
    max_num_free_blocks: int
    final_num_free_blocks: int

    @property
    def reports(self) -> list[FinishedRequest]:
        return [r.report for r in self.requests.values() if r.report is not None]


class ScriptedEngine:
    """Runs a scheduler like ``EngineCore`` does, with scripted outputs and a virtual clock."""

    def __init__(
        self,
        scheduler: Any,
        requests: Sequence[ScriptedRequest],
        *,
        observer_config: Config | None = None,
        step_time_ms: Callable[[Any], float] | None = None,
        max_steps: int = 100_000,
    ) -> None:
        self.scheduler = scheduler
        self.requests = sorted(requests, key=lambda r: (r.arrival_step, r.req_id))
        self.scripts = {r.req_id: r for r in self.requests}
        self.step_time_ms = step_time_ms or (lambda _output: 1.0)
        self.max_steps = max_steps
        self.now_ms = 0.0
        if hasattr(scheduler, "clock_ms"):
            scheduler.clock_ms = lambda: self.now_ms
        self.async_mode = bool(scheduler.scheduler_config.async_scheduling)
        self.batch_queue: deque[tuple[Any, Any]] = deque()
        markers = _observer_markers(scheduler)
        observer_config = observer_config or Config.from_json("{}")
        self._observer_classes = set(observer_config.class_names)
        self.observer = Meridian(
            observer_config,
            block_size=scheduler.block_size,
            max_num_batched_tokens=scheduler.scheduler_config.max_num_batched_tokens,
            max_num_seqs=scheduler.scheduler_config.max_num_seqs,
            reasoning_start_ids=markers[0],
            reasoning_end_ids=markers[1],
            tool_call_ids=markers[2],
        )
        self._handles: dict[str, int] = {}
        self._tokens: dict[str, list[int]] = {}
        self._finish: dict[str, str] = {}
        self._reports: dict[str, FinishedRequest] = {}
        self._alarms = 0
        self._scheduled: list[int] = []
        self._budgets: list[int] = []

    # ---- the engine loop ------------------------------------------------------------------

    def run(self) -> RunResult:
        """Runs until every request finished; raises if ``max_steps`` pass first."""
        pending = deque(self.requests)
        steps = 0
        max_free = self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        while pending or self.scheduler.has_requests() or self.batch_queue:
            while pending and pending[0].arrival_step <= steps:
                self._add(pending.popleft())
            if not self.scheduler.has_requests() and not self.batch_queue:
                steps += 1  # idle until the next arrival
                self.now_ms += 1.0
                continue
            self._step()
            steps += 1
            if steps > self.max_steps:
                raise RuntimeError(f"scripted run did not finish within {self.max_steps} steps")
        return RunResult(
            requests={
                r.req_id: RequestResult(
                    r.req_id, self._tokens.get(r.req_id, []), self._finish.get(r.req_id), self._reports.get(r.req_id)
                )
                for r in self.requests
            },
            num_steps=steps,
            clock_ms=self.now_ms,
            num_answer_preemption_alarms=self._alarms,
            scheduled_tokens_per_step=self._scheduled,
            token_budget_per_step=self._budgets,
            max_num_free_blocks=max_free,
            final_num_free_blocks=self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
        )

    def _step(self) -> None:
        if not self.async_mode:
            output = self._schedule()
            self._apply(output, self._model(output))
            return
        # EngineCore.step_with_batch_queue with a queue of two: schedule ahead while the
        # previous batch "runs", apply the oldest output once the queue is full or idle.
        if self.scheduler.has_requests():
            output = self._schedule()
            self.batch_queue.appendleft((output, self._model(output)))
            executed = output.total_num_scheduled_tokens > 0
            if len(self.batch_queue) < 2 and (executed or self.scheduler.has_requests()):
                return
        if self.batch_queue:
            output, sampled = self.batch_queue.pop()
            self._apply(output, sampled)

    def _schedule(self) -> Any:
        # The observer "plans" the same running set only so that its preemption bookkeeping
        # (which phases were still running when a request lost its KV) applies to any scheduler.
        running = [self._handles[r.request_id] for r in self.scheduler.running if r.request_id in self._handles]
        self.observer.plan_step(self.now_ms, running, [], 0)
        output = self.scheduler.schedule()
        self._scheduled.append(output.total_num_scheduled_tokens)
        self._budgets.append(self.scheduler.max_num_scheduled_tokens)
        for req_id in output.preempted_req_ids or ():
            self._observe_preemption(req_id)
        return output

    def _model(self, output: Any) -> dict[str, list[int]]:
        """The token each scheduled request samples: its script at the next output position."""

        def token_at(req_id: str, position: int) -> int:
            script = self.scripts[req_id].output_token_ids
            return script[position] if position < len(script) else EOS

        return sampled_tokens(output, self.scheduler.requests, token_at)

    def _apply(self, output: Any, sampled: dict[str, list[int]]) -> None:
        self.now_ms += self.step_time_ms(output)
        engine_outputs = self.scheduler.update_from_output(output, runner_output(sampled))
        for batch in engine_outputs.values():
            for out in batch.outputs:
                self._observe_output(out)

    # ---- observation ----------------------------------------------------------------------

    def _add(self, scripted: ScriptedRequest) -> None:
        from vllm import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.request import Request

        init_none_hash(sha256)
        extra = {"meridian_class": scripted.slo_class} if scripted.slo_class is not None else None
        params = SamplingParams(max_tokens=len(scripted.output_token_ids) + 8, temperature=0.0, extra_args=extra)
        params.update_from_generation_config({}, EOS)
        request = Request(
            request_id=scripted.req_id,
            prompt_token_ids=list(scripted.prompt_token_ids),
            sampling_params=params,
            pooling_params=None,
            arrival_time=self.now_ms / 1000.0,
            priority=scripted.priority,
            block_hasher=get_request_block_hasher(self.scheduler.block_size, sha256),
        )
        self._handles[scripted.req_id] = self.observer.add_request(
            scripted.req_id, self.now_ms, list(scripted.prompt_token_ids), params.max_tokens,
            scripted.slo_class if scripted.slo_class in self._observer_classes else None,
            max(-(2**62), min(2**62, scripted.priority)),  # the observer only measures; keep it in range
        )
        self._tokens[scripted.req_id] = []
        self.scheduler.add_request(request)

    def _observe_preemption(self, req_id: str) -> None:
        handle = self._handles.get(req_id)
        if handle is not None:
            _phase, alarm = self.observer.on_preempted(self.now_ms, handle)
            self._alarms += alarm

    def _observe_output(self, out: Any) -> None:
        handle = self._handles.get(out.request_id)
        if handle is None:
            return
        if out.new_token_ids:
            self._tokens[out.request_id].extend(out.new_token_ids)
            self.observer.on_tokens_batch(self.now_ms, [handle], [len(out.new_token_ids)], list(out.new_token_ids))
        if out.finish_reason is not None:
            reason = out.finish_reason.name.lower()
            self._finish[out.request_id] = reason
            core_reason = {"stop": "stopped", "length": "length", "abort": "aborted"}.get(reason, "error")
            self._reports[out.request_id] = self.observer.finish(self.now_ms, handle, core_reason)
            del self._handles[out.request_id]


def _observer_markers(scheduler: Any) -> tuple[list[int], list[int], list[list[int]]]:
    reasoning = scheduler.vllm_config.reasoning_config
    if reasoning is None or not reasoning.enabled:
        return [], [], []
    return (
        list(reasoning.reasoning_start_token_ids or []),
        list(reasoning.natural_reasoning_end_token_ids or []),
        [[TOOL_CALL]],
    )


def tiny_model_dir(cache_dir: str | Path) -> Path:
    """The tiny model folder under ``cache_dir`` (rewritten each call: a few ms, and a cache left
    by an older version can never go stale)."""
    return write_tiny_model(Path(cache_dir) / "tiny-reasoner")
