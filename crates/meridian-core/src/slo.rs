//! SLO classes and their targets, and [`CLASS_ARG`], the request argument that names a class. A
//! class is identified by a dense [`ClassId`] (its index in [`crate::Config::classes`]); targets
//! are validated positive and finite at configuration time, so every deadline computed from them
//! is a finite number.

/// Request argument (`vllm_xargs` / `SamplingParams.extra_args`) naming the request's SLO class;
/// without it the request's vLLM priority picks the class ([`crate::NewRequest::slo_class`]).
pub const CLASS_ARG: &str = "meridian_class";

/// Index of an SLO class in the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClassId(pub u8);

impl ClassId {
    /// The class's index into [`crate::Config::classes`].
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// Latency targets of one class (DESIGN §4 metric definitions).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SloTargets {
    /// Arrival → first generated token.
    pub ttft_ms: f64,
    /// Arrival → first answer token.
    pub ttfat_ms: f64,
    /// Mean inter-token time within the answer phase.
    pub answer_tpot_ms: f64,
    /// Arrival → last token, when the class has one.
    pub e2e_ms: Option<f64>,
}

/// A named class with its targets and its admission rank (0 is served first).
#[derive(Debug, Clone, PartialEq)]
pub struct SloClass {
    /// Name operators and clients use (the request argument [`CLASS_ARG`]).
    pub name: String,
    /// Admission rank: lower ranks are admitted first; aging lowers a waiting request's rank.
    pub rank: u8,
    /// The targets.
    pub targets: SloTargets,
}
