"""Live: ``vllm serve`` (CPU build, tiny reasoning model) with ``--scheduler-cls
meridian.vllm.MeridianScheduler`` and ``--middleware meridian.vllm.frontend.RequestArgsCheck``,
no logits processor, and classes of its own: while one request streams, requests naming a class
this server lacks or carrying an out-of-range thinking budget get HTTP 400 naming the argument
from vLLM's OpenAI server (never reaching the engine), and the streaming request completes.
Without the middleware the engine rejects such a request instead (``test_server.py``: an error
event with code 500 in the stream, the server log naming the argument)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from meridian.demo.server import VllmServer
from meridian.offline.tiny import LETTERS
from meridian.vllm.names import (
    CLASS_ARG,
    CONFIG_KEY,
    MIDDLEWARE,
    THINKING_BUDGET_ARG,
    XARGS_FIELD,
)

from tiny_server import FIXTURE, MODEL, server_args

pytestmark = pytest.mark.vllm

#: Two classes of this server's own: `standard`, a default class, is unknown here.
CLASSES = {"classes": {"gold": {"ttft_ms": 1000, "ttfat_ms": 15000, "answer_tpot_ms": 50, "rank": 0},
                       "bronze": {"ttft_ms": 3000, "ttfat_ms": 60000, "answer_tpot_ms": 100, "rank": 1}},
           "default_class": "bronze", "priority_map": {"0": "bronze"}}
SERVER_ARGS = server_args(kv_cache_tokens=4096, max_num_seqs=8) + [
    "--middleware", MIDDLEWARE, "--additional-config", json.dumps({CONFIG_KEY: CLASSES})]
NUM_THINK, NUM_ANSWER = 99, 26
#: (endpoint, request arguments, streamed, the argument the 400 must name).
BAD: list[tuple[str, dict[str, Any], bool, str]] = [
    ("chat/completions", {CLASS_ARG: "standard"}, False, CLASS_ARG),
    ("chat/completions", {THINKING_BUDGET_ARG: -5}, True, THINKING_BUDGET_ARG),
    ("completions", {CLASS_ARG: "platinum", THINKING_BUDGET_ARG: 8}, True, CLASS_ARG),
]


@pytest.fixture(scope="module")
def server(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    folder = tmp_path_factory.mktemp("live-request-args")
    with VllmServer(FIXTURE, SERVER_ARGS, log_path=folder / "serve.log", cache_dir=cache_dir) as srv:
        yield srv


def body(endpoint: str, xargs: dict[str, Any], stream: bool, n: int = 3, m: int = 2) -> dict[str, Any]:
    prompt = f"think {n} answer {m}"
    text = {"messages": [{"role": "user", "content": prompt}]} if endpoint == "chat/completions" else {"prompt": prompt}
    return {"model": MODEL, **text, "max_tokens": 200, "temperature": 0.0, "stream": stream, XARGS_FIELD: xargs}


def stream_events(url: str, request: dict[str, Any], started: threading.Event,
                  resume: threading.Event) -> list[tuple[float, dict[str, Any]]]:
    """One streaming request's events with their arrival times; at the first it sets ``started``
    and reads no further until ``resume`` is set, so the stream is still open when the caller acts."""
    import httpx

    events: list[tuple[float, dict[str, Any]]] = []
    with httpx.Client(timeout=300) as client, client.stream("POST", url, json=request) as stream:
        assert stream.status_code == 200
        for line in stream.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append((time.monotonic(), json.loads(line.removeprefix("data: "))))
                if not started.is_set():
                    started.set()
                    assert resume.wait(timeout=300)
    started.set()
    return events


def test_bad_arguments_get_400_naming_them_while_another_request_streams(server: VllmServer) -> None:
    import httpx

    started, resume = threading.Event(), threading.Event()
    streaming = body("chat/completions", {CLASS_ARG: "gold"}, True, NUM_THINK, NUM_ANSWER)
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(stream_events, f"{server.base_url}/v1/chat/completions", streaming, started, resume)
        assert started.wait(timeout=300)
        sent_s = time.monotonic()
        try:
            rejected = [(named, httpx.post(f"{server.base_url}/v1/{endpoint}", json=body(endpoint, xargs, streamed),
                                           timeout=60)) for endpoint, xargs, streamed, named in BAD]
        finally:
            resume.set()
        answered_s = time.monotonic()
        events = future.result()
    print(f"\nstream {events[-1][0] - events[0][0]:.2f} s; the bad requests sent "
          f"{sent_s - events[0][0]:.2f} s after its first event, answered {answered_s - sent_s:.2f} s later")
    for named, response in rejected:
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == 400 and f"invalid request argument `{named}`" in error["message"], error
    message = rejected[0][1].json()["error"]["message"]
    assert "unknown SLO class `standard`; configured classes: " in message and "gold" in message, message
    # They were answered while the stream was open: its reader held it after the first event
    # (whether the engine had generated every token by then is the machine's pace: on two cores a
    # client can get no CPU for longer than the whole stream). The stream never noticed.
    chunks = [chunk for _, chunk in events]
    assert not [c for c in chunks if "error" in c]
    deltas = [c["choices"][0] for c in chunks if c.get("choices")]
    reasoning = "".join((d.get("delta") or {}).get("reasoning") or "" for d in deltas)
    content = "".join((d.get("delta") or {}).get("content") or "" for d in deltas)
    assert [w for w in reasoning.split() if w.isdigit()] == [str(k) for k in range(NUM_THINK, 0, -1)]
    assert content.split() == LETTERS[:NUM_ANSWER]
    assert deltas[-1]["finish_reason"] == "stop"
    # Stopped in the API server: the engine never saw them.
    assert "rejecting request" not in server.log()


def test_good_arguments_pass_and_the_server_serves_on(server: VllmServer) -> None:
    import httpx

    good = body("chat/completions", {CLASS_ARG: "bronze", THINKING_BUDGET_ARG: 4}, False)
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=good, timeout=120)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"].split() == LETTERS[:2]
