"""``MeridianThinkingProcessor``: thinking control inside vLLM, as a logits processor of both of
vLLM's model runners.

Selected with ``--logits-processors meridian.vllm.thinking:MeridianThinkingProcessor`` next to
``--scheduler-cls meridian.vllm.MeridianScheduler``; it reads the same ``meridian`` block of
``--additional-config`` (``thinking_control``, top level or per class) and each request's
``vllm_xargs`` (``meridian_thinking``: ``"off"`` or a JSON object; ``meridian_thinking_budget_tokens``;
``meridian_reasoning_effort``), which ``validate_params`` checks at admission (through the core)
so a bad value fails that request with HTTP 400.
Each step, before sampling, it (1) hands every controlled request's newly sampled tokens to its
core ``ThinkingStream`` together with the signals measured on the distribution each came from
(one step late: measured at step *t*, used when token *t* is seen at *t + 1*); (2) masks the
logits of a request the core is forcing to the one forced token (closing text, then vLLM's
reasoning-end tokens); (3) measures this step's rows that the core wants measured: torch on
CPU, the ``logits_stats`` kernel on a side CUDA stream on GPU; (4) asks the
scheduler for EAT probes through ``meridian.vllm.bus`` and feeds probe results back. Which
model runner: one class implements each interface the installed vLLM has, and vLLM calls the one
its runner has — V1 (0.32 and 0.33 only; the 0.32 CPU build, ``VLLM_USE_V2_MODEL_RUNNER=0``):
persistent batch rows and the runner's output lists (``_V1Batch``); Model Runner V2 (the GPU
default, and 0.34's only runner on GPUs and x86 CPUs): request slots, per-step rows and the
runner's token history on the device (``_V2Batch``). vLLM 0.34's standalone CPU runner (non-x86
CPUs without Triton) loads no custom logits processor at all. The work itself is one
(``_Worker``).
It needs ``MeridianScheduler``, which stamps each request's resolved SLO class into its
``extra_args``; the processor reads that class and never guesses one. Invariant: the processor
decides nothing (the core does) and changes no logits of a request
that is not being forced; with no request under control it returns the logits untouched; a
failure while handling one request drops that request's control (logged), never the request
and never the engine.
"""

from __future__ import annotations

import importlib.util
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from meridian.vllm._version import require_supported_vllm

require_supported_vllm()

import torch  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext as V2LogitsContext  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2LogitsProcessor  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcRequestState as V2RequestState  # noqa: E402

from meridian._core import ThinkingStream  # noqa: E402
from meridian.errors import ConfigError, MeridianError  # noqa: E402
from meridian.kernels.meter import CpuMeter, CudaMeter, Signals  # noqa: E402
from meridian.vllm.bus import WorkerEndpoint  # noqa: E402
from meridian.vllm.config import read_settings, runs_meridian_scheduler  # noqa: E402
from meridian.vllm.convert import check_request_args, request_args_json  # noqa: E402
from meridian.vllm.names import (  # noqa: E402
    LOGITS_PROCESSOR,
    PROBE_FOR_ARG,
    REQ_ID_ARG,
    RESOLVED_CLASS_ARG,
    SCHEDULER_CLS,
)

#: Whether this vLLM still has the V1 model runner's logits-processor interface (0.32 and 0.33;
#: 0.34 removed the V1 runner with it). Model Runner V2's interface is in every supported release.
HAS_V1_RUNNER = importlib.util.find_spec("vllm.v1.sample.logits_processor") is not None

if HAS_V1_RUNNER or TYPE_CHECKING:
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality  # noqa: E402
    from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor  # noqa: E402

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig

logger = logging.getLogger("meridian")

#: Streams of requests that left the batch, kept so a preempted request resumes where it was.
MAX_PARKED_STREAMS = 4096


@dataclass(eq=False)
class _Controlled:
    """One controlled request as the processor tracks it."""

    req_id: str | None
    slo_class: str
    stream: ThinkingStream
    output_token_ids: list[int]
    num_seen: int = 0
    #: Signals measured per output position: the row measured when the output held `position`
    #: tokens is the distribution that token `position` is sampled from.
    signals: dict[int, Signals] = field(default_factory=dict)


