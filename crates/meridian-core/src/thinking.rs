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

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::reasoning_effort::{EffortBudgets, ReasoningEffort};

/// Largest entropy, in nats, accepted as a signal. No distribution over a vocabulary that `u32`
/// token ids can index exceeds `ln 2³² ≈ 22.2` nats, so a larger value is a caller bug; the
/// bound also keeps every EMA finite (`|d| ≤ 64`, so `d²` cannot overflow f32). Values are
/// accepted when `|x| ≤ 32`: tiny negative entropies from rounding go through as measured.
pub const MAX_ENTROPY_NATS: f32 = 32.0;

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

/// The text that ends a reasoning line and a sentence. The defaults are the EAT paper's line
/// (`\n\n`) and the ordinary sentence-final punctuation, ASCII and CJK; a model whose reasoning
/// is not prose (the project's tiny counting model has no punctuation at all) names its own
/// markers here.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Boundaries {
    /// Strings that end a reasoning line wherever they occur, also across a token boundary
    /// (`"\n"` then `"\n"`). A line end is also a sentence end. Each 1 to 16 characters
    /// ([`MAX_BOUNDARY_MARKER_CHARS`]).
    pub line_end: Vec<String>,
    /// Strings that end a sentence when a token's text, trailing whitespace removed, ends with
    /// one of them. Each 1 to 16 characters.
    pub sentence_end: Vec<String>,
}

impl Default for Boundaries {
    fn default() -> Self {
        Self {
            line_end: vec!["\n\n".to_owned()],
            sentence_end: [".", "?", "!", "\u{3002}", "\u{ff1f}", "\u{ff01}"].map(str::to_owned).to_vec(),
        }
    }
}

/// Characters of text kept between tokens to find a line marker split across them; longer than
/// any sensible marker, and the validation caps markers below it.
pub const MAX_BOUNDARY_MARKER_CHARS: usize = 16;

impl Boundaries {
    /// The boundary a token closes, given the reasoning text just before it (`tail`, any length;
    /// only its end matters) and the token's own text. A line marker counts when it ends inside
    /// the token's text, so a marker split across two tokens is found once, on the second.
    pub fn boundary_of(&self, tail: &str, token_text: &str) -> Boundary {
        if token_text.is_empty() {
            return Boundary::None;
        }
        let joined = format!("{}{token_text}", char_suffix(tail, MAX_BOUNDARY_MARKER_CHARS));
        let new_from = joined.len() - token_text.len();
        let ends_line = self
            .line_end
            .iter()
            .any(|marker| joined.match_indices(marker.as_str()).any(|(at, m)| at + m.len() > new_from));
        if ends_line {
            return Boundary::Line;
        }
        let trimmed = token_text.trim_end();
        if self.sentence_end.iter().any(|marker| trimmed.ends_with(marker.as_str())) {
            Boundary::Sentence
        } else {
            Boundary::None
        }
    }

