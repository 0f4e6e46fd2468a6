"""The offline engine calls a scheduler exactly as vLLM's own engine loop does.

``OfflineEngine`` stands in for ``EngineCore.step_with_batch_queue`` under async scheduling, for
the replay, the scripted demo and the tests alike. This test checks that claim against vLLM
itself: one short trace runs twice through the same scheduler class, once under the offline
engine (as the replay drives it) and once under a real ``vllm.v1.engine.core.EngineCore`` whose
executor runs no model but answers every step with the replay's scripted tokens (computed the way
``OfflineEngine._model`` computes them, from the scheduler's requests right after scheduling). Both runs use a *recording* subclass of the scheduler under test that logs every
``add_request``, ``schedule`` (tokens per request, preemptions, finished ids, token budget) and
``update_from_output`` (which step's output, and each ``EngineCoreOutput``: tokens, finish
reason). The two logs must be identical, and the replay must step on exactly the loop passes on
which vLLM's loop has work.

Requests reach the ``EngineCore`` the way ``EngineCoreProc`` hands them over
(``preprocess_add_request`` then ``add_request``), at the same loop pass where the replay added
them. A Meridian scheduler reads a clock; the replay run records every reading (and which log
entry it preceded) and the ``EngineCore`` run plays the same readings back, failing if the
scheduler reads it at any other point: both runs see the same times at the same calls.
"""

from __future__ import annotations

import json
from collections import defaultdict
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from meridian._core import Config
from meridian.offline import engine as offline_engine
from meridian.offline.engine import EngineSpec, OfflineEngine, OfflineRequest, runner_output, sampled_tokens, vllm_config_for
from meridian.replay.policies import engine_spec, policy_spec, replay_engine, scheduler_class
from meridian.replay.profiles import Profile
from meridian.replay.traces import TraceRequest
from meridian.replay.workload import model_dir_for, offline_requests, script_token

pytestmark = pytest.mark.vllm

#: Tight targets, so Meridian's slack (and so its clock) shapes its decisions within the trace.
CONFIG: dict[str, Any] = {
    "classes": {
        "interactive": {"ttft_ms": 40.0, "ttfat_ms": 300.0, "answer_tpot_ms": 15.0, "rank": 0},
        "standard": {"ttft_ms": 150.0, "ttfat_ms": 900.0, "answer_tpot_ms": 40.0, "rank": 1},
    },
    "default_class": "standard",
    "priority_map": {"0": "standard"},
    # Every request is served: the trace is built to reach chunking, prefix hits and preemption.
    "overload": {"on_overload": "queue"},
}


def small_profile() -> Profile:
    """40 KV blocks of 16 (39 usable: vLLM keeps one as the null block), 64-token steps: long
    prompts are chunked and the trace below overflows the cache, so requests are preempted."""
    data = {
        "name": "test-small",
        "description": "a small KV cache and step budget, to force chunking and preemption",
        "model": "linear",
        "block_size": 16,
        "num_kv_blocks": 40,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 64,
        "max_model_len": 512,
        "base_ms": 10.0,
        "per_prefill_token_ms": 0.05,
        "per_decode_request_ms": 0.5,
        "per_context_token_ms": 0.0,
    }
    data["sources"] = {key: "test value" for key in data if key not in ("name", "description", "model")}
    return Profile.from_json(data)


def request(req_id: str, arrival_ms: float, prompt: int, think: int | None, answer: int, *,
            slo_class: str | None = None, hashes: tuple[int, ...] = ()) -> TraceRequest:
    return TraceRequest(
        req_id=req_id,
        arrival_ms=arrival_ms,
        num_prompt_tokens=prompt,
        num_output_tokens=(think or 0) + answer,
        num_think_tokens=think,
        num_answer_tokens=answer if think is not None else None,
        slo_class=slo_class,
        prefix_block_hashes=hashes,
        hash_block_size=32 if hashes else None,
    )


