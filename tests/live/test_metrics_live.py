"""Live: Meridian's series on the ``/metrics`` of vLLM's OpenAI server (CPU build, tiny reasoning
model), read with prometheus-client's parser, in vLLM's default layout (one API server, the
scheduler in the engine-core process); ``test_data_parallel.py`` reads them with two engine cores
behind two API servers."""

from __future__ import annotations

import importlib.util
import json
import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from meridian.demo.server import VllmServer, stream_chat
from meridian.offline.tiny import prompt_words
from meridian.vllm.metrics import REQUEST_STATES
from meridian.vllm.names import BUS_DIR_ENV, METRIC_NAMES

from tiny_server import FIXTURE, MODEL, QUEUE_LATE, server_args

pytestmark = pytest.mark.vllm

#: Two seats: a burst of more requests than that queues at the engine however slowly the API
#: server hands it over (the gauges test reads a queue off the series).
SERVER_ARGS = server_args(max_num_seqs=2)
CASES = [(12, 3), (30, 5), (7, 2), (45, 4), (20, 6), (9, 1)]
TTFAT = METRIC_NAMES["ttfat"]


Samples = list[tuple[str, dict[str, str], float]]


def scrape(server: VllmServer) -> Samples:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10.0).text
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def values(samples: Samples, name: str, **labels: str) -> list[float]:
    return [v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items())]


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(values(samples, name, **labels))


def run_cases(server: VllmServer) -> None:
    with ThreadPoolExecutor(len(CASES)) as pool:
        results = list(pool.map(lambda c: stream_chat(server.base_url, MODEL, f"think {c[0]} answer {c[1]}",
                                                      max_tokens=200), CASES))
    assert all(r.status == 200 and r.finish_reason == "stop" for r in results), results


def request_log(paths: list[Path]) -> list[dict[str, Any]]:
    return [json.loads(line) for path in paths if path.exists() for line in path.read_text().splitlines()]


def settled(server: VllmServer, name: str, expected: float) -> Samples:
    """A scrape once ``name`` sums to ``expected`` (the engine core writes as requests finish)."""
    return scrape_until(server, lambda s: total(s, name) == expected, f"{name} at {expected}")


@pytest.fixture(scope="module")
def server(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    folder = tmp_path_factory.mktemp("metrics")
    # The tests count every request they send (finished, or aborted by the test itself): late ones
    # queue instead of being shed (tests/live/test_middleware.py covers shedding).
    config = json.dumps({"meridian": {"request_log_path": str(folder / "requests.jsonl"), **QUEUE_LATE}})
    # The server's own bus folder, so a test can find the files its engine core writes the series to.
    with pytest.MonkeyPatch.context() as env:
        env.setenv(BUS_DIR_ENV, str(folder / "bus"))
        # vLLM's /pause and /resume (its RL endpoints), for the gauges test.
        env.setenv("VLLM_SERVER_DEV_MODE", "1")
        srv = VllmServer(FIXTURE, SERVER_ARGS + ["--additional-config", config], log_path=folder / "serve.log",
                         cache_dir=cache_dir).start()
    srv.request_log = folder / "requests.jsonl"  # type: ignore[attr-defined]
    srv.bus_dir = folder / "bus"  # type: ignore[attr-defined]
    try:
        yield srv
    finally:
        srv.stop()


def test_the_ttfo_histogram_counts_each_finished_request_once_with_the_request_logs_ttfat(server: VllmServer) -> None:
    run_cases(server)
    samples = settled(server, f"{TTFAT}_count", len(CASES))
    log = request_log([server.request_log])  # type: ignore[attr-defined]
    assert len(log) == len(CASES)
    assert total(samples, f"{TTFAT}_count") == len(CASES)
    assert total(samples, f"{TTFAT}_count", **{"class": "standard", "engine": "0"}) == len(CASES)
    assert math.isclose(total(samples, f"{TTFAT}_sum"), sum(e["ttfat_ms"] for e in log) / 1000.0, rel_tol=1e-6)
    assert total(samples, f"{TTFAT}_bucket", le="+Inf") == len(CASES)
    assert total(samples, f"{METRIC_NAMES['thinking_tokens']}_sum") == sum(e["num_think_tokens"] for e in log)
    assert total(samples, f"{METRIC_NAMES['answer_tpot']}_count") == len(CASES)
    finished = METRIC_NAMES["requests_finished"]
    assert total(samples, finished, met_slo="true") == sum(e["met_all"] for e in log)
    assert total(samples, finished) == len(CASES)
    # vLLM's own series are still there, from the same registry.
    assert total(samples, "vllm:request_success_total") >= len(CASES)


def test_every_series_the_dashboard_reads_is_on_the_servers_metrics(server: VllmServer) -> None:
    spec = importlib.util.spec_from_file_location("dashboard", Path(__file__).parents[1] / "shim" / "test_dashboard.py")
    assert spec is not None and spec.loader is not None
    dashboard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dashboard)
    dashboard_series = dashboard.dashboard_series
    exported = {name for name, _labels, _value in scrape(server)}
    missing = {name for name in dashboard_series() if name not in exported}
    assert not missing, f"the dashboard reads series the server does not export: {sorted(missing)}"


