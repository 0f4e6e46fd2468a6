"""The host KV tier on vLLM's CPU build (``meridian.vllm.kvtier``): vLLM's own OffloadingConnector
with Meridian's out-of-tree spec. Under KV pressure preempted requests come back from the host
pool instead of recomputing, and their greedy tokens are those of a run that never ran short;
corrupting the restored bytes changes the output, so the engine really reads what was stored (a
seeded random-weights model: the trained fixtures ignore their KV)."""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from meridian.offline.tiny import THINK_START

pytestmark = pytest.mark.vllm

BLOCK_TOKENS = 32
#: Per token: 2 (K, V) × 4 layers × 4 KV heads × head size 64 × 4 bytes.
KV_BYTES_PER_TOKEN = 2 * 4 * 4 * 64 * 4
NUM_PROMPTS, PROMPT_TOKENS, MAX_TOKENS = 6, 40, 100


def tier_config(cpu_bytes: int, connector: str = "OffloadingConnector") -> dict[str, Any]:
    config: dict[str, Any] = {
        "kv_connector": connector, "kv_role": "kv_both",
        "kv_connector_extra_config": {"spec_name": "HostCopyOffloadingSpec", "spec_module_path": "meridian.vllm.kvtier",
                                      "cpu_bytes_to_use": cpu_bytes, "offload_prompt_only": False},
    }
    if connector != "OffloadingConnector":
        config.update(kv_connector_module_path="meridian.vllm.kvtier", kv_load_failure_policy="recompute")
    return config


#: Meridian's configuration for a restore test: load every hit, as vLLM does (the cost model's
#: own choice is tested with stated costs below).
ALWAYS_RESTORE = {"kv_tier": {"restore": "always"}}


def prompts(reasoning: bool = False) -> list[dict[str, list[int]]]:
    """The seeded prompts (``reasoning``: each ends with ``<think>``, so the request thinks until
    it stops)."""
    rng = random.Random(3)
    tail = [THINK_START] if reasoning else []
    return [{"prompt_token_ids": [rng.randrange(8, 60) for _ in range(PROMPT_TOKENS)] + tail}
            for _ in range(NUM_PROMPTS)]


def generate(model: Path, *, kv_cache_blocks: int, kv_transfer_config: dict[str, Any] | None,
             scheduler_cls: str | None = None, meridian: dict[str, Any] | None = None, reasoning: bool = False,
             inspect: Callable[[Any], None] = lambda scheduler: None, max_num_seqs: int = 8) -> list[list[int]]:
    """Greedy outputs of the seeded prompts (``reasoning``: each ends with ``<think>``, so the
    request thinks until it stops); ``inspect`` sees the engine's scheduler before it closes.
    Meridian's classes queue: these tests compare tokens with an unpressured run, and under
    ``shed`` a request that waits for KV past its TTFT target on a busy machine is ended early —
    triage (``tests/replay/test_triage.py``), not what they check."""
    from vllm import LLM, SamplingParams

    meridian = {"overload": {"on_overload": "queue"}, **(meridian or {})}

    llm = LLM(model=str(model), dtype="float32", enforce_eager=True, max_model_len=256, block_size=BLOCK_TOKENS,
              kv_cache_memory_bytes=kv_cache_blocks * BLOCK_TOKENS * KV_BYTES_PER_TOKEN, seed=0, max_num_seqs=max_num_seqs,
              kv_transfer_config=kv_transfer_config, scheduler_cls=scheduler_cls,
              additional_config={"meridian": meridian},
              reasoning_parser="deepseek_r1" if reasoning else None)
    results = llm.generate(prompts(reasoning), SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True))
    inspect(llm.llm_engine.engine_core.engine_core.scheduler)
    del llm
    return [list(r.outputs[0].token_ids) for r in results]


#: Greedy tokens of the unpressured run, for plain or reasoning prompts.
Reference = Callable[[bool], list[list[int]]]


