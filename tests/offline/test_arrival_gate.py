"""The offline engine's arrival gate: a request it refuses never reaches the scheduler, ends at
its arrival as refused under load (a shed with notice time 0, the gate's reason recorded), and is
neither a rejection nor a failure; the requests it admits run exactly as without a gate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from meridian.offline.engine import (
    REFUSED, EngineSpec, OfflineEngine, OfflineRequest, build_scheduler, scripted_request,
)
from meridian.offline.tiny import ANSWER_IDS, EOS, THINK_END, WORD_IDS

pytestmark = pytest.mark.vllm

OUTPUT = [WORD_IDS[0], WORD_IDS[1], THINK_END, ANSWER_IDS[0], EOS]


class RecordingScheduler:
    """The stock scheduler, noting every request vLLM is handed."""

    @staticmethod
    def build(model_dir: Path) -> Any:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        class Recording(AsyncScheduler):  # type: ignore[misc]
            added: list[str]

            def add_request(self, request: Any) -> None:
                self.added.append(request.request_id)
                super().add_request(request)

        scheduler = build_scheduler(Recording, EngineSpec(model_dir=model_dir, num_blocks=64))
        scheduler.added = []
        return scheduler


def requests() -> list[OfflineRequest]:
    out = [scripted_request(f"r{i}", 5.0 * i, [10 + i] * 8, OUTPUT) for i in range(6)]
    # No room to generate: vLLM's frontend rejects it before any admission check.
    out.append(OfflineRequest("bad", 12.0, [9] * 8, 0, out[0].script))
    return sorted(out, key=lambda r: r.arrival_ms)


def run(model_dir: Path, gate: Any = None) -> tuple[OfflineEngine, Any]:
    scheduler = RecordingScheduler.build(model_dir)
    engine = OfflineEngine(scheduler, requests(), arrival_gate=gate)
    return engine, engine.run()


def test_a_refused_request_never_reaches_the_scheduler_and_is_a_shed_at_arrival(tiny_model: Path) -> None:
    asked: list[tuple[str, float, int]] = []

    def gate(engine: OfflineEngine, request: OfflineRequest) -> str | None:
        assert engine.now_ms >= request.arrival_ms, "asked when the engine adds it, never before its arrival"
        asked.append((request.req_id, engine.now_ms, engine.num_in_flight))
        return "closed" if request.req_id in ("r1", "r4") else None

    engine, result = run(tiny_model, gate)
    assert [a[0] for a in asked] == ["r0", "r1", "r2", "r3", "r4", "r5"], "asked once per valid request, in order"
    assert engine.scheduler.added == ["r0", "r2", "r3", "r5"]
    for req_id in ("r1", "r4"):
        t = result.timelines[req_id]
        assert t.finish_reason == REFUSED and t.shed_by == "closed"
        assert len(t.token_times_ms) == 0 and t.report is not None
        assert t.report.e2e_ms == 0.0, "the client hears at its arrival"
        assert not t.report.met_all and t.report.reason != "stopped"
    assert result.num_refused == 2
    assert result.num_rejected == 1 and result.timelines["bad"].finish_reason == "rejected"
    assert result.timelines["bad"].shed_by is None
    for req_id in ("r0", "r2", "r3", "r5"):
        assert result.timelines[req_id].finish_reason == "stop" and result.timelines[req_id].shed_by is None
    assert engine.num_unfinished == 0 and engine.observer.num_requests == 0


def test_a_gate_that_admits_everything_changes_nothing(tiny_model: Path) -> None:
    _, plain = run(tiny_model)
    _, gated = run(tiny_model, lambda engine, request: None)
    assert gated.num_refused == 0 and gated.num_steps == plain.num_steps and gated.clock_ms == plain.clock_ms
    for req_id, t in plain.timelines.items():
        assert list(gated.timelines[req_id].token_times_ms) == list(t.token_times_ms)
        assert gated.timelines[req_id].finish_reason == t.finish_reason
    assert gated.peak_in_flight == plain.peak_in_flight >= 1
