"""Every field of the installed vLLM's ``SchedulerConfig`` under MeridianScheduler: each has a row in
``meridian.vllm.knobs.KNOBS`` (a field a new release adds fails here until someone decides its row),
each honoured one is shown working by a test (here, or the one named), each refused value stops
the scheduler at start-up with an error naming the flag. Run on every supported release (0.32 with
the venv, 0.33 and 0.34 in their in-process passes).

The honoured knobs are shown on scripted workloads through vLLM's own scheduling loop
(``meridian.offline.engine``): the limit holds on every step, and every request ends with exactly
its scripted tokens.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest

from meridian.errors import ConfigError
from meridian.offline import engine as offline_engine
from meridian.offline.engine import EngineSpec, OfflineEngine, OfflineRequest, scripted_request
from meridian.offline.tiny import WORD_IDS, reasoning_script
from meridian.vllm.knobs import KNOBS, Stance

pytestmark = pytest.mark.vllm

#: The test that shows each honoured field working (a function of this module unless a path is
#: given).
SHOWN_BY: dict[str, str] = {
    "max_num_batched_tokens": "test_max_num_batched_tokens_bounds_every_step",
    "max_num_scheduled_tokens": "test_max_num_scheduled_tokens_bounds_every_step",
    "max_num_seqs": "test_the_running_seats_hold",
    "max_num_active_seqs": "test_the_running_seats_hold",
    "max_num_inflight_kv_loads": "tests/shim/test_async_kv_loads.py",
    "long_prefill_token_threshold": "test_long_prefill_threshold_caps_each_chunk",
    "long_prefill_token_threshold_adaptive": "test_long_prefill_threshold_caps_each_chunk",
    "max_num_queued_reqs": "test_api_server_knobs_never_reach_the_scheduler",
    "max_num_queued_tokens": "test_api_server_knobs_never_reach_the_scheduler",
    "stream_interval": "test_api_server_knobs_never_reach_the_scheduler",
    "policy": "test_the_priority_policy_maps_onto_classes",
    "disable_chunked_mm_input": "test_multimodal_knobs_are_read_inside_vllms_step_only",
    "scheduler_cls": "tests/shim/test_vllm_surface.py",
    "disable_hybrid_kv_cache_manager": "test_a_hybrid_kv_cache_runs_every_request_through",
    "scheduler_reserve_full_isl": "test_vllms_own_admission_checks_still_apply",
    "watermark": "test_vllms_own_admission_checks_still_apply",
    "prefill_schedule_interval": "test_a_throttled_step_admits_no_prompt_and_spends_no_admission",
    "cache_aware_admission_threshold": "test_refused_values_stop_the_scheduler_at_start_up",
    "async_scheduling": "test_both_scheduling_modes_finish_every_request",
}


def _fields() -> list[str]:
    from vllm.config import SchedulerConfig

    return [f.name for f in dataclasses.fields(SchedulerConfig)]


def test_every_field_of_this_vllms_scheduler_config_has_a_decided_row() -> None:
    from vllm import __version__

    undecided = [name for name in _fields() if name not in KNOBS]
    assert not undecided, (
        f"vLLM {__version__} adds SchedulerConfig fields {undecided}: decide each one's row in "
        "python/meridian/vllm/knobs.py (honoured with a test here, or refused with a reason)"
    )


def test_every_honoured_row_is_shown_by_a_test() -> None:
    module = inspect.getmodule(test_every_honoured_row_is_shown_by_a_test)
    repo = Path(__file__).resolve().parents[2]
    for name, knob in KNOBS.items():
        if knob.stance is Stance.DERIVED:
            continue
        if knob.stance is Stance.REFUSED_FOR_SOME:
            assert knob.refused is not None and knob.why, name
            continue
        shown = SHOWN_BY.get(name)
        assert shown is not None, f"honoured knob {name} has no test"
        if shown.startswith("tests/"):
            assert (repo / shown).is_file(), shown
        else:
            assert callable(getattr(module, shown, None)), shown


# ---- building a scheduler with vLLM's fields set ----------------------------------------------------

#: The offline engine's own config builder (a test may build twice, each time with its fields).
_VLLM_CONFIG_FOR = offline_engine.vllm_config_for


def _build(model: Path, monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any], cls: type[Any] | None = None,
           **spec: Any) -> Any:
    """``cls`` (default MeridianScheduler) built as EngineCore builds it, ``fields`` set on vLLM's
    ``SchedulerConfig`` first, with a class that records every step's scheduled tokens and the
    running requests after it."""
    from meridian.vllm import MeridianScheduler

    plain = _VLLM_CONFIG_FOR

    def with_fields(engine_spec: EngineSpec, scheduler_cls: type[Any] | None = None) -> Any:
        config = plain(engine_spec, scheduler_cls)
        for name, value in fields.items():
            setattr(config.scheduler_config, name, value)
        return config

    monkeypatch.setattr(offline_engine, "vllm_config_for", with_fields)
    base = cls or MeridianScheduler

    class Recording(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.steps: list[tuple[dict[str, int], int]] = []

        def schedule(self, *args: Any, **kwargs: Any) -> Any:
            output = super().schedule(*args, **kwargs)
            self.steps.append((dict(output.num_scheduled_tokens), len(self.running)))
            return output

    return offline_engine.build_scheduler(Recording, EngineSpec(model_dir=model, **spec))


def _workload(n: int = 6, prompt_len: int = 100, think: int = 12, answer: int = 6, gap_ms: float = 10.0
              ) -> list[OfflineRequest]:
    return [
        scripted_request(f"r{i}", gap_ms * i, [WORD_IDS[(i + j) % len(WORD_IDS)] for j in range(prompt_len)],
                         reasoning_script(think, answer, seed=i))
        for i in range(n)
    ]


def _run(scheduler: Any, requests: list[OfflineRequest]) -> Any:
    result = OfflineEngine(scheduler, requests).run()
    for request in requests:
        timeline = result.timelines[request.req_id]
        assert timeline.output_token_ids == list(request.script.tokens), request.req_id  # type: ignore[attr-defined]
    assert result.final_num_free_blocks == result.max_num_free_blocks
    return result


# ---- honoured -----------------------------------------------------------------------------------


def test_max_num_batched_tokens_bounds_every_step(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scheduler = _build(tiny_model, monkeypatch, {}, max_num_batched_tokens=64)
    _run(scheduler, _workload())
    assert max(sum(tokens.values()) for tokens, _ in scheduler.steps) == 64


def test_max_num_scheduled_tokens_bounds_every_step(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scheduler = _build(tiny_model, monkeypatch, {"max_num_scheduled_tokens": 48}, max_num_batched_tokens=256)
    _run(scheduler, _workload())
    assert 0 < max(sum(tokens.values()) for tokens, _ in scheduler.steps) <= 48


@pytest.mark.parametrize(("max_num_seqs", "active"), [(2, None), (4, 1)])
def test_the_running_seats_hold(tiny_model: Path, monkeypatch: pytest.MonkeyPatch, max_num_seqs: int,
                                active: int | None) -> None:
    scheduler = _build(tiny_model, monkeypatch, {"max_num_active_seqs": active}, max_num_seqs=max_num_seqs)
    _run(scheduler, _workload())
    seats = active or max_num_seqs
    assert max(num_running for _, num_running in scheduler.steps) == seats


@pytest.mark.parametrize("adaptive", [False, True])
def test_long_prefill_threshold_caps_each_chunk(tiny_model: Path, monkeypatch: pytest.MonkeyPatch,
                                                adaptive: bool) -> None:
    fields = {"long_prefill_token_threshold": 16, "long_prefill_token_threshold_adaptive": adaptive}
    scheduler = _build(tiny_model, monkeypatch, fields, max_num_batched_tokens=64)
    requests = _workload(n=2, prompt_len=100, gap_ms=0.0)
    _run(scheduler, requests)
    # While both prompts are computed, each chunk is capped (the adaptive floor is 64 / 2 = 32).
    cap = 32 if adaptive else 16
    both = [tokens for tokens, _ in scheduler.steps if len(tokens) == 2 and all(n > 1 for n in tokens.values())]
    assert both, "the two prompts were never computed side by side"
    assert all(n <= cap for tokens in both for n in tokens.values()), both


def test_api_server_knobs_never_reach_the_scheduler() -> None:
    """vLLM's load valve (``--max-num-queued-reqs``, ``--max-num-queued-tokens``: HTTP 503) and its
    streaming interval act in the API server process, before a request reaches the engine or
    after its output leaves it: no scheduler reads them, so they act the same with Meridian's
    (the replay models the valve in front of either, ``replay.policies.LoadValve``)."""
    from vllm.v1.core.sched import scheduler as vllm_scheduler
    from vllm.v1.engine.async_llm import AsyncLLM

    from meridian.vllm import scheduler as meridian_scheduler

    admission = inspect.getsource(AsyncLLM.check_admission)
    assert "self.scheduler_config.max_num_queued_reqs" in admission
    assert "self.scheduler_config.max_num_queued_tokens" in admission
    for module in (vllm_scheduler, meridian_scheduler):
        text = inspect.getsource(module)
        for name in ("max_num_queued_reqs", "max_num_queued_tokens", "stream_interval"):
            assert name not in text, (module.__name__, name)


def test_the_priority_policy_maps_onto_classes(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.core.sched.request_queue import SchedulingPolicy

    meridian = {"priority_map": {"-1": "interactive", "1": "batch"}}
    scheduler = _build(tiny_model, monkeypatch, {}, policy="priority", additional_config={"meridian": meridian})
    assert scheduler.policy == SchedulingPolicy.FCFS, "vLLM's queues run FCFS under Meridian's order"
    prompt = [WORD_IDS[j % len(WORD_IDS)] for j in range(40)]
    requests = [scripted_request("urgent", 0.0, prompt, reasoning_script(8, 4), priority=-1),
                scripted_request("later", 0.0, prompt, reasoning_script(8, 4, seed=1), priority=1)]
    _run(scheduler, requests)
    classes = {report.req_id: report.slo_class for report in scheduler.finished_reports}
    assert classes == {"urgent": "interactive", "later": "batch"}


def test_multimodal_knobs_are_read_inside_vllms_step_only() -> None:
    """``disable_chunked_mm_input`` (and the derived encoder budget) are read where vLLM schedules
    a request's encoder inputs, inside its own waiting loop, after Meridian's plan: Meridian never
    reads them, and a request vLLM skips for its encoder inputs spends none of the plan's
    admissions (``MeridianWaitingQueue``: a skip is no admission)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from meridian.vllm import queue, scheduler

    assert "disable_chunked_mm_input" in inspect.getsource(Scheduler)
    for module in (queue, scheduler):
        text = inspect.getsource(module)
        assert "disable_chunked_mm_input" not in text and "encoder_cache_size" not in text


