"""Every name that crosses a process boundary or the HTTP API, defined once.

The request arguments a client sends (``vllm_xargs`` / ``SamplingParams.extra_args``) are the
core's own constants, re-exported here and never retyped; the rest are the keys and markers
``MeridianScheduler``, ``MeridianThinkingProcessor`` and the tools around them agree on: the
``--additional-config`` block, the values the scheduler stamps into a request for the worker,
the bus between them, the request log's fields, and the class paths an operator passes to
``vllm serve``. Invariant: this module imports nothing but the core, so every layer (and every
process) can read it without importing vLLM.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from meridian._core import (
    CLASS_ARG,
    EFFORT_ARG,
    EFFORT_LEVELS,
    POLICY_NAMES,
    SHED_REASONS,
    THINKING_ARG,
    THINKING_BUDGET_ARG,
    THINKING_STOP_RULES,
    WAITED_ARG,
)

__all__ = [
    "BUS_DIR_ENV",
    "CLASS_ARG",
    "CLASS_TARGETS",
    "CONFIG_KEY",
    "EFFORT_ARG",
    "EFFORT_FIELD",
    "EFFORT_LEVELS",
    "KV_HANDOFF_OUTCOMES",
    "KV_TIER_DECISIONS",
    "LOGITS_PROCESSOR",
    "MIDDLEWARE",
    "LABEL_VALUES",
    "METRIC_NAMES",
    "SERIES",
    "POLICY_NAMES",
    "PREEMPTION_PHASES",
    "PROBE_FOR_ARG",
    "PROBE_ID_INFIX",
    "REPORT_FIELDS",
    "REQUEST_ARGS",
    "REQUEST_STATES",
    "REQ_ID_ARG",
    "RESOLVED_CLASS_ARG",
    "SCHEDULER_CLS",
    "STEP_TIME_TERMS",
    "Series",
    "THINKING_ARG",
    "THINKING_BUDGET_ARG",
    "THINKING_STOP_FIELDS",
    "WAITED_ARG",
    "WAITED_HEADER",
    "LOAD_PATH",
    "XARGS_FIELD",
]

#: Key of Meridian's block in ``--additional-config``.
CONFIG_KEY = "meridian"
#: ``--scheduler-cls`` value.
SCHEDULER_CLS = "meridian.vllm.MeridianScheduler"
#: ``--logits-processors`` value.
LOGITS_PROCESSOR = "meridian.vllm.thinking:MeridianThinkingProcessor"
#: ``--middleware`` value: the request arguments checked in vLLM's API server (HTTP 400), shed
#: requests answered with HTTP 429 or 503, the load a router polls.
MIDDLEWARE = "meridian.vllm.frontend.MeridianFrontend"

#: Every request argument a client sends Meridian, as the core checks them.
REQUEST_ARGS = (CLASS_ARG, THINKING_ARG, THINKING_BUDGET_ARG, EFFORT_ARG, WAITED_ARG)
#: Request header a router or client may set on a retry: how long, in ms, the client already
#: waited for the request elsewhere (``MeridianFrontend`` hands it on as ``WAITED_ARG``).
WAITED_HEADER = "x-meridian-waited-ms"
#: The route ``MeridianFrontend`` serves for a router's load poll (vllm-router's
#: ``power_of_two``): ``{"load": <integer>}``, the work ahead in expected output tokens.
LOAD_PATH = "/get_load"
#: Field of an OpenAI-API request body that carries the request arguments (vLLM's name; vLLM
#: hands them on as ``SamplingParams.extra_args``).
XARGS_FIELD = "vllm_xargs"
#: Field of an OpenAI chat-completion request body with the request's reasoning effort
#: (``MeridianFrontend`` hands the levels of ``EFFORT_LEVELS`` on as ``EFFORT_ARG``).
EFFORT_FIELD = "reasoning_effort"

#: Stamped into ``extra_args`` by ``MeridianScheduler``: the request's id and the class the core
#: resolved for it (the logits processor sees sampling params, not requests).
REQ_ID_ARG = "meridian_req_id"
RESOLVED_CLASS_ARG = "meridian_resolved_class"
#: Set on an internal EAT probe: the ``req_id`` it measures.
PROBE_FOR_ARG = "meridian_probe_for"
#: Between a parent's ``req_id`` and the serial number in an EAT probe's ``req_id``.
PROBE_ID_INFIX = "-meridian-eat-probe-"

#: Environment variable naming the folder of the scheduler ↔ worker bus and, with one API server,
#: the metrics files (default: ``meridian-<uid>`` in the temp directory; this user's alone).
BUS_DIR_ENV = "MERIDIAN_BUS_DIR"

#: Fields of a finished request's line in the request log (``request_log_path``), in order.
REPORT_FIELDS = (
    "req_id",
    "slo_class",
    "reason",
    "arrival_ms",
    "ttft_ms",
    "ttfat_ms",
    "transition_gap_ms",
    "think_tpot_ms",
    "answer_tpot_ms",
    "e2e_ms",
    "max_answer_gap_ms",
    "num_stalls",
    "num_think_tokens",
    "num_answer_tokens",
    "num_preemptions_prefill",
    "num_preemptions_think",
    "num_preemptions_answer",
    "met_all",
    "never_reusable_from_token",
    "kv_handoff",
)
#: Fields after them: the thinking-control rule that ended the reasoning, and after how many tokens.
THINKING_STOP_FIELDS = ("thinking_stopped_by", "thinking_stopped_after_tokens")


class Series(NamedTuple):
    """One of Meridian's series on vLLM's ``/metrics``: what ``meridian.vllm.metrics`` creates and
    the documentation's metrics reference lists, from this one definition."""

    #: Short key the code and the tests use.
    key: str
    #: The name as exposed (a counter's ends in ``_total``).
    name: str
    kind: Literal["counter", "gauge", "histogram"]
    #: Labels besides ``model_name`` and ``engine`` (vLLM's own; ``engine`` is the data-parallel rank).
    labels: tuple[str, ...]
    #: The series' HELP text, which the reference shows too.
    help: str
    #: Who writes it: the engine core (labels ``model_name``, ``engine``, then ``labels``), or the
    #: API server (``model_name``, then ``labels``: it serves every engine behind it).
    process: Literal["engine", "api_server"] = "engine"


