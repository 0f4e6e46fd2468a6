//! PyO3 bindings of `meridian-core` as the extension module `meridian._core`. This crate only
//! converts Python values into the core's plain inputs, delegates, and maps each core error
//! variant onto its Python exception class (`meridian.errors`); it holds no policy. The names the
//! core defines (request arguments, policy names) are exported as module constants, so Python
//! never spells them again.

use meridian_core as core;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

mod admission;
mod errors;
mod thinking;

use errors::to_py;

/// CUDA kernel sources embedded at build time (docs/request-life.md §1): the wheel carries them inside the
/// extension, so the loader never depends on package-data paths.
const KERNEL_SOURCES: &[(&str, &str)] = &[("logits_stats.cu", include_str!("../../../cuda/logits_stats.cu"))];

/// Returns the source of a bundled CUDA kernel file by name.
#[pyfunction]
fn kernel_source(name: &str) -> PyResult<&'static str> {
    KERNEL_SOURCES.iter().find(|(n, _)| *n == name).map(|(_, src)| *src).ok_or_else(|| {
        let known: Vec<&str> = KERNEL_SOURCES.iter().map(|(n, _)| *n).collect();
        errors::invalid_argument(format!("no bundled kernel named {name:?}; bundled: {known:?}"))
    })
}

/// Checks a request's Meridian arguments (`meridian_class`, `meridian_thinking`,
/// `meridian_thinking_budget_tokens`, `meridian_reasoning_effort`, `meridian_waited_ms`), given as
/// the JSON object of its request arguments, against `config` (the server's configuration;
/// `None`: the class is checked for its type only) and, for the effort's answer room, the
/// request's `max_tokens` and `priority`. Raises `RequestArgsError` naming the argument.
#[pyfunction]
#[pyo3(signature = (args_json, config, max_tokens=None, priority=0))]
fn check_request_args(
    args_json: &str,
    config: Option<&PyConfig>,
    max_tokens: Option<u32>,
    priority: i64,
) -> PyResult<()> {
    core::check_request_args(args_json, config.map(|c| &c.inner), max_tokens, priority).map_err(to_py)
}

/// The JSON Schema of the `meridian` block of `--additional-config`, as the core derives it from
/// the structs it parses (every accepted key, its type and its explanation).
#[pyfunction]
fn config_schema() -> String {
    core::Config::json_schema()
}

/// Validated Meridian configuration.
#[pyclass(module = "meridian._core", name = "Config", frozen)]
#[derive(Clone)]
pub(crate) struct PyConfig {
    pub(crate) inner: core::Config,
}

#[pymethods]
impl PyConfig {
    /// Parses and validates the JSON object given under `"meridian"` in `--additional-config`.
    #[staticmethod]
    fn from_json(text: &str) -> PyResult<Self> {
        core::Config::from_json(text).map(|inner| Self { inner }).map_err(to_py)
    }

    /// The configuration as the JSON block that parses back to it (every key given but those
    /// left unset); `Config.from_json("{}").to_json()` holds every default.
    fn to_json(&self) -> String {
        self.inner.to_json()
    }

    /// Class names in class-id order.
    #[getter]
    fn class_names(&self) -> Vec<String> {
        self.inner.classes.iter().map(|c| c.name.clone()).collect()
    }

    /// The default class's name.
    #[getter]
    fn default_class(&self) -> String {
        self.inner.classes[self.inner.default_class.index()].name.clone()
    }

    /// Strings whose tokens mark a tool call.
    #[getter]
    fn tool_call_markers(&self) -> Vec<String> {
        self.inner.tool_call_markers.clone()
    }

    /// The length samples (tokens) seeding the predictors: `(thinking, answer)`.
    #[getter]
    fn length_priors(&self) -> (Vec<u32>, Vec<u32>) {
        (self.inner.think_tokens_prior.clone(), self.inner.answer_tokens_prior.clone())
    }

    /// Where the shim appends one JSON line per finished request, if configured.
    #[getter]
    fn request_log_path(&self) -> Option<String> {
        self.inner.request_log_path.clone()
    }

    /// Whether the shim publishes Meridian's series on vLLM's `/metrics`.
    #[getter]
    fn metrics(&self) -> bool {
        self.inner.metrics
    }

    /// Where the shim appends one JSON line per engine step, if configured.
    #[getter]
    fn step_log_path(&self) -> Option<String> {
        self.inner.step_log_path.clone()
    }

    /// Whether to learn from a previous run's request log at start.
    #[getter]
    fn warm_start(&self) -> bool {
        self.inner.warm_start
    }

    /// The request log to learn from at start (`None`: `request_log_path`).
    #[getter]
    fn warm_start_path(&self) -> Option<String> {
        self.inner.warm_start_path.clone()
    }

    /// Whether the API server refuses requests at arrival.
    #[getter]
    fn admits_at_arrival(&self) -> bool {
        self.inner.admits_at_arrival()
    }

    /// The HTTP status a shed or a refusal at arrival is answered with (429 or 503).
    #[getter]
    fn shed_status(&self) -> u16 {
        self.inner.overload.shed_status
    }

