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

from meridian._core import CLASS_ARG, POLICY_NAMES, THINKING_ARG, THINKING_BUDGET_ARG

__all__ = [
    "BUS_DIR_ENV",
    "CLASS_ARG",
    "CONFIG_KEY",
    "LOGITS_PROCESSOR",
    "MIDDLEWARE",
    "METRIC_NAMES",
    "POLICY_NAMES",
    "PROBE_FOR_ARG",
    "PROBE_ID_INFIX",
    "REPORT_FIELDS",
    "REQUEST_ARGS",
    "REQ_ID_ARG",
    "RESOLVED_CLASS_ARG",
    "SCHEDULER_CLS",
    "THINKING_ARG",
    "THINKING_BUDGET_ARG",
    "THINKING_STOP_FIELDS",
    "XARGS_FIELD",
]

#: Key of Meridian's block in ``--additional-config``.
CONFIG_KEY = "meridian"
#: ``--scheduler-cls`` value.
SCHEDULER_CLS = "meridian.vllm.MeridianScheduler"
#: ``--logits-processors`` value.
LOGITS_PROCESSOR = "meridian.vllm.thinking:MeridianThinkingProcessor"
#: ``--middleware`` value: the request arguments checked in vLLM's API server (HTTP 400), shed
#: requests answered with HTTP 503.
MIDDLEWARE = "meridian.vllm.frontend.MeridianFrontend"

#: Every request argument a client sends Meridian, as the core checks them.
REQUEST_ARGS = (CLASS_ARG, THINKING_ARG, THINKING_BUDGET_ARG)
#: Field of an OpenAI-API request body that carries the request arguments (vLLM's name; vLLM
#: hands them on as ``SamplingParams.extra_args``).
XARGS_FIELD = "vllm_xargs"

#: Stamped into ``extra_args`` by ``MeridianScheduler``: the request's id and the class the core
#: resolved for it (the logits processor sees sampling params, not requests).
REQ_ID_ARG = "meridian_req_id"
RESOLVED_CLASS_ARG = "meridian_resolved_class"
#: Set on an internal EAT probe: the ``req_id`` it measures.
PROBE_FOR_ARG = "meridian_probe_for"
#: Between a parent's ``req_id`` and the serial number in an EAT probe's ``req_id``.
PROBE_ID_INFIX = "-meridian-eat-probe-"

#: Environment variable naming the folder of the scheduler ↔ worker bus (default: temp dir).
BUS_DIR_ENV = "MERIDIAN_BUS_DIR"

#: Fields of a finished request's line in the request log (``request_log_path``), in order.
REPORT_FIELDS = (
    "req_id", "slo_class", "reason", "arrival_ms", "ttft_ms", "ttfat_ms", "transition_gap_ms", "think_tpot_ms",
    "answer_tpot_ms", "e2e_ms", "max_answer_gap_ms", "num_stalls", "num_think_tokens", "num_answer_tokens",
    "num_preemptions_prefill", "num_preemptions_think", "num_preemptions_answer", "met_all",
    "never_reusable_from_token",
)
#: Fields after them: the thinking-control rule that ended the reasoning, and after how many tokens.
THINKING_STOP_FIELDS = ("thinking_stopped_by", "thinking_stopped_after_tokens")

#: Meridian's series on vLLM's ``/metrics`` (as exposed: counters end in ``_total``), by key.
#: The dashboard, the tests and the router recipe read these names.
METRIC_NAMES = {
    "ttfat": "meridian:time_to_first_output_token_seconds",
    "answer_tpot": "meridian:answer_time_per_output_token_seconds",
    "thinking_tokens": "meridian:thinking_tokens",
    "requests_finished": "meridian:requests_finished_total",
    "preemptions": "meridian:preemptions_total",
    "answer_preemption_alarms": "meridian:answer_preemption_alarms_total",
    "arrival_preemptions": "meridian:arrival_preemptions_total",
    "shed_requests": "meridian:shed_requests_total",
    "thinking_stops": "meridian:thinking_stops_total",
    "kv_tier_resumes": "meridian:kv_tier_resumes_total",
    "kv_tier_resume_tokens": "meridian:kv_tier_resume_tokens_total",
    "kv_tier_failed_load_blocks": "meridian:kv_tier_failed_load_blocks_total",
    "num_requests": "meridian:num_requests",
    "least_slack": "meridian:least_slack_seconds",
    "ttfat_headroom": "meridian:ttfat_headroom_seconds",
    "recent_ttfat_attainment": "meridian:recent_ttfat_attainment",
    "phase_weighted_queue": "meridian:phase_weighted_queue",
    "expected_output_tokens": "meridian:expected_output_tokens",
    "saturation": "meridian:saturation",
    "step_time_model": "meridian:step_time_model_ms",
    "class_target": "meridian:class_target_seconds",
}
