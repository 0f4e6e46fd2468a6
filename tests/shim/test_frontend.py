"""Meridian's API-server middleware (``meridian.vllm.frontend.MeridianFrontend``) on a FastAPI app
wired as vLLM wires its own: vLLM's exception handlers, its authentication middleware inside ours
(``--middleware`` is added last), a route whose body is read by FastAPI; the core's argument check
through ``convert``, and shed requests answered with HTTP 503 from what the route streams or
returns. The real server is ``tests/live/test_middleware.py``."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import BaseModel

from meridian._core import Config, check_request_args
from meridian.errors import RequestArgsError
from meridian.vllm.names import (
    CLASS_ARG, EFFORT_ARG, LOAD_PATH, MIDDLEWARE, SCHEDULER_CLS, THINKING_ARG, THINKING_BUDGET_ARG, WAITED_ARG, WAITED_HEADER,
    XARGS_FIELD,
)

pytestmark = pytest.mark.vllm

GOLD = {"classes": {"gold": {"ttft_ms": 500, "ttfat_ms": 5000, "answer_tpot_ms": 40, "rank": 0}},
        "default_class": "gold", "priority_map": {"0": "gold"}}
API_KEY = "sesame"


class Body(BaseModel):
    """The part of a chat request the check reads, typed as vLLM types it; ``reply`` picks what
    the route answers (the tests of shed answers)."""

    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    reply: str | None = None


def test_the_core_checks_the_class_against_the_configuration_it_is_given() -> None:
    from meridian.vllm.convert import check_request_args as shim_check

    gold = Config.from_json(json.dumps(GOLD))
    shim_check({CLASS_ARG: "gold", "kv_transfer_params": {"x": 1}}, gold)
    shim_check({CLASS_ARG: "anything"}, None)
    shim_check(None, gold)
    unknown = "`meridian_class`: unknown SLO class `standard`; configured classes: gold"
    with pytest.raises(RequestArgsError, match=unknown):
        shim_check({CLASS_ARG: "standard"}, gold)
    with pytest.raises(RequestArgsError, match=f"`{THINKING_BUDGET_ARG}`"):
        shim_check({THINKING_BUDGET_ARG: float("nan")}, None)
    with pytest.raises(RequestArgsError, match=f"`{THINKING_ARG}.eat.alpha`"):
        check_request_args(json.dumps({THINKING_ARG: {"eat": {"alpha": 3}}}), None)


def make_app(additional_config: dict[str, Any], scheduler_cls: str = SCHEDULER_CLS) -> tuple[Any, list[Any]]:
    """A FastAPI app with vLLM's error handling and authentication, the check as ``--middleware``
    adds it, and one chat route; returns the app and the bodies the route received."""
    from fastapi import FastAPI
    from vllm.entrypoints.serve.exception_handling.register import init_exception_handler
    from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

    from fastapi.responses import StreamingResponse

    from meridian.vllm.frontend import MeridianFrontend

    received: list[Any] = []
    app = FastAPI()
    init_exception_handler(app)
    app.state.args = SimpleNamespace(log_error_stack=False)
    scheduler_config = SimpleNamespace(scheduler_cls=scheduler_cls, get_scheduler_cls=lambda: object)
    app.state.vllm_config = SimpleNamespace(additional_config=additional_config, scheduler_config=scheduler_config)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: Body) -> Any:
        received.append(body.vllm_xargs)
        if body.reply is None:
            return {"ok": True}
        if body.reply.startswith("stream:"):
            events = REPLIES[body.reply]

            async def stream() -> Any:
                for event in events:
                    yield f"data: {json.dumps(event)}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(stream(), media_type="text/event-stream")
        return REPLIES[body.reply]

    app.add_middleware(AuthenticationMiddleware, tokens=[API_KEY])
    app.add_middleware(MeridianFrontend)
    assert f"{MeridianFrontend.__module__}.{MeridianFrontend.__name__}" == MIDDLEWARE
    return app, received


NOTICE = ("meridian:shed:ttft:2: request `r` of class `gold` cannot meet its TTFT target of 500 ms under the "
          "current load; retry in 2 s or on another instance")


def _choice(finish: str | None = None, stop: str | None = None, **delta: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish, "stop_reason": stop}]}


#: What the route answers, by ``reply``: vLLM's shapes of a chat completion and its stream.
REPLIES: dict[str, Any] = {
    "shed": {"choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "abort",
                          "stop_reason": NOTICE}]},
    "answered": {"choices": [{"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop",
                              "stop_reason": None}]},
    # A notice-like stop reason on a finish that is not an abort is not a shed request.
    "stopped-with-text": {"choices": [{"index": 0, "message": {"role": "assistant", "content": ""},
                                       "finish_reason": "stop", "stop_reason": NOTICE}]},
    "stream:shed": [_choice(role="assistant", content=""), _choice("abort", NOTICE)],
    "stream:answered": [_choice(role="assistant", content=""), _choice(reasoning_content="hm"), _choice(content="4"),
                        _choice("stop")],
    # Shed after its thinking began: the stream is the client's already.
    "stream:shed-late": [_choice(role="assistant", content=""), _choice(reasoning_content="hm"), _choice("abort", NOTICE)],
}


def post(app: Any, body: Any, *, auth: bool = True, content_type: str | None = None) -> Any:
    from starlette.testclient import TestClient

    headers = {"Authorization": f"Bearer {API_KEY}"} if auth else {}
    if content_type is not None:
        headers["content-type"] = content_type
    with TestClient(app) as client:
        if isinstance(body, bytes):
            return client.post("/v1/chat/completions", content=body, headers=headers)
        return client.post("/v1/chat/completions", json=body, headers=headers)


@pytest.mark.parametrize(
    ("xargs", "named"),
    [
        ({CLASS_ARG: "standard"}, CLASS_ARG),  # a default class, but not this server's
        ({CLASS_ARG: 3}, CLASS_ARG),
        ({THINKING_BUDGET_ARG: -5}, THINKING_BUDGET_ARG),
        ({THINKING_BUDGET_ARG: "many"}, THINKING_BUDGET_ARG),
        ({THINKING_ARG: json.dumps({"eat": {"alpha": 3}})}, f"{THINKING_ARG}.eat.alpha"),
    ],
)
def test_a_bad_argument_is_a_400_naming_it_and_never_reaches_the_route(xargs: dict[str, Any], named: str) -> None:
    app, received = make_app({"meridian": GOLD})
    response = post(app, {XARGS_FIELD: xargs})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == 400 and f"`{named}`" in error["message"], error
    assert received == []


def test_good_and_foreign_arguments_pass_untouched() -> None:
    app, received = make_app({"meridian": GOLD})
    good = {CLASS_ARG: "gold", THINKING_BUDGET_ARG: 12, "other": "x"}
    assert post(app, {XARGS_FIELD: good}).status_code == 200
    assert post(app, {"messages": [{"role": "user", "content": "meridian_class, in a prompt"}]}).status_code == 200
    assert post(app, {XARGS_FIELD: {"other": "meridian_class"}}).status_code == 200
    assert received == [good, None, {"other": "meridian_class"}]


def test_the_openai_reasoning_effort_reaches_the_engine_as_the_effort_argument() -> None:
    app, received = make_app({"meridian": GOLD})
    assert post(app, {"reasoning_effort": "low", "max_tokens": 4096}).status_code == 200
    # The levels Meridian does not map (vLLM's chat template reads them) pass untouched.
    assert post(app, {"reasoning_effort": "none"}).status_code == 200
    # An effort argument the client sets itself wins over the API field.
    assert post(app, {"reasoning_effort": "high", XARGS_FIELD: {EFFORT_ARG: "low"}}).status_code == 200
    assert post(app, {"reasoning_effort": "medium", XARGS_FIELD: {CLASS_ARG: "gold"}}).status_code == 200
    assert received == [{EFFORT_ARG: "low"}, None, {EFFORT_ARG: "low"}, {CLASS_ARG: "gold", EFFORT_ARG: "medium"}]


@pytest.mark.parametrize("cap_field", ["max_tokens", "max_completion_tokens"])
def test_an_effort_that_leaves_no_room_for_the_answer_is_a_400(cap_field: str) -> None:
    room = {"thinking_control": {"reasoning_effort": {"answer_room_tokens": 200}}}
    app, received = make_app({"meridian": {**GOLD, **room}})
    response = post(app, {"reasoning_effort": "high", cap_field: 150})
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert f"`{EFFORT_ARG}`" in message and "max_tokens is 150" in message and "above 200" in message, message
    assert post(app, {"reasoning_effort": "high", cap_field: 201}).status_code == 200
    assert post(app, {XARGS_FIELD: {EFFORT_ARG: "extreme"}}).status_code == 400
    assert received == [{EFFORT_ARG: "high"}]


def test_what_the_check_cannot_read_is_vllms_to_answer() -> None:
    app, received = make_app({"meridian": GOLD})
    # Malformed JSON, and a body FastAPI does not read as JSON: vLLM's own answers, not the
    # check's (the scheduler checks whatever still reaches the engine).
    malformed = post(app, b'{"vllm_xargs": {"meridian_class": ', content_type="application/json")
    text = post(app, json.dumps({XARGS_FIELD: {CLASS_ARG: "standard"}}).encode(), content_type="text/plain")
    for response in (malformed, text):
        assert response.status_code == 400 and "invalid request argument" not in response.text, response.text
    assert received == []


def test_hostile_bodies_get_a_short_400_or_vllms_own_answer() -> None:
    app, received = make_app({"meridian": GOLD})
    # A megabyte class name: refused naming the argument, without echoing the megabyte back.
    huge = post(app, {XARGS_FIELD: {CLASS_ARG: "g" * (1 << 20)}})
    assert huge.status_code == 400 and f"`{CLASS_ARG}`" in huge.text and len(huge.content) < 1000, huge.text[:300]
    # Nested past the JSON parser's recursion limit: the check cannot read it and lets it pass,
    # and FastAPI refuses it as it refuses any body it cannot parse; the server serves on.
    deep = (b'{"vllm_xargs": {"meridian_class": "standard"}, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    refused = post(app, deep, content_type="application/json")
    assert refused.status_code == 400 and "invalid request argument" not in refused.text, refused.text
    assert post(app, {XARGS_FIELD: {CLASS_ARG: "gold"}}).status_code == 200
    assert received == [{CLASS_ARG: "gold"}]


def test_authentication_answers_first() -> None:
    app, received = make_app({"meridian": GOLD})
    response = post(app, {XARGS_FIELD: {CLASS_ARG: "standard"}}, auth=False)
    assert response.status_code == 401
    assert "standard" not in response.text and received == []


def test_on_a_server_without_meridians_scheduler_it_checks_nothing(caplog: pytest.LogCaptureFixture) -> None:
    app, received = make_app({}, scheduler_cls="vllm.v1.core.sched.async_scheduler.AsyncScheduler")
    assert post(app, {XARGS_FIELD: {CLASS_ARG: "gold"}}).status_code == 200
    assert received == [{CLASS_ARG: "gold"}]
    assert "checks nothing" in caplog.text


@pytest.mark.parametrize(("shed_status", "error_type"), [(None, "RateLimitError"), (503, "ServiceUnavailableError")])
def test_a_request_shed_before_its_first_token_is_the_shed_status_with_retry_after(
    shed_status: int | None, error_type: str
) -> None:
    overload = {} if shed_status is None else {"overload": {"shed_status": shed_status}}
    app, _ = make_app({"meridian": {**GOLD, **overload}})
    expected = shed_status or 429  # the default: a router retries it without marking the server failed
    for reply in ("shed", "stream:shed"):
        response = post(app, {"reply": reply})
        assert response.status_code == expected, (reply, response.text)
        assert response.headers["retry-after"] == "2"
        error = response.json()["error"]
        assert error["code"] == expected and error["type"] == error_type and error["message"] == NOTICE


def test_every_other_response_goes_out_as_it_came() -> None:
    app, _ = make_app({"meridian": GOLD})
    for reply in ("answered", "stopped-with-text"):
        response = post(app, {"reply": reply})
        assert response.status_code == 200 and response.json() == REPLIES[reply], reply
    for reply in ("stream:answered", "stream:shed-late"):
        response = post(app, {"reply": reply})
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line.removeprefix("data: ")) for line in response.text.split("\n\n")
                  if line.startswith("data: {")]
        assert events == REPLIES[reply], reply
        assert response.text.rstrip().endswith("data: [DONE]")


def _publish(folder: Any, num_ahead: int, *, age_ms: float = 0.0, free_seats: int = 0,
             expected_output_tokens: float = 0.0, pid: int = 4242) -> None:
    """An engine's snapshot in ``folder`` as an engine core of this process would write it: one
    start a second, ``num_ahead`` viable requests waiting ahead of every class. Taken now: the
    gate trusts a snapshot for two seconds only, so publish after building the app (the first
    import of vLLM's server takes longer)."""
    import os
    import time

    from meridian._core import ARRIVAL_SNAPSHOT_FORMAT

    snapshot = {"format": ARRIVAL_SNAPSHOT_FORMAT, "taken_ms": time.time() * 1000.0 - age_ms, "starts_per_s": 1.0,
                "free_seats": free_seats, "first_token_lead_ms": 10.0,
                "num_ahead": [["gold", num_ahead], ["patient", num_ahead]],
                "expected_output_tokens": expected_output_tokens}
    (folder / f"meridian-arrival-{os.getpid()}-{pid}.json").write_text(json.dumps(snapshot))


#: ``GOLD`` and a class whose late requests queue: only ``gold``'s are refused at arrival.
TWO_CLASSES = {"classes": {**GOLD["classes"], "patient": {"ttft_ms": 500, "ttfat_ms": 5000, "answer_tpot_ms": 40,
                                                        "rank": 1, "on_overload": "queue"}},
               "default_class": "gold"}


@pytest.fixture
def bus(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    from meridian.vllm.names import BUS_DIR_ENV

    folder = tmp_path / "bus"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv(BUS_DIR_ENV, str(folder))
    return folder


def test_a_request_whose_class_would_miss_its_ttft_is_refused_at_arrival_before_the_route(bus: Any) -> None:
    app, received = make_app({"meridian": TWO_CLASSES})
    _publish(bus, num_ahead=5)  # five ahead at one start a second: ~6 s against a 0.5 s target
    response = post(app, {XARGS_FIELD: {CLASS_ARG: "gold"}})
    assert response.status_code == 429, response.text
    assert int(response.headers["retry-after"]) >= 5
    error = response.json()["error"]
    assert error["code"] == 429 and error["message"].startswith("meridian:shed:ttft:"), error
    assert "`gold`" in error["message"] and received == []
    # A class whose late requests queue is admitted; a bad argument is still the route's 400.
    assert post(app, {XARGS_FIELD: {CLASS_ARG: "patient"}}).status_code == 200
    assert post(app, {XARGS_FIELD: {CLASS_ARG: "gold", THINKING_BUDGET_ARG: -5}}).status_code == 400
    assert received == [{CLASS_ARG: "patient"}]


def test_an_empty_queue_or_a_stale_snapshot_admits(bus: Any) -> None:
    app, _ = make_app({"meridian": TWO_CLASSES})
    _publish(bus, num_ahead=0, free_seats=4)
    assert post(app, {XARGS_FIELD: {CLASS_ARG: "gold"}, "reply": "answered"}).status_code == 200
    _publish(bus, num_ahead=50, age_ms=10_000.0)  # an engine that stopped publishing
    app, _ = make_app({"meridian": TWO_CLASSES})
    assert post(app, {XARGS_FIELD: {CLASS_ARG: "gold"}}).status_code == 200
    (bus / next(p.name for p in bus.iterdir())).write_text("{not json")
    app, received = make_app({"meridian": TWO_CLASSES})
    assert post(app, {XARGS_FIELD: {CLASS_ARG: "gold"}}).status_code == 200, "a torn file admits"
    assert received == [{CLASS_ARG: "gold"}]


def test_admission_at_arrival_can_be_turned_off(bus: Any) -> None:
    app, received = make_app({"meridian": {**TWO_CLASSES, "overload": {"admit_at_arrival": False}}})
    _publish(bus, num_ahead=50)
    assert post(app, {XARGS_FIELD: {CLASS_ARG: "gold"}}).status_code == 200


def get_load(app: Any) -> Any:
    from starlette.testclient import TestClient

    with TestClient(app) as client:
        return client.get(LOAD_PATH)


def test_get_load_is_the_work_ahead_on_every_engine_as_an_integer(bus: Any) -> None:
    app, _ = make_app({"meridian": {**GOLD, "overload": {"admit_at_arrival": False}}})
    response = get_load(app)
    assert response.status_code == 200 and response.json() == {"load": 0}, "no engine has published yet"
    _publish(bus, num_ahead=3, expected_output_tokens=1234.6)
    _publish(bus, num_ahead=0, expected_output_tokens=100.0, pid=4243, age_ms=60_000.0)  # idle, its last word
    app, _ = make_app({"meridian": GOLD})
    load = get_load(app).json()["load"]
    assert load == 1335 and isinstance(load, int), "vllm-router's power_of_two drops a float"
    # A server that does not run Meridian's scheduler leaves the route to vLLM (here: none).
    app, _ = make_app({}, scheduler_cls="vllm.v1.core.sched.async_scheduler.AsyncScheduler")
    assert get_load(app).status_code == 404


def post_waited(app: Any, body: Any, waited: str) -> Any:
    from starlette.testclient import TestClient

    with TestClient(app) as client:
        return client.post("/v1/chat/completions", json=body,
                           headers={"Authorization": f"Bearer {API_KEY}", WAITED_HEADER: waited})


def test_a_retry_header_becomes_the_waited_argument_and_counts_against_the_target(bus: Any) -> None:
    app, received = make_app({"meridian": TWO_CLASSES})
    _publish(bus, num_ahead=0, free_seats=4)  # a seat free: ~10 ms to a first token
    assert post_waited(app, {XARGS_FIELD: {CLASS_ARG: "gold"}}, "120.5").status_code == 200
    assert received == [{CLASS_ARG: "gold", WAITED_ARG: 120.5}]
    # The body's own value wins over the header.
    assert post_waited(app, {XARGS_FIELD: {CLASS_ARG: "gold", WAITED_ARG: 7}}, "300").status_code == 200
    assert received[-1] == {CLASS_ARG: "gold", WAITED_ARG: 7}
    # Waited 600 ms of a 500 ms TTFT target already: refused at once, the wait named.
    refused = post_waited(app, {XARGS_FIELD: {CLASS_ARG: "gold"}}, "600")
    assert refused.status_code == 429 and "600 ms already waited" in refused.json()["error"]["message"]
    for bad in ("soon", "-5", "nan"):
        response = post_waited(app, {XARGS_FIELD: {CLASS_ARG: "gold"}}, bad)
        assert response.status_code == 400 and f"`{WAITED_ARG}`" in response.text, (bad, response.text)
    assert len(received) == 2
