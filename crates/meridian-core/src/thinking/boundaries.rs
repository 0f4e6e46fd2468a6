//! Where a reasoning token ends, in the decoded text: a line (the EAT probe point) or a sentence
//! (the budget rules end thinking only there). Matched over text, not token ids, because the same
//! words tokenize differently from model to model; the markers are configured per class. Invariant:
//! a marker split across two tokens is found once, on the second, and no marker is longer than the
//! text kept between tokens ([`MAX_BOUNDARY_MARKER_CHARS`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

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

    pub(super) fn validate(&self, prefix: &str) -> Result<()> {
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
