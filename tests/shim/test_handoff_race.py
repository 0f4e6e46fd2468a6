"""The prefill/decode hand-off race under MeridianScheduler, reached by tests of its own (vLLM
0.34's ``test_kv_pressure_preempt_mid_handoff`` never reaches it under Meridian, whose admission
keeps room for each admitted request's first decode).

The race: KV pressure preempts a request while the output of its final prompt chunk — the hand-off
token that finishes it on a prefill instance — is still in flight (async scheduling). On a prefill
instance (``kv_producer``, a connector that hands KV off) vLLM 0.34 drops that output so the
request computes its prompt again and hands off real KV; delivered, it would finish the request and
hand off blocks the preemption already freed, and the decode side would read garbage (vLLM 0.32 on;
0.34 added the tests). On a decode
instance with overlapping batches vLLM fences the victim's free behind the step in flight, so the
retry stops instead of preempting and the request finishes from its output.

Reached here three ways, in-process against vLLM's scheduler and ``NixlConnector``'s scheduler
side (every supported release): vLLM's own KV-pressure preemption under Meridian's order (a thinking request grows into a new
block right as the sending request's output is in flight: Meridian's thinking reserve is 0 by
default), the same on a decode instance with the fence, and Meridian's own preemption on arrival of
a sending request whose output is in flight — which, before Meridian passed vLLM's drop on,
delivered the stale hand-off (this file's last test fails without it).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from meridian.offline import engine as offline_engine
from meridian.offline.engine import EngineSpec, runner_output
from meridian.offline.tiny import WORD_IDS
from meridian.vllm.names import CLASS_ARG, CONFIG_KEY

pytestmark = pytest.mark.vllm

_VLLM_CONFIG_FOR = offline_engine.vllm_config_for


@pytest.fixture(autouse=True)
def _needs_the_fix() -> None:
    import inspect

    from vllm.v1.core.sched.scheduler import Scheduler

    if "drop_stale_output" not in inspect.signature(Scheduler._preempt_request).parameters:
        pytest.skip("this vLLM has neither the drop nor the fence")


def _scheduler(model: Path, monkeypatch: pytest.MonkeyPatch, kv_role: str, *, num_blocks: int, max_num_seqs: int = 4,
               **meridian: Any) -> Any:
    from vllm.config import KVTransferConfig

    from meridian.vllm import MeridianScheduler

    def with_connector(spec: EngineSpec, cls: type[Any] | None = None) -> Any:
        config = _VLLM_CONFIG_FOR(spec, cls)
        config.kv_transfer_config = KVTransferConfig(kv_connector="NixlConnector", kv_role=kv_role)
        return config

    monkeypatch.setattr(offline_engine, "vllm_config_for", with_connector)
    spec = EngineSpec(model_dir=model, async_scheduling=True, num_blocks=num_blocks, max_num_batched_tokens=32,
                      max_num_seqs=max_num_seqs, additional_config={CONFIG_KEY: meridian})
    return offline_engine.build_scheduler(MeridianScheduler, spec)


def _request(req_id: str, num_tokens: int, max_tokens: int, *, offset: int, sends: bool = False,
             slo_class: str | None = None, arrived_s_ago: float = 0.0) -> Any:
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    extra: dict[str, Any] = {}
    if sends:
        extra["kv_transfer_params"] = {"do_remote_decode": True}
    if slo_class is not None:
        extra[CLASS_ARG] = slo_class
    return Request(
        request_id=req_id,
        prompt_token_ids=[WORD_IDS[(i + offset) % len(WORD_IDS)] for i in range(num_tokens)],
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra or None),
        pooling_params=None,
        arrival_time=time.time() - arrived_s_ago,
        block_hasher=get_request_block_hasher(16, sha256),
    )


class Engine:
    """vLLM's engine loop with async scheduling, step by step: a step is scheduled before the one
    before it has returned its output (a batch queue of two); every request past its prompt
    samples one thinking word. A request that finished with a hand-off is read by the decode side
    at once: the next output reports its sending finished (NIXL's ``finished_sending``), which
    frees the blocks vLLM held for the read."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.in_flight: list[tuple[Any, dict[str, list[int]]]] = []
        self.outputs: list[Any] = []
        self._read: set[str] = set()
        #: Per request, the prompt and output tokens scheduled for it, step by step.
        self.scheduled: dict[str, list[int]] = {}
        #: Per request that finished, the block pool's free blocks when its finish came out.
        self.free_at_finish: dict[str, set[int]] = {}

    def schedule(self) -> Any:
        output = self.scheduler.schedule()
        requests = self.scheduler.requests
        tokens = {rid: [] if requests[rid].is_prefill_chunk else [WORD_IDS[1]] for rid in output.num_scheduled_tokens}
        for req_id, num_tokens in output.num_scheduled_tokens.items():
            self.scheduled.setdefault(req_id, []).append(num_tokens)
        self.in_flight.append((output, tokens))
        return output

    def finish_oldest(self) -> None:
        from vllm.v1.outputs import KVConnectorOutput

        output, tokens = self.in_flight.pop(0)
        model_output = runner_output(tokens)
        if self._read:
            model_output.kv_connector_output = KVConnectorOutput(finished_sending=self._read)
            self._read = set()
        for batch in self.scheduler.update_from_output(output, model_output).values():
            self.outputs.extend(batch.outputs)
            finished = {o.request_id for o in batch.outputs if o.finish_reason is not None}
            self.free_at_finish |= {req_id: _free_blocks(self.scheduler) for req_id in finished}
            self._read |= {o.request_id for o in batch.outputs if o.request_id in finished and o.kv_transfer_params}

    def step(self) -> Any:
        output = self.schedule()
        if len(self.in_flight) == 2:
            self.finish_oldest()
        return output

    def drain(self, max_steps: int = 200) -> None:
        for _ in range(max_steps):
            if not self.scheduler.requests and not self.in_flight:
                return
            if self.scheduler.has_requests() or self._read:
                self.step()
            else:
                self.finish_oldest()
        raise AssertionError(f"the engine did not drain: {list(self.scheduler.requests)}")

    def finished(self, req_id: str) -> list[Any]:
        return [o for o in self.outputs if o.request_id == req_id and o.finish_reason is not None]


def _block_ids(remote_block_ids: Any) -> set[int]:
    """A hand-back's block ids (one list per KV cache group, or one list)."""
    flat: list[Any] = []
    for item in remote_block_ids:
        flat.extend(item if isinstance(item, list) else [item])
    return set(flat)


def _free_blocks(scheduler: Any) -> set[int]:
    return {b.block_id for b in scheduler.kv_cache_manager.block_pool.free_block_queue.get_all_free_blocks()}


def _reach_the_race(engine: Engine, sender: Any) -> None:
    """Steps until vLLM preempts ``sender`` with its output in flight (fails if it never does)."""
    from vllm.v1.request import RequestStatus

    for _ in range(20):
        engine.schedule()
        if sender.status == RequestStatus.PREEMPTED and sender.num_stale_output_tokens > 0:
            return
        if len(engine.in_flight) == 2:
            engine.finish_oldest()
    raise AssertionError("the race was not reached")


def test_a_prefill_instance_drops_the_in_flight_hand_off_and_hands_off_real_kv(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = _scheduler(tiny_model, monkeypatch, "kv_producer", num_blocks=5)
    engine = Engine(scheduler)
    thinker = _request("thinker", 30, 20, offset=0)
    sender = _request("sender", 20, 1, offset=5, sends=True)
    scheduler.add_request(thinker)
    engine.step()
    engine.step()
    scheduler.add_request(sender)
    _reach_the_race(engine, sender)
    assert sender.drop_stale_output, "a prefill instance drops the hand-off output in flight"
    engine.finish_oldest()  # the prompt's output lands, and is dropped
    assert not sender.is_finished() and sender.num_output_tokens == 0 and "sender" in scheduler.requests
    engine.drain()
    (done,) = engine.finished("sender")
    assert done.finish_reason.name == "LENGTH" and len(done.new_token_ids) == 1
    # Its prompt was computed twice, and the hand-off names the blocks of the second time, which
    # vLLM holds for the decode side's read (none was free when the hand-off came out).
    assert len(engine.scheduled["sender"]) == 2, engine.scheduled["sender"]
    handed_off = _block_ids(done.kv_transfer_params["remote_block_ids"])
    assert handed_off and not handed_off & engine.free_at_finish["sender"], handed_off
    # Meridian saw one preemption of a prompt, one finish, and no token from the dropped output.
    (report,) = [r for r in scheduler.finished_reports if r.req_id == "sender"]
    assert (report.kv_handoff, report.reason) == ("sends", "length")
    assert report.num_think_tokens + report.num_answer_tokens == 1 and report.ttft_ms is not None
    assert report.num_preemptions_prefill == 1
    assert scheduler.meridian.handoff_counters()["num_sent"] == 1
    assert [r.req_id for r in scheduler.finished_reports].count("sender") == 1


def test_a_decode_instance_with_overlapping_batches_fences_the_free_instead(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.v1.request import RequestStatus

    scheduler = _scheduler(tiny_model, monkeypatch, "kv_consumer", num_blocks=5)
    # What async scheduling on a GPU sets (the CPU platform has one batch in flight).
    scheduler.defer_block_free = True
    engine = Engine(scheduler)
    thinker = _request("thinker", 30, 20, offset=0)
    last = _request("last", 20, 1, offset=5)
    scheduler.add_request(thinker)
    engine.step()
    engine.step()
    scheduler.add_request(last)
    for _ in range(6):
        engine.step()
        assert last.status != RequestStatus.PREEMPTED, "its blocks are fenced: the retry stops instead"
        if last.is_finished():
            break
    engine.drain()
    (done,) = engine.finished("last")
    assert len(done.new_token_ids) == 1
    assert [r.req_id for r in scheduler.finished_reports].count("last") == 1
    assert all(r.num_preemptions_prefill == 0 for r in scheduler.finished_reports if r.req_id == "last")


def test_meridians_own_preemption_of_a_sending_request_drops_its_in_flight_output(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Preemption on arrival: an interactive request that has waited through half its TTFT target
    with no seat takes the seat of a batch-class sending request whose hand-off output is in
    flight. Meridian preempts through vLLM's own path with the drop a prefill instance needs."""
    from vllm.v1.request import RequestStatus

    scheduler = _scheduler(tiny_model, monkeypatch, "kv_producer", num_blocks=64, max_num_seqs=1)
    engine = Engine(scheduler)
    sender = _request("sender", 20, 1, offset=5, sends=True, slo_class="batch")
    scheduler.add_request(sender)
    engine.schedule()  # its prompt, whose output (the hand-off token) is now in flight
    assert sender.status == RequestStatus.RUNNING and sender.num_output_placeholders == 1
    urgent = _request("urgent", 20, 4, offset=9, slo_class="interactive", arrived_s_ago=0.9)
    scheduler.add_request(urgent)
    engine.schedule()
    assert sender.status == RequestStatus.PREEMPTED and sender.num_stale_output_tokens > 0
    assert sender.drop_stale_output, "dropped, as vLLM's own preemptions drop it on a prefill instance"
    assert scheduler.meridian.stats()["num_arrival_preemptions"] == 1
    engine.finish_oldest()
    assert not sender.is_finished() and sender.num_output_tokens == 0
    engine.drain()
    (done,) = engine.finished("sender")
    # Computed again (its full first block a prefix-cache hit), and handed off from the blocks
    # of that second time, held for the read.
    assert len(engine.scheduled["sender"]) == 2, engine.scheduled["sender"]
    handed_off = _block_ids(done.kv_transfer_params["remote_block_ids"])
    assert handed_off and not handed_off & engine.free_at_finish["sender"]
    assert len(engine.finished("urgent")) == 1
