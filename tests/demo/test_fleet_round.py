"""The fleet round's parts that need no server: its arms, the router's command line, and where
the replicas' engines go. The router in front of real servers is ``tests/router`` and
``tests/live/test_router_live.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from meridian.demo.fleet import ROUTER_POLICIES, FleetArm, VllmRouter, replica_cpus, router_binary
from meridian.demo.loadgen import Arm


def test_an_arm_names_a_router_policy_the_router_has() -> None:
    FleetArm("ok", Arm("meridian", "meridian"), "power_of_two")
    with pytest.raises(ValueError, match="unknown router policy 'least_busy'"):
        FleetArm("bad", Arm("meridian", "meridian"), "least_busy")
    assert "cache_aware" in ROUTER_POLICIES, "the router's default, which the recipe warns against"


def test_the_router_command_names_every_worker_its_policy_and_its_own_metrics(tmp_path: Path) -> None:
    router = VllmRouter(["http://127.0.0.1:1", "http://127.0.0.1:2"], "round_robin", tmp_path / "router.log",
                        ("--disable-retries",))
    command = router.command()
    assert Path(command[0]) == router_binary()
    workers = command[command.index("--worker-urls") + 1:command.index("--policy")]
    assert workers == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert command[command.index("--policy") + 1] == "round_robin" and command[-1] == "--disable-retries"
    assert command[command.index("--prometheus-port") + 1] == str(router.metrics_port) != str(router.port)


def test_each_replica_gets_its_own_cpu_where_there_are_enough() -> None:
    import os

    cpus = sorted(os.sched_getaffinity(0))
    placed = replica_cpus(2)
    if len(cpus) >= 2:
        assert placed == cpus[:2]
    else:
        assert placed == [None, None]
    assert replica_cpus(len(cpus) + 1) == [None] * (len(cpus) + 1)
