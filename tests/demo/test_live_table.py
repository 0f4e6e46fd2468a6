"""The demo's live part: each round's figures land in their table rows, the machine's speed probe is
shown beside them, a figure a round lacks reads ``-``; a bad rate or request count is refused by name."""

from __future__ import annotations

from typing import Any

import pytest

from meridian.cli import main
from meridian.demo.live import ONE_ROUND_CAVEAT, render, table_row
from meridian.replay.policies import MERIDIAN, STOCK


def round_row(ttfo_p50_ms: float, probe: dict[str, float] | None) -> dict[str, Any]:
    return {"ttfo_p50_ms": ttfo_p50_ms, "per_class": {"interactive": {"good": 81}}, "errors": 0,
            "failed_in_records": 1, "empty_responses": 0, "preemptions_by_phase": {"answer": 2},
            "speed_probe_ms": probe}


def test_the_table_shows_each_rounds_figures_and_its_speed_probe() -> None:
    rows = {STOCK.name: table_row(round_row(323.4, {"before": 131.2, "after": 128.9})),
            MERIDIAN.name: table_row(round_row(911.0, None))}
    lines = {line[:44].strip(): line[44:].split() for line in render(rows).splitlines()[2:]}
    assert lines["TTFO p50 [ms] (first answer token)"] == ["323", "911"]
    assert lines["of which interactive"] == ["81", "81"]
    assert lines["failed requests"] == ["1", "1"]
    assert lines["of which answering (Meridian ledger)"] == ["2", "2"]
    assert lines["machine speed probe, before / after [ms]"] == ["131", "/", "129", "-"]
    assert lines["TTFT p50 [ms]"] == ["-", "-"]
    assert "make bench-live" in ONE_ROUND_CAVEAT


@pytest.mark.parametrize(("args", "message"), [
    (["--live-rate", "0"], "expected a number > 0, got '0'"),
    (["--live-rate", "fast"], "expected a number, got 'fast'"),
    (["--live-requests", "0"], "expected a whole number >= 1, got '0'"),
])
def test_the_live_parts_arguments_are_refused_by_name_before_anything_runs(
        capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--parts", "live", *args])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err and args[0] in err
