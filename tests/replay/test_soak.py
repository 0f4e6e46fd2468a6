"""The replay soak (``meridian.replay.soak``): a short soak of the product and of stock vLLM keeps
every invariant, and the checks catch a scheduler that leaks. The million-step run is
``bench/replay_soak.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meridian._core import Config
from meridian.replay.profiles import Profile
from meridian.replay.soak import _Segments, families, run_soak, soak_config

pytestmark = pytest.mark.vllm

NUM_STEPS = 3_000


@pytest.mark.parametrize("policy", ["meridian", "vllm-fcfs"])
def test_a_short_soak_keeps_every_invariant(policy: str, tmp_path: Path) -> None:
    report = run_soak(policy, NUM_STEPS, seed=3, cache_dir=tmp_path)
    assert report.violations == [] and report.num_violations == 0
    assert report.num_steps >= NUM_STEPS
    assert report.num_finished == report.num_submitted > 0, "every request ended, once"
    assert len(report.samples) == report.num_segments
    last = report.samples[-1]
    assert last.num_finished == report.num_finished
    assert (last.core_heap_bytes is not None) == (policy == "meridian")
    assert last.observer_heap_bytes > 0 and last.rss_bytes > 0


def _leaking(policy_class: type[Any]) -> type[Any]:
    class Leaking(policy_class):  # type: ignore[misc, valid-type]
        """Keeps one KV block of every request that finishes."""

        def _free_blocks(self, request: Any) -> None:
            blocks = self.kv_cache_manager.get_blocks(request.request_id).blocks[0]
            if blocks:
                blocks[0].ref_cnt += 1  # a reference nobody drops
            super()._free_blocks(request)

    return Leaking


def test_the_soak_catches_a_scheduler_that_leaks_kv_blocks(tmp_path: Path) -> None:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    report = run_soak("vllm-fcfs", 500, seed=3, cache_dir=tmp_path, scheduler_cls=_leaking(AsyncScheduler))
    assert report.num_violations >= 1
    assert any("KV blocks still held after the drain" in v for v in report.violations), report.violations


def test_segments_are_drawn_from_the_seed_alone() -> None:
    profile = Profile.load("h200-qwen3-32b")
    config = Config.from_json("{}")
    draws = [[_Segments(seed, profile, config, None).draw(i) for i in range(5)] for seed in (7, 7, 8)]
    assert draws[0] == draws[1]
    assert draws[0] != draws[2]
    assert {s.family.name for s in draws[0]} == {"azure-excerpt"}, "no shared folder: the bundled excerpt only"


def test_families_add_the_public_traces_only_where_they_are(tmp_path: Path) -> None:
    assert [f.name for f in families(tmp_path)] == ["azure-excerpt"]
    (tmp_path / "mooncake").mkdir()
    (tmp_path / "mooncake" / "synthetic_trace.jsonl").write_text("")
    assert [f.name for f in families(tmp_path)] == ["azure-excerpt", "mooncake"]


def test_the_soak_config_turns_every_triage_on() -> None:
    config = Config.from_json(json.dumps(soak_config()))
    assert {name: config.class_targets(name)["on_overload"] for name in config.class_names} == {
        "interactive": "shed", "standard": "degrade", "batch": "queue"}
