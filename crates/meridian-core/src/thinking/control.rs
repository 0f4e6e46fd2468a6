//! The thinking-control configuration: which rules are on for a class or a request, their
//! parameters, each rule's test of its signals, and the closing text, validated with errors that name the dotted key (or, for a
//! request's own control, the request argument). Invariant: a [`ThinkingControl`] that passed
//! `validate` has every parameter in range, so the rules never meet a value they cannot use.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::boundaries::Boundaries;
use super::signals::{EatSignal, RpdiSignal, MAX_ENTROPY_NATS};
use crate::error::{Error, Result};
use crate::reasoning_effort::{EffortBudgets, ReasoningEffort};

/// Longest accepted closing text, in characters (it is forced token by token, so it should be a
/// sentence, not a paragraph).
pub const MAX_CLOSING_TEXT_CHARS: usize = 512;

/// Thinking control for one class (or the whole deployment): which rules are on and the closing
/// text. Every rule is off unless its key is present (`"eat": {}` turns EAT on with the defaults);
/// several may be on, and the first to fire ends the reasoning. Parsed from the `thinking_control`
/// key of the configuration (top level, or `classes.<name>.thinking_control`, which replaces the
/// top-level object for that class).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ThinkingControl {
    /// Hard thinking budget: the reasoning is ended once this many thinking tokens have been
    /// generated (fires on exactly that token). Off when absent; at least 1. The same idea as
    /// vLLM's per-request `thinking_token_budget`.
    pub budget_tokens: Option<u32>,
    /// Budget that tightens while the request's class misses its TTFAT target. Off when absent.
    pub load_aware: Option<LoadAwareBudget>,
    /// EAT stop rule (probes at reasoning-line boundaries). Off when absent. Needs an extra
    /// forward pass per probe (the reasoning so far plus the appended end marker).
    pub eat: Option<EatRule>,
    /// Reasoning-end-token proxy (probability/rank of the end token). Off when absent.
    pub proxy: Option<ProxyRule>,
    /// RPDI deviation rule (local vs global rate of high-entropy tokens). Off when absent.
    pub rpdi: Option<RpdiRule>,
    /// What is forced when a rule fires.
    pub closing: ClosingPolicy,
    /// What text ends a reasoning line (the EAT probe point) and a sentence (the RPDI check).
    pub boundaries: Boundaries,
    /// Thinking budgets per `reasoning_effort` level (`low`, `medium`, `high`), for requests that
    /// send one (the OpenAI API's `reasoning_effort`, or the request argument
    /// `meridian_reasoning_effort`): the level's budget becomes the request's hard budget, cut to
    /// leave `answer_room_tokens` of its `max_tokens` to the answer. Always in force; a request
    /// without an effort is not affected.
    pub reasoning_effort: EffortBudgets,
}

/// A thinking budget that is `budget_tokens` while the class meets its TTFAT target and shrinks
/// linearly toward `min_budget_tokens` as the class's recent TTFAT attainment falls below
/// `attainment_floor`: `min + ⌊(budget − min) · attainment / floor⌋`. Defaults are ours, read off
/// the ServeGen DeepSeek-R1 thinking lengths that seed the predictor.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LoadAwareBudget {
    /// Budget while the class meets its target (default 4096: ≈ p95 of production R1 thinking
    /// lengths — the log-midpoint of p90 = 2,327 and p99 = 9,301 — so a healthy class loses only
    /// its longest tail). At least `min_budget_tokens`.
    pub budget_tokens: u32,
    /// Budget the tightening tends to when the attainment reaches 0 (default 512 ≈ the median
    /// thinking length, 515). At least 1.
    pub min_budget_tokens: u32,
    /// TTFAT attainment fraction below which the budget tightens, in (0, 1] (default 0.9: the
    /// usual "90% of requests within SLO" goodput criterion).
    pub attainment_floor: f64,
}

impl Default for LoadAwareBudget {
    fn default() -> Self {
        Self { budget_tokens: 4096, min_budget_tokens: 512, attainment_floor: 0.9 }
    }
}

