"""The host KV tier on vLLM's CPU build: an out-of-tree ``OffloadingSpec`` for the
``OffloadingConnector`` whose worker copies blocks between the engine's KV tensors and a pool in
host memory. vLLM's stock ``CPUOffloadingSpec`` refuses the CPU platform (its worker needs CUDA
streams and events); this spec inherits everything else from it — the manager (LRU/ARC), keys,
store-ahead, flush on preemption, lookups, events and stats stay vLLM's own code, so what CI
exercises here is what runs on a GPU. Selected with ``--kv-transfer-config``::

    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
     "kv_connector_extra_config": {"spec_name": "HostCopyOffloadingSpec",
                                   "spec_module_path": "meridian.vllm.kvtier",
                                   "cpu_bytes_to_use": 1073741824, "offload_prompt_only": false}}

On CUDA the stock spec does the copies; this one is for platforms without device streams.
Invariant: a transfer is complete when ``submit_*`` returns (the copies are synchronous), so
``get_finished`` reports every submitted job exactly once and ``wait`` never blocks; one offload
chunk is one engine block (``blocks_per_chunk`` 1), checked at construction."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from vllm.platforms import current_platform
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec


class HostCopyOffloadingSpec(CPUOffloadingSpec):
    """vLLM's CPU offloading spec with a worker for engines whose KV lives in host memory."""

    def __init__(self, config: OffloadingConfig):
        super().__init__(config)
        self._host_worker: HostCopyWorker | None = None
        if self.blocks_per_chunk != 1:
            raise ValueError(
                f"HostCopyOffloadingSpec stores one engine block per offload chunk; "
                f"blocks_per_chunk is {self.blocks_per_chunk} (set the offload block size to the engine's block size)"
            )

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if current_platform.is_cuda_alike() or current_platform.is_xpu():
            return super().get_worker(kv_caches)
        if self._host_worker is None:
            self._host_worker = HostCopyWorker(kv_caches, self.num_chunks)
        return self._host_worker


class HostCopyWorker(OffloadingWorker):
    """Synchronous block copies, one row per (tensor, block): a per-row ``copy_`` runs at memory
    speed where advanced indexing (``dst[idx] = src[idx]``) was measured 10× slower."""

    def __init__(self, kv_caches: CanonicalKVCaches, num_chunks: int):
        self._engine = [t.tensor.view(torch.int8).view(-1, t.page_size_bytes) for t in kv_caches.tensors]
        self._host = [torch.zeros((num_chunks, t.page_size_bytes), dtype=torch.int8) for t in kv_caches.tensors]
        # Several groups (or layers) may alias one tensor: copy each tensor once per block.
        self._tensors_of_group = [sorted({ref.tensor_idx for ref in refs}) for refs in kv_caches.group_data_refs]
        self._finished: list[TransferResult] = []

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        return self._copy(job_id, src_spec, dst_spec, to_host=True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        return self._copy(job_id, dst_spec, src_spec, to_host=False)

    def get_finished(self) -> list[TransferResult]:
        finished, self._finished = self._finished, []
        return finished

    def wait(self, job_ids: set[int]) -> None:
        return None

    def _copy(self, job_id: int, engine_spec: GPULoadStoreSpec, host_spec: LoadStoreSpec, *, to_host: bool) -> bool:
        assert isinstance(host_spec, BlockIDsLoadStoreSpec)
        started = time.perf_counter()
        block_ids, chunk_ids = engine_spec.block_ids.tolist(), host_spec.block_ids.tolist()
        if len(block_ids) != len(chunk_ids):
            # With one block per chunk the two lists pair up; anything else is a layout this
            # worker does not know, and the job fails (vLLM falls back per its load-failure policy).
            self._finished.append(TransferResult(job_id=job_id, success=False))
            return True
        num_bytes = 0
        for group, (first, count) in enumerate(_group_spans(engine_spec.group_sizes)):
            for t in self._tensors_of_group[group]:
                engine, host = self._engine[t], self._host[t]
                for block, chunk in zip(block_ids[first:first + count], chunk_ids[first:first + count]):
                    if to_host:
                        host[chunk].copy_(engine[block])
                    else:
                        engine[block].copy_(host[chunk])
                num_bytes += count * engine.shape[1]
        self._finished.append(TransferResult(job_id=job_id, success=True, transfer_size=num_bytes,
                                             transfer_time=time.perf_counter() - started))
        return True


def _group_spans(group_sizes: Sequence[int]) -> list[tuple[int, int]]:
    """(first index, count) of each KV cache group's blocks in a spec's concatenated list."""
    spans, first = [], 0
    for count in group_sizes:
        spans.append((first, count))
        first += count
    return spans
