"""Live: thinking control end to end on vLLM's CPU build with the tiny reasoning model —
``MeridianThinkingProcessor`` next to ``MeridianScheduler``, one rule per request through
``vllm_xargs``. Each rule must end the reasoning early with the answer following; with control
off the output must be the model's own; a bad argument fails that request alone with HTTP 400.
The tiny model cannot judge answer quality, so nothing here claims accuracy.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meridian.demo.server import StreamResult, VllmServer, stream_chat
from meridian.demo.thinking import LOAD_AWARE, MODES, PROCESSOR_ARGS, STRICT_CLASS, server_config_json
from meridian.offline.tiny import LETTERS
from meridian.vllm.bus import ATTAINMENT_READ_PERIOD_S
from meridian.vllm.names import BUS_DIR_ENV, EFFORT_ARG, MIDDLEWARE

from tiny_server import FIXTURE, MODEL, server_args

pytestmark = pytest.mark.vllm

SERVER_ARGS = server_args(kv_cache_tokens=4096, max_num_seqs=8)
NUM_THINK = 60
NUM_ANSWER = 5
RULES = {"budget 12": "budget", "eat": "eat", "proxy": "proxy", "rpdi": "rpdi"}
#: Thinking budgets per reasoning_effort level, small enough for the tiny model's countdown.
EFFORT = {"low_tokens": 10, "medium_tokens": 20, "high_tokens": 30, "answer_room_tokens": 16}


@pytest.fixture(scope="module")
def server(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    folder = tmp_path_factory.mktemp("live-thinking")
    log = folder / "requests.jsonl"
    config = server_config_json({"request_log_path": str(log), "thinking_control": {"reasoning_effort": EFFORT}})
    args = SERVER_ARGS + PROCESSOR_ARGS + ["--middleware", MIDDLEWARE, "--additional-config", config]
    # The server's own bus folder, so a test can read the attainment the scheduler publishes.
    with pytest.MonkeyPatch.context() as env:
        env.setenv(BUS_DIR_ENV, str(folder / "bus"))
        srv = VllmServer(FIXTURE, args, log_path=folder / "serve.log", cache_dir=cache_dir).start()
    srv.request_log = log  # type: ignore[attr-defined]
    srv.bus_dir = folder / "bus"  # type: ignore[attr-defined]
    try:
        yield srv
    finally:
        srv.stop()


def published_attainment(server: VllmServer, slo_class: str) -> float | None:
    """The class's attainment as the scheduler last published it to the worker (its state file)."""
    for path in server.bus_dir.glob("meridian-*.state.json"):  # type: ignore[attr-defined]
        try:
            value = json.loads(path.read_text())["attainment"].get(slo_class)
        except (OSError, ValueError, KeyError):
            continue
        if value is not None:
            return float(value)
    return None


def log_lines(server: VllmServer) -> list[str]:
    path: Path = server.request_log  # type: ignore[attr-defined]
    return path.read_text().splitlines() if path.exists() else []


def ask(server: VllmServer, xargs: dict[str, Any] | None, **fields: Any) -> tuple[StreamResult, dict[str, Any]]:
    """One request (``fields``: more of the request body); returns what the client got and the
    request log's line for it (the scheduler writes it as the request finishes, so the line is
    awaited: exactly one new line)."""
    before = len(log_lines(server))
    extra = {**({"vllm_xargs": xargs} if xargs is not None else {}), **fields} or None
    result = stream_chat(server.base_url, MODEL, f"think {NUM_THINK} answer {NUM_ANSWER}", max_tokens=200, extra=extra)
    assert result.status == 200 and result.error is None, result.error
    deadline = time.monotonic() + 60.0
    while len(lines := log_lines(server)) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(lines) == before + 1, f"expected one new request-log line, got {len(lines) - before}"
    return result, json.loads(lines[-1])


def countdown() -> list[str]:
    return [str(k) for k in range(NUM_THINK, 0, -1)]


@pytest.mark.parametrize("mode", ["off (no arguments)", "off (explicit)"])
def test_with_control_off_the_output_is_the_models_own(server: VllmServer, mode: str) -> None:
    result, logged = ask(server, MODES[mode])
    assert result.reasoning.split() == countdown()
    assert result.content.split() == LETTERS[:NUM_ANSWER]
    assert (logged["thinking_stopped_by"], logged["thinking_stopped_after_tokens"]) == (None, None)


