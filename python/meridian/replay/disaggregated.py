"""Disaggregated replay: a prefill pool and a decode pool of engines behind vllm-router's P/D mode,
each engine with its side's policy's real scheduler and vLLM's own ``NixlConnector``, in virtual
time, the KV moving between them at a transfer cost.

Every client request becomes two, as vllm-router 0.1.17 (``--vllm-pd-disaggregation``) makes it
(docs/operations/disaggregated.md): the router picks a prefill engine and sends the request with
``max_tokens`` 1 and ``kv_transfer_params`` ``{"do_remote_decode": true}``; the prefill engine
computes the prompt, samples one token (the router drops it) and answers with the hand-back its
connector wrote, holding the prompt's blocks. The router then picks a decode engine and sends
the request unchanged with that hand-back: vLLM there allocates the blocks, parks the request in
``WAITING_FOR_REMOTE_KVS`` while NIXL reads the KV (``offline.engine.RemoteKvLink``: the read
costs ``TransferCost.read_ms(tokens)`` beside the forward passes), computes the prompt's last
token itself and streams the answer. When the read is done (or the decode side ends the request
before reading) the prefill engine's blocks are freed. Each pool's engine is picked by the same
router model as the colocated fleet (``meridian.replay.fleet.Router``), over its own pool.

The client's clock runs from its first send; the decode side's scheduler starts its own at the
hand-over unless ``reports_wait`` (vllm-router passes no arrival time on; a router that sent
``x-meridian-waited-ms`` would). A shed before the first token on either side is answered at once
and the router retries the pair from the prefill side, as the colocated fleet retries a shed
(``fleet.Retries``); its client hears only the last answer.

Engines advance together in slices of ``slice_ms``: a prefill answer found in a slice is handed to
the decode pool at the moment it was answered, and the decode engine adds it at its next step
boundary after that (at most one slice late). Invariant: every request's prefill and decode
attempts go to engines in the order of their send times; a decode attempt carries the hand-back of
the prefill attempt just before it; its outcome is its last attempt's; every block a prefill
engine held for a reader is freed by the end.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from meridian.offline.engine import (
    EngineRun,
    FixedScript,
    OfflineEngine,
    OfflineRequest,
    RemoteKvLink,
    Timeline,
)
from meridian.offline.tiny import WORD_IDS
from meridian.replay.fleet import Retries, Router
from meridian.replay.policies import ReplayResult
from meridian.replay.report import is_shed, summarize

#: The slice engines advance in (ms): the most a hand-over can lag its prefill answer.
SLICE_MS = 5.0
#: What the prefill engine "samples" for a request's one token (the router drops it).
_PREFILL_TOKEN = WORD_IDS[0]


@dataclass(frozen=True)
class Split:
    """A P/D layout: ``num_prefill`` prefill engines and ``num_decode`` decode engines."""

    num_prefill: int
    num_decode: int

    @classmethod
    def parse(cls, text: str) -> Split:
        """``"P:D"`` (e.g. ``"1:3"``), each at least 1; a ``ValueError`` naming the text otherwise."""
        parts = text.split(":")
        try:
            num_prefill, num_decode = (int(p) for p in parts)
        except ValueError:
            raise ValueError(f"--disaggregated {text!r}: expected PREFILL:DECODE engine counts, such as 1:3") from None
        if num_prefill < 1 or num_decode < 1:
            raise ValueError(f"--disaggregated {text!r}: each pool needs at least one engine")
        return cls(num_prefill, num_decode)

    @property
    def num_engines(self) -> int:
        return self.num_prefill + self.num_decode

    def __str__(self) -> str:
        return f"{self.num_prefill}:{self.num_decode}"


def split_policy(name: str) -> tuple[str, str]:
    """The prefill and decode policies of a P/D policy name: ``"A/B"`` (prefill A, decode B) or
    ``"A"`` (both)."""
    prefill, slash, decode = name.partition("/")
    if not slash:
        return name, name
    if not prefill or not decode or "/" in decode:
        raise ValueError(f"P/D policy {name!r}: expected POLICY or PREFILL_POLICY/DECODE_POLICY")
    return prefill, decode


@dataclass
class PdAttempt:
    """One try of a client request through the pair."""

    request: OfflineRequest
    number: int
    first_sent_ms: float
    prefill_engine: int = -1
    decode_engine: int = -1

    @property
    def attempt_id(self) -> str:
        return self.request.req_id if self.number == 1 else f"{self.request.req_id}#retry{self.number - 1}"


@dataclass
class PdRun:
    """One disaggregated replay: each engine's run, every request's attempts and its client's
    outcome, and what moved between the pools."""

    split: Split
    prefill: list[EngineRun] = field(default_factory=list)
    decode: list[EngineRun] = field(default_factory=list)
    #: Per request id: its attempts as (prefill engine, decode engine or None if it ended there).
    attempts: dict[str, list[tuple[int, int | None]]] = field(default_factory=dict)
    outcomes: dict[str, Timeline] = field(default_factory=dict)
    #: Per request id reaching a decode engine: when its prefill side answered, from the first send.
    prefill_ms: dict[str, float] = field(default_factory=dict)
    num_reads: int = 0
    num_read_tokens: int = 0
    read_ms_total: float = 0.0
    num_sends: int = 0

    @property
    def num_retries(self) -> int:
        return sum(len(a) - 1 for a in self.attempts.values())

    def client_run(self) -> EngineRun:
        """The requests as their clients saw them, on the pools' clock."""
        engines = [*self.prefill, *self.decode]
        out = EngineRun()
        out.timelines = dict(sorted(self.outcomes.items(), key=lambda kv: kv[1].arrival_ms))
        out.clock_ms = max((run.clock_ms for run in engines), default=0.0)
        out.num_steps = sum(run.num_steps for run in engines)
        out.device_busy_ms = sum(run.device_busy_ms for run in engines)
        out.peak_in_flight = max((run.peak_in_flight for run in engines), default=0)
        out.num_answer_preemption_alarms = sum(run.num_answer_preemption_alarms for run in self.decode)
        return out


