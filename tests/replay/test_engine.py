"""The replay engine against hand-worked numbers, against itself across policies, and at scale.

Every run instantiates vLLM's real scheduler classes (stock ``AsyncScheduler`` and
``MeridianScheduler``) and drives them like ``EngineCore.step_with_batch_queue``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meridian._core import Config
from meridian.offline.engine import Timeline
from meridian.offline.tiny import ANSWER_IDS, EOS, THINK_END, WORD_IDS
from meridian.replay.policies import POLICIES, ReplayResult, policy_spec, replay_policy
from meridian.replay.profiles import Profile
from meridian.replay.report import summarize
from meridian.replay.traces import TraceRequest
from meridian.replay.workload import model_dir_for, offline_requests, prompt_token_ids, script_token

pytestmark = pytest.mark.vllm

#: One class with targets the hand-made runs can be judged against (ms).
CONFIG: dict[str, Any] = {
    "classes": {"standard": {"ttft_ms": 50.0, "ttfat_ms": 60.0, "answer_tpot_ms": 20.0, "rank": 1}},
    "default_class": "standard",
    "priority_map": {"0": "standard"},
}


def linear_profile(*, base_ms: float = 10.0, num_kv_blocks: int = 4096, max_num_seqs: int = 64,
                   per_prefill_token_ms: float = 0.0) -> Profile:
    data = {
        "name": "test-linear",
        "description": "constant-time steps for hand-worked numbers",
        "model": "linear",
        "block_size": 16,
        "num_kv_blocks": num_kv_blocks,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": 512,
        "max_model_len": 4096,
        "base_ms": base_ms,
        "per_prefill_token_ms": per_prefill_token_ms,
        "per_decode_request_ms": 0.0,
        "per_context_token_ms": 0.0,
    }
    data["sources"] = {key: "test value" for key in data if key not in ("name", "description", "model")}
    return Profile.from_json(data)


def request(req_id: str, arrival_ms: float, *, prompt: int = 16, think: int | None = 3, answer: int = 2) -> TraceRequest:
    return TraceRequest(
        req_id=req_id,
        arrival_ms=arrival_ms,
        num_prompt_tokens=prompt,
        num_output_tokens=(think or 0) + answer,
        num_think_tokens=think,
        num_answer_tokens=answer if think is not None else None,
    )


def replay(policy: str, requests: list[TraceRequest], profile: Profile, tmp_path: Path,
           config: dict[str, Any] = CONFIG) -> ReplayResult:
    return replay_policy(
        policy_spec(policy), offline_requests(requests, profile, Config.from_json(json.dumps(config))), profile,
        meridian_config=config, model_dir=model_dir_for(profile, tmp_path),
    )


def timelines(result: ReplayResult) -> list[Timeline]:
    return list(result.run.timelines.values())


def test_the_script_is_thinking_then_the_end_marker_then_the_answer_then_eos() -> None:
    r = request("a", 0.0, think=3, answer=2)
    tokens = [script_token(r, i) for i in range(7)]
    assert tokens == [WORD_IDS[0], WORD_IDS[1], WORD_IDS[2], THINK_END, ANSWER_IDS[0], ANSWER_IDS[1], EOS]
    plain = request("b", 0.0, think=None, answer=2)
    assert [script_token(plain, i) for i in range(3)] == [ANSWER_IDS[0], ANSWER_IDS[1], EOS]


def test_prompts_share_text_exactly_where_their_block_hashes_agree() -> None:
    def hashed(req_id: str, hashes: tuple[int, ...], n: int) -> list[int]:
        r = TraceRequest(req_id, 0.0, n, 4, 2, 2, prefix_block_hashes=hashes, hash_block_size=512)
        return prompt_token_ids(r)

    a = hashed("a", (1, 2, 3), 1500)
    b = hashed("b", (1, 2, 9), 1400)
    c = hashed("c", (7,), 300)
    assert len(a) == 1500 and len(b) == 1400
    assert a[:1024] == b[:1024], "shared blocks give shared text"
    assert a[1024:1100] != b[1024:1100], "a different block gives different text"
    assert a[:16] != c[:16]
    unhashed = [prompt_token_ids(request(f"u{i}", 0.0, prompt=64)) for i in range(2)]
    assert unhashed[0][:32] != unhashed[1][:32], "prompts without hashes share nothing"
    assert prompt_token_ids(request("u0", 0.0, prompt=64)) == unhashed[0], "deterministic"


def test_a_single_request_gives_the_hand_worked_timeline(tmp_path: Path) -> None:
    # Steps take 10 ms and the batch queue holds two: step k's output (output token k-1) is
    # applied at 10·k ms. 3 thinking tokens, </think>, 2 answer tokens, EOS: 7 tokens at
    # 10, 20, …, 70 ms. Its max_tokens is the context's (as for a client that sets none), so
    # vLLM has already scheduled an eighth step when the EOS comes back: the device is busy
    # until 80 ms, and the replay's clock — what its rates divide by — ends there.
    result = replay("vllm-fcfs", [request("a", 0.0)], linear_profile(), tmp_path)
    (timeline,) = timelines(result)
    assert list(timeline.token_times_ms) == [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0]
    assert timeline.finish_reason == "stop"
    report = timeline.report
    assert report.ttft_ms == 10.0
    assert report.ttfat_ms == 50.0, "the first answer token follows </think> at 40 ms"
    assert report.transition_gap_ms == 10.0
    assert report.answer_tpot_ms == 10.0
    assert report.num_think_tokens == 4 and report.num_answer_tokens == 3
    assert report.met_all, "TTFT 10 ≤ 50, TTFAT 50 ≤ 60, answer TPOT 10 ≤ 20"
    summary = summarize(result)
    assert result.run.clock_ms == 80.0
    assert summary["goodput_rps"] == pytest.approx(1 / 0.080)
    assert summary["throughput_tok_s"] == pytest.approx(7 / 0.080)
    assert summary["submitted"] == summary["completed"] == summary["good"] == 1
    assert summary["stalls"] == 0
    assert summary["preemptions"] == {"prefill": 0, "think": 0, "answer": 0}


def test_two_requests_share_steps_and_a_late_one_misses_its_ttfat(tmp_path: Path) -> None:
    # b arrives at 25 ms and joins the step scheduled at 30 ms (the loop's clock after step 3's
    # output), which runs on the device from 40 to 50 ms (step 4 holds it until 40): its tokens
    # come at 50, 60, …; 20 thinking tokens + </think> put the first answer token at 260 ms.
    requests = [request("a", 0.0), request("b", 25.0, think=20)]
    result = replay("vllm-fcfs", requests, linear_profile(), tmp_path)
    a, b = timelines(result)
    assert list(a.token_times_ms) == [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0], "b does not slow a (fixed step cost)"
    assert b.token_times_ms[0] == 50.0
    assert b.report.ttft_ms == pytest.approx(50.0 - 25.0)
    assert b.report.ttfat_ms == pytest.approx(260.0 - 25.0)
    assert not b.report.met_all
    summary = summarize(result)
    assert summary["good"] == 1 and summary["completed"] == 2
    assert summary["attainment"] == 0.5


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_with_ample_capacity_every_policy_streams_the_same_tokens_at_the_same_pace(policy: str, tmp_path: Path) -> None:
    requests = [request(f"r{i}", 7.0 * i, prompt=24 + i, think=3 + i % 4, answer=2 + i % 3) for i in range(8)]
    requests.append(request("plain", 3.0, think=None, answer=4))
    profile = linear_profile()
    reference = replay("vllm-fcfs", requests, profile, tmp_path)
    result = replay(policy, requests, profile, tmp_path)
    for ref, got in zip(timelines(reference), timelines(result), strict=True):
        assert got.finish_reason == ref.finish_reason == "stop"
        assert got.report.num_think_tokens == ref.report.num_think_tokens
        assert got.report.num_answer_tokens == ref.report.num_answer_tokens
        assert got.report.ttft_ms == ref.report.ttft_ms, got.req_id
        assert got.report.ttfat_ms == ref.report.ttfat_ms, got.req_id
        if policy == "pascal":
            # PASCAL paces answers at the TPOT target (20 ms × 0.9 headroom): slower on purpose,
            # never slower than the target.
            assert ref.report.answer_tpot_ms <= got.report.answer_tpot_ms <= CONFIG["classes"]["standard"]["answer_tpot_ms"]
        else:
            assert list(got.token_times_ms) == list(ref.token_times_ms), got.req_id
    assert summarize(result)["preemptions"] == {"prefill": 0, "think": 0, "answer": 0}


def test_ten_thousand_requests_all_complete(tmp_path: Path) -> None:
    requests = [
        request(f"r{i}", 2.0 * i, prompt=16 + i % 48, think=(i % 7) if i % 5 else None, answer=1 + i % 3)
        for i in range(10_000)
    ]
    profile = linear_profile(base_ms=5.0, num_kv_blocks=2048, max_num_seqs=128)
    result = replay("meridian", requests, profile, tmp_path)
    summary = summarize(result)
    assert summary["submitted"] == summary["completed"] == 10_000
    assert all(t.finish_reason == "stop" for t in timelines(result))


@pytest.mark.parametrize("policy", ["vllm-fcfs", "meridian"])
def test_a_thinking_budget_ends_the_scripted_reasoning_for_every_policy(policy: str, tmp_path: Path) -> None:
    config = {**CONFIG, "thinking_control": {"budget_tokens": 2}}
    profile = linear_profile()
    a, b = timelines(replay(policy, [request("a", 0.0, think=5), request("b", 0.0, think=1)], profile, tmp_path, config))
    # a: 2 thinking words, the forced </think>, 2 answer tokens, EOS — at 10, 20, …, 60 ms.
    assert list(a.token_times_ms) == [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    assert a.thinking_stopped_by == "budget"
    assert (a.report.num_think_tokens, a.report.num_answer_tokens) == (3, 3)
    assert a.report.ttfat_ms == 40.0, "the answer starts right after the forced marker"
    assert b.thinking_stopped_by is None, "a reasoning shorter than the budget ends on its own"
    assert b.report.num_think_tokens == 2


def test_the_load_aware_budget_tightens_on_the_observed_attainment(tmp_path: Path) -> None:
    config = {
        "classes": {"standard": {"ttft_ms": 1.0, "ttfat_ms": 1.0, "answer_tpot_ms": 1.0, "rank": 1}},
        "default_class": "standard",
        "priority_map": {"0": "standard"},
        "thinking_control": {"load_aware": {"budget_tokens": 6, "min_budget_tokens": 2, "attainment_floor": 0.9}},
        "overload": {"on_overload": "queue"},
    }
    profile = linear_profile()
    result = replay("meridian", [request("first", 0.0, think=9), request("later", 1_000.0, think=9)], profile,
                    tmp_path, config)
    first, later = timelines(result)
    assert first.thinking_stopped_by == later.thinking_stopped_by == "load_aware_budget"
    assert first.report.num_think_tokens == 6 + 1, "no completion yet: the full budget"
    assert later.report.num_think_tokens == 2 + 1, "the class missed every target: the minimum"
    summary = summarize(result)
    assert summary["thinking_stops"] == 2 and summary["thinking_tokens"] == 10


def test_rules_that_need_logits_are_refused() -> None:
    from meridian.replay.runner import check_classes

    with pytest.raises(ValueError, match="eat, proxy and rpdi"):
        check_classes([request("a", 0.0)], {**CONFIG, "thinking_control": {"proxy": {}}})
    check_classes([request("a", 0.0)], {**CONFIG, "thinking_control": {"budget_tokens": 64}})


def test_first_minute_counts_the_requests_that_arrived_within_60_s_of_the_first(tmp_path: Path) -> None:
    # Arrivals at 5 s, 40 s and 64.9 s are the cohort (within 60 s of the first at 5 s); 65 s and
    # 90 s are not. The one at 40 s thinks past its 60 ms TTFAT target (10 ms steps): not good.
    requests = [request("a", 5_000.0), request("b", 40_000.0, think=12), request("c", 64_900.0),
                request("d", 65_000.0), request("e", 90_000.0, think=12)]
    summary = summarize(replay("meridian", requests, linear_profile(), tmp_path))
    assert summary["first_minute"] == {"submitted": 3, "good": 2, "attainment": 2 / 3}
    assert summary["good"] == 3
