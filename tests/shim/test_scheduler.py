"""MeridianScheduler against vLLM's real scheduler classes, driven offline with scripted outputs.

Every test builds real vLLM configs and schedulers (the tiny local model folder, no hub) and runs
them through the engine core's call sequence (``meridian.offline.engine.OfflineEngine``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meridian._core import Config
from meridian.errors import ConfigError
from meridian.demo.scripted import SCENARIO_MERIDIAN_CONFIG, Scenario, run_scenario, scenario_requests
from meridian.offline.engine import EngineSpec, OfflineEngine, OfflineRequest, build_scheduler, scripted_request
from meridian.offline.tiny import THINK_END, WORD_IDS, reasoning_script

pytestmark = pytest.mark.vllm


def scripted_tokens(request: OfflineRequest) -> list[int]:
    """The tokens a scripted request's model emits."""
    return list(request.script.tokens)  # type: ignore[attr-defined]


def schedulers() -> dict[str, type[Any]]:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from meridian.vllm import MeridianScheduler

    return {"vllm-fcfs": AsyncScheduler, "meridian": MeridianScheduler}


def spec(model: Path, **overrides: Any) -> EngineSpec:
    base: dict[str, Any] = {"model_dir": model, "additional_config": {"meridian": SCENARIO_MERIDIAN_CONFIG}}
    base.update(overrides)
    return EngineSpec(**base)


def run(policy: str, model: Path, requests: list[OfflineRequest], **overrides: Any) -> Any:
    from meridian._core import Config

    scheduler = build_scheduler(schedulers()[policy], spec(model, **overrides))
    config = Config.from_json(json.dumps(SCENARIO_MERIDIAN_CONFIG))
    return scheduler, OfflineEngine(scheduler, requests, observer_config=config).run()


@pytest.fixture(scope="module")
def scenario_runs(cache_dir: Path) -> dict[tuple[str, int], Any]:
    return {(policy, seed): run_scenario(policy, seed, cache_dir) for seed in (0, 1, 2) for policy in ("vllm-fcfs", "meridian")}


def test_under_kv_pressure_thinking_requests_yield_before_answering_ones(scenario_runs: dict[Any, Any]) -> None:
    seeds = (0, 1, 2)
    stock_alarms = sum(scenario_runs[("vllm-fcfs", s)].num_answer_preemption_alarms for s in seeds)
    assert stock_alarms > 0, "the scenario must put stock vLLM under enough pressure to preempt an answer"
    stock_answer = sum(r.num_preemptions_answer for s in seeds for r in scenario_runs[("vllm-fcfs", s)].reports)
    ours_answer = 0
    for seed in seeds:
        result = scenario_runs[("meridian", seed)]
        reports = result.reports
        assert sum(r.num_preemptions_think for r in reports) > 0, "Meridian must also be under pressure"
        # An answer may only lose its KV when no thinking request is left to yield.
        assert result.num_answer_preemption_alarms == 0
        assert sum(r.num_stalls for r in reports) == 0, "no answer stream stalls"
        ours_answer += sum(r.num_preemptions_answer for r in reports)
    assert ours_answer < stock_answer


def test_every_request_finishes_with_the_same_tokens_under_both(scenario_runs: dict[Any, Any]) -> None:
    for seed in (0, 1, 2):
        scripts = {r.req_id: scripted_tokens(r) for r in scenario_requests(Scenario(), seed)}
        for policy in ("vllm-fcfs", "meridian"):
            result = scenario_runs[(policy, seed)]
            for req_id, script in scripts.items():
                got = result.timelines[req_id]
                assert got.output_token_ids == script, (policy, seed, req_id)
                assert got.finish_reason == "stop"


def test_nothing_leaks(scenario_runs: dict[Any, Any]) -> None:
    for result in scenario_runs.values():
        assert result.final_num_free_blocks == result.max_num_free_blocks
        assert len(result.reports) == Scenario().num_requests


class _RecordingFree:
    """Records each request's block ids just before vLLM frees them."""

    freed: dict[str, tuple[list[int], ...]]

    def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        self.freed[request.request_id] = self.kv_cache_manager.get_block_ids(request.request_id)  # type: ignore[attr-defined]
        return super()._free_request(request, *args, **kwargs)  # type: ignore[misc]


