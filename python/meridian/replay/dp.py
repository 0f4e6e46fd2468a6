"""Data-parallel replay: vLLM's internal load balancer over several engine ranks, in virtual time.

With ``--data-parallel-size N`` vLLM runs N engine cores, each with its own scheduler and its own
GPU, and its API server(s) pick a rank for every request (``DPLBAsyncMPClient.
get_core_engine_for_request``, vLLM 0.32) from what the DP coordinator last published. Here each
rank is an ``OfflineEngine`` (its own scheduler and core, its own virtual device) on one shared
virtual clock: at every request's arrival each rank is advanced to that time, the balancer of the
API server that took the request picks a rank, and the request is submitted there.

Balancers (``BALANCERS``), both with vLLM's client bookkeeping around the score:

- ``count`` — vLLM's own rule: score = max(client_count × this client's in-flight requests on the
  rank, waiting + running) + waiting × 6 × max(0, KV usage − 0.5), lowest wins, the scan starting
  one rank further after every pick (ties rotate), the picked rank's waiting count raised by
  client_count until the next snapshot;
- ``phase_weighted`` — the same client with the score replaced by the rank's
  ``phase_weighted_queue`` (the rank core's ``engine_load``: expected remaining output of every
  request, in fresh requests of its class), raised by client_count after a pick until the next
  snapshot (a fresh request weighs one). Needs ranks with a Meridian core.

What the balancer knows, as vLLM plumbs it (``stats_interval_ms``, vLLM's
``min_stats_update_interval_ms`` of 100): an engine sends the coordinator (waiting, running, KV
usage) when its counts change; the coordinator publishes the latest of every engine to the API
servers every 100 ms when something changed (every 5 s otherwise), and each publication replaces
an API server's copy, local raises included. Here the snapshot is taken on the shared clock's
100 ms ticks, from each rank advanced to the tick (its clock may stand up to one step past it: a
snapshot at most one step fresher than vLLM's); ``phase_weighted`` ranks are taken to send their
queue at every tick (it moves with every token). ``stats_interval_ms=0`` gives every balancer the
exact state at the arrival instead. The in-flight count is exact (the client's own bookkeeping).
Requests go to API servers by a hash of their id (the kernel spreads connections between API
server processes; load-blind).

Invariant: every request is submitted to exactly one rank, at its arrival, and ranks share
nothing but the clock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from meridian.offline.engine import EngineRun, OfflineEngine, OfflineRequest
from meridian.replay.policies import HostTier, PolicySpec, ReplayResult, replay_engine
from meridian.replay.profiles import Profile
from meridian.replay.report import summarize

BALANCERS = ("count", "phase_weighted")
#: vLLM's DP coordinator publishes engines' stats at most this often (``min_stats_update_interval_ms``)…
STATS_INTERVAL_MS = 100.0
#: …and, when nothing changed, this often.
IDLE_PUBLISH_MS = 5000.0
#: vLLM's KV-pressure penalty: waiting × ``KV_PENALTY`` × max(0, usage − ``KV_PENALTY_FROM``).
KV_PENALTY, KV_PENALTY_FROM = 6.0, 0.5


@dataclass(frozen=True)
class RankStats:
    """What an engine core tells the coordinator (vLLM's three numbers), and Meridian's
    phase-weighted queue when the rank has a Meridian core (else ``None``)."""

    num_waiting: int
    num_running: int
    kv_cache_usage: float
    phase_weighted_queue: float | None


def rank_stats(engine: OfflineEngine) -> RankStats:
    """The rank's stats now: vLLM's ``get_request_counts`` and ``get_kv_cache_usage``, and the
    core's ``engine_load`` over vLLM's running and waiting lists."""
    from meridian.vllm.scheduler import MeridianScheduler

    scheduler = engine.scheduler
    num_running, num_waiting = scheduler.get_request_counts()
    queue = scheduler.engine_load()[1] if isinstance(scheduler, MeridianScheduler) else None
    return RankStats(num_waiting, num_running, float(scheduler.get_kv_cache_usage()), queue)


class ApiServerBalancer:
    """One API server's ``DPLBAsyncMPClient``: its copy of the coordinator's stats (raised
    locally after each pick), its exact in-flight requests per rank and its rotating scan start;
    ``balancer`` names the score it ranks engines by."""

    def __init__(self, balancer: str, num_ranks: int, client_count: int = 1, client_index: int = 0) -> None:
        if balancer not in BALANCERS:
            raise ValueError(f"unknown balancer {balancer!r}; known: {', '.join(BALANCERS)}")
        self.balancer = balancer
        self.client_count = client_count
        #: Per rank: [waiting, running, KV usage, phase-weighted queue] as last published.
        self.stats: list[list[float]] = [[0, 0, 0.0, 0.0] for _ in range(num_ranks)]
        #: Per rank: this client's requests there that have not finished.
        self.in_flight: list[set[str]] = [set() for _ in range(num_ranks)]
        self.start = num_ranks * client_index // client_count

    def on_published(self, stats: Sequence[RankStats]) -> None:
        """A coordinator publication: replaces the copy (and the local raises with it)."""
        if self.balancer == "phase_weighted" and any(s.phase_weighted_queue is None for s in stats):
            raise ValueError("the phase_weighted balancer needs ranks with a Meridian core")
        self.stats = [[s.num_waiting, s.num_running, s.kv_cache_usage, s.phase_weighted_queue or 0.0] for s in stats]

    def score(self, rank: int) -> float:
        waiting, running, kv_usage, queue = self.stats[rank]
        if self.balancer == "phase_weighted":
            return queue
        score = max(self.client_count * len(self.in_flight[rank]), waiting + running)
        if waiting:
            score += waiting * KV_PENALTY * max(0.0, kv_usage - KV_PENALTY_FROM)
        return score

    def pick(self, req_id: str) -> int:
        """``get_core_engine_for_request``: the lowest score, scanning from the rotating start
        (ties go to the first scanned); then the local raise and the rotation."""
        num_ranks = len(self.stats)
        best, best_score = 0, float("inf")
        for i in range(num_ranks):
            rank = (self.start + i) % num_ranks
            score = self.score(rank)
            if score < best_score:
                best, best_score = rank, score
        self.stats[best][3 if self.balancer == "phase_weighted" else 0] += self.client_count
        self.start = (self.start + 1) % num_ranks
        self.in_flight[best].add(req_id)
        return best

    def forget_finished(self, engines: Sequence[OfflineEngine]) -> None:
        """Drops finished requests from the in-flight sets (vLLM's client sees them finish)."""
        for rank, live in enumerate(self.in_flight):
            timelines = engines[rank].result.timelines
            done = [r for r in live if (t := timelines.get(r)) is not None and t.finish_reason is not None]
            live.difference_update(done)


def api_server_of(req_id: str, num_api_servers: int) -> int:
    """The API server a request reaches: load-blind, by a hash of its id."""
    digest = hashlib.blake2b(req_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % num_api_servers


class Coordinator:
    """vLLM's DP coordinator as the balancers see it: the latest stats each engine sent, published
    every ``interval_ms`` when something changed and every ``IDLE_PUBLISH_MS`` otherwise."""

    def __init__(self, num_ranks: int, interval_ms: float, resend_every_tick: bool) -> None:
        self.interval_ms = interval_ms
        self.resend_every_tick = resend_every_tick
        self.latest: list[RankStats | None] = [None] * num_ranks
        self.sent_counts: list[tuple[int, int] | None] = [None] * num_ranks
        self.last_publish_ms = -float("inf")
        self.next_tick_ms = 0.0

    def tick(self, now_ms: float, engines: Sequence[OfflineEngine]) -> list[RankStats] | None:
        """The publication at ``now_ms`` (a tick), if there is one."""
        changed = False
        for rank, engine in enumerate(engines):
            stats = rank_stats(engine)
            counts = (stats.num_running, stats.num_waiting)
            # An engine sends when its counts change (vLLM's `_maybe_publish_request_counts`);
            # a phase-weighted rank's queue moves with every token, so it sends at every tick.
            if self.resend_every_tick or counts != self.sent_counts[rank]:
                self.sent_counts[rank] = counts
                self.latest[rank] = stats
                changed = True
        if not changed and now_ms - self.last_publish_ms < IDLE_PUBLISH_MS:
            return None
        self.last_publish_ms = now_ms
        return [s if s is not None else RankStats(0, 0, 0.0, 0.0) for s in self.latest]


@dataclass
class DataParallelRun:
    """One data-parallel replay: each rank's run and where every request went."""

    balancer: str
    ranks: list[EngineRun]
    #: Request id → rank, in arrival order.
    assignment: dict[str, int] = field(default_factory=dict)

    def merged(self) -> EngineRun:
        """All ranks as one run: every request's timeline, counters summed, the clock of the
        rank that finished last, device time summed over the ranks' devices."""
        out = EngineRun()
        for run in self.ranks:
            overlap = out.timelines.keys() & run.timelines.keys()
            if overlap:
                raise AssertionError(f"requests served by more than one rank: {sorted(overlap)[:5]}")
            out.timelines.update(run.timelines)
        for f in fields(EngineRun):
            values = [getattr(run, f.name) for run in self.ranks]
            if f.name == "timelines":
                continue
            if f.name == "clock_ms":
                out.clock_ms = max(values)
            elif f.name == "restore_counters":
                counters = [v for v in values if v is not None]
                out.restore_counters = {k: sum(c[k] for c in counters) for k in counters[0]} if counters else None
            elif isinstance(values[0], list):
                setattr(out, f.name, [x for v in values for x in v])
            else:
                setattr(out, f.name, sum(values))
        out.timelines = dict(sorted(out.timelines.items(), key=lambda kv: kv[1].arrival_ms))
        return out


def replay_data_parallel(
    engines: Sequence[OfflineEngine],
    requests: Sequence[OfflineRequest],
    balancer: str,
    *,
    stats_interval_ms: float = STATS_INTERVAL_MS,
    num_api_servers: int = 1,
) -> DataParallelRun:
    """Replays ``requests`` over ``engines`` (the ranks; what was submitted to them before stays
    there, seen by the balancers only through the ranks' stats) with ``balancer``; see the module
    docs."""
    num_ranks = len(engines)
    clients = [ApiServerBalancer(balancer, num_ranks, num_api_servers, i) for i in range(num_api_servers)]
    coordinator = Coordinator(num_ranks, stats_interval_ms, resend_every_tick=balancer == "phase_weighted")
    result = DataParallelRun(balancer, [])
    for request in sorted(requests, key=lambda r: r.arrival_ms):
        now_ms = request.arrival_ms
        if stats_interval_ms > 0:
            while coordinator.next_tick_ms <= now_ms:
                tick_ms = coordinator.next_tick_ms
                for engine in engines:
                    engine.advance_to(tick_ms)
                published = coordinator.tick(tick_ms, engines)
                if published is not None:
                    for client in clients:
                        client.on_published(published)
                coordinator.next_tick_ms += stats_interval_ms
        for engine in engines:
            engine.advance_to(now_ms)
        if stats_interval_ms <= 0:
            exact = [rank_stats(engine) for engine in engines]
            for client in clients:
                client.on_published(exact)
        client = clients[api_server_of(request.req_id, num_api_servers)]
        client.forget_finished(engines)
        rank = client.pick(request.req_id)
        result.assignment[request.req_id] = rank
        engines[rank].submit(request)
    result.ranks = [engine.finish() for engine in engines]
    return result


def replay_ranks(
    spec: PolicySpec,
    requests: Sequence[OfflineRequest],
    profile: Profile,
    balancer: str,
    *,
    num_ranks: int = 2,
    meridian_config: dict[str, Any],
    model_dir: Path,
    stats_interval_ms: float = STATS_INTERVAL_MS,
    num_api_servers: int = 1,
    progress: Callable[[int], None] | None = None,
    host_tier: HostTier | None = None,
) -> DataParallelRun:
    """``num_ranks`` engines of policy ``spec`` on ``profile`` (each as ``replay_engine`` builds
    one: its own scheduler, core and device), balanced by ``balancer``."""
    engines = [
        replay_engine(
            spec,
            [],
            profile,
            meridian_config=meridian_config,
            model_dir=model_dir,
            progress=progress,
            host_tier=host_tier,
        )
        for _ in range(num_ranks)
    ]
    return replay_data_parallel(
        engines, requests, balancer, stats_interval_ms=stats_interval_ms, num_api_servers=num_api_servers
    )


def dp_summary(run: DataParallelRun, label: str) -> dict[str, Any]:
    """The replay's summary over all ranks (``report.summarize``'s, goodput per second of the
    whole run) with per rank: requests, good ones, attainment, TTFAT p50 / p90, device use."""
    merged = run.merged()
    summary = summarize(ReplayResult(label, merged))
    summary["balancer"] = run.balancer
    duration_ms = max(merged.clock_ms, 1e-9)
    per_rank = []
    for rank in run.ranks:
        s = summarize(ReplayResult(label, rank))
        per_rank.append(
            {
                "submitted": s["submitted"],
                "completed": s["completed"],
                "good": s["good"],
                "attainment": s["attainment"],
                "ttfat_ms": s["ttfat_ms"],
                "preemptions": s["preemptions"],
                "device_utilization": rank.device_busy_ms / duration_ms,
            }
        )
    summary["ranks"] = per_rank
    summary["device_utilization"] = merged.device_busy_ms / duration_ms / max(len(run.ranks), 1)
    return summary
