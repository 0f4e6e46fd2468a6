"""Live soak (issue 25, part 3): one Meridian server on the tiny model under aiperf at the knee for
a long run, a hostile client beside it for the second part, and what the server holds sampled
throughout.

One server (pinned as the live A/B pins it: engine core and worker on one core, the API server,
aiperf and the hostile client on the other), request log and metrics on. Two phases on the same
server, back to back:

1. ``clean`` (``--clean-min``): aiperf alone, the reference for the well-behaved client's
   latencies;
2. ``hostile`` (``--hostile-min``): aiperf again, with a second client that, round robin, aborts
   streams mid-answer, drops the connection right after sending, sends bad JSON, unknown and
   ever-new ``meridian_class`` strings (thousands of distinct ones), wrong types, a huge
   ``max_tokens``, negative thinking budgets and a 2 MiB class name.

Sampled every ``--sample-s``: the RSS of the engine core, its worker and the API server, and the
series on ``/metrics`` (all of them, and Meridian's). At the end: requests served and failed by
cause (aiperf's errors, the hostile client's statuses), RSS at the start of each phase and the
end (growth over the hostile phase: target ≤ 5 %), the series count (target: constant; label
values only from the configured classes), request-log lines against vLLM's own count of finished
requests, and the well-behaved client's p99 latencies in each phase (target: hostile within 10 %
of clean). The rate defaults to the model's knee (``LIVE_MODELS``: the lowest swept rate at which
stock vLLM's TTFO p99 reached 5x its unloaded value).

    .venv/bin/python bench/live_soak.py [--clean-min 10] [--hostile-min 30] [--rate R]
        [--sample-s 30] [--policy meridian|stock] [--out bench/results/live_soak_tiny_DATE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import string
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from meridian.demo.loadgen import (  # noqa: E402
    ENGINE_PROCESS_TITLES, Workload, add_round_arguments, aiperf_command, aiperf_environment, pin, read_export,
    round_settings, run_logged, server_args, speed_probe_ms,
)
from meridian.demo.server import VllmServer, stream_chat  # noqa: E402
from meridian.offline.tiny import task_prompt  # noqa: E402
from meridian.vllm.names import CLASS_ARG, THINKING_BUDGET_ARG, XARGS_FIELD  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
#: Hostile requests a second, all behaviours together.
HOSTILE_RATE_RPS = 4.0


# ---- the hostile client -------------------------------------------------------------------------


class Hostile:
    """The second client: one behaviour after another, each outcome counted by behaviour."""

    BEHAVIOURS = ("abort_mid_answer", "disconnect", "bad_json", "unknown_class", "new_class", "wrong_type",
                  "huge_max_tokens", "negative_budget", "huge_class")

    def __init__(self, base_url: str, model: str) -> None:
        self.base_url = base_url
        self.model = model
        self.outcomes: dict[str, Counter[str]] = {b: Counter() for b in self.BEHAVIOURS}
        self.stop = threading.Event()
        self.rng = random.Random(7)
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def _body(self, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "stream": True, "temperature": 0.0, "max_tokens": 200,
                                "messages": [{"role": "user", "content": task_prompt(self.rng.randint(20, 99), 10)}]}
        body.update(extra)
        return body

    def _xargs(self, **xargs: Any) -> dict[str, Any]:
        return self._body(**{XARGS_FIELD: xargs})

    def _new_class(self) -> str:
        return "hostile-" + "".join(self.rng.choices(string.ascii_lowercase + string.digits, k=16))

    async def _post(self, client: Any, behaviour: str, content: bytes | None = None, body: Any = None) -> None:
        url = f"{self.base_url}/v1/chat/completions"
        headers = {"content-type": "application/json"}
        payload = content if content is not None else json.dumps(body).encode()
        async with client.stream("POST", url, content=payload, headers=headers) as response:
            if behaviour == "abort_mid_answer" and response.status_code == 200:
                async for line in response.aiter_lines():
                    if '"content":"' in line.replace(" ", "") and '"content":""' not in line.replace(" ", ""):
                        break  # the answer has started: leave mid-stream
                self.outcomes[behaviour]["200-aborted"] += 1
                return
            await response.aread()
            self.outcomes[behaviour][str(response.status_code)] += 1

    async def _disconnect(self) -> None:
        parsed = urlparse(self.base_url)
        payload = json.dumps(self._body()).encode()
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {parsed.hostname}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(payload)}\r\n\r\n").encode()
        _reader, writer = await asyncio.open_connection(parsed.hostname, parsed.port)
        writer.write(head + payload)
        await writer.drain()
        writer.transport.abort()  # gone before any answer
        self.outcomes["disconnect"]["sent-then-dropped"] += 1

    async def _one(self, client: Any, behaviour: str) -> None:
        try:
            if behaviour == "disconnect":
                await self._disconnect()
            elif behaviour == "bad_json":
                await self._post(client, behaviour, content=b'{"model": "x", "messages": [')
            elif behaviour == "unknown_class":
                await self._post(client, behaviour, body=self._xargs(**{CLASS_ARG: "platinum"}))
            elif behaviour == "new_class":
                await self._post(client, behaviour, body=self._xargs(**{CLASS_ARG: self._new_class()}))
            elif behaviour == "wrong_type":
                await self._post(client, behaviour, body=self._xargs(**{CLASS_ARG: [1, {"a": None}]}))
            elif behaviour == "huge_max_tokens":
                await self._post(client, behaviour, body=self._body(max_tokens=10**12))
            elif behaviour == "negative_budget":
                await self._post(client, behaviour, body=self._xargs(**{THINKING_BUDGET_ARG: -self.rng.randint(1, 10**6)}))
            elif behaviour == "huge_class":
                await self._post(client, behaviour, body=self._xargs(**{CLASS_ARG: "x" * (2 << 20)}))
            else:
                await self._post(client, behaviour, body=self._body())
        except Exception as error:  # noqa: BLE001 - every failure is an outcome to count
            self.outcomes[behaviour][f"client-{type(error).__name__}"] += 1

    async def _run(self) -> None:
        import httpx

        tasks: set[asyncio.Task[None]] = set()
        async with httpx.AsyncClient(timeout=120.0, limits=httpx.Limits(max_connections=32)) as client:
            i = 0
            while not self.stop.is_set():
                task = asyncio.create_task(self._one(client, self.BEHAVIOURS[i % len(self.BEHAVIOURS)]))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                i += 1
                await asyncio.sleep(1.0 / HOSTILE_RATE_RPS)
            if tasks:
                await asyncio.wait(tasks, timeout=60.0)

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> dict[str, dict[str, int]]:
        self.stop.set()
        self.thread.join(timeout=90.0)
        return {b: dict(c) for b, c in self.outcomes.items()}


# ---- what the server holds ---------------------------------------------------------------------


def process_rss(server: VllmServer) -> dict[str, int]:
    """RSS of the engine core and its worker (``engine``) and of the API server (``api``)."""
    import psutil

    assert server.process is not None
    root = psutil.Process(server.process.pid)
    rss = {"engine": 0, "api": 0}
    for proc in [root, *root.children(recursive=True)]:
        try:
            title = " ".join(proc.cmdline()) + " " + proc.name()
            key = "engine" if any(t in title or t[:15] in title for t in ENGINE_PROCESS_TITLES) else "api"
            rss[key] += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return rss


def series(base_url: str, configured_classes: set[str]) -> dict[str, Any]:
    """The series on ``/metrics``: how many in all and of Meridian's, and label values naming a
    class outside the configured ones (hostile names must never become series)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base_url}/metrics", timeout=10.0).text
    total = meridian = 0
    foreign: set[str] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            total += 1
            if sample.name.startswith("meridian"):
                meridian += 1
                for key, value in sample.labels.items():
                    if "class" in key and value not in configured_classes:
                        foreign.add(value)
    return {"total": total, "meridian": meridian, "foreign_class_labels": sorted(foreign)[:10]}


