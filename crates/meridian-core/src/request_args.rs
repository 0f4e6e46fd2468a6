//! A request's own arguments for Meridian — [`CLASS_ARG`], [`THINKING_ARG`],
//! [`THINKING_BUDGET_ARG`] and [`WAITED_ARG`] in its `vllm_xargs` / `SamplingParams.extra_args`
//! — checked as the client sent them, before the request is admitted. One decision wherever it is made: in vLLM's
//! API server (where a failure becomes that request's HTTP 400) and in the scheduler (the last
//! line, for requests no front-end check saw). Every error is [`Error::InvalidRequestArgs`]
//! naming the argument.

use serde_json::{Map, Value};

use crate::error::{shown, Error, Result};
use crate::{Config, ThinkingControl, CLASS_ARG, THINKING_ARG, THINKING_BUDGET_ARG};

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
/// - [`WAITED_ARG`] must be a number of ms from 0 to [`MAX_WAITED_MS`].
///
/// `args_json` that is not a JSON object is the caller's fault, [`Error::InvalidArgument`].
pub fn check_request_args(args_json: &str, config: Option<&Config>) -> Result<()> {
    let args: Map<String, Value> = serde_json::from_str(args_json)
        .map_err(|e| Error::argument("args_json", e, "must be a JSON object of request arguments"))?;
    check_class(present(&args, CLASS_ARG), config)?;
    let thinking = thinking_text(present(&args, THINKING_ARG))?;
    let budget = budget_tokens(present(&args, THINKING_BUDGET_ARG))?;
    waited_ms(present(&args, WAITED_ARG))?;
    ThinkingControl::for_request(&ThinkingControl::default(), thinking.as_deref(), budget).map(drop)
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
        check_request_args(&args.to_string(), config)
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
            let err = check_request_args(text, None).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { name: "args_json", .. }), "{text}: {err}");
        }
    }
}
