"""Live: vLLM's data parallelism on the CPU build (``--data-parallel-size 2``: two engine cores,
each its own ``MeridianScheduler``, behind two API servers in Prometheus' multiprocess mode), one
server for the module, one seat per rank. First, each rank labels its own series and one scrape,
whichever API server answers, counts every request once. Then one rank's engine core is SIGKILLed
under load (a queue on each rank, placed by vLLM's ``X-data-parallel-rank`` header; the kill comes
once each rank has finished a request of that load). What vLLM 0.32 does: its launcher sees the
engine die and stops the whole server (every API server and the other rank too), so no rank
survives to serve; the clients' streams end, none hangs. What Meridian keeps consistent: the other
rank's request log holds one whole JSON line per request it had, each once, ended ``stopped`` or
``aborted``; the killed rank's log holds no torn line. The kill ends the server, so it is the
module's last test."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from meridian.demo.server import StreamResult, VllmServer, stream_chat
from meridian.offline.tiny import task_prompt
from meridian.vllm.names import METRIC_NAMES

from test_metrics_live import CASES, TTFAT, run_cases, scrape, settled, total, values
from tiny_server import FIXTURE, MODEL, QUEUE_LATE, server_args

pytestmark = pytest.mark.vllm

#: Requests per rank under the kill, each rank serving one at a time: most are still queued when
#: the first end.
REQUESTS_PER_RANK = 12


@pytest.fixture(scope="module")
def server(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    folder = tmp_path_factory.mktemp("data-parallel")
    # The tests count every request they send: late ones queue instead of being shed.
    config = json.dumps({"meridian": {"request_log_path": str(folder / "requests.jsonl"), **QUEUE_LATE}})
    args = server_args(kv_cache_tokens=4096, max_num_seqs=1) + ["--data-parallel-size", "2",
                                                                 "--additional-config", config]
    with VllmServer(FIXTURE, args, log_path=folder / "serve.log", cache_dir=cache_dir) as srv:
        srv.request_logs = (folder / "requests.jsonl", folder / "requests.dp1.jsonl")  # type: ignore[attr-defined]
        yield srv


def read_log(path: Path) -> list[dict[str, Any]]:
    """Every line of a request log, each of which must be whole JSON."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_data_parallel_ranks_each_run_their_own_scheduler_and_label_their_series(server: VllmServer) -> None:
    assert server.process is not None and server.process.poll() is None, "the server is up (the kill test comes last)"
    assert "Started 2 API server processes" in server.log()
    run_cases(server)
    samples = settled(server, f"{TTFAT}_count", len(CASES))
    logs = {rank: read_log(path) for rank, path in enumerate(server.request_logs)}  # type: ignore[attr-defined]
    per_engine = {rank: total(samples, f"{TTFAT}_count", engine=str(rank)) for rank in (0, 1)}
    # Each scrape (whichever API server answers) counts every request once.
    for _ in range(4):
        assert total(scrape(server), f"{TTFAT}_count") == len(CASES)
    assert not (server.request_logs[0].parent / "requests.dp0.jsonl").exists(), "rank 0 keeps the configured name"  # type: ignore[attr-defined]
    assert {rank: len(log) for rank, log in logs.items()} == per_engine
    assert sum(per_engine.values()) == len(CASES)
    for rank in (0, 1):
        assert values(samples, METRIC_NAMES["num_requests"], engine=str(rank)), f"rank {rank} publishes"
    for rank in (0, 1):
        assert math.isclose(total(samples, f"{TTFAT}_sum", engine=str(rank)),
                            sum(e["ttfat_ms"] for e in logs[rank]) / 1000.0, rel_tol=1e-6, abs_tol=1e-9)


def wait_until_both_ranks_finished_one(server: VllmServer, logs: tuple[Path, Path], already: tuple[int, int],
                                       timeout_s: float = 120.0) -> None:
    """Both ranks have served a request of the load (a line past ``already`` in each request log):
    both are up and busy."""
    deadline = time.monotonic() + timeout_s
    while not all(len(read_log(path)) > before for path, before in zip(logs, already)):
        assert server.process is not None and server.process.poll() is None, "the server exited"
        assert time.monotonic() < deadline, f"a rank served nothing within {timeout_s:.0f} s"
        time.sleep(0.05)


def engine_core(server: VllmServer, rank: int) -> psutil.Process:
    assert server.process is not None
    for proc in psutil.Process(server.process.pid).children(recursive=True):
        if proc.name() == f"VLLM::EngineCore_DP{rank}":
            return proc
    raise AssertionError(f"no EngineCore_DP{rank} under the server")


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


def test_killing_one_rank_stops_the_server_and_leaves_whole_logs(server: VllmServer) -> None:
    assert server.process is not None
    logs: tuple[Path, Path] = server.request_logs  # type: ignore[attr-defined]
    already = (len(read_log(logs[0])), len(read_log(logs[1])))
    num_requests = 2 * REQUESTS_PER_RANK
    with ThreadPoolExecutor(num_requests) as pool:
        futures = [pool.submit(request, server, i % 2) for i in range(num_requests)]
        wait_until_both_ranks_finished_one(server, logs, already)
        engine_core(server, 1).kill()
        exit_code = server.process.wait(timeout=120)
        results = [f.result(timeout=120) for f in futures]
    assert exit_code != 0
    assert "Engine core process EngineCore_DP1 died unexpectedly" in server.log()
    assert any(cut(r) for r in results), "every request had finished before the kill"
    survivor, killed = read_log(logs[0]), read_log(logs[1])
    assert len({r["req_id"] for r in survivor}) == len(survivor), "a request logged twice"
    assert len({r["req_id"] for r in killed}) == len(killed), "a request logged twice"
    survivor, killed = survivor[already[0]:], killed[already[1]:]
    assert survivor and killed, "each rank logged the request it finished before the kill"
    assert {r["reason"] for r in survivor} <= {"stopped", "aborted"}, survivor
    assert len(survivor) <= REQUESTS_PER_RANK and len(killed) <= REQUESTS_PER_RANK
