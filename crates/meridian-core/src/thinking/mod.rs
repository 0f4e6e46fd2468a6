//! Thinking control: the per-request decision to end a request's reasoning early. Five opt-in
//! rules — a hard token budget, a load-aware budget that tightens while the request's class misses
//! its TTFAT target, EAT (entropy after the reasoning-end marker, arXiv 2509.26522), a cheap
//! proxy (probability and rank of the reasoning-end token in the ordinary next-token
//! distribution) and RPDI (bursts of high-entropy transition tokens, arXiv 2603.14251) — plus the
//! closing text forced before the marker. This module only decides *when*; the caller (the logits
//! processor) measures the signals and forces the text. The EAT and RPDI updates run here, on the
//! host, in f32 with a fixed operation order and no fused multiply-add ([`eat_update`],
//! [`rpdi_update`]), so a decision depends on the signals alone, never on the device that
//! measured them. Invariant: a [`ThinkingState`] fires at most once, never before the firing
//! rule's own minimum, and never panics; unusable inputs (NaN, ±inf, entropies outside
//! ±[`MAX_ENTROPY_NATS`], probabilities outside [0, 1]) are counted and skipped, so they never
//! enter — let alone poison — an EMA.
//!
//! The rooms: [`control`] holds the configuration of the rules (`thinking_control`, per class or
//! per request) and its validation; [`boundaries`] finds the line and sentence ends in the
//! reasoning text the rules count; [`signals`] the EAT and RPDI series and each rule's test of
//! them; [`state`] one request's decision, fed signals ([`ThinkingState`]); [`stream`] the same
//! request as the logits processor sees it, token by token, with the reasoning markers matched by
//! the phase tracker's matcher ([`crate::phase::SequenceMatcher`]) and the forced closing
//! sequence ([`ThinkingStream`]).

mod boundaries;
mod control;
mod signals;
mod state;
mod stream;

pub use boundaries::{Boundaries, Boundary, MAX_BOUNDARY_MARKER_CHARS};
pub use control::{
    ClosingPolicy, EatRule, LoadAwareBudget, ProxyRule, RpdiRule, ThinkingControl, MAX_CLOSING_TEXT_CHARS,
    THINKING_ARG, THINKING_BUDGET_ARG,
};
pub use signals::{eat_update, rpdi_update, EatSignal, RpdiSignal, MAX_ENTROPY_NATS};
pub use state::{FiredAt, IgnoredInputs, StopReason, ThinkingState};
pub use stream::{StreamPhase, ThinkingStream, TokenSignals};

#[cfg(test)]
mod tests;
