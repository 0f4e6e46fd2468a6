"""The host KV tier in the replay: vLLM's OffloadingConnector (scheduler side, vLLM's own code)
on the offline engine, whose simulated link completes the connector's store and load jobs. Under
KV pressure preempted requests come back by loading their blocks instead of recomputing, every
token still arrives, and the profile prices the loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meridian._core import Config
from meridian.replay.policies import HostTier, ReplayResult, policy_spec, replay_engine, replay_policy
from meridian.replay.profiles import Profile, ProfileError
from meridian.replay.report import summarize
from meridian.replay.traces import TraceRequest
from replay_profiles import linear_profile as _linear_profile

pytestmark = pytest.mark.vllm

CONFIG: dict[str, Any] = {
    "classes": {"standard": {"ttft_ms": 500.0, "ttfat_ms": 5000.0, "answer_tpot_ms": 50.0, "rank": 1}},
    "default_class": "standard",
    "priority_map": {"0": "standard"},
}


def linear_profile(**capacity: int) -> Profile:
    """10 ms a step plus 0.5 ms per prompt token (recompute is what a restore saves)."""
    fields: dict[str, Any] = {"num_kv_blocks": 40, "max_model_len": 512, "per_prefill_token_ms": 0.5, **capacity}
    return _linear_profile("test-tier", "KV pressure", **fields)


def request(req_id: str, arrival_ms: float, *, prompt: int, think: int, answer: int) -> TraceRequest:
    return TraceRequest(req_id=req_id, arrival_ms=arrival_ms, num_prompt_tokens=prompt,
                        num_output_tokens=think + answer, num_think_tokens=think, num_answer_tokens=answer)

#: Eight long thinkers at once in 40 blocks of 16 tokens: vLLM admits them all and preempts.
REQUESTS = [request(f"r{i}", float(i), prompt=48, think=90 + 7 * i, answer=6) for i in range(8)]


def replay(policy: str, tmp_path: Path, host_tier: HostTier | None, config: dict[str, Any] = CONFIG) -> ReplayResult:
    from meridian.replay.workload import model_dir_for, offline_requests

    profile = linear_profile()
    return replay_policy(policy_spec(policy), offline_requests(REQUESTS, profile, Config.from_json(json.dumps(config))),
                         profile, meridian_config=config, model_dir=model_dir_for(profile, tmp_path), host_tier=host_tier)


def tokens(result: ReplayResult) -> list[tuple[str, int, int]]:
    return [(t.req_id, t.report.num_think_tokens, t.report.num_answer_tokens) for t in result.run.timelines.values()]


def test_stock_vllm_restores_every_preempted_request_from_the_tier(tmp_path: Path) -> None:
    without = replay("vllm-fcfs", tmp_path, None)
    tiered = replay("vllm-fcfs", tmp_path, HostTier(num_blocks=400, load_ms_per_token=0.001))
    preempted = summarize(tiered)["preemptions"]
    assert summarize(without)["preemptions"]["think"] > 0 and preempted["think"] > 0
    assert tokens(tiered) == tokens(without)
    run = tiered.run
    assert run.num_restored_resumes == sum(preempted.values()), (run.num_restored_resumes, preempted)
    assert run.num_stored_restored_resumes == run.num_stored_preemptions == sum(preempted.values())
    # vLLM's own count of the resumed requests' tokens: all but the last block's come back.
    assert run.num_resumes == sum(preempted.values()) and without.run.resumed_tier_hit_tokens == 0
    assert 0 < run.resumed_tier_hit_tokens + run.resumed_device_hit_tokens <= run.resumed_tokens
    assert run.num_tier_loaded_tokens >= 16 * run.num_tier_loads > 0
    # Restoring instead of recomputing: less device time for the same tokens.
    assert run.device_busy_ms < without.run.device_busy_ms
    assert without.run.num_tier_loads == 0


def test_a_tier_too_small_to_hold_a_request_restores_nothing(tmp_path: Path) -> None:
    tiered = replay("vllm-fcfs", tmp_path, HostTier(num_blocks=1, load_ms_per_token=0.001))
    assert summarize(tiered)["preemptions"]["think"] > 0
    assert tiered.run.num_tier_loads == 0 and summarize(tiered)["completed"] == len(REQUESTS)
    assert tiered.run.num_stored_preemptions == 0


@pytest.mark.parametrize("restore", ["always", "never"])
def test_meridian_restores_or_recomputes_as_configured(tmp_path: Path, restore: str) -> None:
    config = {**CONFIG, "answer_kv_reserve": False, "kv_tier": {"restore": restore}}
    tiered = replay("meridian", tmp_path, HostTier(num_blocks=400, load_ms_per_token=0.001), config)
    assert summarize(tiered)["completed"] == len(REQUESTS)
    if summarize(tiered)["preemptions"]["think"] == 0:
        pytest.skip("Meridian's admission avoided every preemption here")
    assert (tiered.run.num_tier_loads > 0) == (restore == "always")


def test_the_profile_prices_host_loads() -> None:
    profile = Profile.load("h200-qwen3-8b")
    # 147,456 B of KV per token over 51.2 GB/s.
    assert profile.host_load_ms_per_token() == pytest.approx(147456 / 5.12e10 * 1e3)
    assert Profile.from_json(profile.to_json()).host_link_bytes_per_s == profile.host_link_bytes_per_s
    tier = HostTier.of(profile, 64.0)
    assert tier is not None and tier.num_blocks == 64 * 2**30 // (147456 * 16)
    assert HostTier.of(profile, 0.0) is None
    with pytest.raises(ProfileError, match="host_link_bytes_per_s"):
        linear_profile().host_load_ms_per_token()


@pytest.mark.parametrize("num_host_blocks", [400, 4], ids=["roomy", "evicting"])
def test_the_core_knows_how_much_of_each_preempted_request_the_tier_holds(tmp_path: Path,
                                                                         num_host_blocks: int) -> None:
    """What the tier holds of a request (its stored prefix, cut back where the tier evicted a
    block of it) reaches the core before the next plan: the victim choice reads it there."""
    from meridian.replay.workload import model_dir_for, offline_requests
    from meridian.vllm.scheduler import HANDLE_ATTR, MeridianScheduler

    seen: list[tuple[int, int, int]] = []

    class Recording(MeridianScheduler):
        def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
            assert self.kv_tier is not None
            self._tier_policy.flush()  # type: ignore[union-attr]
            stored = self.kv_tier.stored_tokens(request.request_id)
            seen.append((stored, self.meridian.num_stored_tokens(getattr(request, HANDLE_ATTR)),
                         request.num_computed_tokens))
            return super()._preempt_request(request, *args, **kwargs)

    config = {**CONFIG, "answer_kv_reserve": False, "arrival_preemption": {"enabled": False}}
    profile = linear_profile()
    engine = replay_engine(policy_spec("meridian"), offline_requests(REQUESTS, profile, Config.from_json(json.dumps(config))),
                           profile, meridian_config=config, model_dir=model_dir_for(profile, tmp_path),
                           host_tier=HostTier(num_blocks=num_host_blocks, load_ms_per_token=0.001),
                           scheduler_cls=Recording)
    assert summarize(ReplayResult("meridian", engine.run()))["completed"] == len(REQUESTS)
    assert seen, "the workload preempts under Meridian too"
    for stored, in_core, computed in seen:
        assert stored == in_core and stored % 16 == 0 and stored <= computed, seen
    if num_host_blocks == 400:  # store-ahead keeps every full block of a running request
        assert all(stored >= computed - 16 - 1 for stored, _, computed in seen), seen
    else:  # 4 blocks for eight requests: the tier evicts, and a prefix never outgrows it
        assert all(stored <= 4 * 16 for stored, _, _ in seen), seen
