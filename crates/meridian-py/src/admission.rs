//! Bindings of the core's admission at arrival ([`core::ArrivalGate`]): the API server's gate,
//! fed with the engines' published snapshots as the JSON text the engine wrote. Converts and
//! delegates only.

use meridian_core as core;
use pyo3::prelude::*;

use crate::errors::to_py;
use crate::PyConfig;

/// A decision as Python gets it: `(class, predicted wait ms, refusal message, retry-after s)`.
type Decision = (String, Option<f64>, Option<String>, Option<u32>);

/// The API server's admission at arrival for one server configuration.
#[pyclass(module = "meridian._core", name = "ArrivalGate")]
pub(crate) struct PyArrivalGate {
    inner: core::ArrivalGate,
}

#[pymethods]
impl PyArrivalGate {
    #[new]
    fn new(config: &PyConfig) -> Self {
        Self { inner: core::ArrivalGate::new(config.inner.clone()) }
    }

    /// Replaces the engines' snapshots with these published texts; raises `InvalidArgumentError`
    /// naming the fault when one is not a snapshot (the previous ones stay).
    fn set_snapshots(&mut self, texts: Vec<String>) -> PyResult<()> {
        let snapshots = texts
            .iter()
            .map(|t| core::ArrivalSnapshot::from_json(t))
            .collect::<Result<Vec<_>, _>>()
            .map_err(to_py)?;
        self.inner.set_snapshots(snapshots);
        Ok(())
    }

    /// Decides a request arriving at `now_ms` (wall clock) whose client already waited
    /// `waited_ms` elsewhere: `(class, predicted wait ms or None, refusal message or None,
    /// retry-after seconds or None)`.
    #[pyo3(signature = (now_ms, slo_class, priority, waited_ms=0.0))]
    fn decide(
        &mut self,
        now_ms: f64,
        slo_class: Option<&str>,
        priority: i64,
        waited_ms: f64,
    ) -> PyResult<Decision> {
        let d = self.inner.decide(now_ms, slo_class, priority, waited_ms).map_err(to_py)?;
        let class = self.inner.class_name(d.class).to_owned();
        let (message, retry_after_s) = match d.refusal {
            Some(notice) => (Some(notice.message), Some(notice.retry_after_s)),
            None => (None, None),
        };
        Ok((class, d.predicted_wait_ms, message, retry_after_s))
    }

    /// Requests refused so far.
    #[getter]
    fn num_refused(&self) -> u64 {
        self.inner.num_refused()
    }

    /// The work ahead on the engines, in expected output tokens: the load reported to a router.
    #[getter]
    fn load_tokens(&self) -> u64 {
        self.inner.load_tokens()
    }
}
