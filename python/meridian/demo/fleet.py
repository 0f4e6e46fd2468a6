"""A fleet round: two ``vllm serve`` replicas behind the real ``vllm-router`` (PyPI, the vLLM
project's own Rust router), aiperf at the router, measured at the client.

It owns the router process (``VllmRouter``: its command line, its health wait, its Prometheus
series), the placement of two replicas on two CPUs (each engine core and its worker pinned to its
own CPU; the API servers, the router and aiperf on either), and one round (``run_fleet_round``):
fresh replicas and a fresh router, a few warm-up requests through the router, aiperf's timed
replay of the workload at the router, then what the router counted (retries, retries exhausted,
circuit-breaker transitions and the servers it left open) and what each replica counted (Meridian's
sheds and refusals, vLLM's valve's rejections). A request the router retried is one record at the
client, timed from its first send: aiperf sees only the router. ``bench/fleet_ab.py`` runs rounds
of this per arm. Invariant: every arm gets the same replicas' arguments but the scheduler's (and
an arm's valve), the same router flags but its policy and retries, the same dataset and placement.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from meridian.demo.loadgen import (
    Arm,
    RecordTimes,
    RoundSettings,
    Workload,
    aiperf_command,
    aiperf_environment,
    metric_sums,
    pin,
    read_export,
    run_logged,
    server_args,
    settled_metric_sums,
)
from meridian.demo.server import VllmServer, free_port, stream_chat, wait_healthy
from meridian.offline.tiny import task_prompt
from meridian.vllm.names import METRIC_NAMES

#: The router's policies a fleet arm may name (``vllm-router --policy``).
ROUTER_POLICIES = ("round_robin", "power_of_two", "cache_aware", "random")
#: The router's counters a round reads, before and after its load.
ROUTER_COUNTERS = (
    "vllm_router_requests_total",
    "vllm_router_retries_total",
    "vllm_router_retries_exhausted_total",
    "vllm_router_cb_state_transitions_total",
)
#: What each replica counts of its refusals: Meridian's engine sheds and refusals at arrival, and
#: vLLM's own valve's rejections (``--max-num-queued-reqs``).
REPLICA_COUNTERS = (METRIC_NAMES["shed_requests"], METRIC_NAMES["arrival_refusals"], "vllm:admission_rejections_total")


def router_binary() -> Path:
    """``vllm-router`` beside this interpreter (``make setup`` installs it), else on ``PATH``."""
    beside = Path(sys.executable).parent / "vllm-router"
    found = beside if beside.exists() else shutil.which("vllm-router")
    if found is None:
        raise FileNotFoundError("vllm-router is not installed: `make setup` installs the pinned one into .venv")
    return Path(found)


@dataclass
class VllmRouter:
    """``vllm-router`` on 127.0.0.1 in front of ``worker_urls``, for the duration of a ``with``
    block; ``flags`` are its options after the workers and the policy. With ``prefill_decode``
    (a prefill server's URL and a decode server's) it runs in vLLM's P/D mode instead
    (``--vllm-pd-disaggregation``, ``worker_urls`` unused): each request is sent to the prefill
    server with ``max_tokens`` 1 and ``kv_transfer_params`` asking for a remote decode, then to the
    decode server with the prefill's answer's ``kv_transfer_params``."""

    worker_urls: list[str]
    policy: str
    log_path: Path
    flags: tuple[str, ...] = ()
    start_timeout_s: float = 60.0
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    prefill_decode: tuple[str, str] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def command(self) -> list[str]:
        if self.prefill_decode is None:
            workers = ["--worker-urls", *self.worker_urls]
        else:
            prefill, decode = self.prefill_decode
            workers = ["--vllm-pd-disaggregation", "--prefill", prefill, "--decode", decode]
        return [
            str(router_binary()),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *workers,
            "--policy",
            self.policy,
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(self.metrics_port),
            "--log-level",
            "warning",
            *self.flags,
        ]

    def __enter__(self) -> VllmRouter:
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            wait_healthy(self.base_url, self.process, self.start_timeout_s, "vllm-router", self.log_path)
        except TimeoutError:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)

    def series(self) -> dict[str, dict[str, float]]:
        """Every sample of the router's ``/metrics``: name → label text → value."""
        import httpx
        from prometheus_client.parser import text_string_to_metric_families

        out: dict[str, dict[str, float]] = {}
        for family in text_string_to_metric_families(httpx.get(self.metrics_url, timeout=10.0).text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out.setdefault(sample.name, {})[labels] = sample.value
        return out

    def sums(self, names: Iterable[str]) -> dict[str, float]:
        series = self.series()
        return {name: sum(series.get(name, {}).values()) for name in names}

    def open_circuits(self) -> list[str]:
        """The workers whose circuit breaker is not closed now (``vllm_router_cb_state`` ≠ 0)."""
        states = self.series().get("vllm_router_cb_state", {})
        return sorted(labels for labels, value in states.items() if value != 0)


@dataclass(frozen=True)
class FleetArm:
    """One fleet configuration: the replicas' server (``Arm``: policy and valve) and the router's
    policy and extra flags (e.g. ``--disable-retries``)."""

    name: str
    server: Arm
    router_policy: str = "round_robin"
    router_flags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.router_policy not in ROUTER_POLICIES:
            raise ValueError(
                f"fleet arm {self.name!r}: unknown router policy {self.router_policy!r}; "
                f"expected one of {', '.join(ROUTER_POLICIES)}"
            )


def replica_cpus(num_replicas: int) -> list[int | None]:
    """The CPU each replica's engine is pinned to: one each while there are CPUs for all, else
    none (unpinned)."""
    cpus = sorted(os.sched_getaffinity(0))
    return list(cpus[:num_replicas]) if len(cpus) >= num_replicas >= 2 else [None] * num_replicas


def run_fleet_round(
    name: str,
    arm: FleetArm,
    dataset: Path,
    out: Path,
    settings: RoundSettings,
    *,
    num_replicas: int = 2,
    retries: int | None = None,
    on_phase: Callable[[str], None] = lambda phase: None,
) -> tuple[dict[str, Any], list[RecordTimes]]:
    """Fresh replicas and router for ``arm``, warm-up requests through the router, aiperf's timed
    replay of ``dataset`` at the router; the round's row (aiperf's summary and goodput per class
    as ``run_round`` reports them, plus the router's and the replicas' counters) and records.
    ``retries``: the router's attempts in all (``--retry-max-retries``; default: the replicas
    plus one, as the recipe says), unless the arm's flags set them."""
    model_path = settings.model.path(settings.repo).resolve()
    cpus = replica_cpus(num_replicas)
    with ExitStack() as stack:
        on_phase("starting the replicas")
        replicas: list[VllmServer] = []
        for i in range(num_replicas):
            request_log = out / f"requests-{name}-r{i}.jsonl"
            request_log.unlink(missing_ok=True)
            args = server_args(
                arm.server,
                settings.model,
                settings.repo,
                request_log=request_log,
                meridian_config=settings.meridian_config,
            ) + list(settings.extra_server_args)
            replica = stack.enter_context(
                VllmServer(model_path, args, log_path=out / f"serve-{name}-r{i}.log", cache_dir=settings.cache_dir)
            )
            if cpus[i] is not None:
                pin(replica, engine_cpu=cpus[i], front_anywhere=True)
            replicas.append(replica)
        flags = arm.router_flags
        if "--retry-max-retries" not in flags and "--disable-retries" not in flags:
            flags += ("--retry-max-retries", str(retries or num_replicas + 1))
        router = stack.enter_context(
            VllmRouter([r.base_url for r in replicas], arm.router_policy, out / f"router-{name}.log", flags)
        )
        on_phase("cooling down")
        time.sleep(settings.cooldown_s)
        on_phase("warming up")
        for i in range(settings.warmup * num_replicas):
            stream_chat(router.base_url, str(model_path), task_prompt(20 + i, 5), max_tokens=200)
        router_before = router.sums(ROUTER_COUNTERS)
        replicas_before = [metric_sums(r.base_url, REPLICA_COUNTERS) for r in replicas]
        artifacts = out / f"aiperf-{name}"
        shutil.rmtree(artifacts, ignore_errors=True)
        cmd = aiperf_command(
            settings.aiperf,
            model_path,
            router.base_url,
            dataset,
            artifacts,
            workers=settings.workers,
            goodput=settings.model.classes[0],
            raw=settings.raw,
        )
        on_phase("load")
        started = time.monotonic()
        returncode = run_logged(
            cmd, out / f"aiperf-{name}.log", settings.timeout_s, lambda: None, env=aiperf_environment()
        )
        if returncode != 0:
            raise RuntimeError(f"aiperf exited with {returncode}; log: {out / f'aiperf-{name}.log'}")
        wall_s = time.monotonic() - started
        replicas_after = [settled_metric_sums(r.base_url, REPLICA_COUNTERS) for r in replicas]
        router_after = router.sums(ROUTER_COUNTERS)
        open_circuits = router.open_circuits()
        row, records = read_export(artifacts, settings.model.classes, valve=arm.server.max_num_queued_reqs is not None)
    row.update(
        {
            "policy": arm.name,
            "wall_s": wall_s,
            "engine_cpus": cpus,
            "router": {
                k.removeprefix("vllm_router_").removesuffix("_total"): router_after[k] - router_before[k]
                for k in ROUTER_COUNTERS
            },
            "open_circuits_at_end": open_circuits,
            "replicas": [
                {k: after[k] - before[k] for k in REPLICA_COUNTERS}
                for before, after in zip(replicas_before, replicas_after)
            ],
        }
    )
    return row, records


def measure_fleet_capacity_rps(
    out: Path,
    settings: RoundSettings,
    *,
    lengths: str,
    num_requests: int,
    num_replicas: int = 2,
    on_phase: Callable[[str], None] = lambda phase: None,
) -> float:
    """Requests per second a stock fleet behind the router (round robin) completes with a
    standing queue: ``num_requests`` of the workload's mix at once (another seed than the timed
    load's), the completed ones over aiperf's benchmark duration — the rate past which the fleet
    is overloaded, measured on this machine now."""
    dataset = out / "capacity-burst.jsonl"
    dataset.write_text(
        Workload(
            num_requests,
            1_000.0,
            settings.model.classes,
            seed=1,
            lengths=lengths,
            max_think=settings.model.max_think,
            max_tokens=settings.model.max_tokens,
        ).jsonl()
    )
    arm = FleetArm("capacity-stock", Arm("stock", "stock"))
    row, records = run_fleet_round(
        "capacity-stock", arm, dataset, out, settings, num_replicas=num_replicas, on_phase=on_phase
    )
    completed = sum(1 for r in records if r.ok and r.ttfo_ms is not None)
    if not completed or not row["duration_s"]:
        raise RuntimeError(f"the capacity burst completed no request ({row['error_kinds']}); logs under {out}")
    return completed / float(row["duration_s"])