class Sampler:
    """Samples RSS and series every ``interval_s`` on a thread, tagged with the phase."""

    def __init__(self, server: VllmServer, classes: set[str], interval_s: float) -> None:
        self.server, self.classes, self.interval_s = server, classes, interval_s
        self.phase = "start"
        self.samples: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.started = time.monotonic()

    def take(self) -> dict[str, Any]:
        sample = {"t_s": round(time.monotonic() - self.started, 1), "phase": self.phase,
                  "rss": process_rss(self.server), "series": series(self.server.base_url, self.classes)}
        self.samples.append(sample)
        return sample

    def _run(self) -> None:
        while not self.stop.wait(self.interval_s):
            try:
                self.take()
            except Exception as error:  # noqa: BLE001 - a failed sample is recorded, not fatal
                self.samples.append({"t_s": round(time.monotonic() - self.started, 1), "phase": self.phase,
                                     "error": repr(error)})


# ---- the run -----------------------------------------------------------------------------------


def aiperf_phase(name: str, minutes: float, rate: float, seed: int, srv: VllmServer, model_path: Path,
                 settings: Any, placement: dict[str, Any] | None, out: Path) -> dict[str, Any]:
    """aiperf for ``minutes`` at ``rate`` (its fixed schedule of a seeded Poisson workload)."""
    num_requests = max(1, int(minutes * 60 * rate))
    dataset = out / f"workload-{name}.jsonl"
    dataset.write_text(Workload(num_requests, rate, settings.model.classes, seed=seed).jsonl())
    artifacts = out / f"aiperf-{name}"
    shutil.rmtree(artifacts, ignore_errors=True)
    cmd = aiperf_command(settings.aiperf, model_path, srv.base_url, dataset, artifacts, workers=settings.workers,
                         goodput=settings.model.classes[0])
    if placement is not None:
        cmd = ["taskset", "-c", ",".join(map(str, placement["front_cpus"])), *cmd]
    started = time.monotonic()
    code = run_logged(cmd, out / f"aiperf-{name}.log", minutes * 60 * 1.5 + 600, lambda: None, env=aiperf_environment())
    if code != 0:
        raise RuntimeError(f"aiperf exited with {code}; log: {out / f'aiperf-{name}.log'}")
    row, records = read_export(artifacts, settings.model.classes)
    row["wall_s"] = time.monotonic() - started
    row["num_records"] = len(records)
    row["failed_by_cause"] = dict(Counter(str(r.error)[:80] for r in records if not r.ok))
    return row


