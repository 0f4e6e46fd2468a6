"""Live: one data-parallel rank's engine core SIGKILLed under load (``--data-parallel-size 2``, CPU
build, tiny reasoning model, Meridian on both ranks). What vLLM 0.32 does: its launcher sees the
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
from prometheus_client.parser import text_string_to_metric_families

from meridian.demo.server import StreamResult, VllmServer, stream_chat
from meridian.offline.tiny import task_prompt
from meridian.vllm.names import METRIC_NAMES

from tiny_server import FIXTURE, MODEL, QUEUE_LATE, server_args

pytestmark = pytest.mark.vllm

NUM_REQUESTS = 12
LIVE = METRIC_NAMES["num_requests"]


def live_requests_by_rank(server: VllmServer) -> dict[str, float]:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10.0).text
    by_rank: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == LIVE:
                rank = sample.labels.get("engine", "")
                by_rank[rank] = by_rank.get(rank, 0.0) + sample.value
    return by_rank


def wait_until_both_ranks_hold_requests(server: VllmServer, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (live := live_requests_by_rank(server)).get("0", 0) < 1 or live.get("1", 0) < 1:
        assert time.monotonic() < deadline, f"both ranks never held a request at once: {live}"
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


def request(server: VllmServer, i: int) -> StreamResult | BaseException:
    try:
        return stream_chat(server.base_url, MODEL, task_prompt(90, 20), max_tokens=200, timeout_s=120.0)
    except httpx.HTTPError as error:  # the server went away mid-stream
        return error


def test_killing_one_rank_stops_the_server_and_leaves_whole_logs(cache_dir: Path, tmp_path: Path) -> None:
    config = json.dumps({"meridian": {"request_log_path": str(tmp_path / "requests.jsonl"), **QUEUE_LATE}})
    args = server_args(kv_cache_tokens=4096, max_num_seqs=2) + ["--data-parallel-size", "2",
                                                                 "--additional-config", config]
    with VllmServer(FIXTURE, args, log_path=tmp_path / "serve.log", cache_dir=cache_dir) as srv:
        assert srv.process is not None
        with ThreadPoolExecutor(NUM_REQUESTS) as pool:
            futures = [pool.submit(request, srv, i) for i in range(NUM_REQUESTS)]
            wait_until_both_ranks_hold_requests(srv)
            engine_core(srv, 1).kill()
            exit_code = srv.process.wait(timeout=120)
            results = [f.result(timeout=120) for f in futures]
        log = srv.log()
    assert exit_code != 0
    assert "Engine core process EngineCore_DP1 died unexpectedly" in log
    assert len(results) == NUM_REQUESTS, "every client got an answer or a closed stream"
    survivor = read_log(tmp_path / "requests.jsonl")
    killed = read_log(tmp_path / "requests.dp1.jsonl")
    assert survivor, "the surviving rank logged none of the requests it held"
    assert len({r["req_id"] for r in survivor}) == len(survivor), "a request logged twice"
    assert {r["reason"] for r in survivor} <= {"stopped", "aborted"}, survivor
    assert len(survivor) + len(killed) <= NUM_REQUESTS