@pytest.fixture(scope="module")
def unpressured(random_model: Path) -> Reference:
    """The unpressured run each test compares with, made once per module (an engine start is most
    of a test's time): greedy tokens of an engine with room for every request — stock vLLM's
    scheduler, or for reasoning prompts Meridian's with vLLM's reasoning parser — checked to have
    preempted nothing."""
    from vllm.v1.core.sched.scheduler import Scheduler

    made: dict[bool, list[list[int]]] = {}

    def tokens(reasoning: bool) -> list[list[int]]:
        if reasoning not in made:
            preemptions: list[object] = []
            preempt = Scheduler._preempt_request

            def counting_preempt(self: Any, *args: Any, **kwargs: Any) -> Any:
                preemptions.append(args)
                return preempt(self, *args, **kwargs)

            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
                patch.setattr(Scheduler, "_preempt_request", counting_preempt)
                made[reasoning] = generate(random_model, kv_cache_blocks=64, kv_transfer_config=None,
                                           reasoning=reasoning,
                                           scheduler_cls="meridian.vllm.MeridianScheduler" if reasoning else None)
            assert not preemptions, "the unpressured run preempted"
        return made[reasoning]

    return tokens


class Counts:
    def __init__(self) -> None:
        self.preemptions = self.loads = self.stores = 0


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counts:
    """The engine runs in this process: count vLLM's preemptions and the tier's copies."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm.v1.core.sched.scheduler import Scheduler

    from meridian.vllm.kvtier import HostCopyWorker

    counts = Counts()
    preempt, load, store = Scheduler._preempt_request, HostCopyWorker.submit_load, HostCopyWorker.submit_store

    def counting_preempt(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts.preemptions += 1
        return preempt(self, *args, **kwargs)

    def counting_load(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts.loads += 1
        return load(self, *args, **kwargs)

    def counting_store(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts.stores += 1
        return store(self, *args, **kwargs)

    monkeypatch.setattr(Scheduler, "_preempt_request", counting_preempt)
    monkeypatch.setattr(HostCopyWorker, "submit_load", counting_load)
    monkeypatch.setattr(HostCopyWorker, "submit_store", counting_store)
    return counts


@pytest.mark.parametrize("scheduler_cls", [None, "meridian.vllm.MeridianScheduler"], ids=["vllm", "meridian"])
@pytest.mark.runs_model
def test_preempted_requests_restore_from_the_host_tier_token_for_token(random_model: Path, counted: Counts,
                                                                        unpressured: Reference,
                                                                        scheduler_cls: str | None) -> None:
    # Six requests of up to 140 tokens (5 blocks each) in 12 blocks: preemption every few steps.
    seen: dict[str, Any] = {}

    def inspect(scheduler: Any) -> None:
        if scheduler_cls is not None:  # the connector's load timings reached the core's fit
            seen.update(load_ms_per_token=scheduler.meridian.kv_load_ms_per_token(0), **scheduler.meridian.kv_tier_counters())

    tiered = generate(random_model, kv_cache_blocks=12, kv_transfer_config=tier_config(64 * 1024 * 1024),
                      scheduler_cls=scheduler_cls, meridian=ALWAYS_RESTORE, inspect=inspect)
    assert counted.preemptions > 0 and counted.stores > 0 and counted.loads > 0, vars(counted)
    assert tiered == unpressured(False)
    if scheduler_cls is not None:
        assert seen["num_restores"] == counted.loads and seen["load_ms_per_token"] != 0.005, seen


#: Stated costs, nothing refitted: a step costs 20 ms and a recomputed token 1 ms, so a tier hit
#: (at least one 32-token block) restores when loading costs 0.001 ms/token and is recomputed
#: when it costs 10.
def stated_costs(load_ms_per_token: float) -> dict[str, Any]:
    return {"step_time": {"base_ms": 20, "per_prefill_token_ms": 1.0, "per_decode_request_ms": 0,
                          "per_context_token_ms": 0, "online_fit": False},
            "kv_tier": {"load_ms_per_token": load_ms_per_token, "online_fit": False}}


@pytest.mark.parametrize(("load_ms_per_token", "restores"), [(0.001, True), (10.0, False)],
                         ids=["restore-wins", "recompute-wins"])
@pytest.mark.runs_model
def test_restore_or_recompute_follows_the_stated_costs(random_model: Path, counted: Counts, unpressured: Reference,
                                                       load_ms_per_token: float, restores: bool) -> None:
    """The cost model decides on the real engine: the same preemptions either load their stored
    blocks or recompute them, the tokens are those of the unpressured run either way, and the
    core counts what happened."""
    seen: dict[str, Any] = {}

    def inspect(scheduler: Any) -> None:
        seen.update(scheduler.meridian.kv_tier_counters())

    roomy = unpressured(False)
    tiered = generate(random_model, kv_cache_blocks=12, kv_transfer_config=tier_config(64 * 1024 * 1024),
                      scheduler_cls="meridian.vllm.MeridianScheduler", meridian=stated_costs(load_ms_per_token),
                      inspect=inspect)
    assert tiered == roomy
    assert counted.preemptions > 0 and counted.stores > 0, vars(counted)
    if restores:
        assert counted.loads > 0 and seen["num_restores"] > 0 and seen["num_recomputes"] == 0, (vars(counted), seen)
        assert seen["num_restored_tokens"] >= BLOCK_TOKENS * seen["num_restores"] - seen["num_restores"]
    else:
        assert counted.loads == 0 and seen["num_restores"] == 0 and seen["num_recomputes"] > 0, (vars(counted), seen)
        assert seen["num_recomputed_tokens"] >= BLOCK_TOKENS * seen["num_recomputes"]


@pytest.mark.runs_model
def test_corrupted_restores_change_the_output(random_model: Path, counted: Counts, unpressured: Reference,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The check that the bytes matter: every load zeroes what it restored."""
    from meridian.vllm.kvtier import HostCopyWorker

    roomy = unpressured(False)
    copy = HostCopyWorker._copy

    def noisy_copy(self: HostCopyWorker, job_id: int, block_ids: list[int], group_sizes: Any, host_spec: Any, *,
                   to_host: bool) -> bool:
        done = copy(self, job_id, block_ids, group_sizes, host_spec, to_host=to_host)
        if not to_host:
            for engine in self._engine:
                for block in block_ids:
                    engine[block].zero_()
        return done

    monkeypatch.setattr(HostCopyWorker, "_copy", noisy_copy)
    corrupted = generate(random_model, kv_cache_blocks=12, kv_transfer_config=tier_config(64 * 1024 * 1024))
    assert counted.loads > 0
    assert corrupted != roomy


