"""The host KV tier's whole data path without a model, so that it runs wherever vLLM's Python
does (0.32's CPU build and 0.33's CUDA wheel on a CPU machine alike): the scheduler side of
vLLM's ``OffloadingConnector`` in the scheduler, its worker side (``HostCopyOffloadingSpec``'s
``HostCopyWorker``) on a real KV tensor, and in between a stand-in model runner that calls the
worker side as vLLM's runner does (``handle_preemptions``, ``bind_connector_metadata``,
``start_load_kv``, the forward, ``wait_for_save``, ``get_transfer_results``,
``get_block_ids_with_load_errors``, ``build_connector_worker_meta``). Its "forward" checks, for
every scheduled request, that the KV of every position it attends to is the KV computed for that
position's tokens, then writes the KV of the positions it computes: a value derived from the
token prefix, as a real model's KV is. A preempted request restored from the tier therefore
reads back bytes that went out to host memory and came back through the connector; the
sabotaged variant corrupts the host pool and must be caught."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from meridian.offline.engine import EngineSpec, HostTierLink, OfflineEngine, build_scheduler, scripted_request
from meridian.offline.tiny import WORD_IDS, reasoning_script

pytestmark = pytest.mark.vllm

torch = pytest.importorskip("torch")

#: Largest value of the rolling prefix hash: below 2**23, so a float32 holds it exactly.
_MODULUS = 8_388_593
ALWAYS_RESTORE = {"kv_tier": {"restore": "always"}, "answer_kv_reserve": False}


def prefix_kv(tokens: list[int]) -> list[int]:
    """The "KV" of each position: a rolling hash of the tokens up to and including it."""
    values, h = [], 0
    for token in tokens:
        h = (h * 31 + token + 1) % _MODULUS
        values.append(h)
    return values


class DataPathLink(HostTierLink):
    """The engine's tier link with vLLM's worker-side connector and a KV tensor behind it."""

    def __init__(self, scheduler: Any, *, corrupt_host_after_stores: int | None = None) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        super().__init__(scheduler, load_ms_per_token=0.0)
        self.scheduler = scheduler
        self.worker = type(scheduler.connector)(scheduler.vllm_config, KVConnectorRole.WORKER, scheduler.kv_cache_config)
        num_blocks = scheduler.kv_cache_config.num_blocks
        # vLLM's CPU attention layout, blocks first: (blocks, K|V, block size, heads, head size).
        self.kv = torch.full((num_blocks, 2, self.block_size, 1, 1), -1.0)
        self.worker.register_kv_caches({"layer": self.kv})
        self.corrupt_host_after_stores = corrupt_host_after_stores
        self.num_stored_blocks = 0
        self.num_checked_positions = 0
        self.mismatches: list[tuple[str, int]] = []

    def connector_output(self, output: Any) -> Any:
        from vllm.v1.outputs import KVConnectorOutput

        meta = output.kv_connector_metadata
        if meta is None:
            return None
        worker = self.worker
        worker.handle_preemptions(meta)
        worker.bind_connector_metadata(meta)
        worker.start_load_kv(None)  # the offloading connector's loads take no forward context
        self._forward(output)
        worker.wait_for_save()
        self._count_stores(meta)
        results = worker.get_transfer_results(output.finished_req_ids)
        connector_output = KVConnectorOutput(
            finished_sending=results.finished_sending, finished_recving=results.finished_recving,
            invalid_block_ids=worker.get_block_ids_with_load_errors(),
            kv_connector_worker_meta=worker.build_connector_worker_meta(),
        )
        worker.clear_connector_metadata()
        return connector_output

    def _forward(self, output: Any) -> None:
        for req_id, num_tokens in output.num_scheduled_tokens.items():
            request = self.scheduler.requests[req_id]
            end = request.num_computed_tokens  # schedule() already counted this step's tokens
            start = end - num_tokens
            values = prefix_kv(list(request.all_token_ids[:end]))
            block_ids = self.scheduler.kv_cache_manager.get_block_ids(req_id)[0]
            for position in range(end):
                block, offset = block_ids[position // self.block_size], position % self.block_size
                if position < start:
                    self.num_checked_positions += 1
                    if (self.kv[block, 0, offset, 0, 0] != values[position]
                            or self.kv[block, 1, offset, 0, 0] != -values[position] - 1):
                        self.mismatches.append((req_id, position))
                else:
                    self.kv[block, 0, offset, 0, 0] = values[position]
                    self.kv[block, 1, offset, 0, 0] = -values[position] - 1

    def _count_stores(self, meta: Any) -> None:
        # Stores go out at the start of the next step's transfers; a sabotage after enough of
        # them corrupts what later restores read.
        self.num_stored_blocks += sum(len(job.src_spec.block_ids) for job in meta.store_jobs.values())
        limit = self.corrupt_host_after_stores
        if limit is not None and self.num_stored_blocks >= limit:
            for pool in self.worker.connector_worker.worker._host:
                pool.add_(1)
            self.corrupt_host_after_stores = None


def run(model: Path, scheduler_cls: type[Any], *, corrupt_host_after_stores: int | None = None) -> tuple[Any, DataPathLink]:
    # Eight requests of about 170 tokens (11 blocks each) in 40 blocks: preemption every few steps.
    spec = EngineSpec(model_dir=model, num_blocks=40, num_host_blocks=256, max_model_len=512,
                      async_scheduling=False, additional_config={"meridian": ALWAYS_RESTORE})
    scheduler = build_scheduler(scheduler_cls, spec)
    requests = [
        scripted_request(f"r{i}", i * 2.0, [WORD_IDS[(i + k) % len(WORD_IDS)] for k in range(40)],
                         reasoning_script(110, 16, seed=i))
        for i in range(8)
    ]
    engine = OfflineEngine(scheduler, requests)
    link = DataPathLink(scheduler, corrupt_host_after_stores=corrupt_host_after_stores)
    engine.tier_link = link
    result = engine.run()
    return result, link


def schedulers() -> dict[str, type[Any]]:
    from vllm.v1.core.sched.scheduler import Scheduler

    from meridian.vllm import MeridianScheduler

    return {"vllm": Scheduler, "meridian": MeridianScheduler}


@pytest.mark.parametrize("name", ["vllm", "meridian"])
def test_preempted_requests_read_back_their_own_kv_from_the_host_tier(tiny_model: Path, name: str) -> None:
    result, link = run(tiny_model, schedulers()[name])
    assert len(result.reports) == 8 and all(t.finish_reason == "stop" for t in result.timelines.values())
    assert result.num_tier_loads > 0 and result.num_restored_resumes > 0, vars(result)
    assert link.num_stored_blocks > 0 and link.num_checked_positions > 0
    assert link.mismatches == [], link.mismatches[:5]


def test_a_corrupted_host_pool_is_caught_by_the_kv_check(tiny_model: Path) -> None:
    _, link = run(tiny_model, schedulers()["meridian"], corrupt_host_after_stores=16)
    assert link.mismatches, "restores read the corrupted bytes: the check must see them"
