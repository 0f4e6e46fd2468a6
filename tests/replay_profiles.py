"""Linear step-time profiles for the replay tests. Owns the fields a test leaves unset: constant
10 ms steps, a KV cache and batch that never bind, every field's source marked as a test value
(``Profile.from_json`` wants one per field). A test states only the fields its hand-worked numbers
depend on."""

from __future__ import annotations

from typing import Any

from meridian.replay.profiles import Profile

_DEFAULTS: dict[str, Any] = {
    "model": "linear", "block_size": 16, "num_kv_blocks": 4096, "max_num_seqs": 64,
    "max_num_batched_tokens": 512, "max_model_len": 4096, "base_ms": 10.0, "per_prefill_token_ms": 0.0,
    "per_decode_request_ms": 0.0, "per_context_token_ms": 0.0,
}


def linear_profile_data(name: str = "test-linear", description: str = "test profile", **fields: Any) -> dict[str, Any]:
    """The profile's JSON object (what ``--profile`` files hold)."""
    data: dict[str, Any] = {"name": name, "description": description, **_DEFAULTS, **fields}
    data["sources"] = {key: "test value" for key in data if key not in ("name", "description", "model")}
    return data


def linear_profile(name: str = "test-linear", description: str = "test profile", **fields: Any) -> Profile:
    return Profile.from_json(linear_profile_data(name, description, **fields))
