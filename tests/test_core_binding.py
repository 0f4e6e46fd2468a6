"""The binding contract: conversions, error classes mapped variant by variant, stub parity."""

from __future__ import annotations

import subprocess
import sys

import pytest

import meridian
from meridian import Config, Meridian
from meridian.errors import (
    ConfigError,
    DuplicateRequestError,
    InvalidArgumentError,
    MeridianError,
    UnknownRequestError,
    UnknownSloClassError,
)

END = 2


def make_core(config: str = "{}") -> Meridian:
    return Meridian(
        Config.from_json(config),
        block_size=16,
        max_num_batched_tokens=512,
        max_num_seqs=8,
        reasoning_start_ids=[1],
        reasoning_end_ids=[END],
        tool_call_ids=[[3]],
    )


def test_defaults_and_class_targets() -> None:
    config = Config.from_json("{}")
    assert config.class_names == ["interactive", "standard", "batch"]
    assert config.default_class == "standard"
    targets = config.class_targets("interactive")
    assert targets["answer_tpot_ms"] == 50.0 and targets["rank"] == 0
    with pytest.raises(InvalidArgumentError):
        config.class_targets("gold")


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('{"think_batch_multiplier": 0.5}', "think_batch_multiplier"),
        ('{"nope": 1}', "nope"),
        ('{"classes": {"x": {"ttft_ms": 1, "ttfat_ms": 1, "answer_tpot_ms": 0, "rank": 0}}}', "classes.x.answer_tpot_ms"),
        ('{"evict_reasoning_blocks": "sometimes"}', "evict_reasoning_blocks"),
        ("[1, 2]", "meridian"),
    ],
)
def test_config_errors_name_the_key(text: str, names: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_json(text)
    assert names in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, MeridianError)


def test_request_lifecycle_through_the_binding() -> None:
    core = make_core()
    a = core.add_request("a", 0.0, [5, 5, 5], 32, None, 0)
    b = core.add_request("b", 0.0, [5, 5, 5], 32, "interactive", 0)
    assert core.num_requests == 2 and core.handle_of("a") == a and core.handle_of("zz") is None
    core.on_tokens_batch(1.0, [a, b], [1, 2], [9, 9, END])
    assert (core.phase(a), core.phase(b)) == ("think", "answer")
    assert core.num_output_tokens(b) == 2
    plan = core.plan_step(2.0, [a, b], [], 100)
    assert plan.running_order == [1, 0]
    assert 1 <= plan.token_budget <= 512
    core.on_step_output(3.0, plan.step_id, 0, 2, 40)
    done = core.finish(4.0, b, "stopped")
    assert done.req_id == "b" and done.slo_class == "interactive" and done.reason == "stopped"
    assert done.ttft_ms == 1.0 and done.never_reusable_from_token == 3
    stats = core.stats()
    assert stats["num_finished"] == 1 and stats["num_steps"] == 1
    counters = core.class_counters()
    assert counters["interactive"]["num_completed"] == 1


def test_each_core_error_maps_to_its_class() -> None:
    core = make_core()
    a = core.add_request("a", 0.0, [5], 4, None, 0)
    with pytest.raises(DuplicateRequestError, match="`a`"):
        core.add_request("a", 0.0, [5], 4, None, 0)
    with pytest.raises(UnknownSloClassError, match="gold"):
        core.add_request("b", 0.0, [5], 4, "gold", 0)
    with pytest.raises(InvalidArgumentError, match="arrival_ms"):
        core.add_request("c", float("nan"), [5], 4, None, 0)
    with pytest.raises(InvalidArgumentError, match="twice"):
        core.plan_step(1.0, [a], [a], 10)
    with pytest.raises(InvalidArgumentError, match="finish reason"):
        core.finish(1.0, a, "exploded")
    with pytest.raises(InvalidArgumentError, match="differ in length"):
        core.on_tokens_batch(1.0, [a], [1, 1], [9, 9])
    with pytest.raises(InvalidArgumentError, match="add up"):
        core.on_tokens_batch(1.0, [a], [3], [9])
    core.finish(1.0, a, "aborted")
    with pytest.raises(UnknownRequestError) as info:
        core.phase(a)
    assert isinstance(info.value, KeyError) and "unknown request handle" in str(info.value)
    with pytest.raises(OverflowError):
        core.add_request("d", 0.0, [-1], 4, None, 0)


def test_unknown_kernel_name_is_reported() -> None:
    with pytest.raises(InvalidArgumentError, match="no bundled kernel"):
        meridian._core.kernel_source("nope.cu")


def test_stub_matches_the_extension() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "meridian._core"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_version_check_names_both_versions() -> None:
    from meridian.errors import UnsupportedVllmError
    from meridian._vllm_version import check_vllm_version

    assert check_vllm_version("0.32.0") == "0.32.0"
    assert check_vllm_version("0.33.1+cu130") == "0.33.1+cu130"
    for bad in ("0.31.2", "0.34.0", "1.0.0", "garbage"):
        with pytest.raises(UnsupportedVllmError, match=bad.split("+")[0]):
            check_vllm_version(bad)
