"""Thinking-control scenarios for the tiny counting model, shared by the live test and
``bench/thinking_saved.py``.

The tiny model reasons by counting down (``think N answer M`` → ``N … 1``, ``</think>``, M
letters), so its reasoning has no prose: no ``\\n\\n`` lines, no full stops. The scenarios name
their own boundaries (for EAT a token whose text contains a 0 or a 5 ends a line; for RPDI
every token ends a sentence) and
thresholds read off the model's own signals under greedy decoding: next-token entropy ≈ 1.35
nats at every countdown step (the filler-word mass), the end token's rank 15–170, and an EAT
value ≈ 0.015 nats that hardly moves. Invariant: each scenario turns on exactly one rule, so the
rule that ended the reasoning is the one named.
"""

from __future__ import annotations

import json
from typing import Any

#: Line and sentence ends for a countdown (the model has no punctuation).
COUNTDOWN_BOUNDARIES = {"line_end": ["0", "5"], "sentence_end": ["0", "5"]}

#: Every countdown token ends a sentence (RPDI checks at each).
EVERY_TOKEN_A_SENTENCE = {"line_end": [], "sentence_end": [str(d) for d in range(10)]}

#: The class under which the load-aware scenario runs: targets no request can meet, so its
#: recent TTFAT attainment is 0 after the first completion.
STRICT_CLASS = "strict"
LOAD_AWARE = {"budget_tokens": 40, "min_budget_tokens": 8, "attainment_floor": 0.9}

#: Server configuration (``--additional-config``'s ``meridian`` block) for every scenario.
SERVER_CONFIG: dict[str, Any] = {
    "classes": {
        "standard": {"ttft_ms": 60_000, "ttfat_ms": 600_000, "answer_tpot_ms": 10_000, "rank": 1},
        STRICT_CLASS: {
            "ttft_ms": 0.001, "ttfat_ms": 0.001, "answer_tpot_ms": 0.001, "rank": 0,
            "thinking_control": {"load_aware": LOAD_AWARE},
        },
    },
    "default_class": "standard",
    "priority_map": {},
}

#: Mode name → the request's ``vllm_xargs`` (``None``: none at all).
MODES: dict[str, dict[str, Any] | None] = {
    "off (no arguments)": None,
    "off (explicit)": {"meridian_thinking": "off"},
    "budget 12": {"meridian_thinking_budget_tokens": 12},
    "eat": {"meridian_thinking": json.dumps({"eat": {"min_lines": 4}, "boundaries": COUNTDOWN_BOUNDARIES})},
    "proxy": {"meridian_thinking": json.dumps({"proxy": {"min_tokens": 5, "end_prob_threshold": None, "max_end_rank": 40}})},
    "rpdi": {
        "meridian_thinking": json.dumps({
            "rpdi": {"min_tokens": 8, "high_entropy_nats": 1.4, "alpha": 0.3, "ratio_threshold": 2.0},
            "boundaries": EVERY_TOKEN_A_SENTENCE,
        })
    },
    "load-aware (strict class)": {"meridian_class": STRICT_CLASS},
}

#: Extra server arguments: the processor next to the scheduler.
PROCESSOR_ARGS = ["--logits-processors", "meridian.vllm.thinking:MeridianThinkingProcessor"]


def server_config_json(extra: dict[str, Any] | None = None) -> str:
    """``--additional-config`` for the scenarios (plus ``extra`` keys of the meridian block)."""
    return json.dumps({"meridian": {**SERVER_CONFIG, **(extra or {})}})
