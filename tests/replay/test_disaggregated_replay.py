"""The disaggregated replay (``meridian.replay.disaggregated``): a prefill pool and a decode pool
with vLLM's own NixlConnector scheduler side on each engine and the link simulated
(``offline.engine.RemoteKvLink``): every request is prefilled on one side and decoded on the
other, the decode side reads the prompt's KV instead of computing it, the read's cost shows in the
client's first token, the prefill side's blocks are held until read and then freed, a shed on the
prefill side is the client's answer, and bad flags are named.

Stated costs: every step 10 ms plus 1 ms per prompt token computed, so a prompt computed on the
decode side would show.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meridian._core import Config
from meridian.offline.engine import OfflineEngine, OfflineRequest, TransferCost
from meridian.replay.disaggregated import Split, pd_summary, replay_disaggregated, split_policy
from meridian.replay.fleet import Retries, Router
from meridian.replay.policies import policy_spec, replay_engine
from meridian.replay.profiles import Profile
from meridian.replay.runner import ReplayOptions, run_replay
from meridian.replay.traces import TraceRequest
from meridian.replay.workload import model_dir_for, offline_requests
from replay_profiles import linear_profile

CONFIG: dict[str, Any] = {
    "classes": {
        "rush": {"ttft_ms": 1.0, "ttfat_ms": 60_000.0, "answer_tpot_ms": 100.0, "rank": 0},
        "calm": {"ttft_ms": 600_000.0, "ttfat_ms": 900_000.0, "answer_tpot_ms": 1000.0, "rank": 1},
    },
    "default_class": "calm",
    "priority_map": {"0": "calm"},
    "think_tokens_prior": [40],
    "answer_tokens_prior": [10],
}
NUM_PROMPT_TOKENS = 64
ONE_TO_ONE = Split(1, 1)


def profile(max_num_seqs: int = 8) -> Profile:
    return linear_profile(
        "test-pd", "10 ms steps + 1 ms per prompt token", num_kv_blocks=512, max_num_seqs=max_num_seqs,
        per_prefill_token_ms=1.0,
    )


def request(req_id: str, arrival_ms: float, slo_class: str = "calm", think: int = 20) -> OfflineRequest:
    trace = TraceRequest(req_id=req_id, arrival_ms=arrival_ms, num_prompt_tokens=NUM_PROMPT_TOKENS,
                         num_output_tokens=think + 3, num_think_tokens=think, num_answer_tokens=3, slo_class=slo_class)
    (offline,) = offline_requests([trace], profile(), Config.from_json(json.dumps(CONFIG)))
    return offline


def pools(tmp_path: Path, cost: TransferCost, policy: str = "vllm-fcfs", split: Split = ONE_TO_ONE) -> tuple[
    list[OfflineEngine], list[OfflineEngine]
]:
    prof = profile()
    prefill_name, decode_name = split_policy(policy)

    def engine(name: str, role: str) -> OfflineEngine:
        return replay_engine(policy_spec(name), [], prof, meridian_config=CONFIG, model_dir=model_dir_for(prof, tmp_path),
                             kv_role=role, transfer_cost=cost)

    return ([engine(prefill_name, "kv_producer") for _ in range(split.num_prefill)],
            [engine(decode_name, "kv_consumer") for _ in range(split.num_decode)])


def replay(tmp_path: Path, requests: list[OfflineRequest], cost: TransferCost, policy: str = "vllm-fcfs",
           split: Split = ONE_TO_ONE, retries: Retries | None = None) -> Any:
    prefill, decode = pools(tmp_path, cost, policy, split)
    run = replay_disaggregated(prefill, decode, requests, Router("round_robin", split.num_prefill),
                               Router("round_robin", split.num_decode), retries)
    return run, prefill, decode


def test_split_and_pair_names_are_checked() -> None:
    assert Split.parse("1:3") == Split(1, 3) and str(Split(2, 6)) == "2:6" and Split(2, 6).num_engines == 8
    for bad in ("0:2", "3", "a:b", "1:2:3"):
        with pytest.raises(ValueError, match=f"--disaggregated '{bad}'"):
            Split.parse(bad)
    assert split_policy("meridian") == ("meridian", "meridian")
    assert split_policy("vllm-fcfs/meridian") == ("vllm-fcfs", "meridian")
    with pytest.raises(ValueError, match="P/D policy 'a/'"):
        split_policy("a/")


@pytest.mark.vllm
@pytest.mark.parametrize("policy", ["vllm-fcfs", "meridian", "vllm-fcfs/meridian"])
def test_every_request_is_prefilled_on_one_side_and_read_on_the_other(tmp_path: Path, policy: str) -> None:
    requests = [request(f"r{i}", 150.0 * i) for i in range(6)]
    run, prefill, decode = replay(tmp_path, requests, TransferCost(0.05, 1.0), policy, Split(1, 2))
    assert run.outcomes.keys() == {r.req_id for r in requests}
    assert all(t.finish_reason == "stop" and len(t.token_times_ms) == 25 for t in run.outcomes.values())
    # Each decode side read its request's prompt (whole blocks of it), and computed no prompt.
    assert run.num_reads == 6 and run.num_read_tokens == 6 * NUM_PROMPT_TOKENS
    decode_prompt_steps = [n for e in decode for n in e.result.scheduled_tokens_per_step if n > 8]
    assert decode_prompt_steps == [], "the decode side computed a prompt it should have read"
    # The prefill side held each request's blocks until read, then freed every one of them.
    assert run.num_sends == 6
    assert all(e.result.final_num_free_blocks == e.result.max_num_free_blocks for e in [*prefill, *decode])
    meridian_decode = [e for e in decode if hasattr(e.scheduler, "meridian")]
    for engine in meridian_decode:
        counters = engine.scheduler.meridian.handoff_counters()
        assert counters["num_received"] == len(engine.result.timelines)
    summary = pd_summary(run, policy)
    assert summary["submitted"] == 6 and summary["pools"]["ended_on_prefill"] == 0
    assert summary["handoff"]["reads"] == 6 and summary["num_engines"] == 3


@pytest.mark.vllm
def test_the_reads_cost_shows_in_the_first_token(tmp_path: Path) -> None:
    first = {}
    for ms_per_token in (0.0, 2.0):
        run, _, _ = replay(tmp_path, [request("r0", 0.0)], TransferCost(ms_per_token, 0.0))
        first[ms_per_token] = run.outcomes["r0"].token_times_ms[0]
    read_ms = NUM_PROMPT_TOKENS * 2.0
    # The read ends mid-way between steps: the first token comes at most one step after it.
    assert read_ms <= first[2.0] - first[0.0] <= read_ms + 11.0, first


@pytest.mark.vllm
def test_a_shed_on_the_prefill_side_is_the_clients_answer(tmp_path: Path) -> None:
    # Meridian's gate on the prefill side refuses a request whose 1 ms TTFT it cannot meet.
    requests = [request("rush", 0.0, slo_class="rush")]
    run, prefill, _ = replay(tmp_path, requests, TransferCost(0.05), "meridian", retries=Retries(attempts=2))
    outcome = run.outcomes["rush"]
    assert outcome.finish_reason == "refused" and not outcome.token_times_ms
    assert run.attempts["rush"] == [(0, None), (0, None)], "retried once on the prefill side, never decoded"
    assert run.num_reads == 0 and prefill[0].result.final_num_free_blocks == prefill[0].result.max_num_free_blocks


@pytest.mark.vllm
def test_the_replay_runs_both_layouts_and_names_bad_flags(tmp_path: Path) -> None:
    base = ReplayOptions(limit=12, progress=False, jobs=1, cache_dir=tmp_path)
    report = run_replay(
        ReplayOptions(**{**base.__dict__, "policies": ("vllm-fcfs", "vllm-fcfs/meridian"), "disaggregated": "1:1"})
    )
    rows = {r.policy: r.summary for r in report.runs}
    assert list(rows) == ["vllm-fcfs", "vllm-fcfs P/D 1:1", "vllm-fcfs/meridian P/D 1:1"]
    assert rows["vllm-fcfs"]["fleet"] == 2 and rows["vllm-fcfs P/D 1:1"]["handoff"]["reads"] > 0
    assert all(s["submitted"] == 12 for s in rows.values())
    assert report.workload["disaggregated"]["split"] == "1:1"
    for changes, message in [
        ({"policies": ("vllm-fcfs/meridian",)}, "needs --disaggregated"),
        ({"disaggregated": "0:1"}, "--disaggregated '0:1'"),
        ({"disaggregated": "1:1", "policies": ("vllm-fcfs+cap*",)}, "explicit cap"),
        ({"disaggregated": "1:1", "policies": ("vllm-fcfs/nope",)}, "unknown policy 'nope'"),
        ({"disaggregated": "1:1", "transfer_gbps": 0.0}, "--transfer-gbps 0.0"),
        ({"transfer_gbps": 10.0}, "need --disaggregated"),
    ]:
        with pytest.raises(ValueError, match=message):
            run_replay(ReplayOptions(**{**base.__dict__, **changes}))


#: Classes that queue rather than shed, so the order of the loads, not triage, decides.
CAPPED_CONFIG: dict[str, Any] = {
    **CONFIG,
    "classes": {
        "rush": {"ttft_ms": 2_000.0, "ttfat_ms": 60_000.0, "answer_tpot_ms": 100.0, "rank": 0, "on_overload": "queue"},
        "calm": {"ttft_ms": 600_000.0, "ttfat_ms": 900_000.0, "answer_tpot_ms": 1000.0, "rank": 1,
                 "on_overload": "queue"},
    },
}


@pytest.mark.vllm
def test_a_capped_decode_side_starts_loads_while_full_and_a_higher_class_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM 0.34's ``--max-num-inflight-kv-loads`` on the decode side (two seats, a cap of two): its
    hand-offs start their loads while both seats are taken, never more than two hold blocks for a
    load, every request completes; under Meridian the rush class's loads go before the calm
    hand-offs that reached the decode side first (a stock FCFS prefill side hands them over in
    arrival order), so the rush class's first tokens come sooner than under stock vLLM there."""
    from vllm.config import SchedulerConfig

    seats_profile = profile(max_num_seqs=2)
    if "max_num_inflight_kv_loads" not in SchedulerConfig.__dataclass_fields__:
        with pytest.raises(ValueError, match="max_num_inflight_kv_loads=2: this vLLM has no async KV-load queue"):
            replay_engine(policy_spec("meridian"), [], seats_profile, meridian_config=CAPPED_CONFIG,
                          model_dir=model_dir_for(seats_profile, tmp_path), kv_role="kv_consumer",
                          max_num_inflight_kv_loads=2)
        pytest.skip("vLLM before 0.34 has no async KV-load queue (refused by name, above)")
    rush_ttft: dict[str, float] = {}
    for policy in ("vllm-fcfs/vllm-fcfs", "vllm-fcfs/meridian"):
        prefill_name, decode_name = split_policy(policy)
        model_dir = model_dir_for(seats_profile, tmp_path)
        cost = TransferCost(0.5, 1.0)
        prefill = [replay_engine(policy_spec(prefill_name), [], seats_profile, meridian_config=CAPPED_CONFIG,
                                 model_dir=model_dir, kv_role="kv_producer", transfer_cost=cost)]
        decode = [replay_engine(policy_spec(decode_name), [], seats_profile, meridian_config=CAPPED_CONFIG,
                                model_dir=model_dir, kv_role="kv_consumer", transfer_cost=cost,
                                max_num_inflight_kv_loads=2)]
        scheduler = decode[0].scheduler
        holding: list[tuple[int, int]] = []
        schedule = scheduler.schedule

        def counted(*args: Any, _schedule: Any = schedule, _scheduler: Any = scheduler) -> Any:
            output = _schedule(*args)
            counts = _scheduler._kv_fetch_counts
            holding.append((counts["in_progress"] + counts["completed_waiting"], len(_scheduler.running)))
            return output

        monkeypatch.setattr(scheduler, "schedule", counted)
        calm = [request(f"calm{i}", float(i), "calm", think=60) for i in range(8)]
        rush = [request(f"rush{i}", 10.0 + i, "rush", think=60) for i in range(3)]
        run = replay_disaggregated(prefill, decode, [*calm, *rush], Router("round_robin", 1), Router("round_robin", 1))
        assert all(t.finish_reason == "stop" for t in run.outcomes.values()), run.outcomes
        assert max(n for n, _ in holding) == 2, "the cap binds and holds"
        assert any(n > 0 and running == 2 for n, running in holding), "loads start while both seats are taken"
        rush_ttft[policy] = sum(run.outcomes[r.req_id].token_times_ms[0] - r.arrival_ms for r in rush) / len(rush)
    # Measured: 2.64 s against 3.03 s.
    assert rush_ttft["vllm-fcfs/meridian"] < 0.9 * rush_ttft["vllm-fcfs/vllm-fcfs"], rush_ttft
