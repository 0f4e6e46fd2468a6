//! The one error type of the core. Every fallible entry point returns [`Result`]; every message
//! names the offending value so an operator can fix the input without reading code. Nothing in
//! the core panics on caller input: bad input becomes one of these variants.

use thiserror::Error;

/// Everything that can go wrong when the caller hands the core bad input.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum Error {
    /// A configuration key or value is wrong; `key` is the dotted path to it.
    #[error("invalid meridian config `{key}`: {reason}")]
    InvalidConfig {
        /// Dotted path of the bad key, e.g. `classes.interactive.ttft_ms`.
        key: String,
        /// What is wrong with it and what is expected instead.
        reason: String,
    },
    /// A request names an SLO class that the configuration does not define.
    #[error("unknown SLO class `{name}` for request `{req_id}`; configured classes: {known}")]
    UnknownSloClass {
        /// The request that asked for it.
        req_id: String,
        /// The class name as given.
        name: String,
        /// Comma-separated configured class names.
        known: String,
    },
    /// A request id was added twice.
    #[error("request `{req_id}` is already tracked")]
    DuplicateRequest {
        /// The repeated id.
        req_id: String,
    },
    /// A handle does not refer to a live request (never added, or already released).
    #[error("unknown request handle {handle}")]
    UnknownRequest {
        /// The handle as the caller passed it.
        handle: u64,
    },
    /// A per-request or per-step argument is out of range.
    #[error("invalid argument `{name}` = {value}: {reason}")]
    InvalidArgument {
        /// The argument's name.
        name: &'static str,
        /// The value as given, rendered.
        value: String,
        /// What is expected.
        reason: &'static str,
    },
    /// A request's own arguments (`vllm_xargs` / `SamplingParams.extra_args`) are wrong; `key` is
    /// the argument, dotted into it for a JSON object (e.g. `meridian_thinking.eat.alpha`).
    #[error("invalid request argument `{key}`: {reason}")]
    InvalidRequestArgs {
        /// The argument, dotted into its JSON value where the fault lies.
        key: String,
        /// What is wrong with it and what is expected instead.
        reason: String,
    },
}

/// The core's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn config(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidConfig { key: key.into(), reason: reason.into() }
    }

    pub(crate) fn request_args(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidRequestArgs { key: key.into(), reason: reason.into() }
    }

    pub(crate) fn argument(name: &'static str, value: impl ToString, reason: &'static str) -> Self {
        Error::InvalidArgument { name, value: value.to_string(), reason }
    }
}

/// Longest rendering of a caller's value in an error message: a hostile request must not make
/// every log line and HTTP 400 carry a megabyte of its own text.
pub(crate) const MAX_SHOWN_VALUE_CHARS: usize = 80;

/// `value` as an error message shows it: whole when short, else its first
/// [`MAX_SHOWN_VALUE_CHARS`] characters and how long it was.
pub(crate) fn shown(value: &str) -> String {
    match value.char_indices().nth(MAX_SHOWN_VALUE_CHARS) {
        None => value.to_owned(),
        Some((cut, _)) => format!("{}… ({} bytes)", &value[..cut], value.len()),
    }
}

/// Rejects NaN, infinities and negative times, which would poison every ordering key.
pub(crate) fn check_time_ms(name: &'static str, value_ms: f64) -> Result<f64> {
    if value_ms.is_finite() && value_ms >= 0.0 {
        Ok(value_ms)
    } else {
        Err(Error::argument(name, value_ms, "must be a finite, non-negative number of milliseconds"))
    }
}