def test_never_reusable_reasoning_blocks_are_evicted_first(tiny_model: Path) -> None:
    prompt = [WORD_IDS[i % len(WORD_IDS)] for i in range(40)]  # 2 full blocks + 8 tokens
    request = scripted_request("a", 0, prompt, reasoning_script(40, 10))
    outcome = {}
    for policy, base in schedulers().items():
        cls = type(f"Recording{base.__name__}", (_RecordingFree, base), {"freed": {}})
        scheduler = build_scheduler(cls, spec(tiny_model, num_blocks=33))
        cls.freed = {}
        OfflineEngine(scheduler, [request]).run()
        blocks = cls.freed["a"][0]
        pool = scheduler.kv_cache_manager.block_pool
        free = pool.free_block_queue.get_all_free_blocks()
        outcome[policy] = (blocks, [b.block_id for b in free], {b.block_id: b.block_hash for b in pool.blocks})
    blocks, free_order, hashes = outcome["meridian"]
    # Reasoning starts at token 40, inside block 2: blocks 2.. can never be a prefix hit again.
    reasoning, prompt_blocks = set(blocks[2:]), blocks[:2]
    assert set(free_order[: len(reasoning)]) == reasoning, "reasoning blocks are reused first"
    assert all(hashes[b] is None for b in reasoning)
    assert all(hashes[b] is not None for b in prompt_blocks), "prompt blocks stay in the prefix cache"
    assert set(free_order[-2:]) == set(prompt_blocks)
    stock_blocks, stock_free, stock_hashes = outcome["vllm-fcfs"]
    assert all(stock_hashes[b] is not None for b in stock_blocks[2:5]), "stock keeps hashing reasoning blocks"
    assert set(stock_free[: len(stock_blocks)]).isdisjoint(stock_blocks[:5])


def test_tool_call_answers_keep_their_reasoning_blocks(tiny_model: Path) -> None:
    prompt = [WORD_IDS[i % len(WORD_IDS)] for i in range(40)]
    request = scripted_request("t", 0, prompt, reasoning_script(40, 10, tool_call=True))
    scheduler = build_scheduler(schedulers()["meridian"], spec(tiny_model, num_blocks=33))
    result = OfflineEngine(scheduler, [request]).run()
    assert result.timelines["t"].report is not None
    assert scheduler.num_reasoning_blocks_evicted == 0
    assert scheduler.finished_reports[-1].never_reusable_from_token is None


def test_token_budget_cap_holds_while_answers_stream(tiny_model: Path) -> None:
    config = dict(SCENARIO_MERIDIAN_CONFIG)
    config["step_time"] = {
        "base_ms": 1.0, "per_prefill_token_ms": 0.01, "per_decode_request_ms": 0.0, "per_context_token_ms": 0.0,
        "online_fit": False,
    }
    config["tpot_headroom"] = 0.9
    requests = scenario_requests(Scenario(num_requests=24, prompt_tokens=(60, 120)), seed=5)
    max_num_seqs = 32
    scheduler = build_scheduler(
        schedulers()["meridian"],
        spec(tiny_model, num_blocks=200, additional_config={"meridian": config}, max_num_batched_tokens=256,
             max_num_seqs=max_num_seqs),
    )
    result = OfflineEngine(scheduler, requests).run()
    # Every running decode gets its token; prompt chunks get what fits the target: while anyone
    # answers, at least answer TPOT 2.0 ms × 0.9 headroom, (1.8 − 1.0) / 0.01 = 80 prompt tokens,
    # and more only as far as every answer banked time below its mean-TPOT target (the steps here
    # take 1 ms, so answers bank); without answering requests 2.5 × 1.8 ms leaves 350, capped by
    # max_num_batched_tokens.
    budgets = result.token_budget_per_step
    assert min(budgets) >= 80, sorted(set(budgets))[:8]
    assert any(80 + max_num_seqs < b < 256 for b in budgets), "banked answer time is spent on prompt chunks"
    assert 256 in budgets
    for scheduled, budget in zip(result.scheduled_tokens_per_step, result.token_budget_per_step):
        assert scheduled <= budget
    assert max(result.scheduled_tokens_per_step) > 80 + max_num_seqs, "the relaxed budget is used when nobody answers"
    assert all(r.output_token_ids == scripted_tokens(s) for r, s in zip(
        (result.timelines[q.req_id] for q in requests), requests))


