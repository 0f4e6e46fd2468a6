"""The live A/B's reading of aiperf's exports, its workload and its server arguments, on
hand-made raw records (the live test runs the real aiperf: ``tests/live/test_loadgen_live.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meridian.demo.loadgen import (
    LIVE_MODELS, ClassTargets, RecordTimes, Workload, is_good, outputs_by_prompt, parse_raw_record, parse_record, record_metrics,
    server_args,
)
from meridian.vllm.names import MIDDLEWARE

REPO = Path(__file__).resolve().parents[2]
GOLD = ClassTargets("gold", 1.0, ttft_ms=100.0, ttfat_ms=500.0, answer_tpot_ms=60.0, rank=0)


def chunk(t_ms: float, *, reasoning: str = "", content: str = "") -> dict[str, Any]:
    delta = {"reasoning": reasoning} if reasoning else {"content": content}
    return {"perf_ns": int(t_ms * 1e6), "packets": [{"name": "data", "value": json.dumps({"choices": [{"delta": delta}]})}]}


def raw(chunks: list[dict[str, Any]], *, cls: str = "gold", prompt: str = "think 3 answer 2", error: Any = None) -> dict[str, Any]:
    return {"start_perf_ns": 0, "status": 200 if error is None else 500, "error": error,
            "payload": {"messages": [{"role": "user", "content": prompt}], "vllm_xargs": {"meridian_class": cls}},
            "responses": [*chunks, {"perf_ns": 10**12, "packets": [{"name": "data", "value": "[DONE]"}]}]}


def test_raw_record_splits_reasoning_from_answer() -> None:
    r = parse_raw_record(raw([chunk(50, reasoning="3"), chunk(60, reasoning=" 2"), chunk(300, content="a"),
                              chunk(350, content=" b"), chunk(450, content=" c")]))
    assert (r.meridian_class, r.prompt, r.ok) == ("gold", "think 3 answer 2", True)
    assert r.ttft_ms == pytest.approx(50.0) and r.ttfo_ms == pytest.approx(300.0)
    assert r.answer_itl_ms == pytest.approx(75.0)
    assert r.text == "3 2a b c"


def test_goodput_needs_every_class_target() -> None:
    on_time = parse_raw_record(raw([chunk(50, reasoning="1"), chunk(300, content="a"), chunk(350, content="b")]))
    late_answer = parse_raw_record(raw([chunk(50, reasoning="1"), chunk(600, content="a")]))
    slow_first = parse_raw_record(raw([chunk(150, reasoning="1"), chunk(300, content="a")]))
    slow_answer = parse_raw_record(raw([chunk(50, reasoning="1"), chunk(300, content="a"), chunk(400, content="b")]))
    failed = parse_raw_record(raw([], error={"message": "boom"}))
    assert [is_good(r, GOLD) for r in (on_time, late_answer, slow_first, slow_answer, failed)] == [True, False, False, False, False]
    m = record_metrics([on_time, late_answer, failed], [GOLD], duration_s=2.0)
    assert (m["good_requests"], m["goodput_rps"], m["failed_in_records"]) == (1, 0.5, 1)
    assert m["per_class"]["gold"]["requests"] == 3 and m["per_class"]["gold"]["good"] == 1


def test_a_shed_request_is_a_miss_not_a_failure() -> None:
    notice = ('{"error": {"message": "meridian:shed:ttft:1: request r1 (class gold) can no longer meet its TTFT '
              'target of 100 ms", "code": 503}}')
    shed = parse_raw_record(raw([], error={"code": 503, "type": "Service Unavailable", "message": notice}))
    failed = parse_raw_record(raw([], error={"code": 500, "message": "boom"}))
    assert (shed.ok, shed.shed, failed.shed) == (False, True, False)
    m = record_metrics([shed, failed], [GOLD], duration_s=1.0)
    assert (m["good_requests"], m["shed"], m["failed_in_records"]) == (0, 1, 1)


def test_an_empty_ok_response_is_counted() -> None:
    empty = parse_raw_record(raw([]))
    assert record_metrics([empty], [GOLD], duration_s=1.0)["empty_responses"] == 1


def test_greedy_check_groups_outputs_by_prompt() -> None:
    a = RecordTimes("gold", "p", True, 1.0, 2.0, None, 1, "x")
    b = RecordTimes("gold", "p", True, 1.0, 2.0, None, 1, "y")
    untimed = RecordTimes("gold", "p", True, 1.0, 2.0, None, 1)
    assert outputs_by_prompt([a, b, untimed]) == {"p": {"x", "y"}}


def test_greedy_check_ignores_the_spacing_the_reasoning_parser_puts_around_think_end() -> None:
    split = RecordTimes("gold", "p", True, 1.0, 2.0, None, 3, " 2 1  a b")
    grouped = RecordTimes("gold", "p", True, 1.0, 2.0, None, 3, " 2 1 a b")
    other = RecordTimes("gold", "q", True, 1.0, 2.0, None, 3, " 2 1 a c")
    assert outputs_by_prompt([split, grouped, other]) == {"p": {"2 1 a b"}, "q": {"2 1 a c"}}


def test_per_request_export_gives_the_answer_itl() -> None:
    record = {"metadata": {"conversation_id": "session_000001"},
              "metrics": {"time_to_first_token": {"value": 20.0}, "time_to_first_output_token": {"value": 400.0},
                          "request_latency": {"value": 700.0}, "output_token_count": {"value": 4},
                          "output_sequence_length": {"value": 30}}}
    payloads = {"session_000001": {"messages": [{"role": "user", "content": "think 9 answer 4"}],
                                   "vllm_xargs": {"meridian_class": "gold"}}}
    r = parse_record(record, payloads)
    assert (r.meridian_class, r.prompt, r.ok, r.num_output_tokens) == ("gold", "think 9 answer 4", True, 30)
    # Three gaps after the first answer token share the 300 ms after it.
    assert r.answer_itl_ms == pytest.approx(100.0) and r.ttfo_ms == 400.0 and r.text is None
    assert not is_good(r, GOLD)  # 100 ms a token > 60 ms
    failed = parse_record({"metadata": {"conversation_id": "x"}, "metrics": {}, "error": {"message": "boom"}}, payloads)
    assert not failed.ok


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 200), rate=st.floats(0.5, 50.0), seed=st.integers(0, 10))
def test_workload_is_seeded_open_loop_and_classed(n: int, rate: float, seed: int) -> None:
    classes = LIVE_MODELS["tiny"].classes
    entries = Workload(n, rate, classes, seed).entries()
    assert entries == Workload(n, rate, classes, seed).entries()
    stamps = [e["timestamp"] for e in entries]
    assert len(entries) == n and stamps[0] == 0.0 and stamps == sorted(stamps)
    assert {e["extra"]["vllm_xargs"]["meridian_class"] for e in entries} <= {c.name for c in classes}


def test_servers_differ_only_in_the_scheduler() -> None:
    model = LIVE_MODELS["tiny"]
    stock, ours = server_args("stock", model, REPO), server_args("meridian", model, REPO)
    assert ours[: len(stock)] == stock and ours[len(stock)] == "--scheduler-cls"
    assert ours[ours.index("--middleware") + 1] == MIDDLEWARE, "shed requests are answered 503"
    config = json.loads(ours[ours.index("--additional-config") + 1])
    assert config["meridian"]["classes"]["interactive"]["ttfat_ms"] == model.classes[0].ttfat_ms


def test_kv_cache_bytes_follow_the_model_shape() -> None:
    # The tiny model: 2 layers x K,V x 2 heads x 32 x 4 bytes = 1 KiB a token.
    assert LIVE_MODELS["tiny"].kv_cache_bytes(REPO) == LIVE_MODELS["tiny"].kv_cache_tokens * 1024


def test_bad_workloads_and_policies_name_the_value() -> None:
    classes = LIVE_MODELS["tiny"].classes
    with pytest.raises(ValueError, match="num_requests=0"):
        Workload(0, 5.0, classes)
    with pytest.raises(ValueError, match="rate_rps=-1"):
        Workload(10, -1.0, classes)
    with pytest.raises(ValueError, match="'fifo'"):
        server_args("fifo", LIVE_MODELS["tiny"], REPO)


def test_heavy_families_keep_their_sources_shape_on_the_models_range() -> None:
    import numpy as np

    from meridian.demo.loadgen import LENGTH_FAMILIES, task_lengths

    for family in ("servegen", "benchmark"):
        for max_think in (99, 990):
            steps = np.array([t for t, _ in task_lengths(family, 4000, seed=3, max_think=max_think)])
            p50, p99 = np.percentile(steps, [50, 99])
            assert steps.min() >= 1 and steps.max() <= max_think
            assert 0.8 * max_think <= p99 <= max_think, (family, max_think, p99)
            assert p99 / p50 > 10, f"{family}: heavy-tailed (production p99/p50 is about 18), got {p99 / p50:.1f}"
    assert task_lengths("servegen", 50, seed=1) == task_lengths("servegen", 50, seed=1)
    assert set(LENGTH_FAMILIES) == {"uniform", "servegen", "benchmark"}
    with pytest.raises(ValueError, match="'pareto'"):
        Workload(10, 5.0, LIVE_MODELS["tiny"].classes, lengths="pareto")


def test_every_request_has_the_same_max_tokens_and_its_class_rank_as_priority() -> None:
    model = LIVE_MODELS["long"]
    entries = Workload(200, 10.0, model.classes, lengths="servegen", max_think=model.max_think,
                       max_tokens=model.max_tokens).entries()
    assert {e["output_length"] for e in entries} == {model.max_tokens}
    ranks = {c.name: c.rank for c in model.classes}
    assert all(e["extra"]["priority"] == ranks[e["extra"]["vllm_xargs"]["meridian_class"]] for e in entries)
    assert max(int(e["text"].split()[1]) for e in entries) <= model.max_think


def test_the_valve_arm_adds_vllms_cap_and_nothing_else() -> None:
    from meridian.demo.loadgen import Arm, little_law_queue_cap

    model = LIVE_MODELS["tiny"]
    stock = server_args("stock", model, REPO)
    capped = server_args(Arm("fcfs+cap", "stock", 40), model, REPO)
    assert capped == [*stock, "--max-num-queued-reqs", "40"]
    priority = server_args(Arm("priority+cap", "vllm-priority", 40), model, REPO)
    assert priority[priority.index("--scheduling-policy") + 1] == "priority"
    assert little_law_queue_cap(20.0, 1_000.0) == 16 + 20
    with pytest.raises(ValueError, match="max_num_queued_reqs=0"):
        Arm("bad", "stock", 0)
    with pytest.raises(ValueError, match="positive rate"):
        little_law_queue_cap(0.0, 1_000.0)


def test_the_valves_refusals_are_misses_not_failures_even_inside_a_200_stream(tmp_path: Path) -> None:
    from meridian.demo.loadgen import VALVE_IN_STREAM, VALVE_MESSAGE, is_shed_error, read_export

    valve_503 = {"code": 503, "message": json.dumps({"error": {"message": VALVE_MESSAGE + ". Please try again"}})}
    assert is_shed_error(valve_503) and not is_shed_error({"code": 500, "message": VALVE_MESSAGE})
    # aiperf's per-request and summary exports of a round with one refusal inside a 200 stream.
    artifacts = tmp_path / "aiperf"
    artifacts.mkdir()
    empty = {"message": f"Invalid inference result: {VALVE_IN_STREAM} were received", "type": "InvalidInferenceResultError"}
    record = {"metadata": {"conversation_id": "session_000007", "request_start_ns": 0, "request_end_ns": 5_000_000},
              "metrics": {}, "error": empty}
    (artifacts / "profile_export.jsonl").write_text(json.dumps(record) + "\n")
    (artifacts / "inputs.json").write_text(json.dumps({"data": [{"session_id": "session_000007", "payloads": [
        {"messages": [{"role": "user", "content": "think 3 answer 2"}], "vllm_xargs": {"meridian_class": "gold"}}]}]}))
    (artifacts / "profile_export_aiperf.json").write_text(json.dumps({
        "benchmark_duration": {"avg": 1.0}, "error_summary": [{"error_details": empty, "count": 1}]}))
    for valve, failed in ((True, 0), (False, 1)):
        row, records = read_export(artifacts, [GOLD], valve=valve)
        # The summary's error count and the records' failures count the same request.
        assert (row["errors"], row["failed_in_records"], row["shed"]) == (failed, failed, 1 - failed), valve
        assert records[0].session == 7
    assert row["per_class"]["gold"]["requests"] == 1


def test_a_packed_round_reads_back_to_the_row_the_live_run_wrote(tmp_path: Path) -> None:
    from meridian.demo.loadgen import pack_round, read_export, read_packed_round

    artifacts = tmp_path / "aiperf-1.5x-4-meridian"
    artifacts.mkdir()
    met = raw([chunk(50.0, reasoning="3"), chunk(120.0, content="a"), chunk(150.0, content="b")])
    late = raw([chunk(900.0, reasoning="3"), chunk(950.0, content="a"), chunk(990.0, content="b")])
    (artifacts / "profile_export_raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (met, late)))
    (artifacts / "profile_export_aiperf.json").write_text(json.dumps({"benchmark_duration": {"avg": 2.0}}))
    row, records = read_export(artifacts, [GOLD])
    pack_round(tmp_path, "1.5x-4-meridian", records)
    assert not (artifacts / "profile_export_raw.jsonl").exists()
    assert read_packed_round(tmp_path, "1.5x-4-meridian", [GOLD]) == row
    assert (row["good_requests"], row["per_class"]["gold"]["requests"]) == (1, 2)
