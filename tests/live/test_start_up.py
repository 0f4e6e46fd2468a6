"""Live: ``vllm serve`` (CPU build, tiny reasoning model) with ``--scheduler-cls
meridian.vllm.MeridianScheduler`` and a misspelt key in Meridian's ``--additional-config``: the
server stops at start-up, non-zero, its log naming the key. It serves nothing, so it runs beside
the serving tests, not in their one-at-a-time queue (``tests/conftest.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from meridian.demo.server import VllmServer

from tiny_server import FIXTURE, server_args

pytestmark = pytest.mark.vllm


def test_bad_additional_config_stops_the_server_naming_the_key(cache_dir: Path, tmp_path: Path) -> None:
    args = server_args() + ["--additional-config", '{"meridian": {"think_batch_multiplyer": 3}}']
    bad = VllmServer(FIXTURE, args, log_path=tmp_path / "bad.log", cache_dir=cache_dir)
    code = bad.wait_for_exit(timeout_s=300)
    assert code != 0
    assert "think_batch_multiplyer" in bad.log()
