"""The scenario corpus: ServeGen-shaped arrivals (hypothesis over spans, counts and seeds), scenario
building (deterministic, normalised, every request classed and split), the load search, the
report's ratios, geometric means, worst scenarios and leave-one-family-out against hand-worked
numbers, one real replay of a tiny scenario through FCFS and Meridian, and vLLM's load valve as
columns (its cap in the job's key, the tuned valve's pick over its grid, a tiny scenario behind it)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meridian.errors import TraceError
from meridian.replay import corpus as C
from meridian.replay.arrivals import BUNDLED_ARRIVALS, RateRow, ServeGenArrivals, retime
from meridian.replay.traces import TraceRequest

HAVE_TRACES = all((C.traces_dir() / f).is_file() for fam in C.FAMILIES.values() for f in fam.files)
needs_traces = pytest.mark.skipif(not HAVE_TRACES, reason="the shared traces folder is not available")

BUNDLED = ServeGenArrivals.load(BUNDLED_ARRIVALS)


@settings(max_examples=40, deadline=None)
@given(start_s=st.integers(0, 143).map(lambda k: k * 600.0 + 17.0), span_s=st.sampled_from([600.0, 3600.0, 21600.0]),
       n=st.integers(1, 400), seed=st.integers(0, 2**31))
def test_arrivals_are_sorted_finite_from_zero_as_many_as_asked_and_seeded(start_s: float, span_s: float, n: int,
                                                                          seed: int) -> None:
    arrivals = BUNDLED.sample(start_s, span_s, n, seed)
    assert len(arrivals) == n and arrivals[0] == 0.0
    assert np.all(np.isfinite(arrivals)) and np.all(np.diff(arrivals) >= 0)
    assert np.array_equal(arrivals, BUNDLED.sample(start_s, span_s, n, seed))


def test_a_bursty_client_makes_bursty_arrivals_and_a_steady_one_poisson_like() -> None:
    def cv(row: RateRow) -> float:
        gaps = np.diff(ServeGenArrivals([row], origin="test").sample(0.0, 600.0, 2000, 1))
        return float(gaps.std() / gaps.mean())

    bursty = RateRow(client=1, window_start_s=0, rate=5.0, cv=4.0, pattern="Weibull", shape=0.35)
    steady = RateRow(client=2, window_start_s=0, rate=5.0, cv=1.0, pattern="Gamma", shape=1.0)
    assert cv(bursty) > 2.0 and 0.8 < cv(steady) < 1.2


def test_bad_rows_and_spans_are_named() -> None:
    with pytest.raises(TraceError, match="pattern must be one of"):
        RateRow(1, 0, 1.0, 1.0, "Pareto", 1.0).check("row 3")
    with pytest.raises(TraceError, match="rate must be a positive"):
        RateRow(1, 0, -1.0, 1.0, "Gamma", 1.0).check("row 3")
    with pytest.raises(TraceError, match="arrival span"):
        BUNDLED.sample(0.0, 0.0, 10, 0)
    with pytest.raises(TraceError, match="no client is active"):
        ServeGenArrivals([RateRow(1, 0, 1.0, 1.0, "Gamma", 1.0)], origin="t").sample(3600.0, 600.0, 5, 0)
    with pytest.raises(TraceError, match="2 arrival times for 1 requests"):
        retime([TraceRequest("a", 0.0, 1, 1, None, None)], np.array([0.0, 1.0]))


def test_the_summary_reads_back_what_was_written(tmp_path: Path) -> None:
    path = tmp_path / "arrivals.json"
    BUNDLED.write_summary(path)
    again = ServeGenArrivals.load(path)
    assert again.rows == BUNDLED.rows
    assert math.isclose(again.mean_rate(0.0, 86400.0), BUNDLED.mean_rate(0.0, 86400.0))


@needs_traces
def test_scenarios_are_deterministic_normalised_classed_and_split() -> None:
    scenarios = C.make_corpus(2, seed=3, request_scale=0.05)
    assert scenarios == C.make_corpus(2, seed=3, request_scale=0.05)
    assert {s.family for s in scenarios} == set(C.FAMILIES) and {s.arrivals for s in scenarios} >= {"trace", "bursty"}
    for s in scenarios:
        requests = C.scenario_requests(s)
        assert requests == C.scenario_requests(s)
        assert len(requests) == s.num_requests and requests[0].arrival_ms == 0.0
        assert requests[-1].arrival_ms == pytest.approx((s.num_requests - 1) * 1000.0), "one request per second"
        assert all(r.slo_class in C.TARGET_SETS[s.targets] for r in requests)
        assert all(r.num_think_tokens is not None and r.num_answer_tokens >= 1 for r in requests)
        config = C.scenario_config(s, {C.ON_OVERLOAD: {"interactive": "shed"}, "aging_ms": 5.0})
        assert config["classes"]["interactive"]["on_overload"] == "shed" and config["aging_ms"] == 5.0
        assert "on_overload" not in config["classes"]["standard"]


def test_the_load_search_brackets_interpolates_and_stops_at_the_floor() -> None:
    s = C.Scenario("x", "azure-code", 0.0, "trace", 0.0, "servegen", "fixed:standard", "default", "h200-qwen3-8b", 10, 0)
    cal = C.Calibration(s, floor_rate=0.4)
    cal.add(1.0, 0.90)
    assert cal.next_probe(0.5) == 2.0, "double until bracketed"
    cal.add(2.0, 0.45)
    probe = cal.next_probe(0.5)
    assert probe is not None and 1.0 < probe < 2.0
    cal.add(probe, 0.51)
    assert cal.next_probe(0.5) is None and cal.point(0.5) == (probe, 0.51)
    # Nothing above 0.99 yet: halve, but never below the floor; no 99 % point exists then.
    assert cal.next_probe(0.99) == 0.5
    cal.add(0.5, 0.91)
    assert cal.next_probe(0.99) is None and cal.point(0.99) is None


def report_of(goods: dict[tuple[str, str], int], families: dict[str, str]) -> C.CorpusReport:
    scenarios = [C.Scenario(n, families[n], 0.0, "trace", 0.0, "servegen", "fixed:standard", "default",
                            "h200-qwen3-8b", 100, 0) for n in families]
    cols = C.columns(["scorpio"], {"a": {}, "b": {"aging_ms": 1.0}})
    latency = {"p50": 1.0, "p99": 2.0}
    per_class = {"standard": {"shed": 0, "ttft_ms": latency, "ttfat_ms": latency}}
    results = {(n, 0.5, label): {"good": g, "attainment": g / 100, "shed": 0, "throughput_tok_s": 1.0,
                                 "per_class": per_class} for (n, label), g in goods.items()}
    loads = {n: {0.5: (1.0, 0.5)} for n in families}
    return C.CorpusReport(scenarios, cols, loads, results)


def test_ratios_geometric_means_worst_and_leave_one_family_out_by_hand() -> None:
    families = {"x1": "azure-code", "x2": "azure-code", "y1": "mooncake"}
    goods = {("x1", "vllm-fcfs"): 50, ("x2", "vllm-fcfs"): 40, ("y1", "vllm-fcfs"): 50,
             ("x1", "scorpio"): 100, ("x2", "scorpio"): 40, ("y1", "scorpio"): 50,
             ("x1", "meridian[a]"): 80, ("x2", "meridian[a]"): 80, ("y1", "meridian[a]"): 40,
             ("x1", "meridian[b]"): 60, ("x2", "meridian[b]"): 60, ("y1", "meridian[b]"): 75}
    report = report_of(goods, families)
    assert report.ratio("x1", 0.5, "scorpio") == 2.0
    summary = report.summary(0.5, "meridian[a]")
    assert summary["geomean"] == pytest.approx((1.6 * 2.0 * 0.8) ** (1 / 3))
    assert (summary["worst"], summary["worst_scenario"]) == (pytest.approx(0.8), "y1")
    rows = {r["held_out"]: r for r in C.leave_one_family_out(report, ["meridian[a]", "meridian[b]"], "meridian[b]")}
    # Tuned on azure-code, `a` wins there (1.79 vs 1.35) but loses on the held-out mooncake (0.8 vs 1.5).
    assert rows["mooncake"]["picked"] == "meridian[a]"
    assert rows["mooncake"]["picked_on_held_out"] == pytest.approx(0.8)
    assert rows["mooncake"]["default_on_held_out"] == pytest.approx(1.5)
    text = C.render(report)
    assert "| x1 | 1 | 50% | 2.00 | 1.60 | 1.20 |" in text and "**worst**" in text


def test_a_notice_is_late_only_past_the_deadline_its_request_was_shed_for() -> None:
    targets = {"ttft_ms": 1000.0, "ttfat_ms": 15000.0}

    def result(ttft_p99: float | None, ttfat_p99: float | None) -> dict[str, object]:
        return {"shed_notice_ms_by_reason": {"ttft": {"p99": ttft_p99}, "ttfat": {"p99": ttfat_p99}}}

    # A TTFAT shed comes while the request thinks: after the TTFT target, before the TTFAT one.
    assert C.late_notices(result(900.0, 9000.0), targets) == []
    assert C.late_notices(result(1100.0, None), targets) == ["ttft"]
    assert C.late_notices(result(None, 16000.0), targets) == ["ttfat"]
    assert C.late_notices({"shed_notice_ms_by_reason": None}, targets) == []


def test_known_loads_are_read_back_and_bad_ones_named(tmp_path: Path) -> None:
    report = tmp_path / "corpus.json"
    report.write_text(json.dumps({"loads": {"mooncake-00": {"0.5": {"rate": 1.5, "fcfs_attainment": 0.51}}}}))
    assert C.loads_of(report) == {"mooncake-00": {0.5: (1.5, 0.51)}}
    for bad, named in [({"loads": {"m": {"0.6": {"rate": 1.0, "fcfs_attainment": 0.5}}}}, "load point 0.6"),
                       ({"loads": {"m": {"0.5": {"rate": -1.0, "fcfs_attainment": 0.5}}}}, "rate -1.0"),
                       ({"loads": {"m": {"0.5": {"rate": 1.0}}}}, "KeyError"),
                       ({"results": []}, "not a corpus report")]:
        report.write_text(json.dumps(bad))
        with pytest.raises(TraceError, match=named):
            C.loads_of(report)
    with pytest.raises(TraceError, match="no such|not a corpus report"):
        C.loads_of(tmp_path / "missing.json")


@needs_traces
def test_known_loads_must_cover_the_scenarios_and_cannot_feed_the_capacity_search(tmp_path: Path) -> None:
    scenario = C.make_corpus(1, seed=0, request_scale=0.02, families=["mooncake"])[0]
    with pytest.raises(TraceError, match=f"no scenario {scenario.name}"):
        C.run_corpus(C.Corpus(cache_dir=tmp_path), [scenario], C.columns([]), known_loads={})
    with pytest.raises(TraceError, match="capacity search needs"):
        C.run_corpus(C.Corpus(cache_dir=tmp_path), [scenario], C.columns([]), capacity=True, known_loads={})


@needs_traces
@pytest.mark.vllm
def test_a_tiny_scenario_replays_through_fcfs_and_meridian(tmp_path: Path) -> None:
    scenario = C.make_corpus(1, seed=0, request_scale=0.02, families=["mooncake"])[0]
    corpus = C.Corpus(cache_dir=tmp_path, jobs=1)
    jobs = [C.Job.of(scenario, 1.0, "vllm-fcfs"), C.Job.of(scenario, 1.0, "meridian", "shed", {C.ON_OVERLOAD: "shed"})]
    fcfs, meridian = corpus.run(jobs)
    for result in (fcfs, meridian):
        assert result["submitted"] == scenario.num_requests
        assert result["good"] + result["shed"] <= result["submitted"]
    assert fcfs["shed"] == 0
    # Cached: the same jobs give the same numbers without replaying.
    again = C.Corpus(cache_dir=tmp_path, jobs=1)
    assert again.run(jobs) == [fcfs, meridian]


# ---- vLLM's load valve as columns ---------------------------------------------------------------


class StubCorpus:
    """Answers every job from ``good(job)`` without replaying, noting the jobs it was given."""

    def __init__(self, good: Any) -> None:
        self.good = good
        self.jobs: list[C.Job] = []

    def run(self, jobs: list[C.Job]) -> list[dict[str, Any]]:
        self.jobs += jobs
        return [{"good": self.good(j), "attainment": self.good(j) / 100, "queue_cap": j.queue_cap} for j in jobs]


def scenario_x() -> C.Scenario:
    return C.Scenario("x", "azure-code", 0.0, "trace", 0.0, "servegen", "fixed:standard", "default", "h200-qwen3-8b",
                      100, 0)


def test_a_valve_job_is_keyed_by_its_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(C, "docs_queue_cap", lambda s, config_json: 77)
    s = scenario_x()
    docs = C.Job.of(s, 1.0, "vllm-fcfs+cap")
    assert docs.queue_cap == 77 and docs.policy == "vllm-fcfs+cap"
    assert docs.key("b") == C.Job.of(s, 1.0, "vllm-fcfs+cap=77").key("b") == C.Job.of(s, 1.0, "vllm-fcfs+cap", queue_cap=77).key("b")
    keys = {C.Job.of(s, 1.0, "vllm-fcfs+cap", queue_cap=c).key("b") for c in (5, 6, 77)}
    assert len(keys) == 3, "the cap is part of the key"
    assert C.Job.of(s, 1.0, "vllm-fcfs").key("b") not in keys and C.Job.of(s, 1.0, "vllm-fcfs").queue_cap is None
    assert C.Job.of(s, 1.0, "vllm-priority+cap").key("b") != docs.key("b")
    with pytest.raises(ValueError, match="queue cap '0'"):
        C.Job.of(s, 1.0, "vllm-fcfs+cap=0")
    with pytest.raises(ValueError, match="has no load valve"):
        C.Job.of(s, 1.0, "vllm-fcfs", queue_cap=5)


def test_the_tuned_valve_column_keeps_its_best_cap_and_replays_no_cap_that_never_binds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from meridian.replay.policies import TUNED_VALVE, queue_cap_grid

    monkeypatch.setattr(C, "scenario_cap_grid",
                        lambda s, never_binds_at=None: queue_cap_grid(10, never_binds_at or s.num_requests))
    s = scenario_x()
    (tuned,) = [c for c in C.columns([TUNED_VALVE]) if c.tuned]
    assert tuned.label == TUNED_VALVE and tuned.policy == "vllm-fcfs+cap"
    # Grid around 10 seats: 1, 2, 4, 5, 8, 10, 12, 15, 20, 30, ...; FCFS peaked at 20 unfinished there.
    fcfs = {"good": 40, "attainment": 0.4, "peak_in_flight": 20}
    goods = {1: 3, 2: 9, 4: 20, 5: 30, 8: 52, 9: 53, 10: 52, 11: 50, 12: 45, 15: 41}
    stub = StubCorpus(lambda job: goods[job.queue_cap])
    (result,) = C.evaluate(stub, [(tuned, s, 2.0)], {("x", 2.0, "vllm-fcfs"): fcfs})
    # The grid's best is 10 (a tie with 8: the larger); the refinement tries 9 and 11 around it.
    assert [j.queue_cap for j in stub.jobs] == [1, 2, 4, 5, 8, 10, 12, 15, 9, 11], "cap 20 refuses nothing: FCFS's"
    assert all(j.policy == "vllm-fcfs+cap" and j.rate == 2.0 for j in stub.jobs)
    assert result["tuned_queue_caps"] == {**{str(c): g for c, g in goods.items()}, "20": 40}
    assert result["queue_cap"] == 9 and result["good"] == 53, "the most good, found by the refinement"
    # Where no cap beats FCFS the tuned valve is FCFS itself (at a cap that never binds).
    stub = StubCorpus(lambda job: 10)
    (result,) = C.evaluate(stub, [(tuned, s, 2.0)], {("x", 2.0, "vllm-fcfs"): fcfs})
    assert result["queue_cap"] == 20 and result["good"] == 40 and result["peak_in_flight"] == 20
    # The docs-sized valve at a cap at or above the peak is FCFS's run; below it, a replay.
    monkeypatch.setattr(C, "docs_queue_cap", lambda s, config_json: 25)
    (docs,) = [c for c in C.columns(["vllm-fcfs+cap"]) if c.label == "vllm-fcfs+cap"]
    stub = StubCorpus(lambda job: 7)
    assert C.evaluate(stub, [(docs, s, 2.0)], {("x", 2.0, "vllm-fcfs"): fcfs}) == [{**fcfs, "queue_cap": 25}]
    assert stub.jobs == []
    assert C.evaluate(stub, [(docs, s, 2.0)], {("x", 2.0, "vllm-fcfs"): {**fcfs, "peak_in_flight": 26}})[0]["good"] == 7
    assert [j.queue_cap for j in stub.jobs] == [25]
    # Without FCFS's run there (the capacity search) every cap below the request count is replayed.
    stub = StubCorpus(lambda job: job.queue_cap)
    (result,) = C.evaluate(stub, [(tuned, s, 3.0)])
    grid = queue_cap_grid(10, 100)
    assert grid == [1, 2, 4, 5, 8, 10, 12, 15, 20, 30, 40, 60, 80, 120]
    assert [j.queue_cap for j in stub.jobs] == [*grid, 92, 105]
    assert result["queue_cap"] == 120


@needs_traces
@pytest.mark.vllm
def test_a_tiny_scenario_replays_behind_the_valve(tmp_path: Path) -> None:
    from meridian.replay.policies import TUNED_VALVE

    scenario = C.make_corpus(1, seed=0, request_scale=0.02, families=["mooncake"])[0]
    corpus = C.Corpus(cache_dir=tmp_path, jobs=1)
    cols = C.columns(["vllm-fcfs+cap=2", "vllm-fcfs+cap", TUNED_VALVE])
    report = C.run_corpus(corpus, [scenario], cols, points=(0.5,), known_loads={scenario.name: {0.5: (3.0, 0.5)}})
    fcfs = report.results[(scenario.name, 0.5, "vllm-fcfs")]
    capped = report.results[(scenario.name, 0.5, "vllm-fcfs+cap=2")]
    assert fcfs["refused"] == 0 and fcfs["peak_in_flight"] > 2
    assert capped["queue_cap"] == 2 and capped["refused"] > 0 and capped["shed"] == capped["refused"]
    assert capped["shed_by"] == {"valve": capped["refused"]}
    assert capped["good"] + capped["refused"] <= capped["submitted"]
    docs = report.results[(scenario.name, 0.5, "vllm-fcfs+cap")]
    assert docs["queue_cap"] > 1024 and docs["refused"] == 0, "1,024 seats: the docs' cap never binds on 12 requests"
    tuned = report.results[(scenario.name, 0.5, TUNED_VALVE)]
    assert tuned["good"] == max(tuned["tuned_queue_caps"].values()) >= fcfs["good"]
    text = C.render(report)
    assert "vLLM's load valve" in text and f"| 50% | {scenario.name} | {fcfs['peak_in_flight']} |" in text


def test_the_capacity_search_tunes_the_valve_at_every_probed_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    from meridian.replay.policies import TUNED_VALVE, queue_cap_grid

    monkeypatch.setattr(C, "scenario_cap_grid",
                        lambda s, never_binds_at=None: queue_cap_grid(4, never_binds_at or s.num_requests))
    monkeypatch.setattr(C, "docs_queue_cap", lambda s, config_json: 1000)
    s = scenario_x()
    calibration = C.Calibration(s)
    for rate, attainment in ((1.0, 0.9), (1.5, 0.8), (2.0, 0.6), (3.0, 0.4)):
        calibration.add(rate, attainment)
    # Only cap 4 keeps 80 % met, and only up to 2.4 req/s; every other cap (and the docs-sized
    # valve, which never binds on 100 requests) stays under it above FCFS's 1.5 req/s.
    stub = StubCorpus(lambda job: 85 if job.queue_cap == 4 and job.rate <= 2.4 else 50)
    caps = C.capacity_of(stub, {"x": calibration}, C.columns([TUNED_VALVE, "vllm-fcfs+cap"]))
    assert caps["x"]["vllm-fcfs"] == 1.5
    assert caps["x"]["vllm-fcfs+cap"] == 0.0, "never met 80 % at a probed rate"
    assert 1.875 <= caps["x"][TUNED_VALVE] <= 2.4, "the tuned pick at each probed rate, bracketed below 2.4"
    tuned_rates = {j.rate for j in stub.jobs if j.queue_cap != 1000}
    assert len(tuned_rates) >= 3 and all({j.queue_cap for j in stub.jobs if j.rate == r} >= {1, 2, 3, 4, 5}
                                         for r in tuned_rates), "the whole grid at every probed rate"
