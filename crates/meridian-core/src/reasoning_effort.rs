//! A request's thinking budget from the OpenAI API's `reasoning_effort` and what vLLM's own
//! per-request `thinking_token_budget` is set to at admission. This module owns the effort
//! levels, their per-class budgets ([`EffortBudgets`], key `thinking_control.reasoning_effort`)
//! and the room an answer keeps under `max_tokens`; `thinking/control.rs` applies them to a request's
//! control (`ThinkingControl::with_reasoning_effort`) and derives the budget vLLM enforces where
//! Meridian's logits processor does not run (`ThinkingControl::admission_budget`).
//! Invariant: a budget given out is at least 1 token and, for an effort, leaves at least
//! `answer_room_tokens` of `max_tokens` to the answer; an effort that cannot leave that room is
//! refused as [`Error::InvalidRequestArgs`] naming [`EFFORT_ARG`], never silently shrunk to 0.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{shown, Error, Result};

/// The request argument carrying a request's `reasoning_effort` (`low`, `medium`, `high`).
/// `MeridianFrontend` copies the OpenAI API's top-level `reasoning_effort` into it; offline
/// callers set it in `extra_args`.
pub const EFFORT_ARG: &str = "meridian_reasoning_effort";

/// The effort levels that map onto a budget. The API's other values (`none`, `minimal`, `xhigh`,
/// `max`) are left to vLLM and the chat template: Meridian sets no budget for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReasoningEffort {
    /// `low`
    Low,
    /// `medium`
    Medium,
    /// `high`
    High,
}

impl ReasoningEffort {
    /// Every level, in order.
    pub const ALL: [ReasoningEffort; 3] =
        [ReasoningEffort::Low, ReasoningEffort::Medium, ReasoningEffort::High];

    /// The level an API value names, or `None` for a value Meridian leaves to vLLM.
    pub fn from_api(value: &str) -> Option<Self> {
        match value {
            "low" => Some(ReasoningEffort::Low),
            "medium" => Some(ReasoningEffort::Medium),
            "high" => Some(ReasoningEffort::High),
            _ => None,
        }
    }

    /// The API's name of the level.
    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningEffort::Low => "low",
            ReasoningEffort::Medium => "medium",
            ReasoningEffort::High => "high",
        }
    }

    /// Parses [`EFFORT_ARG`]: one of `low`, `medium`, `high`.
    pub fn parse_arg(value: &str) -> Result<Self> {
        Self::from_api(value).ok_or_else(|| {
            Error::request_args(EFFORT_ARG, format!("`{}` must be one of low, medium, high", shown(value)))
        })
    }
}

/// Thinking budgets per `reasoning_effort` level, and the room an answer keeps. Defaults are
/// ours, read off the ServeGen DeepSeek-R1 thinking lengths that seed the predictor: `low` ≈ the
/// p70 (950), `medium` ≈ the p95 (the load-aware budget's 4,096), `high` ≈ beyond the p99
/// (9,301); the answer room ≈ the p80 of answer lengths (520).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EffortBudgets {
    /// Thinking budget of `reasoning_effort: low`, in tokens (default 1024; at least 1).
    pub low_tokens: u32,
    /// Thinking budget of `reasoning_effort: medium`, in tokens (default 4096; at least 1).
    pub medium_tokens: u32,
    /// Thinking budget of `reasoning_effort: high`, in tokens (default 16384; at least 1).
    pub high_tokens: u32,
    /// Tokens of `max_tokens` always left to the answer: the budget is cut to `max_tokens` minus
    /// this, and a request whose `max_tokens` is not above it is refused (default 512; at least
    /// 1).
    pub answer_room_tokens: u32,
}

impl Default for EffortBudgets {
    fn default() -> Self {
        Self { low_tokens: 1024, medium_tokens: 4096, high_tokens: 16384, answer_room_tokens: 512 }
    }
}

impl EffortBudgets {
    /// The budget of a level, before `max_tokens` is counted.
    pub fn tokens(&self, effort: ReasoningEffort) -> u32 {
        match effort {
            ReasoningEffort::Low => self.low_tokens,
            ReasoningEffort::Medium => self.medium_tokens,
            ReasoningEffort::High => self.high_tokens,
        }
    }

    /// The thinking budget of `effort` for a request that may generate `max_tokens` in all
    /// (`None`: no cap known): the level's budget, cut so `answer_room_tokens` remain.
    pub fn budget(&self, effort: ReasoningEffort, max_tokens: Option<u32>) -> Result<u32> {
        let tokens = self.tokens(effort);
        let Some(max_tokens) = max_tokens else { return Ok(tokens) };
        match max_tokens.checked_sub(self.answer_room_tokens).filter(|&room| room >= 1) {
            Some(room) => Ok(tokens.min(room)),
            None => Err(Error::request_args(
                EFFORT_ARG,
                format!(
                    "reasoning_effort `{}` needs max_tokens above {} (the tokens kept for the answer, \
                     thinking_control.reasoning_effort.answer_room_tokens) to leave any thinking budget; \
                     max_tokens is {max_tokens}",
                    effort.as_str(),
                    self.answer_room_tokens
                ),
            )),
        }
    }

