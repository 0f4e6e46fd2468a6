"""The tiny reasoning model through vLLM with ``MeridianScheduler`` and no logits processor (what
vLLM's Model Runner V2 leaves Meridian): the scheduler sets vLLM's own per-request
``thinking_token_budget`` from the request's hard budget, its ``reasoning_effort`` and the
class's load-aware budget, and vLLM's sampler ends the reasoning there."""

from __future__ import annotations

from pathlib import Path

import pytest

from meridian.offline.tiny import LETTERS, prompt_words, vocabulary
from meridian.vllm.names import EFFORT_ARG, THINKING_BUDGET_ARG

pytestmark = [pytest.mark.vllm, pytest.mark.runs_model]

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-reasoner"
#: Small budgets the tiny model's countdown (30 numbers) runs past.
EFFORT = {"low_tokens": 5, "medium_tokens": 9, "high_tokens": 1000, "answer_room_tokens": 8}


def test_the_scheduler_drives_vllms_thinking_budget_without_the_processor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(FIXTURE), dtype="float32", enforce_eager=True, max_model_len=512, block_size=32,
        kv_cache_memory_bytes=16 * 1024 * 1024, reasoning_parser="deepseek_r1", seed=0, max_num_seqs=8,
        scheduler_cls="meridian.vllm.MeridianScheduler",
        additional_config={"meridian": {"thinking_control": {"reasoning_effort": EFFORT}}},
    )
    vocab = llm.get_tokenizer().get_vocab()
    inverse = {i: w for w, i in vocabulary().items()}
    prompt = {"prompt_token_ids": [vocab[w] for w in prompt_words(30, 3)]}
    cases = {
        # request arguments, the client's own thinking_token_budget, max_tokens -> thinking tokens
        "untouched": ({}, None, 200),
        "low": ({EFFORT_ARG: "low"}, None, 200),
        "medium": ({EFFORT_ARG: "medium"}, None, 200),
        "high under max_tokens": ({EFFORT_ARG: "high"}, None, 20),  # 20 - 8 of answer room
        "hard budget": ({THINKING_BUDGET_ARG: 7}, None, 200),
        "client tighter": ({EFFORT_ARG: "medium"}, 3, 200),
    }
    params = [
        SamplingParams(max_tokens=max_tokens, temperature=0.0, extra_args=dict(args) or None,
                       thinking_token_budget=client)
        for args, client, max_tokens in cases.values()
    ]
    results = llm.generate([prompt] * len(cases), params)
    thinking = {}
    for name, result in zip(cases, results):
        words = [inverse[i] for i in result.outputs[0].token_ids]
        assert "</think>" in words, (name, words)
        end = words.index("</think>")
        thinking[name] = end
        assert words[end + 1 : end + 4] == LETTERS[:3] or name == "high under max_tokens", (name, words)
    assert thinking["untouched"] >= 30, thinking  # the whole countdown
    assert {k: v for k, v in thinking.items() if k != "untouched"} == {
        "low": 5, "medium": 9, "high under max_tokens": 12, "hard budget": 7, "client tighter": 3,
    }
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    assert type(scheduler).__name__ == "MeridianScheduler"
    # The finish reports the rule whose budget vLLM enforced; a request whose thinking ended on its
    # own reports none.
    stops = {r.req_id: (r.thinking_stopped_by, r.thinking_stopped_after_tokens) for r in scheduler.finished_reports}
    # The engine's request ids carry a suffix after the client's.
    engine_id = {result.request_id: next(k for k in stops if k == result.request_id or k.startswith(f"{result.request_id}-"))
                 for result in results}
    by_case = dict(zip(cases, (stops[engine_id[result.request_id]] for result in results)))
    assert by_case == {
        "untouched": (None, None), "low": ("budget", 5), "medium": ("budget", 9), "high under max_tokens": ("budget", 12),
        "hard budget": ("budget", 7), "client tighter": ("budget", 3),
    }
    assert scheduler.meridian.num_thinking_stops()["budget"] == 5
    del llm