/// EAT stop rule (arXiv 2509.26522, code `xidulu/EAT`): at each reasoning-line boundary (`\n\n`)
/// the caller measures the entropy of the next token after appending the reasoning-end marker;
/// its exponentially weighted mean and variance are updated by [`eat_update`], and the
/// rule fires at the first probe with `count ≥ min_lines` and `var < variance_threshold`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EatRule {
    /// EMA weight of the newest probe, in (0, 1) (default 0.2: the `alpha` default of Microsoft's
    /// `interwhen` EAT monitor; the EAT README suggests a warm-up of ≈ 4/α = 20 lines, below
    /// `min_lines`).
    pub alpha: f32,
    /// δ, in nats², > 0 (default 1.25e-4). [`eat_update`] keeps the West form
    /// `var = (1−α)(var + α·d²)`, exactly `1/(1−α)` times the paper code's
    /// `α·(x − mean_new)² + (1−α)·var` on the same series, so δ here = δ_paper / (1 − α):
    /// `interwhen`'s δ = 1e-4 at α = 0.2 gives 1.25e-4 (an EW standard deviation of ≈ 0.011
    /// nats). Conservative: after a 2-nat drop the series needs ≈ 45 flat lines to get below it.
    pub variance_threshold: f32,
    /// Probes (lines) before the rule may fire, at least 1 (default 25: `min_distance` of the EAT
    /// code; that code skips the first variance too, so its earliest exit reads the 27th value).
    /// The first probe sets `var = 0`, so `min_lines = 1` fires on the first probe.
    pub min_lines: u32,
}

impl Default for EatRule {
    fn default() -> Self {
        Self { alpha: 0.2, variance_threshold: 1.25e-4, min_lines: 25 }
    }
}

/// The cheap proxy for EAT (close to RCPD, arXiv 2508.17627, which watches the rank of the
/// end-of-thinking token): fire when, after `min_tokens` thinking tokens, the reasoning-end
/// token's probability in the ordinary next-token distribution reaches `end_prob_threshold`, or
/// its rank (number of tokens with a strictly larger logit) is at most `max_end_rank`. For a
/// multi-token end marker the caller passes its first token. Defaults are ours (uncalibrated).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyRule {
    /// Probability threshold in (0, 1), or `null` to use the rank alone (default 0.1: the model
    /// itself gives ending its reasoning a one-in-ten chance).
    pub end_prob_threshold: Option<f32>,
    /// Largest qualifying rank, or `null` to use the probability alone (default 0: the end token
    /// is the most likely next token, where greedy decoding would stop on its own).
    pub max_end_rank: Option<u32>,
    /// Thinking tokens before the proxy is consulted; the token that brings the count to
    /// `min_tokens` is the first one checked (default 128: ≈ p15 of production R1 thinking
    /// lengths — below it a forced exit saves little, and the model is still restating the task).
    pub min_tokens: u32,
}

impl Default for ProxyRule {
    fn default() -> Self {
        Self { end_prob_threshold: Some(0.1), max_end_rank: Some(0), min_tokens: 128 }
    }
}

/// RPDI deviation rule (arXiv 2603.14251: overthinking "deviates from the correct reasoning path
/// … frequently accompanied by high-entropy transition tokens"; the paper's formula and constants
/// are not public). Ours: a token is a *transition* token when its entropy exceeds
/// `high_entropy_nats`; the local rate is the EMA of that indicator ([`rpdi_update`]),
/// the global rate is transitions / tokens; at a sentence boundary the rule fires when
/// `local / global ≥ ratio_threshold` — a burst of transitions well above the request's own
/// baseline, which is the direction the abstract describes. All defaults are ours, uncalibrated:
/// chosen so that one transition token cannot fire the rule but a burst can.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RpdiRule {
    /// Entropy (nats) above which a token counts as a transition, > 0 (default 2.0: ≈ e² ≈ 7
    /// equally likely continuations, a genuine fork rather than wording noise).
    pub high_entropy_nats: f32,
    /// EMA weight of the local rate, in (0, 1) (default 0.02: a memory of ≈ 50 tokens, two or three
    /// sentences; one transition lifts the rate by ≈ α, so at a global rate ≥ 1% a single one
    /// cannot reach 3× it, while 3–4 within ≈ 50 tokens do).
    pub alpha: f32,
    /// Local/global ratio that fires, > 1 (a ratio ≤ 1 would fire on an ordinary stretch)
    /// (default 3.0).
    pub ratio_threshold: f32,
    /// Tokens with a usable entropy before the rule may fire (default 512: the EMA starts at 0 and
    /// after 512 tokens the start weighs 0.98⁵¹² ≈ 3e-5, and the global rate rests on ≈ 10
    /// transitions at a 2% rate).
    pub min_tokens: u32,
}

