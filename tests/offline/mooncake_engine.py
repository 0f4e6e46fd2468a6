"""One engine of the Mooncake store test, run as its own process (vLLM's KV-transfer group is one
per process): greedy outputs of the seeded prompts through vLLM's ``MooncakeStoreConnector``,
written as JSON; engine A then keeps its store segment alive until the test says it is done.

    python mooncake_engine.py MODEL OUT_JSON [--wait-for FILE] [--scheduler-cls CLS]

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out", type=Path)
    parser.add_argument("--wait-for", type=Path, default=None)
    parser.add_argument("--scheduler-cls", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        torch.cuda.Event = CompletedEvent  # type: ignore[misc, assignment]
    from vllm import LLM, SamplingParams

    llm = LLM(model=args.model, dtype="float32", enforce_eager=True, max_model_len=512, block_size=32,
              kv_cache_memory_bytes=64 * 32 * 4096, seed=0, scheduler_cls=args.scheduler_cls,
              kv_transfer_config={"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"})
    rng = random.Random(3)
    prompts = [{"prompt_token_ids": [rng.randrange(8, 60) for _ in range(PROMPT_TOKENS)]} for _ in range(NUM_PROMPTS)]
    results = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True))
    args.out.write_text(json.dumps({"tokens": [list(r.outputs[0].token_ids) for r in results],
                                    "num_cached_tokens": [r.num_cached_tokens for r in results]}))
    while args.wait_for is not None and not args.wait_for.exists():
        time.sleep(0.2)


if __name__ == "__main__":
    main()
