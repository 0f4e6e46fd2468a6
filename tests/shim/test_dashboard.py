"""The Grafana dashboard in ``deploy/grafana/`` reads only series Meridian defines (its expressions
against ``names.METRIC_NAMES``; against a live server's ``/metrics`` in
``tests/live/test_metrics_live.py``) and is a dashboard Grafana can import."""

from __future__ import annotations

import json
import re
from pathlib import Path

from meridian.vllm.names import METRIC_NAMES

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "meridian-dashboard.json"
SERIES = re.compile(r"\b((?:meridian|vllm):[A-Za-z0-9_:]+)")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def dashboard_series() -> set[str]:
    """Every series name an expression of the dashboard reads."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return {name for expr in exprs for name in SERIES.findall(expr)}


def family(name: str) -> str:
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in METRIC_NAMES.values():
            return name.removesuffix(suffix)
    return name


def test_every_meridian_series_the_dashboard_reads_is_one_meridian_defines() -> None:
    meridian = {family(n) for n in dashboard_series() if n.startswith("meridian:")}
    assert meridian, "the dashboard reads Meridian's series"
    assert meridian <= set(METRIC_NAMES.values()), meridian - set(METRIC_NAMES.values())


def test_the_dashboard_covers_phase_mix_ttfo_vs_target_attainment_and_preemptions() -> None:
    read = {family(n) for n in dashboard_series()}
    for key in ("num_requests", "ttfat", "class_target", "requests_finished", "preemptions", "phase_weighted_queue"):
        assert METRIC_NAMES[key] in read, key


def test_the_dashboard_is_importable_json_with_unique_panel_ids() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"] and dashboard["title"]
    assert all(p["targets"] and all(t["expr"].strip() for t in p["targets"]) for p in dashboard["panels"])
