//! One request's thinking decision: fed the thinking tokens' signals and boundaries (and EAT
//! probe results), it says which rule fired and when. Invariant: a [`ThinkingState`] fires at
//! most once, never before the firing rule's own minimum, and never panics; unusable inputs are
//! counted in [`IgnoredInputs`] and skipped.

use super::boundaries::Boundary;
use super::control::ThinkingControl;
use super::signals::{eat_update, rpdi_update, usable_entropy, EatSignal, RpdiSignal};

/// Which rule ended the reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// The hard thinking budget.
    Budget,
    /// The load-aware budget (tightened or not).
    LoadAwareBudget,
    /// EAT variance converged.
    Eat,
    /// The reasoning-end token proxy.
    Proxy,
    /// RPDI deviation.
    Rpdi,
    /// Not a rule of the request's control: the scheduler ended the thinking so that the answer
    /// starts by the TTFAT deadline (its class's `on_overload: degrade`).
    Overload,
}

impl StopReason {
    /// Every rule, in declaration order.
    pub const ALL: [StopReason; 6] = [
        StopReason::Budget,
        StopReason::LoadAwareBudget,
        StopReason::Eat,
        StopReason::Proxy,
        StopReason::Rpdi,
        StopReason::Overload,
    ];

    /// Stable snake_case name, for logs and the request ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Budget => "budget",
            StopReason::LoadAwareBudget => "load_aware_budget",
            StopReason::Eat => "eat",
            StopReason::Proxy => "proxy",
            StopReason::Rpdi => "rpdi",
            StopReason::Overload => "overload",
        }
    }
}

/// The one firing of a request: which rule, after how many thinking tokens (the token that fired
/// included; for EAT, the tokens seen when the probe came in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FiredAt {
    /// The rule that fired.
    pub reason: StopReason,
    /// Thinking tokens generated when it fired.
    pub num_think_tokens: u32,
}

/// Inputs that were unusable and skipped (counted, never fed to an EMA or a rule).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IgnoredInputs {
    /// Per-token entropies that were NaN, infinite or beyond ±[`super::MAX_ENTROPY_NATS`].
    pub entropies: u32,
    /// EAT probe values, likewise.
    pub eat_probes: u32,
    /// End-token probabilities that were NaN or outside [0, 1].
    pub end_probs: u32,
}

/// Per-request thinking-control state. Feed it every thinking token ([`Self::on_think_token`])
/// and every EAT probe ([`Self::on_eat_probe`]) with the request's [`ThinkingControl`]; each call
/// returns the rule that fires on it, if any.
///
/// Firing is once: the call that fires returns `Some(reason)` and records [`FiredAt`]; every
/// later call returns `None` and changes nothing (the tokens forced afterwards are not
/// reasoning). When several rules qualify on the same token the precedence is `Budget`,
/// `LoadAwareBudget`, `Proxy`, `Rpdi` (guarantees before heuristics); EAT fires on probes only.
/// Unusable inputs are skipped and counted in [`IgnoredInputs`]; the token itself still counts.
///
/// ```
/// use meridian_core::{Boundary, Config, StopReason, ThinkingState};
///
/// let config = Config::from_json(r#"{"thinking_control": {"budget_tokens": 3}}"#).unwrap();
/// let control = &config.thinking_control;
/// let mut state = ThinkingState::new();
/// assert_eq!(state.on_think_token(control, Some(0.4), None, None, Boundary::None), None);
/// assert_eq!(state.on_think_token(control, Some(f32::NAN), None, None, Boundary::Sentence), None);
/// let fired = state.on_think_token(control, None, None, None, Boundary::Line);
/// assert_eq!(fired, Some(StopReason::Budget));
/// assert_eq!(state.fired().unwrap().num_think_tokens, 3);
/// assert_eq!(state.ignored().entropies, 1);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThinkingState {
    num_think_tokens: u32,
    num_lines: u32,
    ttfat_attainment: Option<f64>,
    eat: EatSignal,
    rpdi: RpdiSignal,
    ignored: IgnoredInputs,
    fired: Option<FiredAt>,
}

impl ThinkingState {
    /// A request that has not started thinking.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the recent TTFAT attainment fraction of the request's class (for the load-aware
    /// budget; the scheduler refreshes it once per step). Clamped to [0, 1]; a non-finite value
    /// means unknown (no tightening).
    pub fn set_ttfat_attainment(&mut self, attainment: f64) {
        self.ttfat_attainment = attainment.is_finite().then(|| attainment.clamp(0.0, 1.0));
    }

