"""vLLM's load valve (``--max-num-queued-reqs``) as a replay baseline: the valve never lets more
than its cap be unfinished (hypothesis over arrivals and caps), a refusal is a shed counted as
missed and never as a failure, a cap that never binds changes nothing, the docs-sized cap follows
its formula by hand, bad caps are named, and the tuned valve is the best run of its grid."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meridian._core import Config
from meridian.cli import main as cli_main
from meridian.offline.engine import REFUSED, OfflineEngine, OfflineRequest
from meridian.replay.policies import (
    POLICIES, TUNED_VALVE, VALVE, LoadValve, PolicySpec, ReplayResult, WorkloadMeans, best_queue_cap,
    docs_sized_queue_cap, effective_seats, policy_spec, queue_cap_for, queue_cap_grid, refined_queue_caps, replay_engine,
    replay_policy, valve_capacity_rps, with_queue_cap,
)
from meridian.replay.profiles import Profile
from meridian.replay.report import is_shed, summarize, table
from meridian.replay.runner import ReplayOptions, run_replay
from meridian.replay.traces import TraceRequest
from meridian.replay.workload import model_dir_for, offline_requests
from replay_profiles import linear_profile as _linear_profile

pytestmark = pytest.mark.vllm

CONFIG: dict[str, Any] = {
    "classes": {
        "interactive": {"ttft_ms": 40.0, "ttfat_ms": 90.0, "answer_tpot_ms": 20.0, "rank": 0},
        "standard": {"ttft_ms": 50.0, "ttfat_ms": 120.0, "answer_tpot_ms": 20.0, "rank": 1},
    },
    "default_class": "standard",
}


def linear_profile(*, max_num_seqs: int = 4, num_kv_blocks: int = 4096, base_ms: float = 10.0) -> Profile:
    return _linear_profile(
        "test-linear", "constant-time steps for hand-worked numbers", num_kv_blocks=num_kv_blocks,
        max_num_seqs=max_num_seqs, base_ms=base_ms,
    )


def trace(req_id: str, arrival_ms: float, *, think: int = 3, answer: int = 2, slo_class: str = "standard",
          prompt: int = 16) -> TraceRequest:
    return TraceRequest(req_id=req_id, arrival_ms=arrival_ms, num_prompt_tokens=prompt,
                        num_output_tokens=think + answer, num_think_tokens=think, num_answer_tokens=answer,
                        slo_class=slo_class)


def offline(traces: list[TraceRequest], profile: Profile) -> list[OfflineRequest]:
    return offline_requests(traces, profile, Config.from_json(json.dumps(CONFIG)))


def replay(policy: str, traces: list[TraceRequest], profile: Profile, tmp_path: Path) -> ReplayResult:
    return replay_policy(policy_spec(policy), offline(traces, profile), profile, meridian_config=CONFIG,
                         model_dir=model_dir_for(profile, tmp_path))


def burst(n: int, gap_ms: float = 1.0) -> list[TraceRequest]:
    return [trace(f"r{i:02d}", gap_ms * i, think=3 + i % 4) for i in range(n)]


def comparable(result: ReplayResult) -> list[tuple[Any, ...]]:
    return [(t.req_id, t.finish_reason, t.shed_by, list(t.token_times_ms), t.report.met_all if t.report else None)
            for t in result.run.timelines.values()]


# ---- the gate ----------------------------------------------------------------------------------


def test_a_refusal_is_a_shed_counted_as_missed_never_as_a_failure(tmp_path: Path) -> None:
    profile = linear_profile()
    result = replay("vllm-fcfs+cap=3", burst(10), profile, tmp_path)
    assert result.queue_cap == 3
    refused = [t for t in result.run.timelines.values() if t.finish_reason == REFUSED]
    assert len(refused) == result.run.num_refused > 0
    assert all(t.shed_by == VALVE and is_shed(t) and len(t.token_times_ms) == 0 for t in refused)
    assert result.run.num_rejected == 0
    served = [t for t in result.run.timelines.values() if t.finish_reason != REFUSED]
    assert all(t.finish_reason == "stop" for t in served), "every admitted request runs to its end"
    summary = summarize(result)
    assert summary["submitted"] == 10 and summary["completed"] == len(served)
    assert summary["shed"] == summary["refused"] == len(refused)
    assert summary["shed_by"] == {VALVE: len(refused)}
    assert summary["good"] <= len(served), "a refused request is never good"
    assert summary["shed_notice_ms"]["p99"] == 0.0, "refused at arrival"
    assert summary["shed_notice_ms_by_reason"]["ttft"]["p50"] is None, "no TTFT or TTFAT shed"
    assert summary["queue_cap"] == 3
    assert f"{len(refused)} refused at arrival by valve, cap 3" in table([summary])


def test_the_valve_policies_are_stock_vllm_behind_the_valve() -> None:
    for name, vllm_policy in (("vllm-fcfs+cap", "fcfs"), ("vllm-priority+cap", "priority")):
        spec = POLICIES[name]
        assert spec.valve and spec.queue_cap is None and spec.meridian_policy is None
        assert spec.vllm_policy == vllm_policy
    assert not any(POLICIES[n].valve for n in ("vllm-fcfs", "vllm-priority", "meridian"))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    gaps=st.lists(st.floats(min_value=0.0, max_value=40.0), min_size=1, max_size=14),
    thinks=st.lists(st.integers(min_value=0, max_value=12), min_size=14, max_size=14),
    cap=st.integers(min_value=1, max_value=6),
)
def test_the_valve_never_lets_more_than_its_cap_be_unfinished(tmp_path: Path, gaps: list[float], thinks: list[int],
                                                             cap: int) -> None:
    profile = linear_profile(max_num_seqs=3)
    arrivals = [sum(gaps[: i + 1]) for i in range(len(gaps))]
    traces = [trace(f"r{i:02d}", a, think=thinks[i]) for i, a in enumerate(arrivals)]
    seen: list[int] = []
    valve = LoadValve(cap)

    def watching(engine: OfflineEngine, request: OfflineRequest) -> str | None:
        seen.append(engine.num_in_flight)
        assert engine.num_in_flight <= cap
        return None

    engine = replay_engine(with_queue_cap(POLICIES["vllm-fcfs+cap"], cap), offline(traces, profile), profile,
                           meridian_config=CONFIG, model_dir=model_dir_for(profile, tmp_path), arrival_gate=watching)
    engine.after_step = lambda _outputs, _tokens: seen.append(engine.num_in_flight)
    run = engine.run()
    assert max(seen) <= cap and run.peak_in_flight <= cap
    refused = {t.req_id for t in run.timelines.values() if t.finish_reason == REFUSED}
    assert len(refused) == run.num_refused
    assert all(t.finish_reason == "stop" for t in run.timelines.values() if t.req_id not in refused)
    if len(traces) <= cap:
        assert not refused, "never more requests than the cap: nothing to refuse"
    assert valve.cap == cap


def test_a_cap_that_never_binds_changes_nothing(tmp_path: Path) -> None:
    profile = linear_profile()
    traces = burst(12, gap_ms=15.0)
    stock = replay("vllm-fcfs", traces, profile, tmp_path)
    peak = stock.run.peak_in_flight
    assert 1 < peak < len(traces)
    for cap in (len(traces), peak):
        capped = replay(f"vllm-fcfs+cap={cap}", traces, profile, tmp_path)
        assert capped.run.num_refused == 0
        assert comparable(capped) == comparable(stock)
        assert capped.run.num_steps == stock.run.num_steps and capped.run.clock_ms == stock.run.clock_ms
    below = replay(f"vllm-fcfs+cap={peak - 1}", traces, profile, tmp_path)
    assert below.run.num_refused > 0, "one below the peak binds"
    prio, prio_capped = (replay(p, traces, profile, tmp_path) for p in ("vllm-priority", f"vllm-priority+cap={peak}"))
    assert comparable(prio_capped) == comparable(prio)


# ---- sizing the cap ----------------------------------------------------------------------------


def test_the_docs_sized_cap_is_every_seat_plus_the_queue_that_drains_within_the_tightest_ttft() -> None:
    assert docs_sized_queue_cap(max_num_seqs=64, capacity_rps=10.0, min_ttft_target_ms=1500.0) == 64 + 15
    assert docs_sized_queue_cap(max_num_seqs=64, capacity_rps=10.1, min_ttft_target_ms=1500.0) == 64 + 16, "ceil"
    assert docs_sized_queue_cap(max_num_seqs=1024, capacity_rps=0.001, min_ttft_target_ms=1.0) == 1025

    # By hand on a flat 10 ms profile: 16-token prompts, 3 + 1 + 2 + 1 = 7 output tokens each,
    # 4 seats. Decode: 7 steps of 10 ms shared by 4 seats = 17.5 ms per request; prefill at a
    # full 512-token chunk's 10 ms: 16 × 10 / 512 = 0.3125 ms. 1000 / 17.8125 req/s; the
    # interactive class's 40 ms target is the tightest present: 4 + ceil(2.2456) = 7.
    profile = linear_profile(max_num_seqs=4)
    requests = offline([trace("a", 0.0, slo_class="interactive"), trace("b", 5.0)], profile)
    means = WorkloadMeans.of(requests, CONFIG)
    assert (means.prompt_tokens, means.output_tokens, means.min_ttft_target_ms) == (16.0, 7.0, 40.0)
    assert valve_capacity_rps(profile, means) == pytest.approx(1000.0 / 17.8125)
    assert queue_cap_for(POLICIES["vllm-fcfs+cap"], requests, profile, CONFIG) == 4 + math.ceil(40.0 / 17.8125)
    only_standard = offline([trace("b", 5.0)], profile)
    assert queue_cap_for(POLICIES["vllm-fcfs+cap"], only_standard, profile, CONFIG) == 4 + math.ceil(50.0 / 17.8125)
    assert queue_cap_for(policy_spec("vllm-fcfs+cap=9"), requests, profile, CONFIG) == 9, "an explicit cap wins"
    assert queue_cap_for(POLICIES["vllm-fcfs"], requests, profile, CONFIG) is None


@pytest.mark.parametrize("bad", ["0", "-3", "1.5", "abc", ""])
def test_a_bad_cap_is_named(bad: str) -> None:
    with pytest.raises(ValueError, match=f"queue cap {bad!r}"):
        policy_spec(f"vllm-fcfs+cap={bad}")


def test_bad_caps_are_named_wherever_they_come_in(capsys: pytest.CaptureFixture[str]) -> None:
    for cap in (0, -1, 2.5, True, "8"):
        with pytest.raises(ValueError, match=f"queue cap {cap!r}"):
            LoadValve(cap)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=f"queue cap {cap!r}"):
            PolicySpec("x", "x", None, valve=True, queue_cap=cap)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="has no load valve"):
        with_queue_cap(POLICIES["vllm-fcfs"], 8)
    with pytest.raises(ValueError, match="needs the valve"):
        PolicySpec("x", "x", None, queue_cap=8)
    for args in (["vllm-fcfs+cap=0"], ["vllm-priority+cap=-2"]):
        assert cli_main(["replay", "--policies", *args, "--limit", "1", "--no-progress"]) == 2
        assert f"queue cap {args[0].partition('=')[2]!r}" in capsys.readouterr().err
    with pytest.raises(ValueError, match="max_num_seqs 0"):
        docs_sized_queue_cap(max_num_seqs=0, capacity_rps=1.0, min_ttft_target_ms=1.0)
    with pytest.raises(ValueError, match="capacity -1.0"):
        docs_sized_queue_cap(max_num_seqs=1, capacity_rps=-1.0, min_ttft_target_ms=1.0)


# ---- the tuned valve ---------------------------------------------------------------------------


def test_the_cap_grid_and_the_pick_by_hand() -> None:
    assert queue_cap_grid(100) == [12, 25, 38, 50, 75, 100, 125, 150, 200, 300, 400, 600, 800, 1200]
    assert queue_cap_grid(100, never_binds_at=180) == [12, 25, 38, 50, 75, 100, 125, 150, 200], \
        "one cap that never binds kept"
    assert queue_cap_grid(100, never_binds_at=30) == [12, 25, 38]
    assert queue_cap_grid(1) == [1, 2, 3, 4, 6, 8, 12]
    with pytest.raises(ValueError, match="seats >= 1, got 0"):
        queue_cap_grid(0)
    assert best_queue_cap({50: 10, 75: 14, 100: 12}) == 75
    assert best_queue_cap({50: 10, 75: 14, 100: 14}) == 100, "a tie goes to the cap refusing the fewest"
    with pytest.raises(ValueError):
        best_queue_cap({})
    # A third and two thirds of the way (geometrically) to each neighbour of the best: 40 → 60 → 80.
    assert refined_queue_caps({40: 356, 60: 418, 80: 357}) == [46, 52, 66, 73]
    assert refined_queue_caps({10: 5, 20: 9}) == [13, 16], "the best at the end: one side"
    assert refined_queue_caps({4: 1, 5: 2, 6: 1}) == [], "nothing between neighbours one apart"


def test_the_tuned_valve_is_the_best_run_of_its_grid(tmp_path: Path) -> None:
    # Two waves of twelve requests within a 40 ms TTFT target on a 4-seat engine: a deep queue
    # misses it, a valve that refuses a few lets the admitted ones meet it.
    profile = linear_profile(max_num_seqs=4)
    profile_path = tmp_path / "profile.json"
    profile_path.write_text(json.dumps(profile.to_json()))
    waves = [trace(f"w{w}-{i:02d}", 200.0 * w + 2.0 * i, think=2 + i % 3, slo_class="interactive")
             for w in range(2) for i in range(12)]
    trace_path = tmp_path / "trace.jsonl"
    trace_path.write_text("".join(json.dumps({
        "req_id": t.req_id, "arrival_ms": t.arrival_ms, "num_prompt_tokens": t.num_prompt_tokens,
        "num_think_tokens": t.num_think_tokens, "num_answer_tokens": t.num_answer_tokens,
        "slo_class": t.slo_class}) + "\n" for t in waves))
    seats = effective_seats(profile, WorkloadMeans.of(offline(waves, profile), CONFIG))
    grid = queue_cap_grid(seats, never_binds_at=len(waves))
    assert seats == 4 and grid == [1, 2, 3, 4, 5, 6, 8, 12, 16, 24]
    options = ReplayOptions(traces=(trace_path,), classes="trace", reasoning="trace", profile=str(profile_path),
                            policies=("vllm-fcfs", TUNED_VALVE), meridian_config=CONFIG, jobs=1, progress=False,
                            cache_dir=tmp_path)
    report = run_replay(options)
    assert [r.policy for r in report.runs] == ["vllm-fcfs", TUNED_VALVE]
    tuned = report.runs[1].summary
    good = {cap: summarize(replay(f"vllm-fcfs+cap={cap}", waves, profile, tmp_path))["good"] for cap in grid}
    refined = refined_queue_caps(good)
    good.update({cap: summarize(replay(f"vllm-fcfs+cap={cap}", waves, profile, tmp_path))["good"] for cap in refined})
    assert tuned["tuned_queue_caps"] == {str(cap): g for cap, g in sorted(good.items())}
    assert tuned["queue_cap"] == best_queue_cap(good) and tuned["good"] == max(good.values())
    assert tuned["good"] > report.runs[0].summary["good"], "the valve pays here: the test can tell a pick"
    assert tuned["policy"] == TUNED_VALVE
