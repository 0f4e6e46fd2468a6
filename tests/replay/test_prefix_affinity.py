"""Prefix-aware admission fed by the real vLLM components: ``MeridianScheduler`` has vLLM's block
pool record its KV cache events and hands them to the core's prefix index, and the host tier's
stores reach it through the connector's manager; a request whose prompt shares a finished
request's prefix is then found cached on the device, and, once the device cache is reset, in the
host tier. vLLM's own prefix-cache statistics are counted by the offline engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meridian._core import Config
from meridian.replay.policies import HostTier, ReplayResult, policy_spec, replay_engine
from meridian.replay.report import summarize
from meridian.replay.traces import TraceRequest
from replay_profiles import linear_profile

pytestmark = pytest.mark.vllm

CONFIG: dict[str, Any] = {
    "classes": {"standard": {"ttft_ms": 500.0, "ttfat_ms": 5000.0, "answer_tpot_ms": 50.0, "rank": 1}},
    "default_class": "standard",
    "priority_map": {"0": "standard"},
}


def shared_prefix_requests() -> list[TraceRequest]:
    """Two requests whose prompts share their first 64 tokens (two 32-token trace blocks), the
    second arriving long after the first has finished."""
    def request(req_id: str, arrival_ms: float, last_block: int) -> TraceRequest:
        return TraceRequest(req_id=req_id, arrival_ms=arrival_ms, num_prompt_tokens=96, num_output_tokens=12,
                            num_think_tokens=8, num_answer_tokens=4, prefix_block_hashes=(1, 2, last_block),
                            hash_block_size=32)
    return [request("first", 0.0, 3), request("second", 60_000.0, 4)]


def run(tmp_path: Path, *, reset_device_cache: bool) -> tuple[dict[str, tuple[int, int, int]], ReplayResult]:
    from meridian.replay.workload import model_dir_for, offline_requests
    from meridian.vllm.scheduler import HANDLE_ATTR, MeridianScheduler

    seen: dict[str, tuple[int, int, int]] = {}

    class Recording(MeridianScheduler):
        def add_request(self, request: Any) -> None:
            if request.request_id == "second" and reset_device_cache:
                assert self.reset_prefix_cache()
                self.kv_cache_manager.take_events()  # what update_from_output does every step
            super().add_request(request)
            seen[request.request_id] = self.meridian.cached_prefix(getattr(request, HANDLE_ATTR))

    profile = linear_profile(
        "test-prefix", "two requests", num_kv_blocks=64, max_num_seqs=8, max_num_batched_tokens=256,
        max_model_len=512, per_prefill_token_ms=0.5,
    )
    requests = offline_requests(shared_prefix_requests(), profile, Config.from_json(json.dumps(CONFIG)))
    engine = replay_engine(policy_spec("meridian"), requests, profile, meridian_config=CONFIG,
                           model_dir=model_dir_for(profile, tmp_path),
                           host_tier=HostTier(num_blocks=64, load_ms_per_token=0.001), scheduler_cls=Recording)
    return seen, ReplayResult("meridian", engine.run())


def test_a_shared_prefix_is_found_on_the_device(tmp_path: Path) -> None:
    seen, result = run(tmp_path, reset_device_cache=False)
    assert seen["first"] == (0, 0, 0)
    # 64 shared tokens: four 16-token blocks, held by the device cache since "first" ran.
    assert seen["second"][:2] == (4, 0), seen
    stats = summarize(result)["prefix_cache"]
    assert (stats["queries"], stats["hits"]) == (192, 64), stats


def test_after_a_device_reset_the_prefix_is_found_in_the_host_tier(tmp_path: Path) -> None:
    seen, result = run(tmp_path, reset_device_cache=True)
    assert seen["second"] == (0, 4, 0), seen
    assert summarize(result)["completed"] == 2
