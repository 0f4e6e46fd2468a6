"""Fleet replay: N engines behind a router, each with its own policy's real scheduler, in virtual
time, with the router's bounded retries on sheds.

Each engine is an ``OfflineEngine`` as the single-engine replay builds it (its scheduler, core,
arrival gates and virtual device); they share one clock. A router model picks an engine for every
attempt of a request, as ``vllm-router`` (0.1.17) does:

- ``round_robin``: the next engine, one counter for every attempt (a retry does not skip an
  engine it already tried);
- ``least_requests``: the engine with the fewest of the router's requests in flight (ties: the
  lowest index after the last pick);
- ``power_of_two``: two engines drawn at random, the one with the lower load it last polled
  (``GET /get_load`` every ``poll_interval_ms``: Meridian's expected output tokens ahead; a
  stock engine serves none, so its load reads 0 and the pick is blind; ties go to the first
  drawn);
- ``saturation``: per class, the engine where a request of the class would wait least for its
  first token by the queue each engine last published (Meridian's arrival snapshot, polled like
  the load): a router that reads Meridian's per-class saturation. Needs Meridian engines.

A request shed before its first token — refused at arrival by Meridian's gate or vLLM's valve, or
shed by the engine's triage while it waited — is answered 429/503 at once, and the router retries
it after ``initial_backoff_ms × multiplier^(n−1)`` (it does not wait for ``Retry-After``), up to
``attempts`` in all; its client hears only the last answer. A retry is a new request on its engine
(its prompt prefilled again: the retry's cost); with ``reports_wait`` it tells the engine how long
its client already waited (``meridian_waited_ms``), otherwise the engine starts its clock again.
The judge always counts the client's clock, from the first send. A request shed after its first
token (its stream had begun) is not retried.

Engines advance together in slices of at most ``initial_backoff_ms``, so a shed found in a slice
is retried no earlier than the slice's end. Invariant: every request's attempts go to engines in
the order of their send times, its outcome is its last attempt's, and engines share nothing but
the clock.
"""

from __future__ import annotations

import heapq
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from meridian.offline.engine import EngineRun, OfflineEngine, OfflineRequest, Timeline
from meridian.replay.policies import ReplayResult, published_snapshot
from meridian.replay.report import is_shed, summarize

ROUTERS = ("round_robin", "least_requests", "power_of_two", "saturation")
#: vllm-router's default poll interval of ``/get_load`` (``--worker-startup-check-interval``, s).
POLL_INTERVAL_MS = 1_000.0


@dataclass(frozen=True)
class Retries:
    """The router's retries on a shed (vllm-router's ``--retry-*`` defaults: 50 ms × 1.5ⁿ)."""

    #: Attempts in all, the first included (1: no retry).
    attempts: int = 3
    initial_backoff_ms: float = 50.0
    multiplier: float = 1.5
    #: Whether a retry tells the engine how long its client already waited.
    reports_wait: bool = False

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"retries: attempts={self.attempts} must be at least 1 (the first send)")
        if not (self.initial_backoff_ms > 0 and self.multiplier >= 1):
            raise ValueError(
                f"retries: initial_backoff_ms={self.initial_backoff_ms} must be > 0 and "
                f"multiplier={self.multiplier} >= 1"
            )

    def backoff_ms(self, retry: int) -> float:
        """The wait before retry number ``retry`` (1 for the first retry)."""
        return self.initial_backoff_ms * self.multiplier ** (retry - 1)


@dataclass
class Attempt:
    request: OfflineRequest
    number: int
    first_sent_ms: float
    engine: int = -1  # set when sent

    @property
    def attempt_id(self) -> str:
        return self.request.req_id if self.number == 1 else f"{self.request.req_id}#retry{self.number - 1}"


