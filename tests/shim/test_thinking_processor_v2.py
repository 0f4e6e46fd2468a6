"""``MeridianThinkingProcessor`` under vLLM's Model Runner V2 interface, as far as a CPU allows:
vLLM's own V2 classes (``LogitsProcRequestState``, ``LogitsContext``, the V2 ``LogitsProcessor``
base and its loader's check) and ``SamplingParams``, driven step by step the way V2's sampler
drives a custom processor: ``add_request`` per slot, one ``apply`` per step with this step's row
→ slot mapping, tokens committed into the per-slot history. The runner's buffers
(``StagedWriteTensor``, ``UvaBackedTensor``) need CUDA's pinned memory to be built, so the
history and lengths here are plain CPU tensors exposing what the processor reads of them
(``.gpu``, ``.np``); on a GPU the processor reads vLLM's own."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.vllm

torch = pytest.importorskip("torch")

MAX_SLOTS = 8
MAX_MODEL_LEN = 128


@pytest.fixture
def bus_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MERIDIAN_BUS_DIR", str(tmp_path))
    return tmp_path


@dataclass
class _DeviceRows:
    """A runner buffer as the processor reads it: the tensor on the device (``.gpu``)."""

    gpu: Any


@dataclass
class _HostMirrored:
    """A runner buffer with a host mirror (``UvaBackedTensor``: ``.np`` is the source of truth)."""

    np: Any
    gpu: Any


class V2Driver:
    """Plays V2's sampler and model runner for the processor: slots, a token history, greedy
    sampling of whole prompts in one step (no chunking) unless told otherwise."""

    def __init__(self, model: Path, meridian: dict[str, Any] | None = None) -> None:
        from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcRequestState

        from meridian.offline.engine import EngineSpec, vllm_config_for
        from meridian.offline.tiny import vocabulary
        from meridian.vllm.scheduler import MeridianScheduler
        from meridian.vllm.thinking import MeridianThinkingProcessor

        spec = EngineSpec(model_dir=model, additional_config={"meridian": meridian or {}})
        config = vllm_config_for(spec, MeridianScheduler)
        self.vocab = vocabulary()
        self.size = len(self.vocab)
        self.history = torch.zeros(MAX_SLOTS, MAX_MODEL_LEN, dtype=torch.int32)
        self.prompt_len = np.zeros(MAX_SLOTS, dtype=np.int32)
        self.prefill_len = np.zeros(MAX_SLOTS, dtype=np.int32)
        self.total_len = np.zeros(MAX_SLOTS, dtype=np.int32)
        self.req_states = LogitsProcRequestState(
            device=torch.device("cpu"), max_num_reqs=MAX_SLOTS, vocab_size=self.size,
            all_token_ids=_DeviceRows(self.history),
            prompt_len=_HostMirrored(self.prompt_len, torch.from_numpy(self.prompt_len)),
            prefill_len=_HostMirrored(self.prefill_len, torch.from_numpy(self.prefill_len)),
            total_len=_DeviceRows(torch.from_numpy(self.total_len)),
        )
        self.proc = MeridianThinkingProcessor(config, self.req_states)
        self.prompt = [self.vocab[w] for w in ["<|im_start|>", "user", "think", "9", "<|im_end|>", "<think>"]]
        self.active: list[int] = []
        self.wanted: dict[int, bool] = {}

    def add(self, slot: int, xargs: dict[str, Any] | None, *, output: list[int] | None = None,
            prompt: list[int] | None = None, slo_class: str | None = "standard") -> None:
        """Puts a request into ``slot`` (``output``: tokens it had before a preemption)."""
        from vllm import SamplingParams

        from meridian.vllm.names import PROBE_FOR_ARG, RESOLVED_CLASS_ARG

        extra = dict(xargs) if xargs is not None else None
        if slo_class is not None and PROBE_FOR_ARG not in (extra or {}):
            extra = {**(extra or {}), RESOLVED_CLASS_ARG: slo_class}
        params = SamplingParams(max_tokens=100, extra_args=extra)
        tokens = (prompt or self.prompt) + (output or [])
        self.history[slot, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
        self.prompt_len[slot] = len(prompt or self.prompt)
        self.prefill_len[slot] = self.total_len[slot] = len(tokens)
        self.wanted[slot] = self.proc.add_request(slot, params)
        self.active.append(slot)

    def finish(self, slot: int) -> None:
        """The request in ``slot`` leaves the batch (V2 tells the processor nothing)."""
        self.active.remove(slot)

    def output(self, slot: int) -> list[int]:
        return self.history[slot, self.prompt_len[slot] : self.total_len[slot]].tolist()

    def step(self, logits: Any = None, *, order: list[int] | None = None, sample: bool = True,
             seq_lens: dict[int, int] | None = None) -> tuple[Any, Any]:
        """One step over ``order`` (default: every active slot); ``seq_lens``: a slot's tokens
        visible this step where it is not all of them (a prefill chunk)."""
        from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext

        slots = order if order is not None else list(self.active)
        if logits is None:
            logits = self.word_logits(len(slots))
        mapping = torch.tensor(slots, dtype=torch.int32)
        ctx = LogitsContext(
            expanded_idx_mapping=mapping, idx_mapping=mapping, idx_mapping_np=np.array(slots, dtype=np.int32),
            expanded_local_pos=torch.zeros(len(slots), dtype=torch.int32),
            input_ids=torch.tensor([int(self.history[s, self.total_len[s] - 1]) for s in slots]),
            pos=torch.tensor([int(self.total_len[s]) - 1 for s in slots]),
            seq_lens_upper_bound_np=np.array([(seq_lens or {}).get(s, self.total_len[s]) for s in slots], dtype=np.int32),
        )
        before = logits.clone()
        after = self.proc.apply(logits, ctx)
        if sample:
            for row, slot in enumerate(slots):
                self.history[slot, self.total_len[slot]] = int(after[row].argmax())
                self.total_len[slot] += 1
        return before, after

    def word_logits(self, rows: int) -> Any:
        """Logits whose argmax is the word "so" (an ordinary thinking token)."""
        logits = torch.randn(rows, self.size)
        logits[:, self.vocab["so"]] = 50.0
        return logits


def test_the_processor_is_a_v2_processor_vllms_loader_accepts(tiny_model: Path) -> None:
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor
    from vllm.v1.worker.gpu.sample.logits_processor.loader import _load_v2_logitsprocs_by_fqcns

    from meridian.vllm.names import LOGITS_PROCESSOR
    from meridian.vllm.thinking import MeridianThinkingProcessor

    assert _load_v2_logitsprocs_by_fqcns([LOGITS_PROCESSOR]) == [MeridianThinkingProcessor]
    assert issubclass(MeridianThinkingProcessor, LogitsProcessor)


def test_a_budget_forces_the_end_marker_in_its_row_only(tiny_model: Path) -> None:
    d = V2Driver(tiny_model)
    d.add(3, {"meridian_thinking_budget_tokens": 3, "meridian_req_id": "a"})
    d.add(5, None)
    assert d.wanted == {3: True, 5: False}, "only a request under a rule asks V2 for its logits"
    for _ in range(3):
        before, after = d.step()
        assert torch.equal(before, after), "nothing forced while the budget lasts"
    before, after = d.step(order=[5, 3])  # rows follow the step's layout, not the slots
    end = d.vocab["</think>"]
    assert after[1, end] == 0.0 and torch.isinf(after[1]).sum() == d.size - 1
    assert torch.equal(before[0], after[0]), "the uncontrolled row is untouched"
    assert d.output(3) == [d.vocab["so"]] * 3 + [end]
    before, after = d.step()
    assert torch.equal(before, after), "after the marker the answer is the model's"
    assert d.output(3).count(end) == 1 and end not in d.output(5)


def test_the_closing_text_comes_before_the_marker(tiny_model: Path) -> None:
    d = V2Driver(tiny_model)
    closing = json.dumps({"budget_tokens": 1, "closing": {"closing_text": "ok done"}})
    d.add(0, {"meridian_thinking": closing, "meridian_req_id": "a"})
    for _ in range(5):
        d.step()
    assert d.output(0) == [d.vocab[w] for w in ("so", "ok", "done", "</think>", "so")]


def test_requests_without_arguments_are_not_touched(tiny_model: Path) -> None:
    d = V2Driver(tiny_model)
    d.add(0, None)
    d.add(1, {"meridian_thinking": "off"})
    for _ in range(4):
        before, after = d.step()
        assert torch.equal(before, after)
    assert d.wanted == {0: False, 1: False}
    assert not d.proc._v2._slots and not d.proc._v2._pending, "nothing tracked for uncontrolled requests"


def test_a_reused_slot_starts_afresh_and_a_preempted_request_resumes_its_count(tiny_model: Path) -> None:
    d = V2Driver(tiny_model)
    d.add(0, {"meridian_thinking_budget_tokens": 4, "meridian_req_id": "a"})
    d.step()
    d.step()
    so = d.vocab["so"]
    earlier = d.output(0)
    assert earlier == [so, so]
    # Preempted: it leaves the batch; its slot goes to a new request with its own budget.
    d.finish(0)
    d.add(0, {"meridian_thinking_budget_tokens": 2, "meridian_req_id": "b"})
    # Resumed in another slot: its prompt and the output so far are prefilled again.
    d.add(6, {"meridian_thinking_budget_tokens": 4, "meridian_req_id": "a"}, output=earlier)
    for _ in range(3):
        d.step()
    end = d.vocab["</think>"]
    assert d.output(0) == [so, so, end], "the new occupant counts from 0"
    assert d.output(6) == [so, so, so, so, end], "the resumed request counts its earlier thinking"


def test_a_chunked_prefill_is_taken_up_with_its_whole_prompt(tiny_model: Path) -> None:
    d = V2Driver(tiny_model)
    d.add(0, {"meridian_thinking_budget_tokens": 2, "meridian_req_id": "a"})
    before, after = d.step(sample=False, seq_lens={0: 3})  # the first 3 prompt tokens: no sample kept
    assert torch.equal(before, after)
    for _ in range(3):
        d.step()
    so, end = d.vocab["so"], d.vocab["</think>"]
    assert d.output(0) == [so, so, end], "the prompt's open <think> was seen: the budget counts from there"


def test_the_scheduler_ends_thinking_under_overload_through_the_bus(tiny_model: Path, bus_dir: Path) -> None:
    from meridian.vllm.bus import SchedulerEndpoint

    scheduler = SchedulerEndpoint()
    try:
        d = V2Driver(tiny_model, {"classes": {"standard": {
            "ttft_ms": 1000, "ttfat_ms": 5000, "answer_tpot_ms": 100, "rank": 0, "on_overload": "degrade"}},
            "default_class": "standard", "priority_map": {"0": "standard"}})
        d.add(2, {"meridian_req_id": "a"})
        d.step()
        scheduler.publish({}, frozenset({"a"}))
        d.step()
        assert d.output(2) == [d.vocab["so"], d.vocab["</think>"]]
        assert scheduler.take_stops() == [("a", "overload", 1)]
    finally:
        scheduler.close()


def test_eat_probes_are_measured_on_their_prompts_row_and_delivered(tiny_model: Path, bus_dir: Path) -> None:
    from meridian.vllm.bus import SchedulerEndpoint
    from meridian.vllm.names import PROBE_FOR_ARG

    scheduler = SchedulerEndpoint()
    try:
        d = V2Driver(tiny_model)
        rule = {"eat": {"min_lines": 2}, "boundaries": {"line_end": ["so"], "sentence_end": []}}
        d.add(0, {"meridian_thinking": json.dumps(rule), "meridian_req_id": "a"})
        for _ in range(3):
            d.step()
        assert scheduler.take_probes() == [("a", 1), ("a", 2)], "every line end asks for a probe"
        for slot in (1, 2):
            d.add(slot, {PROBE_FOR_ARG: "a"})
        logits = d.word_logits(3)
        logits[1:] = 0.0  # uniform probe rows: the same entropy on both probes
        d.step(logits, sample=False)
        d.finish(1)
        d.finish(2)
        d.step()  # the probes' measurements arrive, the EAT variance is 0: the rule fires
        assert d.output(0) == [d.vocab["so"]] * 3 + [d.vocab["</think>"]], "as under V1: forced at once"
        assert not d.proc._v2._slots.keys() & {1, 2}, "the probes are let go once measured"
    finally:
        scheduler.close()


def test_speculative_rows_leave_every_request_uncontrolled(tiny_model: Path, caplog: pytest.LogCaptureFixture) -> None:
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext

    d = V2Driver(tiny_model)
    d.add(0, {"meridian_thinking_budget_tokens": 1, "meridian_req_id": "a"})
    d.step()
    logits = d.word_logits(3)  # one request, three rows: a draft of two tokens
    mapping = torch.zeros(3, dtype=torch.int32)
    ctx = LogitsContext(
        expanded_idx_mapping=mapping, idx_mapping=mapping[:1], idx_mapping_np=np.zeros(1, dtype=np.int32),
        expanded_local_pos=torch.arange(3, dtype=torch.int32), input_ids=torch.zeros(3, dtype=torch.int64),
        pos=torch.arange(3), seq_lens_upper_bound_np=np.array([d.total_len[0] + 2], dtype=np.int32),
    )
    before = logits.clone()
    assert torch.equal(d.proc.apply(logits, ctx), before)
    assert "speculative decoding" in caplog.text


def test_one_class_serves_both_runners(tiny_model: Path) -> None:
    from meridian.offline.engine import EngineSpec, vllm_config_for
    from meridian.vllm.scheduler import MeridianScheduler
    from meridian.vllm.thinking import MeridianThinkingProcessor

    config = vllm_config_for(EngineSpec(model_dir=tiny_model), MeridianScheduler)
    v1 = MeridianThinkingProcessor(config, torch.device("cpu"), False)
    assert v1._v1 is not None and v1._v2 is None
    with pytest.raises(TypeError, match="unknown constructor arguments"):
        MeridianThinkingProcessor(config, "not a runner's state")