impl Default for RpdiRule {
    fn default() -> Self {
        Self { high_entropy_nats: 2.0, alpha: 0.02, ratio_threshold: 3.0, min_tokens: 512 }
    }
}

/// What the logits processor forces when a rule fires: the closing text (if any), then the
/// model's reasoning-end marker (from vLLM's reasoning parser, never configured here).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ClosingPolicy {
    /// A short sentence emitted before the marker, e.g. the Qwen3 technical report's (§4.3)
    /// "Considering the limited time by the user, I have to give the solution based on the
    /// thinking directly now.\n" (default none: the bare marker, as vLLM's
    /// `thinking_token_budget` does). Not blank; at most 512 characters
    /// ([`MAX_CLOSING_TEXT_CHARS`]).
    pub closing_text: Option<String>,
}

impl ThinkingControl {
    /// Whether any rule is on.
    pub fn is_enabled(&self) -> bool {
        self.budget_tokens.is_some()
            || self.load_aware.is_some()
            || self.eat.is_some()
            || self.proxy.is_some()
            || self.rpdi.is_some()
    }

    /// Whether the caller must compute per-token entropies (RPDI is on).
    pub fn wants_token_entropy(&self) -> bool {
        self.rpdi.is_some()
    }

    /// Whether the caller must run EAT probes at line boundaries (EAT is on).
    pub fn wants_eat_probes(&self) -> bool {
        self.eat.is_some()
    }

    /// Whether the caller must compute the reasoning-end token's probability and rank (the proxy
    /// is on).
    pub fn wants_end_token_stats(&self) -> bool {
        self.proxy.is_some()
    }