    /// The scheduling policy (`meridian`, `answer_first`, `pascal`, `uniboost` or `scorpio`).
    #[getter]
    fn policy(&self) -> &'static str {
        self.inner.policy.name()
    }

    /// The tool-call marker ids, given per configured marker the single token id it is in the
    /// model's vocabulary (`None` when it is not one token). Raises `ConfigError` naming
    /// `tool_call_markers[i]` for a configured marker that is not one token; the default marker is
    /// dropped instead (the result is then shorter than `tool_call_markers`).
    fn resolve_tool_call_markers(&self, found: Vec<Option<u32>>) -> PyResult<Vec<u32>> {
        self.inner.resolve_tool_call_markers(&found).map_err(to_py)
    }

    /// The thinking control a class runs under (its own, else the top-level one).
    fn thinking_control(&self, slo_class: &str) -> PyResult<thinking::PyThinkingControl> {
        self.class_thinking_control(slo_class)
    }

    /// The thinking control of one request of `slo_class` from its request arguments (the JSON
    /// object of `meridian_thinking`, `meridian_thinking_budget_tokens`,
    /// `meridian_reasoning_effort`) under its `max_tokens`. Raises `RequestArgsError` naming the
    /// argument.
    #[pyo3(signature = (slo_class, args_json, max_tokens=None))]
    fn request_thinking_control(
        &self,
        slo_class: &str,
        args_json: &str,
        max_tokens: Option<u32>,
    ) -> PyResult<thinking::PyThinkingControl> {
        self.request_thinking_control_for(slo_class, args_json, max_tokens)
    }

    /// Whether a request of `slo_class` under `control` needs its thinking followed token by
    /// token: a rule is on, or the class degrades under overload.
    fn thinking_stream_wanted(
        &self,
        slo_class: &str,
        control: &thinking::PyThinkingControl,
    ) -> PyResult<bool> {
        self.thinking_stream_wanted_for(slo_class, control)
    }

    /// Targets of one class as a dict (`ttft_ms`, `ttfat_ms`, `answer_tpot_ms`, `e2e_ms`, `rank`).
    fn class_targets<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
        let id = self.inner.class_by_name(name).ok_or_else(|| {
            errors::invalid_argument(format!("unknown class {name:?}; classes: {}", self.inner.class_names()))
        })?;
        let class = &self.inner.classes[id.index()];
        let d = PyDict::new(py);
        d.set_item("ttft_ms", class.targets.ttft_ms)?;
        d.set_item("ttfat_ms", class.targets.ttfat_ms)?;
        d.set_item("answer_tpot_ms", class.targets.answer_tpot_ms)?;
        d.set_item("e2e_ms", class.targets.e2e_ms)?;
        d.set_item("rank", class.rank)?;
        d.set_item("on_overload", class.on_overload.name())?;
        Ok(d)
    }
}

/// One step's decisions.
#[pyclass(module = "meridian._core", name = "StepPlan", frozen, get_all)]
struct PyStepPlan {
    step_id: u64,
    running_order: Vec<u32>,
    waiting_order: Vec<u32>,
    num_admissible: u32,
    token_budget: u32,
    num_reserved_blocks: u32,
    held: Vec<u32>,
    preempt: Vec<u32>,
    prefetch: Vec<u32>,
    shed: Vec<PyShed>,
    end_thinking: Vec<u32>,
}

/// A request a plan ends early, and what its client is told.
#[pyclass(module = "meridian._core", name = "Shed", frozen, get_all)]
#[derive(Clone)]
struct PyShed {
    running: bool,
    index: u32,
    reason: &'static str,
    message: String,
    retry_after_s: u32,
}

/// A finished request's report.
#[pyclass(module = "meridian._core", name = "FinishedRequest", frozen, get_all)]
struct PyFinishedRequest {
    req_id: String,
    slo_class: String,
    reason: &'static str,
    arrival_ms: f64,
    ttft_ms: Option<f64>,
    ttfat_ms: Option<f64>,
    transition_gap_ms: Option<f64>,
    think_tpot_ms: Option<f64>,
    answer_tpot_ms: Option<f64>,
    e2e_ms: Option<f64>,
    max_answer_gap_ms: f64,
    num_stalls: u32,
    num_think_tokens: u32,
    num_answer_tokens: u32,
    num_preemptions_prefill: u32,
    num_preemptions_think: u32,
    num_preemptions_answer: u32,
    met_all: bool,
    never_reusable_from_token: Option<u32>,
    unknown_finish_reason: Option<String>,
    shed: Option<&'static str>,
    thinking_stopped_by: Option<&'static str>,
    thinking_stopped_after_tokens: Option<u32>,
    probe: bool,
    kv_handoff: &'static str,
}

/// The restore-or-recompute choice for one KV tier hit.
#[pyclass(module = "meridian._core", name = "RestorePlan", frozen, get_all)]
struct PyRestorePlan {
    num_restore_tokens: u32,
    num_offered_tokens: u32,
    cost_ms: f64,
    recompute_ms: f64,
}

/// The policy engine of one vLLM scheduler.
#[pyclass(module = "meridian._core", name = "Meridian")]
struct PyMeridian {
    inner: core::Meridian,
}