def finished_requests(base_url: str) -> float:
    from meridian.demo.loadgen import settled_metric_sums

    return settled_metric_sums(base_url, ["vllm:request_success_total"])["vllm:request_success_total"]


def read_request_log(path: Path) -> dict[str, Any]:
    """Lines of the request log by finish reason, and whether any request is logged twice."""
    lines = [json.loads(line) for line in path.open()] if path.exists() else []
    return {"lines": len(lines), "by_reason": dict(Counter(r["reason"] for r in lines)),
            "distinct_req_ids": len({r["req_id"] for r in lines})}


def growth(a: float, b: float) -> float:
    return b / a - 1.0 if a else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_round_arguments(parser)
    parser.add_argument("--clean-min", type=float, default=10.0)
    parser.add_argument("--hostile-min", type=float, default=30.0)
    parser.add_argument("--sample-s", type=float, default=30.0)
    parser.add_argument("--policy", choices=["meridian", "stock"], default="meridian",
                        help="stock: vLLM's own scheduler, for attributing what the engine holds")
    args = parser.parse_args()
    settings = round_settings(args, REPO, "live_soak")
    out: Path = args.out
    model_path = settings.model.path(REPO).resolve()
    request_log = out / "requests.jsonl"
    request_log.unlink(missing_ok=True)
    classes = {c.name for c in settings.model.classes}
    srv_args = server_args(args.policy, settings.model, REPO, request_log=request_log)
    report: dict[str, Any] = {"policy": args.policy, "rate_rps": args.rate, "clean_min": args.clean_min, "hostile_min": args.hostile_min}
    with VllmServer(model_path, srv_args, log_path=out / "serve.log", cache_dir=settings.cache_dir) as srv:
        placement = pin(srv) if settings.pin else None
        report["placement"] = placement
        engine_cpus = None if placement is None else placement["engine_cpus"]
        report["speed_probe_ms_before"] = speed_probe_ms(engine_cpus)
        for i in range(settings.warmup):
            stream_chat(srv.base_url, str(model_path), task_prompt(20 + i, 5), max_tokens=200)
        sampler = Sampler(srv, classes, args.sample_s)
        sampler.phase = "clean"
        report["at_clean_start"] = sampler.take()
        sampler.thread.start()
        report["clean"] = aiperf_phase("clean", args.clean_min, args.rate, 0, srv, model_path, settings, placement, out)
        print(f"clean: {json.dumps({k: report['clean'].get(k) for k in ('requests', 'ttfo_p99_ms', 'itl_p99_ms')})}",
              flush=True)
        sampler.phase = "hostile"
        report["at_hostile_start"] = sampler.take()
        hostile = Hostile(srv.base_url, str(model_path))
        hostile.start()
        report["hostile"] = aiperf_phase("hostile", args.hostile_min, args.rate, 1, srv, model_path, settings,
                                         placement, out)
        report["hostile_outcomes"] = hostile.finish()
        time.sleep(5.0)  # the last aborted streams reach the engine
        sampler.stop.set()
        sampler.thread.join()
        sampler.phase = "end"
        report["at_end"] = sampler.take()
        report["vllm_finished_requests"] = finished_requests(srv.base_url)
        report["speed_probe_ms_after"] = speed_probe_ms(engine_cpus)
        report["server_alive"] = srv.process is not None and srv.process.poll() is None
        report["samples"] = sampler.samples
    report["request_log"] = read_request_log(request_log)
    summarize(report)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out / 'report.json'}")
    return 0