@pytest.mark.parametrize("mode", ["budget 12", "eat", "proxy", "rpdi"])
def test_each_rule_ends_thinking_early_and_the_answer_follows(server: VllmServer, mode: str) -> None:
    result, logged = ask(server, MODES[mode])
    thought = result.reasoning.split()
    assert 0 < len(thought) < NUM_THINK, f"{mode} did not end the reasoning early: {len(thought)} tokens"
    assert thought == countdown()[: len(thought)], "the reasoning was cut, never changed"
    assert result.content.split() == LETTERS[:NUM_ANSWER]
    if mode == "budget 12":
        assert len(thought) == 12
    assert logged["thinking_stopped_by"] == RULES[mode], "the request log names the rule that fired"
    assert logged["thinking_stopped_after_tokens"] == len(thought)
    print(f"\n{mode}: {NUM_THINK - len(thought)} of {NUM_THINK} thinking tokens saved")


def test_load_aware_budget_tightens_once_the_class_misses_its_target(server: VllmServer) -> None:
    xargs = MODES["load-aware (strict class)"]
    first, _logged = ask(server, xargs)
    assert len(first.reasoning.split()) == LOAD_AWARE["budget_tokens"], "no completion yet: the full budget"
    # The scheduler publishes the class's attainment when the request finishes; the worker
    # re-reads the file at most every ATTAINMENT_READ_PERIOD_S, so one period after the file shows
    # it, the worker's next read has it.
    deadline = time.monotonic() + 60.0
    while published_attainment(server, STRICT_CLASS) != 0.0:
        assert time.monotonic() < deadline, f"attainment never published: {published_attainment(server, STRICT_CLASS)}"
        time.sleep(0.05)
    time.sleep(ATTAINMENT_READ_PERIOD_S)
    second, logged = ask(server, xargs)
    assert len(second.reasoning.split()) == LOAD_AWARE["min_budget_tokens"], "attainment 0: the minimum budget"
    assert second.content.split() == LETTERS[:NUM_ANSWER]
    assert logged["thinking_stopped_by"] == "load_aware_budget"
    print(f"\nload-aware: {NUM_THINK - len(second.reasoning.split())} of {NUM_THINK} thinking tokens saved")


@pytest.mark.parametrize(("effort", "num_think"), [("low", 10), ("high", 30)])
def test_reasoning_effort_sets_the_thinking_budget_of_its_level(server: VllmServer, effort: str, num_think: int) -> None:
    # The OpenAI API's field: the middleware hands it on, the processor's core control applies it.
    result, logged = ask(server, None, reasoning_effort=effort)
    assert result.reasoning.split() == countdown()[:num_think]
    assert result.content.split() == LETTERS[:NUM_ANSWER], "the answer follows"
    assert (logged["thinking_stopped_by"], logged["thinking_stopped_after_tokens"]) == ("budget", num_think)


def test_an_effort_that_leaves_no_room_for_the_answer_is_refused_with_400(server: VllmServer) -> None:
    import httpx

    body = {"model": MODEL, "messages": [{"role": "user", "content": "think 3 answer 2"}], "max_tokens": 16,
            "temperature": 0.0, "reasoning_effort": "low"}
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert f"`{EFFORT_ARG}`" in message and "max_tokens is 16" in message, message


@pytest.mark.parametrize(
    ("xargs", "named"),
    [
        ({"meridian_thinking_budget_tokens": 0}, "meridian_thinking_budget_tokens"),
        ({"meridian_thinking": json.dumps({"eat": {"alpha": 3}})}, "meridian_thinking.eat.alpha"),
        ({"meridian_thinking": "on"}, "meridian_thinking"),
        ({"meridian_thinking_budget_tokens": "many"}, "meridian_thinking_budget_tokens"),
    ],
)
def test_a_bad_argument_fails_that_request_alone_with_400(server: VllmServer, xargs: dict[str, Any], named: str) -> None:
    import httpx

    body = {"model": MODEL, "messages": [{"role": "user", "content": "think 3 answer 2"}], "max_tokens": 50,
            "temperature": 0.0, "vllm_xargs": xargs}
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400
    assert f"`{named}`" in response.json()["error"]["message"]
    assert ask(server, None)[0].content.split() == LETTERS[:NUM_ANSWER], "the server still serves"