@dataclass(eq=False)
class _Probe:
    parent_req_id: str
    entropy_nats: float | None = None
    removed: bool = False


#: What a measured row belongs to: a controlled request at an output position, or a probe.
Tag = tuple["_Controlled | _Probe", int]


class _Worker:
    """The processor's work on the requests under control, whatever vLLM's processor interface:
    taking a request up (its control from the core), handing it each new token with its signals,
    forcing, measuring, EAT probes and stop reports. The interfaces below only say which logits
    row belongs to which request and where its tokens are."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None:
        _require_meridian_scheduler(vllm_config)
        settings = read_settings(vllm_config, resolve_tool_calls=False)
        self._config = settings.config
        self._start_ids = settings.markers.start
        self._end_ids = settings.markers.end
        self._forced_end_ids = settings.markers.forced_end
        self._tokenizer = settings.tokenizer
        self._meter: CpuMeter | CudaMeter = CudaMeter(device) if device.type == "cuda" else CpuMeter()
        self._bus = WorkerEndpoint()
        #: Under tensor parallelism every rank runs this processor on the same logits and makes
        #: the same decisions; only the first asks for probes and reports stops, once.
        self._speaks_for_engine = _is_first_rank()
        self._by_req_id: dict[str, _Controlled] = {}
        self._parked: OrderedDict[str, _Controlled] = OrderedDict()
        self._texts: dict[int, str] = {}
        self._closing_ids: dict[str, list[int]] = {}
        if not self._end_ids:
            logger.info("meridian: no --reasoning-parser; thinking control is off")

    # ---- taking requests up and letting them go ---------------------------------------------

    def wants(self, params: SamplingParams) -> bool:
        """Whether a request with these params comes under control: a probe, or a request whose
        control has a rule on or whose class degrades (V2's sampler skips the logits work of a
        batch where no request wants it)."""
        extra = params.extra_args or {}
        if isinstance(extra.get(PROBE_FOR_ARG), str):
            return True
        slo_class = extra.get(RESOLVED_CLASS_ARG)
        if not self._end_ids or not isinstance(slo_class, str):
            return False
        try:
            control = self._config.request_thinking_control(
                slo_class, request_args_json(extra) or "{}", params.max_tokens
            )
            return self._config.thinking_stream_wanted(slo_class, control)
        except MeridianError:
            return False

    def take_up(
        self, params: SamplingParams, prompt_ids: list[int], output_ids: list[int]
    ) -> _Controlled | _Probe | None:
        """The request's control (a parked one resumes), its probe, or ``None``: not controlled.
        A failure leaves the request uncontrolled, never failed."""
        try:
            return self._take_up(params, prompt_ids, output_ids)
        except Exception:  # noqa: BLE001 - the request runs on, uncontrolled
            logger.exception("meridian: thinking control could not take up a request; it runs without")
            return None

    def _take_up(
        self, params: SamplingParams, prompt_ids: list[int], output_ids: list[int]
    ) -> _Controlled | _Probe | None:
        extra = params.extra_args or {}
        parent = extra.get(PROBE_FOR_ARG)
        if isinstance(parent, str):
            return _Probe(parent)
        if not self._end_ids:
            return None
        req_id = extra.get(REQ_ID_ARG) if isinstance(extra.get(REQ_ID_ARG), str) else None
        parked = self._parked.pop(req_id, None) if req_id is not None else None
        if parked is not None:
            # A preempted request resumes: same stream, the runner's new output list.
            parked.output_token_ids = output_ids
            self._by_req_id[req_id] = parked  # type: ignore[index]
            return parked
        controlled = self._new_controlled(req_id, extra, params.max_tokens, prompt_ids, output_ids)
        if controlled is not None and req_id is not None:
            self._by_req_id[req_id] = controlled
        return controlled

    def _new_controlled(
        self,
        req_id: str | None,
        extra: dict[str, Any],
        max_tokens: int | None,
        prompt_ids: list[int],
        output_ids: list[int],
    ) -> _Controlled | None:
        slo_class = extra.get(RESOLVED_CLASS_ARG)
        if not isinstance(slo_class, str):
            # MeridianScheduler stamps every request it admits; an unstamped one bypassed it.
            logger.warning("meridian: request %s carries no resolved SLO class; thinking control off for it", req_id)
            return None
        try:
            control = self._config.request_thinking_control(slo_class, request_args_json(extra) or "{}", max_tokens)
        except MeridianError as exc:
            # validate_params rejected this at admission; reaching here means a caller bypassed it.
            logger.warning("meridian: thinking control off for request %s: %s", req_id, exc)
            return None
        if not self._config.thinking_stream_wanted(slo_class, control):
            return None
        forced = self._closing_token_ids(control.closing_text) + self._forced_end_ids
        stream = ThinkingStream(
            control, prompt_ids, start_ids=self._start_ids, end_ids=self._end_ids, forced_ids=forced
        )
        return _Controlled(req_id, slo_class, stream, output_ids)

    def _closing_token_ids(self, text: str | None) -> list[int]:
        if not text or self._tokenizer is None:
            return []
        if text not in self._closing_ids:
            self._closing_ids[text] = list(self._tokenizer.encode(text, add_special_tokens=False))
        return self._closing_ids[text]

    def let_go(self, owner: _Controlled | _Probe) -> None:
        """The request left the batch: a probe delivers what it measured; a controlled request
        sees its last tokens and, still thinking, is parked for its resumption."""
        if isinstance(owner, _Probe):
            owner.removed = True
            self._deliver_probe(owner)
            return
        try:
            self._consume_tokens(owner)
        except Exception:  # noqa: BLE001 - the request is leaving; its control goes with it
            logger.exception("meridian: thinking control failed for request %s", owner.req_id)
            return
        if owner.req_id is not None:
            self._by_req_id.pop(owner.req_id, None)
            if owner.stream.phase != "answering":
                self._parked[owner.req_id] = owner
                while len(self._parked) > MAX_PARKED_STREAMS:
                    self._parked.popitem(last=False)

    def drop(self, controlled: _Controlled) -> None:
        """Drops control of a request whose step failed; the request itself runs on, uncontrolled."""
        logger.exception("meridian: thinking control failed for request %s; it continues without", controlled.req_id)
        if controlled.req_id is not None:
            self._by_req_id.pop(controlled.req_id, None)

    # ---- the step -------------------------------------------------------------------------------

    def absorb_measured(self) -> None:
        """Takes in the signals measured on earlier steps that are ready."""
        try:
            measured = self._meter.collect()
        except Exception:  # noqa: BLE001 - lost signals only delay a decision
            logger.exception("meridian: collecting thinking signals failed")
            return
        for (owner, position), values in measured:
            if isinstance(owner, _Probe):
                owner.entropy_nats = values[0]
                if owner.removed:
                    self._deliver_probe(owner)
            elif position >= owner.num_seen:
                owner.signals[position] = values

    def step(
        self, logits: torch.Tensor, rows: list[tuple[int, _Controlled]], probe_rows: list[tuple[int, _Probe]]
    ) -> list[_Controlled]:
        """Brings each controlled request up to date, masks the rows being forced and measures
        the rows the core wants measured; returns the requests whose control failed."""
        self.absorb_measured()
        attainment = self._bus.attainment()
        endings = self._bus.thinking_endings()
        measured: list[int] = []
        tags: list[Tag] = []
        failed: list[_Controlled] = []
        for row, controlled in rows:
            try:
                if self._step_row(logits, row, controlled, attainment, endings):
                    measured.append(row)
                    tags.append((controlled, len(controlled.output_token_ids)))
            except Exception:  # noqa: BLE001 - one request's fault must not take the engine down
                self.drop(controlled)
                failed.append(controlled)
        for row, probe in probe_rows:
            measured.append(row)
            tags.append((probe, 0))
        try:
            self._meter.submit(logits, measured, tags, self._end_ids[0] if self._end_ids else 0)
        except Exception:  # noqa: BLE001 - without signals the rules wait; serving goes on
            logger.exception("meridian: measuring thinking signals failed this step")
        return failed

    def _step_row(
        self,
        logits: torch.Tensor,
        row: int,
        controlled: _Controlled,
        attainment: dict[str, float],
        endings: frozenset[str],
    ) -> bool:
        """Brings one request's stream up to date (ending its thinking when the scheduler says
        so) and masks its row if forcing; returns whether its row is to be measured."""
        controlled.stream.set_ttfat_attainment(attainment.get(controlled.slo_class, float("nan")))
        self._consume_tokens(controlled)
        if controlled.req_id in endings:
            ended = controlled.stream.end_for_overload()
            if ended is not None:
                self._report_stop(controlled, ended)
        forced = controlled.stream.forced_token()
        if forced is not None and 0 <= forced < logits.shape[1]:
            logits[row].fill_(float("-inf"))
            logits[row, forced] = 0.0
            return False
        return controlled.stream.wants_signals()

    def _consume_tokens(self, controlled: _Controlled) -> None:
        output = controlled.output_token_ids
        while controlled.num_seen < len(output):
            token = output[controlled.num_seen]
            if token < 0:
                return  # an async placeholder: the real id arrives next step
            position = controlled.num_seen
            controlled.num_seen += 1
            signals = controlled.signals.pop(position, None)
            entropy, prob, rank = signals if signals is not None else (None, None, None)
            fired = controlled.stream.on_token(token, self._token_text(token), entropy, prob, rank)
            if fired is not None:
                self._report_stop(controlled, fired)
            if controlled.stream.take_probe_due() and controlled.req_id is not None and self._speaks_for_engine:
                self._bus.request_probe(controlled.req_id, controlled.num_seen)
        # Measurements for positions already passed (a preemption replayed them) are stale.
        for stale in [p for p in controlled.signals if p < controlled.num_seen]:
            del controlled.signals[stale]

    def _deliver_probe(self, probe: _Probe) -> None:
        try:
            self._deliver_probe_value(probe)
        except Exception:  # noqa: BLE001 - a lost probe only delays an EAT decision
            logger.exception("meridian: an EAT probe for request %s could not be delivered", probe.parent_req_id)

    def _deliver_probe_value(self, probe: _Probe) -> None:
        controlled = self._by_req_id.get(probe.parent_req_id) or self._parked.get(probe.parent_req_id)
        if controlled is None or probe.entropy_nats is None:
            return
        value = probe.entropy_nats
        probe.entropy_nats = None
        probe.removed = False
        # Tokens sampled since the probe was asked for are thinking already done: the stream must
        # count them before the probe can end the reasoning, so forcing starts at the next one.
        self._consume_tokens(controlled)
        fired = controlled.stream.on_eat_probe(value)
        if fired is not None:
            self._report_stop(controlled, fired)

    def _report_stop(self, controlled: _Controlled, reason: str) -> None:
        num_think_tokens = controlled.stream.num_think_tokens
        logger.debug(
            "meridian: request %s thinking ended by %s after %d tokens", controlled.req_id, reason, num_think_tokens
        )
        if controlled.req_id is not None and self._speaks_for_engine:
            self._bus.report_stop(controlled.req_id, reason, num_think_tokens)

    def _token_text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id]) if self._tokenizer is not None else ""
            self._texts[token_id] = text
        return text


class _V1Batch:
    """vLLM's V1 interface (the CPU build; GPUs with ``VLLM_USE_V2_MODEL_RUNNER=0``): rows are
    persistent batch indices, moved and removed by ``BatchUpdate``; each request's output list
    is the runner's own, appended to in place."""

    def __init__(self, worker: _Worker) -> None:
        self._worker = worker
        self._rows: dict[int, _Controlled] = {}
        self._probes: dict[int, _Probe] = {}

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        self._worker.absorb_measured()
        if batch_update is None:
            return
        for index in batch_update.removed:
            self._remove_row(index)
        for index, params, prompt_ids, output_ids in batch_update.added:
            self._remove_row(index)
            owner = self._worker.take_up(params, prompt_ids or [], output_ids)
            if isinstance(owner, _Probe):
                self._probes[index] = owner
            elif owner is not None:
                self._rows[index] = owner
        for a, b, direction in batch_update.moved:
            self._move_row(a, b, direction)

    def _remove_row(self, index: int) -> None:
        owner: _Controlled | _Probe | None = self._probes.pop(index, None) or self._rows.pop(index, None)
        if owner is not None:
            self._worker.let_go(owner)

    def _move_row(self, a: int, b: int, direction: MoveDirectionality) -> None:
        for table in (self._rows, self._probes):
            first, second = table.pop(a, None), table.pop(b, None)
            if first is not None:
                table[b] = first  # type: ignore[assignment]
            if second is not None and direction == MoveDirectionality.SWAP:
                table[a] = second  # type: ignore[assignment]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._rows and not self._probes:
            return logits
        failed = self._worker.step(logits, list(self._rows.items()), list(self._probes.items()))
        for controlled in failed:
            for row in [r for r, c in self._rows.items() if c is controlled]:
                del self._rows[row]
        return logits