class _Pool:
    """One side's engines behind its router, with the attempts in flight on each."""

    def __init__(self, engines: Sequence[OfflineEngine], router: Router) -> None:
        self.engines = list(engines)
        self.router = router
        self.live: list[dict[str, PdAttempt]] = [{} for _ in engines]
        for engine in self.engines:
            engine.watch_finished()

    def send(self, now_ms: float, attempt: PdAttempt, sent: OfflineRequest) -> int:
        """Submits ``sent`` (the attempt as this side receives it) to the engine the router picks
        for the attempt's request; returns that engine's index."""
        self.router.poll(now_ms, self.engines)
        index = self.router.pick(attempt.request)
        self.router.in_flight[index] += 1
        self.live[index][attempt.attempt_id] = attempt
        self.engines[index].submit(sent)
        self.engines[index].advance_to(now_ms)
        return index

    def finished(self) -> Iterator[tuple[int, OfflineEngine, PdAttempt, Timeline]]:
        """The attempts finished since the last call, out of flight: engine index, engine,
        attempt, its timeline there."""
        for index, engine in enumerate(self.engines):
            for attempt_id in engine.drain_finished():
                attempt = self.live[index].pop(attempt_id)
                self.router.in_flight[index] -= 1
                yield index, engine, attempt, engine.result.timelines[attempt_id]

    @property
    def num_live(self) -> int:
        return sum(map(len, self.live))


