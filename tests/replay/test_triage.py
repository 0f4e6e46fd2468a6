"""Triage in the replay, on vLLM's real scheduler classes: a burst that cannot all start within its
TTFT target on a small engine, under each class's ``on_overload``. Under ``shed`` the late
requests end early with the core's notice as their stop reason — every request is either served
or shed (none lost), each shed one learns its fate within its TTFT target, and the report counts
them as submitted and missed; under ``queue`` every request is served; under ``degrade`` long
thinkers have their reasoning ended so they answer by their TTFAT deadline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meridian._core import SHED_MARKER, Config, parse_shed_notice
from meridian.replay.policies import ReplayResult, policy_spec, replay_policy
from meridian.replay.profiles import Profile
from meridian.replay.report import is_shed, summarize
from meridian.replay.traces import TraceRequest
from meridian.replay.workload import model_dir_for, offline_requests

pytestmark = pytest.mark.vllm

#: 10 ms a step and 0.1 ms a prompt token on two seats.
PROFILE = Profile.from_json({
    "name": "triage", "description": "two seats, 10 ms steps", "model": "linear", "block_size": 16,
    "num_kv_blocks": 4096, "max_num_seqs": 2, "max_num_batched_tokens": 512, "max_model_len": 4096,
    "base_ms": 10.0, "per_prefill_token_ms": 0.1, "per_decode_request_ms": 0.0, "per_context_token_ms": 0.0,
    "sources": {k: "test value" for k in ("block_size", "num_kv_blocks", "max_num_seqs", "max_num_batched_tokens",
                                           "max_model_len", "base_ms", "per_prefill_token_ms", "per_decode_request_ms",
                                           "per_context_token_ms")},
})


def config(mode: str, ttfat_ms: float = 60_000.0) -> dict[str, Any]:
    return {"classes": {"c": {"ttft_ms": 500.0, "ttfat_ms": ttfat_ms, "answer_tpot_ms": 100.0, "rank": 0,
                              "on_overload": mode}},
            "default_class": "c", "think_tokens_prior": [40], "answer_tokens_prior": [5],
            "step_time": {"base_ms": 10.0, "per_prefill_token_ms": 0.1, "per_decode_request_ms": 0.0,
                          "per_context_token_ms": 0.0, "online_fit": False}}


def burst(n: int, think: int = 40) -> list[TraceRequest]:
    """``n`` requests at once: each holds a seat for ~450 ms, so only the first two start in time."""
    return [TraceRequest(req_id=f"r{i}", arrival_ms=0.0, num_prompt_tokens=32, num_output_tokens=think + 5,
                         num_think_tokens=think, num_answer_tokens=5) for i in range(n)]


def replay(requests: list[TraceRequest], meridian: dict[str, Any], tmp_path: Path) -> ReplayResult:
    return replay_policy(policy_spec("meridian"), offline_requests(requests, PROFILE, Config.from_json(json.dumps(meridian))),
                         PROFILE, meridian_config=meridian, model_dir=model_dir_for(PROFILE, tmp_path))


def test_shed_ends_the_late_ones_early_and_loses_none(tmp_path: Path) -> None:
    # The engine's triage alone: admission at arrival would refuse most of the burst first.
    result = replay(burst(10), {**config("shed"), "overload": {"admit_at_arrival": False}}, tmp_path)
    timelines = list(result.run.timelines.values())
    shed = [t for t in timelines if is_shed(t)]
    served = [t for t in timelines if t.report is not None and t.report.reason == "stopped"]
    assert len(shed) + len(served) == 10, "every request is served or shed"
    assert 2 <= len(served) < 10 and shed
    for t in shed:
        assert t.finish_reason == "abort" and t.stop_reason is not None and t.stop_reason.startswith(f"{SHED_MARKER}:ttft:")
        assert parse_shed_notice(t.stop_reason) == ("ttft", 1)
        assert t.report is not None and t.report.e2e_ms is not None and t.report.e2e_ms <= 500.0, "fate within TTFT"
        assert not t.token_times_ms, "shed before its first token"
    assert all(t.report is not None and t.report.met_all for t in served), "the served ones met their targets"
    summary = summarize(result)
    assert summary["shed"] == len(shed) and summary["submitted"] == 10 and summary["good"] == len(served)
    assert summary["shed_notice_ms"]["p99"] <= 500.0
    by_reason = summary["shed_notice_ms_by_reason"]
    assert by_reason["ttft"] == summary["shed_notice_ms"] and by_reason["ttfat"]["p99"] is None


def test_admission_at_arrival_refuses_what_would_wait_past_its_ttft_and_serves_the_rest(tmp_path: Path) -> None:
    # Two seats, each request holding one for ~450 ms, a 500 ms TTFT target: the first two start
    # at once; the gate knows no start rate yet, so it refuses the rest of the burst as it arrives
    # (each would queue behind a full engine), at its arrival and before any token.
    result = replay(burst(10), config("shed"), tmp_path)
    timelines = list(result.run.timelines.values())
    refused = [t for t in timelines if t.shed_by == "arrival"]
    served = [t for t in timelines if t.report is not None and t.report.reason == "stopped"]
    assert len(refused) + len(served) + sum(1 for t in timelines if is_shed(t) and t.shed_by is None) == 10
    assert len(served) >= 2 and refused
    for t in refused:
        assert t.finish_reason == "refused" and not t.token_times_ms
        assert t.report is not None and not t.report.met_all
    assert all(t.report is not None and t.report.met_all for t in served), "the admitted ones met their targets"
    summary = summarize(result)
    assert summary["shed_by"].get("arrival") == len(refused) and summary["shed_notice_ms"]["p99"] <= 500.0


def test_queue_serves_every_request(tmp_path: Path) -> None:
    summary = summarize(replay(burst(10), config("queue"), tmp_path))
    assert (summary["shed"], summary["completed"]) == (0, 10)


def test_degrade_ends_long_thinking_in_time_for_the_answer(tmp_path: Path) -> None:
    # Thinking 300 tokens takes 3 s; the TTFAT target is 1.5 s: only ending it early answers in
    # time. Two requests, two seats: no queueing.
    requests = burst(2, think=300)
    queued = replay(requests, config("queue", ttfat_ms=1_500.0), tmp_path)
    degraded = replay(requests, config("degrade", ttfat_ms=1_500.0), tmp_path)
    assert all(not t.report.met_all for t in queued.run.timelines.values() if t.report is not None)
    for t in degraded.run.timelines.values():
        assert t.thinking_stopped_by == "overload"
        assert t.report is not None and t.report.reason == "stopped"
        assert t.report.ttfat_ms is not None and t.report.ttfat_ms <= 1_500.0, t.report.ttfat_ms
        assert t.report.num_think_tokens < 300
