"""vLLM 0.34's async KV-load queue under MeridianScheduler, in-process against 0.34's own scheduler
and the scheduler side of its ``NixlConnector`` on a decode instance (``kv_consumer``) with
``--max-num-inflight-kv-loads``: a hand-off (``do_remote_prefill``) waits in ``async_kv_waiting``
and may start its KV load while every running seat is taken. Under Meridian the plan orders that
queue together with ``waiting``: a hand-off of a higher class starts its load before one that
arrived earlier, the running requests keep their steps (a load takes no seat and no token budget),
a load never eats the blocks the running answers are expected to need, and vLLM's cap holds.
Stock vLLM, on the same sequence, starts loads in arrival order. Skipped before 0.34.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from meridian.offline import engine as offline_engine
from meridian.offline.engine import EngineSpec, runner_output
from meridian.offline.tiny import THINK_END, WORD_IDS
from meridian.vllm.names import CLASS_ARG, CONFIG_KEY

pytestmark = pytest.mark.vllm

NUM_PROMPT_TOKENS = 40
CAP = 2


@pytest.fixture(autouse=True)
def _needs_the_async_queue() -> None:
    from vllm.config import SchedulerConfig

    if "max_num_inflight_kv_loads" not in SchedulerConfig.__dataclass_fields__:
        pytest.skip("vLLM before 0.34 has no async KV-load queue (--max-num-inflight-kv-loads)")


def _decode_side(model: Path, monkeypatch: pytest.MonkeyPatch, scheduler_cls: type[Any], *, num_blocks: int = 200,
                 cap: int | None = CAP, **meridian: Any) -> Any:
    """A decode instance's scheduler (two running seats) with vLLM's NixlConnector as ``kv_consumer``
    and ``--max-num-inflight-kv-loads`` ``cap``."""
    from vllm.config import KVTransferConfig

    plain = offline_engine.vllm_config_for

    def decode_side(spec: EngineSpec, cls: type[Any] | None = None) -> Any:
        config = plain(spec, cls)
        config.kv_transfer_config = KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_consumer")
        config.scheduler_config.max_num_inflight_kv_loads = cap
        return config

    monkeypatch.setattr(offline_engine, "vllm_config_for", decode_side)
    spec = EngineSpec(model_dir=model, async_scheduling=False, max_num_seqs=2, num_blocks=num_blocks,
                      additional_config={CONFIG_KEY: meridian})
    return offline_engine.build_scheduler(scheduler_cls, spec)


def _request(req_id: str, slo_class: str, *, handoff: bool, max_tokens: int = 64) -> Any:
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    extra: dict[str, Any] = {CLASS_ARG: slo_class}
    if handoff:
        extra["kv_transfer_params"] = {
            "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [1, 2, 3],
            "remote_engine_id": "prefill-0", "remote_host": "127.0.0.1", "remote_port": 5601, "tp_size": 1,
            "remote_request_id": f"prefill-{req_id}",
        }
    return Request(
        request_id=req_id,
        prompt_token_ids=[WORD_IDS[i % len(WORD_IDS)] for i in range(NUM_PROMPT_TOKENS)],
        sampling_params=SamplingParams(max_tokens=max_tokens, extra_args=extra),
        pooling_params=None,
        arrival_time=time.time(),
        block_hasher=get_request_block_hasher(16, sha256),
    )


def _step(scheduler: Any, **kv_output: Any) -> Any:
    """One engine step: every scheduled request past its prompt samples the reasoning end, so the
    running requests answer from their first token on."""
    from vllm.v1.outputs import KVConnectorOutput

    output = scheduler.schedule()
    model_output = runner_output({req_id: [THINK_END] for req_id in output.num_scheduled_tokens})
    if kv_output:
        model_output.kv_connector_output = KVConnectorOutput(**kv_output)
    scheduler.update_from_output(output, model_output)
    return output


def _loading(scheduler: Any) -> set[str]:
    from vllm.v1.request import RequestStatus

    return {r.request_id for r in scheduler.requests.values() if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS}


def _fill_the_seats(scheduler: Any) -> list[Any]:
    running = [_request(f"run{i}", "standard", handoff=False) for i in range(2)]
    for request in running:
        scheduler.add_request(request)
    _step(scheduler)
    assert [r.request_id for r in scheduler.running] == ["run0", "run1"]
    return running


def _hand_offs(scheduler: Any) -> None:
    """Three hand-offs arrive while the seats are full, the batch class's first; then 800 ms pass
    (the scheduler's clock, as the replay installs one): the interactive ones near their 1 s TTFT
    target, the batch one safely inside its 60 s."""
    for req_id, slo_class in (("batch", "batch"), ("inter1", "interactive"), ("inter2", "interactive")):
        scheduler.add_request(_request(req_id, slo_class, handoff=True))
        time.sleep(0.002)
    scheduler.clock_ms = lambda: time.time() * 1000.0 + 800.0


def test_a_higher_class_hand_off_starts_its_load_first_and_the_cap_holds(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from meridian.vllm import MeridianScheduler

    scheduler = _decode_side(tiny_model, monkeypatch, MeridianScheduler)
    _fill_the_seats(scheduler)
    _hand_offs(scheduler)
    assert len(scheduler.async_kv_waiting) == 3 and len(scheduler.waiting) == 0, "vLLM queued them for async loads"
    output = _step(scheduler)
    assert _loading(scheduler) == {"inter1", "inter2"}, "the interactive hand-offs load first, two under the cap"
    assert set(output.num_scheduled_tokens) == {"run0", "run1"}, "the running answers keep their step"
    assert [r.request_id for r in scheduler.async_kv_waiting] == ["batch"]
    # The core counted both loads as started (and no more).
    starts = [getattr(r, "meridian_handle") for r in scheduler.requests.values() if r.request_id.startswith("inter")]
    assert all(h is not None for h in starts)
    for _ in range(3):
        output = _step(scheduler)
        assert _loading(scheduler) == {"inter1", "inter2"}, "the cap holds while both loads are in flight"
        assert set(output.num_scheduled_tokens) == {"run0", "run1"}
    # One arrives: it waits for a seat, still counted against the cap, so the batch load stays put.
    _step(scheduler, finished_recving={"inter1"})
    assert "batch" not in _loading(scheduler)
    counters = scheduler.meridian.handoff_counters()
    assert counters["num_received"] == 1


def test_stock_vllm_starts_its_loads_in_arrival_order(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same sequence under vLLM's own scheduler (what Meridian changes): FCFS by arrival."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    scheduler = _decode_side(tiny_model, monkeypatch, AsyncScheduler)
    _fill_the_seats(scheduler)
    _hand_offs(scheduler)
    _step(scheduler)
    assert _loading(scheduler) == {"batch", "inter1"}


def test_a_load_does_not_take_the_blocks_the_running_answers_need(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tight memory: the running answers' expected growth is held back, and a load that would eat
    into it waits; stock vLLM starts it."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from meridian.vllm import MeridianScheduler

    num_blocks = 9  # 8 usable: the two running requests hold 3 each, two are left
    started = {}
    for cls in (MeridianScheduler, AsyncScheduler):
        scheduler = _decode_side(tiny_model, monkeypatch, cls, num_blocks=num_blocks,
                                 **({"answer_tokens_prior": [400]} if cls is MeridianScheduler else {}))
        _fill_the_seats(scheduler)
        scheduler.add_request(_request("inter1", "interactive", handoff=True, max_tokens=4))
        _step(scheduler)
        started[cls.__name__] = _loading(scheduler)
    assert started == {"MeridianScheduler": set(), "AsyncScheduler": {"inter1"}}


def test_without_the_cap_a_hand_off_waits_for_a_seat_as_before(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from meridian.vllm import MeridianScheduler

    scheduler = _decode_side(tiny_model, monkeypatch, MeridianScheduler, cap=None)
    _fill_the_seats(scheduler)
    _hand_offs(scheduler)
    assert len(scheduler.waiting) == 3 and len(scheduler.async_kv_waiting) == 0
    _step(scheduler)
    assert _loading(scheduler) == set(), "every seat is taken: nothing starts"