#[pymethods]
impl PyMeridian {
    #[new]
    #[pyo3(signature = (config, *, block_size, max_num_batched_tokens, max_num_seqs,
                        reasoning_start_ids, reasoning_end_ids, tool_call_ids, max_num_inflight_kv_loads=None))]
    // One argument per field of the core's `EngineLimits` and `ReasoningMarkers`.
    #[allow(clippy::too_many_arguments)]
    fn new(
        config: &PyConfig,
        block_size: u32,
        max_num_batched_tokens: u32,
        max_num_seqs: u32,
        reasoning_start_ids: Vec<u32>,
        reasoning_end_ids: Vec<u32>,
        tool_call_ids: Vec<Vec<u32>>,
        max_num_inflight_kv_loads: Option<u32>,
    ) -> PyResult<Self> {
        let limits = core::EngineLimits {
            max_num_inflight_kv_loads,
            ..core::EngineLimits::new(block_size, max_num_batched_tokens, max_num_seqs)
        };
        let markers = core::ReasoningMarkers::new(reasoning_start_ids, reasoning_end_ids, tool_call_ids);
        core::Meridian::new(config.inner.clone(), limits, markers).map(|inner| Self { inner }).map_err(to_py)
    }

    /// Number of live requests.
    #[getter]
    fn num_requests(&self) -> usize {
        self.inner.num_requests()
    }

    /// Starts tracking a request; returns its handle and the name of the SLO class it was given.
    #[pyo3(signature = (req_id, arrival_ms, prompt_token_ids, max_tokens, slo_class, priority, waited_ms=0.0))]
    // One argument per field of the core's `NewRequest`: Python's call names them.
    #[allow(clippy::too_many_arguments)]
    fn add_request(
        &mut self,
        req_id: &str,
        arrival_ms: f64,
        prompt_token_ids: Vec<u32>,
        max_tokens: u32,
        slo_class: Option<&str>,
        priority: i64,
        waited_ms: f64,
    ) -> PyResult<(u64, String)> {
        let req = core::NewRequest {
            req_id,
            arrival_ms,
            prompt_token_ids: &prompt_token_ids,
            max_tokens,
            slo_class,
            priority,
            waited_ms,
        };
        let (handle, class) = self.inner.add_request(req).map_err(to_py)?;
        Ok((handle.0, self.class_name(class)))
    }

    /// Starts tracking an internal EAT probe of `parent` (its class, one token, kept out of the
    /// counters); returns its handle.
    fn add_probe(
        &mut self,
        req_id: &str,
        arrival_ms: f64,
        prompt_token_ids: Vec<u32>,
        parent: u64,
    ) -> PyResult<u64> {
        self.inner
            .add_probe(req_id, arrival_ms, &prompt_token_ids, core::ReqHandle(parent))
            .map(|h| h.0)
            .map_err(to_py)
    }

    /// Whether a live request is an internal EAT probe.
    fn is_probe(&self, handle: u64) -> PyResult<bool> {
        self.inner.is_probe(core::ReqHandle(handle)).map_err(to_py)
    }

    /// How many internal EAT probes are live.
    fn num_live_probes(&self) -> usize {
        self.inner.num_live_probes()
    }

    /// The ids of the live requests whose thinking a plan ended, until they finish.
    fn thinking_endings(&self) -> Vec<&str> {
        self.inner.thinking_endings()
    }

    /// Decides one step from the handles of `running` and `waiting` in their current order; the
    /// last `num_async_waiting` of `waiting` are vLLM 0.34's async KV-load queue, with
    /// `num_inflight_kv_loads` loads holding blocks now.
    #[pyo3(signature = (now_ms, running, waiting, num_free_blocks, *, num_async_waiting=0, num_inflight_kv_loads=0))]
    fn plan_step(
        &mut self,
        now_ms: f64,
        running: Vec<u64>,
        waiting: Vec<u64>,
        num_free_blocks: u32,
        num_async_waiting: usize,
        num_inflight_kv_loads: u32,
    ) -> PyResult<PyStepPlan> {
        let running = handles(running);
        let waiting = handles(waiting);
        let loads =
            core::AsyncKvLoads { num_waiting: num_async_waiting, num_inflight: num_inflight_kv_loads };
        let plan = self
            .inner
            .plan_step_with_async_loads(now_ms, &running, &waiting, num_free_blocks, loads)
            .map_err(to_py)?;
        let mut shed = Vec::with_capacity(plan.shed.len());
        for s in &plan.shed {
            let handle = if s.running { running[s.index as usize] } else { waiting[s.index as usize] };
            let notice = self.inner.shed_notice(handle, s.reason).map_err(to_py)?;
            shed.push(PyShed {
                running: s.running,
                index: s.index,
                reason: s.reason.name(),
                message: notice.message,
                retry_after_s: notice.retry_after_s,
            });
        }
        Ok(PyStepPlan {
            step_id: plan.step_id,
            running_order: plan.running_order,
            waiting_order: plan.waiting_order,
            num_admissible: plan.num_admissible,
            token_budget: plan.token_budget,
            num_reserved_blocks: plan.num_reserved_blocks,
            held: plan.held,
            preempt: plan.preempt,
            prefetch: plan.prefetch,
            shed,
            end_thinking: plan.end_thinking,
        })
    }

    /// The load of `running` and `waiting` for the gauges: `({class: {figure: value}}, queue)`,
    /// every class present; `least_slack_ms` and `ttfat_headroom_ms` are `None` when no request
    /// of the class is before its answer; `queue` is the phase-weighted queue.
    fn engine_load<'py>(
        &mut self,
        py: Python<'py>,
        now_ms: f64,
        running: Vec<u64>,
        waiting: Vec<u64>,
    ) -> PyResult<(Bound<'py, PyDict>, f64)> {
        let load = self.inner.engine_load(now_ms, &handles(running), &handles(waiting)).map_err(to_py)?;
        let out = PyDict::new(py);
        for (class, c) in self.inner.config().classes.iter().zip(&load.classes) {
            let d = PyDict::new(py);
            d.set_item("num_waiting", c.num_waiting)?;
            d.set_item("num_prefilling", c.num_prefilling)?;
            d.set_item("num_thinking", c.num_thinking)?;
            d.set_item("num_answering", c.num_answering)?;
            d.set_item("least_slack_ms", c.least_slack_ms)?;
            d.set_item("ttfat_headroom_ms", c.ttfat_headroom_ms)?;
            d.set_item("expected_output_tokens", c.expected_output_tokens)?;
            d.set_item("saturation", c.saturation)?;
            out.set_item(&class.name, d)?;
        }
        Ok((out, load.phase_weighted_queue))
    }

    /// Learns one finished request of an earlier run (a request-log line's class, reason,
    /// whether it answered, thinking and answer tokens, hand-off part); returns whether it
    /// taught anything.
    #[pyo3(signature = (slo_class, reason, answered, num_think_tokens, num_answer_tokens, kv_handoff = "local"))]
    fn learn_from_history(
        &mut self,
        slo_class: &str,
        reason: &str,
        answered: bool,
        num_think_tokens: u32,
        num_answer_tokens: u32,
        kv_handoff: &str,
    ) -> PyResult<bool> {
        let handoff = kv_handoff_named(kv_handoff)?;
        self.inner
            .learn_from_history(slo_class, reason, answered, num_think_tokens, num_answer_tokens, handoff)
            .map_err(to_py)
    }

    /// The engine's queue as an arriving request would meet it, as the JSON text the API
    /// server's `ArrivalGate` reads (`now_ms`: wall clock, also the snapshot's time).
    fn arrival_snapshot(&mut self, now_ms: f64, running: Vec<u64>, waiting: Vec<u64>) -> PyResult<String> {
        let load = self.inner.engine_load(now_ms, &handles(running), &handles(waiting)).map_err(to_py)?;
        Ok(core::ArrivalSnapshot::of_load(self.inner.config(), &load, now_ms).to_json())
    }

    /// Records a preemption; returns `(phase, alarm)`.
    fn on_preempted(&mut self, now_ms: f64, handle: u64) -> PyResult<(&'static str, bool)> {
        let p = self.inner.on_preempted(now_ms, core::ReqHandle(handle)).map_err(to_py)?;
        Ok((phase_name(p.phase), p.alarm))
    }

    /// Feeds the tokens of one step's output for many requests: `counts[i]` tokens of
    /// `flat_token_ids` belong to `handles[i]`, in order.
    fn on_tokens_batch(
        &mut self,
        now_ms: f64,
        handles: Vec<u64>,
        counts: Vec<u32>,
        flat_token_ids: Vec<u32>,
    ) -> PyResult<()> {
        if handles.len() != counts.len() {
            return Err(errors::invalid_argument(format!(
                "handles ({}) and counts ({}) differ in length",
                handles.len(),
                counts.len()
            )));
        }
        let total: u64 = counts.iter().map(|&c| u64::from(c)).sum();
        if total != flat_token_ids.len() as u64 {
            return Err(errors::invalid_argument(format!(
                "counts add up to {total} tokens but flat_token_ids holds {}",
                flat_token_ids.len()
            )));
        }
        let mut offset = 0usize;
        for (&h, &n) in handles.iter().zip(&counts) {
            let end = offset + n as usize;
            self.inner.on_tokens(now_ms, core::ReqHandle(h), &flat_token_ids[offset..end]).map_err(to_py)?;
            offset = end;
        }
        Ok(())
    }

    /// Records a step's output arrival and folds its duration, with the step's shape (prompt
    /// tokens computed, requests decoding, KV context tokens read), into the step-time model;
    /// returns the measured duration when it was folded in, else `None`.
    fn on_step_output(
        &mut self,
        now_ms: f64,
        step_id: u64,
        num_prefill_tokens: u32,
        num_decode_requests: u32,
        num_context_tokens: u64,
    ) -> PyResult<Option<f64>> {
        let shape = core::StepShape { num_prefill_tokens, num_decode_requests, num_context_tokens };
        self.inner.on_step_output(now_ms, step_id, shape).map_err(to_py)
    }

    /// Stops tracking a request. `finish_reason` is `str()` of vLLM's `FinishReason` (`stop`,
    /// `length`, `abort`, `error`; anything else finishes it as `error` and is reported in
    /// `unknown_finish_reason`); `output_token_ids` is its full output list, whose tail beyond
    /// the tokens already fed is fed first.
    fn finish(
        &mut self,
        now_ms: f64,
        handle: u64,
        finish_reason: &str,
        output_token_ids: Vec<u32>,
    ) -> PyResult<PyFinishedRequest> {
        let done = self
            .inner
            .finish(now_ms, core::ReqHandle(handle), finish_reason, &output_token_ids)
            .map_err(to_py)?;
        let m = &done.metrics;
        let p = done.ledger.num_preemptions;
        Ok(PyFinishedRequest {
            slo_class: self.class_name(done.class),
            reason: done.reason.name(),
            arrival_ms: done.ledger.arrival_ms,
            ttft_ms: m.ttft_ms,
            ttfat_ms: m.ttfat_ms,
            transition_gap_ms: m.transition_gap_ms,
            think_tpot_ms: m.think_tpot_ms,
            answer_tpot_ms: m.answer_tpot_ms,
            e2e_ms: m.e2e_ms,
            max_answer_gap_ms: m.max_answer_gap_ms,
            num_stalls: m.num_stalls,
            num_think_tokens: done.ledger.num_think_tokens,
            num_answer_tokens: done.ledger.num_answer_tokens,
            num_preemptions_prefill: p.prefill,
            num_preemptions_think: p.think,
            num_preemptions_answer: p.answer,
            met_all: done.attainment.all(),
            never_reusable_from_token: done.never_reusable_from_token,
            unknown_finish_reason: done.unknown_finish_reason,
            shed: done.shed.map(|r| r.name()),
            thinking_stopped_by: done.thinking_stop.map(|s| s.reason.as_str()),
            thinking_stopped_after_tokens: done.thinking_stop.map(|s| s.num_think_tokens),
            probe: done.probe,
            kv_handoff: done.kv_handoff.name(),
            req_id: done.req_id,
        })
    }

    /// Phase of a live request: `prefill`, `think`, `answer` or `done`.
    fn phase(&self, handle: u64) -> PyResult<&'static str> {
        self.inner.phase(core::ReqHandle(handle)).map(phase_name).map_err(to_py)
    }

    /// Output tokens the core has observed for a live request.
    fn num_output_tokens(&self, handle: u64) -> PyResult<u32> {
        self.inner.num_output_tokens(core::ReqHandle(handle)).map_err(to_py)
    }

    /// Handle of a live request by vLLM id, if tracked.
    fn handle_of(&self, req_id: &str) -> Option<u64> {
        self.inner.handle_of(req_id).map(|h| h.0)
    }

    /// Engine-wide counters as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("num_steps", s.num_steps)?;
        d.set_item("num_added", s.num_added)?;
        d.set_item("num_finished", s.num_finished)?;
        set_preemptions(&d, &s.num_preemptions)?;
        d.set_item("num_answer_preemption_alarms", s.num_answer_preemption_alarms)?;
        d.set_item("num_reasoning_evictions", s.num_reasoning_evictions)?;
        d.set_item("num_step_samples", s.num_step_samples)?;
        d.set_item("num_probes", s.num_probes)?;
        d.set_item("num_probe_prompt_tokens", s.num_probe_prompt_tokens)?;
        d.set_item("num_arrival_preemptions", s.num_arrival_preemptions)?;
        d.set_item("num_unknown_finish_reasons", s.num_unknown_finish_reasons)?;
        d.set_item("num_shed", s.num_shed)?;
        d.set_item("num_degraded", s.num_degraded)?;
        Ok(d)
    }

    /// Thinking ended by each rule since start (reported by the logits processor, or the budget
    /// vLLM enforced), by the rule's name.
    fn num_thinking_stops<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stops = PyDict::new(py);
        for (rule, count) in core::StopReason::ALL.iter().zip(self.inner.stats().num_thinking_stops) {
            stops.set_item(rule.as_str(), count)?;
        }
        Ok(stops)
    }

    /// What the core holds now: `{num_live_requests, num_slots, num_pending_steps,
    /// num_indexed_blocks, heap_bytes}`.
    fn footprint<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let f = self.inner.footprint();
        let d = PyDict::new(py);
        d.set_item("num_live_requests", f.num_live_requests)?;
        d.set_item("num_slots", f.num_slots)?;
        d.set_item("num_pending_steps", f.num_pending_steps)?;
        d.set_item("num_indexed_blocks", f.num_indexed_blocks)?;
        d.set_item("heap_bytes", f.heap_bytes)?;
        Ok(d)
    }

    /// Per-class attainment counters: `{class: {counter: value}}`.
    fn class_counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for (class, c) in self.inner.config().classes.iter().zip(self.inner.class_counters()) {
            let d = PyDict::new(py);
            d.set_item("num_completed", c.num_completed)?;
            d.set_item("num_aborted", c.num_aborted)?;
            d.set_item("num_met_ttft", c.num_met_ttft)?;
            d.set_item("num_met_ttfat", c.num_met_ttfat)?;
            d.set_item("num_met_answer_tpot", c.num_met_answer_tpot)?;
            d.set_item("num_met_e2e", c.num_met_e2e)?;
            d.set_item("num_met_all", c.num_met_all)?;
            d.set_item("num_stalls", c.num_stalls)?;
            set_preemptions(&d, &c.num_preemptions)?;
            d.set_item("num_arrival_preemptions", c.num_arrival_preemptions)?;
            for reason in core::ShedReason::ALL {
                d.set_item(format!("num_shed_{}", reason.name()), c.num_shed[reason as usize])?;
            }
            d.set_item("num_degraded", c.num_degraded)?;
            out.set_item(&class.name, d)?;
        }
        Ok(out)
    }

    /// TTFAT attainment of each class's recent completions (`{class: fraction}`; classes that
    /// have completed nothing yet are absent).
    fn recent_ttfat_attainment<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for (class, recent) in self.inner.config().classes.iter().zip(self.inner.recent_ttfat_attainment()) {
            if let Some(value) = recent {
                out.set_item(&class.name, value)?;
            }
        }
        Ok(out)
    }

    /// Registers a KV tier by the connector's name for it; returns its id (the same for the
    /// same name). `staged`: slower tiers sit behind it, so the plans prefetch.
    #[pyo3(signature = (name, staged = false))]
    fn add_kv_tier(&mut self, name: &str, staged: bool) -> PyResult<u8> {
        self.inner.add_kv_tier(name, staged).map(|t| t.0).map_err(to_py)
    }

    /// Folds a finished load (`num_tokens` tokens from `tier` in `duration_ms`) into the
    /// tier's load cost.
    fn on_kv_load(&mut self, tier: u8, num_tokens: u64, duration_ms: f64) -> PyResult<()> {
        self.inner.on_kv_load(core::TierId(tier), num_tokens, duration_ms).map_err(to_py)
    }

    /// How much of a tier hit to load: `tiers[i]` holds the next `num_tokens[i]` tokens of the
    /// request's prefix, in order.
    fn plan_restore(&mut self, handle: u64, tiers: Vec<u8>, num_tokens: Vec<u32>) -> PyResult<PyRestorePlan> {
        if tiers.len() != num_tokens.len() {
            return Err(errors::invalid_argument(format!(
                "tiers ({}) and num_tokens ({}) differ in length",
                tiers.len(),
                num_tokens.len()
            )));
        }
        let spans: Vec<core::TierSpan> = tiers
            .into_iter()
            .zip(num_tokens)
            .map(|(tier, num_tokens)| core::TierSpan { tier: core::TierId(tier), num_tokens })
            .collect();
        let plan = self.inner.plan_restore(core::ReqHandle(handle), &spans).map_err(to_py)?;
        Ok(PyRestorePlan {
            num_restore_tokens: plan.num_restore_tokens,
            num_offered_tokens: plan.num_offered_tokens,
            cost_ms: plan.cost_ms,
            recompute_ms: plan.recompute_ms,
        })
    }

    /// The thinking budget vLLM itself should enforce for a request just added, under its thinking
    /// `control` and the client's own `thinking_token_budget` (`None`: none applies).
    #[pyo3(signature = (handle, control, client_tokens=None))]
    fn vllm_thinking_budget(
        &mut self,
        handle: u64,
        control: &thinking::PyThinkingControl,
        client_tokens: Option<u32>,
    ) -> PyResult<Option<u32>> {
        self.inner.vllm_thinking_budget(core::ReqHandle(handle), &control.inner, client_tokens).map_err(to_py)
    }

    /// The logits processor reports that `rule` (a name of `THINKING_STOP_RULES`) ended the
    /// request's thinking after `num_think_tokens`; the first report stands.
    fn on_thinking_stopped(&mut self, handle: u64, rule: &str, num_think_tokens: u32) -> PyResult<()> {
        let reason = core::StopReason::ALL.into_iter().find(|r| r.as_str() == rule).ok_or_else(|| {
            errors::invalid_argument(format!(
                "unknown thinking-stop rule {rule:?}; rules: {:?}",
                core::StopReason::ALL.map(core::StopReason::as_str)
            ))
        })?;
        self.inner.on_thinking_stopped(core::ReqHandle(handle), reason, num_think_tokens).map_err(to_py)
    }

    /// vLLM allocated the request with `num_loaded_tokens` from a tier: counts the last offer.
    fn on_kv_allocated(&mut self, handle: u64, num_loaded_tokens: u32) -> PyResult<()> {
        self.inner.on_kv_allocated(core::ReqHandle(handle), num_loaded_tokens).map_err(to_py)
    }

    /// A tier holds the first `num_tokens[i]` tokens of request `handles[i]`'s KV (its stored
    /// prefix; 0 forgets it).
    fn on_kv_stored_batch(&mut self, tier: u8, handles: Vec<u64>, num_tokens: Vec<u32>) -> PyResult<()> {
        if handles.len() != num_tokens.len() {
            return Err(errors::invalid_argument(format!(
                "handles ({}) and num_tokens ({}) differ in length",
                handles.len(),
                num_tokens.len()
            )));
        }
        for (handle, n) in handles.into_iter().zip(num_tokens) {
            self.inner.on_kv_stored(core::ReqHandle(handle), core::TierId(tier), n).map_err(to_py)?;
        }
        Ok(())
    }

    /// The block hashes of a request's prompt: `block_hashes` holds them back to back,
    /// `hash_size` bytes each (vLLM's `request.block_hashes` joined).
    fn set_block_hashes(&mut self, handle: u64, block_hashes: &[u8], hash_size: usize) -> PyResult<()> {
        let hashes = hashes_from_bytes(block_hashes, hash_size)?;
        self.inner.set_block_hashes(core::ReqHandle(handle), hashes).map_err(to_py)
    }

    /// Whether a KV tier keeps the blocks a live request stored until it finishes (per policy).
    fn retains_live_tier_blocks(&self) -> bool {
        self.inner.retains_live_tier_blocks()
    }

    /// Whether prefix-aware admission wants the device cache's and the tiers' block events.
    fn wants_block_events(&self) -> bool {
        self.inner.wants_block_events()
    }

    /// Block events of one medium (`tier` None: the device cache), in order: `ops[i]` is 1 for a
    /// store, 0 for a removal (each takes the next `hash_size` bytes of `block_hashes`) or 2 for
    /// "everything cleared" (takes none).
    fn on_block_events(
        &mut self,
        tier: Option<u8>,
        ops: &[u8],
        block_hashes: &[u8],
        hash_size: usize,
    ) -> PyResult<()> {
        let hashes = hashes_from_bytes(block_hashes, hash_size)?;
        let medium = tier.map_or(core::Medium::Device, |t| core::Medium::Tier(core::TierId(t)));
        let mut next = hashes.iter();
        for (i, &op) in ops.iter().enumerate() {
            match op {
                2 => self.inner.on_blocks_cleared(medium).map_err(to_py)?,
                0 | 1 => {
                    let Some(&hash) = next.next() else {
                        return Err(errors::invalid_argument(format!(
                            "ops[{i}] needs a block hash but only {} were given",
                            hashes.len()
                        )));
                    };
                    let apply = if op == 1 {
                        core::Meridian::on_blocks_stored
                    } else {
                        core::Meridian::on_blocks_removed
                    };
                    apply(&mut self.inner, medium, &[hash]).map_err(to_py)?;
                }
                other => {
                    return Err(errors::invalid_argument(format!(
                        "ops[{i}] is {other}; expected 0 (removed), 1 (stored) or 2 (cleared)"
                    )))
                }
            }
        }
        Ok(())
    }

    /// `(device blocks, tier blocks, tier)` of a live request's prompt the index finds cached.
    fn cached_prefix(&self, handle: u64) -> PyResult<(u32, u32, u8)> {
        let c = self.inner.cached_prefix(core::ReqHandle(handle)).map_err(to_py)?;
        Ok((c.num_device_blocks, c.num_tier_blocks, c.tier.0))
    }

    /// A worker that can end a request's thinking is attached (or not): plans end the thinking
    /// of `degrade` classes' requests in time only with one.
    fn set_thinking_worker(&mut self, attached: bool) {
        self.inner.set_thinking_worker(attached);
    }

    /// These requests' prefixes are as ready as the tiers can make them: no more prefetch.
    fn on_prefetched(&mut self, handles: Vec<u64>) -> PyResult<()> {
        for handle in handles {
            self.inner.on_prefetched(core::ReqHandle(handle)).map_err(to_py)?;
        }
        Ok(())
    }

    /// Tokens of the request's KV a tier holds, as far as the core knows.
    fn num_stored_tokens(&self, handle: u64) -> PyResult<u32> {
        self.inner.num_stored_tokens(core::ReqHandle(handle)).map_err(to_py)
    }

    /// Loads of `num_blocks` of the request's KV blocks failed; it recomputes from now on.
    fn on_kv_load_failure(&mut self, handle: u64, num_blocks: u64) -> PyResult<()> {
        self.inner.on_kv_load_failure(core::ReqHandle(handle), num_blocks).map_err(to_py)
    }

    /// Sets a request's part in a prefill/decode hand-off (`KV_HANDOFFS`: "local", "sends",
    /// "receives").
    fn set_kv_handoff(&mut self, handle: u64, handoff: &str) -> PyResult<()> {
        let part = kv_handoff_named(handoff)?;
        self.inner.set_kv_handoff(core::ReqHandle(handle), part).map_err(to_py)
    }

    /// vLLM gave a receiving request the blocks its KV arrives into.
    fn on_remote_kv_started(&mut self, now_ms: f64, handle: u64) -> PyResult<()> {
        self.inner.on_remote_kv_started(now_ms, core::ReqHandle(handle)).map_err(to_py)
    }

    /// A receiving request's KV arrived.
    fn on_remote_kv_received(&mut self, now_ms: f64, handle: u64) -> PyResult<()> {
        self.inner.on_remote_kv_received(now_ms, core::ReqHandle(handle)).map_err(to_py)
    }

    /// Milliseconds per prompt token a KV arrival takes here, once one was measured.
    fn kv_arrival_ms_per_token(&self) -> Option<f64> {
        self.inner.kv_arrival_ms_per_token()
    }

    /// Hand-off counts as a dict.
    fn handoff_counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.inner.handoff_counters();
        let d = PyDict::new(py);
        d.set_item("num_sent", c.num_sent)?;
        d.set_item("num_received", c.num_received)?;
        d.set_item("num_received_tokens", c.num_received_tokens)?;
        d.set_item("num_failed", c.num_failed)?;
        Ok(d)
    }

    /// A tier's current fitted load cost in ms per token.
    fn kv_load_ms_per_token(&self, tier: u8) -> PyResult<f64> {
        self.inner.kv_load_ms_per_token(core::TierId(tier)).map_err(to_py)
    }

    /// Restore and recompute counters of the KV tiers as a dict.
    fn kv_tier_counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.inner.kv_tier_counters();
        let d = PyDict::new(py);
        d.set_item("num_restores", c.num_restores)?;
        d.set_item("num_restored_tokens", c.num_restored_tokens)?;
        d.set_item("num_recomputes", c.num_recomputes)?;
        d.set_item("num_recomputed_tokens", c.num_recomputed_tokens)?;
        d.set_item("num_failed_load_blocks", c.num_failed_load_blocks)?;
        Ok(d)
    }

    /// What the step-time model predicts now for a step of this shape (ms).
    fn predict_step_ms(
        &self,
        num_prefill_tokens: u32,
        num_decode_requests: u32,
        num_context_tokens: u64,
    ) -> f64 {
        self.inner.predict_step_ms(core::StepShape {
            num_prefill_tokens,
            num_decode_requests,
            num_context_tokens,
        })
    }

    /// The decode step the last plan judged every deadline with (ms).
    fn planned_decode_step_ms(&self) -> f64 {
        self.inner.planned_decode_step_ms()
    }

    /// Current step-time coefficients
    /// `(base_ms, per_prefill_token_ms, per_decode_request_ms, per_context_token_ms)`.
    fn step_time_coefficients(&self) -> (f64, f64, f64, f64) {
        let c = self.inner.step_time_coefficients();
        (c.base_ms, c.per_prefill_token_ms, c.per_decode_request_ms, c.per_context_token_ms)
    }
}

