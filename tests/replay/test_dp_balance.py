"""The data-parallel replay (``meridian.replay.dp``): vLLM's count rule checked against vLLM's own
``DPLBAsyncMPClient``, the phase-weighted rule against the rank cores' ``engine_load``, and the
replay itself (one rank replays exactly as ``OfflineEngine.run``; over two, every request is
served once).

Stated costs: a linear profile, every step 10 ms whatever it holds; one class whose length priors
are 400 thinking and 100 answer tokens, so a fresh reasoning request weighs 1 in the
phase-weighted queue (500 expected tokens) and an answering one at most 100 / 500 = 0.2.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from meridian._core import Config
from meridian.offline.engine import OfflineEngine
from meridian.replay.dp import ApiServerBalancer, RankStats, rank_stats, replay_data_parallel, replay_ranks
from meridian.replay.policies import policy_spec, replay_engine, replay_policy
from meridian.replay.profiles import Profile
from meridian.replay.traces import TraceRequest
from meridian.replay.workload import model_dir_for, offline_requests
from replay_profiles import linear_profile

CONFIG: dict[str, Any] = {
    "classes": {"standard": {"ttft_ms": 60_000.0, "ttfat_ms": 120_000.0, "answer_tpot_ms": 100.0, "rank": 1}},
    "default_class": "standard",
    "priority_map": {"0": "standard"},
    "think_tokens_prior": [400],
    "answer_tokens_prior": [100],
}


def profile(num_kv_blocks: int = 4096) -> Profile:
    return linear_profile("test-dp", "10 ms steps", num_kv_blocks=num_kv_blocks)


def request(req_id: str, arrival_ms: float, *, think: int, answer: int, prompt: int = 32) -> TraceRequest:
    return TraceRequest(req_id=req_id, arrival_ms=arrival_ms, num_prompt_tokens=prompt,
                        num_output_tokens=think + answer, num_think_tokens=think, num_answer_tokens=answer)


def offline(requests: list[TraceRequest], prof: Profile) -> list[Any]:
    return offline_requests(requests, prof, Config.from_json(json.dumps(CONFIG)))


def mixed_trace(n: int, seed: int, gap_ms: float = 30.0) -> list[TraceRequest]:
    rng = random.Random(seed)
    return [request(f"r{i}", i * gap_ms, prompt=rng.randint(16, 1500), think=rng.randint(1, 400),
                    answer=rng.randint(1, 120)) for i in range(n)]


# ---- vLLM's count rule, transcribed: checked against vLLM's own function ------------------------


@pytest.mark.vllm
@pytest.mark.parametrize("client_count", [1, 2])
def test_the_count_rule_picks_what_vllms_own_client_picks(client_count: int) -> None:
    """Random publications, picks and finishes: ``ApiServerBalancer("count")`` and vLLM's
    ``DPLBAsyncMPClient.get_core_engine_for_request`` (run on a stand-in client object) agree on
    every pick, with three ranks so the rotation is visible."""
    from vllm.v1.engine.core_client import DPLBAsyncMPClient

    rng = random.Random(client_count)
    num_ranks = 3
    for client_index in range(client_count):
        engines = [rank.to_bytes(2, "little") for rank in range(num_ranks)]
        # vLLM 0.33 also reads the client's streaming sessions and a request's ``resumable``.
        theirs = SimpleNamespace(lb_engines=[[0, 0, 0.0] for _ in engines], engine_inflight=Counter(),
                                 core_engines=engines, client_count=client_count, reqs_in_flight={},
                                 eng_start_index=num_ranks * client_index // client_count, streaming_reqs=set())
        mine = ApiServerBalancer("count", num_ranks, client_count, client_index)
        for i in range(400):
            op = rng.random()
            if op < 0.15:
                stats = [RankStats(rng.randint(0, 6), rng.randint(0, 8), rng.choice([0.0, 0.3, 0.6, 0.95]), None)
                         for _ in engines]
                theirs.lb_engines = [[s.num_waiting, s.num_running, s.kv_cache_usage] for s in stats]
                mine.on_published(stats)
            elif op < 0.35 and theirs.reqs_in_flight:
                req_id = rng.choice(sorted(theirs.reqs_in_flight))
                engine = theirs.reqs_in_flight.pop(req_id)
                theirs.engine_inflight[engine] -= 1
                mine.in_flight[engines.index(engine)].discard(req_id)
            else:
                req_id = f"q{i}"
                new = SimpleNamespace(request_id=req_id, data_parallel_rank=None, pooling_params=None, resumable=False)
                expected = engines.index(DPLBAsyncMPClient.get_core_engine_for_request(theirs, new))
                assert mine.pick(req_id) == expected, f"pick {i}"


def test_count_breaks_ties_by_rotation_and_penalises_a_queue_on_a_full_cache() -> None:
    balancer = ApiServerBalancer("count", 2)
    assert [balancer.pick(f"r{i}") for i in range(4)] == [0, 1, 0, 1]
    balancer = ApiServerBalancer("count", 2)
    # Rank 0: 2 waiting + 4 running on a full cache: 6 + 2 × 6 × 0.5 = 12; rank 1: 10 running.
    balancer.on_published([RankStats(2, 4, 1.0, None), RankStats(0, 10, 1.0, None)])
    assert balancer.pick("a") == 1
    balancer = ApiServerBalancer("count", 2)
    balancer.on_published([RankStats(2, 4, 0.5, None), RankStats(0, 10, 1.0, None)])
    assert balancer.pick("a") == 0, "no penalty at half usage: 6 < 10"


def test_phase_weighted_ranks_by_the_queue_and_raises_the_pick_until_the_next_publication() -> None:
    balancer = ApiServerBalancer("phase_weighted", 2)
    balancer.on_published([RankStats(0, 9, 0.9, 0.6), RankStats(0, 2, 0.1, 1.9)])
    assert balancer.pick("a") == 0, "nine nearly done requests weigh less than two fresh thinkers"
    assert balancer.stats[0][3] == pytest.approx(1.6), "a fresh request weighs one"
    assert balancer.pick("b") == 0
    assert balancer.pick("c") == 1, "2.6 > 1.9 now"
    with pytest.raises(ValueError, match="Meridian core"):
        balancer.on_published([RankStats(0, 0, 0.0, None), RankStats(0, 0, 0.0, 0.0)])


# ---- the replay ---------------------------------------------------------------------------------


@pytest.mark.vllm
@pytest.mark.parametrize(("policy", "balancer"),
                         [("vllm-fcfs", "count"), ("meridian", "count"), ("meridian", "phase_weighted")])
def test_one_rank_replays_exactly_as_run(tmp_path: Path, policy: str, balancer: str) -> None:
    """``advance_to`` + ``submit`` + ``finish`` (with stats read on every 100 ms tick) is the
    same loop as ``run``: a KV cache of 4096 tokens (257 blocks, one is vLLM's null block) for prompts up to 1500 tokens
    forces preemptions, and every token comes at the same virtual time."""
    prof = profile(num_kv_blocks=257)
    requests = offline(mixed_trace(40, seed=1), prof)
    model_dir = model_dir_for(prof, tmp_path)
    whole = replay_policy(policy_spec(policy), requests, prof, meridian_config=CONFIG, model_dir=model_dir).run
    dp = replay_ranks(policy_spec(policy), requests, prof, balancer, num_ranks=1, meridian_config=CONFIG,
                      model_dir=model_dir)
    (ranked,) = dp.ranks
    assert sum(r.num_preemptions_think + r.num_preemptions_answer + r.num_preemptions_prefill
               for r in whole.reports) > 0, "the run must preempt to test the loop"
    assert ranked.timelines.keys() == whole.timelines.keys()
    for req_id, timeline in whole.timelines.items():
        assert list(ranked.timelines[req_id].token_times_ms) == list(timeline.token_times_ms), req_id
        assert ranked.timelines[req_id].finish_reason == timeline.finish_reason
    assert (ranked.num_steps, ranked.clock_ms, ranked.device_busy_ms) == (whole.num_steps, whole.clock_ms,
                                                                         whole.device_busy_ms)


@pytest.mark.vllm
@pytest.mark.parametrize("balancer", ["count", "phase_weighted"])
@pytest.mark.parametrize("stats_interval_ms", [100.0, 0.0])
def test_every_request_is_served_exactly_once_across_two_ranks(tmp_path: Path, balancer: str,
                                                               stats_interval_ms: float) -> None:
    prof = profile()
    requests = offline(mixed_trace(30, seed=2, gap_ms=20.0), prof)
    run = replay_ranks(policy_spec("meridian"), requests, prof, balancer, num_ranks=2, meridian_config=CONFIG,
                       model_dir=model_dir_for(prof, tmp_path), stats_interval_ms=stats_interval_ms,
                       num_api_servers=2)
    ids = {r.req_id for r in requests}
    assert run.assignment.keys() == ids
    for rank, rank_run in enumerate(run.ranks):
        assert rank_run.timelines.keys() == {r for r, k in run.assignment.items() if k == rank}
        assert rank_run.timelines, "both ranks serve"
    merged = run.merged()
    assert merged.timelines.keys() == ids
    assert all(t.finish_reason == "stop" and t.report is not None for t in merged.timelines.values())
    assert merged.num_steps == sum(r.num_steps for r in run.ranks)
    assert merged.clock_ms == max(r.clock_ms for r in run.ranks)


def _ranks_after_setup(tmp_path: Path) -> tuple[list[OfflineEngine], Profile]:
    """Rank 0 holds three requests past their thinking (2 thinking tokens, then 90 answer
    tokens), rank 1 two fresh thinkers (1,000 thinking tokens); both advanced to 300 ms (30
    steps: rank 0's requests about 26 answer tokens in, rank 1's about 29 thinking tokens)."""
    prof = profile()
    engines = [replay_engine(policy_spec("meridian"), [], prof, meridian_config=CONFIG,
                             model_dir=model_dir_for(prof, tmp_path)) for _ in range(2)]
    for r in offline([request(f"done{i}", 0.0, think=2, answer=90) for i in range(3)], prof):
        engines[0].submit(r)
    for r in offline([request(f"fresh{i}", 0.0, think=1000, answer=10) for i in range(2)], prof):
        engines[1].submit(r)
    for engine in engines:
        engine.advance_to(300.0)
    return engines, prof


@pytest.mark.vllm
def test_phase_weighted_sends_an_arrival_to_the_rank_past_its_thinking_count_does_not(tmp_path: Path) -> None:
    engines, _ = _ranks_after_setup(tmp_path)
    stats = [rank_stats(engine) for engine in engines]
    assert [(s.num_waiting, s.num_running) for s in stats] == [(0, 3), (0, 2)]
    answering, thinking = stats[0].phase_weighted_queue, stats[1].phase_weighted_queue
    assert answering is not None and thinking is not None
    assert answering < 3 * 0.2, f"three answering requests, each under 0.2: {answering}"
    assert thinking > 1.8, f"two fresh thinkers, each near 1: {thinking}"
    picks = {}
    for balancer in ("count", "phase_weighted"):
        client = ApiServerBalancer(balancer, 2)
        client.in_flight = [{"done0", "done1", "done2"}, {"fresh0", "fresh1"}]  # it routed them
        client.on_published(stats)
        picks[balancer] = client.pick("new")
    assert picks == {"count": 1, "phase_weighted": 0}


@pytest.mark.vllm
@pytest.mark.parametrize(("balancer", "expected_rank"), [("count", 1), ("phase_weighted", 0)])
def test_the_replay_routes_an_arrival_by_the_published_state(tmp_path: Path, balancer: str,
                                                            expected_rank: int) -> None:
    """The same two ranks, then an arrival at 300 ms through ``replay_data_parallel`` (stats
    published on the 100 ms ticks): each balancer's pick, and every request served once."""
    engines, prof = _ranks_after_setup(tmp_path)
    (new,) = offline([request("new", 300.0, think=50, answer=20)], prof)
    run = replay_data_parallel(engines, [new], balancer)
    assert run.assignment == {"new": expected_rank}
    served = [set(r.timelines) for r in run.ranks]
    assert served[expected_rank] >= {"new"} and not served[1 - expected_rank] & {"new"}
    assert all(t.finish_reason == "stop" for r in run.ranks for t in r.timelines.values())