def failing_loads(monkeypatch: pytest.MonkeyPatch, num_failing: int | None) -> None:
    """The first ``num_failing`` load jobs (all when None) read chunks marked as holding nothing
    usable — what a failed store leaves — so their blocks never arrive."""
    from meridian.vllm.kvtier import HostCopyWorker

    copy_rows, failed = HostCopyWorker._copy_rows, []

    def sabotaged(self: HostCopyWorker, tensor: int, pairs: list[tuple[int, int]], *, to_host: bool) -> None:
        if not to_host and (num_failing is None or len(failed) < num_failing):
            failed.append(pairs)
            self._bad_chunks.update(chunk for _block, chunk in pairs)
        copy_rows(self, tensor, pairs, to_host=to_host)
        if not to_host and num_failing is not None:
            self._bad_chunks.clear()  # a transient failure: the next load of these chunks works

    monkeypatch.setattr(HostCopyWorker, "_copy_rows", sabotaged)


@pytest.mark.parametrize(("scheduler_cls", "num_failing"),
                         [(None, 2), ("meridian.vllm.MeridianScheduler", 2), ("meridian.vllm.MeridianScheduler", None)],
                         ids=["vllm-transient", "meridian-transient", "meridian-every-load"])
@pytest.mark.runs_model
def test_failed_loads_are_recomputed_and_nothing_is_lost(random_model: Path, counted: Counts, unpressured: Reference,
                                                         monkeypatch: pytest.MonkeyPatch, scheduler_cls: str | None,
                                                         num_failing: int | None) -> None:
    """MeridianOffloadingConnector reports the blocks of a failed load and vLLM's
    ``kv_load_failure_policy: recompute`` recomputes them: the tokens are the unpressured run's.
    When every load fails, Meridian recomputes a request after its first failure (stock vLLM
    would look the same bad copy up again, and again)."""
    seen: dict[str, Any] = {}

    def inspect(scheduler: Any) -> None:
        if scheduler_cls is not None:
            seen.update(scheduler.meridian.kv_tier_counters())

    roomy = unpressured(False)
    failing_loads(monkeypatch, num_failing)
    tiered = generate(random_model, kv_cache_blocks=12,
                      kv_transfer_config=tier_config(64 * 1024 * 1024, "MeridianOffloadingConnector"),
                      scheduler_cls=scheduler_cls, meridian=ALWAYS_RESTORE, inspect=inspect)
    assert counted.loads > 0, vars(counted)
    assert tiered == roomy
    if scheduler_cls is not None:
        assert seen["num_failed_load_blocks"] > 0, seen


