//! Bindings of the core's thinking control: the per-request control ([`PyThinkingControl`]) and
//! the token-by-token stream the logits processor feeds ([`PyThinkingStream`]). Conversion and
//! delegation only; every decision is `meridian_core::thinking::stream`'s.

use meridian_core as core;
use pyo3::prelude::*;

use crate::errors::{self, to_py};
use crate::PyConfig;

/// The thinking control in force for one request (validated).
#[pyclass(module = "meridian._core", name = "ThinkingControl", frozen)]
#[derive(Clone)]
pub(crate) struct PyThinkingControl {
    pub(crate) inner: core::ThinkingControl,
}

#[pymethods]
impl PyThinkingControl {
    /// The control for one request: `base` (default: every rule off), replaced by the request's
    /// `meridian_thinking` (`"off"` or a JSON object) and given the hard budget of
    /// `meridian_thinking_budget_tokens`. Raises `RequestArgsError` naming the argument.
    #[staticmethod]
    #[pyo3(signature = (base, thinking, budget_tokens))]
    fn for_request(
        base: Option<&Self>,
        thinking: Option<&str>,
        budget_tokens: Option<i64>,
    ) -> PyResult<Self> {
        let default = core::ThinkingControl::default();
        let base = base.map_or(&default, |b| &b.inner);
        let inner = core::ThinkingControl::for_request(base, thinking, budget_tokens).map_err(to_py)?;
        Ok(Self { inner })
    }

    /// Whether any rule is on.
    fn is_enabled(&self) -> bool {
        self.inner.is_enabled()
    }

    /// Whether per-token entropies are needed (RPDI).
    fn wants_token_entropy(&self) -> bool {
        self.inner.wants_token_entropy()
    }

    /// Whether the end token's probability and rank are needed (the proxy).
    fn wants_end_token_stats(&self) -> bool {
        self.inner.wants_end_token_stats()
    }

    /// Whether EAT probes are needed.
    fn wants_eat_probes(&self) -> bool {
        self.inner.wants_eat_probes()
    }

    /// The hard budget in force (the request's own, its class's or its `reasoning_effort`'s),
    /// if any.
    #[getter]
    fn budget_tokens(&self) -> Option<u32> {
        self.inner.budget_tokens
    }

    /// The thinking budget vLLM itself enforces for a request admitted now: the tightest of the
    /// hard budget, the load-aware budget at the class's TTFAT `attainment` (`None`: unknown) and
    /// the client's own `thinking_token_budget`; `None` when none applies.
    #[pyo3(signature = (attainment, client_tokens=None))]
    fn admission_budget(&self, attainment: Option<f64>, client_tokens: Option<u32>) -> Option<u32> {
        self.inner.admission_budget(attainment, client_tokens)
    }

    /// The closing text forced before the end marker, if any.
    #[getter]
    fn closing_text(&self) -> Option<String> {
        self.inner.closing.closing_text.clone()
    }
}

impl PyConfig {
    fn class_id(&self, slo_class: &str) -> PyResult<core::ClassId> {
        self.inner.class_by_name(slo_class).ok_or_else(|| {
            errors::invalid_argument(format!(
                "unknown class {slo_class:?}; classes: {}",
                self.inner.class_names()
            ))
        })
    }

    pub(crate) fn request_thinking_control_for(
        &self,
        slo_class: &str,
        args_json: &str,
        max_tokens: Option<u32>,
    ) -> PyResult<PyThinkingControl> {
        let class = self.class_id(slo_class)?;
        let inner =
            core::thinking_control_for_request(&self.inner, class, args_json, max_tokens).map_err(to_py)?;
        Ok(PyThinkingControl { inner })
    }

    pub(crate) fn class_thinking_control(&self, slo_class: &str) -> PyResult<PyThinkingControl> {
        Ok(PyThinkingControl { inner: self.inner.thinking_control_for(self.class_id(slo_class)?).clone() })
    }

    pub(crate) fn thinking_stream_wanted_for(
        &self,
        slo_class: &str,
        control: &PyThinkingControl,
    ) -> PyResult<bool> {
        Ok(self.inner.thinking_stream_wanted(self.class_id(slo_class)?, &control.inner))
    }
}

