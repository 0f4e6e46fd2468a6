"""The one engine loop that stands in for vLLM's ``EngineCore``: any vLLM scheduler class, driven
offline with scripted model outputs on a virtual clock.

``build_scheduler`` builds a scheduler class (stock ``AsyncScheduler``/``Scheduler`` or
``MeridianScheduler``) from vLLM's own config classes, with a local model folder and no model hub
(the recipe of vLLM's ``tests/v1/core/utils.py``). ``OfflineEngine`` then runs it through
``EngineCore.step_with_batch_queue``'s call sequence — with a batch queue of two under async
scheduling (step N+1 is scheduled before step N's output is applied), of one otherwise (vLLM's
synchronous ``step``) — with a "model" that emits each request's scripted token by output
position, the way greedy decoding would. Time is virtual: each executed step occupies the device
for ``step_time_ms(shape)``, starting when it was scheduled or when the previous step finished,
and its output is applied when it finishes. The replay, the scripted demo and the tests all run
on this loop; ``tests/offline/test_engine_vs_engine_core.py`` compares it with a real
``EngineCore``. ``run()`` replays the requests given at construction; ``submit`` (arrivals, in
order), ``advance_to`` (the clock) and ``finish`` run the same loop piece by piece, for a caller
that decides where each request goes as it arrives (the data-parallel replay,
``meridian.replay.dp``: one engine fed that way gives exactly ``run()``'s results).

An optional *arrival gate* (``ArrivalGate``) stands where a server refuses work before its
engine sees it — vLLM's own load valve (``--max-num-queued-reqs``, ``meridian.replay.policies``)
or an admission decision at arrival: it is asked once per valid request as the engine adds it,
with the engine itself to read (the scheduler, the clock, what is in flight), and a refusal
finishes the request at its arrival without a scheduler ever seeing it. A refusal is recorded as
a request *refused under load*: a shed whose client hears at once (``Timeline.shed_by`` names the
gate's reason), counted as missed, never as a failure.

Metrics come from one Meridian core used as a pure observer (no plans), fed the same token
streams whatever the scheduler, so stock and Meridian runs are measured by one definition
(docs/request-life.md §4). Invariant: the engine only calls the public scheduler interface, in vLLM's order; it
never looks at a policy's decisions except through what vLLM itself would see (outputs,
preemptions).

An engine can also stand on one side of a prefill/decode hand-off: ``EngineSpec.kv_role`` gives
its scheduler vLLM's ``NixlConnector`` as producer (the prefill instance: a request's blocks stay
held after its one token until the decode side has read them) or consumer (the decode instance:
vLLM parks a request in ``WAITING_FOR_REMOTE_KVS`` while its prompt's KV arrives), and
``RemoteKvLink`` simulates what NIXL's worker would report (``finished_recving`` /
``finished_sending``) at a transfer cost per token. A caller that owns both sides
(``meridian.replay.disaggregated``) joins the links: a read on the decode side tells the producer
when its blocks are free.
"""

from __future__ import annotations

import heapq
import os
from array import array
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from meridian._core import SHED_MARKER, Config, FinishedRequest, Meridian
from meridian.offline.tiny import EOS, TOOL_CALL
from meridian.vllm.names import CONFIG_KEY

#: vLLM's batch queue depth under async scheduling with one GPU (``max_concurrent_batches``).
BATCH_QUEUE_SIZE = 2
#: Virtual time that passes when the scheduler holds requests but schedules nothing and nothing
#: is in flight (e.g. every running answer is paced): the engine polls again after this.
IDLE_TICK_MS = 1.0
#: The observer core takes priorities in this range (it only measures; vLLM takes any int).
_PRIORITY_LIMIT = 2**62
#: ``Timeline.finish_reason`` of a request an arrival gate refused.
REFUSED = "refused"


def offline_environment(cache_dir: str | Path) -> None:
    """Points vLLM's caches into ``cache_dir`` and keeps it off the network and off Triton."""
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache / "vllm"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")


# ---- building a scheduler the way EngineCore does --------------------------------------------


@dataclass
class EngineSpec:
    """The vLLM engine settings an offline run uses."""

    model_dir: Path
    num_blocks: int = 49
    block_size: int = 16
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 256
    max_model_len: int = 2048
    reasoning_parser: str | None = "deepseek_r1"
    async_scheduling: bool = True
    enable_prefix_caching: bool = True
    policy: str = "fcfs"
    additional_config: dict[str, Any] = field(default_factory=dict)
    #: Blocks of the host KV tier (vLLM's OffloadingConnector on Meridian's host-copy spec, its
    #: transfers simulated by the engine); 0: no tier.
    num_host_blocks: int = 0
    #: What a load from the host tier costs the simulated link per token.
    host_load_ms_per_token: float = 0.0
    #: This engine's side of a prefill/decode hand-off (vLLM's ``NixlConnector`` in that
    #: ``kv_role``: ``kv_producer`` on a prefill instance, ``kv_consumer`` on a decode one);
    #: ``None``: no hand-off.
    kv_role: str | None = None
    #: vLLM 0.34's ``--max-num-inflight-kv-loads`` (a decode instance's hand-offs start their KV
    #: loads while every running seat is taken, at most this many at once); ``None``: off.
    max_num_inflight_kv_loads: int | None = None


#: The ``kv_role`` values of a hand-off's two sides.
KV_ROLES = ("kv_producer", "kv_consumer")


#: The (one-layer, one-head) KV layout offline engines give vLLM's KV cache manager.
_KV_NUM_HEADS, _KV_HEAD_SIZE, _KV_DTYPE_BYTES = 1, 1, 4


