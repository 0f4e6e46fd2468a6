//! SLO classes, their targets and what happens to their requests under overload
//! ([`OnOverload`]), and [`CLASS_ARG`], the request argument that names a class. A class is
//! identified by a dense [`ClassId`] (its index in [`crate::Config::classes`]); targets are
//! validated positive and finite at configuration time, so every deadline computed from them is a
//! finite number.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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

/// Latency targets of one class (docs/request-life.md §4 metric definitions).
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

/// What becomes of a request of the class once it can no longer meet its targets — its
/// probability of meeting them has fallen below `overload.min_success_probability` (key
/// `classes.<name>.on_overload`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnOverload {
    /// It waits behind every request that can still make its targets, for a bounded time
    /// (`late_wait_ttft_factor`), then goes ahead of new requests: every request is served.
    Queue,
    /// It is ended early with a clear error (HTTP 503 where the API allows it) as soon as it is
    /// judged unable to make its targets, so the client can retry elsewhere; an answering
    /// request is never shed. The default: in the run that adopted it, on the scenario corpus it
    /// met every target for 1.56× the requests FCFS did at FCFS's 50 % load, against 1.11× under
    /// `queue`, and won on every trace family held out (`bench/results/corpus_2026-12-03/`); with
    /// the later defaults (`value_density`, `shed_until: ttfat`), 1.62×.
    #[default]
    Shed,
    /// Its thinking is capped to what still fits before its TTFAT deadline (through thinking
    /// control); one that cannot make even its TTFT waits as under `queue`.
    Degrade,
}

/// How the policy orders waiting requests that are neither safely inside their targets nor
/// judged late, within a class rank (key `overload.waiting_order`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WaitingOrder {
    /// Least slack first (earliest effective deadline): the request closest to missing goes
    /// first.
    Slack,
    /// Value density first, in classes whose late requests are shed (the others keep `slack`):
    /// the probability of meeting its targets if admitted now per millisecond of engine time it
    /// is expected to hold a seat (prefill, then its expected thinking and answer at the
    /// predicted decode step), so the engine's time goes to the requests most likely to finish
    /// on time per unit of it. The default: on the scenario corpus at FCFS's 50 % load it met
    /// every target for 1.61× the requests FCFS did against 1.56× under `slack`, with fewer
    /// sheds and FCFS's throughput, and won on every trace family held out
    /// (`bench/results/corpus_2026-12-03-value-density/`). Not under `queue`: there every
    /// request is served anyway, and on the scripted KV-pressure scenario the cheap ones first
    /// met fewer targets (28 against 32 over three seeds) and let an answer be preempted once.
    #[default]
    ValueDensity,
    /// Value at risk first, in classes whose late requests are shed (the others keep `slack`):
    /// what a request loses by waiting for the next admission — its probability of meeting its
    /// targets if admitted now less that if admitted one start later (the time between two
    /// requests' first tokens, lately; a request that would miss its TTFT target by then loses
    /// all of it) — per millisecond of engine time, as `value_density` prices it. A fresh
    /// request loses little by waiting and lets one near its TTFT deadline go first; among
    /// requests that lose alike, the cheaper first; one that cannot make it either way, last.
    ValueAtRisk,
}

/// How long after its arrival a request of a `shed` class may still be shed (key
/// `overload.shed_until`): past it, a late request runs on as under `queue`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ShedUntil {
    /// While its client would still hear the shed by the class's TTFT target (the plan's lead
    /// to the client counted): a client learns its fate within the time it was promised a first
    /// token, early enough to retry elsewhere. A request that turns late after that — a
    /// thinking one whose reasoning runs long — is served to its end, holding its seat and KV:
    /// on the scenario corpus at FCFS's 50 % load it met every target for 1.55× the requests
    /// FCFS did against 1.62× (`bench/results/corpus_2026-12-03-shed-window/`).
    Ttft,
    /// Until it starts answering: a thinking request is ended whenever it turns late while the
    /// engine is contended, at the latest around its TTFAT deadline — long after its client was
    /// promised a first token, but its seat and KV go to requests that still make their targets.
    /// The default: it won on every trace family held out.
    #[default]
    Ttfat,
}

impl OnOverload {
    /// The name the configuration uses.
    pub const fn name(self) -> &'static str {
        match self {
            OnOverload::Queue => "queue",
            OnOverload::Shed => "shed",
            OnOverload::Degrade => "degrade",
        }
    }
}

/// A named class with its targets, its admission rank (0 is served first) and its triage.
#[derive(Debug, Clone, PartialEq)]
pub struct SloClass {
    /// Name operators and clients use (the request argument [`CLASS_ARG`]).
    pub name: String,
    /// Admission rank: lower ranks are admitted first; aging lowers a waiting request's rank.
    pub rank: u8,
    /// The targets.
    pub targets: SloTargets,
    /// What becomes of its requests when they can no longer meet the targets.
    pub on_overload: OnOverload,
}
