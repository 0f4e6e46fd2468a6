"""The host KV tier on vLLM's CPU build (``meridian.vllm.kvtier``): vLLM's own OffloadingConnector
with Meridian's out-of-tree spec. Under KV pressure preempted requests come back from the host
pool instead of recomputing, and their greedy tokens are those of a run that never ran short;
corrupting the restored bytes changes the output, so the engine really reads what was stored (a
seeded random-weights model: the trained fixtures ignore their KV)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from meridian.offline.tiny import write_random_model

pytestmark = pytest.mark.vllm

BLOCK_TOKENS = 32
#: Per token: 2 (K, V) × 4 layers × 4 KV heads × head size 64 × 4 bytes.
KV_BYTES_PER_TOKEN = 2 * 4 * 4 * 64 * 4
NUM_PROMPTS, PROMPT_TOKENS, MAX_TOKENS = 6, 40, 100


def tier_config(cpu_bytes: int) -> dict[str, Any]:
    return {
        "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"spec_name": "HostCopyOffloadingSpec", "spec_module_path": "meridian.vllm.kvtier",
                                      "cpu_bytes_to_use": cpu_bytes, "offload_prompt_only": False},
    }


@pytest.fixture(scope="module")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_model(tmp_path_factory.mktemp("models") / "random-qwen3", seed=0)


def generate(model: Path, *, kv_cache_blocks: int, kv_transfer_config: dict[str, Any] | None,
             scheduler_cls: str | None = None) -> list[list[int]]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(model), dtype="float32", enforce_eager=True, max_model_len=256, block_size=BLOCK_TOKENS,
              kv_cache_memory_bytes=kv_cache_blocks * BLOCK_TOKENS * KV_BYTES_PER_TOKEN, seed=0, max_num_seqs=8,
              kv_transfer_config=kv_transfer_config, scheduler_cls=scheduler_cls)
    rng = random.Random(3)
    prompts = [{"prompt_token_ids": [rng.randrange(8, 60) for _ in range(PROMPT_TOKENS)]} for _ in range(NUM_PROMPTS)]
    results = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True))
    del llm
    return [list(r.outputs[0].token_ids) for r in results]


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
def test_preempted_requests_restore_from_the_host_tier_token_for_token(random_model: Path, counted: Counts,
                                                                        scheduler_cls: str | None) -> None:
    roomy = generate(random_model, kv_cache_blocks=64, kv_transfer_config=None, scheduler_cls=scheduler_cls)
    assert counted.preemptions == 0
    # Six requests of up to 140 tokens (5 blocks each) in 12 blocks: preemption every few steps.
    tiered = generate(random_model, kv_cache_blocks=12, kv_transfer_config=tier_config(64 * 1024 * 1024),
                      scheduler_cls=scheduler_cls)
    assert counted.preemptions > 0 and counted.stores > 0 and counted.loads > 0, vars(counted)
    assert tiered == roomy


def test_corrupted_restores_change_the_output(random_model: Path, counted: Counts,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The check that the bytes matter: every load zeroes what it restored."""
    from meridian.vllm.kvtier import HostCopyWorker

    roomy = generate(random_model, kv_cache_blocks=64, kv_transfer_config=None)
    copy = HostCopyWorker._copy

    def noisy_copy(self: HostCopyWorker, job_id: int, engine_spec: Any, host_spec: Any, *, to_host: bool) -> bool:
        done = copy(self, job_id, engine_spec, host_spec, to_host=to_host)
        if not to_host:
            for engine in self._engine:
                for block in engine_spec.block_ids.tolist():
                    engine[block].zero_()
        return done

    monkeypatch.setattr(HostCopyWorker, "_copy", noisy_copy)
    corrupted = generate(random_model, kv_cache_blocks=12, kv_transfer_config=tier_config(64 * 1024 * 1024))
    assert counted.loads > 0
    assert corrupted != roomy