    /// Checks every value; errors name the dotted key under `prefix` (e.g. `thinking_control`).
    pub(crate) fn validate(&self, prefix: &str) -> Result<()> {
        let key = |field: &str| format!("{prefix}.{field}");
        if self.budget_tokens == Some(0) {
            return Err(Error::config(
                key("budget_tokens"),
                "0 is not a budget: it must be at least 1 token (omit the key to turn the budget off)",
            ));
        }
        if let Some(rule) = &self.load_aware {
            let key = |field: &str| format!("{prefix}.load_aware.{field}");
            if rule.min_budget_tokens == 0 {
                return Err(Error::config(key("min_budget_tokens"), "0 must be at least 1 token"));
            }
            if rule.budget_tokens < rule.min_budget_tokens {
                return Err(Error::config(
                    key("budget_tokens"),
                    format!(
                        "{} is below min_budget_tokens ({}): the budget only tightens toward the minimum",
                        rule.budget_tokens, rule.min_budget_tokens
                    ),
                ));
            }
            let floor = rule.attainment_floor;
            if !(floor > 0.0 && floor <= 1.0) {
                return Err(Error::config(key("attainment_floor"), format!("{floor} is not in (0, 1]")));
            }
        }
        self.reasoning_effort.validate(&key("reasoning_effort"))?;
        if let Some(rule) = &self.eat {
            let key = |field: &str| format!("{prefix}.eat.{field}");
            open_unit(&key("alpha"), rule.alpha)?;
            positive_f32(&key("variance_threshold"), rule.variance_threshold)?;
            if rule.min_lines == 0 {
                return Err(Error::config(key("min_lines"), "0 must be at least 1 line"));
            }
        }
        if let Some(rule) = &self.proxy {
            let key = |field: &str| format!("{prefix}.proxy.{field}");
            if let Some(threshold) = rule.end_prob_threshold {
                open_unit(&key("end_prob_threshold"), threshold)?;
            }
            if rule.end_prob_threshold.is_none() && rule.max_end_rank.is_none() {
                return Err(Error::config(
                    format!("{prefix}.proxy"),
                    "end_prob_threshold and max_end_rank are both null: the proxy could never fire",
                ));
            }
        }
        if let Some(rule) = &self.rpdi {
            let key = |field: &str| format!("{prefix}.rpdi.{field}");
            positive_f32(&key("high_entropy_nats"), rule.high_entropy_nats)?;
            if rule.high_entropy_nats > MAX_ENTROPY_NATS {
                return Err(Error::config(
                    key("high_entropy_nats"),
                    format!(
                        "{} exceeds {MAX_ENTROPY_NATS} nats, above any real entropy",
                        rule.high_entropy_nats
                    ),
                ));
            }
            open_unit(&key("alpha"), rule.alpha)?;
            let ratio = rule.ratio_threshold;
            if !(ratio.is_finite() && ratio > 1.0) {
                return Err(Error::config(
                    key("ratio_threshold"),
                    format!("{ratio} must be a number > 1 (a local rate above the global one)"),
                ));
            }
        }
        self.boundaries.validate(prefix)?;
        if let Some(text) = &self.closing.closing_text {
            let key = key("closing.closing_text");
            if text.trim().is_empty() {
                return Err(Error::config(
                    key,
                    "must be a sentence, not blank (omit it for the bare marker)",
                ));
            }
            let chars = text.chars().count();
            if chars > MAX_CLOSING_TEXT_CHARS {
                return Err(Error::config(
                    key,
                    format!("{chars} characters is longer than the {MAX_CLOSING_TEXT_CHARS} allowed"),
                ));
            }
        }
        Ok(())
    }
}

/// Request argument that replaces the class's thinking control: `"off"`, or a JSON object with the
/// keys of `thinking_control` (validated the same way).
pub const THINKING_ARG: &str = "meridian_thinking";

/// Request argument that sets a hard thinking budget (tokens) on top of the class's control.
pub const THINKING_BUDGET_ARG: &str = "meridian_thinking_budget_tokens";

impl ThinkingControl {
    /// The control for one request: the class's `base`, replaced by the request's
    /// [`THINKING_ARG`] (`"off"` or a JSON object) and then given the hard budget of
    /// [`THINKING_BUDGET_ARG`]. Errors name the argument, dotted into the JSON.
    pub fn for_request(
        base: &ThinkingControl,
        thinking: Option<&str>,
        budget_tokens: Option<i64>,
    ) -> Result<Self> {
        let mut control = match thinking.map(str::trim) {
            None => base.clone(),
            Some("off") => ThinkingControl::default(),
            Some(text) => {
                let parsed: ThinkingControl = serde_json::from_str(text).map_err(|e| {
                    Error::request_args(
                        THINKING_ARG,
                        format!("{e}; expected \"off\" or a JSON object with the keys of thinking_control"),
                    )
                })?;
                parsed.validate(THINKING_ARG).map_err(into_request_args)?;
                parsed
            }
        };
        if let Some(budget) = budget_tokens {
            let budget = u32::try_from(budget).ok().filter(|&b| b >= 1).ok_or_else(|| {
                Error::request_args(
                    THINKING_BUDGET_ARG,
                    format!("{budget} must be a whole number of tokens from 1 to {}", u32::MAX),
                )
            })?;
            control.budget_tokens = Some(budget);
        }
        Ok(control)
    }
}

fn into_request_args(err: Error) -> Error {
    match err {
        Error::InvalidConfig { key, reason } => Error::InvalidRequestArgs { key, reason },
        other => other,
    }
}