impl PyMeridian {
    fn class_name(&self, class: core::ClassId) -> String {
        self.inner.config().classes[class.index()].name.clone()
    }
}

fn set_preemptions(d: &Bound<'_, PyDict>, p: &core::PhaseCountsU64) -> PyResult<()> {
    d.set_item("num_preemptions_prefill", p.prefill)?;
    d.set_item("num_preemptions_think", p.think)?;
    d.set_item("num_preemptions_answer", p.answer)
}

/// Block hashes sent back to back, `hash_size` bytes each, as 64-bit keys: the last 8 bytes of
/// each, big-endian (vLLM's own reduction of a block hash to an integer).
fn hashes_from_bytes(bytes: &[u8], hash_size: usize) -> PyResult<Vec<u64>> {
    if hash_size == 0 || bytes.len() % hash_size != 0 {
        return Err(errors::invalid_argument(format!(
            "block_hashes holds {} bytes, not a whole number of {hash_size}-byte hashes",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(hash_size)
        .map(|h| h.iter().rev().take(8).rev().fold(0u64, |key, &b| key << 8 | u64::from(b)))
        .collect())
}

/// The hand-off part named `name`, or an error naming the bad value and the known ones.
fn kv_handoff_named(name: &str) -> PyResult<core::KvHandoff> {
    core::KvHandoff::from_name(name).ok_or_else(|| {
        errors::invalid_argument(format!(
            "invalid `kv_handoff` {name:?}: expected one of {:?}",
            core::KvHandoff::ALL.map(core::KvHandoff::name)
        ))
    })
}

fn handles(raw: Vec<u64>) -> Vec<core::ReqHandle> {
    raw.into_iter().map(core::ReqHandle).collect()
}

fn phase_name(phase: core::Phase) -> &'static str {
    match phase {
        core::Phase::Prefill => "prefill",
        core::Phase::Think => "think",
        core::Phase::Answer => "answer",
        core::Phase::Done => "done",
    }
}

/// The extension module.
/// The reason and the retry-after seconds of a shed request's message (its stop reason), or
/// `None` when the text is not one.
#[pyfunction]
fn parse_shed_notice(text: &str) -> Option<(&'static str, u32)> {
    core::parse_shed_notice(text).map(|(reason, retry_after_s)| (reason.name(), retry_after_s))
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("CLASS_ARG", core::CLASS_ARG)?;
    m.add("THINKING_ARG", core::THINKING_ARG)?;
    m.add("THINKING_BUDGET_ARG", core::THINKING_BUDGET_ARG)?;
    m.add("WAITED_ARG", core::WAITED_ARG)?;
    m.add("EFFORT_ARG", core::EFFORT_ARG)?;
    m.add(
        "EFFORT_LEVELS",
        PyTuple::new(m.py(), core::ReasoningEffort::ALL.map(core::ReasoningEffort::as_str))?,
    )?;
    m.add("POLICY_NAMES", PyTuple::new(m.py(), core::Policy::ALL.map(core::Policy::name))?)?;
    m.add("THINKING_STOP_RULES", PyTuple::new(m.py(), core::StopReason::ALL.map(core::StopReason::as_str))?)?;
    m.add("SHED_MARKER", core::SHED_MARKER)?;
    m.add("KV_HANDOFFS", PyTuple::new(m.py(), core::KvHandoff::ALL.map(core::KvHandoff::name))?)?;
    m.add_function(wrap_pyfunction!(parse_shed_notice, m)?)?;
    m.add("SHED_REASONS", PyTuple::new(m.py(), core::ShedReason::ALL.map(core::ShedReason::name))?)?;
    m.add_class::<PyConfig>()?;
    m.add_class::<admission::PyArrivalGate>()?;
    m.add("ARRIVAL_SNAPSHOT_FORMAT", core::ARRIVAL_SNAPSHOT_FORMAT)?;
    m.add_class::<PyMeridian>()?;
    m.add_class::<PyStepPlan>()?;
    m.add_class::<PyShed>()?;
    m.add_class::<PyFinishedRequest>()?;
    m.add_class::<PyRestorePlan>()?;
    m.add_class::<thinking::PyThinkingControl>()?;
    m.add_class::<thinking::PyThinkingStream>()?;
    m.add_function(wrap_pyfunction!(kernel_source, m)?)?;
    m.add_function(wrap_pyfunction!(check_request_args, m)?)?;
    m.add_function(wrap_pyfunction!(config_schema, m)?)?;
    Ok(())
}
