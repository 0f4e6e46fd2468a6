//! A request's own arguments for Meridian — [`CLASS_ARG`], [`THINKING_ARG`],
//! [`THINKING_BUDGET_ARG`], [`EFFORT_ARG`] and [`WAITED_ARG`] in its `vllm_xargs` /
//! `SamplingParams.extra_args` — checked as the client sent them, before the request is admitted,
//! and turned into the request's thinking control ([`thinking_control_for_request`]). One decision wherever it is made: in vLLM's
//! API server (where a failure becomes that request's HTTP 400) and in the scheduler (the last
//! line, for requests no front-end check saw). Every error is [`Error::InvalidRequestArgs`]
//! naming the argument.

use serde_json::{Map, Value};

use crate::config::Config;
use crate::error::{shown, Error, Result};
use crate::reasoning_effort::{ReasoningEffort, EFFORT_ARG};
use crate::slo::ClassId;
use crate::slo::CLASS_ARG;
use crate::thinking::{ThinkingControl, THINKING_ARG, THINKING_BUDGET_ARG};

/// The request argument saying how long, in ms, the request's client has already waited for it
/// elsewhere: a retry of a request another server shed (set by the client, or by
/// `MeridianFrontend` from the `x-meridian-waited-ms` header a router may add). Its class's
/// targets count that time, in admission at arrival and in the engine.
pub const WAITED_ARG: &str = "meridian_waited_ms";
/// The longest wait [`WAITED_ARG`] may report, ms (a day): a client's wait, not a timestamp.
pub const MAX_WAITED_MS: f64 = 86_400_000.0;

/// A reported wait elsewhere, checked: finite, from 0 to [`MAX_WAITED_MS`].
pub fn check_waited_ms(waited_ms: f64) -> Result<f64> {
    if waited_ms.is_finite() && (0.0..=MAX_WAITED_MS).contains(&waited_ms) {
        Ok(waited_ms)
    } else {
        Err(Error::request_args(
            WAITED_ARG,
            format!("{waited_ms} must be a number of milliseconds from 0 to {MAX_WAITED_MS}"),
        ))
    }
}

/// Checks a request's Meridian arguments, given as the JSON object of its request arguments
/// (other keys are ignored; a `null` value counts as absent).
///
/// - [`CLASS_ARG`] must be a string and, with `config` (the server's configuration), the name of
///   one of its classes; without it (a caller that cannot see the server's configuration) only
///   the type is checked.
/// - [`THINKING_ARG`] (`"off"` or a JSON object, as text or as the object itself) and
///   [`THINKING_BUDGET_ARG`] (a whole number of tokens) must make a valid control
///   ([`ThinkingControl::for_request`]).
/// - [`EFFORT_ARG`] must be `low`, `medium` or `high`; with `config` and `max_tokens`, its budget
///   must leave the answer room of the request's class (named by [`CLASS_ARG`], else picked by
///   `priority`) under `max_tokens`.
/// - [`WAITED_ARG`] must be a number of ms from 0 to [`MAX_WAITED_MS`].
///
/// `args_json` that is not a JSON object is the caller's fault, [`Error::InvalidArgument`].
pub fn check_request_args(
    args_json: &str,
    config: Option<&Config>,
    max_tokens: Option<u32>,
    priority: i64,
) -> Result<()> {
    let args = parse_args(args_json)?;
    check_class(present(&args, CLASS_ARG), config)?;
    waited_ms(present(&args, WAITED_ARG))?;
    let base = match config {
        Some(config) => {
            let class = match present(&args, CLASS_ARG) {
                Some(Value::String(name)) => config.class_by_name(name),
                _ => None,
            };
            config.thinking_control_for(class.unwrap_or_else(|| config.class_for_priority(priority))).clone()
        }
        None => ThinkingControl::default(),
    };
    request_control(&args, &base, max_tokens).map(drop)
}

/// The thinking control in force for one request of `class`: the class's (or the top-level)
/// control, replaced by [`THINKING_ARG`], given the hard budget of [`THINKING_BUDGET_ARG`], then
/// the budget of [`EFFORT_ARG`] under `max_tokens`. The one reading of these arguments, for the
/// scheduler (vLLM's own thinking budget) and the logits processor alike.
pub fn thinking_control_for_request(
    config: &Config,
    class: ClassId,
    args_json: &str,
    max_tokens: Option<u32>,
) -> Result<ThinkingControl> {
    request_control(&parse_args(args_json)?, config.thinking_control_for(class), max_tokens)
}

