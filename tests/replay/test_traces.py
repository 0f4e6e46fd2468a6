"""Trace loaders, transforms, SLO class rules and ServeGen reasoning lengths (``meridian.replay``).

Malformed inputs must fail with the file, the 1-based line and the bad field named; the real traces
in ../shared/traces load with the README's row counts when that folder exists; ServeGen sampling is
seeded and matches REASONING.md's production statistics loosely."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meridian.errors import MeridianError, TraceError
from meridian.replay import reasoning, traces
from meridian.replay.reasoning import ServeGenLengths, apply_reasoning_lengths, coarsen_pmf, describe
from meridian.replay.traces import TraceRequest

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "traces"
MOONCAKE = SHARED / "mooncake" / "synthetic_trace.jsonl"
AZURE_CODE = SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
AZURE_CONV = SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
needs_shared = pytest.mark.skipif(not MOONCAKE.is_file() or not AZURE_CODE.is_file(),
                                  reason="../shared/traces is not available")
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def mc(ts: int = 0, inp: int = 600, out: int = 5, hashes: list[object] | None = None) -> str:
    return json.dumps({"timestamp": ts, "input_length": inp, "output_length": out,
                       "hash_ids": hashes if hashes is not None else list(range(math.ceil(inp / 512)))})


def req(i: int, arrival: float, out: int = 10, **kw: object) -> TraceRequest:
    return TraceRequest(req_id=f"r{i}", arrival_ms=arrival, num_prompt_tokens=7, num_output_tokens=out,
                        num_think_tokens=None, num_answer_tokens=None, **kw)  # type: ignore[arg-type]


# ---- TraceRequest ----------------------------------------------------------------------------


def test_trace_error_is_a_meridian_value_error() -> None:
    assert issubclass(TraceError, MeridianError) and issubclass(TraceError, ValueError)


@pytest.mark.parametrize(("changes", "message"), [
    ({"num_think_tokens": 3, "num_answer_tokens": 6}, r"3 \+ 6 must equal 'num_output_tokens' = 10"),
    ({"num_think_tokens": 10, "num_answer_tokens": 0}, "'num_answer_tokens' must be a positive integer, got 0"),
    ({"num_think_tokens": 4}, "given together"),
    ({"num_prompt_tokens": 0}, "'num_prompt_tokens' must be a positive integer, got 0"),
    ({"arrival_ms": -1.0}, "'arrival_ms' must be a non-negative number"),
    ({"arrival_ms": math.nan}, "'arrival_ms' must be a non-negative number"),
    ({"prefix_block_hashes": (1, 2)}, "'hash_block_size' must be a positive integer"),
    ({"prefix_block_hashes": (1,), "hash_block_size": 4}, r"has 1 entries, but 7 prompt tokens"),
    ({"hash_block_size": 4}, "'hash_block_size' is given but 'prefix_block_hashes' is empty"),
    ({"slo_class": ""}, "'slo_class' must be a non-empty string"),
])
def test_trace_request_checks_its_fields(changes: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"req_id": "a", "arrival_ms": 0.0, "num_prompt_tokens": 7, "num_output_tokens": 10,
                                 "num_think_tokens": None, "num_answer_tokens": None} | changes
    with pytest.raises(TraceError, match=message):
        TraceRequest(**fields)  # type: ignore[arg-type]


# ---- Mooncake -------------------------------------------------------------------------------


def test_mooncake_loads_ids_hashes_and_rebases(tmp_path: Path) -> None:
    path = write(tmp_path, "m.jsonl", "\n".join([mc(100, 1024), "", mc(100, 1), mc(350, 513)]) + "\n")
    got = traces.load_mooncake(path)
    assert [r.req_id for r in got] == ["mooncake-1", "mooncake-3", "mooncake-4"]
    assert [r.arrival_ms for r in got] == [0.0, 0.0, 250.0]
    assert got[0].prefix_block_hashes == (0, 1) and got[0].hash_block_size == 512
    assert all(r.source == "mooncake" and not r.has_split for r in got)
    assert traces.load_trace(path) == got  # inferred from hash_ids


@pytest.mark.parametrize(("lines", "message"), [
    ([mc(), "{not json"], r"m\.jsonl:2: not valid JSON"),
    ([mc(), "[1, 2]"], r"m\.jsonl:2: expected a JSON object, got list"),
    (['{"timestamp": 0, "output_length": 1, "hash_ids": [0]}'], r"m\.jsonl:1: missing key 'input_length'"),
    ([mc(inp=-3)], r"m\.jsonl:1: 'input_length' must be a positive integer, got -3"),
    ([mc(out=0)], r"m\.jsonl:1: 'output_length' must be a positive integer, got 0"),
    ([mc(), '{"timestamp": 5, "input_length": 12.5, "output_length": 1, "hash_ids": [0]}'],
     r"m\.jsonl:2: 'input_length' must be a positive integer, got 12.5"),
    (['{"timestamp": 0, "input_length": true, "output_length": 1, "hash_ids": [0]}'],
     r"'input_length' must be a positive integer, got True"),
    ([mc(ts=-1)], r"m\.jsonl:1: 'timestamp' must be a non-negative number, got -1"),
    (['{"timestamp": "0", "input_length": 5, "output_length": 1, "hash_ids": [0]}'], r"'timestamp' must be a non-negative"),
    ([mc(inp=1025, hashes=[1, 2])], r"m\.jsonl:1: 'hash_ids' has 2 entries, but input_length 1025 needs ceil\(1025/512\) = 3"),
    ([mc(hashes=[1, "x"])], r"'hash_ids' must be a list of integers, got 'x'"),
    ([mc(ts=10), "", mc(ts=20), mc(ts=5)], r"m\.jsonl:4: 'timestamp' 5 is earlier than line 3's 20"),
    (["", "   "], r"m\.jsonl: the trace holds no requests"),
])
def test_mooncake_rejects_malformed_lines(tmp_path: Path, lines: list[str], message: str) -> None:
    path = write(tmp_path, "m.jsonl", "\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=message):
        traces.load_mooncake(path)


def test_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"nope\.jsonl: cannot read the trace"):
        traces.load_mooncake(tmp_path / "nope.jsonl")


# ---- Azure ----------------------------------------------------------------------------------


def test_azure_parses_seven_fraction_digits_and_labels_source(tmp_path: Path) -> None:
    rows = ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:46.6815901,396,109",
            "2023-11-16 18:15:47,10,1", "2023-11-17 00:00:00.5,3,2"]
    path = write(tmp_path, "AzureLLMInferenceTrace_conv.csv", AZURE_HEADER + "\r\n".join(rows))  # CRLF, no final newline
    got = traces.load_azure(path)
    assert [r.req_id for r in got] == ["conv-2", "conv-3", "conv-4", "conv-5"]
    assert got[1].arrival_ms == pytest.approx(1.0001, abs=1e-9)
    assert got[2].arrival_ms == pytest.approx(319.41, abs=1e-9)
    assert got[3].arrival_ms == pytest.approx((24 * 3600 - (18 * 3600 + 15 * 60 + 46.68059) + 0.5) * 1000, abs=1e-6)
    assert (got[0].num_prompt_tokens, got[0].num_output_tokens, got[0].source) == (374, 44, "conv")
    assert traces.load_azure(write(tmp_path, "x_code_excerpt.csv", AZURE_HEADER + rows[0]))[0].source == "code"
    assert traces.load_azure(write(tmp_path, "other.csv", AZURE_HEADER + rows[0]))[0].source == "other"


@pytest.mark.parametrize(("text", "message"), [
    ("TIMESTAMP,Context,GeneratedTokens\n2023-11-16 18:15:46.6,1,1\n",
     r"a\.csv:1: expected the Azure LLM header 'TIMESTAMP,ContextTokens,GeneratedTokens', got 'TIMESTAMP,Context"),
    ("", r"a\.csv:1: expected the Azure LLM header .* got an empty file"),
    (AZURE_HEADER + "16/11/2023 18:15:46,1,1\n", r"a\.csv:2: 'TIMESTAMP' must look like '2023-11-16 18:15:46.6805900', got '16/11"),
    (AZURE_HEADER + "2023-02-30 18:15:46.1,1,1\n", r"a\.csv:2: 'TIMESTAMP' '2023-02-30 18:15:46.1' is not a valid date"),
    (AZURE_HEADER + "2023-11-16 25:15:46.1,1,1\n", r"a\.csv:2: .* is not a valid time of day"),
    (AZURE_HEADER + "2023-11-16 18:15:46.1,1,1\n2023-11-16 18:15:47.1,-3,1\n", r"a\.csv:3: 'ContextTokens' must be a positive integer, got '-3'"),
    (AZURE_HEADER + "2023-11-16 18:15:46.1,0,1\n", r"a\.csv:2: 'ContextTokens' must be a positive integer, got '0'"),
    (AZURE_HEADER + "2023-11-16 18:15:46.1,12.5,1\n", r"'ContextTokens' must be a positive integer, got '12.5'"),
    (AZURE_HEADER + "2023-11-16 18:15:46.1,5,x\n", r"a\.csv:2: 'GeneratedTokens' must be a non-negative integer, got 'x'"),
    (AZURE_HEADER + "2023-11-16 18:15:46.1,5\n", r"a\.csv:2: expected 3 comma-separated fields, got 2"),
    (AZURE_HEADER + "2023-11-16 18:15:47.1,5,1\n\n2023-11-16 18:15:46.1,5,1\n",
     r"a\.csv:4: 'TIMESTAMP' '2023-11-16 18:15:46.1' is earlier than line 2's"),
])
def test_azure_rejects_malformed_rows(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        traces.load_azure(write(tmp_path, "a.csv", text))


def test_azure_skips_zero_generated_rows_with_a_counted_warning(tmp_path: Path) -> None:
    text = AZURE_HEADER + "2023-11-16 18:00:00.0,5,0\n2023-11-16 18:00:01.0,5,3\n2023-11-16 18:00:02.0,5,0\n"
    with pytest.warns(traces.TraceWarning, match=r"a\.csv: skipped 2 row\(s\) with GeneratedTokens = 0 \(first at line 2\)"):
        got = traces.load_azure(write(tmp_path, "a.csv", text))
    assert [(r.req_id, r.arrival_ms) for r in got] == [("a-3", 0.0)]


# ---- Meridian JSONL ---------------------------------------------------------------------------


def mer(**fields: object) -> str:
    base: dict[str, object] = {"arrival_ms": 1, "num_prompt_tokens": 5, "num_output_tokens": 3}
    return json.dumps({k: v for k, v in (base | fields).items() if v is not ...})


def test_meridian_jsonl_defaults_and_split(tmp_path: Path) -> None:
    lines = [mer(arrival_ms=12.5), "", mer(arrival_ms=20, req_id="x", num_output_tokens=..., num_think_tokens=0,
                                         num_answer_tokens=4, slo_class="batch", source="s"),
             mer(arrival_ms=30, num_output_tokens=9, num_think_tokens=5, num_answer_tokens=4,
                 prefix_block_hashes=[7, 8], hash_block_size=4, slo_class=None)]
    got = traces.load_meridian_jsonl(write(tmp_path, "own.jsonl", "\n".join(lines)))
    assert [r.req_id for r in got] == ["req-1", "x", "req-4"]
    assert [r.arrival_ms for r in got] == [0.0, 7.5, 17.5]
    assert (got[0].source, got[0].has_split, got[0].slo_class) == ("own", False, None)
    assert (got[1].num_output_tokens, got[1].num_think_tokens, got[1].num_answer_tokens, got[1].slo_class) == (4, 0, 4, "batch")
    assert got[2].prefix_block_hashes == (7, 8) and got[2].hash_block_size == 4


@pytest.mark.parametrize(("line", "message"), [
    (mer(arival_ms=3), r"o\.jsonl:2: unknown key 'arival_ms'; did you mean 'arrival_ms'\?"),
    (mer(zzz=1), r"o\.jsonl:2: unknown key 'zzz'; known keys: req_id, arrival_ms"),
    (mer(arrival_ms=...), r"o\.jsonl:2: missing key 'arrival_ms'"),
    (mer(num_prompt_tokens=...), r"o\.jsonl:2: missing key 'num_prompt_tokens'"),
    (mer(num_prompt_tokens=0), r"o\.jsonl:2: 'num_prompt_tokens' must be a positive integer, got 0"),
    (mer(num_output_tokens=...), r"o\.jsonl:2: missing key 'num_output_tokens' \(or the pair"),
    (mer(num_output_tokens=2.0), r"'num_output_tokens' must be a positive integer, got 2.0"),
    (mer(num_think_tokens=3), r"o\.jsonl:2: missing key 'num_answer_tokens'"),
    (mer(num_output_tokens=..., num_think_tokens=-1, num_answer_tokens=2), r"'num_think_tokens' must be a non-negative integer, got -1"),
    (mer(num_output_tokens=..., num_think_tokens=1, num_answer_tokens=0), r"'num_answer_tokens' must be a positive integer, got 0"),
    (mer(num_think_tokens=1, num_answer_tokens=1), r"o\.jsonl:2: 'num_output_tokens' 3 != num_think_tokens \+ num_answer_tokens = 2"),
    (mer(prefix_block_hashes=[1, 2]), r"missing key 'hash_block_size' \(required with 'prefix_block_hashes'\)"),
    (mer(hash_block_size=4), r"'hash_block_size' is given without 'prefix_block_hashes'"),
    (mer(prefix_block_hashes=[1, 2, 3], hash_block_size=4), r"o\.jsonl:2: 'prefix_block_hashes' has 3 entries, but 5 prompt"),
    (mer(prefix_block_hashes=[1, 2], hash_block_size=0), r"'hash_block_size' must be a positive integer, got 0"),
    (mer(req_id="a"), r"o\.jsonl:2: 'req_id' 'a' repeats line 1"),
    (mer(req_id=5), r"'req_id' must be a non-empty string, got 5"),
    (mer(slo_class=""), r"'slo_class' must be a non-empty string"),
    (mer(source=3), r"'source' must be a string, got 3"),
    (mer(arrival_ms=-0.5), r"o\.jsonl:2: 'arrival_ms' must be a non-negative number, got -0.5"),
    (mer(arrival_ms=0.5), r"o\.jsonl:2: 'arrival_ms' 0.5 is earlier than line 1's 1"),
    ("not json", r"o\.jsonl:2: not valid JSON"),
])
def test_meridian_jsonl_rejects_malformed_lines(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path, "o.jsonl", mer(arrival_ms=1, req_id="a") + "\n" + line + "\n")
    with pytest.raises(TraceError, match=message):
        traces.load_meridian_jsonl(path)


def test_load_trace_infers_the_format_and_rejects_unknown_ones(tmp_path: Path) -> None:
    own = write(tmp_path, "own.jsonl", "\n" + mer() + "\n")
    assert traces.load_trace(own)[0].source == "own"
    azure = write(tmp_path, "t.csv", AZURE_HEADER + "2023-11-16 18:00:00.0,5,3\n")
    assert traces.load_trace(azure)[0].source == "t"
    with pytest.raises(TraceError, match="unknown trace format 'parquet'; expected one of mooncake, azure, meridian"):
        traces.load_trace(own, "parquet")
    with pytest.raises(TraceError, match=r"o\.jsonl:1: unknown key 'timestamp'"):
        traces.load_trace(write(tmp_path, "o.jsonl", json.dumps({"timestamp": 0})), "meridian")


requests_strategy = st.lists(
    st.tuples(st.floats(0, 1e6, allow_nan=False), st.integers(1, 5000), st.integers(1, 5000),
              st.one_of(st.none(), st.floats(0, 1)), st.sampled_from([None, "interactive", "batch"]),
              st.sampled_from(["", "code", "mooncake"]), st.booleans()),
    min_size=1, max_size=20)


def build_requests(rows: list[tuple[float, int, int, float | None, str | None, str, bool]]) -> list[TraceRequest]:
    out, arrival = [], 0.0
    for i, (gap, prompt, output, ratio, slo, source, hashed) in enumerate(rows):
        arrival = arrival + gap if i else 0.0
        think = None if ratio is None or output < 2 else min(int(output * ratio), output - 1)
        out.append(TraceRequest(
            req_id=f"id-{i}", arrival_ms=arrival, num_prompt_tokens=prompt, num_output_tokens=output,
            num_think_tokens=think, num_answer_tokens=None if think is None else output - think, slo_class=slo,
            source=source, prefix_block_hashes=tuple(range(math.ceil(prompt / 64))) if hashed else (),
            hash_block_size=64 if hashed else None))
    return out


@settings(max_examples=40, deadline=None)
@given(requests_strategy)
def test_dump_then_load_gives_the_same_requests(rows: list[tuple[float, int, int, float | None, str | None, str, bool]]) -> None:
    requests = build_requests(rows)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.jsonl"
        traces.dump_meridian_jsonl(requests, path)
        assert traces.load_meridian_jsonl(path) == requests
        assert traces.load_trace(path) == requests


@settings(max_examples=60, deadline=None)
@given(requests_strategy, st.floats(0, 2000), st.one_of(st.none(), st.floats(0.001, 2000)), st.floats(0.01, 100))
def test_window_and_scale_keep_the_invariant(rows: list[tuple[float, int, int, float | None, str | None, str, bool]],
                                             start_s: float, duration_s: float | None, factor: float) -> None:
    requests = build_requests(rows)
    try:
        kept = traces.window(requests, start_s, duration_s)
    except TraceError as exc:
        assert "holds no requests" in str(exc)
        return
    scaled = traces.scale_rate(kept, factor)
    for result in (kept, scaled):
        assert result[0].arrival_ms == 0.0
        assert all(a.arrival_ms <= b.arrival_ms for a, b in zip(result, result[1:]))
    by_id = {r.req_id: r for r in requests}
    hi = math.inf if duration_s is None else (start_s + duration_s) * 1000
    assert [r.req_id for r in kept] == [r.req_id for r in requests if start_s * 1000 <= r.arrival_ms < hi]
    origin = by_id[kept[0].req_id].arrival_ms
    for r, s in zip(kept, scaled):
        assert r.arrival_ms == pytest.approx(by_id[r.req_id].arrival_ms - origin)
        assert s.arrival_ms == pytest.approx(r.arrival_ms / factor)


def test_dump_refuses_unsorted_or_duplicate_requests(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="request 1 .'r1'. arrives before request 0"):
        traces.dump_meridian_jsonl([req(0, 5.0), req(1, 1.0)], tmp_path / "x.jsonl")
    with pytest.raises(TraceError, match="req_id 'r0' appears twice"):
        traces.dump_meridian_jsonl([req(0, 0.0), req(0, 1.0)], tmp_path / "x.jsonl")


# ---- transforms ----------------------------------------------------------------------------


def test_window_scale_and_limit() -> None:
    requests = [req(i, t) for i, t in enumerate([0.0, 500.0, 1000.0, 1999.0, 2000.0, 3500.0])]
    assert [(r.req_id, r.arrival_ms) for r in traces.window(requests, 1.0, 1.0)] == [("r2", 0.0), ("r3", 999.0)]
    assert [r.req_id for r in traces.window(requests, 2.0, None)] == ["r4", "r5"]
    assert [r.arrival_ms for r in traces.scale_rate(requests, 2.0)][:3] == [0.0, 250.0, 500.0]
    assert [r.req_id for r in traces.limit(requests, 2)] == ["r0", "r1"]
    assert requests[1].arrival_ms == 500.0  # inputs untouched
    with pytest.raises(TraceError, match=r"window \[4 s, 5 s\) holds no requests; the trace's arrivals span 0-3.5 s"):
        traces.window(requests, 4.0, 1.0)
    with pytest.raises(TraceError, match="window start must be a non-negative number of seconds, got -1.0"):
        traces.window(requests, -1.0, None)
    with pytest.raises(TraceError, match="window duration must be a positive number of seconds, got 0.0"):
        traces.window(requests, 0.0, 0.0)
    with pytest.raises(TraceError, match="rate factor must be a positive number, got 0.0"):
        traces.scale_rate(requests, 0.0)
    with pytest.raises(TraceError, match="rate factor must be a positive number, got inf"):
        traces.scale_rate(requests, math.inf)
    with pytest.raises(TraceError, match="request limit must be a positive integer, got 0"):
        traces.limit(requests, 0)


def test_load_traces_merges_on_wall_clock_and_prefixes_clashing_ids(tmp_path: Path) -> None:
    a = write(tmp_path, "x_conv.csv", AZURE_HEADER + "2023-11-16 18:00:00.0,5,3\n2023-11-16 18:00:02.0,5,3\n")
    b = write(tmp_path, "x_code.csv", AZURE_HEADER + "2023-11-16 18:00:01.0,5,3\n2023-11-16 18:00:02.0,6,3\n")
    merged = traces.load_traces([a, b])
    assert [(r.req_id, r.arrival_ms) for r in merged] == [("conv-2", 0.0), ("code-2", 1000.0), ("conv-3", 2000.0), ("code-3", 2000.0)]
    m = write(tmp_path, "m.jsonl", mc(0) + "\n" + mc(1500) + "\n")
    twice = traces.load_traces([m, m])
    assert [r.req_id for r in twice] == ["0/mooncake-1", "1/mooncake-1", "0/mooncake-2", "1/mooncake-2"]
    with pytest.raises(TraceError, match="no trace files"):
        traces.load_traces([])


# ---- SLO classes ----------------------------------------------------------------------------


def test_class_rules() -> None:
    requests = [req(i, float(i), slo_class="gold" if i == 0 else None, source="code" if i % 2 else "conv")
                for i in range(2000)]
    assert [r.slo_class for r in traces.assign_classes(requests[:3], "trace", 0)] == ["gold", None, None]
    assert {r.slo_class for r in traces.assign_classes(requests, "fixed:batch", 0)} == {"batch"}
    mixed = traces.assign_classes(requests, "mix:interactive=0.2, standard=0.6,batch=0.2", 7)
    assert mixed == traces.assign_classes(requests, "mix:interactive=0.2,standard=0.6,batch=0.2", 7)
    assert mixed != traces.assign_classes(requests, "mix:interactive=0.2,standard=0.6,batch=0.2", 8)
    shares = {name: sum(r.slo_class == name for r in mixed) / len(mixed) for name in ("interactive", "standard", "batch")}
    assert shares["interactive"] == pytest.approx(0.2, abs=0.04) and shares["standard"] == pytest.approx(0.6, abs=0.04)
    unnormalised = traces.assign_classes(requests, "mix:a=1,b=3", 1)
    assert sum(r.slo_class == "b" for r in unnormalised) / 2000 == pytest.approx(0.75, abs=0.04)
    by_source = traces.assign_classes(requests[:4], "by-source:code=interactive,conv=standard,other=x", 0)
    assert [r.slo_class for r in by_source] == ["standard", "interactive", "standard", "interactive"]


@pytest.mark.parametrize(("rule", "message"), [
    ("by-source:code=interactive", r"class rule 'by-source:code=interactive' maps no class for source\(s\) 'conv' \(sources in the trace: 'code', 'conv'\)"),
    ("mix:a=0.5,b=0", r"class rule 'mix:a=0.5,b=0': weight of 'b' must be a positive number, got '0'"),
    ("mix:a=-1", "weight of 'a' must be a positive number"),
    ("mix:a=x", "weight of 'a' must be a positive number, got 'x'"),
    ("mix:a=1,a=2", "'a' is given twice"),
    ("mix:a", r"class rule 'mix:a': expected KEY=VALUE, got 'a'"),
    ("fixed:", "class rule 'fixed:': '' is not a class name"),
    ("fixed:two words", "is not a class name"),
    ("random", r"unknown class rule 'random'; expected 'trace', 'fixed:NAME'"),
    ("mix", "unknown class rule 'mix'"),
])
def test_bad_class_rules_name_the_rule(rule: str, message: str) -> None:
    requests = [req(0, 0.0, source="code"), req(1, 1.0, source="conv")]
    with pytest.raises(TraceError, match=message):
        traces.assign_classes(requests, rule, 0)


# ---- the real traces ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def azure_merged() -> list[TraceRequest]:
    return traces.load_traces([AZURE_CODE, AZURE_CONV])


@needs_shared
def test_real_mooncake_trace_loads() -> None:
    got = traces.load_trace(MOONCAKE)
    assert len(got) == 3993
    assert got[-1].arrival_ms == 1_022_025.0
    assert all(len(r.prefix_block_hashes) == math.ceil(r.num_prompt_tokens / 512) for r in got)


@needs_shared
def test_real_azure_code_and_conv_merge(azure_merged: list[TraceRequest]) -> None:
    counts = {s: sum(r.source == s for r in azure_merged) for s in ("code", "conv")}
    assert counts == {"code": 8819, "conv": 19366}
    assert len({r.req_id for r in azure_merged}) == len(azure_merged)
    assert all(a.arrival_ms <= b.arrival_ms for a, b in zip(azure_merged, azure_merged[1:]))
    assert azure_merged[0].req_id == "conv-2" and azure_merged[0].arrival_ms == 0.0
    # The code file starts 18:17:03.97996, 77.29937 s after the conversation file's 18:15:46.68059.
    first_code = next(r for r in azure_merged if r.source == "code")
    assert first_code.arrival_ms == pytest.approx(77_299.37, abs=1e-6)
    last_code = [r for r in azure_merged if r.source == "code"][-1]
    assert (last_code.arrival_ms - first_code.arrival_ms) / 1000 == pytest.approx(3436, abs=1)
    classes = traces.assign_classes(azure_merged, "by-source:code=interactive,conv=standard", 0)
    assert {r.slo_class for r in classes if r.source == "code"} == {"interactive"}


# ---- ServeGen reasoning lengths ----------------------------------------------------------------


@pytest.fixture(scope="module")
def bundled() -> ServeGenLengths:
    return ServeGenLengths.default()


def test_bundled_summary_is_small_and_complete(bundled: ServeGenLengths) -> None:
    assert reasoning.BUNDLED_SUMMARY.stat().st_size < 300_000
    assert len(bundled.windows) == 156 and bundled.max_points == 64
    assert {w.window_start_s for w in bundled.windows} == {0, 21600, 43200, 64800}
    assert all(len(w.output_tokens.values) <= 64 and len(w.reason_ratio.values) <= 64 for w in bundled.windows)
    assert (reasoning.BUNDLED_SUMMARY.parent / "ATTRIBUTION.md").is_file()


def test_sampling_is_seeded_and_splits_are_valid(bundled: ServeGenLengths) -> None:
    first = [bundled.sample(np.random.default_rng(3)) for _ in range(3)]
    assert first[0] == first[1] == first[2]
    rng = np.random.default_rng(5)
    singles = [bundled.sample(rng) for _ in range(50)]
    think, answer = bundled.sample_many(np.random.default_rng(5), 50)
    assert singles == list(zip(think.tolist(), answer.tolist()))
    think, answer = bundled.sample_many(np.random.default_rng(0), 20_000)
    assert think.min() >= 0 and answer.min() >= 1
    output = think + answer
    assert output.max() <= 32_768
    # REASONING.md 1a (day, rate-weighted): reason_ratio mean 0.70, output p50 792.
    assert 0.65 <= float(np.mean(think / output)) <= 0.75
    assert 600 <= float(np.median(output)) <= 1000
    assert 0.25 <= float(np.mean(output < 512)) <= 0.45  # REASONING.md: 7 % below 256, 27 % in 256-512


def test_hour_of_day_restricts_to_its_six_hour_window(bundled: ServeGenLengths) -> None:
    morning = sum(bundled.sample_many(np.random.default_rng(1), 4000, hour_of_day=8.5))
    evening = sum(bundled.sample_many(np.random.default_rng(1), 4000, hour_of_day=20.0))
    # REASONING.md: output p50 2,422 for 06-12 h vs 520 for 18-24 h.
    assert np.median(morning) > 3 * np.median(evening)
    for bad in (24.0, -0.1, math.nan):
        with pytest.raises(TraceError, match=r"hour_of_day must be a number in \[0, 24\)"):
            bundled.sample(np.random.default_rng(0), bad)


def test_apply_reasoning_lengths_modes(bundled: ServeGenLengths) -> None:
    requests = [req(i, i * 1000.0, out=1 if i == 0 else 50 * i) for i in range(200)]
    with pytest.raises(TraceError, match="reasoning source 'trace' needs a thinking/answer split in the trace, but request 'r0'"):
        apply_reasoning_lengths(requests, "trace", seed=0, servegen=None)
    none = apply_reasoning_lengths(requests, "none", seed=0, servegen=None)
    assert none == requests and not any(r.has_split for r in none)
    full = apply_reasoning_lengths(requests, "servegen", seed=4, servegen=bundled)
    assert full == apply_reasoning_lengths(requests, "servegen", seed=4, servegen=None)  # None = bundled
    assert full != apply_reasoning_lengths(requests, "servegen", seed=5, servegen=bundled)
    assert all(r.num_think_tokens is not None and r.num_answer_tokens is not None and r.num_answer_tokens >= 1
               and r.num_think_tokens + r.num_answer_tokens == r.num_output_tokens for r in full)
    assert [r.num_output_tokens for r in full] != [r.num_output_tokens for r in requests]
    ratio = apply_reasoning_lengths(requests, "servegen-ratio", seed=4, servegen=bundled)
    assert [r.num_output_tokens for r in ratio] == [r.num_output_tokens for r in requests]
    assert (ratio[0].num_think_tokens, ratio[0].num_answer_tokens) == (0, 1)  # a 1-token output stays all answer
    assert all(r.num_answer_tokens is not None and r.num_answer_tokens >= 1 for r in ratio)
    assert apply_reasoning_lengths(ratio, "trace", seed=0, servegen=None) == ratio
    assert apply_reasoning_lengths(full, "none", seed=0, servegen=None)[5].num_think_tokens is None
    # A trace's own split is resampled by the ServeGen modes, kept by "trace".
    assert apply_reasoning_lengths(full, "servegen", seed=9, servegen=bundled) != full
    with pytest.raises(TraceError, match="unknown reasoning source 'r1'; expected one of trace, none, servegen, servegen-ratio"):
        apply_reasoning_lengths(requests, "r1", seed=0, servegen=None)


def test_hour_of_day_advances_with_arrival(bundled: ServeGenLengths) -> None:
    # Arrivals 1 h apart from 05:30: the first request draws from 00-06 h, the rest from 06-12 h.
    requests = [req(i, i * 3_600_000.0) for i in range(3)]
    slots = reasoning._request_slots(requests, 5.5)
    assert slots.tolist() == [0, 1, 1]
    assert reasoning._request_slots(requests, 23.5).tolist() == [3, 0, 0]  # wraps at midnight


def test_describe_names_the_source_and_seed(bundled: ServeGenLengths) -> None:
    line = describe("servegen", 0, bundled)
    assert line.startswith("real arrivals + production-derived reasoning lengths: ServeGen DeepSeek-R1")
    assert "arXiv:2505.09999" in line and "sampled independently within a client-window, seed 0" in line
    assert "coarsened to <= 64 points" in line
    assert "seed 3" in describe("servegen-ratio", 3)
    assert "recorded in the trace" in describe("trace", 0)
    with pytest.raises(TraceError):
        describe("bogus", 0)


def test_coarsening_preserves_mass_and_mean() -> None:
    rng = np.random.default_rng(2)
    values = np.unique(rng.integers(1, 30_000, 3000))
    pmf = reasoning.Pmf.from_masses(values, rng.pareto(1.5, len(values)) + 0.01)
    small = coarsen_pmf(pmf, 64)
    assert len(small.values) <= 64
    assert small.probs.sum() == pytest.approx(1.0) and small.mean() == pytest.approx(pmf.mean(), rel=1e-9)
    assert small.values.max() <= pmf.values.max() and small.values.min() >= pmf.values.min()
    assert abs(small.quantile(0.5) - pmf.quantile(0.5)) <= pmf.quantile(0.53) - pmf.quantile(0.47)
    assert coarsen_pmf(small, 64) is small


def test_summary_round_trip(tmp_path: Path, bundled: ServeGenLengths) -> None:
    path = tmp_path / "servegen_summary.json"
    reasoning.write_summary(bundled, path)
    again = ServeGenLengths.load(path)
    assert len(again.windows) == len(bundled.windows) and again.max_points == 64
    for a, b in zip(again.windows, bundled.windows):
        assert (a.client, a.window_start_s, a.weight) == (b.client, b.window_start_s, b.weight)
        assert np.array_equal(a.output_tokens.values, b.output_tokens.values)
        assert np.allclose(a.reason_ratio.probs, b.reason_ratio.probs, atol=1e-6)
    with pytest.raises(TraceError, match="not a ServeGen summary"):
        ServeGenLengths.load(write(tmp_path, "other.json", "{}"))


def write_chunk(folder: Path, client: int, windows: dict[str, tuple[str, str]], rates: dict[int, float]) -> None:
    """A ServeGen-format client: dict-literal PMF strings and 144 rate rows (rates by row index)."""
    document = {start: {"input_tokens": "{10: 1.0}" if out != "{}" else "{}", "output_tokens": out, "reason_ratio": ratio}
                for start, (out, ratio) in windows.items()}
    (folder / f"chunk-{client}-dataset.json").write_text(json.dumps(document))
    rows = [f"{600 * i},{rates.get(i, 0.0)},1.0,Gamma,1.0,1.0" if rates.get(i) else f"{600 * i},0,0,,0,0"
            for i in range(144)]
    (folder / f"chunk-{client}-trace.csv").write_text("\n".join(rows) + "\n")


def test_servegen_folder_weights_and_skips(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "reason" / "deepseek-r1"  # a ServeGen checkout's layout
    folder.mkdir(parents=True)
    write_chunk(folder, 0, {"0": ("{100: 0.5, 300: 0.5}", "{0.5: 1.0}"), "21600": ("{}", "{}"),
                            "43200": ("{1000: 1.0}", "{0.9: 0.25, 0.1: 0.75}")}, {0: 0.5, 1: 0.5, 40: 1.0, 80: 2.0})
    write_chunk(folder, 1, {"64800": ("{50: 1.0}", "{0.2: 1.0}")}, {})  # data, but never any request
    lengths = ServeGenLengths.load(tmp_path)
    assert [(w.client, w.window_start_s, w.weight) for w in lengths.windows] == [(0, 0, 600.0), (0, 43200, 1200.0)]
    assert lengths.max_points is None
    think, answer = lengths.sample_many(np.random.default_rng(0), 3000)
    assert set((think + answer).tolist()) == {100, 300, 1000}
    assert set(think[(think + answer) == 100].tolist()) == {50}
    with pytest.raises(TraceError, match="no client-window has data in 6-h window 1"):
        lengths.sample(np.random.default_rng(0), hour_of_day=7.0)
    (folder / "chunk-1-trace.csv").unlink()
    with pytest.raises(TraceError, match=r"chunk-1-trace\.csv: missing"):
        ServeGenLengths.load(folder)
    write_chunk(folder, 1, {"0": ("{50: 1.0", "{0.2: 1.0}")}, {0: 1.0})
    with pytest.raises(TraceError, match=r"chunk-1-dataset\.json: window '0': 'output_tokens' is not a Python dict literal"):
        ServeGenLengths.load(folder)
    with pytest.raises(TraceError, match="no ServeGen chunk"):
        ServeGenLengths.load(tmp_path / "data")


@pytest.mark.skipif(not (reasoning.servegen_dir() / "chunk-0-dataset.json").is_file(), reason="ServeGen folder not available")
def test_bundled_summary_matches_the_released_files(tmp_path: Path, bundled: ServeGenLengths) -> None:
    # Three clients only (parsing all 73 takes seconds); 18 is busy in three windows.
    for client in (0, 5, 18):
        for kind in ("dataset.json", "trace.csv"):
            shutil.copy(reasoning.servegen_dir() / f"chunk-{client}-{kind}", tmp_path)
    full = ServeGenLengths.load(tmp_path)
    summary = {(w.client, w.window_start_s): w for w in bundled.windows if w.client in (0, 5, 18)}
    assert sorted(summary) == sorted((w.client, w.window_start_s) for w in full.windows)
    for w in full.windows:
        s = summary[(w.client, w.window_start_s)]
        assert s.weight == pytest.approx(w.weight, abs=1e-3)
        assert s.output_tokens.mean() == pytest.approx(w.output_tokens.mean(), abs=0.6)
        assert s.reason_ratio.mean() == pytest.approx(w.reason_ratio.mean(), abs=1e-3)


def test_servegen_dir_honours_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MERIDIAN_SERVEGEN_DIR", str(tmp_path))
    assert reasoning.servegen_dir() == tmp_path
    monkeypatch.delenv("MERIDIAN_SERVEGEN_DIR")
    assert reasoning.servegen_dir() == reasoning.DEFAULT_SERVEGEN_DIR
    assert reasoning.DEFAULT_SERVEGEN_DIR.parts[-3:] == ("shared", "traces", "servegen_deepseek_r1")


def test_no_warnings_when_loading_clean_traces(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        traces.load_azure(write(tmp_path, "a.csv", AZURE_HEADER + "2023-11-16 18:00:00.0,5,3\n"))