@pytest.mark.runs_model
def test_the_disk_tier_serves_a_fresh_engine_after_a_restart(random_model: Path, counted: Counts,
                                                            unpressured: Reference, tmp_path: Path) -> None:
    """vLLM's tiering spec with its file-system secondary tier, on the host-copy worker: a first
    engine stores its prompts' blocks through the host tier to disk and exits; a second engine
    (a new host tier, empty) loads them back from disk on its first requests, and its tokens are
    those of an engine that computed everything."""

    config = tier_config(64 * 1024 * 1024)
    config["kv_connector_extra_config"].update(
        spec_name="HostCopyTieringSpec",
        secondary_tiers=[{"type": "fs", "root_dir": str(tmp_path / "kv"), "n_read_threads": 1, "n_write_threads": 1}])
    def shared_regions() -> set[str]:
        return {name for name in os.listdir("/dev/shm") if name.startswith("vllm_offload_")}

    roomy = unpressured(False)
    # Other processes on the machine may hold regions of their own: only this engine's count.
    regions_before = shared_regions()
    first = generate(random_model, kv_cache_blocks=64, kv_transfer_config=config)
    assert counted.stores > 0 and counted.loads == 0 and first == roomy
    stored = [p for p in (tmp_path / "kv").rglob("*.bin")]
    assert stored, "the fs tier wrote nothing"
    assert not shared_regions() - regions_before, "shared region leaked"
    second = generate(random_model, kv_cache_blocks=64, kv_transfer_config=config)
    assert counted.loads > 0, vars(counted)
    assert second == roomy


def disk_tier_config(root: Path) -> dict[str, Any]:
    config = tier_config(64 * 1024 * 1024)
    config["kv_connector_extra_config"].update(
        spec_name="HostCopyTieringSpec",
        secondary_tiers=[{"type": "fs", "root_dir": str(root), "n_read_threads": 1, "n_write_threads": 1}])
    return config


class DiskJobs:
    """What vLLM's file-system tier did: load jobs submitted, and jobs that finished failed."""

    def __init__(self) -> None:
        self.loads = self.failed_loads = self.failed_stores = 0


@pytest.fixture
def disk_jobs(monkeypatch: pytest.MonkeyPatch) -> DiskJobs:
    from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

    jobs = DiskJobs()
    submit_load, finished = FileSystemTierManager.submit_load, FileSystemTierManager.get_finished_jobs

    def counting_load(self: Any, job: Any) -> None:
        jobs.loads += 1
        submit_load(self, job)

    def counting_finished(self: Any) -> Any:
        loading = set(self._load_job_keys)
        results = list(finished(self))
        for result in results:
            if not result.success:
                if result.job_id in loading:
                    jobs.failed_loads += 1
                else:
                    jobs.failed_stores += 1
        return results

    monkeypatch.setattr(FileSystemTierManager, "submit_load", counting_load)
    monkeypatch.setattr(FileSystemTierManager, "get_finished_jobs", counting_finished)
    return jobs


@contextlib.contextmanager
def read_only(root: Path) -> Iterator[None]:
    """Every folder and file under ``root`` unwritable, for root too (the immutable attribute)."""
    paths = [root, *root.rglob("*")]
    if os.geteuid() == 0:
        made = subprocess.run(["chattr", "-R", "+i", str(root)], capture_output=True, check=False).returncode == 0
    else:
        for path in paths:
            path.chmod(0o555 if path.is_dir() else 0o444)
        made = True
    try:
        probe = root / "probe"
        try:
            probe.touch()
        except OSError:
            pass
        else:
            pytest.skip(f"cannot make {root} read-only here")
        assert made
        yield
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-R", "-i", str(root)], check=False)
        else:
            for path in paths:
                path.chmod(0o755 if path.is_dir() else 0o644)


@contextlib.contextmanager
def tiny_filesystem(root: Path, size_kib: int) -> Iterator[None]:
    """A ``size_kib`` tmpfs mounted on ``root`` (skips where mounting is not allowed)."""
    root.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(root)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


