"""``meridian replay`` end to end: a small trace in Meridian's own format through every policy,
the JSON file's schema, the plots, a load sweep, and clear errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meridian.cli import main
from meridian.replay.policies import POLICIES
from meridian.replay.traces import TraceRequest, dump_meridian_jsonl
from replay_profiles import linear_profile_data

pytestmark = pytest.mark.vllm

LATENCIES = ("ttft_ms", "ttfat_ms", "answer_tpot_ms", "think_tpot_ms")


def write_profile(path: Path) -> Path:
    data = linear_profile_data(
        "test-linear", "small linear profile for CLI tests", num_kv_blocks=64, max_num_seqs=16,
        max_num_batched_tokens=256, max_model_len=1000, base_ms=5.0, per_prefill_token_ms=0.01,
        per_decode_request_ms=0.1, per_context_token_ms=0.0001,
    )
    path.write_text(json.dumps(data))
    return path


def write_trace(path: Path, n: int = 24) -> Path:
    requests = [
        TraceRequest(
            req_id=f"r{i}",
            arrival_ms=40.0 * i,
            num_prompt_tokens=20 + (i * 13) % 60,
            num_output_tokens=(5 + i % 17) + (3 + i % 5),
            num_think_tokens=5 + i % 17,
            num_answer_tokens=3 + i % 5,
            slo_class="interactive" if i % 3 == 0 else "standard",
        )
        for i in range(n)
    ]
    dump_meridian_jsonl(requests, path)
    return path


def test_replay_writes_the_json_schema_and_the_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    report = tmp_path / "report"
    code = main([
        "replay", "--trace", str(write_trace(tmp_path / "t.jsonl")), "--profile", str(write_profile(tmp_path / "p.json")),
        "--json", str(out), "--report-dir", str(report), "--no-progress", "--cache-dir", str(tmp_path / "cache"),
        "--jobs", "2",
    ])
    assert code == 0
    printed = capsys.readouterr().out
    for policy in POLICIES:
        assert policy in printed
    payload = json.loads(out.read_text())
    assert set(payload["policies"]) == set(POLICIES)
    for summary in payload["policies"].values():
        for key in LATENCIES:
            assert set(summary[key]) == {"p50", "p90", "p99", "mean"}
        assert summary["submitted"] == summary["completed"] == 24
        assert 0 <= summary["good"] <= summary["completed"]
        assert summary["goodput_rps"] == pytest.approx(summary["good"] / summary["duration_s"])
        assert summary["throughput_tok_s"] > 0
        assert set(summary["preemptions"]) == {"prefill", "think", "answer"}
        assert isinstance(summary["stalls"], int)
        assert set(summary["per_class"]) == {"interactive", "standard"}
    assert any(s["good"] > 0 for s in payload["policies"].values()), "the targets are reachable: goodput measures something"
    assert payload["workload"]["reasoning_lengths"] == "thinking/answer lengths as recorded in the trace"
    for name in ("cdf_ttfat.png", "cdf_answer_tpot.png", "replay.json"):
        assert (report / name).stat().st_size > 0


def test_a_load_sweep_plots_goodput_and_ttfat_against_load(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    report = tmp_path / "report"
    code = main([
        "replay", "--trace", str(write_trace(tmp_path / "t.jsonl", n=12)), "--profile", str(write_profile(tmp_path / "p.json")),
        "--policies", "vllm-fcfs,meridian", "--rate-scale", "1,4", "--json", str(out), "--report-dir", str(report),
        "--no-progress", "--cache-dir", str(tmp_path / "cache"), "--jobs", "1",
    ])
    assert code == 0
    sweep = json.loads(out.read_text())["load_sweep"]
    assert set(sweep) == {"1.0", "4.0"}
    assert all(set(v) == {"vllm-fcfs", "meridian"} for v in sweep.values())
    for name in ("goodput_vs_load.png", "ttfat_p99_vs_load.png", "cdf_ttfat_x1.png", "cdf_ttfat_x4.png"):
        assert (report / name).stat().st_size > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", "fcfs"], "unknown policy 'fcfs'"),
        (["--classes", "mix:interactive=-1"], "mix"),
        (["--limit", "0"], "limit"),
        (["--classes", "fixed:gold"], "does not define: gold"),
    ],
)
def test_bad_arguments_fail_with_a_message_naming_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code = main(["replay", "--trace", str(write_trace(tmp_path / "t.jsonl", n=3)), "--no-progress", *args])
    assert code == 2
    assert message in capsys.readouterr().err


def test_the_host_tier_needs_a_profile_that_prices_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["replay", "--trace", str(write_trace(tmp_path / "t.jsonl", n=3)), "--no-progress",
                 "--profile", str(write_profile(tmp_path / "p.json")), "--host-tier-gib", "8"])
    assert code == 2
    assert "host_link_bytes_per_s" in capsys.readouterr().err


def test_a_replay_with_the_host_tier_states_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    code = main(["replay", "--trace", str(write_trace(tmp_path / "t.jsonl", n=6)), "--profile", "h200-qwen3-8b",
                 "--policies", "vllm-fcfs", "--host-tier-gib", "16", "--json", str(out), "--no-progress",
                 "--cache-dir", str(tmp_path / "cache"), "--jobs", "1"])
    assert code == 0
    assert "host KV tier: 16 GiB (7281 blocks)" in capsys.readouterr().out
    payload = json.loads(out.read_text())
    assert payload["workload"]["host_tier"]["num_blocks"] == 16 * 2**30 // (147456 * 16)
    assert set(payload["policies"]["vllm-fcfs"]["kv_tier"]) == {"loads", "loaded_tokens", "restored_resumes", "restore_plans",
                                                               "stored_preemptions", "stored_restored_resumes",
                                                               "resumes", "resumed_tokens", "resumed_device_hit_tokens",
                                                               "resumed_tier_hit_tokens"}
    assert set(payload["policies"]["vllm-fcfs"]["prefix_cache"]) == {"queries", "hits", "hit_rate"}


def test_a_malformed_trace_fails_with_its_line_number(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t.jsonl", n=3)
    lines = trace.read_text().splitlines()
    lines.insert(2, '{"arrival_ms": 500, "num_prompt_tokens": -4, "num_output_tokens": 3}')
    trace.write_text("\n".join(lines) + "\n")
    assert main(["replay", "--trace", str(trace), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "t.jsonl:3" in err and "num_prompt_tokens" in err


def test_a_fleet_replay_serves_every_request_once_behind_the_router(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    code = main(["replay", "--trace", str(write_trace(tmp_path / "t.jsonl", n=24)), "--profile",
                 str(write_profile(tmp_path / "p.json")), "--policies", "vllm-fcfs,meridian", "--fleet", "3",
                 "--router", "power_of_two", "--json", str(out), "--no-progress", "--cache-dir",
                 str(tmp_path / "cache"), "--jobs", "1"])
    assert code == 0
    payload = json.loads(out.read_text())
    assert payload["workload"]["fleet"] == {"engines": 3, "router": "power_of_two", "attempts": 3}
    for policy in ("vllm-fcfs", "meridian"):
        summary = payload["policies"][policy]
        assert summary["submitted"] == 24 and summary["fleet"] == 3 and summary["router"] == "power_of_two"
        assert summary["good_per_engine"] == pytest.approx(summary["good"] / 3)


@pytest.mark.parametrize(("args", "message"), [(["--fleet", "0"], "--fleet"), (["--router", "nearest"], "--router"),
                                               (["--retry-attempts", "0"], "--retry-attempts")])
def test_bad_fleet_arguments_name_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                           message: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["replay", "--trace", str(write_trace(tmp_path / "t.jsonl", n=3)), "--no-progress", *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("meridian", "message"),
    [('{"policy": "bogus"}', "`policy`"), ("{bad", "--meridian is not valid JSON"), ("[1]", "expected a JSON object")],
)
def test_disaggregated_names_a_bad_meridian_block_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], meridian: str, message: str
) -> None:
    code = main(["disaggregated", "--log-dir", str(tmp_path / "logs"), "--meridian", meridian])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "logs").exists(), "no server was started"
