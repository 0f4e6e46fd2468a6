"""Live: one data-parallel rank's engine core SIGKILLed under load (``--data-parallel-size 2``, CPU
build, tiny reasoning model, Meridian on both ranks, one seat each, a queue on each placed by
vLLM's ``X-data-parallel-rank`` header; the kill comes once each rank has finished a request). What vLLM 0.32 does: its launcher sees the
engine die and stops the whole server (every API server and the other rank too), so no rank
survives to serve; the clients' streams end, none hangs. What Meridian keeps consistent: the
other rank's request log holds one whole JSON line per request it had, each once, ended
``stopped`` or ``aborted``; the killed rank's log holds no torn line."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from meridian.demo.server import StreamResult, VllmServer, stream_chat
from meridian.offline.tiny import task_prompt

from tiny_server import FIXTURE, MODEL, QUEUE_LATE, server_args

pytestmark = pytest.mark.vllm

#: Requests per rank, each rank serving one at a time: most are still queued when the first end.
REQUESTS_PER_RANK = 12


def wait_until_both_ranks_finished_one(server: VllmServer, logs: tuple[Path, Path], timeout_s: float = 120.0) -> None:
    """Both ranks have served a request (a line in each request log): both are up and busy."""
    deadline = time.monotonic() + timeout_s
    while not all(path.exists() and path.read_text().strip() for path in logs):
        assert server.process is not None and server.process.poll() is None, "the server exited"
        assert time.monotonic() < deadline, f"a rank served nothing within {timeout_s:.0f} s"
        time.sleep(0.05)


def engine_core(server: VllmServer, rank: int) -> psutil.Process:
    assert server.process is not None
    for proc in psutil.Process(server.process.pid).children(recursive=True):
        if proc.name() == f"VLLM::EngineCore_DP{rank}":
            return proc
    raise AssertionError(f"no EngineCore_DP{rank} under the server")


def read_log(path: Path) -> list[dict[str, Any]]:
    """Every line of a request log, each of which must be whole JSON."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def request(server: VllmServer, rank: int) -> StreamResult | BaseException:
    """One request, placed on ``rank`` by vLLM's ``X-data-parallel-rank`` header (the balancer's
    choice under a loaded machine could leave a rank idle)."""
    try:
        return stream_chat(server.base_url, MODEL, task_prompt(90, 20), max_tokens=200, timeout_s=120.0,
                           headers={"X-data-parallel-rank": str(rank)})
    except httpx.HTTPError as error:  # the server went away mid-stream
        return error


def cut(result: StreamResult | BaseException) -> bool:
    return not isinstance(result, StreamResult) or result.finish_reason != "stop"


def test_killing_one_rank_stops_the_server_and_leaves_whole_logs(cache_dir: Path, tmp_path: Path) -> None:
    logs = (tmp_path / "requests.jsonl", tmp_path / "requests.dp1.jsonl")
    config = json.dumps({"meridian": {"request_log_path": str(logs[0]), **QUEUE_LATE}})
    args = server_args(kv_cache_tokens=4096, max_num_seqs=1) + ["--data-parallel-size", "2",
                                                                 "--additional-config", config]
    num_requests = 2 * REQUESTS_PER_RANK
    with VllmServer(FIXTURE, args, log_path=tmp_path / "serve.log", cache_dir=cache_dir) as srv:
        assert srv.process is not None
        with ThreadPoolExecutor(num_requests) as pool:
            futures = [pool.submit(request, srv, i % 2) for i in range(num_requests)]
            wait_until_both_ranks_finished_one(srv, logs)
            engine_core(srv, 1).kill()
            exit_code = srv.process.wait(timeout=120)
            results = [f.result(timeout=120) for f in futures]
        log = srv.log()
    assert exit_code != 0
    assert "Engine core process EngineCore_DP1 died unexpectedly" in log
    assert any(cut(r) for r in results), "every request had finished before the kill"
    survivor, killed = read_log(logs[0]), read_log(logs[1])
    assert survivor and killed, "each rank logged the request it finished before the kill"
    assert len({r["req_id"] for r in survivor}) == len(survivor), "a request logged twice"
    assert {r["reason"] for r in survivor} <= {"stopped", "aborted"}, survivor
    assert len(survivor) <= REQUESTS_PER_RANK and len(killed) <= REQUESTS_PER_RANK
