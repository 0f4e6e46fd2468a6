"""The contract with a real router: the pinned ``vllm-router`` binary (PyPI, the vLLM project's
own) in front of two servers that answer through Meridian's real ``MeridianFrontend``
(``frontend_server.py``, one process each, as vLLM's API servers are). What an operator relies on
when Meridian sheds behind it:

- a shed (the configured status, 429 by default, with ``Retry-After``) is retried and served on
  the other server, with the request's ``vllm_xargs`` and Meridian's headers intact, and the
  router's retries equal the sheds;
- when every server sheds, the client gets the last shed with its ``Retry-After`` and notice;
- ``power_of_two`` follows ``GET /get_load``, the work the engines published;
- a 429 never trips the router's circuit breaker, while ten 503s in a row eject a server for every
  class: why ``overload.shed_status`` defaults to 429.

The two live vLLM servers behind the router are ``tests/live/test_router_live.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meridian.demo.fleet import VllmRouter, router_binary
from meridian.demo.server import free_port, wait_healthy
from meridian.vllm.names import BUS_DIR_ENV, CLASS_ARG, WAITED_ARG, WAITED_HEADER, XARGS_FIELD

pytestmark = pytest.mark.vllm

HERE = Path(__file__).resolve().parent
CLASSES = {"classes": {"interactive": {"ttft_ms": 1000, "ttfat_ms": 10000, "answer_tpot_ms": 100, "rank": 0}},
           "default_class": "interactive"}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "2+2?"}], XARGS_FIELD: {CLASS_ARG: "interactive"}}


class Fleet:
    """Two frontend servers (A, B) and, once ``route`` starts it, a router in front of them."""

    def __init__(self, folder: Path, overload: dict[str, Any]) -> None:
        self.folder = folder
        self.bus = folder / "bus"
        self.bus.mkdir(mode=0o700)
        self.processes: list[subprocess.Popen[bytes]] = []
        config = json.dumps({"meridian": {**CLASSES, "overload": overload}})
        self.servers: dict[str, str] = {}
        for name in ("A", "B"):
            port = free_port()
            self.servers[name] = f"http://127.0.0.1:{port}"
            self._start([sys.executable, str(HERE / "frontend_server.py"), "--port", str(port), "--name", name,
                         "--additional-config", config], name, {BUS_DIR_ENV: str(self.bus)})
        for process, (name, url) in zip(self.processes, self.servers.items()):
            wait_healthy(url, process, 60.0, f"server {name}", self.folder / f"{name}.log")
        self.router: VllmRouter | None = None

    def route(self, policy: str, *extra: str) -> None:
        self.router = VllmRouter(list(self.servers.values()), policy, self.folder / "router.log", extra)
        self.router.__enter__()

    def _start(self, command: list[str], name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(self.folder / f"{name}.log", "wb") as log:
            process = subprocess.Popen(command, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append(process)
        return process

    def set_mode(self, name: str, mode: str) -> None:
        import httpx

        httpx.post(f"{self.servers[name]}/mode", json={"mode": mode}, timeout=60.0).raise_for_status()

    def counts(self, name: str) -> dict[str, Any]:
        import httpx

        return dict(httpx.get(f"{self.servers[name]}/counts", timeout=60.0).json())

    def chat(self, headers: dict[str, str] | None = None) -> Any:
        import httpx

        assert self.router is not None
        return httpx.post(f"{self.router.base_url}/v1/chat/completions", json=CHAT, headers=headers or {}, timeout=30.0)

    def router_series(self, name: str) -> dict[str, float]:
        """The router's Prometheus samples of one series, by their labels."""
        assert self.router is not None
        return self.router.series().get(name, {})

    def publish(self, name: str, expected_output_tokens: float) -> None:
        """The snapshot an engine behind server ``name`` would publish, with this much work ahead."""
        from meridian._core import ARRIVAL_SNAPSHOT_FORMAT

        pid = self.counts(name)["pid"]
        snapshot = {"format": ARRIVAL_SNAPSHOT_FORMAT, "taken_ms": time.time() * 1000.0, "starts_per_s": 1.0,
                    "free_seats": 4, "first_token_lead_ms": 10.0, "num_ahead": [["interactive", 0]],
                    "expected_output_tokens": expected_output_tokens}
        (self.bus / f"meridian-arrival-{pid}-1.json").write_text(json.dumps(snapshot))

    def close(self) -> None:
        if self.router is not None:
            self.router.__exit__(None, None, None)
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    router_binary()  # installed by make setup, pinned in scripts/requirements.txt: missing is a failure
    fleet = Fleet(tmp_path, {})
    try:
        yield fleet
    finally:
        fleet.close()