def test_unknown_class_fails_only_that_request(tiny_model: Path) -> None:
    requests = [
        scripted_request("good", 0, WORD_IDS[:8], reasoning_script(5, 3), slo_class="standard"),
        scripted_request("bad", 0, WORD_IDS[:8], reasoning_script(5, 3), slo_class="gold"),
        scripted_request("late", 3, WORD_IDS[:8], reasoning_script(5, 3)),
        scripted_request("huge-priority", 1, WORD_IDS[:8], reasoning_script(5, 3), priority=2**70),
    ]
    scheduler, result = run("meridian", tiny_model, requests)
    for rejected in ("bad", "huge-priority"):
        assert result.timelines[rejected].finish_reason == "error"
        assert result.timelines[rejected].output_token_ids == []
    for req_id in ("good", "late"):
        assert result.timelines[req_id].finish_reason == "stop"
        assert result.timelines[req_id].output_token_ids == scripted_tokens(requests[0])
    assert scheduler.meridian.num_requests == 0 and not scheduler.has_requests()


@pytest.mark.parametrize(
    ("extra", "named"),
    [({"meridian_class": "gold"}, "meridian_class"), ({"meridian_thinking_budget_tokens": -1}, "meridian_thinking_budget_tokens"),
     ({"meridian_thinking": "on"}, "meridian_thinking"),
     # max_tokens 8 leaves no thinking budget above the default answer room (512 tokens).
     ({"meridian_reasoning_effort": "low"}, "meridian_reasoning_effort"),
     ({"meridian_reasoning_effort": "extreme"}, "meridian_reasoning_effort")],
)
def test_the_scheduler_rejects_a_bad_request_argument_naming_it(
    tiny_model: Path, extra: dict[str, Any], named: str, caplog: pytest.LogCaptureFixture
) -> None:
    # What reaches the engine when no check in the API server saw it (a server without
    # --middleware meridian.vllm.frontend.RequestArgsCheck): the request fails alone with
    # finish reason `error`, the log names the argument, nothing is tracked.
    from vllm import SamplingParams
    from vllm.v1.engine import FinishReason
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT
    from vllm.v1.request import Request, RequestStatus

    from meridian.vllm import MeridianScheduler

    scheduler = build_scheduler(MeridianScheduler, spec(tiny_model))
    params = SamplingParams(max_tokens=8, extra_args=dict(extra))
    request = Request(request_id="bad", prompt_token_ids=WORD_IDS[:8], sampling_params=params, pooling_params=None,
                      arrival_time=0.0)
    scheduler.add_request(request)
    assert request.status == RequestStatus.FINISHED_ERROR
    assert f"invalid request argument `{named}`" in caplog.text
    assert scheduler.meridian.num_requests == 0
    outputs = scheduler.update_from_output(scheduler.schedule(), EMPTY_MODEL_RUNNER_OUTPUT)
    [error] = [o for batch in outputs.values() for o in batch.outputs]
    assert (error.request_id, error.finish_reason, error.new_token_ids) == ("bad", FinishReason.ERROR, [])
    assert not scheduler.has_requests()


def test_bad_additional_config_stops_start_up_naming_the_key(tiny_model: Path) -> None:
    bad = {"meridian": {"classes": {"gold": {"ttft_ms": 1, "ttfat_ms": 1, "answer_tpot_ms": "fast", "rank": 0}}}}
    with pytest.raises(ConfigError, match="classes.gold.answer_tpot_ms"):
        build_scheduler(schedulers()["meridian"], spec(tiny_model, additional_config=bad))
    with pytest.raises(ConfigError, match="meridian"):
        build_scheduler(schedulers()["meridian"], spec(tiny_model, additional_config={"meridian": [1]}))


def test_vllm_priority_maps_onto_classes_and_fcfs_underneath(tiny_model: Path) -> None:
    from vllm.v1.core.sched.request_queue import SchedulingPolicy

    requests = [
        scripted_request("urgent", 0, WORD_IDS[:8], reasoning_script(4, 2), priority=-1),
        scripted_request("normal", 0, WORD_IDS[:8], reasoning_script(4, 2)),
        scripted_request("later", 0, WORD_IDS[:8], reasoning_script(4, 2), priority=3),
    ]
    scheduler = build_scheduler(schedulers()["meridian"], spec(tiny_model, policy="priority", additional_config={}))
    assert scheduler.policy == SchedulingPolicy.FCFS
    OfflineEngine(scheduler, requests).run()
    classes = {r.req_id: r.slo_class for r in scheduler.finished_reports}
    assert classes == {"urgent": "interactive", "normal": "standard", "later": "batch"}


def test_synchronous_engine_loop_works_too(tiny_model: Path) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    from meridian.vllm import MeridianScheduler

    requests = scenario_requests(Scenario(num_requests=12), seed=3)
    for cls in (Scheduler, MeridianScheduler):
        scheduler = build_scheduler(cls, spec(tiny_model, async_scheduling=False))
        result = OfflineEngine(scheduler, requests).run()
        assert [result.timelines[r.req_id].output_token_ids for r in requests] == [scripted_tokens(r) for r in requests]
        assert result.final_num_free_blocks == result.max_num_free_blocks