def summarize(report: dict[str, Any]) -> None:
    start, hostile_start, end = report["at_clean_start"], report["at_hostile_start"], report["at_end"]
    clean, hostile = report["clean"], report["hostile"]
    series_counts = {s["series"]["total"] for s in report["samples"] if "series" in s}
    summary = {
        "engine_rss_mib": [round(x["rss"]["engine"] / 2**20, 1) for x in (start, hostile_start, end)],
        "engine_rss_growth_hostile": growth(hostile_start["rss"]["engine"], end["rss"]["engine"]),
        "engine_rss_growth_all": growth(start["rss"]["engine"], end["rss"]["engine"]),
        "api_rss_mib": [round(x["rss"]["api"] / 2**20, 1) for x in (start, hostile_start, end)],
        "api_rss_growth_hostile": growth(hostile_start["rss"]["api"], end["rss"]["api"]),
        "series_total_min_max": [min(series_counts), max(series_counts)] if series_counts else None,
        "meridian_series": [x["series"]["meridian"] for x in (start, hostile_start, end)],
        "foreign_class_labels": end["series"]["foreign_class_labels"],
        # vLLM counts the requests its engine finishes (``vllm:request_success_total``); a stream
        # the client drops is aborted by the API server and never reaches that count, but is in
        # Meridian's log as ``aborted``.
        "request_log": report["request_log"],
        "vllm_finished_requests": report["vllm_finished_requests"],
        "hostile_aborts_and_drops": sum(report["hostile_outcomes"][b].get(k, 0) for b, k in (
            ("abort_mid_answer", "200-aborted"), ("disconnect", "sent-then-dropped"))),
        "p99_ms": {k: [clean.get(k), hostile.get(k), growth(clean.get(k) or 0, hostile.get(k) or 0)]
                   for k in ("ttft_p99_ms", "ttfo_p99_ms", "itl_p99_ms")},
        "aiperf_requests": [clean.get("num_records"), hostile.get("num_records")],
        "aiperf_failed": [clean.get("failed_by_cause"), hostile.get("failed_by_cause")],
        "hostile_requests": sum(sum(c.values()) for c in report["hostile_outcomes"].values()),
        "server_alive": report["server_alive"],
        "speed_probe_ms": [report["speed_probe_ms_before"], report["speed_probe_ms_after"]],
    }
    report["summary"] = summary
    print(json.dumps(summary, indent=1))
    print(json.dumps(report["hostile_outcomes"], indent=1))


if __name__ == "__main__":
    sys.exit(main())
