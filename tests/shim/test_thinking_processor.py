"""``MeridianThinkingProcessor`` against vLLM's real V1 logits-processor classes (``BatchUpdate``,
``SamplingParams``, a ``VllmConfig`` with the deepseek_r1 reasoning parser), driven step by step
the way the model runner drives it: rows added, moved, swapped and removed, async placeholders
in the output lists, a preempted request resuming, EAT probes round-tripping through the bus."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.vllm

torch = pytest.importorskip("torch")
if importlib.util.find_spec("vllm") is not None and importlib.util.find_spec("vllm.v1.sample.logits_processor") is None:
    pytest.skip("vLLM 0.34 removed the V1 model runner and its processor interface", allow_module_level=True)


@pytest.fixture
def bus_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MERIDIAN_BUS_DIR", str(tmp_path))
    return tmp_path


class Driver:
    """Plays the model runner: one ``update_state`` + ``apply`` per step, greedy sampling."""

    def __init__(self, model: Path, meridian: dict[str, Any] | None = None, *, config: Any = None) -> None:
        from meridian.offline.engine import EngineSpec, vllm_config_for
        from meridian.offline.tiny import vocabulary
        from meridian.vllm.scheduler import MeridianScheduler
        from meridian.vllm.thinking import MeridianThinkingProcessor

        if config is None:
            spec = EngineSpec(model_dir=model, additional_config={"meridian": meridian or {}})
            config = vllm_config_for(spec, MeridianScheduler)
        self.config = config
        self.model = model
        self.proc = MeridianThinkingProcessor(config, torch.device("cpu"), False)
        self.vocab = vocabulary()
        self.size = len(self.vocab)
        self.prompt = [self.vocab[w] for w in ["<|im_start|>", "user", "think", "9", "<|im_end|>", "<think>"]]
        self.outputs: dict[int, list[int]] = {}
        self.pending: tuple[list[Any], list[Any], list[Any]] = ([], [], [])

    def add(self, row: int, xargs: dict[str, Any] | None, output: list[int] | None = None, prompt: list[int] | None = None,
            *, slo_class: str | None = "standard") -> list[int]:
        """Adds a request to the batch; ``slo_class`` is the class MeridianScheduler would have
        stamped (``None``: none, as for a request that bypassed the scheduler)."""
        from vllm import SamplingParams

        from meridian.vllm.names import PROBE_FOR_ARG, RESOLVED_CLASS_ARG

        out = output if output is not None else []
        self.outputs[row] = out
        extra = dict(xargs) if xargs is not None else None
        if slo_class is not None and PROBE_FOR_ARG not in (extra or {}):
            extra = {**(extra or {}), RESOLVED_CLASS_ARG: slo_class}
        params = SamplingParams(max_tokens=100, extra_args=extra)
        self.pending[1].append((row, params, prompt or self.prompt, out))
        return out

    def remove(self, row: int) -> None:
        if self.pending[2]:
            # vLLM's BatchUpdate applies its removals before its moves: a removal after a move
            # belongs to the next update.
            self.flush()
        self.outputs.pop(row, None)
        self.pending[0].append(row)

    def flush(self) -> None:
        """Hands the pending batch changes over as one update, as a step would, without a step."""
        from vllm.v1.sample.logits_processor import BatchUpdate

        removed, added, moved = self.pending
        if removed or added or moved:
            self.pending = ([], [], [])
            self.proc.update_state(BatchUpdate(max(self.outputs, default=-1) + 1, removed, added, moved))

    def swap(self, a: int, b: int) -> None:
        from vllm.v1.sample.logits_processor import MoveDirectionality

        self.outputs[a], self.outputs[b] = self.outputs[b], self.outputs[a]
        self.pending[2].append((a, b, MoveDirectionality.SWAP))

    def fresh(self) -> Driver:
        """A new processor and batch under the same vLLM configuration."""
        return Driver(self.model, config=self.config)

    def step(self, logits: Any = None, *, sample: bool = True) -> Any:
        from vllm.v1.sample.logits_processor import BatchUpdate

        removed, added, moved = self.pending
        update = BatchUpdate(max(self.outputs, default=-1) + 1, removed, added, moved) if (removed or added or moved) else None
        self.pending = ([], [], [])
        self.proc.update_state(update)
        rows = max(self.outputs, default=-1) + 1
        if logits is None:
            logits = self.word_logits(rows)
        before = logits.clone()
        after = self.proc.apply(logits)
        if sample:
            for row, out in self.outputs.items():
                out.append(int(after[row].argmax()))
        return before, after

    def word_logits(self, rows: int) -> Any:
        """Logits whose argmax is the word "so" (an ordinary thinking token)."""
        logits = torch.randn(rows, self.size)
        logits[:, self.vocab["so"]] = 50.0
        return logits


def test_a_budget_forces_the_end_marker_and_leaves_other_rows_alone(tiny_model: Path) -> None:
    d = Driver(tiny_model)
    controlled = d.add(0, {"meridian_thinking_budget_tokens": 3, "meridian_req_id": "a"})
    free = d.add(1, None)
    for _ in range(3):
        before, after = d.step()
        assert torch.equal(before, after), "nothing forced while the budget lasts"
    before, after = d.step()
    end = d.vocab["</think>"]
    assert controlled[-1] == end and after[0, end] == 0.0 and torch.isinf(after[0]).sum() == d.size - 1
    assert torch.equal(before[1], after[1]), "the uncontrolled row is untouched"
    assert free[-1] == d.vocab["so"]
    before, after = d.step()
    assert torch.equal(before, after), "after the marker the answer is the model's"
    assert controlled.count(end) == 1


def test_the_closing_text_comes_before_the_marker(tiny_model: Path) -> None:
    d = Driver(tiny_model)
    closing = json.dumps({"budget_tokens": 1, "closing": {"closing_text": "ok done"}})
    out = d.add(0, {"meridian_thinking": closing, "meridian_req_id": "a"})
    for _ in range(5):
        d.step()
    words = [d.vocab["so"], d.vocab["ok"], d.vocab["done"], d.vocab["</think>"], d.vocab["so"]]
    assert out == words


def test_forcing_follows_a_request_across_a_swap(tiny_model: Path) -> None:
    d = Driver(tiny_model)
    out = d.add(0, {"meridian_thinking_budget_tokens": 2, "meridian_req_id": "a"})
    d.add(1, None)
    d.step()
    d.swap(0, 1)
    d.step()
    _, after = d.step()
    assert out[-1] == d.vocab["</think>"] and after[1, d.vocab["</think>"]] == 0.0
    assert not torch.isinf(after[0]).any()


def test_async_placeholders_wait_for_the_real_token(tiny_model: Path) -> None:
    d = Driver(tiny_model)
    out = d.add(0, {"meridian_thinking_budget_tokens": 2, "meridian_req_id": "a"})
    d.step()
    out.append(-1)  # the runner's placeholder for a token still on the device
    _, after = d.step(sample=False)
    assert not torch.isinf(after).any(), "one real thinking token so far"
    out[-1] = d.vocab["so"]
    _, after = d.step()
    assert out[-1] == d.vocab["</think>"]


def test_a_preempted_request_resumes_its_count(tiny_model: Path) -> None:
    d = Driver(tiny_model)
    out = d.add(0, {"meridian_thinking_budget_tokens": 4, "meridian_req_id": "a"})
    d.step()
    d.step()
    d.remove(0)
    d.step(sample=False)
    d.add(2, {"meridian_thinking_budget_tokens": 4, "meridian_req_id": "a"}, output=out)
    d.step()
    d.step()
    d.step()
    assert out[:4] == [d.vocab["so"]] * 4 and out[4] == d.vocab["</think>"], out


def test_eat_probes_round_trip_through_the_bus(tiny_model: Path, bus_dir: Path) -> None:
    from meridian.vllm.bus import SchedulerEndpoint
    from meridian.vllm.thinking import PROBE_FOR_ARG

    scheduler = SchedulerEndpoint()
    try:
        d = Driver(tiny_model)
        rule = {"eat": {"min_lines": 2}, "boundaries": {"line_end": ["so"], "sentence_end": []}}
        out = d.add(0, {"meridian_thinking": json.dumps(rule), "meridian_req_id": "a"})
        for _ in range(3):
            d.step()
        # A token is seen on the step after it is sampled: two seen, two line ends, two probes.
        assert scheduler.take_probes() == [("a", 1), ("a", 2)], "every line end asks for a probe"
        for probe_row in (1, 2):
            d.add(probe_row, {PROBE_FOR_ARG: "a"})
        logits = d.word_logits(3)
        logits[1:] = 0.0  # uniform probe rows: the same entropy on both probes
        d.step(logits, sample=False)
        d.remove(1)
        d.remove(2)
        _, after = d.step()
        assert out[-1] == d.vocab["</think>"], "two equal probes: variance 0, EAT fires"
    finally:
        scheduler.close()


def test_requests_without_arguments_are_not_touched(tiny_model: Path) -> None:
    d = Driver(tiny_model)
    d.add(0, None)
    d.add(1, {"meridian_thinking": "off"})
    for _ in range(4):
        before, after = d.step()
        assert torch.equal(before, after)
    assert not d.proc._v1._rows, "nothing tracked for uncontrolled requests"


def test_a_failing_request_loses_its_control_not_the_engine(tiny_model: Path, caplog: pytest.LogCaptureFixture) -> None:
    d = Driver(tiny_model)
    broken = d.add(0, {"meridian_thinking_budget_tokens": 2, "meridian_req_id": "a"})
    healthy = d.add(1, {"meridian_thinking_budget_tokens": 2, "meridian_req_id": "b"})
    d.step()
    d.proc._v1._worker._token_text = lambda token_id: (_ for _ in ()).throw(RuntimeError("tokenizer broke"))  # type: ignore[method-assign]
    d.step()
    assert "thinking control failed for request a" in caplog.text
    assert not d.proc._v1._rows, "both lost control: both hit the broken tokenizer"
    _, after = d.step()
    assert not torch.isinf(after).any() and broken[-1] == healthy[-1] == d.vocab["so"], "both run on, uncontrolled"


def test_the_cpu_meter_matches_the_float64_reference() -> None:
    import numpy as np

    from meridian.kernels.meter import CpuMeter
    from meridian.kernels.reference import logits_stats_reference

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 5003, generator=generator) * 3
    logits[2, ::7] = float("-inf")
    logits[4] = float("-inf")
    rows = [0, 2, 4, 8]
    meter = CpuMeter()
    meter.submit(logits, rows, rows, 17)
    got = dict(meter.collect())
    assert meter.collect() == []
    ref = logits_stats_reference(logits[rows].numpy(), [17])
    for i, row in enumerate(rows):
        entropy, prob, rank = got[row]
        assert entropy == pytest.approx(ref.entropy[i], rel=1e-5, abs=1e-6)
        assert prob == pytest.approx(ref.target_prob[i, 0], rel=1e-5, abs=1e-9)
        assert rank == int(ref.target_rank[i, 0])
    assert np.isfinite([v for values in got.values() for v in values]).all()


def _ops() -> Any:
    from hypothesis import strategies as st

    rows = st.integers(0, 3)
    return st.lists(
        st.one_of(
            st.tuples(st.just("add"), rows, st.one_of(st.none(), st.integers(1, 30))),
            st.tuples(st.just("remove"), rows, st.none()),
            st.tuples(st.just("swap"), rows, rows),
            st.tuples(st.just("step"), st.booleans(), st.none()),
            st.tuples(st.just("step"), st.just(False), st.none()),
        ),
        min_size=5,
        max_size=60,
    )


def test_random_batch_histories_keep_the_invariants(tiny_model: Path) -> None:
    """Whatever vLLM does to the batch — adds, removals (a preempted request comes back with its
    output list), swaps, a token that arrives a step late (an async placeholder) — an
    uncontrolled row is never touched, a controlled request thinks exactly its budget (or less, if
    it leaves first) and gets the end marker at most once, and nothing raises."""
    from hypothesis import HealthCheck, example, given, settings

    template = Driver(tiny_model)
    end = template.vocab["</think>"]

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    # Two controlled rows swapped mid-thinking: random histories reach it rarely, and a processor
    # that dropped the second of a swapped pair passes them all.
    @example([("add", 0, 5), ("add", 1, 5), ("step", False, None), ("swap", 0, 1)] + [("step", False, None)] * 8)
    # A removal after a swap in the same step: vLLM's update removes before it moves.
    @example([("add", 0, 1), ("step", False, None), ("add", 2, None), ("swap", 0, 2), ("remove", 0, None),
              ("step", False, None)])
    @given(_ops())
    def run(ops: list[tuple[Any, Any, Any]]) -> None:
        d = template.fresh()
        budgets: dict[str, int | None] = {}
        lists: dict[str, list[int]] = {}
        row_of: dict[int, str] = {}
        for kind, a, b in ops:
            if kind == "add" and a not in row_of:
                req_id = next((r for r in lists if r not in row_of.values()), f"r{len(lists)}")
                budget = budgets.setdefault(req_id, b)
                xargs = {"meridian_req_id": req_id, **({"meridian_thinking_budget_tokens": budget} if budget else {})}
                lists[req_id] = d.add(a, xargs, output=lists.get(req_id))
                row_of[a] = req_id
            elif kind == "remove" and a in row_of:
                d.remove(a)
                del row_of[a]
            elif kind == "swap" and a in row_of and b in row_of and a != b:
                d.swap(a, b)
                row_of[a], row_of[b] = row_of[b], row_of[a]
            elif kind == "step" and row_of:
                rows = max(d.outputs) + 1
                late = a
                before, after = d.step(d.word_logits(rows), sample=not late)
                for row, req_id in row_of.items():
                    if budgets[req_id] is None:
                        assert torch.equal(before[row], after[row]), "an uncontrolled row was touched"
                if late:
                    # The token sampled from `after` is still on the device for one more step.
                    sampled = {row: int(after[row].argmax()) for row in d.outputs}
                    for out in d.outputs.values():
                        out.append(-1)
                    d.step(d.word_logits(rows), sample=False)
                    for row, out in d.outputs.items():
                        out[-1] = sampled[row]
        for req_id, out in lists.items():
            budget = budgets[req_id]
            assert out.count(end) <= 1
            if end in out:
                assert budget is not None and out.index(end) == budget, (budget, out)
            elif budget is not None:
                assert len(out) <= budget, "a budgeted request thought past its budget"

    run()


def test_the_processor_refuses_to_start_without_meridians_scheduler(tiny_model: Path) -> None:
    from meridian.errors import ConfigError
    from meridian.offline.engine import EngineSpec, vllm_config_for
    from meridian.vllm.thinking import MeridianThinkingProcessor

    config = vllm_config_for(EngineSpec(model_dir=tiny_model))  # vLLM's own scheduler
    with pytest.raises(ConfigError, match="--scheduler-cls meridian.vllm.MeridianScheduler"):
        MeridianThinkingProcessor(config, torch.device("cpu"), False)


def test_a_request_without_a_resolved_class_is_left_alone(tiny_model: Path) -> None:
    # The class would decide the control; the processor never guesses one.
    d = Driver(tiny_model, {"thinking_control": {"budget_tokens": 1}})
    unstamped = d.add(0, {"meridian_req_id": "a"}, slo_class=None)
    stamped = d.add(1, {"meridian_req_id": "b"})
    for _ in range(3):
        d.step()
    end = d.vocab["</think>"]
    assert end not in unstamped, "no class, no control"
    assert stamped[1] == end, "the class's budget of one token ends the stamped request's reasoning"


def test_the_scheduler_ends_a_degrade_class_thinking_and_the_stop_is_reported(tiny_model: Path, bus_dir: Path) -> None:
    from meridian.vllm.bus import SchedulerEndpoint

    degrade = {"classes": {"standard": {"ttft_ms": 1000, "ttfat_ms": 10000, "answer_tpot_ms": 100, "rank": 0,
                                        "on_overload": "degrade"}}, "default_class": "standard"}
    scheduler = SchedulerEndpoint()  # in this process: the worker finds it in memory
    try:
        d = Driver(tiny_model, degrade)
        # No rule is on, but the class degrades: its thinking is followed, and ends when told.
        late = d.add(0, {"meridian_req_id": "late"})
        other = d.add(1, {"meridian_req_id": "other"})
        for _ in range(3):
            before, after = d.step()
            assert torch.equal(before, after)
        scheduler.publish({}, frozenset({"late"}))
        d.step()
        end = d.vocab["</think>"]
        assert late[-1] == end and other[-1] == d.vocab["so"]
        assert scheduler.take_stops() == [("late", "overload", 3)]
        d.step()
        assert late.count(end) == 1, "ended once"
    finally:
        scheduler.close()


def test_the_scheduler_creates_a_missing_bus_folder_that_only_its_user_may_enter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from meridian.vllm.bus import SchedulerEndpoint

    folder = tmp_path / "not" / "there"
    monkeypatch.setenv("MERIDIAN_BUS_DIR", str(folder))
    scheduler = SchedulerEndpoint()
    try:
        assert (folder / f"meridian-{os.getpid()}.sock").exists(), "the worker's socket is bound"
        assert folder.stat().st_mode & 0o777 == 0o700
    finally:
        scheduler.close()
