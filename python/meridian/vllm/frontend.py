"""``MeridianFrontend``: Meridian's part of vLLM's API server — a request's Meridian arguments
checked before the engine sees them (HTTP 400 naming the argument), a request whose class would
wait past its TTFT target refused as it arrives (admission at arrival), a request that triage
shed before its first token answered with HTTP 429 or 503 (``overload.shed_status``) and
``Retry-After`` instead of an aborted completion, and the load a router polls (``GET
/get_load``).

Selected with ``--middleware meridian.vllm.frontend.MeridianFrontend`` next to ``--scheduler-cls
meridian.vllm.MeridianScheduler`` (``RequestArgsCheck``, its earlier name, is the same class).
Why a middleware: vLLM 0.32's one per-request check in the API server is a logits processor's
``validate_params``, which sees the request and nothing of the server's configuration
(``MeridianThinkingProcessor`` uses it for what needs none), runs only when
``--logits-processors`` names one, and ``get_current_vllm_config()`` is not set there; the plugin
groups loaded in the API server either come before the configuration exists
(``vllm.general_plugins``) or never see a request (``vllm.stat_logger_plugins``). And a request
the scheduler ends can only reach the client as a finished output: the engine core has no way to
choose an HTTP status. ``--middleware`` is vLLM's own server option, and the middleware reaches
the server's ``VllmConfig`` through ``app.state`` (vLLM sets it before serving).

How it checks: it reads nothing itself; it watches the body of each JSON ``POST`` as the route
reads it, and when a ``vllm_xargs`` object in it carries Meridian's arguments the core checks
them against the server's ``meridian`` configuration (``convert.check_request_args``). A
rejection is raised from that read as FastAPI's ``HTTPException``, which FastAPI passes on from a
body read, so vLLM's own handler answers with its error body (``{"error": {"message": ..., "code":
400}}``); vLLM's authentication and CORS layers have run by then, as for any other 400. The
scheduler checks again (the same core function) for what never passes here: requests without a
JSON body, offline ``LLM`` use, servers started without this middleware.

How it admits at arrival (when the configuration asks for it, ``overload.admit_at_arrival``): it
reads a completion request's whole body first, hands its class (or priority) to the core's
``ArrivalGate`` — fed with the engines' published queues (``meridian.vllm.arrival``) — and either
answers the shed status with ``Retry-After`` and the core's notice at once, or passes the body on to the
route unchanged. A body it cannot read, arguments the core rejects (the route answers those with
its 400) and any fault of the gate admit the request.

How it speaks to a router: ``GET /get_load`` answers ``{"load": N}``, N the work ahead on this
server's engines in expected output tokens (the core's ``ArrivalGate.load_tokens`` over the
snapshots the engines publish), an integer because vllm-router's ``power_of_two`` drops anything
else. A retry may say how long its client already waited elsewhere in the ``x-meridian-waited-ms``
header: the body is rewritten to carry it as the ``meridian_waited_ms`` request argument (unless
it carries one already), so the gate and the engine count it against the class's targets.

How it answers a shed request: it holds a completion's response start (and any body that carries
no token yet) until the body shows either a token — then everything goes out as it came, the
client sees no difference but when its headers left — or, first, a choice that finished
``abort`` with a stop reason carrying the core's shed notice (``SHED_MARKER``). Then the client
gets HTTP 429 or 503 with ``Retry-After`` and an OpenAI-style error body with the notice, which OpenAI
clients, load generators and routers treat as "try again later or elsewhere". A request shed
after its first token (a thinking one, under ``shed_running``) ends its stream with that finish
and message.

Invariant: only an argument the core rejects stops a request here, and only a shed notice before
any token turns a response into a 429 or 503; a body the check cannot read, a server not running
``MeridianScheduler``, or a fault of the check itself lets the request and its response through
unchanged (the scheduler remains the last line).
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from meridian.vllm._version import require_supported_vllm

require_supported_vllm()

from fastapi import HTTPException  # noqa: E402

from meridian._core import CLASS_ARG, ArrivalGate, parse_shed_notice  # noqa: E402
from meridian.errors import MeridianError, RequestArgsError  # noqa: E402
from meridian.vllm import convert  # noqa: E402
from meridian.vllm.arrival import ArrivalReader  # noqa: E402
from meridian.vllm.config import config_from_vllm, runs_meridian_scheduler  # noqa: E402
from meridian.vllm.names import (  # noqa: E402
    EFFORT_ARG,
    EFFORT_FIELD,
    EFFORT_LEVELS,
    LOAD_PATH,
    MIDDLEWARE,
    REQUEST_ARGS,
    SCHEDULER_CLS,
    WAITED_ARG,
    WAITED_HEADER,
    XARGS_FIELD,
)

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from meridian._core import Config
    from meridian.vllm.metrics import ArrivalMetrics

logger = logging.getLogger("meridian")

#: Bytes every Meridian argument name starts with: a body without them is not parsed. (A client
#: that escapes plain letters of a key as ``\\u`` sequences skips this check and meets the
#: scheduler's.)
_MARKER = os.path.commonprefix(list(REQUEST_ARGS)).encode()


class MeridianFrontend:
    """ASGI middleware: HTTP 400 for a request whose Meridian arguments the core rejects, HTTP 429 or
    503 with ``Retry-After`` for one refused at arrival or shed before its first token, and ``GET
    /get_load`` for a router (see the module docs)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        #: Decided at the first request (vLLM sets ``app.state`` before serving): whether this
        #: server runs MeridianScheduler, and its configuration.
        self._active: bool | None = None
        self._config: Config | None = None
        #: Admission at arrival (the core's gate over the engines' published queues), when the
        #: configuration asks for it.
        self._gate: ArrivalGate | None = None
        self._reader: ArrivalReader | None = None
        self._refusals: ArrivalMetrics | None = None
        self._gate_failed = False
        #: ``overload.shed_status`` and ``overload.admit_at_arrival`` as the core resolved them.
        self._shed_status = 429
        self._admits = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "GET" and scope.get("path") == LOAD_PATH:
            if self._is_active(scope):
                await self._send_load(send)
                return
        elif scope["type"] == "http" and scope.get("method") == "POST" and _is_json(scope) and self._is_active(scope):
            if scope.get("path", "") in COMPLETION_PATHS:
                waited = _header(scope, WAITED_HEADER.encode())
                if waited is not None or self._admits:
                    messages = await _read_request(receive)
                    body = b"".join(m.get("body", b"") for m in messages)
                    if waited is not None:
                        body = _with_waited(body, waited)
                        messages = [{"type": "http.request", "body": body, "more_body": False}]
                    refusal = self._admit(body) if self._admits else None
                    if refusal is not None:
                        await _send_shed(send, *refusal, self._shed_status)
                        return
                    receive = _Replay(messages, receive).receive
                send = _ShedAnswer(send, self._shed_status).send
            receive = _BodyCheck(receive, self._config, scope.get("path", "") in COMPLETION_PATHS).receive
        await self.app(scope, receive, send)

    def _is_active(self, scope: Scope) -> bool:
        if self._active is None:
            self._active, self._config = _server_config(scope)
            if self._config is not None:
                self._gate, self._reader = ArrivalGate(self._config), ArrivalReader()
                self._shed_status = self._config.shed_status
                self._admits = self._config.admits_at_arrival
                if self._admits:
                    self._refusals = _refusal_metrics(scope, self._config)
        return self._active

    async def _send_load(self, send: Send) -> None:
        """``{"load": N}``: the work ahead on this server's engines in expected output tokens, an
        integer as vllm-router's ``power_of_two`` reads it (0 before any engine has published)."""
        assert self._gate is not None and self._reader is not None
        try:
            texts = self._reader.texts()
            if texts is not None:
                self._gate.set_snapshots(texts)
        except MeridianError:
            pass  # a torn snapshot: the previous ones stay
        body = json.dumps({"load": self._gate.load_tokens}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def _admit(self, body: bytes) -> tuple[str, int] | None:
        """The refusal (notice, retry-after seconds) of a request the gate refuses at arrival, or
        ``None``. A body this cannot read, arguments the core rejects (the route answers 400) or
        a fault of the gate admit it: the engine's triage remains."""
        assert self._gate is not None and self._reader is not None
        try:
            request = json.loads(body)
            if not isinstance(request, dict):
                return None
            xargs = request.get(XARGS_FIELD)
            xargs = xargs if isinstance(xargs, dict) else {}
            convert.check_request_args(xargs, self._config)
            slo_class = xargs.get(CLASS_ARG)
            priority = request.get("priority", 0)
            waited_ms = xargs.get(WAITED_ARG)
            texts = self._reader.texts()
            if texts is not None:
                self._gate.set_snapshots(texts)
            slo_class, _, message, retry_after_s = self._gate.decide(
                time.time() * 1000.0,
                slo_class if isinstance(slo_class, str) else None,
                priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
                float(waited_ms) if isinstance(waited_ms, (int, float)) else 0.0,
            )
        except (ValueError, RequestArgsError, MeridianError):
            return None
        except Exception:  # noqa: BLE001 - admission never fails a request
            if not self._gate_failed:
                self._gate_failed = True
                logger.exception("meridian: admission at arrival failed; requests are admitted")
            return None
        if message is None or retry_after_s is None:
            return None
        if self._refusals is not None:
            self._refusals.refused(slo_class)
        return message, retry_after_s


#: The name this middleware had before it also answered shed requests; existing deployments'
#: ``--middleware meridian.vllm.frontend.RequestArgsCheck`` keeps working.
RequestArgsCheck = MeridianFrontend

#: The OpenAI-API routes whose responses carry choices with a finish and a stop reason.
COMPLETION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
#: The largest ``max_tokens`` the core takes (a larger one caps nothing more).
MAX_U32 = 2**32 - 1
#: Bytes of a response held while no token has shown: past this it goes out as it is.
MAX_HELD_BYTES = 1 << 20


def _server_config(scope: Scope) -> tuple[bool, Config | None]:
    """Whether the server runs MeridianScheduler, and its Meridian configuration."""
    try:
        vllm_config = scope["app"].state.vllm_config
        if not runs_meridian_scheduler(vllm_config):
            logger.warning(
                "meridian: %s is configured but vLLM does not run --scheduler-cls %s; it checks nothing",
                MIDDLEWARE,
                SCHEDULER_CLS,
            )
            return False, None
        return True, config_from_vllm(vllm_config)
    except Exception:  # noqa: BLE001 - without the configuration the scheduler still checks
        logger.exception("meridian: %s could not read the server's configuration; it checks nothing", MIDDLEWARE)
        return False, None


def _refusal_metrics(scope: Scope, config: Config) -> ArrivalMetrics | None:
    """The counter of refusals at arrival, beside the engines' series on ``/metrics`` (none when
    the configuration turns the series off or the folder cannot be had)."""
    if not config.metrics:
        return None
    try:
        from meridian.vllm.metrics import ArrivalMetrics, metrics_dir, served_model_name

        vllm_config = scope["app"].state.vllm_config
        return ArrivalMetrics(metrics_dir(vllm_config), served_model_name(vllm_config), config.class_names)
    except Exception:  # noqa: BLE001 - the refusals still happen, only uncounted
        logger.exception("meridian: cannot count refusals at arrival on /metrics")
        return None


def _header(scope: Scope, name: bytes) -> bytes | None:
    """A request header's value (the first, when repeated), or ``None``."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


def _with_waited(body: bytes, header: bytes) -> bytes:
    """The body with the ``x-meridian-waited-ms`` header's value as its ``meridian_waited_ms``
    request argument (one the body carries itself wins), for the core to check and count. A body
    that is not a JSON object goes on as it came (vLLM answers it); a header value that is not a
    number goes on as it came, text, so the core's check names it in a 400."""
    try:
        request = json.loads(body)
    except ValueError:
        return body
    if not isinstance(request, dict):
        return body
    xargs = request.get(XARGS_FIELD)
    xargs = dict(xargs) if isinstance(xargs, dict) else {}
    if xargs.get(WAITED_ARG) is not None:
        return body
    text = header.decode("latin-1").strip()
    try:
        value: float | str = float(text)
    except ValueError:
        value = text
    request[XARGS_FIELD] = {**xargs, WAITED_ARG: value}
    return json.dumps(request).encode()


def _is_json(scope: Scope) -> bool:
    """Whether FastAPI would read the body as JSON (no content type, or a JSON one) and it is not
    compressed."""
    content_type = None
    for name, value in scope.get("headers", ()):
        if name == b"content-encoding":
            return False
        if name == b"content-type":
            content_type = value.split(b";", 1)[0].strip().lower()
    return content_type is None or content_type == b"application/json" or content_type.endswith(b"+json")


class _BodyCheck:
    """Wraps one request's ``receive``: collects the body as the route reads it, hands its OpenAI
    ``reasoning_effort`` on as the ``meridian_reasoning_effort`` request argument (completion
    routes), checks it, and passes it on as one message."""

    def __init__(self, receive: Receive, config: Config | None, completion: bool) -> None:
        self._receive = receive
        self._config = config
        self._completion = completion
        self._done = False

    async def receive(self) -> Message:
        message = await self._receive()
        if self._done or message["type"] != "http.request":
            return message
        chunks = [message.get("body", b"")]
        while message.get("more_body", False):
            message = await self._receive()
            if message["type"] != "http.request":
                return message  # the client went away mid-body: the route sees that
            chunks.append(message.get("body", b""))
        self._done = True
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if self._completion:
            body = _with_effort(body)
        check_body(body, self._config)
        return {"type": "http.request", "body": body, "more_body": False}


def _with_effort(body: bytes) -> bytes:
    """The body with its ``reasoning_effort`` (a level Meridian maps onto a budget) as the
    ``meridian_reasoning_effort`` request argument, unless the body sets that argument itself."""
    if EFFORT_FIELD.encode() not in body:
        return body
    try:
        request = json.loads(body)
    except ValueError:
        return body
    if not isinstance(request, dict) or request.get(EFFORT_FIELD) not in EFFORT_LEVELS:
        return body
    xargs = request.get(XARGS_FIELD)
    xargs = dict(xargs) if isinstance(xargs, dict) else {}
    if xargs.get(EFFORT_ARG) is not None:
        return body
    request[XARGS_FIELD] = {**xargs, EFFORT_ARG: request[EFFORT_FIELD]}
    return json.dumps(request).encode()


def check_body(body: bytes, config: Config | None) -> None:
    """Raises ``HTTPException`` (400, the core's message naming the argument) when the request
    body's ``vllm_xargs`` carry a Meridian argument the core rejects; returns otherwise."""
    if _MARKER not in body:
        return
    try:
        request = json.loads(body)
    except Exception:  # noqa: BLE001 - vLLM answers a malformed body itself
        return
    xargs = request.get(XARGS_FIELD) if isinstance(request, dict) else None
    if not isinstance(xargs, dict):
        return
    max_tokens = request.get("max_completion_tokens", request.get("max_tokens"))
    priority = request.get("priority", 0)
    try:
        convert.check_request_args(
            xargs,
            config,
            min(max_tokens, MAX_U32)
            if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= 0
            else None,
            priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
        )
    except RequestArgsError as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None
    except Exception:  # noqa: BLE001 - a fault of the check never fails a request; the scheduler checks
        logger.exception("meridian: checking a request's arguments failed; the request goes on")


class _ShedAnswer:
    """Wraps one response's ``send``: holds the response start and the body until it shows a token
    (or the response ends), then lets everything through — or answers the shed status when the
    first thing it shows is a shed notice."""

    def __init__(self, send: Send, status: int) -> None:
        self._send = send
        self._status = status
        self._start: Message | None = None
        self._held: list[Message] = []
        self._decided = False
        #: A shed answer went out instead: the rest of the route's response goes nowhere.
        self._replaced = False

    async def send(self, message: Message) -> None:
        if self._replaced:
            return
        if self._decided:
            await self._send(message)
            return
        if message["type"] == "http.response.start":
            if message.get("status") != 200:
                self._decided = True
                await self._send(message)
                return
            self._start = message
            return
        if message["type"] != "http.response.body":
            await self._release()
            await self._send(message)
            return
        self._held.append(message)
        body = b"".join(m.get("body", b"") for m in self._held)
        more = bool(message.get("more_body", False))
        try:
            verdict = _verdict(body, self._streaming(), finished=not more)
        except Exception:  # noqa: BLE001 - a fault of the check never changes a response
            logger.exception("meridian: reading a response for a shed notice failed; it goes out unchanged")
            verdict = _RELEASE
        if verdict is _HOLD and more and len(body) <= MAX_HELD_BYTES:
            return
        if isinstance(verdict, tuple):
            await self._answer_shed(*verdict)
        else:
            await self._release()

    def _streaming(self) -> bool:
        headers = dict(self._start.get("headers", ())) if self._start else {}
        return bool(headers.get(b"content-type", b"").split(b";", 1)[0].strip() == b"text/event-stream")

    async def _release(self) -> None:
        self._decided = True
        if self._start is not None:
            await self._send(self._start)
        for held in self._held:
            await self._send(held)
        self._held.clear()

    async def _answer_shed(self, message: str, retry_after_s: int) -> None:
        self._decided = self._replaced = True
        self._held.clear()
        await _send_shed(self._send, message, retry_after_s, self._status)


#: The OpenAI error type of each shed status (the names OpenAI's clients give them).
_ERROR_TYPES = {429: "RateLimitError", 503: "ServiceUnavailableError"}


async def _send_shed(send: Send, message: str, retry_after_s: int, status: int) -> None:
    """HTTP ``status`` (429 or 503, ``overload.shed_status``) with ``Retry-After`` and an
    OpenAI-style error body carrying the shed notice."""
    body = json.dumps(
        {"error": {"message": message, "type": _ERROR_TYPES[status], "param": None, "code": status}}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(retry_after_s).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _read_request(receive: Receive) -> list[Message]:
    """Every message of a request's body (up to its last part, or a disconnect)."""
    messages = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            return messages


class _Replay:
    """A request's ``receive`` that gives back the messages already read, then the rest."""

    def __init__(self, messages: list[Message], receive: Receive) -> None:
        self._messages = list(messages)
        self._receive = receive

    async def receive(self) -> Message:
        if self._messages:
            return self._messages.pop(0)
        return await self._receive()


#: ``_verdict``'s answers besides a shed notice ``(message, retry_after_s)``.
_HOLD, _RELEASE = object(), object()


def _verdict(body: bytes, streaming: bool, finished: bool) -> object:
    """What the response so far says: a shed notice before any token (``(message,
    retry_after_s)``), ``_RELEASE`` once a token (or anything else) shows, ``_HOLD`` while
    nothing has."""
    if not streaming:
        if not finished:
            return _HOLD
        return _choices_verdict(json.loads(body), final=True)
    for event in body.split(b"\n\n")[:-1] if not finished else body.split(b"\n\n"):
        data = event.strip().removeprefix(b"data:").strip()
        if not data:
            continue
        if data == b"[DONE]":
            return _RELEASE
        verdict = _choices_verdict(json.loads(data), final=False)
        if verdict is not _HOLD:
            return verdict
    return _RELEASE if finished else _HOLD


def _choices_verdict(payload: Any, final: bool) -> object:
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices:
        return _RELEASE
    for choice in choices:
        if not isinstance(choice, dict):
            return _RELEASE
        stop_reason = choice.get("stop_reason")
        notice = parse_shed_notice(stop_reason) if isinstance(stop_reason, str) else None
        if choice.get("finish_reason") == "abort" and notice is not None and not _has_tokens(choice):
            return stop_reason, notice[1]
        if _has_tokens(choice) or choice.get("finish_reason") is not None:
            return _RELEASE
    return _RELEASE if final else _HOLD


def _has_tokens(choice: dict[str, Any]) -> bool:
    """Whether a choice (or a stream delta) carries output: text, reasoning or tool calls."""
    parts = [choice.get("text"), choice.get("message"), choice.get("delta")]
    for part in parts:
        if isinstance(part, str) and part:
            return True
        if isinstance(part, dict) and any(
            part.get(k) for k in ("content", "reasoning_content", "reasoning", "tool_calls")
        ):
            return True
    return False
