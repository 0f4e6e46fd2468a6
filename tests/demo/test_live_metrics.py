"""The live demo's client-side metrics (DESIGN §4) on hand-made stream timings."""

from __future__ import annotations

import pytest

from meridian.demo.live import LiveWorkload, summarize_live
from meridian.demo.server import StreamResult


def test_client_side_metrics_follow_the_definitions() -> None:
    a = StreamResult(status=200, sent_s=10.0, reasoning="3 2 1", content="a b c", finish_reason="stop",
                     reasoning_times_s=[10.1, 10.2, 10.3], content_times_s=[10.5, 10.55, 10.9])
    b = StreamResult(status=200, sent_s=10.0, reasoning="1", content="a", finish_reason="stop",
                     reasoning_times_s=[10.3], content_times_s=[10.4])
    failed = StreamResult(status=500, sent_s=10.0, error="boom")
    m = summarize_live([a, b, failed], wall_s=2.0)
    assert m["completed"] == 2.0
    # TTFT: 100 ms (a) and 300 ms (b); TTFAT: 500 ms (a) and 400 ms (b). Percentiles are nearest-rank.
    assert (m["ttft_p50_ms"], m["ttft_p99_ms"]) == (pytest.approx(100.0), pytest.approx(300.0))
    assert (m["ttfat_p50_ms"], m["ttfat_p99_ms"]) == (pytest.approx(400.0), pytest.approx(500.0))
    # Answer gaps of request a: 50 ms and 350 ms; 350 ms > 5 x 50 ms is one stall.
    assert m["answer_stalls"] == 1.0
    assert m["answer_itl_max_ms"] == pytest.approx(350.0)
    assert m["answer_tpot_mean_ms"] == pytest.approx(200.0)
    assert m["throughput_tok_s"] == pytest.approx(8 / 2.0)


def test_workload_is_seeded() -> None:
    assert LiveWorkload(seed=3).prompts() == LiveWorkload(seed=3).prompts()
    assert all(20 <= n <= 99 and 5 <= m <= 26 for n, m in LiveWorkload().prompts())