/// One request's thinking control, fed each sampled token in order.
#[pyclass(module = "meridian._core", name = "ThinkingStream")]
pub(crate) struct PyThinkingStream {
    inner: core::ThinkingStream,
}

#[pymethods]
impl PyThinkingStream {
    #[new]
    #[pyo3(signature = (control, prompt_token_ids, *, start_ids, end_ids, forced_ids))]
    fn new(
        control: &PyThinkingControl,
        prompt_token_ids: Vec<u32>,
        start_ids: Vec<u32>,
        end_ids: Vec<u32>,
        forced_ids: Vec<u32>,
    ) -> PyResult<Self> {
        let inner = core::ThinkingStream::new(
            control.inner.clone(),
            &prompt_token_ids,
            start_ids,
            end_ids,
            forced_ids,
        )
        .map_err(to_py)?;
        Ok(Self { inner })
    }

    /// The token the request must emit next, while forcing.
    fn forced_token(&self) -> Option<u32> {
        self.inner.forced_token()
    }

    /// Whether the next token's distribution must be measured.
    fn wants_signals(&self) -> bool {
        self.inner.wants_signals()
    }

    /// One sampled token; returns the name of the rule that fired on it, if any.
    #[pyo3(signature = (token_id, token_text, entropy_nats=None, end_prob=None, end_rank=None))]
    fn on_token(
        &mut self,
        token_id: u32,
        token_text: &str,
        entropy_nats: Option<f32>,
        end_prob: Option<f32>,
        end_rank: Option<u32>,
    ) -> Option<&'static str> {
        let signals = core::TokenSignals { entropy_nats, end_prob, end_rank };
        self.inner.on_token(token_id, token_text, signals).map(core::StopReason::as_str)
    }

    /// Whether an EAT probe is due; clears the flag.
    fn take_probe_due(&mut self) -> bool {
        self.inner.take_probe_due()
    }

    /// The result of an EAT probe; returns `"eat"` when it ends the reasoning.
    fn on_eat_probe(&mut self, eat_entropy_nats: f32) -> Option<&'static str> {
        self.inner.on_eat_probe(eat_entropy_nats).map(core::StopReason::as_str)
    }

    /// The scheduler ends the reasoning now (`on_overload: degrade`); returns `"overload"` when
    /// it does (the request was thinking and no rule had fired).
    fn end_for_overload(&mut self) -> Option<&'static str> {
        self.inner.end_for_overload().map(core::StopReason::as_str)
    }

    /// Sets the class's recent TTFAT attainment (load-aware budget).
    fn set_ttfat_attainment(&mut self, attainment: f64) {
        self.inner.set_ttfat_attainment(attainment);
    }

    /// `before_thinking`, `thinking`, `forcing` or `answering`.
    #[getter]
    fn phase(&self) -> &'static str {
        self.inner.phase().as_str()
    }

    /// The rule that ended the reasoning, if one did.
    #[getter]
    fn fired_reason(&self) -> Option<&'static str> {
        self.inner.state().fired().map(|f| f.reason.as_str())
    }

    /// Thinking tokens generated (frozen when a rule fires).
    #[getter]
    fn num_think_tokens(&self) -> u32 {
        self.inner.state().num_think_tokens()
    }

    /// Reasoning lines seen.
    #[getter]
    fn num_lines(&self) -> u32 {
        self.inner.state().num_lines()
    }

    /// EAT probes taken.
    #[getter]
    fn num_eat_probes(&self) -> u32 {
        self.inner.state().eat().count
    }

    /// Forced tokens emitted.
    #[getter]
    fn num_forced_tokens(&self) -> u32 {
        self.inner.num_forced_tokens()
    }

    /// Forced positions where another token came out.
    #[getter]
    fn num_mismatched_forced(&self) -> u32 {
        self.inner.num_mismatched_forced()
    }

    /// The control in force.
    #[getter]
    fn control(&self) -> PyThinkingControl {
        PyThinkingControl { inner: self.inner.control().clone() }
    }
}