@pytest.mark.parametrize("fault", ["read-only", "full", "truncated"])
@pytest.mark.runs_model
def test_disk_tier_faults_cost_hits_never_requests(random_model: Path, counted: Counts, disk_jobs: DiskJobs,
                                                   unpressured: Reference, tmp_path: Path, fault: str) -> None:
    """The disk tier of ``test_the_disk_tier_serves_a_fresh_engine_after_a_restart`` with a fault
    between the engine that stores and the fresh one that loads, both under Meridian's scheduler:

    - read-only: the folder made unwritable (the engine already running when a disk is remounted
      read-only): the second engine, on prompts that share their first block with the first's,
      loads what is there and its stores of the rest fail;
    - full: a 512 KiB file system, room for two of the blocks: most stores fail with ENOSPC, and
      the second engine loads what fitted;
    - truncated: every block file cut to half its size: each load fails, vLLM marks the blocks a
      miss and they are recomputed.

    Every request of both engines ends with the tokens of an engine that computed everything."""
    root = tmp_path / "kv"
    config = disk_tier_config(root)
    meridian = {"scheduler_cls": "meridian.vllm.MeridianScheduler", "meridian": ALWAYS_RESTORE}
    roomy = unpressured(False)
    full = tiny_filesystem(root, 512) if fault == "full" else contextlib.nullcontext()
    with full:
        assert generate(random_model, kv_cache_blocks=64, kv_transfer_config=config, **meridian) == roomy
        stored = sorted(root.rglob("*.bin"))
        assert stored, "the disk tier stored nothing"
        if fault == "full":
            assert disk_jobs.failed_stores > 0, "every store fitted: the file system was not full"
        if fault == "truncated":
            for path in stored:
                os.truncate(path, path.stat().st_size // 2)
        faulty = read_only(root) if fault == "read-only" else contextlib.nullcontext()
        # Read-only, the second engine's prompts end with <think>: their first block is on disk,
        # what they generate is not, so the engine has blocks of its own to store.
        reasoning = fault == "read-only"
        with faulty:
            failed_stores = disk_jobs.failed_stores
            assert generate(random_model, kv_cache_blocks=64, kv_transfer_config=config, reasoning=reasoning,
                            **meridian) == unpressured(reasoning)
    assert disk_jobs.loads > 0, "the second engine found nothing on disk"
    if fault == "truncated":
        assert disk_jobs.failed_loads == disk_jobs.loads, vars(disk_jobs)
    else:
        assert disk_jobs.failed_loads == 0 and counted.loads > 0, (vars(disk_jobs), vars(counted))
    if fault == "read-only":
        assert disk_jobs.failed_stores > failed_stores, "the second engine's stores did not fail"


@pytest.mark.parametrize("prefetch_requests", [0, 4], ids=["no-prefetch", "prefetch"])
@pytest.mark.runs_model
def test_prefetch_moves_disk_prefixes_up_before_their_turn(random_model: Path, counted: Counts, unpressured: Reference,
                                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           prefetch_requests: int) -> None:
    """A fresh engine whose prompts' prefixes are on disk (a first engine put them there), one
    seat, the first request running when the others arrive: vLLM's tiering manager moves a block
    from disk to the host tier when a lookup finds it there and asks the scheduler to come back
    later, and vLLM looks a waiting request up only at its turn, so without prefetch every request
    waits a step or more at its turn; with it the plans look the next requests up while they
    queue, their blocks are in host memory when their turn comes, and they load at once. The
    tokens are those of an engine that computed everything."""
    from vllm import LLM, SamplingParams
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector

    roomy = unpressured(False)
    config = disk_tier_config(tmp_path / "kv")
    assert generate(random_model, kv_cache_blocks=64, kv_transfer_config=config) == roomy
    deferred: list[str] = []
    lookup = OffloadingConnector.get_num_new_matched_tokens

    def counting_lookup(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        num_tokens, load_async = lookup(self, request, *args, **kwargs)
        if num_tokens is None:  # "ask again later": a move from disk is under way
            deferred.append(request.request_id.split("-")[0])  # vLLM suffixes the client's id
        return num_tokens, load_async

    monkeypatch.setattr(OffloadingConnector, "get_num_new_matched_tokens", counting_lookup)
    llm = LLM(model=str(random_model), dtype="float32", enforce_eager=True, max_model_len=256, block_size=BLOCK_TOKENS,
              kv_cache_memory_bytes=64 * BLOCK_TOKENS * KV_BYTES_PER_TOKEN, seed=0, max_num_seqs=1,
              kv_transfer_config=config, scheduler_cls="meridian.vllm.MeridianScheduler",
              additional_config={"meridian": {"kv_tier": {"restore": "always", "prefetch_requests": prefetch_requests},
                                              "overload": {"on_overload": "queue"}}})
    engine = llm.llm_engine
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts()):
        engine.add_request(f"r{i}", prompt, params)
        while i == 0 and not engine.engine_core.engine_core.scheduler.running:
            engine.step()  # the first request holds the seat before the others arrive
    outputs: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id.split("-")[0]] = list(out.outputs[0].token_ids)
    hooks = engine.engine_core.engine_core.scheduler.kv_tier
    assert [outputs[f"r{i}"] for i in range(NUM_PROMPTS)] == roomy and counted.loads > 0
    assert hooks.staged
    if prefetch_requests == 0:
        assert hooks.num_prefetch_lookups == 0
        assert sorted(set(deferred)) == [f"r{i}" for i in range(NUM_PROMPTS)], deferred
    else:
        assert hooks.num_prefetched_blocks >= NUM_PROMPTS - 1
        assert set(deferred) == {"r0"}, deferred


