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
    a, class_a = core.add_request("a", 0.0, [5, 5, 5], 32, None, 0)
    b, class_b = core.add_request("b", 0.0, [5, 5, 5], 32, "interactive", 0)
    assert (class_a, class_b) == ("standard", "interactive")
    assert core.num_requests == 2 and core.handle_of("a") == a and core.handle_of("zz") is None
    core.on_tokens_batch(1.0, [a, b], [1, 2], [9, 9, END])
    assert (core.phase(a), core.phase(b)) == ("think", "answer")
    assert core.num_output_tokens(b) == 2
    plan = core.plan_step(2.0, [a, b], [], 100)
    assert plan.running_order == [1, 0]
    assert 1 <= plan.token_budget <= 512
    assert core.on_step_output(3.0, plan.step_id, 0, 2, 40) == 1.0
    done = core.finish(4.0, b, "stop", [9, END])
    assert done.req_id == "b" and done.slo_class == "interactive" and done.reason == "stopped"
    assert done.ttft_ms == 1.0 and done.never_reusable_from_token == 3
    assert done.unknown_finish_reason is None
    stats = core.stats()
    assert stats["num_finished"] == 1 and stats["num_steps"] == 1
    counters = core.class_counters()
    assert counters["interactive"]["num_completed"] == 1


def test_each_core_error_maps_to_its_class() -> None:
    core = make_core()
    a, _ = core.add_request("a", 0.0, [5], 4, None, 0)
    with pytest.raises(DuplicateRequestError, match="`a`"):
        core.add_request("a", 0.0, [5], 4, None, 0)
    with pytest.raises(UnknownSloClassError, match="gold"):
        core.add_request("b", 0.0, [5], 4, "gold", 0)
    with pytest.raises(InvalidArgumentError, match="arrival_ms"):
        core.add_request("c", float("nan"), [5], 4, None, 0)
    with pytest.raises(InvalidArgumentError, match="twice"):
        core.plan_step(1.0, [a], [a], 10)
    with pytest.raises(InvalidArgumentError, match="now_ms"):
        core.finish(float("inf"), a, "stop", [])
    with pytest.raises(InvalidArgumentError, match="differ in length"):
        core.on_tokens_batch(1.0, [a], [1, 1], [9, 9])
    with pytest.raises(InvalidArgumentError, match="add up"):
        core.on_tokens_batch(1.0, [a], [3], [9])
    core.finish(1.0, a, "abort", [])
    with pytest.raises(UnknownRequestError) as info:
        core.phase(a)
    assert isinstance(info.value, KeyError) and "unknown request handle" in str(info.value)
    with pytest.raises(UnknownRequestError):
        core.finish(2.0, a, "stop", [])
    with pytest.raises(ConfigError, match=r"tool_call_markers\[0\]"):
        Config.from_json('{"tool_call_markers": ["<tool>"]}').resolve_tool_call_markers([None])
    with pytest.raises(InvalidArgumentError, match="2 entries for 1 configured marker"):
        Config.from_json("{}").resolve_tool_call_markers([1, 2])
    with pytest.raises(OverflowError):
        core.add_request("d", 0.0, [-1], 4, None, 0)


def test_request_args_are_checked_by_the_core_against_the_configuration_given() -> None:
    from meridian._core import check_request_args
    from meridian.errors import RequestArgsError

    defaults = Config.from_json("{}")
    check_request_args('{"meridian_class": "batch", "meridian_thinking_budget_tokens": 8, "other": null}', defaults)
    check_request_args('{"meridian_class": "gold"}', None)  # no configuration: the type only
    with pytest.raises(RequestArgsError, match="`meridian_class`: unknown SLO class `gold`; configured classes: interactive"):
        check_request_args('{"meridian_class": "gold"}', defaults)
    with pytest.raises(RequestArgsError, match="`meridian_thinking_budget_tokens`: -3 must be a whole number"):
        check_request_args('{"meridian_thinking_budget_tokens": -3}', None)
    with pytest.raises(InvalidArgumentError, match="args_json"):
        check_request_args("[]", None)


def test_unknown_kernel_name_is_reported() -> None:
    with pytest.raises(InvalidArgumentError, match="no bundled kernel"):
        meridian._core.kernel_source("nope.cu")
    # The device-side signal update is gone: the core updates the signals on the host.
    assert "logits_stats" in meridian._core.kernel_source("logits_stats.cu")
    with pytest.raises(InvalidArgumentError, match="signals.cu"):
        meridian._core.kernel_source("signals.cu")


def test_add_request_returns_the_resolved_class() -> None:
    core = make_core()
    assert core.add_request("named", 0.0, [5], 4, "batch", -5)[1] == "batch"  # the name wins
    assert core.add_request("urgent", 0.0, [5], 4, None, -1)[1] == "interactive"
    assert core.add_request("later", 0.0, [5], 4, None, 7)[1] == "batch"
    handle, slo_class = core.add_request("plain", 0.0, [5], 4, None, 0)
    assert slo_class == Config.from_json("{}").default_class == "standard"
    assert core.handle_of("plain") == handle
    assert not hasattr(core, "resolve_class")