    /// One generated thinking token: its sampling distribution's entropy (`None` when not
    /// computed), the reasoning-end token's probability and rank there, and the boundary the
    /// token closes. Updates the counters and the RPDI signal, then checks the token rules.
    pub fn on_think_token(
        &mut self,
        control: &ThinkingControl,
        entropy_nats: Option<f32>,
        end_prob: Option<f32>,
        end_rank: Option<u32>,
        boundary: Boundary,
    ) -> Option<StopReason> {
        if self.fired.is_some() {
            return None;
        }
        self.num_think_tokens = self.num_think_tokens.saturating_add(1);
        if boundary == Boundary::Line {
            self.num_lines = self.num_lines.saturating_add(1);
        }
        match entropy_nats {
            Some(x) if !usable_entropy(x) => {
                self.ignored.entropies = self.ignored.entropies.saturating_add(1)
            }
            Some(x) => {
                if let Some(rule) = &control.rpdi {
                    rpdi_update(&mut self.rpdi, x, rule.high_entropy_nats, rule.alpha);
                }
            }
            None => {}
        }
        let end_prob = match end_prob {
            Some(p) if (0.0..=1.0).contains(&p) => Some(p),
            Some(_) => {
                self.ignored.end_probs = self.ignored.end_probs.saturating_add(1);
                None
            }
            None => None,
        };
        let reason = self.token_rule_that_fires(control, end_prob, end_rank, boundary);
        if let Some(reason) = reason {
            self.fire(reason);
        }
        reason
    }

    /// One EAT probe (the entropy after the appended end marker, taken at a line boundary).
    /// Ignored while EAT is off or after firing; an unusable value is counted and skipped.
    pub fn on_eat_probe(&mut self, control: &ThinkingControl, eat_entropy_nats: f32) -> Option<StopReason> {
        if self.fired.is_some() {
            return None;
        }
        let rule = control.eat.as_ref()?;
        if !usable_entropy(eat_entropy_nats) {
            self.ignored.eat_probes = self.ignored.eat_probes.saturating_add(1);
            return None;
        }
        eat_update(&mut self.eat, eat_entropy_nats, rule.alpha);
        if rule.converged(&self.eat) {
            self.fire(StopReason::Eat);
            return Some(StopReason::Eat);
        }
        None
    }

    fn token_rule_that_fires(
        &self,
        control: &ThinkingControl,
        end_prob: Option<f32>,
        end_rank: Option<u32>,
        boundary: Boundary,
    ) -> Option<StopReason> {
        let n = self.num_think_tokens;
        if control.budget_tokens.is_some_and(|budget| n >= budget) {
            return Some(StopReason::Budget);
        }
        if control.load_aware.is_some_and(|rule| n >= rule.effective_budget(self.ttfat_attainment)) {
            return Some(StopReason::LoadAwareBudget);
        }
        if control.proxy.is_some_and(|rule| rule.qualifies(n, end_prob, end_rank)) {
            return Some(StopReason::Proxy);
        }
        if boundary.ends_sentence() && control.rpdi.is_some_and(|rule| rule.deviates(&self.rpdi)) {
            return Some(StopReason::Rpdi);
        }
        None
    }

    /// The scheduler ends the thinking now ([`StopReason::Overload`]); `None` when a rule fired
    /// already.
    pub fn stop_for_overload(&mut self) -> Option<StopReason> {
        if self.fired.is_some() {
            return None;
        }
        self.fire(StopReason::Overload);
        Some(StopReason::Overload)
    }

    fn fire(&mut self, reason: StopReason) {
        self.fired = Some(FiredAt { reason, num_think_tokens: self.num_think_tokens });
    }

    /// The firing, once it happened.
    pub fn fired(&self) -> Option<FiredAt> {
        self.fired
    }

    /// Thinking tokens seen (frozen at the firing).
    pub fn num_think_tokens(&self) -> u32 {
        self.num_think_tokens
    }

    /// Reasoning lines seen (tokens that closed a [`Boundary::Line`]).
    pub fn num_lines(&self) -> u32 {
        self.num_lines
    }

    /// The class attainment last set, after clamping.
    pub fn ttfat_attainment(&self) -> Option<f64> {
        self.ttfat_attainment
    }

    /// The EAT signal.
    pub fn eat(&self) -> &EatSignal {
        &self.eat
    }

    /// The RPDI signal.
    pub fn rpdi(&self) -> &RpdiSignal {
        &self.rpdi
    }

    /// Inputs skipped as unusable.
    pub fn ignored(&self) -> IgnoredInputs {
        self.ignored
    }
}
