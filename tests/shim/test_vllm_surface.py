"""The private vLLM surface the shim relies on, checked against the installed vLLM.

vLLM's scheduler interface is not public. These checks pin down each assumption the shim makes
(read from the 0.32.0, 0.33.0 and 0.34.0 sources), so a vLLM upgrade that breaks one fails here,
by name, instead of silently changing behaviour.
"""

from __future__ import annotations

import inspect

import pytest

pytestmark = pytest.mark.vllm


def source(obj: object) -> str:
    return inspect.getsource(obj)  # type: ignore[arg-type]


def vllm_minor() -> tuple[int, int]:
    from vllm import __version__

    major, minor = __version__.split(".")[:2]
    return int(major), int(minor)


def test_schedule_reads_the_levers_meridian_sets() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    body = source(Scheduler.schedule)
    # The per-step budget is read from this attribute at the start of every step.
    assert "token_budget = self.max_num_scheduled_tokens" in body
    # Under FCFS the preemption victim is the last running request.
    assert "self.running[-1]" in body
    # The waiting loop only asks the queue for truthiness, peek and pop.
    assert "if not request_queue" in body
    assert "request_queue.peek_request()" in body
    if vllm_minor() < (0, 34):
        assert "request_queue = self.waiting" in body
    else:
        # 0.34 picks between `waiting` and the async KV-load queue, `async_kv_waiting`, by its
        # `_next_waiting_queue` (which MeridianScheduler overrides with the core's order), and
        # reads `async_kv_waiting` alone once no running slot or token budget is left.
        assert "request_queue = self._next_waiting_queue(take_async_kv)" in body
        assert "request_queue = self.async_kv_waiting" in body
        params = list(inspect.signature(Scheduler._next_waiting_queue).parameters)
        assert params == ["self", "take_async_kv"], params
        assert "self._admits_inflight_kv_load()" in body
        # What MeridianScheduler._num_inflight_kv_loads counts, as vLLM counts it against the cap.
        cap_check = source(Scheduler._admits_inflight_kv_load)
        for term in ("self._kv_fetch_counts[KV_FETCH_IN_PROGRESS]", "self._kv_fetch_counts[KV_FETCH_COMPLETED_WAITING]",
                     "len(self._aborted_kv_loads)"):
            assert term in cap_check, term
        from vllm.v1.metrics.stats import KV_FETCH_COMPLETED_WAITING, KV_FETCH_IN_PROGRESS

        assert (KV_FETCH_IN_PROGRESS, KV_FETCH_COMPLETED_WAITING) == ("in_progress", "completed_waiting")
        # A request the connector may load asynchronously is queued there (the plan's async part).
        assert "self.async_kv_waiting.add_request(request)" in source(Scheduler._enqueue_waiting_request)


def test_preemption_and_free_hooks_exist() -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler

    assert "preempted_req_ids" in SchedulerOutput.__dataclass_fields__
    params = inspect.signature(Scheduler._free_request).parameters
    assert list(params)[:2] == ["self", "request"]
    assert "self._free_blocks(request)" in source(Scheduler._free_request)
    assert "evict_blocks" in dir(KVCacheManager) and "get_block_ids" in dir(KVCacheManager)
    # Blocks without a hash go to the front of the free queue: what makes dropping hashes evict first.
    from vllm.v1.core.block_pool import BlockPool

    free_blocks = source(BlockPool.free_blocks)
    assert "prepend_n(blocks_to_evict_first)" in free_blocks


def test_reasoning_config_exposes_marker_ids() -> None:
    from vllm.config import ReasoningConfig

    for name in ("enabled", "reasoning_start_token_ids", "natural_reasoning_end_token_ids"):
        assert isinstance(getattr(ReasoningConfig, name), property), name


def test_request_queue_interface_is_what_the_waiting_queue_implements() -> None:
    from vllm.v1.core.sched.request_queue import RequestQueue

    from meridian.vllm.queue import MeridianWaitingQueue

    abstract = set(RequestQueue.__abstractmethods__)
    assert abstract <= set(vars(MeridianWaitingQueue)), abstract - set(vars(MeridianWaitingQueue))


