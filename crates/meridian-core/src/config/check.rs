//! The range checks the key table names (`key: f64 = 2.5 => at_least_one`). Each takes the key's
//! dotted path and the value and returns the value, or an [`Error::InvalidConfig`] naming the key
//! and saying what the value is not; the message texts are part of the interface (operators and
//! the tests read them), so a check's wording changes only with intent. Non-finite numbers fail
//! every numeric check.

use crate::error::{Error, Result};
use crate::thinking::ThinkingControl;

use super::SHED_STATUSES;

/// No check: every value of the type is valid.
pub(super) fn accept<T>(_key: &str, v: T) -> Result<T> {
    Ok(v)
}

/// `> 0`.
pub(super) fn positive(key: &str, v: f64) -> Result<f64> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(Error::config(key, format!("{v} is not a positive number")))
    }
}

/// `≥ 0`.
pub(super) fn non_negative(key: &str, v: f64) -> Result<f64> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(Error::config(key, format!("{v} is not a non-negative number")))
    }
}

/// `≥ 1`.
pub(super) fn at_least_one(key: &str, v: f64) -> Result<f64> {
    if v.is_finite() && v >= 1.0 {
        Ok(v)
    } else {
        Err(Error::config(key, format!("{v} must be a number ≥ 1")))
    }
}

/// `(0, 1]`.
pub(super) fn in_unit_interval(key: &str, v: f64) -> Result<f64> {
    if v.is_finite() && v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err(Error::config(key, format!("{v} is not in (0, 1]")))
    }
}

/// `(0, 1)`: a probability that is neither never nor always.
pub(super) fn open_unit_interval(key: &str, v: f64) -> Result<f64> {
    if v.is_finite() && v > 0.0 && v < 1.0 {
        Ok(v)
    } else {
        Err(Error::config(key, format!("{v} is not in (0, 1)")))
    }
}

/// `[0, 1]`.
pub(super) fn fraction(key: &str, v: f64) -> Result<f64> {
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(Error::config(key, format!("{v} is not in [0, 1]")))
    }
}

/// `(0.5, 1]`: a forgetting factor that keeps more than half of the past each step.
pub(super) fn forgetting(key: &str, v: f64) -> Result<f64> {
    if v > 0.5 && v <= 1.0 {
        Ok(v)
    } else {
        Err(Error::config(key, format!("{v} is not in (0.5, 1]")))
    }
}

/// `≥ 1`, for a count.
pub(super) fn positive_u32(key: &str, v: u32) -> Result<u32> {
    if v > 0 {
        Ok(v)
    } else {
        Err(Error::config(key, "must be at least 1"))
    }
}

/// One of [`SHED_STATUSES`].
pub(super) fn shed_status(key: &str, status: u16) -> Result<u16> {
    if SHED_STATUSES.contains(&status) {
        Ok(status)
    } else {
        Err(Error::config(key, format!("{status} is not one of 429, 503")))
    }
}

/// A sample of lengths: at least one, each at least one token.
pub(super) fn length_sample(key: &str, v: Vec<u32>) -> Result<Vec<u32>> {
    if v.is_empty() {
        Err(Error::config(key, "must list at least one length"))
    } else if v.contains(&0) {
        Err(Error::config(key, "lengths must be at least 1 token"))
    } else {
        Ok(v)
    }
}

/// A file path: an empty string is a mistake, not "no file" (leave the key out for that).
pub(super) fn file_path(key: &str, path: String) -> Result<String> {
    if path.trim().is_empty() {
        Err(Error::config(key, "must be a file path, not an empty string"))
    } else {
        Ok(path)
    }
}

/// A thinking control, its rules checked under `key` (`thinking_control.eat.alpha`).
pub(super) fn thinking_rules(key: &str, control: ThinkingControl) -> Result<ThinkingControl> {
    control.validate(key)?;
    Ok(control)
}