fn open_unit(key: &str, v: f32) -> Result<()> {
    if v > 0.0 && v < 1.0 {
        Ok(())
    } else {
        Err(Error::config(key, format!("{v} is not in (0, 1)")))
    }
}

fn positive_f32(key: &str, v: f32) -> Result<()> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(Error::config(key, format!("{v} is not a positive number")))
    }
}

impl LoadAwareBudget {
    /// The budget in force at a class TTFAT attainment (`None`: unknown, no tightening):
    /// `budget_tokens` at or above the floor, else `min + ⌊(budget − min) · attainment / floor⌋`.
    pub fn effective_budget(&self, attainment: Option<f64>) -> u32 {
        match attainment {
            Some(a) if a < self.attainment_floor => {
                let span = f64::from(self.budget_tokens.saturating_sub(self.min_budget_tokens));
                let scale = (a / self.attainment_floor).clamp(0.0, 1.0);
                // `span · scale` lies in [0, span] ⊂ u32, so the cast is exact after `floor`.
                self.min_budget_tokens.saturating_add((span * scale).floor() as u32)
            }
            _ => self.budget_tokens,
        }
    }
}

impl ThinkingControl {
    /// The control with the request's `reasoning_effort` applied: its budget becomes a hard
    /// budget (the tighter one wins where the control has one already).
    pub fn with_reasoning_effort(
        mut self,
        effort: Option<ReasoningEffort>,
        max_tokens: Option<u32>,
    ) -> Result<Self> {
        if let Some(effort) = effort {
            let budget = self.reasoning_effort.budget(effort, max_tokens)?;
            self.budget_tokens = Some(self.budget_tokens.map_or(budget, |own| own.min(budget)));
        }
        Ok(self)
    }

    /// The thinking budget vLLM itself enforces for a request admitted now: the tightest of the
    /// hard budget and the load-aware budget at the class's TTFAT attainment now (`None`:
    /// unknown, no tightening), and `client_tokens`, the client's own `thinking_token_budget`.
    /// `None` when none applies. The budget is fixed for the request's life: the load-aware
    /// budget follows the attainment further only under Meridian's logits processor.
    pub fn admission_budget(&self, attainment: Option<f64>, client_tokens: Option<u32>) -> Option<u32> {
        let load_aware = self.load_aware.map(|rule| rule.effective_budget(attainment));
        [self.budget_tokens, load_aware, client_tokens].into_iter().flatten().min()
    }
}

impl EatRule {
    /// Whether the EAT series has converged: enough probes and the EW variance below δ.
    pub fn converged(&self, signal: &EatSignal) -> bool {
        signal.count >= self.min_lines && signal.var < self.variance_threshold
    }
}

impl ProxyRule {
    /// Whether the proxy qualifies after `num_think_tokens` thinking tokens, given the end
    /// token's probability and rank at this token (either may be missing).
    pub fn qualifies(&self, num_think_tokens: u32, end_prob: Option<f32>, end_rank: Option<u32>) -> bool {
        if num_think_tokens < self.min_tokens {
            return false;
        }
        let by_prob = matches!((self.end_prob_threshold, end_prob), (Some(t), Some(p)) if p >= t);
        let by_rank = matches!((self.max_end_rank, end_rank), (Some(m), Some(r)) if r <= m);
        by_prob || by_rank
    }
}

impl RpdiRule {
    /// Whether the local transition rate is at least `ratio_threshold` times the global one,
    /// after `min_tokens` tokens (never while no transition has been seen: the ratio is
    /// undefined). Compared as `local · tokens ≥ ratio · transitions` in f64, without division.
    pub fn deviates(&self, signal: &RpdiSignal) -> bool {
        signal.num_tokens >= self.min_tokens
            && signal.num_tokens > 0
            && signal.num_high > 0
            && f64::from(signal.local_rate) * f64::from(signal.num_tokens)
                >= f64::from(self.ratio_threshold) * f64::from(signal.num_high)
    }
}