fn parse_args(args_json: &str) -> Result<Map<String, Value>> {
    serde_json::from_str(args_json)
        .map_err(|e| Error::argument("args_json", e, "must be a JSON object of request arguments"))
}

fn request_control(
    args: &Map<String, Value>,
    base: &ThinkingControl,
    max_tokens: Option<u32>,
) -> Result<ThinkingControl> {
    let thinking = thinking_text(present(args, THINKING_ARG))?;
    let budget = budget_tokens(present(args, THINKING_BUDGET_ARG))?;
    let effort = reasoning_effort(present(args, EFFORT_ARG))?;
    ThinkingControl::for_request(base, thinking.as_deref(), budget)?.with_reasoning_effort(effort, max_tokens)
}

fn reasoning_effort(value: Option<&Value>) -> Result<Option<ReasoningEffort>> {
    match value {
        None => Ok(None),
        Some(Value::String(text)) => ReasoningEffort::parse_arg(text).map(Some),
        Some(other) => Err(Error::request_args(
            EFFORT_ARG,
            format!("{} must be one of \"low\", \"medium\", \"high\"", shown(&other.to_string())),
        )),
    }
}

fn present<'a>(args: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    args.get(key).filter(|v| !v.is_null())
}

fn check_class(value: Option<&Value>, config: Option<&Config>) -> Result<()> {
    let name = match value {
        None => return Ok(()),
        Some(Value::String(name)) => name,
        Some(other) => {
            return Err(Error::request_args(
                CLASS_ARG,
                format!("{} must be a string naming an SLO class", shown(&other.to_string())),
            ))
        }
    };
    match config {
        Some(config) if config.class_by_name(name).is_none() => Err(Error::request_args(
            CLASS_ARG,
            format!("unknown SLO class `{}`; configured classes: {}", shown(name), config.class_names()),
        )),
        _ => Ok(()),
    }
}

fn thinking_text(value: Option<&Value>) -> Result<Option<String>> {
    match value {
        None => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        // Request arguments given directly (vLLM's offline API) may carry the object itself.
        Some(object @ Value::Object(_)) => Ok(Some(object.to_string())),
        Some(other) => Err(Error::request_args(
            THINKING_ARG,
            format!(
                "{} must be \"off\" or a JSON object with the keys of thinking_control",
                shown(&other.to_string())
            ),
        )),
    }
}

fn budget_tokens(value: Option<&Value>) -> Result<Option<i64>> {
    match value {
        None => Ok(None),
        // In range of i64: `ThinkingControl::for_request` checks the range and names it.
        Some(Value::Number(n)) if n.as_i64().is_some() => Ok(n.as_i64()),
        Some(other) => Err(Error::request_args(
            THINKING_BUDGET_ARG,
            format!("{} must be a whole number of tokens from 1 to {}", shown(&other.to_string()), u32::MAX),
        )),
    }
}

