"""One engine of the Mooncake store tests, run as its own process (vLLM's KV-transfer group is one
per process): greedy outputs of the seeded prompts through vLLM's ``MooncakeStoreConnector``,
written as JSON; engine A then keeps its store segment alive until the test says it is done.

    python mooncake_engine.py MODEL OUT_JSON [--start-after FILE] [--wait-for FILE] [--scheduler-cls CLS]
        [--host-tier] [--reasoning] [--max-tokens N] [--kv-cache-blocks N] [--meridian JSON]
        [--again-after FILE]

``--start-after`` builds the engine at once (then touches OUT_JSON's ``.ready``) and holds its
prompts until the file exists, so a second engine starts up while the first one computes (an
engine's start-up is most of its time). ``--again-after`` runs the prompts a second time once its
file exists, into OUT_JSON's ``.again.json``.

``--host-tier`` puts Meridian's host tier in front of the store, both parts of vLLM's
``MultiConnector``; ``--reasoning`` ends each prompt with ``<think>`` under vLLM's ``deepseek_r1``
reasoning parser. With ``MeridianScheduler`` the JSON also says whether the tier hooks were
installed, the core's tier counters and the preemptions of the finished requests.

The one stand-in: vLLM 0.32's Mooncake store worker records a ``torch.cuda.Event`` after the
forward to order its stores behind it, and PyPI's torch raises "Found no NVIDIA driver" on
``record()`` without a GPU, which stops the engine. On the CPU build the forward has finished when
``wait_for_save`` runs, so an event that is always complete is what a CUDA event would be there.
The store, its master and the TCP transfers are Mooncake's own."""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

NUM_PROMPTS, PROMPT_TOKENS, MAX_TOKENS = 3, 200, 8
BLOCK_TOKENS, KV_CACHE_BLOCKS = 32, 32
#: Per token: 2 (K, V) × 4 layers × 4 KV heads × head size 64 × 4 bytes.
KV_BYTES_PER_TOKEN = 2 * 4 * 4 * 64 * 4
#: The store, as engine A runs it alone.
MOONCAKE_STORE: dict[str, Any] = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}
#: Meridian's host tier (what ``meridian.vllm.kvtier`` documents), with room for every block here.
HOST_TIER: dict[str, Any] = {
    "kv_connector": "MeridianOffloadingConnector", "kv_connector_module_path": "meridian.vllm.kvtier",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {"spec_name": "HostCopyOffloadingSpec", "spec_module_path": "meridian.vllm.kvtier",
                                  "cpu_bytes_to_use": 64 * 1024 * 1024, "offload_prompt_only": False}}


def kv_transfer_config(host_tier: bool) -> dict[str, Any]:
    if not host_tier:
        return MOONCAKE_STORE
    # MultiConnector loads from the first part that reports a hit and saves to all of them: the
    # host tier first, so a preempted request gets its prompt *and* what it generated back from
    # local memory; the store (prompts only, over the network) answers what the host tier lacks.
    return {"kv_connector": "MultiConnector", "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"connectors": [HOST_TIER, MOONCAKE_STORE]}}


class CompletedEvent:
    """``torch.cuda.Event`` on a device whose work is done when the host gets control back."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def wait(self, stream: Any = None) -> None:
        pass


def scheduler_report(scheduler: Any) -> dict[str, Any]:
    """What MeridianScheduler saw: its tier hooks, the core's tier counters, the preemptions."""
    if not hasattr(scheduler, "meridian"):
        return {}
    reports = list(scheduler.finished_reports)
    return {"kv_tier_installed": scheduler.kv_tier is not None,
            "kv_tier_counters": scheduler.meridian.kv_tier_counters(),
            "num_preemptions": sum(r.num_preemptions_prefill + r.num_preemptions_think + r.num_preemptions_answer
                                   for r in reports)}


def write_results(llm: Any, results: Any, path: Path) -> None:
    report = scheduler_report(llm.llm_engine.engine_core.engine_core.scheduler)
    path.write_text(json.dumps({"tokens": [list(r.outputs[0].token_ids) for r in results],
                                "num_cached_tokens": [r.num_cached_tokens for r in results], **report}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out", type=Path)
    parser.add_argument("--start-after", type=Path, default=None)
    parser.add_argument("--wait-for", type=Path, default=None)
    parser.add_argument("--scheduler-cls", default=None)
    parser.add_argument("--host-tier", action="store_true")
    parser.add_argument("--reasoning", action="store_true")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--kv-cache-blocks", type=int, default=KV_CACHE_BLOCKS)
    parser.add_argument("--meridian", type=json.loads, default={})
    parser.add_argument("--again-after", type=Path, default=None,
                        help="then run the prompts again once this file exists, into OUT_JSON's .again.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        torch.cuda.Event = CompletedEvent  # type: ignore[misc, assignment]
    from vllm import LLM, SamplingParams

    from meridian.offline.tiny import THINK_START

    llm = LLM(model=args.model, dtype="float32", enforce_eager=True, max_model_len=512, block_size=BLOCK_TOKENS,
              kv_cache_memory_bytes=args.kv_cache_blocks * BLOCK_TOKENS * KV_BYTES_PER_TOKEN, seed=0,
              scheduler_cls=args.scheduler_cls, kv_transfer_config=kv_transfer_config(args.host_tier),
              # Classes queue: the tokens are compared with another engine's, and under `shed` a
              # request waiting past its TTFT target on a busy machine would be ended early.
              additional_config={"meridian": {"overload": {"on_overload": "queue"}, **args.meridian}},
              reasoning_parser="deepseek_r1" if args.reasoning else None)
    args.out.with_suffix(".ready").touch()
    rng = random.Random(3)
    tail = [THINK_START] if args.reasoning else []
    prompts = [{"prompt_token_ids": [rng.randrange(8, 60) for _ in range(PROMPT_TOKENS)] + tail}
               for _ in range(NUM_PROMPTS)]
    while args.start_after is not None and not args.start_after.exists():
        time.sleep(0.2)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    write_results(llm, llm.generate(prompts, params), args.out)
    if args.again_after is not None:
        while not args.again_after.exists():
            time.sleep(0.2)
        write_results(llm, llm.generate(prompts, params), args.out.with_suffix(".again.json"))
    while args.wait_for is not None and not args.wait_for.exists():
        time.sleep(0.2)


if __name__ == "__main__":
    main()