def test_phases_and_ledger_are_populated(tiny_model: Path) -> None:
    requests = [scripted_request("r", 0, WORD_IDS[:8], reasoning_script(6, 4))]
    scheduler, result = run("meridian", tiny_model, requests)
    report = scheduler.finished_reports[-1]
    assert report.num_think_tokens == 7 and report.num_answer_tokens == 5  # 4 answer tokens + EOS
    assert report.ttft_ms is not None and report.ttfat_ms is not None and report.ttfat_ms > report.ttft_ms
    assert report.never_reusable_from_token == 8
    assert result.timelines["r"].output_token_ids.index(THINK_END) == 6
    stats = scheduler.meridian.stats()
    assert stats["num_finished"] == 1 and stats["num_steps"] >= 12


def test_a_configured_tool_call_marker_that_is_not_one_token_stops_start_up(tiny_model: Path) -> None:
    config = {**SCENARIO_MERIDIAN_CONFIG, "tool_call_markers": ["<tool_call>", "call the tool"]}
    with pytest.raises(ConfigError, match=r"tool_call_markers\[1\]`: `call the tool` is not a single token"):
        build_scheduler(schedulers()["meridian"], spec(tiny_model, additional_config={"meridian": config}))
    config["tool_call_markers"] = ["</tool_call>"]
    scheduler = build_scheduler(schedulers()["meridian"], spec(tiny_model, additional_config={"meridian": config}))
    assert scheduler.meridian.num_requests == 0, "a marker that is one token is taken"


def test_the_scheduler_stamps_the_class_the_core_resolved(tiny_model: Path) -> None:
    from meridian.vllm.names import REQ_ID_ARG, RESOLVED_CLASS_ARG

    requests = [
        scripted_request("named", 0, WORD_IDS[:8], reasoning_script(2, 2), slo_class="batch"),
        scripted_request("by-priority", 0, WORD_IDS[:8], reasoning_script(2, 2), priority=-1),
        scripted_request("default", 0, WORD_IDS[:8], reasoning_script(2, 2)),
    ]
    scheduler = build_scheduler(schedulers()["meridian"], spec(tiny_model, additional_config={}))
    stamped: dict[str, Any] = {}
    original = scheduler.add_request

    def add_request(request: Any) -> None:
        original(request)
        stamped[request.request_id] = dict(request.sampling_params.extra_args)

    scheduler.add_request = add_request
    OfflineEngine(scheduler, requests).run()
    assert {r: e[RESOLVED_CLASS_ARG] for r, e in stamped.items()} == {
        "named": "batch", "by-priority": "interactive", "default": "standard"}
    assert all(e[REQ_ID_ARG] == r for r, e in stamped.items())


def slo_class(ttft_ms: float, ttfat_ms: float, answer_tpot_ms: float, rank: int) -> dict[str, float]:
    return {"ttft_ms": ttft_ms, "ttfat_ms": ttfat_ms, "answer_tpot_ms": answer_tpot_ms, "rank": rank}


#: Targets in steps: an interactive class that cannot wait and a batch class that can.
ARRIVAL_CONFIG: dict[str, Any] = {
    "classes": {"interactive": slo_class(20, 300, 2, 0), "batch": slo_class(1000, 100_000, 50, 2)},
    "default_class": "batch", "priority_map": {"0": "batch"}, "step_time": SCENARIO_MERIDIAN_CONFIG["step_time"],
    # A late request waits (the rule under test makes room for it), rather than being shed.
    "overload": {"on_overload": "queue"},
}