class _V2Batch:
    """vLLM's Model Runner V2 interface (the GPU default): requests live in slots that are
    reused without notice, logits rows change every step (``ctx.idx_mapping_np``: row → slot),
    and tokens are read from the runner's per-slot history (``req_states.all_token_ids``, valid
    below each row's ``seq_lens_upper_bound_np``). A request is taken up at its first step, once
    its prompt is on the device; a slot's next occupant lets the previous one go. Under
    speculative decoding (several rows per request) no request is controlled."""

    def __init__(self, worker: _Worker, req_states: V2RequestState) -> None:
        self._worker = worker
        self._req_states = req_states
        self._slots: dict[int, _Controlled | _Probe] = {}
        self._pending: dict[int, SamplingParams] = {}
        self._warned_rows = False

    def add_request(self, slot: int, params: SamplingParams) -> bool:
        owner = self._slots.pop(slot, None)
        if owner is not None:
            self._worker.let_go(owner)
        self._pending.pop(slot, None)
        if not self._worker.wants(params):
            return False
        self._pending[slot] = params
        return True

    def apply(self, logits: torch.Tensor, ctx: V2LogitsContext) -> torch.Tensor:
        if not self._slots and not self._pending:
            return logits
        slots = [int(s) for s in ctx.idx_mapping_np]
        if logits.shape[0] != len(slots):
            if not self._warned_rows:
                self._warned_rows = True
                logger.warning(
                    "meridian: speculative decoding gives several logits rows per request; "
                    "thinking control is off under it"
                )
            return logits
        seq_lens = [int(n) for n in ctx.seq_lens_upper_bound_np[: len(slots)]]
        for slot in slots:
            if slot in self._pending:
                self._take_up(slot)
        rows: list[tuple[int, _Controlled]] = []
        probe_rows: list[tuple[int, _Probe]] = []
        self._read_new_tokens(slots, seq_lens)
        for row, slot in enumerate(slots):
            owner = self._slots.get(slot)
            if isinstance(owner, _Controlled):
                rows.append((row, owner))
            elif isinstance(owner, _Probe):
                probe_rows.append((row, owner))
        failed = self._worker.step(logits, rows, probe_rows)
        for row, probe in probe_rows:
            # A probe samples one token: the row of its whole prompt is its only real one (earlier
            # rows were prefill chunks, their samples dropped); what it measured there is final.
            slot = slots[row]
            if seq_lens[row] >= int(self._req_states.prefill_len.np[slot]):
                self._slots.pop(slot, None)
                self._worker.let_go(probe)
        for controlled in failed:
            for slot in [s for s, c in self._slots.items() if c is controlled]:
                del self._slots[slot]
        return logits

    def _take_up(self, slot: int) -> None:
        # The whole prompt is in the history from the request's first step, chunked or not.
        params = self._pending.pop(slot)
        prompt_len = int(self._req_states.prompt_len.np[slot])
        prompt = self._req_states.all_token_ids.gpu[slot, :prompt_len].tolist()
        owner = self._worker.take_up(params, prompt, [])
        if owner is not None:
            self._slots[slot] = owner

    def _read_new_tokens(self, slots: list[int], seq_lens: list[int]) -> None:
        """Appends each controlled request's committed tokens it has not read yet, in one copy
        from the device."""
        history = self._req_states.all_token_ids.gpu
        spans: list[tuple[_Controlled, int]] = []
        pieces = []
        for slot, seq_len in zip(slots, seq_lens):
            owner = self._slots.get(slot)
            if not isinstance(owner, _Controlled):
                continue
            start = int(self._req_states.prompt_len.np[slot]) + len(owner.output_token_ids)
            if seq_len > start:
                pieces.append(history[slot, start:seq_len])
                spans.append((owner, seq_len - start))
        if not pieces:
            return
        tokens = torch.cat(pieces).tolist()
        at = 0
        for owner, count in spans:
            owner.output_token_ids.extend(tokens[at : at + count])
            at += count