/// The wait a request reports ([`WAITED_ARG`]): 0 when absent.
pub fn waited_ms(value: Option<&Value>) -> Result<f64> {
    match value {
        None => Ok(0.0),
        Some(Value::Number(n)) => check_waited_ms(n.as_f64().unwrap_or(f64::NAN)),
        Some(other) => Err(Error::request_args(
            WAITED_ARG,
            format!(
                "{} must be a number of milliseconds from 0 to {MAX_WAITED_MS}",
                shown(&other.to_string())
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(args: Value, config: Option<&Config>) -> Result<()> {
        check_request_args(&args.to_string(), config, None, 0)
    }

    /// The argument a rejection names.
    fn named(err: Error) -> String {
        match err {
            Error::InvalidRequestArgs { key, .. } => key,
            other => panic!("expected InvalidRequestArgs, got {other}"),
        }
    }

    fn gold_config() -> Config {
        let classes = r#"{"classes": {"gold": {"ttft_ms": 500, "ttfat_ms": 5000, "answer_tpot_ms": 40, "rank": 0}},
                          "default_class": "gold", "priority_map": {"0": "gold"}}"#;
        Config::from_json(classes).unwrap()
    }

    #[test]
    fn absent_null_and_foreign_arguments_pass() {
        let config = Config::default();
        check(serde_json::json!({}), Some(&config)).unwrap();
        check(serde_json::json!({"kv_transfer_params": {"x": 1}, "other": [1, 2]}), Some(&config)).unwrap();
        let nulls = serde_json::json!({CLASS_ARG: null, THINKING_ARG: null, THINKING_BUDGET_ARG: null, WAITED_ARG: null});
        check(nulls, Some(&config)).unwrap();
    }

    #[test]
    fn a_class_must_be_configured_when_the_configuration_is_known() {
        let config = gold_config();
        check(serde_json::json!({CLASS_ARG: "gold"}), Some(&config)).unwrap();
        let err = check(serde_json::json!({CLASS_ARG: "standard"}), Some(&config)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid request argument `meridian_class`: unknown SLO class `standard`; configured classes: gold"
        );
        // The defaults know `standard` but not `gold`: the check is against the configuration given.
        check(serde_json::json!({CLASS_ARG: "standard"}), Some(&Config::default())).unwrap();
        assert_eq!(
            named(check(serde_json::json!({CLASS_ARG: "gold"}), Some(&Config::default())).unwrap_err()),
            CLASS_ARG
        );
    }

    #[test]
    fn a_hostile_value_is_shown_cut_short_in_the_rejection() {
        let config = gold_config();
        let long_name = "é".repeat(100_000);
        let long_list = serde_json::json!(vec![7; 100_000]);
        for (args, key) in [
            (serde_json::json!({CLASS_ARG: long_name}), CLASS_ARG),
            (serde_json::json!({CLASS_ARG: long_list.clone()}), CLASS_ARG),
            (serde_json::json!({THINKING_ARG: long_list.clone()}), THINKING_ARG),
            (serde_json::json!({THINKING_BUDGET_ARG: long_list}), THINKING_BUDGET_ARG),
        ] {
            let err = check(args, Some(&config)).unwrap_err();
            let message = err.to_string();
            assert!(message.len() < 400, "{} bytes: {}", message.len(), &message[..400]);
            assert!(message.contains(" bytes)"), "{message}");
            assert_eq!(named(err), key);
        }
    }

    #[test]
    fn without_a_configuration_only_the_class_type_is_checked() {
        check(serde_json::json!({CLASS_ARG: "anything"}), None).unwrap();
        for bad in [serde_json::json!(3), serde_json::json!(true), serde_json::json!(["gold"])] {
            let err = check(serde_json::json!({CLASS_ARG: bad}), None).unwrap_err();
            assert_eq!(named(err.clone()), CLASS_ARG, "{err}");
            assert!(err.to_string().contains("must be a string"), "{err}");
        }
    }

    #[test]
    fn thinking_arguments_are_checked_like_the_control_they_make() {
        let ok = [
            serde_json::json!({THINKING_ARG: "off"}),
            serde_json::json!({THINKING_ARG: r#"{"eat": {}}"#}),
            serde_json::json!({THINKING_ARG: {"eat": {"min_lines": 3}}}),
            serde_json::json!({THINKING_BUDGET_ARG: 1}),
            serde_json::json!({THINKING_BUDGET_ARG: u32::MAX}),
        ];
        for args in ok {
            check(args.clone(), None).unwrap_or_else(|e| panic!("{args}: {e}"));
        }
        let bad = [
            (serde_json::json!({THINKING_ARG: "on"}), THINKING_ARG),
            (serde_json::json!({THINKING_ARG: 3}), THINKING_ARG),
            (serde_json::json!({THINKING_ARG: {"eat": {"alpha": 3}}}), "meridian_thinking.eat.alpha"),
            (serde_json::json!({THINKING_BUDGET_ARG: 0}), THINKING_BUDGET_ARG),
            (serde_json::json!({THINKING_BUDGET_ARG: -5}), THINKING_BUDGET_ARG),
            (serde_json::json!({THINKING_BUDGET_ARG: u64::from(u32::MAX) + 1}), THINKING_BUDGET_ARG),
            (serde_json::json!({THINKING_BUDGET_ARG: u64::MAX}), THINKING_BUDGET_ARG),
            (serde_json::json!({THINKING_BUDGET_ARG: 12.5}), THINKING_BUDGET_ARG),
            (serde_json::json!({THINKING_BUDGET_ARG: 12.0}), THINKING_BUDGET_ARG),
            (serde_json::json!({THINKING_BUDGET_ARG: "12"}), THINKING_BUDGET_ARG),
            (serde_json::json!({THINKING_BUDGET_ARG: true}), THINKING_BUDGET_ARG),
        ];
        for (args, key) in bad {
            let err = check(args.clone(), Some(&Config::default())).unwrap_err();
            assert_eq!(named(err), key, "{args}");
        }
        let err = check(serde_json::json!({THINKING_BUDGET_ARG: -5}), None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid request argument `meridian_thinking_budget_tokens`: -5 must be a whole number of tokens from 1 to 4294967295"
        );
    }

    #[test]
    fn a_reported_wait_is_a_bounded_number_of_milliseconds() {
        for ok in [serde_json::json!(0), serde_json::json!(1234.5), serde_json::json!(MAX_WAITED_MS)] {
            check(serde_json::json!({WAITED_ARG: ok}), None).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            serde_json::json!(-1),
            serde_json::json!(MAX_WAITED_MS + 1.0),
            serde_json::json!("100"),
            serde_json::json!(true),
            serde_json::json!([100]),
        ] {
            let err = check(serde_json::json!({WAITED_ARG: bad}), None).unwrap_err();
            assert!(err.to_string().contains("milliseconds"), "{err}");
            assert_eq!(named(err), WAITED_ARG, "{bad}");
        }
        assert!(check_waited_ms(f64::NAN).is_err() && check_waited_ms(f64::INFINITY).is_err());
    }

    #[test]
    fn the_first_bad_argument_is_named_class_first() {
        let args = serde_json::json!({CLASS_ARG: "gold", THINKING_BUDGET_ARG: -1});
        assert_eq!(named(check(args.clone(), Some(&Config::default())).unwrap_err()), CLASS_ARG);
        assert_eq!(named(check(args, None).unwrap_err()), THINKING_BUDGET_ARG);
    }

    #[test]
    fn arguments_that_are_not_a_json_object_are_the_callers_fault() {
        for text in ["[1]", "3", "{not json"] {
            let err = check_request_args(text, None, None, 0).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { name: "args_json", .. }), "{text}: {err}");
        }
    }

    #[test]
    fn a_bad_reasoning_effort_is_named() {
        for bad in [serde_json::json!("extreme"), serde_json::json!(3), serde_json::json!({"low": 1})] {
            let err = check(serde_json::json!({EFFORT_ARG: bad}), None).unwrap_err();
            assert_eq!(named(err), EFFORT_ARG, "{bad}");
        }
        check(serde_json::json!({EFFORT_ARG: "high"}), None).unwrap();
    }

    #[test]
    fn an_effort_that_leaves_no_answer_room_is_refused_by_the_class_budgets() {
        let config = Config::from_json(
            r#"{"classes": {
                  "gold": {"ttft_ms": 500, "ttfat_ms": 5000, "answer_tpot_ms": 40, "rank": 0},
                  "bulk": {"ttft_ms": 5000, "ttfat_ms": 50000, "answer_tpot_ms": 400, "rank": 1,
                           "thinking_control": {"reasoning_effort": {"answer_room_tokens": 64}}}},
                "default_class": "gold", "priority_map": {"0": "gold", "10": "bulk"}}"#,
        )
        .unwrap();
        let args = |class: Option<&str>| match class {
            Some(class) => serde_json::json!({EFFORT_ARG: "low", CLASS_ARG: class}).to_string(),
            None => serde_json::json!({EFFORT_ARG: "low"}).to_string(),
        };
        // gold keeps the default room (512), bulk its own (64); the priority picks bulk.
        let err = check_request_args(&args(Some("gold")), Some(&config), Some(100), 0).unwrap_err();
        assert!(err.to_string().contains("max_tokens is 100"), "{err}");
        check_request_args(&args(Some("bulk")), Some(&config), Some(100), 0).unwrap();
        check_request_args(&args(None), Some(&config), Some(100), 10).unwrap();
        assert!(check_request_args(&args(None), Some(&config), Some(100), 0).is_err());
        check_request_args(&args(Some("gold")), Some(&config), None, 0).unwrap();
        let bulk = config.class_by_name("bulk").unwrap();
        let control = thinking_control_for_request(&config, bulk, &args(None), Some(100)).unwrap();
        assert_eq!(control.budget_tokens, Some(36));
        let with_budget = serde_json::json!({EFFORT_ARG: "high", THINKING_BUDGET_ARG: 10}).to_string();
        let control = thinking_control_for_request(&config, bulk, &with_budget, None).unwrap();
        assert_eq!(control.budget_tokens, Some(10), "the tighter budget wins");
    }
}
