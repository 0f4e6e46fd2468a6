"""Two real vLLM servers with Meridian (scheduler and middleware) behind the real ``vllm-router``
(round robin, three attempts): one saturated, every request through the router ends served or,
only where both servers shed it, shed with ``Retry-After`` — never a 500 — and the router's
retries add up to exactly the sheds the servers counted on their ``/metrics``.

Server A is saturated as ``test_middleware.py`` saturates its server: two seat holders of the
queueing class ``calm``, sent to A directly, decode thousands of tokens on its two seats; once A's
step log shows both decoding, requests of the shedding class ``rush`` (400 ms TTFT target) go to
the router one after another. Round robin sends every other first attempt to A, which refuses it
at arrival (or its engine sheds it before a first token): the router retries it on B, idle, which
serves it. Each engine runs alone on its own core (two CPUs: A's on the first, B's on the second)
and the API servers on either, as the fleet A/B places them (held to the other engine's core, an
API server can pass nothing on for seconds while that engine runs flat out).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from meridian._core import SHED_MARKER, parse_shed_notice
from meridian.demo.fleet import VllmRouter, replica_cpus
from meridian.demo.loadgen import metric_sums, pin
from meridian.demo.server import VllmServer
from meridian.offline.tiny import LETTERS
from meridian.vllm.names import CONFIG_KEY, METRIC_NAMES, MIDDLEWARE

from test_middleware import (
    CLASSES, HOLDER_TOKENS, NUM_ANSWER, SERVER_ARGS, SHED_STATUS, answer_of, both_seats_decoding, long_context_model,
    request,
)

pytestmark = pytest.mark.vllm

#: Requests sent through the router while A's seats are held.
NUM_ROUTED = 8
#: Attempts in all per request: more than the servers, as the recipe says.
ATTEMPTS = 3
#: Tries until the holders hold A's seats through the routed requests (see test_middleware).
TRIES = 3
SHED_SERIES = (METRIC_NAMES["shed_requests"], METRIC_NAMES["arrival_refusals"])


@pytest.fixture(scope="module")
def fleet(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("live-router")
    model = long_context_model(folder / "model")
    cpus = replica_cpus(2)
    with ExitStack() as stack:
        servers = {}
        for name, cpu in zip(("A", "B"), cpus):
            config = dict(CLASSES, step_log_path=str(folder / f"steps-{name}.jsonl"),
                          overload={"shed_running": False})
            args = SERVER_ARGS + ["--middleware", MIDDLEWARE, "--additional-config", json.dumps({CONFIG_KEY: config})]
            servers[name] = stack.enter_context(
                VllmServer(model, args, log_path=folder / f"serve-{name}.log", cache_dir=cache_dir))
            if cpu is not None:
                pin(servers[name], engine_cpu=cpu, front_anywhere=True)
        router = stack.enter_context(VllmRouter([servers["A"].base_url, servers["B"].base_url], "round_robin",
                                                folder / "router.log", ("--retry-max-retries", str(ATTEMPTS))))
        yield {"servers": servers, "router": router, "step_log_A": folder / "steps-A.jsonl"}


async def routed_behind_held_seats(fleet: dict[str, Any]) -> tuple[bool, list[tuple[float, int, dict[str, str], Any]]]:
    """Two ``calm`` holders take A's seats; once A decodes both, ``NUM_ROUTED`` ``rush``
    requests go through the router one by one. Returns whether the holders held through them."""
    a = fleet["servers"]["A"].base_url
    limits = httpx.Limits(max_connections=16)
    async with httpx.AsyncClient(base_url=a, timeout=300, limits=limits) as to_a, \
            httpx.AsyncClient(base_url=fleet["router"].base_url, timeout=300, limits=limits) as to_router:
        holders = [asyncio.create_task(request(to_a, "calm", False, HOLDER_TOKENS)) for _ in range(2)]
        if not await both_seats_decoding(fleet["step_log_A"], holders):
            for holder in holders:
                holder.cancel()
            await asyncio.gather(*holders, return_exceptions=True)
            return False, []
        results = [await request(to_router, "rush", False) for _ in range(NUM_ROUTED)]
        held = not any(holder.done() for holder in holders)
        for holder in holders:
            holder.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
        return held, results


def shed_sums(fleet: dict[str, Any], until: float) -> float:
    """Sheds and refusals at arrival counted on both servers' ``/metrics``, once they reach
    ``until`` (the engines mirror their counters at most every 0.25 s) or after 30 s."""
    deadline = time.monotonic() + 30
    while True:
        total = sum(sum(metric_sums(s.base_url, SHED_SERIES).values()) for s in fleet["servers"].values())
        if total >= until or time.monotonic() > deadline:
            return total
        time.sleep(0.5)


def test_a_saturated_server_sheds_and_the_router_serves_it_on_the_other(fleet: dict[str, Any]) -> None:
    for _ in range(TRIES):
        held, results = asyncio.run(routed_behind_held_seats(fleet))
        if held:
            break
    assert held, f"A's holders did not hold its seats through the routed requests, {TRIES} times"
    statuses = [status for _, status, _, _ in results]
    print(f"\nrouted statuses {statuses}")
    for _, status, headers, result in results:
        assert status in (200, SHED_STATUS), (status, result)
        if status == SHED_STATUS:  # only when every attempt was shed: both servers
            message = result["error"]["message"]
            assert message.startswith(f"{SHED_MARKER}:") and int(headers["retry-after"]) >= 1, (headers, result)
            assert parse_shed_notice(message) is not None
        else:
            finish, content = answer_of(result, False)
            assert (finish, content.split()) == ("stop", LETTERS[:NUM_ANSWER]), result
    assert statuses.count(200) >= NUM_ROUTED // 2, "B is idle: what A sheds, B serves"
    router = fleet["router"].sums(["vllm_router_retries_total", "vllm_router_retries_exhausted_total"])
    retries, exhausted = router["vllm_router_retries_total"], router["vllm_router_retries_exhausted_total"]
    assert retries >= 1, ("round robin sends every other first attempt to the saturated A", router)
    assert exhausted == statuses.count(SHED_STATUS), router
    # Every shed a server counted was one attempt the router saw shed: retried, or the last.
    assert shed_sums(fleet, until=retries + exhausted) == retries + exhausted, router