# The runners' interfaces this vLLM has: vLLM checks the class it loads against its runner's.
if HAS_V1_RUNNER or TYPE_CHECKING:

    class _RunnerInterfaces(V1LogitsProcessor, V2LogitsProcessor):  # type: ignore[misc]  # apply() is MeridianThinkingProcessor's
        pass

else:

    class _RunnerInterfaces(V2LogitsProcessor):  # type: ignore[no-redef]
        pass


class MeridianThinkingProcessor(_RunnerInterfaces):
    """Ends reasoning early by the core's thinking-control rules (see the module docs). One class
    for each of vLLM's processor interfaces it has: vLLM builds it with ``(vllm_config, device,
    is_pin_memory)`` under the V1 model runner (0.32 and 0.33) and with ``(vllm_config,
    req_states)`` under V2, and calls only its runner's methods."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        # Runs in the API server, which gives it no configuration: the core checks the request's
        # arguments, the class for its type only (its name is checked against the server's
        # classes by the --middleware MeridianFrontend, and by the scheduler).
        try:
            check_request_args(sampling_params.extra_args, None)
        except MeridianError as exc:
            raise ValueError(str(exc)) from exc

    def __init__(self, vllm_config: VllmConfig, *runner_args: Any) -> None:
        if len(runner_args) == 1 and isinstance(runner_args[0], V2RequestState):
            req_states = runner_args[0]
            self._v1: _V1Batch | None = None
            self._v2: _V2Batch | None = _V2Batch(_Worker(vllm_config, req_states.device), req_states)
        elif len(runner_args) == 2:
            device, _is_pin_memory = runner_args
            self._v1, self._v2 = _V1Batch(_Worker(vllm_config, device)), None
        else:
            raise TypeError(f"{LOGITS_PROCESSOR}: unknown constructor arguments from vLLM: {runner_args!r}")

    # ---- V1 -----------------------------------------------------------------------------------

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        assert self._v1 is not None, "vLLM's V1 runner calls update_state"
        self._v1.update_state(batch_update)

    # ---- V2 -----------------------------------------------------------------------------------

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        assert self._v2 is not None, "vLLM's V2 runner calls add_request"
        return self._v2.add_request(req_idx, sampling_params)

    # ---- both ---------------------------------------------------------------------------------

    def apply(self, logits: torch.Tensor, ctx: V2LogitsContext | None = None) -> torch.Tensor:
        if self._v2 is not None:
            assert ctx is not None, "vLLM's V2 runner passes the batch layout"
            return self._v2.apply(logits, ctx)
        assert self._v1 is not None
        return self._v1.apply(logits)


def _require_meridian_scheduler(vllm_config: VllmConfig) -> None:
    """The processor learns each request's class from ``MeridianScheduler``'s stamp; without that
    scheduler it could only guess, so it refuses to start."""
    try:
        runs_meridian = runs_meridian_scheduler(vllm_config)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"{LOGITS_PROCESSOR} needs --scheduler-cls {SCHEDULER_CLS}: {exc}") from exc
    if not runs_meridian:
        scheduler_cls = vllm_config.scheduler_config.scheduler_cls
        raise ConfigError(
            f"{LOGITS_PROCESSOR} needs --scheduler-cls {SCHEDULER_CLS} (it stamps each request's SLO class); "
            f"vLLM runs {getattr(scheduler_cls, '__qualname__', scheduler_cls)}"
        )


def _is_first_rank() -> bool:
    """Whether this worker is the first tensor-parallel rank (or the only one)."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return bool(get_tensor_model_parallel_rank() == 0)
    except (AssertionError, ImportError, RuntimeError, AttributeError):
        return True  # no parallel state: a single worker
