"""The trained reasoning-format fixtures (tests/fixtures/tiny-reasoner; in the compute-bound
shape, tests/fixtures/compute-reasoner; counting down from up to 990, tests/fixtures/long-reasoner): their files are the
documented ones, its config and tokenizer are what the generator writes, the training data has
the promised shape, and greedy decoding through vLLM's real CPU engine follows the prompt's
lengths — with stock vLLM's scheduler and with MeridianScheduler, token for token."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from meridian.offline.tiny import (
    FILLERS, LETTERS, MAX_NUMBER, MODEL_SHAPES, completion_words, prompt_words, vocabulary, write_tiny_model,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
#: (shape name, fixture folder, largest weights file allowed in the repository).
MODELS = [("tiny", "tiny-reasoner", 4 * 1024 * 1024), ("compute", "compute-reasoner", 10 * 1024 * 1024),
          ("long", "long-reasoner", 4 * 1024 * 1024)]
#: Prompts each fixture's greedy output is checked on: (countdown, answer letters).
CASES = {"tiny": [(1, 1), (9, 4), (40, 13), (99, 26)], "compute": [(1, 1), (9, 4), (40, 13), (99, 26)],
         "long": [(1, 1), (42, 18), (238, 9), (990, 26)]}
by_model = pytest.mark.parametrize(("shape", "folder", "max_bytes"), MODELS, ids=[m[0] for m in MODELS])


@by_model
def test_fixture_files_match_the_documented_hashes(shape: str, folder: str, max_bytes: int) -> None:
    FIXTURE = FIXTURES / folder
    manifest = json.loads((FIXTURE / "MANIFEST.json").read_text())
    files = {p.name for p in FIXTURE.iterdir()} - {"MANIFEST.json"}
    assert files == set(manifest["sha256"])
    for name, digest in manifest["sha256"].items():
        assert hashlib.sha256((FIXTURE / name).read_bytes()).hexdigest() == digest, name
    assert (FIXTURE / "model.safetensors").stat().st_size < max_bytes
    assert f"--shape {shape}" in manifest["made_by"] or shape == "tiny"


@by_model
def test_generator_reproduces_config_and_tokenizer(tmp_path: Path, shape: str, folder: str, max_bytes: int) -> None:
    FIXTURE = FIXTURES / folder
    max_number = MAX_NUMBER[shape]
    write_tiny_model(tmp_path, shape=MODEL_SHAPES[shape], max_position_embeddings=512 if max_number < 100 else 2048,
                     max_number=max_number)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (tmp_path / name).read_bytes() == (FIXTURE / name).read_bytes(), name


def test_training_sequences_count_down_then_answer() -> None:
    rng = random.Random(7)
    vocab = vocabulary()
    for _ in range(50):
        n, m = rng.randint(1, 99), rng.randint(1, 26)
        words = completion_words(n, m, rng)
        end = words.index("</think>")
        numbers = [w for w in words[:end] if w.isdigit()]
        assert numbers == [str(k) for k in range(n, 0, -1)]
        assert all(w in FILLERS for w in words[:end] if not w.isdigit())
        assert words[end + 1 :] == LETTERS[:m] + ["<|im_end|>"]
        assert all(w in vocab for w in prompt_words(n, m) + words)


@pytest.mark.vllm
@by_model
@pytest.mark.runs_model
def test_greedy_generation_through_vllm_follows_the_prompt(monkeypatch: pytest.MonkeyPatch, shape: str, folder: str,
                                                           max_bytes: int) -> None:
    FIXTURE = FIXTURES / folder
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process: deterministic steps
    from vllm import LLM, SamplingParams

    cases = CASES[shape]
    outputs = {}
    for name, scheduler_cls in (("vllm", None), ("meridian", "meridian.vllm.MeridianScheduler")):
        llm = LLM(
            model=str(FIXTURE), dtype="float32", enforce_eager=True, max_model_len=512 if shape != "long" else 1088, block_size=32,
            kv_cache_memory_bytes=16 * 1024 * 1024, reasoning_parser="deepseek_r1", seed=0, max_num_seqs=8,
            scheduler_cls=scheduler_cls,
        )
        vocab = llm.get_tokenizer().get_vocab()
        prompts = [{"prompt_token_ids": [vocab[w] for w in prompt_words(n, m)]} for n, m in cases]
        results = llm.generate(prompts, SamplingParams(max_tokens=1050, temperature=0.0))
        outputs[name] = [list(r.outputs[0].token_ids) for r in results]
        if scheduler_cls is not None:
            scheduler = llm.llm_engine.engine_core.engine_core.scheduler
            assert type(scheduler).__name__ == "MeridianScheduler"
            reports = {r.req_id: r for r in scheduler.finished_reports}
            assert len(reports) == len(cases)
            assert all(r.num_answer_tokens >= 2 and r.ttfat_ms is not None for r in reports.values())
        del llm
    assert outputs["meridian"] == outputs["vllm"], "the scheduler must not change greedy outputs"
    inverse = {i: w for w, i in vocabulary(MAX_NUMBER[shape]).items()}
    for (n, m), ids in zip(cases, outputs["vllm"]):
        words = [inverse[i] for i in ids]
        end = words.index("</think>")
        assert [w for w in words[:end] if w.isdigit()] == [str(k) for k in range(n, 0, -1)]
        assert words[end + 1 :] == LETTERS[:m] + ["<|im_end|>"]