def test_an_unknown_finish_reason_is_reported_not_raised() -> None:
    core = make_core()
    a, _ = core.add_request("a", 0.0, [5], 8, None, 0)
    core.on_tokens_batch(1.0, [a], [2], [9, END])
    done = core.finish(2.0, a, "hallucination", [9, END, 9])
    assert done.reason == "error" and done.unknown_finish_reason == "hallucination"
    assert done.num_answer_tokens == 1, "the unseen tail is still fed"
    assert core.num_requests == 0 and core.handle_of("a") is None, "released"
    stats = core.stats()
    assert stats["num_unknown_finish_reasons"] == 1 and stats["num_finished"] == 1
    assert core.class_counters()["standard"]["num_aborted"] == 1
    # vLLM's own names, exactly (str(FinishReason.STOP) == "stop").
    for wire, reason in [("stop", "stopped"), ("length", "length"), ("abort", "aborted"), ("error", "error")]:
        h, _ = core.add_request(wire, 0.0, [5], 8, None, 0)
        done = core.finish(1.0, h, wire, [])
        assert (done.reason, done.unknown_finish_reason) == (reason, None)
    h, _ = core.add_request("core-name", 0.0, [5], 8, None, 0)
    assert core.finish(1.0, h, "stopped", []).unknown_finish_reason == "stopped"
    assert core.stats()["num_unknown_finish_reasons"] == 2


def test_finish_feeds_the_tokens_the_core_has_not_seen() -> None:
    core = make_core()
    a, _ = core.add_request("a", 0.0, [5, 1], 8, None, 0)
    core.on_tokens_batch(1.0, [a], [2], [9, 9])
    assert core.phase(a) == "think" and core.num_output_tokens(a) == 2
    done = core.finish(3.0, a, "stop", [9, 9, END, 9])
    assert (done.num_think_tokens, done.num_answer_tokens) == (3, 1)
    assert done.ttfat_ms == 3.0, "the unseen tokens arrive at now_ms"
    # A list no longer than what the core has seen feeds nothing, and is no error.
    b, _ = core.add_request("b", 0.0, [5, 1], 8, None, 0)
    core.on_tokens_batch(1.0, [b], [2], [9, 9])
    done = core.finish(3.0, b, "length", [9])
    assert (done.num_think_tokens, done.num_answer_tokens) == (2, 0)


def test_resolve_tool_call_markers_explicit_and_default() -> None:
    default = Config.from_json("{}")
    assert default.tool_call_markers == ["<tool_call>"]
    assert default.resolve_tool_call_markers([151657]) == [151657]
    assert default.resolve_tool_call_markers([None]) == [], "the default marker is dropped"
    explicit = Config.from_json('{"tool_call_markers": ["<tool_call>", "<tool>"]}')
    assert explicit.resolve_tool_call_markers([7, 9]) == [7, 9]
    with pytest.raises(ConfigError) as info:
        explicit.resolve_tool_call_markers([7, None])
    message = str(info.value)
    assert "tool_call_markers[1]" in message and "`<tool>` is not a single token" in message
    assert isinstance(info.value, ValueError)


def test_on_step_output_returns_the_measured_duration() -> None:
    core = make_core()
    a, _ = core.add_request("a", 0.0, [5], 8, None, 0)
    plan = core.plan_step(10.0, [a], [], 100)
    assert core.on_step_output(14.5, plan.step_id, 0, 1, 1) == 4.5
    assert core.on_step_output(15.0, plan.step_id, 0, 1, 1) is None, "already met"
    assert core.on_step_output(16.0, 999, 0, 1, 1) is None, "never planned"
    idle = core.plan_step(20.0, [a], [], 100)
    assert core.on_step_output(21.0, idle.step_id, 0, 0, 0) is None, "executed nothing"
    assert core.stats()["num_step_samples"] == 1


def test_module_constants_are_the_cores_names() -> None:
    from meridian import _core

    assert _core.CLASS_ARG == "meridian_class"
    assert _core.THINKING_ARG == "meridian_thinking"
    assert _core.THINKING_BUDGET_ARG == "meridian_thinking_budget_tokens"
    assert _core.POLICY_NAMES == ("meridian", "answer_first", "pascal", "uniboost", "scorpio")
    for name in _core.POLICY_NAMES:
        assert Config.from_json(f'{{"policy": "{name}"}}').policy == name
    with pytest.raises(ConfigError, match="sjf"):
        Config.from_json('{"policy": "sjf"}')


def test_stub_matches_the_extension() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "meridian._core"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_version_check_names_both_versions() -> None:
    from meridian.errors import UnsupportedVllmError
    from meridian.vllm._version import check_vllm_version

    assert check_vllm_version("0.32.0") == "0.32.0"
    assert check_vllm_version("0.33.1+cu130") == "0.33.1+cu130"
    assert check_vllm_version("0.34.0") == "0.34.0"
    for bad in ("0.31.2", "0.35.0", "1.0.0", "garbage"):
        with pytest.raises(UnsupportedVllmError, match=bad.split("+")[0]):
            check_vllm_version(bad)


def test_config_exposes_the_length_priors_and_validates_the_predictor_keys() -> None:
    think, answer = Config.from_json('{"think_tokens_prior": [5, 7], "answer_tokens_prior": [3]}').length_priors
    assert (think, answer) == ([5, 7], [3])
    default_think, default_answer = Config.from_json("{}").length_priors
    assert len(default_think) == len(default_answer) == 10
    with pytest.raises(ConfigError, match="predictor.memory_requests"):
        Config.from_json('{"predictor": {"memory_requests": 0}}')
    with pytest.raises(ConfigError, match="late_wait_ttft_factor"):
        Config.from_json('{"late_wait_ttft_factor": -2}')