def _served_by(response: Any) -> dict[str, Any]:
    return dict(json.loads(response.json()["choices"][0]["message"]["content"]))


def test_a_shed_is_served_on_the_other_server_with_its_arguments_and_the_last_shed_reaches_the_client(
    fleet: Fleet,
) -> None:
    fleet.route("round_robin")
    fleet.set_mode("A", "shed")
    responses = [fleet.chat({WAITED_HEADER: "40"}) for _ in range(8)]
    assert [r.status_code for r in responses] == [200] * 8, [r.text for r in responses]
    served = [_served_by(r) for r in responses]
    assert {s["server"] for s in served} == {"B"}
    # The body and Meridian's header arrive as sent: the class, and the wait as its argument.
    assert all(s["vllm_xargs"] == {CLASS_ARG: "interactive", WAITED_ARG: 40.0} for s in served), served
    sheds = fleet.counts("A")["shed"]
    assert sheds >= 4, "round robin sends about every other first attempt to A"
    assert sum(fleet.router_series("vllm_router_retries_total").values()) == sheds
    # Every server sheds: the client gets the last one, its status, Retry-After and notice.
    fleet.set_mode("B", "shed")
    final = fleet.chat()
    assert final.status_code == 429 and final.headers["retry-after"] == "2", final.text
    error = final.json()["error"]
    assert error["code"] == 429 and error["message"].startswith("meridian:shed:ttft:2:"), error


def test_power_of_two_follows_the_load_meridian_reports(fleet: Fleet) -> None:
    import httpx

    fleet.publish("A", 10_000.4)
    fleet.publish("B", 10.0)
    assert httpx.get(f"{fleet.servers['A']}/get_load", timeout=60.0).json() == {"load": 10_000}
    fleet.route("power_of_two", "--worker-startup-check-interval", "1")
    # The router polls /get_load once a second (on a busy machine later): wait for a poll of
    # each server after the snapshots were written.
    deadline = time.monotonic() + 30
    while min(fleet.counts(name)["load_polls"] for name in ("A", "B")) < 1:
        assert time.monotonic() < deadline, "the router never polled /get_load"
        time.sleep(0.2)
    served = [_served_by(fleet.chat())["server"] for _ in range(10)]
    assert served == ["B"] * 10, served


@pytest.mark.parametrize(("shed_status", "ejected"), [(429, False), (503, True)])
def test_only_a_503_shed_trips_the_routers_circuit_breaker(tmp_path: Path, shed_status: int, ejected: bool) -> None:
    router_binary()  # installed by make setup, pinned in scripts/requirements.txt: missing is a failure
    fleet = Fleet(tmp_path, {"shed_status": shed_status})
    try:
        fleet.route("round_robin")
        fleet.set_mode("A", "shed")
        assert all(fleet.chat().status_code == 200 for _ in range(24))
        states = fleet.router_series("vllm_router_cb_state")
        a_state = next(v for k, v in states.items() if fleet.servers["A"] in k)
        assert (a_state != 0) == ejected, states
        # An ejected server gets nothing, even once it would serve again.
        fleet.set_mode("A", "serve")
        served = {_served_by(fleet.chat())["server"] for _ in range(6)}
        assert ("A" not in served) == ejected, served
    finally:
        fleet.close()
