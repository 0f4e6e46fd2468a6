"""The live tests' one description of the tiny reasoning model's server: its folder and the vLLM
flags every live test starts it with (a CPU build, float32, eager, 256-token contexts in 32-token
blocks, the DeepSeek-R1 reasoning parser). Each test adds only what it is about: the KV cache size,
the scheduler, the connector. Test code only; pytest puts this folder on ``sys.path``."""

from __future__ import annotations

from pathlib import Path

from meridian.vllm.names import SCHEDULER_CLS

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-reasoner"
MODEL = str(FIXTURE)
#: 2 layers x (K, V) x 2 heads x 32 dims x 4 bytes = 1 KiB of KV per token.
KV_BYTES_PER_TOKEN = 1024
#: A 320-token cache (10 blocks of 32) holds two or three requests (up to ~140 tokens each) at
#: full length, so a burst of 12 must wait or be preempted.
PRESSURED_KV_TOKENS = 320
#: ``meridian`` keys for the tests that count every request they send: late requests queue
#: instead of being shed (Meridian's default; tests/live/test_middleware.py is about shedding).
QUEUE_LATE = {"overload": {"on_overload": "queue"}}


def server_args(*, kv_cache_tokens: int = PRESSURED_KV_TOKENS, max_num_seqs: int = 16,
                scheduler: bool = True, max_model_len: int = 256) -> list[str]:
    """The shared flags, a KV cache of ``kv_cache_tokens``, contexts of ``max_model_len`` (the
    model's positions allow 512) and, with ``scheduler``, Meridian's."""
    args = ["--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_model_len), "--block-size", "32",
            "--kv-cache-memory-bytes", str(kv_cache_tokens * KV_BYTES_PER_TOKEN), "--max-num-seqs", str(max_num_seqs),
            "--reasoning-parser", "deepseek_r1"]
    return args + ["--scheduler-cls", SCHEDULER_CLS] if scheduler else args