class _Dispatch:
    """The router's two stages over the two pools (see the module docs)."""

    def __init__(
        self,
        prefill: _Pool,
        decode: _Pool,
        retries: Retries,
        reports_wait: bool,
    ) -> None:
        self.prefill, self.decode = prefill, decode
        self.retries = retries
        self.reports_wait = reports_wait
        self.result = PdRun(Split(len(prefill.engines), len(decode.engines)))
        self.events: list[tuple[float, int, str, PdAttempt]] = []
        self._seq = 0
        #: Per prefill attempt id: the prefill engine holding its blocks for a reader.
        self._held_on: dict[str, int] = {}
        for engine in self.decode.engines:
            _link(engine).on_read = self._release

    def push(self, at_ms: float, stage: str, attempt: PdAttempt) -> None:
        heapq.heappush(self.events, (at_ms, self._seq, stage, attempt))
        self._seq += 1

    def _release(self, prefill_id: str, at_ms: float) -> None:
        index = self._held_on.pop(prefill_id, None)
        if index is not None:
            _link(self.prefill.engines[index]).release(prefill_id, at_ms)

    # ---- sending --------------------------------------------------------------------------

    def send_prefill(self, now_ms: float, attempt: PdAttempt) -> None:
        request = attempt.request
        sent = replace(
            request,
            req_id=attempt.attempt_id,
            arrival_ms=now_ms,
            max_tokens=min(request.max_tokens, 1),
            script=FixedScript((_PREFILL_TOKEN,)),
            waited_ms=now_ms - attempt.first_sent_ms,
            reports_wait=self.retries.reports_wait,
            kv_transfer_params={"do_remote_decode": True},
        )
        attempt.prefill_engine = index = self.prefill.send(now_ms, attempt, sent)
        self.result.attempts.setdefault(request.req_id, []).append((index, None))

    def send_decode(self, now_ms: float, attempt: PdAttempt) -> None:
        request = attempt.request
        hand_back = self.prefill.engines[attempt.prefill_engine].result.timelines[attempt.attempt_id].kv_transfer_params
        sent = replace(
            request,
            req_id=attempt.attempt_id,
            arrival_ms=now_ms,
            waited_ms=now_ms - attempt.first_sent_ms,
            reports_wait=self.reports_wait,
            kv_transfer_params=hand_back,
        )
        attempt.decode_engine = index = self.decode.send(now_ms, attempt, sent)
        self.result.attempts[request.req_id][-1] = (attempt.prefill_engine, index)
        self.result.prefill_ms[request.req_id] = now_ms - attempt.first_sent_ms

    # ---- answers --------------------------------------------------------------------------

    def collect(self) -> None:
        """Turns every finished attempt into its next event: a hand-over, a retry or an outcome."""
        for index, engine, attempt, timeline in self.prefill.finished():
            if timeline.kv_transfer_params is not None:
                self._held_on[attempt.attempt_id] = index
            if timeline.finish_reason in ("length", "stop"):
                self.push(_finished_ms(timeline, engine), "decode", attempt)
            else:
                self._end(attempt, timeline, engine)
        for _index, engine, attempt, timeline in self.decode.finished():
            # Ended before reading (refused at arrival, shed while waiting): vLLM's notice, or
            # the API server's clean-up request, frees the prefill side's blocks now.
            self._release(attempt.attempt_id, _finished_ms(timeline, engine))
            self._end(attempt, timeline, engine)

    def _end(self, attempt: PdAttempt, timeline: Timeline, engine: OfflineEngine) -> None:
        """A retry for a shed before the first token with attempts left, else the outcome."""
        if is_shed(timeline) and not timeline.token_times_ms and attempt.number < self.retries.attempts:
            retry = PdAttempt(attempt.request, attempt.number + 1, attempt.first_sent_ms)
            self.push(_finished_ms(timeline, engine) + self.retries.backoff_ms(attempt.number), "prefill", retry)
            return
        self.result.outcomes[attempt.request.req_id] = replace(
            timeline, req_id=attempt.request.req_id, arrival_ms=attempt.first_sent_ms
        )

    @property
    def num_live(self) -> int:
        return self.prefill.num_live + self.decode.num_live


def _link(engine: OfflineEngine) -> RemoteKvLink:
    if engine.kv_link is None:
        raise ValueError("a disaggregated replay needs engines built with a kv_role (vLLM's NixlConnector)")
    return engine.kv_link


def _finished_ms(timeline: Timeline, engine: OfflineEngine) -> float:
    return timeline.finished_ms if timeline.finished_ms is not None else engine.now_ms


def replay_disaggregated(
    prefill: Sequence[OfflineEngine],
    decode: Sequence[OfflineEngine],
    requests: Sequence[OfflineRequest],
    prefill_router: Router,
    decode_router: Router,
    retries: Retries | None = None,
    *,
    reports_wait: bool = False,
    slice_ms: float = SLICE_MS,
) -> PdRun:
    """Replays ``requests`` through a prefill and a decode pool (see the module docs); ``retries``:
    the router's on a shed (default ``Retries()``)."""
    if not (prefill and decode):
        raise ValueError("a disaggregated replay needs at least one prefill and one decode engine")
    if prefill_router.num_engines != len(prefill) or decode_router.num_engines != len(decode):
        raise ValueError(
            f"the routers know {prefill_router.num_engines} prefill and {decode_router.num_engines} decode "
            f"engines, the pools have {len(prefill)} and {len(decode)}"
        )
    if slice_ms <= 0:
        raise ValueError(f"slice_ms={slice_ms} must be > 0")
    for engine in [*prefill, *decode]:
        _link(engine)  # fail before any work on an engine without a hand-off
    run = _Dispatch(_Pool(prefill, prefill_router), _Pool(decode, decode_router), retries or Retries(), reports_wait)
    for request in sorted(requests, key=lambda r: r.arrival_ms):
        run.push(request.arrival_ms, "prefill", PdAttempt(request, 1, request.arrival_ms))
    engines = [*prefill, *decode]
    clock_ms = 0.0
    while run.events or run.num_live:
        target_ms = run.events[0][0] if run.events else max(e.now_ms for e in engines) + slice_ms
        while clock_ms < target_ms:
            clock_ms = min(target_ms, clock_ms + slice_ms)
            for engine in engines:
                engine.advance_to(clock_ms)
            run.collect()
        if not run.events:
            if run.num_live and all(not e.num_unfinished for e in engines):
                raise AssertionError("attempts in flight on idle engines")
            continue
        now_ms, _, stage, attempt = heapq.heappop(run.events)
        if stage == "prefill":
            run.send_prefill(now_ms, attempt)
        else:
            run.send_decode(now_ms, attempt)
    result = run.result
    result.prefill = [engine.finish() for engine in prefill]
    result.decode = [engine.finish() for engine in decode]
    for engine in engines:
        link = _link(engine)
        result.num_reads += link.num_reads
        result.num_read_tokens += link.num_read_tokens
        result.read_ms_total += link.read_ms_total
        result.num_sends += link.num_sends
    return result