def states(samples: Samples) -> dict[str, float]:
    return {state: total(samples, METRIC_NAMES["num_requests"], state=state) for state in REQUEST_STATES}


def scrape_until(server: VllmServer, done: Callable[[Samples], bool], what: str, timeout_s: float = 120.0) -> Samples:
    deadline = time.monotonic() + timeout_s
    while True:
        samples = scrape(server)
        if done(samples):
            return samples
        assert time.monotonic() < deadline, f"{what}: not seen within {timeout_s:.0f} s; last states {states(samples)}"
        time.sleep(0.1)


def post(server: VllmServer, path: str, **kwargs: Any) -> None:
    response = httpx.post(f"{server.base_url}{path}", timeout=60.0, **kwargs)
    assert response.status_code == 200, (path, response.status_code, response.text)


def test_gauges_show_the_queue_of_a_paused_server_and_read_zero_once_it_is_idle(server: VllmServer) -> None:
    # The gauges are read while vLLM's scheduler is paused with its requests kept (`/pause?mode=keep`,
    # what RL frameworks call around a weight update): nothing moves between two readings then, so
    # they must show the engine's queue exactly. A reading taken while a burst runs proves nothing
    # here: on this two-core machine a process that wants to read them can be kept off the CPU for
    # as long as a whole burst (10.55 s measured in one run queue, with the server at nice 10), and
    # the API server answered /metrics only after the burst. The running states of a paused engine
    # are checked in-process (tests/shim/test_metrics.py).
    num_requests = 72
    prompts = [" ".join(prompt_words(99 - i % 20, 26)) for i in range(num_requests)]
    body = {"model": MODEL, "prompt": prompts, "max_tokens": 70, "temperature": 0.0, "ignore_eos": True}
    finished_before = total(scrape(server), METRIC_NAMES["requests_finished"])
    post(server, "/pause", params={"mode": "keep"})
    with ThreadPoolExecutor(1) as pool:
        try:
            burst = pool.submit(httpx.post, f"{server.base_url}/v1/completions", json=body, timeout=600)
            # Arrivals take no step while paused: each one refreshes the gauges itself.
            queued = scrape_until(server, lambda s: states(s)["waiting"] == num_requests, f"{num_requests} waiting")
            assert states(queued) == {"waiting": num_requests, "prefilling": 0, "thinking": 0, "answering": 0}
            assert total(queued, METRIC_NAMES["phase_weighted_queue"]) > 0.0
            assert all(v > 0 for v in values(queued, METRIC_NAMES["saturation"], **{"class": "standard"}))
            assert all(math.isfinite(v) for v in values(queued, METRIC_NAMES["least_slack"], **{"class": "standard"}))
            assert states(scrape(server)) == states(queued), "a paused engine's gauges do not move"
        finally:
            post(server, "/resume")
        assert burst.result().status_code == 200
    # Once idle, the engine core writes the gauges right after the last finish it counts.
    samples = scrape_until(server, lambda s: total(s, METRIC_NAMES["requests_finished"]) == finished_before + num_requests
                           and not any(states(s).values()), "every request finished and the gauges at zero")
    assert total(samples, METRIC_NAMES["phase_weighted_queue"]) == 0.0
    assert all(math.isnan(v) for v in values(samples, METRIC_NAMES["least_slack"]))
    assert all(math.isnan(v) for v in values(samples, METRIC_NAMES["ttfat_headroom"]))
    attainment = values(samples, METRIC_NAMES["recent_ttfat_attainment"], **{"class": "standard"})
    assert attainment and 0.0 <= attainment[0] <= 1.0
    base = values(samples, METRIC_NAMES["step_time_model"], term="base")
    assert base and base[0] > 0.0