def test_a_hybrid_kv_cache_runs_every_request_through(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hybrid KV cache (GPT-OSS's shape: a full-attention group and a sliding-window group in one
    block pool): the core counts the pool's free blocks, which vLLM shares between the groups;
    under pressure every request still ends with its scripted tokens and nothing leaks."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

    def hybrid(spec: EngineSpec) -> Any:
        full = FullAttentionSpec(block_size=spec.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
        window = SlidingWindowSpec(block_size=spec.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32,
                                   sliding_window=32)
        return KVCacheConfig(num_blocks=spec.num_blocks, kv_cache_tensors=[],
                             kv_cache_groups=[KVCacheGroupSpec(["full"], full), KVCacheGroupSpec(["window"], window)])

    monkeypatch.setattr(offline_engine, "kv_cache_config_for", hybrid)
    scheduler = _build(tiny_model, monkeypatch, {"disable_hybrid_kv_cache_manager": False}, num_blocks=40)
    assert len(scheduler.kv_cache_config.kv_cache_groups) == 2
    _run(scheduler, _workload(n=6, prompt_len=60, think=40))


@pytest.mark.parametrize("fields", [{"scheduler_reserve_full_isl": False}, {"scheduler_reserve_full_isl": True},
                                    {"watermark": 0.3}])
def test_vllms_own_admission_checks_still_apply(tiny_model: Path, monkeypatch: pytest.MonkeyPatch,
                                                fields: dict[str, Any]) -> None:
    """vLLM's own KV checks run on each request Meridian's allowance lets through: with a watermark
    vLLM keeps that share of the pool free of new admissions; either way every request finishes."""
    scheduler = _build(tiny_model, monkeypatch, fields, num_blocks=40)
    result = _run(scheduler, _workload(n=6, prompt_len=60, think=40))
    if "watermark" in fields:
        plain = _build(tiny_model, monkeypatch, {}, num_blocks=40)
        plain_result = _run(plain, _workload(n=6, prompt_len=60, think=40))
        assert max(n for _, n in scheduler.steps) <= max(n for _, n in plain.steps)
        assert result.num_steps >= plain_result.num_steps


def test_a_throttled_step_admits_no_prompt_and_spends_no_admission(tiny_model: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``prefill_schedule_interval`` (data-parallel prefill balancing): the engine core passes
    ``throttle_prefills`` on the steps between, and vLLM defers prompts there while requests
    decode; the next step admits the waiting request, as the plan did."""
    from meridian.offline.engine import runner_output

    scheduler = _build(tiny_model, monkeypatch, {})
    scheduler.clock_ms = lambda: 50.0  # the requests' own clock (they arrive at 0 and 10 ms)
    first, second = (offline_engine.vllm_request(r, scheduler.block_size) for r in _workload(n=2, prompt_len=20))
    scheduler.add_request(first)
    output = scheduler.schedule()
    scheduler.update_from_output(output, runner_output({first.request_id: [WORD_IDS[0]]}))
    scheduler.add_request(second)
    throttled = scheduler.schedule(throttle_prefills=True)
    assert set(throttled.num_scheduled_tokens) == {first.request_id}, "the prompt waits on a throttled step"
    scheduler.update_from_output(throttled, runner_output({first.request_id: [WORD_IDS[1]]}))
    released = scheduler.schedule()
    assert released.num_scheduled_tokens.get(second.request_id) == 20


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_both_scheduling_modes_finish_every_request(tiny_model: Path, monkeypatch: pytest.MonkeyPatch,
                                                    async_scheduling: bool) -> None:
    scheduler = _build(tiny_model, monkeypatch, {}, async_scheduling=async_scheduling, num_blocks=40)
    _run(scheduler, _workload(n=6, prompt_len=60, think=40))


# ---- refused --------------------------------------------------------------------------------------

#: A value each refused row refuses, for this test.
REFUSED_VALUES: dict[str, Any] = {
    "runner_type": "pooling",
    "enable_chunked_prefill": False,
    "cache_aware_admission_window": 8,
}


@pytest.mark.parametrize("name", [name for name, knob in KNOBS.items() if knob.stance is Stance.REFUSED_FOR_SOME])
def test_refused_values_stop_the_scheduler_at_start_up(tiny_model: Path, monkeypatch: pytest.MonkeyPatch,
                                                       name: str) -> None:
    if name not in _fields():
        pytest.skip(f"this vLLM has no {name}")
    knob = KNOBS[name]
    value = REFUSED_VALUES[name]
    with pytest.raises(ConfigError, match=knob.flag) as raised:
        _build(tiny_model, monkeypatch, {name: value})
    assert knob.why in str(raised.value)
    # The default value starts.
    _build(tiny_model, monkeypatch, {})
