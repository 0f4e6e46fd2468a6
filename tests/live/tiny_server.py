"""The live tests' tiny reasoning model server: its folder and the defaults every live test starts
it with, on top of the product's flags (``meridian.demo.server.tiny_server_args``: a CPU build,
float32, eager, 32-token blocks, the DeepSeek-R1 reasoning parser). Each test adds only what it is
about: the KV cache size, the scheduler, the connector. Test code only; pytest puts this folder on
``sys.path``."""

from __future__ import annotations

from pathlib import Path

from meridian.demo.server import tiny_server_args

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-reasoner"
MODEL = str(FIXTURE)
#: A 320-token cache (10 blocks of 32) holds two or three requests (up to ~140 tokens each) at
#: full length, so a burst of 12 must wait or be preempted.
PRESSURED_KV_TOKENS = 320
#: ``meridian`` keys for the tests that count every request they send: late requests queue
#: instead of being shed (Meridian's default; tests/live/test_middleware.py is about shedding).
QUEUE_LATE = {"overload": {"on_overload": "queue"}}


def server_args(*, kv_cache_tokens: int = PRESSURED_KV_TOKENS, max_num_seqs: int = 16,
                scheduler: bool = True, max_model_len: int = 256) -> list[str]:
    """The product's tiny-model flags with the live tests' defaults: a pressured KV cache of
    ``kv_cache_tokens``, contexts of ``max_model_len`` (the model's positions allow 512) and, with
    ``scheduler``, Meridian's scheduler."""
    return tiny_server_args(max_model_len=max_model_len, kv_cache_tokens=kv_cache_tokens,
                            max_num_seqs=max_num_seqs, scheduler=scheduler)
