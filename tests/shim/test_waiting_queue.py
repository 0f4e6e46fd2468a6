"""MeridianWaitingQueue inside vLLM's own waiting loop (the stock ``Scheduler.schedule()``, on
every supported version): the plan's allowance counts admissions, not pops, so requests the loop
pops only to skip them (``skip_request()``) neither spend it nor stop the requests behind them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from meridian.offline.engine import EngineSpec, build_scheduler
from meridian.offline.tiny import WORD_IDS

pytestmark = pytest.mark.vllm


def _stock_scheduler_with_meridian_queue(model: Path) -> Any:
    from vllm.v1.core.sched.scheduler import Scheduler

    from meridian.vllm.queue import MeridianWaitingQueue

    scheduler = build_scheduler(Scheduler, EngineSpec(model_dir=model, async_scheduling=False))
    scheduler.waiting = MeridianWaitingQueue()
    return scheduler


def _request(req_id: str, num_prompt_tokens: int = 20) -> Any:
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    return Request(
        request_id=req_id,
        prompt_token_ids=[WORD_IDS[i % len(WORD_IDS)] for i in range(num_prompt_tokens)],
        sampling_params=SamplingParams(max_tokens=8),
        pooling_params=None,
        arrival_time=0.0,
        block_hasher=get_request_block_hasher(16, sha256),
    )


def _block_on_grammar(request: Any) -> None:
    """A structured-output request whose grammar has not compiled: vLLM skips it every step."""
    from vllm.v1.request import RequestStatus

    request.status = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR


@pytest.mark.parametrize("num_blocked", [1, 3])
@pytest.mark.parametrize("allowance", [1, 2])
def test_skipped_requests_spend_no_admission(tiny_model: Path, num_blocked: int, allowance: int) -> None:
    scheduler = _stock_scheduler_with_meridian_queue(tiny_model)
    blocked = [_request(f"blocked-{i}") for i in range(num_blocked)]
    ready = [_request(f"ready-{i}") for i in range(3)]
    for request in blocked:
        _block_on_grammar(request)
    for request in (*blocked, *ready):
        scheduler.add_request(request)
    scheduler.waiting.apply_plan(list(range(len(scheduler.waiting))), allowance)
    try:
        output = scheduler.schedule()
    finally:
        scheduler.waiting.close_gate()
    admitted = [r.req_id for r in output.scheduled_new_reqs]
    assert admitted == [r.request_id for r in ready[:allowance]]
    # The skipped requests are back in the queue, ahead of the ones not admitted, in their order.
    assert [r.request_id for r in scheduler.waiting] == [
        *(r.request_id for r in blocked), *(r.request_id for r in ready[allowance:])]


def test_an_allowance_of_zero_admits_nothing_and_pops_nothing(tiny_model: Path) -> None:
    scheduler = _stock_scheduler_with_meridian_queue(tiny_model)
    for i in range(2):
        scheduler.add_request(_request(f"r{i}"))
    scheduler.waiting.apply_plan([0, 1], 0)
    try:
        output = scheduler.schedule()
    finally:
        scheduler.waiting.close_gate()
    assert output.scheduled_new_reqs == []
    assert [r.request_id for r in scheduler.waiting] == ["r0", "r1"]


def test_between_plans_the_queue_admits_as_fcfs_does(tiny_model: Path) -> None:
    scheduler = _stock_scheduler_with_meridian_queue(tiny_model)
    blocked = _request("blocked")
    _block_on_grammar(blocked)
    for request in (blocked, _request("r0"), _request("r1")):
        scheduler.add_request(request)
    output = scheduler.schedule()
    assert [r.req_id for r in output.scheduled_new_reqs] == ["r0", "r1"]
    assert [r.request_id for r in scheduler.waiting] == ["blocked"]
