"""One HTTP server behind the router in the contract tests: vLLM's OpenAI chat route reduced to
what the router sees, behind Meridian's real ``MeridianFrontend`` as ``--middleware`` adds it.

Run as its own process (``python frontend_server.py --port P --name A --mode serve|shed``), as
each vLLM API server is, so that ``GET /get_load`` reads the snapshots written for this process's
pid in the bus folder (``MERIDIAN_BUS_DIR``), as it reads its engines' in a real server. The route
answers what vLLM's engine would hand the API server: ``serve`` a completion naming this server
and the ``vllm_xargs`` it received; ``shed`` the aborted completion the engine makes of a request
Meridian's triage shed before its first token (stop reason: the core's notice), which the
middleware turns into the configured shed status with ``Retry-After``. ``GET /health`` answers
200 (the router's health check); ``POST /mode`` switches the mode; ``GET /counts`` says what it
served and shed and how often the router polled ``/get_load``. The Meridian configuration
comes from ``--additional-config`` as in ``vllm serve``.
"""

from __future__ import annotations

import argparse
import json
import os
from types import SimpleNamespace
from typing import Any

from fastapi import FastAPI, Request

#: The notice the route's shed completions carry: the core's format, reason ``ttft``, retry in 2 s.
NOTICE = ("meridian:shed:ttft:2: request `r` of class `interactive` cannot meet its TTFT target of 1000 ms under "
          "the current load; retry in 2 s or on another instance")


def build_app(name: str, mode: str, additional_config: dict[str, Any]) -> Any:
    from meridian.vllm.frontend import MeridianFrontend
    from meridian.vllm.names import LOAD_PATH, SCHEDULER_CLS

    app = FastAPI()
    scheduler_config = SimpleNamespace(scheduler_cls=SCHEDULER_CLS, get_scheduler_cls=lambda: object)
    app.state.vllm_config = SimpleNamespace(additional_config=additional_config, scheduler_config=scheduler_config)
    state = {"mode": mode, "served": 0, "shed": 0, "load_polls": 0}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Any:
        body = await request.json()
        if state["mode"] == "shed":
            state["shed"] += 1
            return {"id": "chatcmpl-shed", "object": "chat.completion", "model": "tiny",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": ""},
                                 "finish_reason": "abort", "stop_reason": NOTICE}]}
        state["served"] += 1
        content = json.dumps({"server": name, "vllm_xargs": body.get("vllm_xargs")})
        return {"id": "chatcmpl-ok", "object": "chat.completion", "model": "tiny",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                             "finish_reason": "stop", "stop_reason": None}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "tiny", "object": "model"}]}

    @app.get("/counts")
    async def counts() -> dict[str, Any]:
        return {**state, "pid": os.getpid()}

    @app.post("/mode")
    async def set_mode(request: Request) -> dict[str, str]:
        state["mode"] = (await request.json())["mode"]
        return {"mode": state["mode"]}

    app.add_middleware(MeridianFrontend)

    @app.middleware("http")
    async def count_load_polls(request: Request, call_next: Any) -> Any:
        # Outside MeridianFrontend, which answers /get_load itself: how often the router polled.
        if request.url.path == LOAD_PATH:
            state["load_polls"] += 1
        return await call_next(request)

    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--mode", choices=("serve", "shed"), default="serve")
    parser.add_argument("--additional-config", default="{}")
    args = parser.parse_args()
    app = build_app(args.name, args.mode, json.loads(args.additional_config))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