#: Victim phases of ``meridian:preemptions_total``, as the core counts them.
PREEMPTION_PHASES = ("prefill", "think", "answer")
#: States a request is counted in by ``meridian:num_requests``.
REQUEST_STATES = ("waiting", "prefilling", "thinking", "answering")
#: Terms of the step-time model (``meridian:step_time_model_ms``), in the core's order.
STEP_TIME_TERMS = ("base", "per_prefill_token", "per_decode_request", "per_context_token")
#: Targets of ``meridian:class_target_seconds``, as the configuration names them (``<target>_ms``).
CLASS_TARGETS = ("ttft", "ttfat", "answer_tpot", "e2e")
#: What became of a KV-tier hit on resume.
KV_TIER_DECISIONS = ("loaded", "recomputed")
#: What became of a prefill/decode hand-off on this engine.
KV_HANDOFF_OUTCOMES = ("sent", "received", "failed")

#: The values of every label with a fixed set of them (``class`` takes the configured class names).
LABEL_VALUES: dict[str, tuple[str, ...]] = {
    "met_slo": ("true", "false"),
    "phase": PREEMPTION_PHASES,
    "reason": SHED_REASONS,
    "rule": THINKING_STOP_RULES,
    "decision": KV_TIER_DECISIONS,
    "outcome": KV_HANDOFF_OUTCOMES,
    "state": REQUEST_STATES,
    "term": STEP_TIME_TERMS,
    "target": CLASS_TARGETS,
}

