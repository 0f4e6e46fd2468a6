"""MeridianScheduler's series, written by the engine-core side into Prometheus multiprocess files
and read back with prometheus-client's own ``MultiProcessCollector`` (what ``/metrics`` serves),
on vLLM's real scheduler classes driven offline. The live server checks are in
``tests/live/test_metrics_live.py``."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import values
from prometheus_client.multiprocess import MultiProcessCollector

from meridian.offline.engine import EngineSpec, OfflineEngine, build_scheduler, scripted_request
from meridian.offline.tiny import WORD_IDS, reasoning_script
from meridian.vllm.metrics import MULTIPROC_DIR_ENV, REQUEST_STATES
from meridian.vllm.names import METRIC_NAMES, SERIES

pytestmark = pytest.mark.vllm


def collected(directory: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    families = MultiProcessCollector(None, path=str(directory)).collect()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def total(samples: dict[Any, float], name: str, **labels: str) -> float:
    return sum(v for (n, lab), v in samples.items() if n == name and all((k, x) in lab for k, x in labels.items()))


def scheduler_with_metrics(model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **config: Any) -> Any:
    from meridian.vllm import MeridianScheduler

    monkeypatch.setenv("MERIDIAN_BUS_DIR", str(tmp_path))
    spec = EngineSpec(model_dir=model, additional_config={"meridian": {"metrics": True, **config}})
    return build_scheduler(MeridianScheduler, spec)


def test_finished_requests_are_observed_once_and_gauges_read_zero_when_idle(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    value_class, env_dir = values.ValueClass, os.environ.get(MULTIPROC_DIR_ENV)
    scheduler = scheduler_with_metrics(tiny_model, tmp_path, monkeypatch)
    prompt = [WORD_IDS[i % len(WORD_IDS)] for i in range(20)]
    requests = [scripted_request(f"r{i}", i * 5.0, prompt, reasoning_script(10 + 7 * i, 4)) for i in range(5)]
    run = OfflineEngine(scheduler, requests).run()
    samples = collected(scheduler.metrics.directory)
    ttfat = METRIC_NAMES["ttfat"]
    assert total(samples, f"{ttfat}_count") == 5
    assert math.isclose(total(samples, f"{ttfat}_sum"), sum(r.ttfat_ms for r in run.reports) / 1000.0, rel_tol=1e-9)
    assert total(samples, f"{METRIC_NAMES['thinking_tokens']}_sum") == sum(r.num_think_tokens for r in run.reports)
    for state in REQUEST_STATES:
        assert total(samples, METRIC_NAMES["num_requests"], state=state) == 0.0
    assert total(samples, METRIC_NAMES["class_target"], target="ttfat", **{"class": "standard"}) == 60.0
    assert total(samples, METRIC_NAMES["step_time_model"], term="base") > 0.0
    # Only Meridian's own values went to files: the process' prometheus_client is as it was.
    assert values.ValueClass is value_class and os.environ.get(MULTIPROC_DIR_ENV) == env_dir


def test_a_fresh_scheduler_publishes_every_gauge_before_its_first_request(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A dashboard pointed at a server that has served nothing yet reads an empty queue, not "no
    # data": Prometheus' multiprocess collector leaves out a gauge that was never set.
    scheduler = scheduler_with_metrics(tiny_model, tmp_path, monkeypatch)
    samples = collected(scheduler.metrics.directory)
    exported = {name for name, _labels in samples}
    gauges = {s.name for s in SERIES.values() if s.kind == "gauge"}
    assert gauges <= exported, sorted(gauges - exported)
    for state in REQUEST_STATES:
        assert total(samples, METRIC_NAMES["num_requests"], state=state) == 0.0
    assert total(samples, METRIC_NAMES["phase_weighted_queue"]) == 0.0


def test_every_series_is_made_from_its_definition_in_names(tmp_path: Path) -> None:
    # The docs' metrics reference is generated from `names.SERIES`: what the engine core exports
    # must be exactly that, name, type, labels and HELP text.
    from prometheus_client.metrics import MetricWrapperBase

    from meridian.vllm.metrics import MeridianMetrics

    targets = {"standard": {"ttft_ms": 3000.0, "ttfat_ms": 60000.0, "answer_tpot_ms": 100.0, "e2e_ms": None}}
    metrics = MeridianMetrics(tmp_path, "m", 0, targets)
    made = {}
    for series in vars(metrics).values():
        if isinstance(series, MetricWrapperBase):
            name = series._name + ("_total" if series._type == "counter" else "")
            made[name] = (series._type, tuple(series._labelnames), series._documentation)
    assert made == {s.name: (s.kind, ("model_name", "engine", *s.labels), s.help) for s in SERIES.values()
                    if s.process == "engine"}


def test_the_api_servers_refusals_land_beside_the_engines_series(tmp_path: Path) -> None:
    from meridian.vllm.metrics import ArrivalMetrics

    refusals = ArrivalMetrics(tmp_path, "m", ["gold", "standard"])
    refusals.refused("gold")
    refusals.refused("gold")
    refusals.refused("unknown")  # a class the server lacks never reaches here; if it did, nothing breaks
    samples = collected(tmp_path)
    name = METRIC_NAMES["arrival_refusals"]
    assert total(samples, name, **{"class": "gold"}) == 2.0
    assert total(samples, name, **{"class": "standard"}) == 0.0, "every class exported before its first refusal"
    series = SERIES["arrival_refusals"]
    assert series.process == "api_server" and series.kind == "counter"


def test_counters_mirror_the_core_and_are_never_counted_twice(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = scheduler_with_metrics(tiny_model, tmp_path, monkeypatch)
    OfflineEngine(scheduler, [scripted_request("a", 0.0, [WORD_IDS[0]] * 20, reasoning_script(30, 4))]).run()
    stats = scheduler.meridian.stats()
    for _ in range(3):  # refreshing again adds nothing
        scheduler.metrics._last_gauges_s = float("-inf")
        scheduler._refresh_metrics()
    samples = collected(scheduler.metrics.directory)
    for phase in ("prefill", "think", "answer"):
        assert total(samples, METRIC_NAMES["preemptions"], phase=phase) == stats[f"num_preemptions_{phase}"]
    assert total(samples, METRIC_NAMES["requests_finished"]) == 1


def test_metrics_false_publishes_nothing(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scheduler = scheduler_with_metrics(tiny_model, tmp_path, monkeypatch, metrics=False)
    assert scheduler.metrics is None
    assert not list(tmp_path.glob("meridian-metrics-*"))


def test_an_unwritable_metrics_folder_is_a_config_error_naming_the_variable(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from meridian.errors import ConfigError

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="MERIDIAN_BUS_DIR"):
        scheduler_with_metrics(tiny_model, blocker, monkeypatch)


def test_a_paused_engines_gauges_show_exactly_what_it_holds_arrivals_included(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # vLLM's `/pause?mode=keep` (a weight update) stops the steps that refresh the gauges: they are
    # written when the pause takes effect and on each arrival during it, so they match the engine.
    from vllm.v1.core.sched.interface import PauseState

    from meridian.vllm import MeridianScheduler

    monkeypatch.setenv("MERIDIAN_BUS_DIR", str(tmp_path))
    spec = EngineSpec(model_dir=tiny_model, max_num_seqs=2, additional_config={"meridian": {"metrics": True}})
    scheduler = build_scheduler(MeridianScheduler, spec)
    prompt = [WORD_IDS[i % len(WORD_IDS)] for i in range(20)]
    engine = OfflineEngine(scheduler)
    for i in range(6):
        engine.submit(scripted_request(f"r{i}", 0.0, prompt, reasoning_script(200, 4)))
    engine.advance_to(40.0)

    def held() -> dict[str, float]:
        started = sum(r.num_output_tokens > 0 for r in scheduler.running)
        return {"waiting": len(scheduler.waiting) + len(scheduler.kv_holding_waiting),
                "prefilling": len(scheduler.running) - started, "thinking": started, "answering": 0}

    def gauges() -> dict[str, float]:
        samples = collected(scheduler.metrics.directory)
        return {state: total(samples, METRIC_NAMES["num_requests"], state=state) for state in REQUEST_STATES}

    scheduler.set_pause_state(PauseState.PAUSED_ALL)
    assert held() == {"waiting": 4, "prefilling": 0, "thinking": 2, "answering": 0}
    assert gauges() == held()
    engine.submit(scripted_request("late", engine.now_ms, prompt, reasoning_script(5, 2)))
    engine.advance_to(engine.now_ms)  # a paused engine takes no step: the arrival is only added
    assert held()["waiting"] == 5 and gauges() == held()
    scheduler.set_pause_state(PauseState.UNPAUSED)
    run = engine.finish()
    assert len(run.reports) == 7
    assert gauges() == {state: 0.0 for state in REQUEST_STATES}