def _host_tier_config(spec: EngineSpec) -> Any:
    """vLLM's OffloadingConnector on ``HostCopyOffloadingSpec`` with room for
    ``spec.num_host_blocks`` blocks, thinking tokens stored too."""
    from vllm.config import KVTransferConfig

    from meridian.vllm.kvtier import HostCopyOffloadingSpec

    page_bytes = 2 * spec.block_size * _KV_NUM_HEADS * _KV_HEAD_SIZE * _KV_DTYPE_BYTES
    align = HostCopyOffloadingSpec.BLOCK_SIZE_ALIGNMENT
    chunk_bytes = -(-page_bytes // align) * align
    return KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "spec_name": HostCopyOffloadingSpec.__name__,
            "spec_module_path": HostCopyOffloadingSpec.__module__,
            "cpu_bytes_to_use": spec.num_host_blocks * chunk_bytes,
            "offload_prompt_only": False,
        },
    )


def _kv_transfer_config(spec: EngineSpec) -> Any:
    """The connector ``spec`` asks for: the host tier, one side of a hand-off, or none."""
    if spec.kv_role is not None and spec.kv_role not in KV_ROLES:
        raise ValueError(f"kv_role {spec.kv_role!r}: expected one of {', '.join(KV_ROLES)}")
    if spec.kv_role is not None and spec.num_host_blocks > 0:
        raise ValueError("an engine takes the host KV tier or one side of a hand-off, not both (one connector)")
    if spec.num_host_blocks > 0:
        return _host_tier_config(spec)
    if spec.kv_role is None:
        return None
    from vllm.config import KVTransferConfig

    # vLLM's default load-failure policy ("fail"); the simulated link never fails a read.
    return KVTransferConfig(kv_connector="NixlConnector", kv_role=cast(Any, spec.kv_role))


def vllm_config_for(spec: EngineSpec, scheduler_cls: type[Any] | None = None) -> Any:
    """The ``VllmConfig`` an engine with ``spec`` runs under (``scheduler_cls`` recorded in it
    for ``EngineCore``, which builds its scheduler from the config)."""
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ReasoningConfig, SchedulerConfig, VllmConfig

    model_config = ModelConfig(model=str(spec.model_dir), max_model_len=spec.max_model_len, dtype="float32", seed=0)
    extra: dict[str, Any] = {"scheduler_cls": scheduler_cls} if scheduler_cls is not None else {}
    if spec.max_num_inflight_kv_loads is not None:
        if "max_num_inflight_kv_loads" not in SchedulerConfig.__dataclass_fields__:
            raise ValueError(
                f"max_num_inflight_kv_loads={spec.max_num_inflight_kv_loads}: this vLLM has no async KV-load queue "
                "(vLLM 0.34 added --max-num-inflight-kv-loads)"
            )
        extra["max_num_inflight_kv_loads"] = spec.max_num_inflight_kv_loads
    scheduler_config = SchedulerConfig(
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        max_model_len=spec.max_model_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        async_scheduling=spec.async_scheduling,
        policy=cast(Any, spec.policy),
        **extra,
    )
    cache_config = CacheConfig(block_size=spec.block_size, enable_prefix_caching=spec.enable_prefix_caching)
    reasoning_config = ReasoningConfig(reasoning_parser=spec.reasoning_parser) if spec.reasoning_parser else None
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        reasoning_config=reasoning_config,
        device_config=DeviceConfig(device="cpu"),
        additional_config=_without_metrics(spec.additional_config),
        kv_transfer_config=_kv_transfer_config(spec),
    )
    # vLLM's CPU platform turns async scheduling off ("not required on CPU"); the engine here
    # stands in for a GPU engine, whose batch queue of two is what it models.
    vllm_config.scheduler_config.async_scheduling = spec.async_scheduling
    return vllm_config


def _without_metrics(additional_config: dict[str, Any]) -> dict[str, Any]:
    # No /metrics to publish on here: Meridian's series stay off unless the spec asks for them.
    # No API server either: the scheduler publishes no queue for one (the replay's own gate,
    # ``meridian.replay.policies.MeridianAdmission``, reads the core directly); that key steers
    # nothing else in the core.
    block = additional_config.get(CONFIG_KEY, {})
    if not isinstance(block, dict) or not isinstance(block.get("overload", {}), dict):
        return additional_config  # a bad block: the scheduler's own check names it
    overload = {**block.get("overload", {}), "admit_at_arrival": False}
    return {**additional_config, CONFIG_KEY: {"metrics": False, **block, "overload": overload}}