#: Meridian's series on vLLM's ``/metrics``, by key. The dashboard, the tests, the router recipe
#: and the documentation read these.
SERIES: dict[str, Series] = {
    s.key: s
    for s in (
        Series(
            "ttfat",
            "meridian:time_to_first_output_token_seconds",
            "histogram",
            ("class",),
            "Time to first output (answer) token of each finished request that answered (TTFAT; what "
            "aiperf calls TTFO).",
        ),
        Series(
            "answer_tpot",
            "meridian:answer_time_per_output_token_seconds",
            "histogram",
            ("class",),
            "Mean time per answer token of each finished request (answer TPOT).",
        ),
        Series(
            "thinking_tokens",
            "meridian:thinking_tokens",
            "histogram",
            ("class",),
            "Reasoning tokens per finished request.",
        ),
        Series(
            "requests_finished",
            "meridian:requests_finished_total",
            "counter",
            ("class", "met_slo"),
            "Finished requests by class and whether they met every class target (aborted ones count as missed).",
        ),
        Series(
            "preemptions", "meridian:preemptions_total", "counter", ("phase",), "Preemptions by the victim's phase."
        ),
        Series(
            "answer_preemption_alarms",
            "meridian:answer_preemption_alarms_total",
            "counter",
            (),
            "Answering requests preempted while a thinking request ran (each is also logged).",
        ),
        Series(
            "arrival_preemptions",
            "meridian:arrival_preemptions_total",
            "counter",
            ("class",),
            "Running requests preempted for a more important arrival, by the victim's class.",
        ),
        Series(
            "shed_requests",
            "meridian:shed_requests_total",
            "counter",
            ("class", "reason"),
            "Requests ended early because they could no longer meet their class's targets "
            "(on_overload: shed), by the target they would miss.",
        ),
        Series(
            "arrival_refusals",
            "meridian:arrival_refusals_total",
            "counter",
            ("class",),
            "Requests refused by admission at arrival (HTTP 429 or 503 + Retry-After before they reached the engine: "
            "their class would have waited past its TTFT target), by class; written by the API server.",
            process="api_server",
        ),
        Series(
            "thinking_stops",
            "meridian:thinking_stops_total",
            "counter",
            ("rule",),
            "Reasoning ended by a thinking-control rule.",
        ),
        Series(
            "kv_tier_resumes",
            "meridian:kv_tier_resumes_total",
            "counter",
            ("decision",),
            "KV-tier hits on resume, loaded or recomputed.",
        ),
        Series(
            "kv_tier_resume_tokens",
            "meridian:kv_tier_resume_tokens_total",
            "counter",
            ("decision",),
            "Tokens of those hits, loaded or recomputed.",
        ),
        Series(
            "kv_tier_failed_load_blocks",
            "meridian:kv_tier_failed_load_blocks_total",
            "counter",
            (),
            "KV blocks whose load from a tier failed (recomputed).",
        ),
        Series(
            "kv_handoffs",
            "meridian:kv_handoffs_total",
            "counter",
            ("outcome",),
            "Prefill/decode hand-offs of this engine: KV sent on after the prompt (prefill side), "
            "received from another engine, or whose arrival failed (the prompt was computed here).",
        ),
        Series(
            "kv_handoff_received_tokens",
            "meridian:kv_handoff_received_tokens_total",
            "counter",
            (),
            "Prompt tokens whose KV arrived from another engine instead of being computed here.",
        ),
        Series("num_requests", "meridian:num_requests", "gauge", ("class", "state"), "Requests by class and state."),
        Series(
            "least_slack",
            "meridian:least_slack_seconds",
            "gauge",
            ("class",),
            "Least slack before a TTFAT/TTFT deadline among the class's requests not answering yet (NaN: none).",
        ),
        Series(
            "ttfat_headroom",
            "meridian:ttfat_headroom_seconds",
            "gauge",
            ("class",),
            "Time left to the class's nearest TTFAT deadline (NaN: no request before its answer).",
        ),
        Series(
            "recent_ttfat_attainment",
            "meridian:recent_ttfat_attainment",
            "gauge",
            ("class",),
            "TTFAT attainment of the class's recent completions, the load-aware thinking budget's input "
            "(NaN before the first).",
        ),
        Series(
            "phase_weighted_queue",
            "meridian:phase_weighted_queue",
            "gauge",
            (),
            "Expected remaining output of every request, in fresh requests of its class: a queue length "
            "for routers in which a request past its thinking weighs less than a fresh one.",
        ),
        Series(
            "expected_output_tokens",
            "meridian:expected_output_tokens",
            "gauge",
            (),
            "Expected remaining output tokens of every request (the phase-weighted queue in tokens; "
            "integer-safe for routers that read a gauge as an integer).",
        ),
        Series(
            "saturation",
            "meridian:saturation",
            "gauge",
            ("class",),
            "How long a new request of the class would wait for its first token, in units of its TTFT "
            "target (>= 1: it would miss it; route it elsewhere).",
        ),
        Series(
            "step_time_model", "meridian:step_time_model_ms", "gauge", ("term",), "The step-time model's coefficients."
        ),
        Series(
            "class_target",
            "meridian:class_target_seconds",
            "gauge",
            ("class", "target"),
            "The class's targets, for dashboards (NaN: not set).",
        ),
    )
}

#: Each series' exposed name, by key.
METRIC_NAMES = {key: series.name for key, series in SERIES.items()}