def pd_summary(run: PdRun, label: str) -> dict[str, Any]:
    """The clients' view (``report.summarize`` over each request's outcome, from its first send)
    with ``add_pd_fields``'s."""
    summary = summarize(ReplayResult(label, run.client_run()))
    add_pd_fields(summary, run)
    return summary


def add_pd_fields(summary: dict[str, Any], run: PdRun) -> None:
    """Adds to a summary of ``run``'s clients: per pool the attempts, where requests ended, sheds
    and device use; what moved between the pools; the count per engine."""
    num_engines = run.split.num_engines
    ended_on_prefill = sum(1 for a in run.attempts.values() if a[-1][1] is None)
    prefill_ms = sorted(run.prefill_ms.values())
    summary.update(
        layout=f"P/D {run.split}",
        num_engines=num_engines,
        retries=run.num_retries,
        requests_retried=sum(len(a) > 1 for a in run.attempts.values()),
        good_per_engine=summary["good"] / num_engines,
        pools={
            "prefill": _pool(run.prefill),
            "decode": _pool(run.decode),
            "ended_on_prefill": ended_on_prefill,
        },
        handoff={
            "reads": run.num_reads,
            "read_tokens": run.num_read_tokens,
            "read_ms_mean": run.read_ms_total / run.num_reads if run.num_reads else None,
            "sends_freed": run.num_sends,
            "prefill_answer_ms_p50": _quantile(prefill_ms, 0.5),
            "prefill_answer_ms_p99": _quantile(prefill_ms, 0.99),
        },
    )


def _pool(runs: Sequence[EngineRun]) -> dict[str, Any]:
    clock_ms = max((run.clock_ms for run in runs), default=0.0)
    return {
        "engines": len(runs),
        "attempts": sum(len(run.timelines) for run in runs),
        "refused": sum(run.num_refused for run in runs),
        "shed": sum(1 for run in runs for t in run.timelines.values() if is_shed(t)),
        "device_utilization": sum(run.device_busy_ms for run in runs) / max(clock_ms * len(runs), 1e-9),
        "steps": sum(run.num_steps for run in runs),
    }


def _quantile(values: Sequence[float], q: float) -> float | None:
    import numpy as np

    return float(np.quantile(values, q)) if values else None


def pd_table(summaries: Sequence[dict[str, Any]]) -> str:
    """The comparison at equal engine count: per row the requests meeting every target per
    engine, TTFT and TTFAT p99, each pool's device use and sheds, and the hand-off's cost."""
    header = (
        f"{'layout':<30} {'good':>5} {'/engine':>7} {'TTFT p99':>8} {'TTFAT p99':>9} "
        f"{'P util':>6} {'D util':>6} {'P shed':>6} {'D shed':>6} {'read ms':>7} {'P ans p50':>9}"
    )
    lines = [header, "-" * len(header)]
    for s in summaries:
        pools = s.get("pools")
        handoff = s.get("handoff") or {}
        engines = s.get("num_engines") or s.get("fleet") or 1
        util = f"{s['device_utilization'] / engines:>6.0%}"
        p_util, d_util = (
            (f"{pools['prefill']['device_utilization']:>6.0%}", f"{pools['decode']['device_utilization']:>6.0%}")
            if pools
            else (util, "")
        )
        lines.append(
            f"{s['policy'] if pools else s['policy'] + ' ×' + str(engines):<30} {s['good']:>5} "
            f"{s['good'] / engines:>7.1f} {_seconds(s['ttft_ms']['p99']):>8} {_seconds(s['ttfat_ms']['p99']):>9} "
            f"{p_util:>6} {d_util:>6} {pools['prefill']['shed'] if pools else '':>6} "
            f"{pools['decode']['shed'] if pools else '':>6} "
            f"{_number(handoff.get('read_ms_mean')):>7} {_seconds(handoff.get('prefill_answer_ms_p50')):>9}"
        )
    return "\n".join(lines)


def _seconds(ms: float | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.2f}s"


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"
