"""Thinking control below the server: the core's per-request control and token stream through
the binding, the processor's admission check on real ``SamplingParams``, and the scheduler ↔
worker channel in one process and across two."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import tempfile
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


# ---- the bus folder is this user's alone --------------------------------------------------------


def test_the_default_bus_folder_is_a_private_one_of_this_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from meridian.vllm.bus import SchedulerEndpoint

    monkeypatch.delenv("MERIDIAN_BUS_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    scheduler = SchedulerEndpoint()
    try:
        folder = tmp_path / f"meridian-{os.getuid()}"
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        scheduler.publish({"standard": 0.5}, frozenset())
        for name in (f"meridian-{os.getpid()}.sock", f"meridian-{os.getpid()}.state.json"):
            assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
    finally:
        scheduler.close()


def _unsafe_folder(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """A bus folder another local user could write into, and the words the refusal names it by."""
    folder = tmp_path / "bus"
    if kind == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        folder.symlink_to(tmp_path / "elsewhere")
        return folder, "is a symbolic link"
    if kind == "file":
        folder.write_text("")
        return folder, "is not a directory"
    folder.mkdir(mode=0o700)
    if kind == "world-writable":
        folder.chmod(0o777)
        return folder, "is writable by group or others (mode 0777)"
    os.chown(folder, 4242, -1)
    return folder, "belongs to uid 4242"


UNSAFE = ["symlink", "file", "world-writable",
          pytest.param("another-users", marks=pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root"))]


@pytest.mark.parametrize("kind", UNSAFE)
def test_a_bus_folder_others_could_write_is_refused_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    from meridian.errors import ConfigError
    from meridian.vllm.bus import SchedulerEndpoint

    folder, problem = _unsafe_folder(tmp_path, kind)
    monkeypatch.setenv("MERIDIAN_BUS_DIR", str(folder))
    with pytest.raises(ConfigError) as refused:
        SchedulerEndpoint()
    assert str(folder) in str(refused.value) and problem in str(refused.value)
    assert "MERIDIAN_BUS_DIR" in str(refused.value)


@pytest.mark.parametrize("kind", UNSAFE)
def test_a_worker_neither_reads_nor_sends_through_a_folder_others_could_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    from meridian.vllm.bus import WorkerEndpoint

    folder, _ = _unsafe_folder(tmp_path, kind)
    monkeypatch.setenv("MERIDIAN_BUS_DIR", str(folder))
    if folder.is_dir():
        # What a planted file would say: end this request's thinking.
        (folder / f"meridian-{os.getppid()}.state.json").write_text(
            json.dumps({"attainment": {"standard": 0.0}, "end_thinking": ["victim"]}))
    worker = WorkerEndpoint()
    worker.request_probe("victim", 3)
    assert worker.thinking_endings() == frozenset() and worker.attainment() == {}
    assert worker._sock is None, "nothing was sent"


def test_the_metrics_folder_lives_only_in_a_private_bus_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              tiny_model: Path) -> None:
    from meridian.errors import ConfigError
    from meridian.offline.engine import EngineSpec, vllm_config_for
    from meridian.vllm.metrics import MULTIPROC_DIR_ENV, metrics_dir

    monkeypatch.delenv(MULTIPROC_DIR_ENV, raising=False)
    vllm_config = vllm_config_for(EngineSpec(model_dir=tiny_model))
    folder, problem = _unsafe_folder(tmp_path, "world-writable")
    monkeypatch.setenv("MERIDIAN_BUS_DIR", str(folder))
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        metrics_dir(vllm_config)
    folder.chmod(0o700)
    assert metrics_dir(vllm_config).parent == folder
