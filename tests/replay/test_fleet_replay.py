"""The fleet replay (``meridian.replay.fleet``): the router models' picks, and the replay of a
saturated engine beside an idle one — a shed retried on the other engine, the client's clock
kept from the first send, retries bounded, and a retry that reports its wait judged by it.

Stated costs as in ``test_dp_balance.py``: every step 10 ms. Engine 0 is saturated before the
test's requests arrive: two holders of the queueing class ``calm`` take its two seats for 3 s
(300 thinking tokens); a ``rush`` request (TTFT target 200 ms, shed) arriving there would wait
seconds, so Meridian's gate refuses it at arrival, and the router sends it elsewhere.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meridian._core import Config
from meridian.offline.engine import OfflineEngine, OfflineRequest
from meridian.replay.fleet import Retries, Router, fleet_summary, replay_fleet
from meridian.replay.policies import policy_spec, replay_engine
from meridian.replay.profiles import Profile
from meridian.replay.traces import TraceRequest
from meridian.replay.workload import model_dir_for, offline_requests
from replay_profiles import linear_profile

CONFIG: dict[str, Any] = {
    "classes": {"rush": {"ttft_ms": 200.0, "ttfat_ms": 60_000.0, "answer_tpot_ms": 100.0, "rank": 0},
                "calm": {"ttft_ms": 600_000.0, "ttfat_ms": 900_000.0, "answer_tpot_ms": 1000.0, "rank": 1,
                         "on_overload": "queue"}},
    "default_class": "calm",
    "priority_map": {"0": "calm"},
    "think_tokens_prior": [400],
    "answer_tokens_prior": [100],
}


def test_round_robin_counts_every_attempt_and_power_of_two_takes_the_lighter() -> None:
    rr = Router("round_robin", 3)
    (req,) = [object()]
    assert [rr.pick(req) for _ in range(5)] == [0, 1, 2, 0, 1]  # type: ignore[arg-type]
    p2 = Router("power_of_two", 2, seed=3)
    p2._snapshots = [{"expected_output_tokens": 10_000.0}, {"expected_output_tokens": 10.0}]
    assert {p2.pick(req) for _ in range(20)} == {1}  # type: ignore[arg-type]
    blind = Router("power_of_two", 2, seed=3)
    assert {blind.pick(req) for _ in range(50)} == {0, 1}, "no load (stock vLLM): a blind pick"  # type: ignore[arg-type]
    least = Router("least_requests", 2)
    least.in_flight = [5, 2]
    assert least.pick(req) == 1  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown router 'nearest'"):
        Router("nearest", 2)
    with pytest.raises(ValueError, match="attempts=0"):
        Retries(attempts=0)


def profile() -> Profile:
    """Every step 10 ms, two seats."""
    return linear_profile("test-fleet", "10 ms steps", max_num_seqs=2)


def offline(req_id: str, arrival_ms: float, slo_class: str, think: int) -> OfflineRequest:
    trace = TraceRequest(req_id=req_id, arrival_ms=arrival_ms, num_prompt_tokens=32, num_output_tokens=think + 3,
                         num_think_tokens=think, num_answer_tokens=3, slo_class=slo_class)
    (request,) = offline_requests([trace], profile(), Config.from_json(json.dumps(CONFIG)))
    return request


def fleet(tmp_path: Path, policy: str = "meridian") -> list[OfflineEngine]:
    """Two engines of ``policy``; engine 0's seats taken by ``calm`` holders."""
    prof = profile()
    engines = [replay_engine(policy_spec(policy), [], prof, meridian_config=CONFIG,
                             model_dir=model_dir_for(prof, tmp_path)) for _ in range(2)]
    for i in range(2):
        engines[0].submit(offline(f"hold{i}", 0.0, "calm", think=300))
    engines[0].advance_to(100.0)
    return engines


def rushes(n: int, start_ms: float = 200.0) -> list[OfflineRequest]:
    return [offline(f"rush{i}", start_ms + 40.0 * i, "rush", think=2) for i in range(n)]


@pytest.mark.vllm
def test_a_request_refused_by_the_saturated_engine_is_served_on_the_idle_one(tmp_path: Path) -> None:
    engines = fleet(tmp_path)
    requests = rushes(6)
    run = replay_fleet(engines, requests, Router("round_robin", 2), Retries(attempts=3))
    assert run.outcomes.keys() == {r.req_id for r in requests}, "every request has one outcome"
    served = {req_id: t for req_id, t in run.outcomes.items() if t.finish_reason == "stop"}
    assert len(served) == 6, {k: (t.finish_reason, run.attempts[k]) for k, t in run.outcomes.items()}
    bounced = [a for a in run.attempts.values() if a[0] == 0]
    # Round robin counts every attempt, so a retry may meet the saturated engine again (as
    # vllm-router's does): every attempt there is refused, the last one lands on the idle one.
    assert bounced and all(a[-1] == 1 and set(a[:-1]) == {0} for a in bounced), run.attempts
    assert run.num_retries == sum(len(a) - 1 for a in bounced)
    # The client's clock runs from the first send: the outcome's arrival, and its report's.
    for r in requests:
        outcome = run.outcomes[r.req_id]
        assert outcome.arrival_ms == r.arrival_ms and outcome.report is not None
        assert outcome.report.arrival_ms == pytest.approx(r.arrival_ms)
    summary = fleet_summary(run, "meridian")
    assert summary["retries"] == run.num_retries and summary["submitted"] == 6
    assert sum(e["outcomes"] for e in summary["engines"]) == 6 and summary["engines"][1]["outcomes"] == 6


@pytest.mark.vllm
def test_without_retries_the_refusal_is_the_clients_answer(tmp_path: Path) -> None:
    run = replay_fleet(fleet(tmp_path), rushes(6), Router("round_robin", 2), Retries(attempts=1))
    refused = [k for k, t in run.outcomes.items() if t.finish_reason == "refused"]
    assert refused and all(run.attempts[k] == [0] for k in refused) and run.num_retries == 0


@pytest.mark.vllm
@pytest.mark.parametrize(("reports_wait", "outcome"), [(False, "stop"), (True, "refused")])
def test_a_retry_that_reports_its_wait_is_refused_once_that_wait_spent_its_target(
        tmp_path: Path, reports_wait: bool, outcome: str) -> None:
    """A 300-ms backoff spends the 200-ms TTFT target before the retry is sent: told so, the idle
    engine's gate refuses it at once (the client hears a final shed); not told, it serves it,
    late by the client's clock — a miss either way, but only one answers at once."""
    (first,) = rushes(1)
    run = replay_fleet(fleet(tmp_path), [first], Router("round_robin", 2),
                       Retries(attempts=2, initial_backoff_ms=300.0, reports_wait=reports_wait))
    assert run.attempts[first.req_id] == [0, 1]
    result = run.outcomes[first.req_id]
    assert result.finish_reason == outcome
    assert result.report is not None and not result.report.met_all
