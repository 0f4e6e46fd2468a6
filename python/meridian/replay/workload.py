"""A trace request as the offline engine replays it: synthetic prompt text that follows the
trace's prefix block hashes, and a scripted "model" that thinks and answers for the trace's
lengths, with the config's signal-free thinking control applied.

The scripted model emits each request's next token from its trace lengths (thinking words, the
reasoning-end token, answer tokens, EOS); where a class runs ``budget_tokens`` or ``load_aware``
(``thinking_control``), the core's own ``ThinkingStream`` decides where the reasoning ends — the
closing text counted as one token per word, the load-aware budget reading the observer's recent
class attainment — exactly as in the logits processor. The signal rules (EAT, proxy, RPDI) need a
real model's logits and are refused by the runner. Invariant: the same trace request always
gives the same prompt tokens and the same script, whatever the policy replaying it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import numpy.typing as npt

from meridian._core import Config, ThinkingControl, ThinkingStream
from meridian.offline.engine import OfflineRequest
from meridian.offline.tiny import ANSWER_IDS, EOS, THINK_END, THINK_START, WORD_IDS, write_tiny_model
from meridian.replay.profiles import Profile
from meridian.replay.traces import TraceRequest

#: First token id of synthetic prompt text: above every marker of the tiny tokenizer, so prompt
#: text can never be mistaken for a reasoning or tool-call marker.
PROMPT_TOKEN_BASE = 1_000
#: Distinct synthetic prompt token ids.
PROMPT_TOKEN_RANGE = 100_000


def offline_requests(requests: list[TraceRequest], profile: Profile, config: Config) -> list[OfflineRequest]:
    """The trace's requests as the engine takes them: each in its class (the default class when
    it names none), at its class's rank as vLLM priority, with the ``max_tokens`` vLLM gives a
    request that sets none — what the profile's context leaves after the prompt (below 1: the
    engine rejects it, as vLLM's frontend would). Never the script's own length: a scheduler that
    reads ``max_tokens`` (Meridian caps its predicted remaining work by it) would know each
    request's length in the replay and not on a live server, where clients set a generous cap or
    none."""
    controls = {name: config.thinking_control(name) for name in config.class_names}
    followed = {name: config.thinking_stream_wanted(name, control) for name, control in controls.items()}
    ranks = {name: int(config.class_targets(name)["rank"] or 0) for name in config.class_names}
    out = []
    for trace in requests:
        slo_class = trace.slo_class or config.default_class
        script = ScriptedModel(trace, slo_class, controls[slo_class], followed[slo_class])
        out.append(
            OfflineRequest(
                req_id=trace.req_id,
                arrival_ms=trace.arrival_ms,
                prompt_token_ids=prompt_token_ids(trace),
                max_tokens=profile.max_model_len - trace.num_prompt_tokens,
                script=script,
                slo_class=slo_class,
                priority=ranks[slo_class],
            )
        )
    return out


class ScriptedModel:
    """One request's scripted output, token by token, with thinking control applied: the trace's
    thinking until a rule fires or the scheduler ends it (the core's ``ThinkingStream`` decides,
    as in the logits processor), the forced closing words and ``</think>``, then the trace's
    answer and EOS. ``followed``: the thinking is followed token by token (a rule is on, or the
    class degrades under overload)."""

    def __init__(self, trace: TraceRequest, slo_class: str, control: ThinkingControl, followed: bool) -> None:
        self.trace = trace
        self.slo_class = slo_class
        self.tokens: list[int] = []
        self.end_position: int | None = None
        self.stream: ThinkingStream | None = None
        closing_words = len((control.closing_text or "").split())
        if trace.num_think_tokens is not None and followed:
            forced = [WORD_IDS[i % len(WORD_IDS)] for i in range(closing_words)] + [THINK_END]
            self.stream = ThinkingStream(
                control, [THINK_START], start_ids=[THINK_START], end_ids=[THINK_END], forced_ids=forced
            )

    @property
    def thinking_stopped_by(self) -> str | None:
        return self.stream.fired_reason if self.stream is not None else None

    def end_thinking(self) -> None:
        """The scheduler ends the thinking now (``on_overload: degrade``): the next tokens close it."""
        if self.stream is not None:
            self.stream.end_for_overload()

    def token_at(self, position: int, attainment: Mapping[str, float]) -> int:
        """The token at output ``position`` (asked in order; a repeated position gets the same)."""
        while len(self.tokens) <= position:
            self.tokens.append(self._next(attainment))
        return self.tokens[position]

    def _next(self, attainment: Mapping[str, float]) -> int:
        position = len(self.tokens)
        stream = self.stream
        if stream is not None:
            stream.set_ttfat_attainment(attainment.get(self.slo_class, float("nan")))
            forced = stream.forced_token()
            token = forced if forced is not None else self._scripted(position)
            stream.on_token(token, "")
        else:
            token = self._scripted(position)
        if token == THINK_END and self.end_position is None:
            self.end_position = position
        return token

    def _scripted(self, position: int) -> int:
        trace = self.trace
        if trace.num_think_tokens is None:
            return script_token(trace, position)
        if self.end_position is None:
            return WORD_IDS[position % len(WORD_IDS)] if position < trace.num_think_tokens else THINK_END
        offset = position - self.end_position - 1
        return ANSWER_IDS[offset % len(ANSWER_IDS)] if offset < answer_tokens(trace) else EOS


def answer_tokens(trace: TraceRequest) -> int:
    """Visible answer tokens of ``trace`` (all of its output when it has no split)."""
    return trace.num_answer_tokens if trace.num_answer_tokens is not None else trace.num_output_tokens


def script_token(trace: TraceRequest, position: int) -> int:
    """The token at output ``position``: thinking words, ``</think>``, answer tokens, EOS."""
    if trace.num_think_tokens is not None:
        if position < trace.num_think_tokens:
            return WORD_IDS[position % len(WORD_IDS)]
        if position == trace.num_think_tokens:
            return THINK_END
        position -= trace.num_think_tokens + 1
    if position < answer_tokens(trace):
        return ANSWER_IDS[position % len(ANSWER_IDS)]
    return EOS


def _mix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's finaliser: consecutive inputs give unrelated outputs."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    mixed: npt.NDArray[np.uint64] = x ^ (x >> np.uint64(31))
    return mixed


def prompt_token_ids(trace: TraceRequest) -> list[int]:
    """Synthetic prompt text whose blocks follow the trace's prefix block hashes: requests that
    share a hashed block share its tokens, so vLLM's own prefix cache sees the trace's reuse.
    A prompt without hashes gets text of its own. The prompt ends the way a chat template ends
    it: ``<think>`` opened for a reasoning request, an empty ``<think></think>`` otherwise."""
    n = trace.num_prompt_tokens
    if trace.prefix_block_hashes and trace.hash_block_size:
        size = trace.hash_block_size
        blocks = np.repeat(np.asarray(trace.prefix_block_hashes, dtype=np.uint64), size)[:n]
        offsets = np.tile(np.arange(size, dtype=np.uint64), len(trace.prefix_block_hashes))[:n]
    else:
        # Own text: a key no trace hash can take (hash ids are non-negative and far below 2**62).
        digest = hashlib.blake2b(trace.req_id.encode(), digest_size=7).digest()
        seed = np.uint64((1 << 62) + int.from_bytes(digest, "little"))
        blocks = np.full(n, seed, dtype=np.uint64)
        offsets = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        mixed = _mix64(blocks * np.uint64(0x9E3779B97F4A7C15) + offsets)
    tokens: list[int] = (mixed % np.uint64(PROMPT_TOKEN_RANGE) + np.uint64(PROMPT_TOKEN_BASE)).tolist()
    tail = [THINK_START] if trace.num_think_tokens is not None else [THINK_START, THINK_END]
    if n <= len(tail):
        return tail[-n:]
    return tokens[: n - len(tail)] + tail


def model_dir_for(profile: Profile, cache_dir: Path) -> Path:
    """A tokenizer/config folder vLLM's config classes accept for ``profile``'s context length
    (the replay never runs the model; vLLM reads its vocabulary and limits)."""
    return write_tiny_model(
        cache_dir / f"replay-model-{profile.max_model_len}", max_position_embeddings=profile.max_model_len
    )