@pytest.mark.runs_model
def test_finished_reasoning_goes_to_the_front_of_the_tiers_eviction_order(random_model: Path, counted: Counts,
                                                                          unpressured: Reference) -> None:
    """Thinking requests stored block by block (so a preempted one restores); when each finishes,
    the core's never-reusable token marks it and the tier's policy demotes those blocks."""
    seen: dict[str, Any] = {}

    def inspect(scheduler: Any) -> None:
        manager = scheduler.connector.connector_scheduler.manager
        seen.update(hooks=scheduler.kv_tier, policy=type(manager._policy).__name__,
                    ranks=dict(manager._policy._ranks))

    roomy = unpressured(True)
    tiered = generate(random_model, kv_cache_blocks=12, kv_transfer_config=tier_config(64 * 1024 * 1024),
                      reasoning=True, scheduler_cls="meridian.vllm.MeridianScheduler", meridian=ALWAYS_RESTORE,
                      inspect=inspect)
    assert tiered == roomy and counted.loads > 0
    assert seen["policy"] == "NeverReusableFirstLRU"
    assert seen["hooks"].num_requests_marked == NUM_PROMPTS
    # Every stored block but the prompt's first one (the only one that ends before <think>) sits
    # below every rank an ordinary store or access gets.
    demoted = [r for r in seen["ranks"].values() if r < 0]
    assert len(demoted) >= NUM_PROMPTS * 2, seen["ranks"]


def insert_chunk(policy: Any, key: Any, chunk: Any, context: Any) -> None:
    """A stored chunk into a cache policy: vLLM 0.33's ``insert`` takes the storing request's
    context (and ranks a request's blocks by their positions in it, none here), 0.32's does not."""
    import inspect

    from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

    if "req_context" in inspect.signature(LRUCachePolicy.insert).parameters:
        policy.insert(key, chunk, context)
    else:
        policy.insert(key, chunk)


def test_the_policy_evicts_never_reusable_blocks_first() -> None:
    """On vLLM's own policy classes: three requests' blocks stored in order; the middle one
    finishes with its blocks from token 64 on never reusable; eviction takes those first."""
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus
    from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

    from meridian.vllm.kvtier import NeverReusable, NeverReusableFirstLRU

    def fill(policy: LRUCachePolicy) -> tuple[list[Any], ReqContext]:
        keys = [make_offload_key(bytes([i]) * 8, 0) for i in range(12)]
        for i, key in enumerate(keys):
            chunk = ChunkStatus(chunk_id=i)
            chunk.ref_cnt = 0  # stored and ready
            insert_chunk(policy, key, chunk, ReqContext(req_id=f"stored-{i}"))
        middle = ReqContext(req_id="b")
        for j, key in enumerate(keys[4:8]):
            middle.set_offload_key_position(key, (j + 1) * BLOCK_TOKENS)
        middle.set_state(NeverReusable(from_token=2 * BLOCK_TOKENS))
        policy.on_request_finished([keys[4:8]], set(keys[4:8]), set(), middle)
        return keys, middle

    ours = NeverReusableFirstLRU(cache_capacity=12)
    keys, _ = fill(ours)
    evicted = [k for k, _ in ours.evict(3, protected=set()) or []]
    assert evicted == [keys[7], keys[6], keys[0]], "b's reasoning blocks (tail first), then plain LRU"
    stock = LRUCachePolicy(cache_capacity=12)
    keys, _ = fill(stock)
    assert [k for k, _ in stock.evict(3, protected=set()) or []] == keys[:3]


