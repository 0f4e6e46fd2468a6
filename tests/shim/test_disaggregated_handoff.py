"""MeridianScheduler on either side of a prefill/decode hand-off, in-process against vLLM's own
scheduler and the scheduler side of its ``NixlConnector`` (every supported version): the decode
side's core learns when a request's KV started arriving (vLLM puts it into
``WAITING_FOR_REMOTE_KVS``) and when it arrived (the connector's ``finished_recving``), fits the
arrival cost from that, and the request then computes one token, not its prompt; the allowance
counts the request once, not again while its KV is still on the way; a failed arrival is counted
and the request ends as vLLM's ``kv_load_failure_policy`` says (an error, or its prompt computed
here). The prefill side's request, which ends after its prompt with its KV
sent on, is judged by its TTFT alone, logged as ``sends`` and not learnt from on a warm start.
The transfer itself (UCX over TCP between two servers) is ``tests/live``'s.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from meridian.offline import engine as offline_engine
from meridian.offline.engine import EngineSpec, runner_output
from meridian.offline.tiny import WORD_IDS
from meridian.vllm.names import CONFIG_KEY

pytestmark = pytest.mark.vllm

NUM_PROMPT_TOKENS = 40


def _scheduler(
    model: Path, kv_role: str, monkeypatch: pytest.MonkeyPatch, on_load_failure: str = "fail", **meridian: Any
) -> Any:
    """MeridianScheduler built as EngineCore builds it, with vLLM's NixlConnector in ``kv_role``
    (``on_load_failure``: its ``kv_load_failure_policy``)."""
    from vllm.config import KVTransferConfig

    from meridian.vllm import MeridianScheduler

    plain = offline_engine.vllm_config_for

    def with_connector(spec: EngineSpec, scheduler_cls: type[Any] | None = None) -> Any:
        config = plain(spec, scheduler_cls)
        config.kv_transfer_config = KVTransferConfig(
            kv_connector="NixlConnector", kv_role=kv_role, kv_load_failure_policy=on_load_failure
        )
        return config

    monkeypatch.setattr(offline_engine, "vllm_config_for", with_connector)
    spec = EngineSpec(model_dir=model, async_scheduling=False, additional_config={CONFIG_KEY: meridian})
    return offline_engine.build_scheduler(MeridianScheduler, spec)


def _request(req_id: str, kv_transfer_params: dict[str, Any] | None, max_tokens: int = 8) -> Any:
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params is not None else None
    return Request(
        request_id=req_id,
        prompt_token_ids=[WORD_IDS[i % len(WORD_IDS)] for i in range(NUM_PROMPT_TOKENS)],
        sampling_params=SamplingParams(max_tokens=max_tokens, extra_args=extra),
        pooling_params=None,
        arrival_time=time.time(),
        block_hasher=get_request_block_hasher(16, sha256),
    )


def _from_prefill(req_id: str) -> dict[str, Any]:
    """The ``kv_transfer_params`` a prefill instance's NixlConnector hands back for a request (what
    a router passes on to the decode instance)."""
    return {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [1, 2, 3],
            "remote_engine_id": "prefill-0", "remote_host": "127.0.0.1", "remote_port": 5601, "tp_size": 1,
            "remote_request_id": f"prefill-{req_id}"}


def _step(scheduler: Any, sampled: dict[str, list[int]] | None = None, **kv_output: Any) -> Any:
    from vllm.v1.outputs import KVConnectorOutput

    output = scheduler.schedule()
    tokens = {req_id: [WORD_IDS[0]] for req_id in output.num_scheduled_tokens} | (sampled or {})
    model_output = runner_output(tokens)
    if kv_output:
        model_output.kv_connector_output = KVConnectorOutput(**kv_output)
    scheduler.update_from_output(output, model_output)
    return output


def test_the_decode_side_counts_the_arrival_and_computes_one_token(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.v1.request import RequestStatus

    scheduler = _scheduler(tiny_model, "kv_consumer", monkeypatch)
    arriving = _request("arriving", _from_prefill("arriving"))
    scheduler.add_request(arriving)
    first = _step(scheduler)
    assert arriving.status == RequestStatus.WAITING_FOR_REMOTE_KVS and first.num_scheduled_tokens == {}
    assert scheduler.meridian.kv_arrival_ms_per_token() is None, "no arrival measured yet"
    # Still on the way: a request behind it is admitted with the allowance it did not spend again.
    local = _request("local", None)
    scheduler.add_request(local)
    second = _step(scheduler)
    assert second.num_scheduled_tokens == {"local": NUM_PROMPT_TOKENS}
    assert arriving.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    time.sleep(0.01)
    _step(scheduler, finished_recving={"arriving"})
    counters = scheduler.meridian.handoff_counters()
    assert (counters["num_received"], counters["num_received_tokens"]) == (1, NUM_PROMPT_TOKENS)
    fitted = scheduler.meridian.kv_arrival_ms_per_token()
    assert fitted is not None and fitted >= 10.0 / NUM_PROMPT_TOKENS, fitted
    # Its prompt's KV is here: one token (the last prompt position) is computed, not the prompt.
    resumed = _step(scheduler)
    assert resumed.num_scheduled_tokens["arriving"] == 1, resumed.num_scheduled_tokens


@pytest.mark.parametrize("on_load_failure", ["fail", "recompute"])
def test_a_failed_arrival_is_counted_and_ends_as_vllm_is_told(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, on_load_failure: str
) -> None:
    scheduler = _scheduler(tiny_model, "kv_consumer", monkeypatch, on_load_failure)
    arriving = _request("arriving", _from_prefill("arriving"))
    scheduler.add_request(arriving)
    _step(scheduler)
    blocks = {b for group in scheduler.kv_cache_manager.get_block_ids("arriving") for b in group}
    _step(scheduler, finished_recving={"arriving"}, invalid_block_ids=blocks)
    assert scheduler.meridian.handoff_counters()["num_failed"] == 1
    assert scheduler.meridian.kv_arrival_ms_per_token() is None, "a failed arrival is not fitted"
    if on_load_failure == "fail":
        # vLLM's default: the request ends with an error the client sees; its log line is whole.
        (report,) = scheduler.finished_reports
        assert (report.req_id, report.reason, report.kv_handoff) == ("arriving", "error", "local")
        return
    recomputed = _step(scheduler)
    assert recomputed.num_scheduled_tokens.get("arriving", 0) > 1, "vLLM computes the prompt here"


def test_the_prefill_side_judges_its_ttft_logs_sends_and_teaches_no_warm_start(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    log = tmp_path / "requests.jsonl"
    scheduler = _scheduler(tiny_model, "kv_producer", monkeypatch, request_log_path=str(log))
    sending = _request("sending", {"do_remote_decode": True}, max_tokens=1)
    scheduler.add_request(sending)
    _step(scheduler)
    (report,) = scheduler.finished_reports
    assert (report.kv_handoff, report.reason, report.met_all) == ("sends", "length", True)
    assert report.ttfat_ms is None, "its thinking runs on the decode instance"
    assert scheduler.meridian.handoff_counters()["num_sent"] == 1
    scheduler.shutdown()
    (line,) = [json.loads(text) for text in log.read_text().splitlines()]
    assert line["kv_handoff"] == "sends"
    # A restart of the prefill instance learns nothing from its own log.
    from meridian import InvalidArgumentError
    from meridian._core import Config, Meridian
    from meridian.vllm import convert

    config = Config.from_json(json.dumps({"request_log_path": str(log)}))
    restarted = Meridian(
        config, block_size=16, max_num_batched_tokens=256, max_num_seqs=32,
        reasoning_start_ids=[1], reasoning_end_ids=[2], tool_call_ids=[],
    )
    assert convert.warm_start(restarted, config) == (str(log), 0, 1)
    with pytest.raises(InvalidArgumentError, match="kv_handoff"):
        restarted.learn_from_history(line["slo_class"], line["reason"], False, 0, 0, "remote")


def test_vllms_own_clean_up_request_is_no_clients_request(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """After a failed hand-off vLLM's API server adds a pre-aborted request carrying the
    ``kv_transfer_params`` so the connector frees the prefill side's blocks (``abort_immediately``):
    the engine core adds it and aborts it at once. It reaches no class counter and no log line."""
    log = tmp_path / "requests.jsonl"
    scheduler = _scheduler(tiny_model, "kv_consumer", monkeypatch, request_log_path=str(log))
    clean_up = _request("clean-up", _from_prefill("clean-up"))
    clean_up.abort_immediately = True
    scheduler.add_request(clean_up)
    scheduler.finish_requests(["clean-up"], clean_up.status.FINISHED_ABORTED)
    assert "clean-up" not in scheduler.requests
    _step(scheduler)
    assert scheduler.meridian.stats()["num_added"] == 0 and not scheduler.finished_reports
    scheduler.shutdown()
    assert log.read_text() == ""

