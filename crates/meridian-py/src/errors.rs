//! Maps each `meridian_core::Error` variant onto its exception class. The classes are defined in
//! Python (`meridian/errors.py`) so they can also subclass `ValueError`/`KeyError`, which a single
//! `create_exception!` base cannot express; callers catch either the precise class or the builtin.

use meridian_core::Error;
use pyo3::import_exception;
use pyo3::PyErr;

import_exception!(meridian.errors, ConfigError);
import_exception!(meridian.errors, UnknownSloClassError);
import_exception!(meridian.errors, DuplicateRequestError);
import_exception!(meridian.errors, UnknownRequestError);
import_exception!(meridian.errors, InvalidArgumentError);
import_exception!(meridian.errors, RequestArgsError);

/// Converts a core error into the matching Python exception, message unchanged.
pub(crate) fn to_py(err: Error) -> PyErr {
    let msg = err.to_string();
    match err {
        Error::InvalidConfig { .. } => ConfigError::new_err(msg),
        Error::UnknownSloClass { .. } => UnknownSloClassError::new_err(msg),
        Error::DuplicateRequest { .. } => DuplicateRequestError::new_err(msg),
        Error::UnknownRequest { .. } => UnknownRequestError::new_err(msg),
        Error::InvalidArgument { .. } => InvalidArgumentError::new_err(msg),
        Error::InvalidRequestArgs { .. } => RequestArgsError::new_err(msg),
    }
}

/// A binding-level argument error (e.g. mismatched list lengths).
pub(crate) fn invalid_argument(msg: String) -> PyErr {
    InvalidArgumentError::new_err(msg)
}