def test_a_live_request_s_blocks_stay_until_it_finishes() -> None:
    """On vLLM's own policy classes: LRU would evict a running request's oldest blocks — its
    first ones, without which the connector restores nothing of it — before another's newer
    ones; the blocks a request Meridian keeps (``KeepWhileLive``) stored stay until it finishes,
    and then are ordinary LRU blocks again. A request without the state is vLLM's plain LRU."""
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

    from meridian.vllm.kvtier import KeepWhileLive, NeverReusableFirstLRU

    def store(policy: NeverReusableFirstLRU, context: ReqContext, keys: list[Any], first_chunk: int) -> None:
        policy.on_store_miss(keys, context)
        for i, key in enumerate(keys):
            chunk = ChunkStatus(chunk_id=first_chunk + i)
            chunk.ref_cnt = 0
            insert_chunk(policy, key, chunk, context)

    keys = [make_offload_key(bytes([i]) * 8, 0) for i in range(6)]
    for kept in (True, False):
        policy = NeverReusableFirstLRU(cache_capacity=6)
        running, other = ReqContext(req_id="running"), ReqContext(req_id="other")
        if kept:
            running.set_state(KeepWhileLive())
        store(policy, running, keys[:3], 0)  # the running request's first blocks: the oldest
        store(policy, other, keys[3:], 3)
        evicted = [k for k, _ in policy.evict(2, protected=set()) or []]
        assert evicted == (keys[3:5] if kept else keys[:2])
        if kept:
            assert policy.evict(2, protected=set()) is None, "only kept blocks are left but one"
            policy.on_request_finished([keys[:3]], set(keys[:3]), set(), running)
            assert [k for k, _ in policy.evict(2, protected=set()) or []] == [keys[5], keys[2]]


@pytest.mark.runs_model
def test_a_slow_host_link_turns_restores_into_recomputes(random_model: Path, counted: Counts, unpressured: Reference,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A host tier whose loads take 50 ms per KV tensor (a congested link): Meridian's online fit of the
    tier's load cost sees it, and under ``restore: auto`` the preempted requests recompute instead
    of waiting on the link; the tokens are the unpressured run's."""
    import time

    from meridian.vllm.kvtier import HostCopyWorker

    copy_rows = HostCopyWorker._copy_rows

    def slow_rows(self: HostCopyWorker, tensor: int, pairs: list[tuple[int, int]], *, to_host: bool) -> None:
        if not to_host:
            time.sleep(0.05)  # per KV tensor of a load job: the link, not the copy, is slow
        copy_rows(self, tensor, pairs, to_host=to_host)

    monkeypatch.setattr(HostCopyWorker, "_copy_rows", slow_rows)
    seen: dict[str, Any] = {}

    def inspect(scheduler: Any) -> None:
        seen.update(load_ms_per_token=scheduler.meridian.kv_load_ms_per_token(0), **scheduler.meridian.kv_tier_counters())

    roomy = unpressured(False)
    tiered = generate(random_model, kv_cache_blocks=12, kv_transfer_config=tier_config(64 * 1024 * 1024),
                      scheduler_cls="meridian.vllm.MeridianScheduler", inspect=inspect)
    assert tiered == roomy
    assert counted.preemptions > 0, vars(counted)
    # The first loads measure the link (restores decided before a measurement stay restores);
    # after them, restoring costs more than recomputing. Unslowed, the same run under `auto`
    # restores every preemption (4 restores, 0 recomputes, 2026-12-05).
    assert seen["load_ms_per_token"] > 1.0, seen
    assert seen["num_recomputes"] > 0, seen