#: Staggered arrivals; requests arriving while others decode; prompts over the 64-token step
#: budget (chunked prefill); reasoning and plain requests; two classes; two prompts sharing a
#: cached prefix; more KV demand than the 39 usable blocks (preemption); an idle gap at the end.
TRACE = [
    request("a", 0.0, 40, 30, 10, slo_class="interactive"),
    request("b", 0.0, 24, None, 20),
    request("c", 15.0, 150, 20, 8, hashes=(1, 2, 3, 4, 5)),
    request("d", 35.0, 60, 40, 12, slo_class="interactive"),
    request("e", 50.0, 100, None, 30),
    request("f", 70.0, 80, 25, 15, slo_class="interactive"),
    request("g", 90.0, 130, 10, 6, hashes=(1, 2, 3, 9, 9)),
    request("h", 140.0, 30, 5, 5),
    request("i", 3_000.0, 20, 3, 3, slo_class="interactive"),
]


# ---- the recording scheduler --------------------------------------------------------------


def recording_class(base: type[Any], clock_tape: list[tuple[int, float]] | None = None) -> type[Any]:
    """``base`` with every engine-facing call logged to ``self.log``. A scheduler with a clock
    (``clock_ms``) records each reading in ``self.clock_log`` as ``(log position, value)``; with
    ``clock_tape`` it instead returns the tape's readings in order, checking each is read at the
    same log position as when it was recorded."""

    class Recording(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.log: list[tuple[Any, ...]] = []
            self.clock_log: list[tuple[int, float]] = []
            self.added: list[Any] = []
            self._num_schedules = 0
            self._inner_clock: Any = None
            super().__init__(*args, **kwargs)

        def add_request(self, request: Any) -> None:
            self.added.append(request)
            self.log.append(("add", request.request_id))
            super().add_request(request)

        def schedule(self, *args: Any, **kwargs: Any) -> Any:
            output = super().schedule(*args, **kwargs)
            output.recorded_step = self._num_schedules
            self.log.append((
                "schedule",
                self._num_schedules,
                list(output.num_scheduled_tokens.items()),
                sorted(output.preempted_req_ids or ()),
                sorted(output.finished_req_ids),
                self.max_num_scheduled_tokens,
            ))
            self._num_schedules += 1
            return output

        def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
            outputs = super().update_from_output(scheduler_output, model_runner_output)
            self.log.append((
                "update",
                scheduler_output.recorded_step,
                [
                    (
                        out.request_id,
                        list(out.new_token_ids),
                        out.finish_reason.name if out.finish_reason is not None else None,
                        out.stop_reason,
                        getattr(out.prefill_stats, "num_cached_tokens", None),
                    )
                    for client in sorted(outputs)
                    for out in outputs[client].outputs
                ],
            ))
            return outputs

    from meridian.vllm import MeridianScheduler

    if issubclass(base, MeridianScheduler):
        tape = iter(clock_tape) if clock_tape is not None else None

        def _get(self: Any) -> Any:
            if tape is not None:
                def replayed() -> float:
                    entry = next(tape, None)
                    assert entry is not None, f"clock read before log entry {len(self.log)}: the replay read it no more"
                    position, value = entry
                    assert position == len(self.log), (
                        f"clock read before log entry {len(self.log)}, recorded before entry {position}"
                    )
                    return value
                return replayed

            def recorded() -> float:
                value = self._inner_clock()
                self.clock_log.append((len(self.log), value))
                return value
            return recorded

        def _set(self: Any, clock: Any) -> None:
            self._inner_clock = clock

        Recording.clock_ms = property(_get, _set)  # type: ignore[attr-defined]
        Recording.tape_left = lambda self: sum(1 for _ in tape) if tape is not None else 0  # type: ignore[attr-defined]
    Recording.__name__ = Recording.__qualname__ = f"Recording{base.__name__}"
    return Recording


# ---- the replay run ------------------------------------------------------------------------


class TracedReplay(OfflineEngine):
    """The offline engine, noting at which loop pass it added each request and which passes
    stepped the engine (the rest jump idle time)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.adds: list[tuple[int, str]] = []
        self.stepped_passes: list[int] = []
        super().__init__(*args, **kwargs)

    def _add(self, offline: OfflineRequest) -> None:
        self.adds.append((self.num_loop_passes, offline.req_id))
        super()._add(offline)

    def _step(self) -> None:
        self.stepped_passes.append(self.num_loop_passes)
        super()._step()


def run_replay(
    policy: str, tmp_path: Path, batch_queue_size: int | None = None
) -> tuple[TracedReplay, EngineSpec, type[Any]]:
    """Replays ``TRACE`` as the replay does, under a recording subclass of the policy's
    scheduler; returns the engine, the ``EngineSpec`` its scheduler was built from and the
    policy's scheduler class."""
    profile = small_profile()
    spec = policy_spec(policy)
    model_dir = model_dir_for(profile, tmp_path)
    base_cls = scheduler_class(spec)
    requests = offline_requests(TRACE, profile, Config.from_json(json.dumps(CONFIG)))
    engine = replay_engine(
        spec, requests, profile, meridian_config=CONFIG, model_dir=model_dir,
        scheduler_cls=recording_class(base_cls), engine_cls=TracedReplay, batch_queue_size=batch_queue_size,
    )
    assert isinstance(engine, TracedReplay)
    engine.run()
    return engine, engine_spec(spec, profile, CONFIG, model_dir), base_cls


# ---- the EngineCore run --------------------------------------------------------------------


def make_scripted_executor(num_blocks: int, block_size: int) -> type[Any]:
    """A vLLM ``Executor`` that runs no model: one full-attention layer sized to ``num_blocks``
    KV blocks, and steps answered with the replay's scripted tokens."""
    import torch
    from vllm.v1.executor.abstract import Executor
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    layer_spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)

    def done(value: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(value)
        return future

    class ScriptedExecutor(Executor):
        #: Set once the EngineCore exists: the scheduler whose requests the "model" reads, and
        #: the trace of each request.
        scheduler: Any = None
        traces: dict[str, TraceRequest] = {}

        def _init_executor(self) -> None:
            self.rpc_calls: list[str] = []
            self._sampled: dict[str, list[int]] | None = None

        @classmethod
        def supports_async_scheduling(cls) -> bool:
            return True

        def get_kv_cache_specs(self) -> list[dict[str, Any]]:
            return [{"layer": layer_spec}]

        def determine_available_memory(self) -> list[int]:
            return [num_blocks * layer_spec.page_size_bytes]

        def initialize_from_config(self, kv_cache_configs: list[Any]) -> None:
            (config,) = kv_cache_configs
            assert config.num_blocks == num_blocks

        def collective_rpc(self, method: Any, timeout: float | None = None, args: tuple = (),
                           kwargs: dict | None = None, non_block: bool = False) -> Any:
            name = method if isinstance(method, str) else getattr(method, "__name__", repr(method))
            self.rpc_calls.append(name)
            replies = {
                "get_supported_kv_cache_layouts": [["NHD"]],
                "set_kv_cache_layout": [None],
                "compile_or_warm_up_model": [],
                "shutdown": [None],
            }
            if name not in replies:
                raise NotImplementedError(f"scripted executor: unexpected collective_rpc {name!r}")
            return done(replies[name]) if non_block else replies[name]

        def execute_model(self, scheduler_output: Any, non_block: bool = False) -> Any:
            assert self._sampled is None, "execute_model twice without sample_tokens"
            # OfflineEngine._model's tokens: read right after scheduling.
            traces = self.traces
            sampled = sampled_tokens(
                scheduler_output, self.scheduler.requests, lambda req_id, pos: script_token(traces[req_id], pos)
            )
            if scheduler_output.total_num_scheduled_tokens == 0:
                result: Any = runner_output(sampled)  # nothing to sample: the output is final
            else:
                self._sampled, result = sampled, None  # sample_tokens follows
            return done(result) if non_block else result

        def sample_tokens(self, grammar_output: Any, non_block: bool = False) -> Any:
            assert self._sampled is not None, "sample_tokens without execute_model"
            result = runner_output(self._sampled)
            self._sampled = None
            return done(result) if non_block else result

        def check_health(self) -> None:
            pass

    return ScriptedExecutor


def engine_core_config(spec: EngineSpec, scheduler_cls: type[Any]) -> Any:
    """``harness.build_scheduler``'s VllmConfig recipe for ``spec``, naming ``scheduler_cls``
    (async scheduling back on, which gives EngineCore its batch queue of two)."""
    return vllm_config_for(spec, scheduler_cls)


def run_engine_core(replay: TracedReplay, spec: EngineSpec, base_cls: type[Any]) -> tuple[Any, list[int]]:
    """Runs the replay's requests through a real ``EngineCore`` with vLLM's own step function,
    adding each at the loop pass where the replay added it; returns the core and the passes on
    which it stepped."""
    import gc

    import vllm.envs as vllm_envs
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.core import EngineCore

    replayed = replay.scheduler
    scheduler_cls = recording_class(base_cls, clock_tape=list(replayed.clock_log) if replayed.clock_log else None)
    executor_cls = make_scripted_executor(spec.num_blocks, spec.block_size)
    vllm_config = engine_core_config(spec, scheduler_cls)
    assert vllm_config.max_concurrent_batches == offline_engine.BATCH_QUEUE_SIZE == 2
    try:
        core = EngineCore(vllm_config, executor_cls, log_stats=True)
    finally:
        # EngineCore's init freezes the GC heap and caches vLLM's environment variables, both
        # process-wide: undo them, or later tests in this process would see stale settings.
        vllm_envs.disable_envs_cache()
        gc.unfreeze()
    assert type(core.scheduler) is scheduler_cls
    assert core.step_fn == core.step_with_batch_queue
    assert core.batch_queue_size == 2
    assert core.model_executor.rpc_calls == ["get_supported_kv_cache_layouts", "set_kv_cache_layout",
                                             "compile_or_warm_up_model"]
    # Same scheduler settings as the replay's scheduler, built by the harness.
    ours = core.scheduler
    assert ours.kv_cache_manager.block_pool.num_gpu_blocks == replayed.kv_cache_manager.block_pool.num_gpu_blocks
    assert ours.block_size == replayed.block_size
    assert ours.max_num_running_reqs == replayed.max_num_running_reqs
    assert ours.max_num_scheduled_tokens == replayed.max_num_scheduled_tokens
    assert ours.policy == replayed.policy
    assert ours.scheduler_config.enable_chunked_prefill and ours.cache_config.enable_prefix_caching
    core.model_executor.scheduler = core.scheduler
    core.model_executor.traces = {t.req_id: t for t in TRACE}

    requests = {r.request_id: r for r in replayed.added}
    adds: dict[int, list[str]] = defaultdict(list)
    for loop_pass, req_id in replay.adds:
        adds[loop_pass].append(req_id)
    stepped: list[int] = []
    loop_pass = 0
    while adds or core.scheduler.has_requests() or core.batch_queue:
        loop_pass += 1
        if loop_pass > 10 * replay.num_loop_passes:
            raise RuntimeError("vLLM's loop runs on far past the replay's")
        # EngineCoreProc._process_input_queue, then _process_engine_step when there is work.
        for req_id in adds.pop(loop_pass, ()):
            original = requests[req_id]
            core_request = EngineCoreRequest(
                request_id=req_id,
                prompt_token_ids=list(original.prompt_token_ids),
                mm_features=None,
                sampling_params=original.sampling_params.clone(),
                pooling_params=None,
                arrival_time=original.arrival_time,
                lora_request=None,
                cache_salt=None,
                data_parallel_rank=None,
                priority=original.priority,
            )
            core.add_request(*core.preprocess_add_request(core_request))
        if not (core.scheduler.has_requests() or core.batch_queue):
            continue  # EngineCoreProc would block on its input queue here
        stepped.append(loop_pass)
        _outputs, model_executed = core.step_fn()
        core.post_step(model_executed)
    core.shutdown()
    return core, stepped


def first_difference(ours: list[Any], theirs: list[Any]) -> str:
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            context = "\n".join(f"  [{j}] replay {ours[j]!r}\n  [{j}] vllm   {theirs[j]!r}"
                                for j in range(max(0, i - 3), min(len(ours), len(theirs), i + 2)))
            return f"first difference at entry {i}:\n{context}"
    return f"lengths differ: replay {len(ours)} entries, vLLM {len(theirs)}"


def compare(policy: str, tmp_path: Path) -> tuple[TracedReplay, Any, list[int]]:
    replay, spec, base_cls = run_replay(policy, tmp_path)
    core, stepped = run_engine_core(replay, spec, base_cls)
    return replay, core, stepped


@pytest.mark.parametrize("policy", ["vllm-fcfs", "meridian"])
def test_the_offline_engine_calls_the_scheduler_exactly_as_engine_core_does(policy: str, tmp_path: Path) -> None:
    replay, core, stepped = compare(policy, tmp_path)
    ours, theirs = replay.scheduler.log, core.scheduler.log
    assert ours == theirs, first_difference(ours, theirs)
    assert replay.stepped_passes == stepped, "the replay steps on exactly the passes vLLM's loop has work"
    if replay.scheduler.clock_log:
        assert core.scheduler.tape_left() == 0, "vLLM's loop read the clock fewer times than the replay"

    # The trace exercised what it is meant to (the logs being equal, either one will do).
    schedules = [e for e in ours if e[0] == "schedule"]
    updates = [e for e in ours if e[0] == "update"]
    finished = {out[0]: out[2] for e in updates for out in e[2] if out[2] is not None}
    assert finished == {t.req_id: "STOP" for t in TRACE}, "every request ends with EOS"
    assert any(n > 0 and n < t.num_prompt_tokens for e in schedules for (r, n) in e[2]
               for t in TRACE if t.req_id == r and t.num_prompt_tokens > 64), "a prompt is chunked"
    assert len(stepped) < replay.num_loop_passes, "the replay jumped idle time at least once"
    first_token = {}
    for i, e in enumerate(ours):
        for out in e[2] if e[0] == "update" else ():
            if out[1]:
                first_token.setdefault(out[0], i)
    last_update = {out[0]: i for i, e in enumerate(ours) if e[0] == "update" for out in e[2]}
    assert any(first_token[r] < i < last_update[r] for i, e in enumerate(ours) if e[0] == "add" for r in first_token
               if r != e[1]), "a request arrives while another decodes"
    cached = [out[4] for e in updates for out in e[2] if out[4]]
    assert cached, "a prompt reused a cached prefix"
    if policy == "vllm-fcfs":
        assert any(e[3] for e in schedules), "the KV cache overflows: a request is preempted"
    if policy == "meridian":
        assert len(replay.scheduler.clock_log) > len(schedules), "Meridian reads the clock"


def test_the_comparison_catches_a_synchronous_engine(tmp_path: Path) -> None:
    # With a batch queue of one, the engine applies each step's output before scheduling the
    # next (vLLM's synchronous `step`): not what EngineCore does under async scheduling.
    replay, spec, base_cls = run_replay("vllm-fcfs", tmp_path, batch_queue_size=1)
    core, _stepped = run_engine_core(replay, spec, base_cls)
    assert replay.scheduler.log != core.scheduler.log