    fn validate(&self, prefix: &str) -> Result<()> {
        for (name, markers) in [("line_end", &self.line_end), ("sentence_end", &self.sentence_end)] {
            for (i, marker) in markers.iter().enumerate() {
                let chars = marker.chars().count();
                if chars == 0 || chars > MAX_BOUNDARY_MARKER_CHARS {
                    return Err(Error::config(
                        format!("{prefix}.boundaries.{name}[{i}]"),
                        format!("{marker:?} must be 1 to {MAX_BOUNDARY_MARKER_CHARS} characters"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The last `max_chars` characters of `text` (all of it when shorter).
pub(crate) fn char_suffix(text: &str, max_chars: usize) -> &str {
    match text.char_indices().rev().nth(max_chars.saturating_sub(1)) {
        Some((at, _)) if max_chars > 0 => &text[at..],
        _ if max_chars == 0 => "",
        _ => text,
    }
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

/// EAT signal state of one request, updated by [`eat_update`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EatSignal {
    /// Exponentially weighted mean of the EAT values, nats.
    pub mean: f32,
    /// Exponentially weighted variance (West form), nats².
    pub var: f32,
    /// Probes taken.
    pub count: u32,
}

/// RPDI signal state of one request, updated by [`rpdi_update`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RpdiSignal {
    /// Tokens with a usable entropy.
    pub num_tokens: u32,
    /// Of those, tokens whose entropy exceeded the threshold (transition tokens).
    pub num_high: u32,
    /// EMA of the transition indicator (starts at 0).
    pub local_rate: f32,
}

/// One EAT probe, in f32, in this operation order and without fused multiply-add: the first
/// probe sets `mean = x, var = 0`; later ones `d = x − mean; mean += α·d; var = (1 − α)(var +
/// α·d·d)`. It takes any value: the caller filters unusable ones (see [`MAX_ENTROPY_NATS`]).
pub fn eat_update(signal: &mut EatSignal, x: f32, alpha: f32) {
    if signal.count == 0 {
        signal.mean = x;
        signal.var = 0.0;
    } else {
        let d = x - signal.mean;
        signal.mean += alpha * d;
        signal.var = (1.0 - alpha) * (signal.var + alpha * d * d);
    }
    signal.count = signal.count.saturating_add(1);
}

/// One ordinary reasoning token, in f32, in this operation order: `high = x > threshold ? 1 :
/// 0`; count it; `local += α·(high − local)`.
pub fn rpdi_update(signal: &mut RpdiSignal, x: f32, high_entropy_nats: f32, alpha: f32) {
    let is_high = x > high_entropy_nats;
    let high: f32 = if is_high { 1.0 } else { 0.0 };
    signal.num_tokens = signal.num_tokens.saturating_add(1);
    signal.num_high = signal.num_high.saturating_add(u32::from(is_high));
    signal.local_rate += alpha * (high - signal.local_rate);
}

/// Whether an entropy may enter an EMA: finite and within ±[`MAX_ENTROPY_NATS`].
fn usable_entropy(x: f32) -> bool {
    x.abs() <= MAX_ENTROPY_NATS
}

/// Where the token just generated ends, as the caller's tokenizer sees it. A line end (`\n\n`,
/// the EAT probe point) is also a sentence end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Boundary {
    /// Mid-sentence.
    None,
    /// The token ends a sentence (`.`, `?`, `!`, … followed by space or newline).
    Sentence,
    /// The token ends a reasoning line (`\n\n`).
    Line,
}

impl Boundary {
    /// Whether the token ends a sentence (a line end included).
    pub fn ends_sentence(self) -> bool {
        matches!(self, Boundary::Sentence | Boundary::Line)
    }
}

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
    /// Per-token entropies that were NaN, infinite or beyond ±[`MAX_ENTROPY_NATS`].
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn only(f: impl FnOnce(&mut ThinkingControl)) -> ThinkingControl {
        let mut control = ThinkingControl::default();
        f(&mut control);
        control.validate("thinking_control").unwrap();
        control
    }

    /// Feeds `n` plain thinking tokens (no signals, no boundary); returns the 1-based index of
    /// the token that fired, if any.
    fn plain_tokens(
        state: &mut ThinkingState,
        control: &ThinkingControl,
        n: u32,
    ) -> Option<(u32, StopReason)> {
        (1..=n).find_map(|i| state.on_think_token(control, None, None, None, Boundary::None).map(|r| (i, r)))
    }

    /// Feeds EAT probes; returns the 1-based index of the probe that fired, if any.
    fn probes(state: &mut ThinkingState, control: &ThinkingControl, xs: &[f32]) -> Option<usize> {
        xs.iter().position(|&x| state.on_eat_probe(control, x).is_some()).map(|i| i + 1)
    }

    #[test]
    fn default_control_is_off_and_never_fires() {
        let control = ThinkingControl::default();
        assert!(!control.is_enabled());
        let mut state = ThinkingState::new();
        for i in 0..10_000 {
            let boundary = if i % 7 == 0 { Boundary::Line } else { Boundary::Sentence };
            assert_eq!(state.on_think_token(&control, Some(5.0), Some(1.0), Some(0), boundary), None);
            assert_eq!(state.on_eat_probe(&control, 0.0), None);
        }
        assert_eq!(state.fired(), None);
        assert_eq!(state.eat().count, 0, "EAT off: probes are not even recorded");
    }

    #[test]
    fn eat_update_matches_hand_computed_values() {
        // α = 0.5 and dyadic inputs keep every f32 operation exact.
        let mut s = EatSignal::default();
        eat_update(&mut s, 2.0, 0.5);
        assert_eq!(s, EatSignal { mean: 2.0, var: 0.0, count: 1 });
        eat_update(&mut s, 4.0, 0.5); // d = 2, mean = 3, var = 0.5·(0 + 0.5·4) = 1
        assert_eq!(s, EatSignal { mean: 3.0, var: 1.0, count: 2 });
        eat_update(&mut s, 3.0, 0.5); // d = 0, var halves
        assert_eq!(s, EatSignal { mean: 3.0, var: 0.5, count: 3 });
        eat_update(&mut s, 1.0, 0.5); // d = −2, mean = 2, var = 0.5·(0.5 + 0.5·4) = 1.25
        assert_eq!(s, EatSignal { mean: 2.0, var: 1.25, count: 4 });
    }

    #[test]
    fn rpdi_update_matches_hand_computed_values() {
        let mut s = RpdiSignal::default();
        rpdi_update(&mut s, 0.1, 2.0, 0.5); // low: local = 0
        assert_eq!(s, RpdiSignal { num_tokens: 1, num_high: 0, local_rate: 0.0 });
        rpdi_update(&mut s, 3.0, 2.0, 0.5); // high: local = 0.5
        assert_eq!(s, RpdiSignal { num_tokens: 2, num_high: 1, local_rate: 0.5 });
        rpdi_update(&mut s, 2.0, 2.0, 0.5); // not strictly above: local = 0.25
        assert_eq!(s, RpdiSignal { num_tokens: 3, num_high: 1, local_rate: 0.25 });
        rpdi_update(&mut s, 9.0, 2.0, 0.5); // local = 0.25 + 0.5·0.75 = 0.625
        assert_eq!(s, RpdiSignal { num_tokens: 4, num_high: 2, local_rate: 0.625 });
    }

    #[test]
    fn signal_updates_match_float32_golden_bits() {
        // Golden bits computed with float32 NumPy in the same operation order (no fused
        // multiply-add), one value per call, with eat_alpha = 0.2, high_entropy_nats = 2.5,
        // rpdi_alpha = 0.05.
        let eat_in = [2.5f32, 1.75, 1.9, 0.6, 0.61, 0.59, 0.6];
        let eat_golden: [(u32, u32); 7] = [
            (0x4020_0000, 0x0000_0000),
            (0x4016_6666, 0x3db8_51ec),
            (0x4010_a3d7, 0x3dd5_cfaa),
            (0x3ff6_c8b4, 0x3f06_4020),
            (0x3fd5_0b0f, 0x3f32_8d90),
            (0x3fb9_89df, 0x3f3e_1fbb),
            (0x3fa3_ca75, 0x3f35_a8cb),
        ];
        let mut eat = EatSignal::default();
        for (i, (&x, &(mean, var))) in eat_in.iter().zip(&eat_golden).enumerate() {
            eat_update(&mut eat, x, 0.2);
            assert_eq!((eat.mean.to_bits(), eat.var.to_bits()), (mean, var), "probe {i}");
            assert_eq!(eat.count, i as u32 + 1);
        }
        let rpdi_in = [0.1f32, 3.0, 2.5, 2.6, 0.0, 5.0];
        let rpdi_golden: [(u32, u32); 6] = [
            (0, 0x0),
            (1, 0x3d4c_cccd),
            (1, 0x3d42_8f5c),
            (2, 0x3dc2_d0e6),
            (2, 0x3db9_1341),
            (3, 0x3e0b_1c58),
        ];
        let mut rpdi = RpdiSignal::default();
        for (i, (&x, &(high, local))) in rpdi_in.iter().zip(&rpdi_golden).enumerate() {
            rpdi_update(&mut rpdi, x, 2.5, 0.05);
            assert_eq!((rpdi.num_high, rpdi.local_rate.to_bits()), (high, local), "token {i}");
            assert_eq!(rpdi.num_tokens, i as u32 + 1);
        }
    }

    #[test]
    fn west_variance_is_the_paper_codes_over_one_minus_alpha() {
        // xidulu/EAT `exponential_moving_variance`: mean_t = α·x + (1−α)·mean; var_t = α·(x −
        // mean_t)² + (1−α)·var, var_0 = 0. Ours (the West form) is that divided by (1 − α).
        let xs = [2.5f64, 1.75, 1.9, 0.6, 0.61, 0.59, 0.6, 0.4, 0.45, 0.44];
        let alpha = 0.2f64;
        let (mut mean, mut var) = (xs[0], 0.0f64);
        let mut ours = EatSignal::default();
        eat_update(&mut ours, xs[0] as f32, alpha as f32);
        for &x in &xs[1..] {
            mean = alpha * x + (1.0 - alpha) * mean;
            var = alpha * (x - mean).powi(2) + (1.0 - alpha) * var;
            eat_update(&mut ours, x as f32, alpha as f32);
            let expected = var / (1.0 - alpha);
            assert!(
                (f64::from(ours.var) - expected).abs() <= 1e-5 * expected.max(1e-3),
                "{ours:?} vs {expected}"
            );
        }
    }

    #[test]
    fn eat_fires_at_the_first_probe_below_delta_once_min_lines_are_in() {
        // α = 0.5: var runs 0, 1, 0.5, 0.25, 0.125, 0.0625 on 2, 4, 3, 3, 3, 3 (exact in f32).
        let series = [2.0f32, 4.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0];
        let control =
            |min_lines| only(|c| c.eat = Some(EatRule { alpha: 0.5, variance_threshold: 0.1, min_lines }));
        // The first probe has var = 0 < δ: with min_lines = 1 it fires at once.
        assert_eq!(probes(&mut ThinkingState::new(), &control(1), &series), Some(1));
        // From min_lines = 2 on, the first var below 0.1 is the 6th probe (0.0625).
        assert_eq!(probes(&mut ThinkingState::new(), &control(2), &series), Some(6));
        assert_eq!(probes(&mut ThinkingState::new(), &control(6), &series), Some(6));
        // min_lines holds it back even though var is already below δ.
        assert_eq!(probes(&mut ThinkingState::new(), &control(8), &series), Some(8));
        assert_eq!(probes(&mut ThinkingState::new(), &control(9), &series), None);
        // Strictly below: a threshold equal to the variance does not fire (0.125 at probe 5).
        let exact = only(|c| c.eat = Some(EatRule { alpha: 0.5, variance_threshold: 0.125, min_lines: 2 }));
        assert_eq!(probes(&mut ThinkingState::new(), &exact, &series), Some(6));
    }

    #[test]
    fn eat_fires_with_the_default_rule_on_a_stable_series() {
        let control = only(|c| c.eat = Some(EatRule::default()));
        // Two thinking tokens per line, a probe at each line end; returns the line that fired.
        let run = |series: &dyn Fn(u32) -> f32| {
            let mut state = ThinkingState::new();
            for line in 1..=200u32 {
                state.on_think_token(&control, None, None, None, Boundary::None);
                state.on_think_token(&control, None, None, None, Boundary::Line);
                if let Some(reason) = state.on_eat_probe(&control, series(line)) {
                    assert_eq!(reason, StopReason::Eat);
                    assert_eq!(state.fired().unwrap().num_think_tokens, 2 * line);
                    assert_eq!(state.num_lines(), line);
                    return Some(line);
                }
            }
            None
        };
        // A flat series has var = 0 from the first probe: it fires exactly at min_lines = 25.
        assert_eq!(run(&|_| 0.5), Some(25));
        // Falling 2.5 → 0.5 nats over five lines, then flat: var decays by ≈ (1 − α) per line
        // and first drops below 1.25e-4 at line 49 (1.109e-4; line 48: 1.386e-4), as computed
        // with float32 NumPy in `eat_update`'s operation order.
        assert_eq!(run(&|line| if line <= 5 { 3.0 - 0.5 * line as f32 } else { 0.5 }), Some(49));
    }

    #[test]
    fn eat_never_fires_on_a_series_that_keeps_oscillating() {
        // 1, 3, 1, 3, …: the mean settles into a 2-cycle (1.89, 2.11) with |d| ≈ 1.11 ≥ 1, so
        // var ≥ (1 − α)·α·1 = 0.16 > δ forever. (min_lines = 2 skips the first probe's var = 0.)
        let control = only(|c| c.eat = Some(EatRule { alpha: 0.2, variance_threshold: 0.01, min_lines: 2 }));
        let series: Vec<f32> = (0..2_000).map(|i| if i % 2 == 0 { 1.0 } else { 3.0 }).collect();
        let mut state = ThinkingState::new();
        assert_eq!(probes(&mut state, &control, &series), None);
        assert_eq!(state.eat().count, 2_000);
        assert!(state.eat().var > 0.16, "{:?}", state.eat());
    }

    #[test]
    fn budget_fires_at_exactly_budget_tokens() {
        let control = only(|c| c.budget_tokens = Some(5));
        let mut state = ThinkingState::new();
        assert_eq!(plain_tokens(&mut state, &control, 100), Some((5, StopReason::Budget)));
        assert_eq!(state.fired(), Some(FiredAt { reason: StopReason::Budget, num_think_tokens: 5 }));
        let one = only(|c| c.budget_tokens = Some(1));
        assert_eq!(plain_tokens(&mut ThinkingState::new(), &one, 3), Some((1, StopReason::Budget)));
    }

    #[test]
    fn firing_is_once_and_freezes_the_state() {
        let control = only(|c| {
            c.budget_tokens = Some(3);
            c.eat = Some(EatRule { alpha: 0.5, variance_threshold: 0.1, min_lines: 1 });
        });
        let mut state = ThinkingState::new();
        assert_eq!(plain_tokens(&mut state, &control, 3), Some((3, StopReason::Budget)));
        let frozen = state.clone();
        assert_eq!(plain_tokens(&mut state, &control, 50), None);
        assert_eq!(state.on_eat_probe(&control, 1.0), None, "EAT would fire, but the budget already did");
        assert_eq!(state, frozen);
    }

    #[test]
    fn load_aware_tightens_only_below_the_floor() {
        let rule = LoadAwareBudget { budget_tokens: 100, min_budget_tokens: 20, attainment_floor: 0.5 };
        assert_eq!(rule.effective_budget(None), 100);
        assert_eq!(rule.effective_budget(Some(0.5)), 100, "at the floor: no tightening");
        assert_eq!(rule.effective_budget(Some(0.9)), 100);
        assert_eq!(rule.effective_budget(Some(0.25)), 60, "20 + ⌊80 · 0.5⌋");
        assert_eq!(rule.effective_budget(Some(0.0)), 20);
        let control = only(|c| c.load_aware = Some(rule));
        let run = |attainment: Option<f64>| {
            let mut state = ThinkingState::new();
            if let Some(a) = attainment {
                state.set_ttfat_attainment(a);
            }
            plain_tokens(&mut state, &control, 1_000)
        };
        assert_eq!(run(Some(0.25)), Some((60, StopReason::LoadAwareBudget)));
        assert_eq!(run(Some(0.0)), Some((20, StopReason::LoadAwareBudget)));
        assert_eq!(run(Some(0.75)), Some((100, StopReason::LoadAwareBudget)));
        assert_eq!(run(None), Some((100, StopReason::LoadAwareBudget)));
        assert_eq!(run(Some(f64::NAN)), Some((100, StopReason::LoadAwareBudget)), "NaN: unknown");
        assert_eq!(run(Some(-3.0)), Some((20, StopReason::LoadAwareBudget)), "clamped to 0");
    }

    #[test]
    fn load_aware_fires_on_the_next_token_when_the_budget_tightens_below_the_count() {
        let rule = LoadAwareBudget { budget_tokens: 100, min_budget_tokens: 20, attainment_floor: 0.5 };
        let control = only(|c| c.load_aware = Some(rule));
        let mut state = ThinkingState::new();
        assert_eq!(plain_tokens(&mut state, &control, 70), None);
        state.set_ttfat_attainment(0.25); // budget 60 < 70 tokens
        assert_eq!(plain_tokens(&mut state, &control, 5), Some((1, StopReason::LoadAwareBudget)));
        assert_eq!(state.fired().unwrap().num_think_tokens, 71);
    }

    #[test]
    fn hard_budget_wins_a_tie_with_the_load_aware_budget() {
        let control = only(|c| {
            c.budget_tokens = Some(20);
            c.load_aware =
                Some(LoadAwareBudget { budget_tokens: 100, min_budget_tokens: 20, attainment_floor: 0.5 });
        });
        let mut state = ThinkingState::new();
        state.set_ttfat_attainment(0.0);
        assert_eq!(plain_tokens(&mut state, &control, 50), Some((20, StopReason::Budget)));
    }

    #[test]
    fn proxy_fires_at_the_first_qualifying_token_from_min_tokens_on() {
        let control = only(|c| {
            c.proxy = Some(ProxyRule { end_prob_threshold: Some(0.3), max_end_rank: Some(1), min_tokens: 4 })
        });
        // (prob, rank) per token; tokens 1–3 qualify but come before min_tokens.
        let tokens = [
            (Some(0.9), Some(0)),
            (Some(0.5), None),
            (None, Some(1)),
            (Some(0.29), Some(2)), // 4: neither
            (None, None),          // 5: nothing measured
            (Some(0.1), Some(1)),  // 6: rank 1 ≤ 1
        ];
        let mut state = ThinkingState::new();
        let fired = tokens
            .iter()
            .position(|&(p, r)| state.on_think_token(&control, None, p, r, Boundary::None).is_some());
        assert_eq!(fired, Some(5), "the 6th token");
        assert_eq!(state.fired(), Some(FiredAt { reason: StopReason::Proxy, num_think_tokens: 6 }));

        let by_prob = only(|c| {
            c.proxy = Some(ProxyRule { end_prob_threshold: Some(0.3), max_end_rank: None, min_tokens: 4 })
        });
        let mut state = ThinkingState::new();
        let ps = [0.0f32, 0.0, 0.0, 0.2, 0.3];
        let fired = ps
            .iter()
            .position(|&p| state.on_think_token(&by_prob, None, Some(p), Some(0), Boundary::None).is_some());
        assert_eq!(fired, Some(4), "rank 0 is ignored with max_end_rank null; p = 0.3 ≥ 0.3 fires");
    }

    #[test]
    fn rpdi_fires_only_at_sentence_boundaries() {
        // α = 0.5, threshold 1 nat, ratio 1.5, min 4 tokens. Entropies: low, low, low, high, high.
        // After token 5: 5 tokens, 2 high, local = 0.75 → ratio 0.75 / 0.4 = 1.875 ≥ 1.5.
        let control = only(|c| {
            c.rpdi =
                Some(RpdiRule { high_entropy_nats: 1.0, alpha: 0.5, ratio_threshold: 1.5, min_tokens: 4 })
        });
        let entropies = [0.0f32, 0.0, 0.0, 2.0, 2.0, 0.0, 0.0];
        let run = |boundaries: &[Boundary]| {
            let mut state = ThinkingState::new();
            let fired = entropies
                .iter()
                .zip(boundaries)
                .position(|(&x, &b)| state.on_think_token(&control, Some(x), None, None, b).is_some());
            (fired.map(|i| i + 1), state)
        };
        let none = [Boundary::None; 7];
        let (fired, state) = run(&none);
        assert_eq!(fired, None, "the ratio qualifies at token 5 but no token ends a sentence");
        assert_eq!(*state.rpdi(), RpdiSignal { num_tokens: 7, num_high: 2, local_rate: 0.1875 });
        let mut at5 = none;
        at5[4] = Boundary::Sentence;
        assert_eq!(run(&at5).0, Some(5));
        let mut line_at5 = none;
        line_at5[4] = Boundary::Line;
        assert_eq!(run(&line_at5).0, Some(5), "a line end is a sentence end");
        // At token 6 the local rate has decayed to 0.375: 0.375 / (2/6) = 1.125 < 1.5.
        let mut at6 = none;
        at6[5] = Boundary::Sentence;
        assert_eq!(run(&at6).0, None);
        // Token 4 (the first transition) already qualifies: 0.5 / (1/4) = 2 ≥ 1.5, and 4 tokens
        // meet min_tokens = 4, so a sentence end there fires.
        let mut at4 = none;
        at4[3] = Boundary::Sentence;
        assert_eq!(run(&at4).0, Some(4));
    }

    #[test]
    fn rpdi_respects_min_tokens_and_an_empty_global_rate() {
        let control = only(|c| {
            c.rpdi =
                Some(RpdiRule { high_entropy_nats: 1.0, alpha: 0.5, ratio_threshold: 1.5, min_tokens: 5 })
        });
        let mut state = ThinkingState::new();
        for x in [0.0f32, 0.0, 0.0, 2.0] {
            assert_eq!(state.on_think_token(&control, Some(x), None, None, Boundary::Sentence), None);
        }
        // No transitions at all: the ratio is undefined and never fires.
        let mut calm = ThinkingState::new();
        for _ in 0..100 {
            assert_eq!(calm.on_think_token(&control, Some(0.1), None, None, Boundary::Line), None);
        }
    }

    #[test]
    fn unusable_inputs_are_counted_and_never_enter_an_ema() {
        let control = only(|c| {
            c.eat = Some(EatRule { alpha: 0.5, variance_threshold: 0.1, min_lines: 2 });
            c.rpdi =
                Some(RpdiRule { high_entropy_nats: 1.0, alpha: 0.5, ratio_threshold: 1.5, min_tokens: 100 });
            c.proxy = Some(ProxyRule { end_prob_threshold: Some(0.5), max_end_rank: None, min_tokens: 0 });
        });
        let mut state = ThinkingState::new();
        for x in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, -33.0] {
            assert_eq!(state.on_think_token(&control, Some(x), None, None, Boundary::Sentence), None);
            assert_eq!(state.on_eat_probe(&control, x), None);
        }
        for p in [f32::NAN, 1.5, -0.1, f32::INFINITY] {
            assert_eq!(state.on_think_token(&control, None, Some(p), None, Boundary::None), None);
        }
        assert_eq!(state.ignored(), IgnoredInputs { entropies: 5, eat_probes: 5, end_probs: 4 });
        assert_eq!(*state.eat(), EatSignal::default());
        assert_eq!(*state.rpdi(), RpdiSignal::default());
        assert_eq!(state.num_think_tokens(), 9, "the tokens themselves still count");
        // The EAT series goes on as if the bad probes never came (2, 4, 3, 3, 3, 3 → fires at 6).
        let fired = probes(&mut state, &control, &[2.0, 4.0, f32::NAN, 3.0, 3.0, 3.0, 3.0]);
        assert_eq!(fired, Some(7), "the 7th call, the 6th usable probe");
        assert_eq!(state.ignored().eat_probes, 6);
    }

    #[test]
    fn validation_names_the_dotted_key_and_the_value() {
        let bad = |f: fn(&mut ThinkingControl)| {
            let mut control = ThinkingControl::default();
            f(&mut control);
            control.validate("thinking_control").unwrap_err().to_string()
        };
        let msg = bad(|c| c.eat = Some(EatRule { alpha: 1.0, ..EatRule::default() }));
        assert!(msg.contains("thinking_control.eat.alpha") && msg.contains("1 is not in (0, 1)"), "{msg}");
        let msg = bad(|c| c.eat = Some(EatRule { variance_threshold: -0.5, ..EatRule::default() }));
        assert!(msg.contains("thinking_control.eat.variance_threshold") && msg.contains("-0.5"), "{msg}");
        let msg = bad(|c| c.eat = Some(EatRule { min_lines: 0, ..EatRule::default() }));
        assert!(msg.contains("thinking_control.eat.min_lines"), "{msg}");
        let msg = bad(|c| c.budget_tokens = Some(0));
        assert!(msg.contains("thinking_control.budget_tokens"), "{msg}");
        let msg = bad(|c| {
            c.load_aware =
                Some(LoadAwareBudget { budget_tokens: 10, min_budget_tokens: 20, attainment_floor: 0.9 })
        });
        assert!(msg.contains("thinking_control.load_aware.budget_tokens") && msg.contains("10"), "{msg}");
        let msg = bad(|c| {
            c.load_aware = Some(LoadAwareBudget { attainment_floor: 0.0, ..LoadAwareBudget::default() })
        });
        assert!(msg.contains("thinking_control.load_aware.attainment_floor"), "{msg}");
        let msg =
            bad(|c| c.proxy = Some(ProxyRule { end_prob_threshold: Some(f32::NAN), ..ProxyRule::default() }));
        assert!(msg.contains("thinking_control.proxy.end_prob_threshold") && msg.contains("NaN"), "{msg}");
        let msg = bad(|c| {
            c.proxy = Some(ProxyRule { end_prob_threshold: None, max_end_rank: None, min_tokens: 1 })
        });
        assert!(msg.contains("thinking_control.proxy"), "{msg}");
        let msg = bad(|c| c.rpdi = Some(RpdiRule { ratio_threshold: 1.0, ..RpdiRule::default() }));
        assert!(msg.contains("thinking_control.rpdi.ratio_threshold"), "{msg}");
        let msg = bad(|c| c.rpdi = Some(RpdiRule { high_entropy_nats: 0.0, ..RpdiRule::default() }));
        assert!(msg.contains("thinking_control.rpdi.high_entropy_nats"), "{msg}");
        let msg = bad(|c| c.rpdi = Some(RpdiRule { alpha: f32::INFINITY, ..RpdiRule::default() }));
        assert!(msg.contains("thinking_control.rpdi.alpha") && msg.contains("inf"), "{msg}");
        let msg = bad(|c| c.closing.closing_text = Some("  \n".to_owned()));
        assert!(msg.contains("thinking_control.closing.closing_text"), "{msg}");
        let msg = bad(|c| c.closing.closing_text = Some("x".repeat(MAX_CLOSING_TEXT_CHARS + 1)));
        assert!(msg.contains("thinking_control.closing.closing_text") && msg.contains("513"), "{msg}");
    }

    #[test]
    fn every_default_rule_is_valid() {
        let control = ThinkingControl {
            budget_tokens: Some(1),
            load_aware: Some(LoadAwareBudget::default()),
            eat: Some(EatRule::default()),
            proxy: Some(ProxyRule::default()),
            rpdi: Some(RpdiRule::default()),
            closing: ClosingPolicy { closing_text: Some("Time is up.".to_owned()) },
            boundaries: Boundaries::default(),
            reasoning_effort: EffortBudgets::default(),
        };
        control.validate("thinking_control").unwrap();
        assert!(
            control.wants_token_entropy() && control.wants_eat_probes() && control.wants_end_token_stats()
        );
    }

    #[derive(Debug, Clone)]
    enum Event {
        Token { entropy: Option<f32>, prob: Option<f32>, rank: Option<u32>, boundary: Boundary },
        Probe(f32),
        Attainment(f64),
    }

    /// Mostly calm entropies with occasional transitions (so RPDI bursts happen), plus junk.
    fn signal_f32() -> impl Strategy<Value = f32> {
        prop_oneof![
            14 => 0.0f32..0.5,
            3 => 0.5f32..6.0,
            1 => Just(f32::NAN),
            1 => prop_oneof![Just(f32::INFINITY), Just(f32::NEG_INFINITY), Just(1e30f32), Just(-40.0f32)],
        ]
    }

    fn event() -> impl Strategy<Value = Event> {
        let boundary =
            prop_oneof![6 => Just(Boundary::None), 2 => Just(Boundary::Sentence), 1 => Just(Boundary::Line)];
        let prob = prop_oneof![4 => 0.0f32..0.4, 1 => Just(f32::NAN), 1 => -1.0f32..2.0];
        prop_oneof![
            12 => (
                proptest::option::of(signal_f32()),
                proptest::option::of(prob),
                proptest::option::of(0u32..50),
                boundary,
            )
                .prop_map(|(entropy, prob, rank, boundary)| Event::Token { entropy, prob, rank, boundary }),
            3 => signal_f32().prop_map(Event::Probe),
            1 => prop_oneof![0.0f64..1.0, Just(f64::NAN)].prop_map(Event::Attainment),
        ]
    }

    fn control() -> impl Strategy<Value = ThinkingControl> {
        let budget = proptest::option::of(1u32..400);
        let load_aware =
            proptest::option::of((1u32..200, 0u32..300, 0.05f64..1.0).prop_map(|(min, extra, floor)| {
                LoadAwareBudget {
                    budget_tokens: min + extra,
                    min_budget_tokens: min,
                    attainment_floor: floor,
                }
            }));
        let eat =
            proptest::option::of((0.01f32..0.99, 1e-4f32..0.5, 1u32..40).prop_map(|(alpha, delta, min)| {
                EatRule { alpha, variance_threshold: delta, min_lines: min }
            }));
        let proxy = proptest::option::of(
            (proptest::option::of(0.05f32..0.95), proptest::option::of(0u32..3), 0u32..300).prop_map(
                |(threshold, rank, min)| ProxyRule {
                    end_prob_threshold: threshold,
                    max_end_rank: if threshold.is_none() { Some(rank.unwrap_or(0)) } else { rank },
                    min_tokens: min,
                },
            ),
        );
        let rpdi = proptest::option::of((0.5f32..4.0, 0.01f32..0.5, 1.01f32..4.0, 0u32..300).prop_map(
            |(high, alpha, ratio, min)| RpdiRule {
                high_entropy_nats: high,
                alpha,
                ratio_threshold: ratio,
                min_tokens: min,
            },
        ));
        (budget, load_aware, eat, proxy, rpdi).prop_map(|(budget_tokens, load_aware, eat, proxy, rpdi)| {
            ThinkingControl {
                budget_tokens,
                load_aware,
                eat,
                proxy,
                rpdi,
                closing: ClosingPolicy::default(),
                boundaries: Boundaries::default(),
                reasoning_effort: EffortBudgets::default(),
            }
        })
    }

    /// Runs the events; returns each call's answer and the final state, checking on the way
    /// that a firing never comes before the firing rule's own minimum.
    fn replay(control: &ThinkingControl, events: &[Event]) -> (Vec<Option<StopReason>>, ThinkingState) {
        let mut state = ThinkingState::new();
        let mut answers = Vec::with_capacity(events.len());
        for event in events {
            let answer = match *event {
                Event::Token { entropy, prob, rank, boundary } => {
                    let answer = state.on_think_token(control, entropy, prob, rank, boundary);
                    if answer == Some(StopReason::Rpdi) {
                        assert!(boundary.ends_sentence(), "RPDI fired mid-sentence");
                    }
                    answer
                }
                Event::Probe(x) => state.on_eat_probe(control, x),
                Event::Attainment(a) => {
                    state.set_ttfat_attainment(a);
                    None
                }
            };
            if let Some(reason) = answer {
                let n = state.num_think_tokens();
                match reason {
                    StopReason::Budget => assert_eq!(Some(n), control.budget_tokens),
                    StopReason::LoadAwareBudget => {
                        let rule = control.load_aware.unwrap();
                        assert!(n >= rule.effective_budget(state.ttfat_attainment()));
                        assert!(n >= rule.min_budget_tokens);
                    }
                    StopReason::Eat => assert!(state.eat().count >= control.eat.unwrap().min_lines),
                    StopReason::Proxy => assert!(n >= control.proxy.unwrap().min_tokens),
                    StopReason::Rpdi => assert!(state.rpdi().num_tokens >= control.rpdi.unwrap().min_tokens),
                    StopReason::Overload => unreachable!("only the scheduler ends a thinking for overload"),
                }
                assert_eq!(state.fired(), Some(FiredAt { reason, num_think_tokens: n }));
            }
            assert!(state.eat().mean.is_finite() && state.eat().var.is_finite() && state.eat().var >= 0.0);
            assert!((0.0..=1.0).contains(&state.rpdi().local_rate));
            answers.push(answer);
        }
        (answers, state)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn decisions_are_deterministic_single_and_never_early(
            control in control(),
            events in prop::collection::vec(event(), 0..600),
        ) {
            control.validate("thinking_control").unwrap();
            let (first, state) = replay(&control, &events);
            let (second, again) = replay(&control, &events);
            prop_assert_eq!(&first, &second);
            prop_assert_eq!(&state, &again);
            let fired: Vec<_> = first.iter().flatten().collect();
            prop_assert!(fired.len() <= 1, "fired {} times", fired.len());
            prop_assert_eq!(fired.first().copied().copied(), state.fired().map(|f| f.reason));
            if let Some(budget) = control.budget_tokens {
                prop_assert!(state.num_think_tokens() <= budget, "the hard budget is a guarantee");
            }
        }
    }
}