class Router:
    """The router model (see the module docs)."""

    def __init__(
        self, kind: str, num_engines: int, *, seed: int = 0, poll_interval_ms: float = POLL_INTERVAL_MS
    ) -> None:
        if kind not in ROUTERS:
            raise ValueError(f"unknown router {kind!r}; known: {', '.join(ROUTERS)}")
        if num_engines < 1:
            raise ValueError(f"a fleet needs at least one engine, got {num_engines}")
        self.kind = kind
        self.num_engines = num_engines
        self.poll_interval_ms = poll_interval_ms
        self._rng = random.Random(seed)
        self._next = 0
        self.in_flight = [0] * num_engines
        self._polled_ms = -float("inf")
        self._snapshots: list[dict[str, Any] | None] = [None] * num_engines

    def poll(self, now_ms: float, engines: Sequence[OfflineEngine]) -> None:
        """Refreshes what the router knows of each engine when a poll is due."""
        if self.kind not in ("power_of_two", "saturation") or now_ms - self._polled_ms < self.poll_interval_ms:
            return
        self._polled_ms = now_ms
        for i, engine in enumerate(engines):
            text = published_snapshot(engine)
            self._snapshots[i] = json.loads(text) if text is not None else None
        if self.kind == "saturation" and any(s is None for s in self._snapshots):
            raise ValueError("the saturation router needs engines with a Meridian core")

    def load(self, engine: int) -> int:
        snapshot = self._snapshots[engine]
        return round(snapshot.get("expected_output_tokens", 0.0)) if snapshot is not None else 0

    def wait_ms(self, engine: int, slo_class: str | None) -> float:
        """The wait before a first token a request of ``slo_class`` would meet there, by the
        engine's last published queue (the core's gate's arithmetic, without its own count)."""
        snapshot = self._snapshots[engine]
        assert snapshot is not None
        ahead = dict(snapshot["num_ahead"]).get(slo_class or "", max((n for _, n in snapshot["num_ahead"]), default=0))
        behind_seats = max(0.0, ahead + 1 - snapshot["free_seats"])
        return float(snapshot["first_token_lead_ms"] + behind_seats / snapshot["starts_per_s"] * 1000.0)

    def pick(self, request: OfflineRequest) -> int:
        n = self.num_engines
        if self.kind == "round_robin":
            engine = self._next % n
            self._next += 1
        elif self.kind == "least_requests":
            order = [(self._next + i) % n for i in range(n)]
            engine = min(order, key=lambda e: self.in_flight[e])
            self._next = engine + 1
        elif self.kind == "power_of_two":
            a, b = self._rng.sample(range(n), 2) if n >= 2 else (0, 0)
            engine = b if self.load(b) < self.load(a) else a
        else:
            engine = min(range(n), key=lambda e: (self.wait_ms(e, request.slo_class), self.in_flight[e]))
        return engine


@dataclass
class FleetRun:
    """One fleet replay: each engine's run, every request's attempts and its client's outcome."""

    router: str
    engines: list[EngineRun] = field(default_factory=list)
    #: Per request id: the engines its attempts went to, in order.
    attempts: dict[str, list[int]] = field(default_factory=dict)
    #: Per request id: its client's outcome (the last attempt's timeline, under the request's id).
    outcomes: dict[str, Timeline] = field(default_factory=dict)

    @property
    def num_retries(self) -> int:
        return sum(len(a) - 1 for a in self.attempts.values())

    def client_run(self) -> EngineRun:
        """The requests as their clients saw them, one timeline each, on the fleet's clock."""
        out = EngineRun()
        out.timelines = dict(sorted(self.outcomes.items(), key=lambda kv: kv[1].arrival_ms))
        out.clock_ms = max((run.clock_ms for run in self.engines), default=0.0)
        out.num_steps = sum(run.num_steps for run in self.engines)
        out.device_busy_ms = sum(run.device_busy_ms for run in self.engines)
        out.peak_in_flight = max((run.peak_in_flight for run in self.engines), default=0)
        out.num_answer_preemption_alarms = sum(run.num_answer_preemption_alarms for run in self.engines)
        return out


