"""Live: ``vllm serve`` (CPU build, default process layout: the spec loads in the model worker)
with vLLM's OffloadingConnector (as Meridian's subclass that reports failed loads) on Meridian's
host-copy spec, as the README configures it, under KV pressure, with stock
vLLM's scheduler and with ``MeridianScheduler``: every request of a burst completes with the
right countdown and answer, vLLM's own ``/metrics`` shows blocks stored to the host tier, and
when the burst was preempted, blocks loaded back from it."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from meridian.demo.loadgen import metric_sum
from meridian.demo.server import VllmServer, stream_chat
from meridian.offline.tiny import LETTERS, task_prompt

from tiny_server import FIXTURE, QUEUE_LATE, server_args

pytestmark = pytest.mark.vllm

#: The README's --kv-transfer-config, with a 16 MiB tier.
TIER = {"kv_connector": "MeridianOffloadingConnector", "kv_connector_module_path": "meridian.vllm.kvtier",
        "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"spec_name": "HostCopyOffloadingSpec", "spec_module_path": "meridian.vllm.kvtier",
                                      "cpu_bytes_to_use": 16 * 1024 * 1024, "offload_prompt_only": False}}
# A 320-token cache (tiny_server.PRESSURED_KV_TOKENS), so a burst of 12 is preempted.
SERVER_ARGS = server_args(scheduler=False) + ["--kv-transfer-config", json.dumps(TIER)]
CASES = [(60, 5), (8, 20), (90, 3), (25, 12), (70, 8), (3, 2), (45, 15), (99, 26), (12, 4), (33, 9), (80, 1), (50, 22)]


def positive_metric(base_url: str, name: str, timeout_s: float = 60.0) -> float:
    """The metric once it is above zero: the engine's stats of a step reach the API server's
    registry after the step's outputs, so a client can be done before they are counted."""
    deadline = time.monotonic() + timeout_s
    while (value := metric_sum(base_url, name)) <= 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    return value


#: Meridian loads every hit here, as vLLM does: on this model a recompute costs far less than the
#: extra step a load takes, so the cost model's default (``auto``) would recompute them all
#: (tests/offline/test_kv_tier.py checks that choice with stated costs).
MERIDIAN_ARGS = ["--scheduler-cls", "meridian.vllm.MeridianScheduler",
                 "--additional-config", json.dumps({"meridian": {"kv_tier": {"restore": "always"}, **QUEUE_LATE}})]


@pytest.mark.parametrize("scheduler_args", [[], MERIDIAN_ARGS], ids=["vllm", "meridian"])
def test_a_burst_under_kv_pressure_completes_through_the_host_tier(cache_dir: Path, tmp_path: Path,
                                                                   scheduler_args: list[str]) -> None:
    with VllmServer(FIXTURE, SERVER_ARGS + scheduler_args, log_path=tmp_path / "serve.log", cache_dir=cache_dir) as srv:
        # A fresh server's first request pays its one-off costs before the burst.
        assert stream_chat(srv.base_url, str(FIXTURE), task_prompt(3, 2), max_tokens=200).status == 200
        with ThreadPoolExecutor(len(CASES)) as pool:
            results = list(pool.map(lambda c: stream_chat(srv.base_url, str(FIXTURE), task_prompt(*c), max_tokens=200),
                                    CASES))
        for (n, m), r in zip(CASES, results):
            assert r.status == 200 and r.error is None, r
            assert r.reasoning.split() == [str(k) for k in range(n, 0, -1)], (n, r.reasoning)
            assert r.content.split() == LETTERS[:m], (m, r.content)
        assert positive_metric(srv.base_url, "vllm:kv_offload_store_bytes_total") > 0
        # Whether a request resumes from the tier depends on how the burst reaches the engine (a
        # fresh clone's server saw no preemption even under stock vLLM; one preempted before any of
        # its blocks was stored has nothing to load): a block the tier was asked for and had (vLLM's
        # external prefix-cache hit) must have been loaded. tests/offline/test_kv_tier.py forces and
        # counts preemptions and restores.
        if metric_sum(srv.base_url, "vllm:external_prefix_cache_hits_total") > 0:
            assert positive_metric(srv.base_url, "vllm:kv_offload_load_bytes_total") > 0
