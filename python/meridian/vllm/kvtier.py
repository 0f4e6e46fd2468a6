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
The scheduler side adds Meridian's eviction order to the tier: when a request finishes, the core
reports the token from which its KV is never reusable (its reasoning and the answer computed
after it, the first eviction tier of docs/request-life.md §3); ``TierHooks`` (installed by ``MeridianScheduler`` on the
connector's manager, wrapping its public methods) marks the request's ``ReqContext`` with it, the
manager then never stores those blocks in the request's final store pass, and
``NeverReusableFirstLRU`` (this spec's default cache policy; on CUDA name it with
``"eviction_policy": "NeverReusableFirstLRU", "cache_policy_module_path": "meridian.vllm.kvtier"``)
puts those already stored at the front of the eviction order instead of the back. ``TierHooks``
also puts the core's restore-or-recompute choice between vLLM's scheduler and the connector's
lookup (a hit the core prices dearer than its recompute is reported as no hit, so vLLM
recomputes it), feeds the core the connector's own load timings, what the tier holds of each
live request (the victim choice counts a stored prefix as work a preemption does not lose) and
which blocks it stores and evicts (the core's prefix index), and, with vLLM's tiering spec,
looks up the prefixes of the requests the core names next in line (prefetch: the spec moves
blocks up from its slower tiers when a lookup finds them there). Invariants: a
transfer is complete when ``submit_*`` returns (the copies are synchronous), so ``get_finished``
reports every submitted job exactly once (complete: a block that did not arrive is reported
through ``MeridianOffloadingConnector`` instead, and a chunk whose store failed is never loaded)
and ``wait`` never blocks; one offload chunk is one
engine block (``blocks_per_chunk`` 1), checked at construction; a block with no recorded position
is treated as reusable (never dropped on a guess)."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
from vllm.platforms import current_platform
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    OffloadingManager,
    OffloadingWorker,
    OffloadKey,
    ReqContext,
    TransferResult,
    get_offload_block_hash,
    make_offload_key,
)
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = logging.getLogger("meridian")

#: Finished requests whose contexts ``TierHooks`` keeps until the manager is done with them.
MAX_TRACKED_CONTEXTS = 65536


class _HostCopySpec(CPUOffloadingSpec):
    """What both host-copy specs share: Meridian's eviction order unless the operator named one,
    the one-block chunks the host-copy worker pairs, and vLLM's own worker where its device
    streams exist (CUDA, XPU)."""

    def __init__(self, config: OffloadingConfig):
        super().__init__(config)
        self._host_worker: HostCopyWorker | None = None
        if "eviction_policy" not in self.extra_config:
            self.eviction_policy = NeverReusableFirstLRU.__name__
            self.cache_policy_module_path = __name__
        if self.blocks_per_chunk != 1:
            raise ValueError(
                f"{type(self).__name__} stores one engine block per offload chunk; blocks_per_chunk is "
                f"{self.blocks_per_chunk} (set the offload block size to the engine's block size)"
            )

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if current_platform.is_cuda_alike() or current_platform.is_xpu():
            return super().get_worker(kv_caches)
        if self._host_worker is None:
            self._host_worker = HostCopyWorker(kv_caches, self.num_chunks, self._host_region())
        return self._host_worker

    def _host_region(self) -> SharedOffloadRegion | None:
        """The shared memory the host pool lives in; None: a private tensor per KV tensor."""
        return None


class HostCopyOffloadingSpec(_HostCopySpec):
    """vLLM's CPU offloading spec with a worker for engines whose KV lives in host memory."""


class HostCopyTieringSpec(_HostCopySpec, TieringOffloadingSpec):
    """vLLM's tiering spec (a host primary tier and secondary tiers such as ``fs``, a prefix
    cache on disk that survives a restart) with the host-copy worker. The secondary tiers read
    and write the primary tier's shared memory region, so the worker's host pool is that region
    (one view per KV tensor, as vLLM's own worker lays it out), released at shutdown."""

    def _host_region(self) -> SharedOffloadRegion | None:
        rank = 0 if self.replicated_layout else self.config.parallel.rank
        return SharedOffloadRegion(
            engine_id=self._engine_id,
            num_chunks=self.num_chunks,
            rank=rank,
            kv_bytes_per_chunk=self.kv_bytes_per_chunk,
            cpu_page_size=self.cpu_page_size_per_worker,
        )


class MeridianOffloadingConnector(OffloadingConnector):
    """vLLM's OffloadingConnector, plus the one thing its worker side lacks: reporting blocks
    whose load failed (``get_block_ids_with_load_errors``), so vLLM's ``kv_load_failure_policy``
    applies — ``recompute`` recomputes them and nothing is lost — instead of an assertion in the
    worker. Failures are known for the host-copy worker; with CUDA's stock worker nothing more
    is reported than vLLM itself reports. Selected with ``"kv_connector":
    "MeridianOffloadingConnector", "kv_connector_module_path": "meridian.vllm.kvtier"``."""

    def get_block_ids_with_load_errors(self) -> set[int]:
        worker = getattr(self.connector_worker, "worker", None)
        return worker.take_failed_block_ids() if isinstance(worker, HostCopyWorker) else set()


class HostCopyWorker(OffloadingWorker):
    """Synchronous block copies, one row per (tensor, block): a per-row ``copy_`` runs at memory
    speed where advanced indexing (``dst[idx] = src[idx]``) was measured 10× slower."""

    def __init__(self, kv_caches: CanonicalKVCaches, num_chunks: int, region: SharedOffloadRegion | None = None):
        self._engine = [t.tensor.view(torch.int8).view(-1, t.page_size_bytes) for t in kv_caches.tensors]
        self._region = region
        self._host = [
            torch.zeros((num_chunks, t.page_size_bytes), dtype=torch.int8)
            if region is None
            else region.create_next_worker_view(t.page_size_bytes)
            for t in kv_caches.tensors
        ]
        # Several groups (or layers) may alias one tensor: copy each tensor once per block.
        self._tensors_of_group = [sorted({ref.tensor_idx for ref in refs}) for refs in kv_caches.group_data_refs]
        # vLLM 0.34 hands the engine side over as device pointers, computed per group from its
        # first tensor as base + block id × row stride: what reads them back to block ids.
        self._pointer_rows = [
            (
                kv_caches.tensors[refs[0].tensor_idx].tensor.data_ptr(),
                kv_caches.tensors[refs[0].tensor_idx].tensor.stride(0),
            )
            if refs
            else (0, 1)
            for refs in kv_caches.group_data_refs
        ]
        self._finished: list[TransferResult] = []
        self._failed_block_ids: set[int] = set()
        self._bad_chunks: set[int] = set()

    # The engine side is a ``GPULoadStoreSpec`` of block ids on vLLM 0.32 and 0.33, the
    # ``DevicePointers`` vLLM resolved from them on 0.34.
    def submit_store(self, job_id: int, src_spec: Any, dst_spec: LoadStoreSpec) -> bool:
        return self._copy(job_id, *self._engine_blocks(src_spec), dst_spec, to_host=True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: Any, expedited: bool = False) -> bool:
        # Copies are synchronous: an expedited load (0.34) is no sooner than any other.
        return self._copy(job_id, *self._engine_blocks(dst_spec), src_spec, to_host=False)

    def _engine_blocks(self, engine_side: Any) -> tuple[list[int], Sequence[int]]:
        """The engine blocks of a transfer and how many belong to each KV cache group."""
        if isinstance(engine_side, GPULoadStoreSpec):
            return engine_side.block_ids.tolist(), engine_side.group_sizes
        block_ids: list[int] = []
        offset = 0
        counts = engine_side.group_block_counts
        for (base, stride), count, num_refs in zip(self._pointer_rows, counts, engine_side.group_data_ref_counts):
            if count == 0:
                continue
            rows = (engine_side.ptrs[offset : offset + count].astype("int64") - base) // stride
            block_ids.extend(int(b) for b in rows)
            offset += count * num_refs
        return block_ids, counts

    def get_finished(self) -> list[TransferResult]:
        finished, self._finished = self._finished, []
        return finished

    def wait(self, job_ids: set[int]) -> None:
        return None

    def shutdown(self) -> None:
        self._host = []
        if self._region is not None:
            self._region.cleanup()  # the creator also unlinks its /dev/shm file
            self._region = None

    def take_failed_block_ids(self) -> set[int]:
        """Engine blocks whose loads failed since the last call (their bytes never arrived)."""
        failed, self._failed_block_ids = self._failed_block_ids, set()
        return failed

    def _copy(
        self, job_id: int, block_ids: list[int], group_sizes: Sequence[int], host_spec: LoadStoreSpec, *, to_host: bool
    ) -> bool:
        assert isinstance(host_spec, BlockIDsLoadStoreSpec)
        started = time.perf_counter()
        chunk_ids = host_spec.block_ids.tolist()
        if len(block_ids) != len(chunk_ids):
            # With one block per chunk the two lists pair up; anything else is a layout this
            # worker does not know: nothing is copied, and a load's blocks are reported failed.
            logger.error(
                "meridian: host tier job %d pairs %d engine blocks with %d host chunks",
                job_id,
                len(block_ids),
                len(chunk_ids),
            )
            if not to_host:
                self._failed_block_ids.update(block_ids)
            self._finished.append(TransferResult(job_id=job_id, success=True))
            return True
        num_bytes = 0
        for group, (first, count) in enumerate(_group_spans(group_sizes)):
            pairs = list(zip(block_ids[first : first + count], chunk_ids[first : first + count]))
            for t in self._tensors_of_group[group]:
                self._copy_rows(t, pairs, to_host=to_host)
                num_bytes += count * self._engine[t].shape[1]
        # A job is always reported complete (vLLM's offloading worker takes no failed jobs);
        # blocks that did not arrive go through get_block_ids_with_load_errors instead.
        self._finished.append(
            TransferResult(
                job_id=job_id, success=True, transfer_size=num_bytes, transfer_time=time.perf_counter() - started
            )
        )
        return True

    def _copy_rows(self, tensor: int, pairs: list[tuple[int, int]], *, to_host: bool) -> None:
        engine, host = self._engine[tensor], self._host[tensor]
        for block, chunk in pairs:
            try:
                if to_host:
                    host[chunk].copy_(engine[block])
                    self._bad_chunks.discard(chunk)
                elif chunk in self._bad_chunks:
                    self._failed_block_ids.add(block)
                else:
                    engine[block].copy_(host[chunk])
            except RuntimeError:
                logger.exception(
                    "meridian: host tier copy of block %d %s chunk %d failed", block, "to" if to_host else "from", chunk
                )
                if to_host:  # the chunk holds nothing usable until it is stored again
                    self._bad_chunks.add(chunk)
                else:
                    self._failed_block_ids.add(block)


def _group_spans(group_sizes: Sequence[int]) -> list[tuple[int, int]]:
    """(first index, count) of each KV cache group's blocks in a spec's concatenated list."""
    spans, first = [], 0
    for count in group_sizes:
        spans.append((first, count))
        first += count
    return spans


# ---- scheduler side: Meridian's eviction order on the tier ----------------------------------


@dataclass(frozen=True)
class NeverReusable:
    """``ReqContext`` state of a finished request: its KV from ``from_token`` on is never reused."""

    from_token: int

    def keeps(self, key: OffloadKey, req_context: ReqContext) -> bool:
        position = req_context.get_offload_key_position(key)  # the block's end token
        return position is None or position <= self.from_token


@dataclass(frozen=True)
class KeepWhileLive:
    """``ReqContext`` state of a request whose policy retains its tier blocks (the core's
    ``retains_live_tier_blocks``: Meridian's own): the tier keeps the blocks it stores until it
    finishes."""


class NeverReusableFirstLRU(LRUCachePolicy):
    """vLLM's LRU with Meridian's order: a finished request's never-reusable blocks go to the front
    of the eviction order instead of to the back (below every other block, earliest demoted first,
    and within a request its tail first, as LRU orders a request's blocks), and the blocks a live
    request stored are not evicted until it finishes. Why the second rule: the connector restores
    a prefix, from the first block on, and LRU evicts a long-running request's oldest blocks — its
    first ones — while it still runs, so a preempted request whose first block is gone loads
    nothing of the thousands after it (measured in the replay: 22 of 139 preempted requests whose
    later blocks were all stored recomputed everything). What it holds back is bounded by the KV of
    the requests in flight; when nothing else can go, a store fails and vLLM retries it later. A
    request is kept only when its ``ReqContext`` carries ``KeepWhileLive`` (``TierHooks`` sets it),
    so under vLLM's own scheduler the order is vLLM's LRU. A kept block is never in LRU's evictable
    heap (eviction would have to step over every kept block at its front on every call); its
    request's finish hands it back to LRU."""

    def __init__(self, cache_capacity: int):
        super().__init__(cache_capacity)
        # Ordinary ranks count up from 1; demoted ones count up from far below them.
        self._next_low_rank = -(1 << 62)
        #: Blocks live requests stored, per request and all together; those of them LRU would
        #: otherwise hold as evictable (stored, not being read).
        self._kept_by_request: dict[str, set[OffloadKey]] = {}
        self._kept: set[OffloadKey] = set()
        self._kept_idle: set[OffloadKey] = set()

    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        keys = list(keys)
        super().on_store_miss(keys, req_context)
        if req_context.get_state(KeepWhileLive) is not None:
            self._kept_by_request.setdefault(req_context.req_id, set()).update(keys)
            self._kept.update(keys)

    def insert(self, key: OffloadKey, chunk: Any, *req_context: ReqContext) -> None:
        # vLLM 0.33 hands the storing request's context on (and ranks its blocks by position);
        # 0.32 does not: pass on whatever came.
        super().insert(key, chunk, *req_context)
        if key in self._kept and key in self._evictable:
            self._hold(key)

    def mark_evictable(self, key: OffloadKey) -> None:
        if key in self._kept:
            self._kept_idle.add(key)
        else:
            super().mark_evictable(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        if key in self._kept_idle:
            self._kept_idle.discard(key)
        else:
            super().mark_non_evictable(key)

    def remove(self, key: OffloadKey) -> None:
        super().remove(key)
        self._kept.discard(key)
        self._kept_idle.discard(key)

    def clear(self) -> None:
        super().clear()
        self._kept_by_request.clear()
        self._kept.clear()
        self._kept_idle.clear()

    def _hold(self, key: OffloadKey) -> None:
        # Out of the evictable set, its heap entry goes stale (LRU invalidates entries lazily).
        self._evictable.discard(key)
        self._kept_idle.add(key)

    def _release(self, req_id: str) -> None:
        for key in self._kept_by_request.pop(req_id, ()):
            self._kept.discard(key)
            if key in self._kept_idle:
                self._kept_idle.discard(key)
                self._evictable.add(key)
                self._push_evictable(key)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: set[OffloadKey],
        reused_keys: set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        self._release(req_context.req_id)
        rule = req_context.get_state(NeverReusable)
        if rule is None:
            super().on_request_finished(key_groups, insertion_only_keys, reused_keys, req_context)
            return
        kept = tuple(tuple(k for k in group if rule.keeps(k, req_context)) for group in key_groups)
        super().on_request_finished(kept, insertion_only_keys, reused_keys, req_context)
        for group in key_groups:
            for key in reversed(group):
                if not rule.keeps(key, req_context):
                    self._demote(key)

    def _demote(self, key: OffloadKey) -> None:
        if key not in self.chunks:
            return
        # The heap invalidates entries lazily by rank, so a new low rank is all it takes. Its
        # shape is the LRU's own: an int on vLLM 0.32, (rank, -position) on 0.33, whose heap
        # cannot compare the two.
        self._next_low_rank += 1
        current = self._ranks.get(key)
        self._ranks[key] = (self._next_low_rank, 0) if isinstance(current, tuple) else self._next_low_rank
        if key in self._evictable:
            self._push_evictable(key)


class RestorePolicy(Protocol):
    """What the hooks ask the scheduler (which asks the core)."""

    @property
    def retains_live_blocks(self) -> bool:
        """Whether the tier keeps a live request's stored blocks until it finishes."""

    def restore_tokens(self, request: Request, num_hit_tokens: int) -> int:
        """How many of a tier hit's tokens to load; the rest is recomputed."""

    def on_kv_allocated(self, request: Request, num_external_tokens: int) -> None:
        """vLLM allocated the request with this many tokens coming from the tier."""

    def on_kv_loaded(self, num_tokens: float, duration_s: float) -> None:
        """The tier finished loads of ``num_tokens`` tokens in ``duration_s``."""

    def on_kv_stored(self, req_id: str, num_tokens: int) -> None:
        """The tier now holds the first ``num_tokens`` tokens of the request's KV."""

    def on_tier_blocks(self, stored_hashes: list[bytes], removed_hashes: list[bytes]) -> None:
        """The tier stored and evicted these blocks (their block hashes)."""

    def on_tier_cleared(self) -> None:
        """The tier dropped everything."""


class TierHooks:
    """Wraps an OffloadingConnector's and its manager's public methods (never vLLM's code):
    remembers each request's ``ReqContext``, marks a finished one with the core's never-reusable
    token and keeps those blocks out of its final store pass; asks the core how much of each hit
    to load; reports the tier's load timings, and how much of each live request's KV the tier
    holds (what a preemption of it would lose): the end of the prefix its stores have covered,
    cut back when the manager evicts one of its blocks to make room (evictions the manager makes
    on its own, e.g. a tiering spec's promotions, are not seen: the figure is a hint to the
    victim choice, and a resume still loads only what the connector's lookup finds)."""

    #: The core's name for the tier (one per engine: the first OffloadingConnector's).
    TIER_NAME = "OffloadingConnector"

    #: Whether slower tiers sit behind the manager (vLLM's tiering spec with secondary tiers):
    #: a lookup there starts moving a block up, so looking ahead pays (``prefetch``).
    staged: bool

    def __init__(
        self, connector: Any, manager: OffloadingManager, policy: RestorePolicy, kv_bytes_per_token: float, group: Any
    ):
        self._contexts: OrderedDict[str, ReqContext] = OrderedDict()
        self._manager = manager
        #: The core's answer, per policy: the baselines leave the tier's own order alone.
        self._retains_live = policy.retains_live_blocks
        self.staged = bool(getattr(manager, "secondary_tiers", None))
        #: Prefix lookups made ahead of a request's turn, and the blocks they found ready.
        self.num_prefetch_lookups = 0
        self.num_prefetched_blocks = 0
        #: Per request being prefetched: its first chunk not yet found ready.
        self._prefetch_from: dict[str, int] = {}
        # The connector's first KV cache group: its keys are one block hash in every
        # ``hashes_per_chunk`` (the chunk's last), as the connector's own lookup builds them.
        self._group_idx, self._hashes_per_chunk = group.group_idx, group.hashes_per_chunk
        tokens_per_chunk = group.tokens_per_chunk
        self.num_blocks_not_stored = 0
        self.num_requests_marked = 0
        self._policy = policy
        self._tokens_per_chunk = tokens_per_chunk
        #: Live requests' stored blocks: key → (req_id, the block's end token).
        self._owners: dict[OffloadKey, tuple[str, int]] = {}
        #: Per live request: the end of its stored prefix, and the keys it owns.
        self._stored_tokens: dict[str, int] = {}
        self._owned_keys: dict[str, list[OffloadKey]] = {}
        self._wrap_manager(manager)
        self._wrap_connector(connector, policy, kv_bytes_per_token)

    def _wrap_manager(self, manager: OffloadingManager) -> None:
        on_new_request, prepare_store = manager.on_new_request, manager.prepare_store
        on_request_finished = manager.on_request_finished

        retains_live = self._retains_live

        def tracking_on_new_request(req_context: ReqContext) -> Any:
            if retains_live:
                req_context.set_state(KeepWhileLive())
            self._contexts[req_context.req_id] = req_context
            while len(self._contexts) > MAX_TRACKED_CONTEXTS:
                self._contexts.popitem(last=False)
            return on_new_request(req_context)

        def filtering_prepare_store(keys: Collection[OffloadKey], req_context: ReqContext) -> Any:
            rule = req_context.get_state(NeverReusable)
            if rule is not None:
                kept = [k for k in keys if rule.keeps(k, req_context)]
                self.num_blocks_not_stored += len(keys) - len(kept)
                keys = kept
            output = prepare_store(keys, req_context)
            if output is not None:
                self._policy.on_tier_blocks(
                    [get_offload_block_hash(k) for k in output.keys_to_store],
                    [get_offload_block_hash(k) for k in output.evicted_keys],
                )
                if rule is None:  # a live request: what a preemption of it would lose
                    self._note_stored(keys, req_context, output.evicted_keys)
            return output

        def releasing_on_request_finished(req_context: ReqContext) -> None:
            on_request_finished(req_context)
            self._contexts.pop(req_context.req_id, None)
            self._prefetch_from.pop(req_context.req_id, None)
            self._forget(req_context.req_id)

        reset_cache = manager.reset_cache

        def clearing_reset_cache() -> Any:
            self._policy.on_tier_cleared()
            return reset_cache()

        manager.on_new_request = tracking_on_new_request  # type: ignore[method-assign]
        manager.reset_cache = clearing_reset_cache  # type: ignore[method-assign]
        manager.prepare_store = filtering_prepare_store  # type: ignore[method-assign]
        manager.on_request_finished = releasing_on_request_finished  # type: ignore[method-assign]

    def _note_stored(
        self, keys: Collection[OffloadKey], req_context: ReqContext, evicted_keys: Iterable[OffloadKey]
    ) -> None:
        # Store-ahead offers a request's full blocks in order, so its stored prefix grows block
        # by block while nothing of it is evicted; a block after a hole extends nothing. Blocks
        # before its first offer were prefix hits, held by the device cache or already stored.
        req_id, chunk = req_context.req_id, self._tokens_per_chunk
        end = self._stored_tokens.get(req_id)
        owned = self._owned_keys.setdefault(req_id, [])
        for key in keys:
            position = req_context.get_offload_key_position(key)
            if position is None:
                continue
            self._owners[key] = (req_id, position)
            owned.append(key)
            if end is None:
                end = position - chunk
            if position - chunk <= end:
                end = max(end, position)
        if end is not None:
            self._set_stored(req_id, end)
        for key in evicted_keys:
            owner = self._owners.pop(key, None)
            if owner is not None:
                # The prefix now ends where the evicted block begins.
                victim, position = owner
                self._set_stored(victim, min(self._stored_tokens.get(victim, 0), position - self._tokens_per_chunk))

    def _set_stored(self, req_id: str, num_tokens: int) -> None:
        num_tokens = max(num_tokens, 0)
        if self._stored_tokens.get(req_id) != num_tokens:
            self._stored_tokens[req_id] = num_tokens
            self._policy.on_kv_stored(req_id, num_tokens)

    def _forget(self, req_id: str) -> None:
        self._stored_tokens.pop(req_id, None)
        for key in self._owned_keys.pop(req_id, ()):
            if self._owners.get(key, (None,))[0] == req_id:
                del self._owners[key]

    @staticmethod
    def _wrap_connector(connector: Any, policy: RestorePolicy, kv_bytes_per_token: float) -> None:
        lookup, after_alloc = connector.get_num_new_matched_tokens, connector.update_state_after_alloc
        update_output = connector.update_connector_output

        def planned_lookup(request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
            num_hit_tokens, load_async = lookup(request, num_computed_tokens)
            if not num_hit_tokens:
                return num_hit_tokens, load_async  # no hit, or "ask again later" (None)
            num_tokens = policy.restore_tokens(request, num_hit_tokens)
            # (0, False) is the connector's own "no hit": nothing is loaded, vLLM recomputes.
            return num_tokens, load_async and num_tokens > 0

        def counted_after_alloc(request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> Any:
            policy.on_kv_allocated(request, num_external_tokens)
            return after_alloc(request, blocks, num_external_tokens)

        def timed_update_output(connector_output: KVConnectorOutput) -> Any:
            meta = connector_output.kv_connector_worker_meta
            if isinstance(meta, OffloadingWorkerMetadata) and meta.transfer_stats.load.bytes > 0:
                loads = meta.transfer_stats.load
                policy.on_kv_loaded(loads.bytes / kv_bytes_per_token, loads.time)
            return update_output(connector_output)

        connector.get_num_new_matched_tokens = planned_lookup
        connector.update_state_after_alloc = counted_after_alloc
        connector.update_connector_output = timed_update_output

    @classmethod
    def install(
        cls, connector: object | None, policy: RestorePolicy, kv_cache_config: KVCacheConfig
    ) -> TierHooks | None:
        """Hooks on the first OffloadingConnector among ``connector`` (or a MultiConnector's parts)."""
        for part in _connector_parts(connector):
            connector_scheduler: Any = getattr(part, "connector_scheduler", None)
            manager = getattr(connector_scheduler, "manager", None)
            if isinstance(manager, OffloadingManager):
                group = connector_scheduler.config.kv_group_configs[0]
                return cls(part, manager, policy, kv_bytes_per_token(kv_cache_config), group)
        return None

    def prefetch(self, requests: Iterable[Request]) -> list[Request]:
        """Looks each request's prompt up in the tier, chunk by chunk until a miss, as the
        connector will when the request's turn comes: a staged manager answers "ask again" while
        it checks a slower tier, then starts moving the chunk up to the fastest, then finds it
        there, so a request is looked up step after step until its chunks are all ready (or
        missing). Returns the requests for which that is done. Chunks found ready are not looked
        up again."""
        ready = []
        for request in requests:
            context = self._contexts.get(request.request_id)
            if context is None:
                ready.append(request)
                continue
            step = self._hashes_per_chunk
            keys = request.block_hashes[step - 1 :: step]
            first = self._prefetch_from.get(request.request_id, 0)
            pending = False
            for i in range(first, len(keys)):
                self.num_prefetch_lookups += 1
                result = self._manager.lookup(make_offload_key(keys[i], self._group_idx), context)
                if result == LookupResult.MISS:
                    break
                if result == LookupResult.HIT and not pending:
                    first = i + 1
                    self.num_prefetched_blocks += step
                else:
                    pending = True  # keep going: the manager starts its checks along the way
            self._prefetch_from[request.request_id] = first
            if not pending:
                ready.append(request)
                self._prefetch_from.pop(request.request_id, None)
        return ready

    def stored_tokens(self, req_id: str) -> int:
        """The end of the request's stored prefix as the hooks have seen it (0: nothing stored)."""
        return self._stored_tokens.get(req_id, 0)

    def mark_never_reusable(self, req_id: str, from_token: int) -> None:
        context = self._contexts.get(req_id)
        if context is not None:
            context.set_state(NeverReusable(from_token))
            self.num_requests_marked += 1


def kv_bytes_per_token(kv_cache_config: KVCacheConfig) -> float:
    """Bytes of KV one token takes in the engine, all layers of its group (the mean over groups of
    a hybrid model): what a tier moves per token."""
    per_group = [
        g.kv_cache_spec.page_size_bytes * len(g.layer_names) / g.kv_cache_spec.block_size
        for g in kv_cache_config.kv_cache_groups
    ]
    return sum(per_group) / len(per_group) if per_group else 1.0


def _connector_parts(connector: object | None) -> Iterable[object]:
    if connector is None:
        return []
    return [connector, *getattr(connector, "_connectors", [])]