def replay_fleet(
    engines: Sequence[OfflineEngine], requests: Sequence[OfflineRequest], router: Router, retries: Retries = Retries()
) -> FleetRun:
    """Replays ``requests`` through ``engines`` behind ``router`` (see the module docs)."""
    if router.num_engines != len(engines):
        raise ValueError(f"the router knows {router.num_engines} engines, the fleet has {len(engines)}")
    result = FleetRun(router.kind)
    queue: list[tuple[float, int, Attempt]] = []
    for seq, request in enumerate(sorted(requests, key=lambda r: r.arrival_ms)):
        queue.append((request.arrival_ms, seq, Attempt(request, 1, request.arrival_ms)))
    heapq.heapify(queue)
    seq = len(queue)
    live: list[dict[str, Attempt]] = [{} for _ in engines]
    clock_ms = 0.0
    while queue or any(live):
        target_ms = queue[0][0] if queue else max(e.now_ms for e in engines) + retries.initial_backoff_ms
        # Slices no longer than the first backoff: a shed found in one is retried at or after its end.
        while clock_ms < target_ms:
            clock_ms = min(target_ms, clock_ms + retries.initial_backoff_ms)
            for engine in engines:
                engine.advance_to(clock_ms)
            for retry in _collect_finished(engines, live, result, retries, router):
                heapq.heappush(queue, (retry[0], seq, retry[1]))
                seq += 1
        if not queue:
            if any(live) and all(not e.num_unfinished for e in engines):
                raise AssertionError("attempts in flight on idle engines")
            continue
        now_ms, _, attempt = heapq.heappop(queue)
        router.poll(now_ms, engines)
        attempt.engine = engine_index = router.pick(attempt.request)
        sent = (
            attempt.request
            if attempt.number == 1
            else replace(
                attempt.request,
                req_id=attempt.attempt_id,
                arrival_ms=now_ms,
                waited_ms=now_ms - attempt.first_sent_ms,
                reports_wait=retries.reports_wait,
            )
        )
        result.attempts.setdefault(attempt.request.req_id, []).append(engine_index)
        router.in_flight[engine_index] += 1
        live[engine_index][attempt.attempt_id] = attempt
        engines[engine_index].submit(sent)
        engines[engine_index].advance_to(now_ms)
    result.engines = [engine.finish() for engine in engines]
    return result


def _collect_finished(
    engines: Sequence[OfflineEngine], live: list[dict[str, Attempt]], result: FleetRun, retries: Retries, router: Router
) -> list[tuple[float, Attempt]]:
    """Moves finished attempts out of ``live``: a shed before the first token with attempts left
    becomes a retry (its send time and attempt), anything else the request's outcome."""
    out = []
    for index, engine in enumerate(engines):
        timelines = engine.result.timelines
        for attempt_id in [
            a for a, _ in live[index].items() if (t := timelines.get(a)) is not None and t.finish_reason is not None
        ]:
            attempt = live[index].pop(attempt_id)
            router.in_flight[index] -= 1
            timeline = timelines[attempt_id]
            bounced = is_shed(timeline) and not timeline.token_times_ms
            if bounced and attempt.number < retries.attempts:
                finished_ms = timeline.finished_ms if timeline.finished_ms is not None else engine.now_ms
                out.append(
                    (
                        finished_ms + retries.backoff_ms(attempt.number),
                        Attempt(attempt.request, attempt.number + 1, attempt.first_sent_ms),
                    )
                )
                continue
            result.outcomes[attempt.request.req_id] = replace(
                timeline, req_id=attempt.request.req_id, arrival_ms=attempt.first_sent_ms
            )
    return out


def fleet_summary(run: FleetRun, label: str) -> dict[str, Any]:
    """The clients' view (``report.summarize`` over each request's outcome, from its first send)
    with the retries, and per engine the attempts it took and the good ones among its outcomes."""
    summary = summarize(ReplayResult(label, run.client_run()))
    summary["router"] = run.router
    summary["retries"] = run.num_retries
    summary["requests_retried"] = sum(len(a) > 1 for a in run.attempts.values())
    per_engine = [{"attempts": 0, "outcomes": 0, "good": 0} for _ in run.engines]
    for req_id, engines in run.attempts.items():
        for e in engines:
            per_engine[e]["attempts"] += 1
        per_engine[engines[-1]]["outcomes"] += 1
        report = run.outcomes[req_id].report
        per_engine[engines[-1]]["good"] += int(report is not None and report.reason == "stopped" and report.met_all)
    summary["engines"] = per_engine
    summary["good_per_engine"] = summary["good"] / max(len(run.engines), 1)
    return summary