def test_scheduler_cls_flag_resolves_to_meridian() -> None:
    from vllm.config import SchedulerConfig

    from meridian.vllm import MeridianScheduler

    config = SchedulerConfig(
        max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256, is_encoder_decoder=False,
        scheduler_cls="meridian.vllm.MeridianScheduler",
    )
    assert config.get_scheduler_cls() is MeridianScheduler


def test_the_tier_cache_policy_interface_never_reusable_first_lru_overrides() -> None:
    """``NeverReusableFirstLRU`` (``meridian.vllm.kvtier``) subclasses vLLM's ``LRUCachePolicy``
    and overrides these methods; it writes ``_ranks`` and pushes to the evictable heap. vLLM 0.33
    added the storing request's context to ``insert`` and made the ranks ``(rank, -position)``
    tuples (0.32: ints; 0.34 as 0.33); the subclass follows whichever is installed."""
    from vllm import __version__
    from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

    insert = list(inspect.signature(LRUCachePolicy.insert).parameters)
    expected = ["self", "key", "chunk", "req_context"] if vllm_minor() >= (0, 33) else ["self", "key", "chunk"]
    assert insert == expected, (__version__, insert)
    for name in ("on_store_miss", "mark_evictable", "mark_non_evictable", "remove", "clear", "on_request_finished",
                 "_push_evictable", "evict"):
        assert callable(getattr(LRUCachePolicy, name)), name
    finished = list(inspect.signature(LRUCachePolicy.on_request_finished).parameters)
    assert finished == ["self", "key_groups", "insertion_only_keys", "reused_keys", "req_context"], finished
    assert "self._ranks[key]" in source(LRUCachePolicy.insert)


def test_model_runner_v2_processor_interface_is_what_the_thinking_processor_reads() -> None:
    import dataclasses
    import inspect

    from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcessor, LogitsProcRequestState

    assert {"all_token_ids", "prompt_len", "prefill_len", "device"} <= {f.name for f in dataclasses.fields(LogitsProcRequestState)}
    assert {"idx_mapping_np", "seq_lens_upper_bound_np"} <= {f.name for f in dataclasses.fields(LogitsContext)}
    assert list(inspect.signature(LogitsProcessor.__init__).parameters) == ["self", "vllm_config", "req_states"]
    assert list(inspect.signature(LogitsProcessor.add_request).parameters) == ["self", "req_idx", "sampling_params"]
    assert list(inspect.signature(LogitsProcessor.apply).parameters) == ["self", "logits", "ctx"]
    assert LogitsProcessor.__abstractmethods__ == frozenset({"apply"})


def test_sampling_params_carry_vllms_thinking_budget() -> None:
    from vllm import SamplingParams

    assert SamplingParams(thinking_token_budget=5).thinking_token_budget == 5


def test_the_offloading_worker_interface_is_what_the_host_copy_worker_takes() -> None:
    """``HostCopyWorker`` (``meridian.vllm.kvtier``) copies engine blocks by id. vLLM 0.32 and 0.33
    hand it a ``GPULoadStoreSpec`` of block ids; 0.34 hands it the ``DevicePointers`` it resolved
    from them (per group, from each data reference's tensor: base + block id × row stride), which
    the worker reads back to block ids. ``submit_load``'s ``expedited`` (0.33 on) changes nothing
    for synchronous copies."""
    from vllm.v1.kv_offload.base import OffloadingWorker

    store = list(inspect.signature(OffloadingWorker.submit_store).parameters)
    load = list(inspect.signature(OffloadingWorker.submit_load).parameters)
    if vllm_minor() < (0, 34):
        assert store == ["self", "job_id", "src_spec", "dst_spec"], store
        assert load[:4] == ["self", "job_id", "src_spec", "dst_spec"], load  # 0.33 adds `expedited`
        return
    assert store == ["self", "job_id", "device_ptrs", "dst_spec"], store
    assert load == ["self", "job_id", "src_spec", "device_ptrs", "expedited"], load
    from vllm.v1.kv_offload import pointer_utils

    resolve = source(pointer_utils.resolve_device_pointers)
    assert "base_ptr = np.uint64(tensor.data_ptr())" in resolve
    assert "row_stride = np.uint64(tensor.stride(0))" in resolve
    assert "ptrs[op_idx:end_idx] = base_ptr + group_block_ids_u64 * row_stride" in resolve
    assert "if group_size == 0:\n            continue" in resolve