    /// Checks every value; errors name the dotted key under `prefix`.
    pub(crate) fn validate(&self, prefix: &str) -> Result<()> {
        let fields = [
            ("low_tokens", self.low_tokens),
            ("medium_tokens", self.medium_tokens),
            ("high_tokens", self.high_tokens),
            ("answer_room_tokens", self.answer_room_tokens),
        ];
        for (field, value) in fields {
            if value == 0 {
                return Err(Error::config(format!("{prefix}.{field}"), "0 must be at least 1 token"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::thinking::{LoadAwareBudget, ThinkingControl};

    fn named(err: Error) -> String {
        match err {
            Error::InvalidRequestArgs { key, .. } => key,
            other => panic!("expected InvalidRequestArgs, got {other}"),
        }
    }

    #[test]
    fn api_values_parse_and_others_are_left_to_vllm() {
        for effort in ReasoningEffort::ALL {
            assert_eq!(ReasoningEffort::from_api(effort.as_str()), Some(effort));
        }
        for other in ["none", "minimal", "xhigh", "max", "LOW", ""] {
            assert_eq!(ReasoningEffort::from_api(other), None);
        }
        let err = ReasoningEffort::parse_arg("extreme").unwrap_err();
        assert!(err.to_string().contains("`extreme`"), "{err}");
        assert_eq!(named(err), EFFORT_ARG);
    }

    #[test]
    fn the_budget_leaves_the_answer_room_under_max_tokens() {
        let budgets = EffortBudgets::default();
        assert_eq!(budgets.budget(ReasoningEffort::High, None).unwrap(), 16384);
        assert_eq!(budgets.budget(ReasoningEffort::Low, Some(8192)).unwrap(), 1024);
        assert_eq!(budgets.budget(ReasoningEffort::High, Some(8192)).unwrap(), 8192 - 512);
        assert_eq!(budgets.budget(ReasoningEffort::Low, Some(513)).unwrap(), 1);
        for max_tokens in [0, 1, 512] {
            let err = budgets.budget(ReasoningEffort::Low, Some(max_tokens)).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains(&format!("max_tokens is {max_tokens}")) && text.contains("`low`"),
                "{text}"
            );
            assert_eq!(named(err), EFFORT_ARG);
        }
    }

    #[test]
    fn effort_tightens_a_hard_budget_and_never_loosens_it() {
        let mut control = ThinkingControl::default();
        let low = control.clone().with_reasoning_effort(Some(ReasoningEffort::Low), None).unwrap();
        assert_eq!(low.budget_tokens, Some(1024));
        assert!(low.is_enabled());
        control.budget_tokens = Some(100);
        let high = control.clone().with_reasoning_effort(Some(ReasoningEffort::High), None).unwrap();
        assert_eq!(high.budget_tokens, Some(100));
        assert_eq!(control.clone().with_reasoning_effort(None, Some(1)).unwrap(), control);
    }

    #[test]
    fn the_admission_budget_is_the_tightest_in_force() {
        let mut control = ThinkingControl::default();
        assert_eq!(control.admission_budget(Some(0.0), None), None);
        assert_eq!(control.admission_budget(None, Some(7)), Some(7));
        control.load_aware =
            Some(LoadAwareBudget { budget_tokens: 100, min_budget_tokens: 20, attainment_floor: 0.5 });
        assert_eq!(control.admission_budget(None, None), Some(100));
        assert_eq!(control.admission_budget(Some(0.25), None), Some(60));
        control.budget_tokens = Some(50);
        assert_eq!(control.admission_budget(Some(0.9), None), Some(50));
        assert_eq!(control.admission_budget(Some(0.0), Some(30)), Some(20));
    }

    #[test]
    fn zero_budgets_are_refused_naming_the_key() {
        let budgets = EffortBudgets { medium_tokens: 0, ..EffortBudgets::default() };
        let err = budgets.validate("thinking_control.reasoning_effort").unwrap_err();
        assert!(err.to_string().contains("thinking_control.reasoning_effort.medium_tokens"), "{err}");
    }

    proptest! {
        #[test]
        fn an_effort_budget_always_leaves_the_answer_room(
            low in 1u32..100_000, medium in 1u32..100_000, high in 1u32..100_000,
            room in 1u32..10_000, max_tokens in proptest::option::of(0u32..200_000), level in 0usize..3,
        ) {
            let budgets = EffortBudgets { low_tokens: low, medium_tokens: medium, high_tokens: high, answer_room_tokens: room };
            let effort = ReasoningEffort::ALL[level];
            match budgets.budget(effort, max_tokens) {
                Ok(budget) => {
                    prop_assert!(budget >= 1 && budget <= budgets.tokens(effort));
                    if let Some(max_tokens) = max_tokens {
                        prop_assert!(u64::from(budget) + u64::from(room) <= u64::from(max_tokens));
                    }
                }
                Err(err) => {
                    prop_assert_eq!(named(err), EFFORT_ARG);
                    prop_assert!(max_tokens.is_some_and(|m| m <= room));
                }
            }
        }
    }
}
