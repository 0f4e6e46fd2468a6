"""``RequestArgsCheck``: a request's Meridian arguments checked in vLLM's API server, so a bad one
is that request's HTTP 400 naming the argument, before the engine sees it.

Selected with ``--middleware meridian.vllm.frontend.RequestArgsCheck`` next to ``--scheduler-cls
meridian.vllm.MeridianScheduler``. Why a middleware: vLLM 0.32's one per-request check in the
API server is a logits processor's ``validate_params``, which sees the request and nothing of the
server's configuration (``MeridianThinkingProcessor`` uses it for what needs none), runs only
when ``--logits-processors`` names one, and ``get_current_vllm_config()`` is not set there; the
plugin groups loaded in the API server either come before the configuration exists
(``vllm.general_plugins``) or never see a request (``vllm.stat_logger_plugins``). A class the
server does not define was therefore caught only in the engine core, where vLLM can fail a
request only as an internal error (HTTP 500, or an error event in the stream). ``--middleware``
is vLLM's own server option, and the middleware reaches the server's ``VllmConfig`` through
``app.state`` (vLLM sets it before serving).

How it answers: it reads nothing itself; it watches the body of each JSON ``POST`` as the route
reads it, and when a ``vllm_xargs`` object in it carries Meridian's arguments the core checks
them against the server's ``meridian`` configuration (``convert.check_request_args``). A
rejection is raised from that read as FastAPI's ``HTTPException``, which FastAPI passes on from a
body read, so vLLM's own handler answers with its error body (``{"error": {"message": ..., "code":
400}}``); vLLM's authentication and CORS layers have run by then, as for any other 400. The
scheduler checks again (the same core function) for what never passes here: requests without a
JSON body, offline ``LLM`` use, servers started without this middleware.

Invariant: only an argument the core rejects stops a request here; a body the check cannot read,
a server not running ``MeridianScheduler``, or a fault of the check itself lets the request
through unchanged (the scheduler remains the last line).
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any

from meridian.vllm._version import require_supported_vllm

require_supported_vllm()

from fastapi import HTTPException  # noqa: E402

from meridian.errors import RequestArgsError  # noqa: E402
from meridian.vllm import convert  # noqa: E402
from meridian.vllm.config import config_from_vllm  # noqa: E402
from meridian.vllm.names import MIDDLEWARE, REQUEST_ARGS, SCHEDULER_CLS, XARGS_FIELD  # noqa: E402

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from meridian._core import Config

logger = logging.getLogger("meridian")

#: Bytes every Meridian argument name starts with: a body without them is not parsed. (A client
#: that escapes plain letters of a key as ``\\u`` sequences skips this check and meets the
#: scheduler's.)
_MARKER = os.path.commonprefix(list(REQUEST_ARGS)).encode()


class RequestArgsCheck:
    """ASGI middleware: HTTP 400 for a request whose Meridian arguments the core rejects (see the
    module docs)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        #: Decided at the first request (vLLM sets ``app.state`` before serving): whether this
        #: server runs MeridianScheduler, and its configuration.
        self._active: bool | None = None
        self._config: Config | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST" and _is_json(scope) and self._is_active(scope):
            receive = _BodyCheck(receive, self._config).receive
        await self.app(scope, receive, send)

    def _is_active(self, scope: Scope) -> bool:
        if self._active is None:
            self._active, self._config = _server_config(scope)
        return self._active


def _server_config(scope: Scope) -> tuple[bool, Config | None]:
    """Whether the server runs MeridianScheduler, and its Meridian configuration."""
    try:
        vllm_config = scope["app"].state.vllm_config
        if not _runs_meridian_scheduler(vllm_config):
            logger.warning(
                "meridian: %s is configured but vLLM does not run --scheduler-cls %s; it checks nothing",
                MIDDLEWARE, SCHEDULER_CLS,
            )
            return False, None
        return True, config_from_vllm(vllm_config)
    except Exception:  # noqa: BLE001 - without the configuration the scheduler still checks
        logger.exception("meridian: %s could not read the server's configuration; it checks nothing", MIDDLEWARE)
        return False, None


def _runs_meridian_scheduler(vllm_config: Any) -> bool:
    scheduler_cls = vllm_config.scheduler_config.scheduler_cls
    if scheduler_cls is None:
        return False
    if isinstance(scheduler_cls, str) and scheduler_cls == SCHEDULER_CLS:
        return True
    from meridian.vllm.scheduler import MeridianScheduler

    resolved = vllm_config.scheduler_config.get_scheduler_cls()
    return isinstance(resolved, type) and issubclass(resolved, MeridianScheduler)


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
    """Wraps one request's ``receive``: passes every message on, and checks the body once it is
    complete, as the route reads it."""

    def __init__(self, receive: Receive, config: Config | None) -> None:
        self._receive = receive
        self._config = config
        self._chunks: list[bytes] | None = []

    async def receive(self) -> Message:
        message = await self._receive()
        if self._chunks is not None and message["type"] == "http.request":
            self._chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                body = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
                self._chunks = None
                check_body(body, self._config)
        return message


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
    try:
        convert.check_request_args(xargs, config)
    except RequestArgsError as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None
    except Exception:  # noqa: BLE001 - a fault of the check never fails a request; the scheduler checks
        logger.exception("meridian: checking a request's arguments failed; the request goes on")