@pytest.mark.parametrize("enabled", [True, False])
def test_an_interactive_arrival_preempts_batch_thinking_through_vllms_own_path(tiny_model: Path, enabled: bool) -> None:
    # Two seats, both taken by long-thinking batch requests; an interactive request arrives at
    # 5 ms (TTFT target 20 ms). Past half its target it makes a batch request yield its seat.
    requests = [
        scripted_request("batch-a", 0, WORD_IDS[:8], reasoning_script(200, 5), slo_class="batch"),
        scripted_request("batch-b", 0, WORD_IDS[:16], reasoning_script(200, 5, seed=1), slo_class="batch"),
        scripted_request("urgent", 5, WORD_IDS[:8], reasoning_script(3, 3, seed=2), slo_class="interactive"),
    ]
    config = {**ARRIVAL_CONFIG, "arrival_preemption": {"enabled": enabled}}
    scheduler = build_scheduler(
        schedulers()["meridian"], spec(tiny_model, max_num_seqs=2, num_blocks=200, additional_config={"meridian": config})
    )
    result = OfflineEngine(scheduler, requests, observer_config=Config.from_json(json.dumps(ARRIVAL_CONFIG))).run()
    for r in requests:
        assert result.timelines[r.req_id].output_token_ids == scripted_tokens(r), "a victim resumes exactly"
        assert result.timelines[r.req_id].finish_reason == "stop"
    assert result.final_num_free_blocks == result.max_num_free_blocks, "nothing leaks"
    reports = {r.req_id: r for r in scheduler.finished_reports}
    urgent_ttft = reports["urgent"].ttft_ms
    preempted = sum(reports[b].num_preemptions_think for b in ("batch-a", "batch-b"))
    if enabled:
        assert scheduler.meridian.stats()["num_arrival_preemptions"] == preempted == 1
        assert scheduler.meridian.class_counters()["batch"]["num_arrival_preemptions"] == 1
        assert reports["batch-a"].num_preemptions_think == 0, "batch-b has more slack net of its recompute"
        assert urgent_ttft is not None and urgent_ttft < 20.0, "the urgent request makes its TTFT target"
        assert result.num_answer_preemption_alarms == 0
    else:
        assert scheduler.meridian.stats()["num_arrival_preemptions"] == preempted == 0
        assert urgent_ttft is not None and urgent_ttft > 150.0, "without the rule it waits for a seat"


def _expected_output_tokens(scheduler: Any) -> float:
    """What the scheduler's core expects a fresh request of the default class to generate."""
    from meridian.offline.tiny import THINK_START
    from meridian.vllm.scheduler import HANDLE_ATTR

    from meridian.offline.engine import FixedScript

    # A generous max_tokens, as clients set: the core caps its expectation by it.
    request = OfflineRequest("fresh", 0.0, [WORD_IDS[0], THINK_START], 400, FixedScript(tuple(reasoning_script(3, 2))))
    engine = OfflineEngine(scheduler, [], observer_config=Config.from_json("{}"))
    engine.submit(request)
    engine.advance_to(0.0)
    core = scheduler.meridian
    handles = [getattr(r, HANDLE_ATTR, None) for r in scheduler.waiting]
    core.plan_step(0.0, [], [h for h in handles if h is not None], 1000)
    load, _ = core.engine_load(0.0, [], [h for h in handles if h is not None])
    return sum(float(c["expected_output_tokens"]) for c in load.values())


def test_a_restarted_server_learns_from_its_request_log(tiny_model: Path, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    from meridian.vllm import MeridianScheduler

    log = tmp_path / "requests.jsonl"
    line = {"req_id": "x", "slo_class": "standard", "reason": "stopped", "ttfat_ms": 80.0, "num_think_tokens": 12,
            "num_answer_tokens": 3}
    log.write_text("".join(json.dumps({**line, "req_id": f"r{i}"}) + "\n" for i in range(400))
                   + "{torn\n" + json.dumps({**line, "slo_class": "gold"}) + "\n")
    config = {"request_log_path": str(log)}
    cold = build_scheduler(MeridianScheduler, spec(tiny_model, additional_config={"meridian": {"warm_start": False, **config}}))
    with caplog.at_level("INFO", logger="meridian"):
        warm = build_scheduler(MeridianScheduler, spec(tiny_model, additional_config={"meridian": config}))
    assert "400 finished requests learnt, 2 lines skipped" in caplog.text
    cold_tokens, warm_tokens = _expected_output_tokens(cold), _expected_output_tokens(warm)
    for scheduler in (cold, warm):
        scheduler.shutdown()
    # 12 thinking tokens and 3 answer tokens against priors of hundreds (capped by max_tokens, 400).
    assert 15 <= warm_tokens < 0.5 * cold_tokens, (warm_tokens, cold_tokens)


def test_a_warm_start_log_that_cannot_be_read_stops_start_up_naming_the_key(tiny_model: Path, tmp_path: Path) -> None:
    from meridian.vllm import MeridianScheduler

    missing = {"meridian": {"warm_start_path": str(tmp_path / "no-such.jsonl")}}
    with pytest.raises(ConfigError, match="warm_start_path"):
        build_scheduler(MeridianScheduler, spec(tiny_model, additional_config=missing))
    # The server's own log not there yet is its first run: nothing to learn, no error.
    build_scheduler(MeridianScheduler, spec(tiny_model, additional_config={"meridian": {
        "request_log_path": str(tmp_path / "new.jsonl")}})).shutdown()
