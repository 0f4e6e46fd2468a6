"""Thinking control below the server: the core's per-request control and token stream through
the binding, the processor's admission check on real ``SamplingParams``, and the scheduler ↔
worker channel in one process and across two."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from meridian._core import Config, ThinkingControl, ThinkingStream
from meridian.errors import RequestArgsError

START, END, CLOSE, WORD = 1, 2, 3, 10


def test_request_arguments_replace_or_extend_the_class_control() -> None:
    config = Config.from_json(json.dumps({"thinking_control": {"rpdi": {}}}))
    base = config.thinking_control(config.default_class)
    assert base.is_enabled() and base.wants_token_entropy() and not base.wants_eat_probes()
    assert not ThinkingControl.for_request(base, "off", None).is_enabled()
    eat = ThinkingControl.for_request(base, json.dumps({"eat": {"min_lines": 3}}), None)
    assert eat.wants_eat_probes() and not eat.wants_token_entropy(), "a JSON object replaces the class's"
    assert ThinkingControl.for_request(None, None, 5).is_enabled()


@pytest.mark.parametrize(
    ("thinking", "budget", "named"),
    [
        ('{"eat": {"alpha": 3}}', None, "meridian_thinking.eat.alpha"),
        ('{"rpdi": {"ratio_threshold": 0.5}}', None, "meridian_thinking.rpdi.ratio_threshold"),
        ("{not json", None, "meridian_thinking"),
        (None, 0, "meridian_thinking_budget_tokens"),
        (None, 2**40, "meridian_thinking_budget_tokens"),
    ],
)
def test_bad_request_arguments_raise_naming_the_argument(thinking: str | None, budget: int | None, named: str) -> None:
    with pytest.raises(RequestArgsError, match=f"`{named}`"):
        ThinkingControl.for_request(None, thinking, budget)


def test_a_stream_forces_the_closing_sequence_after_the_budget() -> None:
    control = ThinkingControl.for_request(None, None, 2)
    stream = ThinkingStream(control, [7, START], start_ids=[START], end_ids=[END], forced_ids=[CLOSE, END])
    assert stream.phase == "thinking"
    assert stream.on_token(WORD, " w") is None
    assert stream.on_token(WORD, " w") == "budget"
    assert (stream.forced_token(), stream.fired_reason, stream.num_think_tokens) == (CLOSE, "budget", 2)
    stream.on_token(CLOSE, " so")
    stream.on_token(END, "</think>")
    assert (stream.phase, stream.forced_token(), stream.num_forced_tokens) == ("answering", None, 2)


def test_eat_probes_come_due_at_line_ends_and_fire_on_a_flat_series() -> None:
    control = ThinkingControl.for_request(None, json.dumps({"eat": {"min_lines": 2}}), None)
    stream = ThinkingStream(control, [START], start_ids=[START], end_ids=[END], forced_ids=[END])
    stream.on_token(WORD, "done.\n\n")
    assert stream.take_probe_due() and not stream.take_probe_due()
    assert stream.on_eat_probe(0.5) is None
    assert stream.on_eat_probe(0.5) == "eat"
    assert stream.forced_token() == END


def test_a_stream_without_an_end_marker_is_refused() -> None:
    with pytest.raises(ValueError, match="end_ids"):
        ThinkingStream(ThinkingControl.for_request(None, None, 1), [], start_ids=[], end_ids=[], forced_ids=[END])


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"meridian_thinking_budget_tokens": "many"}, "meridian_thinking_budget_tokens"),
        ({"meridian_thinking_budget_tokens": True}, "meridian_thinking_budget_tokens"),
        ({"meridian_thinking": 3}, "meridian_thinking"),
        ({"meridian_thinking": "on"}, "meridian_thinking"),
    ],
)
def test_admission_rejects_bad_arguments_on_real_sampling_params(extra: dict[str, object], named: str) -> None:
    from vllm import SamplingParams

    from meridian.vllm.thinking import MeridianThinkingProcessor

    with pytest.raises(ValueError, match=f"`{named}`"):
        MeridianThinkingProcessor.validate_params(SamplingParams(max_tokens=4, extra_args=extra))
    MeridianThinkingProcessor.validate_params(SamplingParams(max_tokens=4, extra_args={"meridian_thinking": {"eat": {}}}))
    MeridianThinkingProcessor.validate_params(SamplingParams(max_tokens=4))


@pytest.fixture
def bus_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MERIDIAN_BUS_DIR", str(tmp_path))
    return tmp_path


def test_the_bus_in_one_process(bus_dir: Path) -> None:
    from meridian.vllm.bus import SchedulerEndpoint, WorkerEndpoint

    scheduler, worker = SchedulerEndpoint(), WorkerEndpoint()
    try:
        worker.request_probe("a", 7)
        worker.request_probe("b", 9)
        worker.report_stop("a", "eat", 31)
        assert scheduler.take_probes() == [("a", 7), ("b", 9)]
        assert scheduler.take_probes() == []
        assert scheduler.take_stops() == [("a", "eat", 31)]
        scheduler.publish({"standard": 0.25}, frozenset({"a"}))
        assert worker.attainment() == {"standard": 0.25}
        assert worker.thinking_endings() == frozenset({"a"})
    finally:
        scheduler.close()
    assert not list(bus_dir.iterdir()), "close removes the socket and the state file"


def _child_worker(results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    from meridian.vllm.bus import WorkerEndpoint

    worker = WorkerEndpoint()
    worker.request_probe("parent-req", 42)
    worker.report_stop("parent-req", "budget", 12)
    results.put((worker.attainment(), worker.thinking_endings()))


def test_the_bus_across_processes_finds_the_parent(bus_dir: Path) -> None:
    from meridian.vllm.bus import SchedulerEndpoint

    scheduler = SchedulerEndpoint()
    try:
        scheduler.publish({"interactive": 0.5}, frozenset({"late-thinker"}))
        context = multiprocessing.get_context("fork")
        results = context.Queue()
        # A forked child is a separate process: it must not see the parent's in-memory endpoint.
        child = context.Process(target=_run_without_local, args=(results,))
        child.start()
        child.join(30)
        assert child.exitcode == 0
        assert results.get(timeout=5) == ({"interactive": 0.5}, frozenset({"late-thinker"}))
        assert scheduler.take_probes() == [("parent-req", 42)]
        assert scheduler.take_stops() == [("parent-req", "budget", 12)]
        bad = os.path.join(str(bus_dir), f"meridian-{os.getpid()}.sock")
        import socket

        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"not json", bad)
            for message in ({"kind": "probe", "req_id": "x", "num_output_tokens": -1},
                            {"kind": "stop", "req_id": 3, "reason": "eat", "num_think_tokens": 1},
                            {"kind": "stop", "req_id": "x", "reason": "eat", "num_think_tokens": True},
                            {"kind": "other", "req_id": "x"}):
                sock.sendto(json.dumps(message).encode(), bad)
        assert scheduler.take_probes() == [] and scheduler.take_stops() == [], "malformed datagrams are dropped"
    finally:
        scheduler.close()


def _run_without_local(results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    from meridian.vllm import bus

    bus._LOCAL.clear()
    _child_worker(results)