def kv_cache_config_for(spec: EngineSpec) -> Any:
    """vLLM's ``KVCacheConfig`` of an offline engine: ``spec.num_blocks`` blocks of one
    full-attention group."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    attention = FullAttentionSpec(
        block_size=spec.block_size, num_kv_heads=_KV_NUM_HEADS, head_size=_KV_HEAD_SIZE, dtype=torch.float32
    )
    return KVCacheConfig(
        num_blocks=spec.num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], attention)]
    )


def build_scheduler(scheduler_cls: type[Any], spec: EngineSpec) -> Any:
    """Builds ``scheduler_cls`` the way ``EngineCore`` does, with ``spec.num_blocks`` KV blocks."""
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.structured_output import StructuredOutputManager

    vllm_config = vllm_config_for(spec)
    kv_cache_config = kv_cache_config_for(spec)
    vllm_config.cache_config.num_gpu_blocks = spec.num_blocks
    register_all_kvcache_specs(vllm_config)
    return scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=spec.block_size,
        log_stats=True,
    )


# ---- the scripted model -----------------------------------------------------------------------


def runner_output(sampled: dict[str, list[int]]) -> Any:
    """The ``ModelRunnerOutput`` a model runner returns for ``sampled`` (tokens per request)."""
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(sampled)
    # vLLM 0.34 reads each request's row from `req_ids` alone; 0.32 and 0.33 also want the index.
    index: dict[str, Any] = (
        {"req_id_to_index": {req_id: i for i, req_id in enumerate(req_ids)}}
        if "req_id_to_index" in ModelRunnerOutput.__dataclass_fields__
        else {}
    )
    return ModelRunnerOutput(
        req_ids=req_ids,
        sampled_token_ids=[sampled[req_id] for req_id in req_ids],
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
        **index,
    )


def sampled_tokens(output: Any, requests: dict[str, Any], token_at: Callable[[str, int], int]) -> dict[str, list[int]]:
    """What greedy decoding samples for a scheduled step, read right after ``schedule()``: one
    token per request whose prompt is complete — ``token_at(req_id, output position)`` — and
    nothing for a prompt chunk."""
    sampled: dict[str, list[int]] = {}
    for req_id in output.num_scheduled_tokens:
        request = requests[req_id]
        if request.is_prefill_chunk:
            sampled[req_id] = []
            continue
        sampled[req_id] = [token_at(req_id, request.num_computed_tokens - request.num_prompt_tokens)]
    return sampled


class HostTierLink:
    """The worker side of the host KV tier, simulated: every store and load job a step carries
    completes with that step's output, and the output waits for the step's loads at
    ``load_ms_per_token`` (a GPU's copy engine runs them beside the forward pass, so a step takes
    the longer of the two). What the scheduler side sees is what vLLM's worker would report: the
    completed jobs with their transfer sizes and times, and the requests whose loads finished."""

    def __init__(self, scheduler: Any, load_ms_per_token: float) -> None:
        from meridian.vllm.kvtier import kv_bytes_per_token

        self.block_size = int(scheduler.block_size)
        self.load_ms_per_token = load_ms_per_token
        self.kv_bytes_per_token = kv_bytes_per_token(scheduler.kv_cache_config)
        self._manager = scheduler.connector.connector_scheduler.manager

    def holds(self, request: Any) -> bool:
        """Whether the tier holds (or is storing) a preempted request's blocks: its last full
        block but one (store-ahead offers a block the step after it fills, so a victim's newest
        block may never have been offered)."""
        from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key

        if not request.block_hashes:
            return False
        key = make_offload_key(request.block_hashes[max(len(request.block_hashes) - 2, 0)], 0)
        return bool(self._manager.lookup(key, ReqContext(req_id=request.request_id)) != LookupResult.MISS)

    @staticmethod
    def _jobs(output: Any) -> Any:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingConnectorMetadata

        meta = output.kv_connector_metadata
        return meta if isinstance(meta, OffloadingConnectorMetadata) else None

    def _load_tokens(self, jobs: Any) -> int:
        return sum(len(job.dst_spec.block_ids) for job in jobs.load_jobs.values()) * self.block_size

    def has_jobs(self, output: Any) -> bool:
        jobs = self._jobs(output)
        return jobs is not None and bool(jobs.load_jobs or jobs.store_jobs)

    def load_ms(self, output: Any) -> float:
        jobs = self._jobs(output)
        return 0.0 if jobs is None else self._load_tokens(jobs) * self.load_ms_per_token

    def load_req_ids(self, output: Any) -> list[str]:
        jobs = self._jobs(output)
        return [] if jobs is None else [job.req_id for job in jobs.load_jobs.values()]

    def load_tokens(self, output: Any) -> int:
        jobs = self._jobs(output)
        return 0 if jobs is None else self._load_tokens(jobs)

    def connector_output(self, output: Any) -> Any:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
        from vllm.v1.outputs import KVConnectorOutput

        jobs = self._jobs(output)
        if jobs is None:
            return None
        meta = OffloadingWorkerMetadata()
        for job_id in (*jobs.store_jobs, *jobs.load_jobs):
            meta.mark_completed(job_id)
        num_tokens = self._load_tokens(jobs)
        if num_tokens:
            meta.transfer_stats.load.record(
                round(num_tokens * self.kv_bytes_per_token), num_tokens * self.load_ms_per_token / 1000.0
            )
        finished = {job.req_id for job in jobs.load_jobs.values()}
        return KVConnectorOutput(finished_recving=finished or None, kv_connector_worker_meta=meta)


@dataclass(frozen=True)
class TransferCost:
    """What moving one request's KV from a prefill to a decode instance costs: a fixed latency
    (the read's set-up and the completion notice) and a time per prompt token (KV bytes per token
    over the link's bandwidth)."""

    ms_per_token: float
    latency_ms: float = 0.0

    def __post_init__(self) -> None:
        if not (self.ms_per_token >= 0 and self.latency_ms >= 0):
            raise ValueError(
                f"transfer cost: ms_per_token={self.ms_per_token} and latency_ms={self.latency_ms} must be >= 0"
            )

    def read_ms(self, num_tokens: int) -> float:
        return self.latency_ms + num_tokens * self.ms_per_token


class RemoteKvLink:
    """The worker side of vLLM's ``NixlConnector``, simulated for one instance of a hand-off.

    Decode side (``kv_consumer``): a read starts when a step's connector metadata carries the
    request (vLLM allocated its blocks and parked it in ``WAITING_FOR_REMOTE_KVS``); it runs beside
    the forward passes, as NIXL's reads do, and completes ``cost.read_ms(tokens)`` later; the first
    step output applied after that reports it in ``finished_recving``. Either way (a read, or the
    notice-only entry vLLM sends when a request ends before reading) the producer's blocks are
    released at that moment through ``on_read(remote_request_id, at_ms)``.

    Prefill side (``kv_producer``): a finished request whose output carries ``kv_transfer_params``
    holds its blocks (vLLM delays their free) until ``release`` gives the moment its reader is
    done; the first step output applied after that reports it in ``finished_sending``.
    Invariant: every read reported finished was started by the scheduler's own metadata, and every
    send reported finished was held by a finished request of this engine.
    """

    def __init__(self, scheduler: Any, cost: TransferCost) -> None:
        self.block_size = int(scheduler.block_size)
        self.cost = cost
        #: Decode side: told of each read's end (the dispatcher forwards it to the producer).
        self.on_read: Callable[[str, float], None] | None = None
        self._reads: list[tuple[float, str]] = []  # (done_ms, req_id), a heap
        #: Prefill side: per request holding its blocks for a reader, when the reader is done
        #: (``None``: not yet known).
        self._held: dict[str, float | None] = {}
        self.num_reads = 0
        self.num_read_tokens = 0
        self.read_ms_total = 0.0
        self.num_sends = 0

    def start_reads(self, output: Any, now_ms: float) -> None:
        """Starts the reads a scheduled step's metadata asks for."""
        meta = output.kv_connector_metadata
        for req_id, req_meta in getattr(meta, "reqs_to_recv", {}).items():
            num_tokens = len(req_meta.local_block_ids[0]) * self.block_size if req_meta.awaiting_kvs else 0
            done_ms = now_ms + (self.cost.read_ms(num_tokens) if req_meta.awaiting_kvs else self.cost.latency_ms)
            if req_meta.awaiting_kvs:
                heapq.heappush(self._reads, (done_ms, req_id))
                self.num_reads += 1
                self.num_read_tokens += num_tokens
                self.read_ms_total += done_ms - now_ms
            if self.on_read is not None and req_meta.remote is not None:
                self.on_read(req_meta.remote.request_id, done_ms)

    def hold(self, req_id: str) -> None:
        """A finished request's blocks wait for a reader (its output carried ``kv_transfer_params``)."""
        self._held[req_id] = None

    def release(self, req_id: str, at_ms: float) -> None:
        """Its reader is done (or gone) at ``at_ms``; an unknown id is ignored (nothing held), and
        a later moment than one already known changes nothing."""
        if req_id in self._held:
            known = self._held[req_id]
            self._held[req_id] = at_ms if known is None else min(known, at_ms)

    def has_due_events(self) -> bool:
        """Whether something will complete on its own (a read, or a send whose reader is known):
        an engine holding only blocks whose reader has not started has nothing to do."""
        return self.next_due_ms() is not None

    def next_due_ms(self) -> float | None:
        """When the next read or known send completes (``None``: nothing will on its own)."""
        times = [t for t in self._held.values() if t is not None]
        if self._reads:
            times.append(self._reads[0][0])
        return min(times, default=None)

    def connector_output(self, now_ms: float) -> Any:
        """What the worker reports with a step's output applied at ``now_ms``."""
        from vllm.v1.outputs import KVConnectorOutput

        received: set[str] = set()
        while self._reads and self._reads[0][0] <= now_ms:
            received.add(heapq.heappop(self._reads)[1])
        sent = {req_id for req_id, t in self._held.items() if t is not None and t <= now_ms}
        for req_id in sent:
            del self._held[req_id]
        self.num_sends += len(sent)
        if not (received or sent):
            return None
        return KVConnectorOutput(finished_recving=received or None, finished_sending=sent or None)


class OutputScript(Protocol):
    """What the "model" generates for one request, token by output position."""

    def token_at(self, position: int, recent_ttfat_attainment: Mapping[str, float]) -> int:
        """The token at output ``position`` (asked in order; a repeated position gets the same).
        ``recent_ttfat_attainment`` is the observer's per-class value (for load-aware rules)."""
        ...

    @property
    def thinking_stopped_by(self) -> str | None:
        """The thinking-control rule that ended the reasoning, if one did."""
        ...

    def end_thinking(self) -> None:
        """The scheduler ends the reasoning now (``on_overload: degrade``)."""
        ...


@dataclass(frozen=True)
class FixedScript:
    """Exactly these tokens, then EOS."""

    tokens: Sequence[int]

    def token_at(self, position: int, recent_ttfat_attainment: Mapping[str, float]) -> int:
        return self.tokens[position] if position < len(self.tokens) else EOS

    @property
    def thinking_stopped_by(self) -> str | None:
        return None

    def end_thinking(self) -> None:
        pass  # a fixed script has no thinking control


@dataclass(frozen=True)
class OfflineRequest:
    """A request as the frontend hands it to the engine, with what the model will answer."""

    req_id: str
    arrival_ms: float
    prompt_token_ids: list[int]
    #: vLLM's ``max_tokens``; below 1 the request is rejected, as vLLM's frontend does.
    max_tokens: int
    script: OutputScript
    #: The ``meridian_class`` it asks for (``None``: none).
    slo_class: str | None = None
    priority: int = 0
    #: How long its client had already waited for it before it arrived here, ms (a retry after
    #: a shed elsewhere): the judge counts it against the class's targets, whatever the server knows.
    waited_ms: float = 0.0
    #: Whether it tells the server that wait (the ``meridian_waited_ms`` argument, as
    #: ``MeridianFrontend`` makes of a router's ``x-meridian-waited-ms``).
    reports_wait: bool = False
    #: vLLM's ``kv_transfer_params`` as a P/D router sends them (``{"do_remote_decode": True}`` to
    #: a prefill instance; the prefill side's hand-back to a decode instance); ``None``: none.
    kv_transfer_params: Mapping[str, Any] | None = None


def scripted_request(
    req_id: str,
    arrival_ms: float,
    prompt_token_ids: list[int],
    output_token_ids: Sequence[int],
    *,
    slo_class: str | None = None,
    priority: int = 0,
) -> OfflineRequest:
    """A request whose model output is exactly ``output_token_ids`` (ending in EOS), with room
    to spare in ``max_tokens`` so the script, not the cap, ends it."""
    return OfflineRequest(
        req_id,
        arrival_ms,
        list(prompt_token_ids),
        len(output_token_ids) + 8,
        FixedScript(tuple(output_token_ids)),
        slo_class=slo_class,
        priority=priority,
    )


# ---- what a run records ------------------------------------------------------------------------


def vllm_request(offline: OfflineRequest, block_size: int) -> Any:
    """The vLLM ``Request`` the engine's frontend would make of ``offline`` (greedy, its class and
    hand-off parameters in ``extra_args``)."""
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    from meridian.vllm.names import CLASS_ARG, WAITED_ARG

    init_none_hash(sha256)
    extra: dict[str, Any] = {CLASS_ARG: offline.slo_class} if offline.slo_class is not None else {}
    if offline.reports_wait and offline.waited_ms > 0:
        extra[WAITED_ARG] = offline.waited_ms
    if offline.kv_transfer_params is not None:
        # vLLM's connector marks the dict as it goes (``do_remote_prefill`` turns off): a copy.
        extra["kv_transfer_params"] = dict(offline.kv_transfer_params)
    params = SamplingParams(max_tokens=offline.max_tokens, temperature=0.0, extra_args=extra or None)
    params.update_from_generation_config({}, EOS)
    return Request(
        request_id=offline.req_id,
        prompt_token_ids=list(offline.prompt_token_ids),
        sampling_params=params,
        pooling_params=None,
        # vLLM's frontend stamps the arrival when the request reaches the server; the engine core
        # sees it only at its next step boundary, so deadlines run from the trace's arrival, as
        # the replay's metrics do.
        arrival_time=offline.arrival_ms / 1000.0,
        priority=offline.priority,
        block_hasher=get_request_block_hasher(block_size, sha256),
    )


@dataclass
class Timeline:
    """What one request went through."""

    req_id: str
    #: The class the observer resolved (the default class when the request names one it lacks).
    slo_class: str
    arrival_ms: float
    token_times_ms: array[float] = field(default_factory=lambda: array("d"))
    #: Output tokens (kept only when the engine is told to).
    output_token_ids: list[int] = field(default_factory=list)
    #: vLLM's finish reason (``stop``, ``length``, ``abort``, ``error``), ``rejected`` (no room
    #: to generate, as vLLM's frontend rejects it) or ``refused`` (an arrival gate refused it).
    finish_reason: str | None = None
    #: vLLM's stop reason of the final output when it is a message (a shed request's starts with
    #: ``SHED_MARKER``).
    stop_reason: str | None = None
    report: FinishedRequest | None = None
    thinking_stopped_by: str | None = None
    #: The reason an arrival gate gave for refusing the request (e.g. ``valve``); ``None`` when
    #: no gate refused it. A refused request is shed at its arrival: its notice time is 0.
    shed_by: str | None = None
    #: When it finished on the engine's clock (its arrival for a refused or rejected one).
    finished_ms: float | None = None
    #: The ``kv_transfer_params`` its final output carried (a prefill instance's hand-back: what
    #: a P/D router passes on to the decode instance).
    kv_transfer_params: dict[str, Any] | None = None


@dataclass
class EngineRun:
    """Everything one offline run observed (filled in as the run goes)."""

    #: Per request, in arrival order.
    timelines: dict[str, Timeline] = field(default_factory=dict)
    num_steps: int = 0
    clock_ms: float = 0.0
    device_busy_ms: float = 0.0
    num_rejected: int = 0
    #: Requests an arrival gate refused (shed at arrival; not in ``num_rejected``).
    num_refused: int = 0
    #: The most requests added to the scheduler and unfinished at once (a valve's cap at or
    #: above a run's peak would never have refused anything in it).
    peak_in_flight: int = 0
    num_answer_preemption_alarms: int = 0
    scheduled_tokens_per_step: list[int] = field(default_factory=list)
    token_budget_per_step: list[int] = field(default_factory=list)
    #: Free KV blocks before the first request, and after the last finished.
    max_num_free_blocks: int = 0
    final_num_free_blocks: int = 0
    #: With a host KV tier: load jobs, tokens loaded, and resumes of preempted requests that
    #: loaded (part of) their KV back instead of recomputing all of it.
    num_tier_loads: int = 0
    num_tier_loaded_tokens: int = 0
    num_restored_resumes: int = 0
    #: Preemptions after which the tier held the victim's last full block, and how many of those
    #: victims came back by a load.
    num_stored_preemptions: int = 0
    num_stored_restored_resumes: int = 0
    #: A Meridian scheduler's restore-or-recompute counters at the end of the run (its core's
    #: ``kv_tier_counters``); None for other schedulers.
    restore_counters: dict[str, int] | None = None
    #: vLLM's own device prefix-cache statistics (``vllm:prefix_cache_queries`` / ``_hits``:
    #: prompt tokens looked up and found cached, requests resuming from a preemption left out).
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    #: Requests resuming from a preemption (vLLM's ``preempted_*`` prefix-cache statistics): their
    #: tokens at readmission, those found in the device cache, those a KV tier supplied.
    num_resumes: int = 0
    resumed_tokens: int = 0
    resumed_device_hit_tokens: int = 0
    resumed_tier_hit_tokens: int = 0

    @property
    def reports(self) -> list[FinishedRequest]:
        return [t.report for t in self.timelines.values() if t.report is not None]


def one_ms_per_step(_shape: Mapping[str, int]) -> float:
    """The scripted demo's clock: every executed step takes 1 ms, so latencies read in steps."""
    return 1.0


# ---- the engine loop ---------------------------------------------------------------------------

#: Asked as the engine adds a valid request, before any scheduler sees it: ``None`` admits it, a
#: short reason (e.g. ``"valve"``) refuses it. It may read the engine (``scheduler``,
#: ``now_ms``, ``num_in_flight``) but must not change it.
ArrivalGate = Callable[["OfflineEngine", "OfflineRequest"], "str | None"]


class OfflineEngine:
    """Runs a scheduler like ``EngineCore`` does; see the module docs."""

    def __init__(
        self,
        scheduler: Any,
        requests: Sequence[OfflineRequest] = (),
        *,
        observer_config: Config | None = None,
        step_time_ms: Callable[[Mapping[str, int]], float] = one_ms_per_step,
        batch_queue_size: int | None = None,
        keep_output_tokens: bool = True,
        max_steps: int = 10_000_000,
        progress: Callable[[int], None] | None = None,
        host_load_ms_per_token: float = 0.0,
        after_step: Callable[[Mapping[int, Any], int], None] | None = None,
        arrival_gate: ArrivalGate | None = None,
        transfer_cost: TransferCost | None = None,
    ) -> None:
        from meridian.vllm.convert import step_shape

        self.scheduler = scheduler
        self.requests = sorted(requests, key=lambda r: r.arrival_ms)
        self.step_time_ms = step_time_ms
        async_mode = bool(scheduler.scheduler_config.async_scheduling)
        self.batch_queue_size = batch_queue_size or (BATCH_QUEUE_SIZE if async_mode else 1)
        self.keep_output_tokens = keep_output_tokens
        self.max_steps = max_steps
        self.progress = progress or (lambda _n: None)
        #: Called with vLLM's engine outputs (client index → ``EngineCoreOutputs``) and the step's
        #: scheduled tokens once each step's output is applied and its finished requests recorded:
        #: the soak's invariant checks.
        self.after_step = after_step
        #: Asked for each valid arriving request whether to refuse it (module docs).
        self.arrival_gate = arrival_gate
        self._step_shape = step_shape
        self.now_ms = 0.0
        if hasattr(scheduler, "clock_ms"):
            scheduler.clock_ms = lambda: self.now_ms
        # The scripted model stands in for the worker: it ends the thinking the scheduler asks
        # it to (``thinking_endings``), as MeridianThinkingProcessor would.
        attach = getattr(scheduler, "attach_thinking_worker", None)
        if attach is not None:
            attach()
        self.observer_config = observer_config or Config.from_json("{}")
        self._observer_classes = set(self.observer_config.class_names)
        self.observer = _observer(scheduler, self.observer_config)
        self.device_free_ms = 0.0
        self.batch_queue: deque[tuple[Any, dict[str, list[int]], float]] = deque()
        self._live: dict[str, tuple[OfflineRequest, Timeline, int]] = {}
        self.result = EngineRun()
        #: The simulated worker side of the scheduler's connector: the host tier's link, or one
        #: side of a prefill/decode hand-off (``transfer_cost`` prices its reads).
        self.tier_link: HostTierLink | None = None
        self.kv_link: RemoteKvLink | None = None
        kv_transfer = scheduler.vllm_config.kv_transfer_config
        if kv_transfer is not None and kv_transfer.kv_role in KV_ROLES:
            self.kv_link = RemoteKvLink(scheduler, transfer_cost or TransferCost(0.0))
        elif scheduler.connector is not None:
            self.tier_link = HostTierLink(scheduler, host_load_ms_per_token)
        #: Requests finished since the last ``drain_finished``, once ``watch_finished`` asked
        #: for them (a dispatcher's cheap poll; ``None``: nobody asked, nothing kept).
        self._just_finished: list[str] | None = None
        #: Passes of the busy loop so far (one ``step_with_batch_queue`` call each, plus idle
        #: jumps); arrivals are added at the top of a pass, as ``EngineCore`` does between steps.
        self.num_loop_passes = 0
        #: Preempted requests that have not loaded KV back since, and those of them whose blocks
        #: the tier held at the preemption.
        self._preempted: set[str] = set()
        self._preempted_stored: set[str] = set()
        #: Submitted requests not yet added to the scheduler, in arrival order.
        self._pending: deque[OfflineRequest] = deque()
        self._started = False

    def run(self) -> EngineRun:
        """Runs every request given at construction until each admitted one has finished."""
        for request in self.requests:
            self.submit(request)
        return self.finish()

    # ---- incremental use: submit arrivals as they come, advance the clock, finish --------------

    def submit(self, request: OfflineRequest) -> None:
        """Hands the engine a request; it is added to the scheduler at the top of the first loop
        pass whose clock has reached its arrival. Requests must be submitted in arrival order."""
        if self._pending and request.arrival_ms < self._pending[-1].arrival_ms:
            raise ValueError(
                f"request {request.req_id!r} arrives at {request.arrival_ms} ms, before the last "
                f"submitted one ({self._pending[-1].arrival_ms} ms): submit in arrival order"
            )
        self._start()
        self._pending.append(request)

    def advance_to(self, t_ms: float) -> None:
        """Runs loop passes until the clock reaches ``t_ms`` (a step in flight may carry it past),
        then adds the submitted requests that have arrived by then: the state a request arriving
        at ``t_ms`` finds. An engine with nothing to do stays where it is."""
        self._start()
        while self._has_work() and self.now_ms < t_ms:
            self._loop_pass()
        self._add_arrived()

    def finish(self) -> EngineRun:
        """Runs until every submitted request has finished; returns the run's record."""
        self._start()
        while self._has_work():
            self._loop_pass()
        self.result.clock_ms = self.now_ms
        self.result.final_num_free_blocks = self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        core = getattr(self.scheduler, "meridian", None)
        if isinstance(core, Meridian):
            self.result.restore_counters = core.kv_tier_counters()
        return self.result

    @property
    def num_unfinished(self) -> int:
        """Submitted requests that have not finished (a rejected one finishes on arrival)."""
        return len(self._pending) + len(self._live)

    @property
    def num_in_flight(self) -> int:
        """Requests added to the scheduler that have not finished."""
        return len(self._live)

    def _start(self) -> None:
        if not self._started:
            self._started = True
            self.result.max_num_free_blocks = self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def watch_finished(self) -> None:
        """Keeps the ids of requests as they finish, for ``drain_finished``; before any is submitted."""
        if self._pending or self._live or self.result.timelines:
            raise RuntimeError("watch_finished must come before the first request")
        self._just_finished = []

    def drain_finished(self) -> list[str]:
        """The requests that finished (rejected and refused ones included) since the last call."""
        if self._just_finished is None:
            raise RuntimeError("drain_finished needs watch_finished first")
        finished, self._just_finished = self._just_finished, []
        return finished

    def _finished(self, req_id: str) -> None:
        if self._just_finished is not None:
            self._just_finished.append(req_id)
        self.progress(1)

    def _has_work(self) -> bool:
        return bool(self._pending) or self._scheduler_has_work() or bool(self.batch_queue)

    def _scheduler_has_work(self) -> bool:
        scheduler = self.scheduler
        if not scheduler.has_requests():
            return False
        if self.kv_link is None or scheduler.has_unfinished_requests() or scheduler.finished_req_ids:
            return True
        # Only blocks held for readers remain: vLLM's loop would spin, but nothing changes here
        # until a reader is known (the dispatcher releases them), so the engine rests.
        return self.kv_link.has_due_events()

    def _add_arrived(self) -> None:
        pending = self._pending
        while pending and pending[0].arrival_ms <= self.now_ms:
            self._add(pending.popleft())

    def _loop_pass(self) -> None:
        """One pass of the busy loop: add what has arrived, then step (or, idle, jump to the next
        arrival)."""
        self.num_loop_passes += 1
        self._add_arrived()
        if not self._scheduler_has_work() and not self.batch_queue:
            if self._pending:
                self.now_ms = max(self.now_ms, self._pending[0].arrival_ms)
            return
        self._skip_to_transfer()
        self._step()

    def _skip_to_transfer(self) -> None:
        """An engine whose only work is a transfer completing later (blocks held for a reader,
        a read in flight, nothing to compute) jumps to it, or to the next arrival if sooner: no
        step in between would schedule anything."""
        scheduler = self.scheduler
        if self.kv_link is None or scheduler.finished_req_ids:
            return
        if any(queued.total_num_scheduled_tokens for queued, _, _ in self.batch_queue):
            return
        if any(
            not r.is_finished() and r.status != r.status.WAITING_FOR_REMOTE_KVS for r in scheduler.requests.values()
        ):
            return
        due_ms = self.kv_link.next_due_ms()
        if due_ms is None:
            return
        if self._pending:
            due_ms = min(due_ms, self._pending[0].arrival_ms)
        self.now_ms = max(self.now_ms, due_ms)

    def _step(self) -> None:
        """``EngineCore.step_with_batch_queue``: schedule ahead while the device is busy; apply the
        oldest batch once the queue is full or nothing more can be scheduled."""
        if self._scheduler_has_work():
            output = self._schedule()
            if self.kv_link is not None:
                self.kv_link.start_reads(output, self.now_ms)
            executed = output.total_num_scheduled_tokens > 0 or (
                self.tier_link is not None and self.tier_link.has_jobs(output)
            )
            finish_ms = self._execute(output) if executed else self.now_ms
            self.batch_queue.appendleft((output, self._model(output), finish_ms))
            if len(self.batch_queue) < self.batch_queue_size and (executed or self._scheduler_has_work()):
                return
        if self.batch_queue:
            output, sampled, finish_ms = self.batch_queue.pop()
            self.now_ms = max(self.now_ms, finish_ms)
            self._apply(output, sampled)
            device_idle = all(queued.total_num_scheduled_tokens == 0 for queued, _, _ in self.batch_queue)
            if output.total_num_scheduled_tokens == 0 and device_idle and self._scheduler_has_work():
                # Requests wait (e.g. paced answers) with the device idle: the real engine would
                # spin on the wall clock; the virtual one moves on a tick.
                self.now_ms = max(self.now_ms, self.device_free_ms) + IDLE_TICK_MS

    def _schedule(self) -> Any:
        # The observer "plans" the same running set only so that its preemption bookkeeping
        # (which phases were still running when a request lost its KV) applies to any scheduler.
        running = [self._live[r.request_id][2] for r in self.scheduler.running if r.request_id in self._live]
        self.observer.plan_step(self.now_ms, running, [], 0)
        output = self.scheduler.schedule()
        result = self.result
        result.num_steps += 1
        if result.num_steps > self.max_steps:
            raise RuntimeError(f"the offline run did not finish within {self.max_steps} steps")
        result.scheduled_tokens_per_step.append(output.total_num_scheduled_tokens)
        result.token_budget_per_step.append(self.scheduler.max_num_scheduled_tokens)
        for req_id in output.preempted_req_ids or ():
            self._observe_preemption(req_id)
        return output

    def _execute(self, output: Any) -> float:
        """Occupies the virtual device with the step; returns when its output is ready."""
        step_ms = self.step_time_ms(self._step_shape(output, self.scheduler.requests))
        if self.tier_link is not None:
            step_ms = max(step_ms, self.tier_link.load_ms(output))
        start_ms = max(self.now_ms, self.device_free_ms)
        self.device_free_ms = start_ms + step_ms
        self.result.device_busy_ms += step_ms
        return self.device_free_ms

    def _model(self, output: Any) -> dict[str, list[int]]:
        """The token each scheduled request samples: its script at the next output position."""
        attainment = self.observer.recent_ttfat_attainment()
        live = self._live
        for req_id in getattr(self.scheduler, "thinking_endings", ()):
            entry = live.get(req_id)
            if entry is not None:
                entry[0].script.end_thinking()
        return sampled_tokens(
            output, self.scheduler.requests, lambda req_id, pos: live[req_id][0].script.token_at(pos, attainment)
        )

    def _apply(self, output: Any, sampled: dict[str, list[int]]) -> None:
        model_output = runner_output(sampled)
        if self.tier_link is not None:
            model_output.kv_connector_output = self.tier_link.connector_output(output)
            self._count_loads(output)
        if self.kv_link is not None:
            model_output.kv_connector_output = self.kv_link.connector_output(self.now_ms)
        engine_outputs = self.scheduler.update_from_output(output, model_output)
        self._count_prefix_cache(engine_outputs.values())
        handles: list[int] = []
        counts: list[int] = []
        flat: list[int] = []
        finished: list[tuple[str, str, Any]] = []
        for batch in engine_outputs.values():
            for out in batch.outputs:
                entry = self._live.get(out.request_id)
                if entry is None:
                    continue
                if out.new_token_ids and not _is_shed(out):
                    timeline = entry[1]
                    timeline.token_times_ms.extend([self.now_ms] * len(out.new_token_ids))
                    if self.keep_output_tokens:
                        timeline.output_token_ids.extend(out.new_token_ids)
                    handles.append(entry[2])
                    counts.append(len(out.new_token_ids))
                    flat.extend(out.new_token_ids)
                if out.finish_reason is not None:
                    finished.append((out.request_id, str(out.finish_reason), out.stop_reason))
                    if out.kv_transfer_params is not None:
                        entry[1].kv_transfer_params = dict(out.kv_transfer_params)
                        if self.kv_link is not None:
                            self.kv_link.hold(out.request_id)
        if handles:
            self.observer.on_tokens_batch(self.now_ms, handles, counts, flat)
        for req_id, reason, stop_reason in finished:
            self._finish(req_id, reason, stop_reason if isinstance(stop_reason, str) else None)
        if self.after_step is not None:
            self.after_step(engine_outputs, output.total_num_scheduled_tokens)

    def _count_prefix_cache(self, batches: Any) -> None:
        result = self.result
        for batch in batches:
            if batch.scheduler_stats is None:
                continue
            local = batch.scheduler_stats.prefix_cache_stats
            if local is not None:
                result.prefix_cache_queries += local.queries
                result.prefix_cache_hits += local.hits
                result.num_resumes += local.preempted_requests
                result.resumed_tokens += local.preempted_queries
                result.resumed_device_hit_tokens += local.preempted_hits
            tier = batch.scheduler_stats.connector_prefix_cache_stats
            if tier is not None:
                result.resumed_tier_hit_tokens += tier.preempted_hits

    def _count_loads(self, output: Any) -> None:
        assert self.tier_link is not None
        req_ids = self.tier_link.load_req_ids(output)
        result = self.result
        result.num_tier_loads += len(req_ids)
        result.num_tier_loaded_tokens += self.tier_link.load_tokens(output)
        result.num_restored_resumes += sum(1 for req_id in req_ids if req_id in self._preempted)
        result.num_stored_restored_resumes += sum(1 for req_id in req_ids if req_id in self._preempted_stored)
        self._preempted.difference_update(req_ids)
        self._preempted_stored.difference_update(req_ids)

    # ---- requests -------------------------------------------------------------------------

    def _add(self, offline: OfflineRequest) -> None:
        known_class = offline.slo_class if offline.slo_class in self._observer_classes else None
        handle, slo_class = self.observer.add_request(
            offline.req_id,
            offline.arrival_ms,
            list(offline.prompt_token_ids),
            max(offline.max_tokens, 1),
            known_class,
            max(-_PRIORITY_LIMIT, min(_PRIORITY_LIMIT, offline.priority)),
            offline.waited_ms,
        )
        timeline = Timeline(offline.req_id, slo_class, offline.arrival_ms)
        self.result.timelines[offline.req_id] = timeline
        if offline.max_tokens < 1:
            # vLLM's frontend rejects a prompt that leaves no room to generate: so does the engine
            # (the observer forgets it; it never reached a scheduler).
            self.observer.finish(self.now_ms, handle, "abort", [])
            timeline.finish_reason = "rejected"
            timeline.finished_ms = offline.arrival_ms
            self.result.num_rejected += 1
            self._finished(offline.req_id)
            return
        refusal = self.arrival_gate(self, offline) if self.arrival_gate is not None else None
        if refusal is not None:
            # Refused before the engine sees it, as a server's load valve answers at once: the
            # client hears at its arrival (notice time 0), whatever step boundary the replay
            # reached; the observer counts it as a request that met nothing.
            timeline.report = self.observer.finish(offline.arrival_ms, handle, "abort", [])
            timeline.finish_reason = REFUSED
            timeline.finished_ms = offline.arrival_ms
            timeline.shed_by = str(refusal)
            self.result.num_refused += 1
            self._finished(offline.req_id)
            return
        request = vllm_request(offline, self.scheduler.block_size)
        self._live[offline.req_id] = (offline, timeline, handle)
        self.result.peak_in_flight = max(self.result.peak_in_flight, len(self._live))
        self.scheduler.add_request(request)

    def _observe_preemption(self, req_id: str) -> None:
        self._preempted.add(req_id)
        request = self.scheduler.requests.get(req_id)
        if self.tier_link is not None and request is not None and self.tier_link.holds(request):
            self.result.num_stored_preemptions += 1
            self._preempted_stored.add(req_id)
        entry = self._live.get(req_id)
        if entry is not None:
            _phase, alarm = self.observer.on_preempted(self.now_ms, entry[2])
            self.result.num_answer_preemption_alarms += alarm

    def _finish(self, req_id: str, reason: str, stop_reason: str | None = None) -> None:
        self._preempted.discard(req_id)
        self._preempted_stored.discard(req_id)
        offline, timeline, handle = self._live.pop(req_id)
        timeline.thinking_stopped_by = offline.script.thinking_stopped_by
        timeline.finish_reason = reason
        timeline.stop_reason = stop_reason
        timeline.finished_ms = self.now_ms
        timeline.report = self.observer.finish(self.now_ms, handle, reason, [])
        self._finished(req_id)


def _is_shed(output: Any) -> bool:
    """A shed request's final output: its token (an end-of-sequence that vLLM's stream needs to
    deliver the finish) is no output of the model, so it is not counted as one."""
    stop = output.stop_reason
    return output.finish_reason is not None and isinstance(stop, str) and stop.startswith(SHED_MARKER)


def _observer(scheduler: Any, config: Config) -> Meridian:
    """A core that only measures, with the scheduler's limits and reasoning markers."""
    reasoning = scheduler.vllm_config.reasoning_config
    enabled = reasoning is not None and reasoning.enabled
    return Meridian(
        config,
        block_size=scheduler.block_size,
        max_num_batched_tokens=scheduler.scheduler_config.max_num_batched_tokens,
        max_num_seqs=scheduler.scheduler_config.max_num_seqs,
        reasoning_start_ids=list(reasoning.reasoning_start_token_ids or []) if enabled else [],
        reasoning_end_ids=list(reasoning.natural_reasoning_end_token_ids or []) if enabled else [],
        tool_call_ids=[[TOOL_CALL]] if enabled else [],
    )
