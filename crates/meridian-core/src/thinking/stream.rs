//! One request's thinking control as the logits processor sees it, token by token: where the
//! request is (before its reasoning, thinking, forcing the end, answering), which token it must
//! emit next, when an EAT probe is due, and the rule that ended its reasoning. It wraps a
//! [`ThinkingState`] with the marker matching and the forced sequence (closing text, then the
//! model's end marker), so the processor only measures signals and masks logits. Invariant: the
//! forced sequence starts only after a rule fired while thinking, is emitted in order exactly
//! once, and a request whose reasoning ended on its own is never forced.

use super::boundaries::{char_suffix, Boundary, MAX_BOUNDARY_MARKER_CHARS};
use super::control::ThinkingControl;
use super::state::{StopReason, ThinkingState};
use crate::error::{Error, Result};
use crate::phase::SequenceMatcher;

/// Where a request's reasoning stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamPhase {
    /// The reasoning has not started (the prompt did not open it and the model has not yet).
    BeforeThinking,
    /// Inside the reasoning; every token is a thinking token.
    Thinking,
    /// A rule fired; the next token is `forced_ids[next]`.
    Forcing {
        /// Index of the next forced token.
        next: usize,
    },
    /// The reasoning is over (ended by the model or by forcing); nothing more to do.
    Answering,
}

impl StreamPhase {
    /// Stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamPhase::BeforeThinking => "before_thinking",
            StreamPhase::Thinking => "thinking",
            StreamPhase::Forcing { .. } => "forcing",
            StreamPhase::Answering => "answering",
        }
    }
}

/// The signals measured on the distribution a token was sampled from (each `None` when not
/// computed).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TokenSignals {
    /// Entropy in nats.
    pub entropy_nats: Option<f32>,
    /// Probability of the (first) reasoning-end token.
    pub end_prob: Option<f32>,
    /// Rank of the (first) reasoning-end token: tokens with a strictly larger logit.
    pub end_rank: Option<u32>,
}

/// One request's thinking control, fed each sampled token in order. See the module docs.
#[derive(Debug, Clone, PartialEq)]
pub struct ThinkingStream {
    control: ThinkingControl,
    state: ThinkingState,
    /// The reasoning markers, matched as the phase tracker matches them (a marker split over
    /// tokens or steps is still seen), and each one's progress through the output so far.
    start: SequenceMatcher,
    end: SequenceMatcher,
    start_state: u16,
    end_state: u16,
    forced_ids: Vec<u32>,
    phase: StreamPhase,
    /// Last characters of the reasoning text, to find a line marker split over tokens.
    text_tail: String,
    probe_due: bool,
    num_forced_tokens: u32,
    num_mismatched_forced: u32,
}

impl ThinkingStream {
    /// A stream for a request with `prompt_token_ids`, under `control`. `start_ids`/`end_ids`
    /// are the model's reasoning markers (`start_ids` empty: the reasoning starts with the
    /// output); `forced_ids` is what a firing rule forces (the closing text's tokens, then the
    /// end marker's). The request is thinking from the start when the prompt opens the
    /// reasoning and does not close it (a chat template that ends with `<think>`).
    pub fn new(
        control: ThinkingControl,
        prompt_token_ids: &[u32],
        start_ids: Vec<u32>,
        end_ids: Vec<u32>,
        forced_ids: Vec<u32>,
    ) -> Result<Self> {
        if end_ids.is_empty() {
            return Err(Error::argument(
                "end_ids",
                "[]",
                "thinking control needs the model's reasoning-end marker",
            ));
        }
        if forced_ids.is_empty() {
            return Err(Error::argument(
                "forced_ids",
                "[]",
                "the forced sequence must end with the end marker",
            ));
        }
        let (start, end) = (SequenceMatcher::new(start_ids), SequenceMatcher::new(end_ids));
        let phase = if start.is_empty() || prompt_opens_reasoning(prompt_token_ids, &start, &end) {
            StreamPhase::Thinking
        } else {
            StreamPhase::BeforeThinking
        };
        Ok(Self {
            control,
            state: ThinkingState::new(),
            start,
            end,
            start_state: 0,
            end_state: 0,
            forced_ids,
            phase,
            text_tail: String::new(),
            probe_due: false,
            num_forced_tokens: 0,
            num_mismatched_forced: 0,
        })
    }

    /// The token the request must emit next, while forcing.
    pub fn forced_token(&self) -> Option<u32> {
        match self.phase {
            StreamPhase::Forcing { next } => self.forced_ids.get(next).copied(),
            _ => None,
        }
    }

    /// Whether the signals of the next token's distribution are needed (the request is thinking
    /// and a signal rule is on).
    pub fn wants_signals(&self) -> bool {
        self.phase == StreamPhase::Thinking
            && (self.control.wants_token_entropy() || self.control.wants_end_token_stats())
    }

    /// One sampled token, its text (as the tokenizer decodes it alone) and the signals of the
    /// distribution it came from. Returns the rule that fired on it, if any; from the next token
    /// on, [`Self::forced_token`] names what to emit.
    pub fn on_token(&mut self, token_id: u32, token_text: &str, signals: TokenSignals) -> Option<StopReason> {
        let (opened, closed) = self.match_markers(token_id);
        match self.phase {
            StreamPhase::BeforeThinking => {
                if opened {
                    self.phase = StreamPhase::Thinking;
                }
                None
            }
            StreamPhase::Thinking => self.on_thinking_token(closed, token_text, signals),
            StreamPhase::Forcing { next } => {
                self.on_forcing_token(next, token_id, closed);
                None
            }
            StreamPhase::Answering => None,
        }
    }

    /// Feeds the token to both marker matchers, whatever the phase (a marker may begin before
    /// the phase that looks for it): whether it completed the start marker, and the end marker.
    fn match_markers(&mut self, token_id: u32) -> (bool, bool) {
        let (start_state, opened) = self.start.advance(self.start_state, token_id);
        let (end_state, closed) = self.end.advance(self.end_state, token_id);
        (self.start_state, self.end_state) = (start_state, end_state);
        (opened, closed)
    }

    fn on_thinking_token(
        &mut self,
        closed: bool,
        token_text: &str,
        signals: TokenSignals,
    ) -> Option<StopReason> {
        if closed {
            // The model closed its reasoning itself.
            self.phase = StreamPhase::Answering;
            self.probe_due = false;
            return None;
        }
        let boundary = self.control.boundaries.boundary_of(&self.text_tail, token_text);
        self.text_tail.push_str(token_text);
        let keep = char_suffix(&self.text_tail, MAX_BOUNDARY_MARKER_CHARS).len();
        self.text_tail.drain(..self.text_tail.len() - keep);
        let fired = self.state.on_think_token(
            &self.control,
            signals.entropy_nats,
            signals.end_prob,
            signals.end_rank,
            boundary,
        );
        if fired.is_some() {
            self.start_forcing();
        } else if boundary == Boundary::Line && self.control.wants_eat_probes() {
            self.probe_due = true;
        }
        fired
    }

    fn on_forcing_token(&mut self, next: usize, token_id: u32, closed: bool) {
        if self.forced_ids.get(next) == Some(&token_id) {
            self.num_forced_tokens = self.num_forced_tokens.saturating_add(1);
            self.phase = if next + 1 >= self.forced_ids.len() {
                StreamPhase::Answering
            } else {
                StreamPhase::Forcing { next: next + 1 }
            };
        } else if closed {
            // Something later in the sampler overrode the mask, but the reasoning ended anyway.
            self.phase = StreamPhase::Answering;
        } else {
            // Overridden (e.g. by a later logits processor): force the same token again.
            self.num_mismatched_forced = self.num_mismatched_forced.saturating_add(1);
        }
    }

    fn start_forcing(&mut self) {
        self.phase = StreamPhase::Forcing { next: 0 };
        self.probe_due = false;
    }

    /// The scheduler ends the reasoning now, to answer by the TTFAT deadline (`on_overload:
    /// degrade`): the forced sequence starts with the next token. `None` (and no change) unless
    /// the request is thinking and no rule fired yet.
    pub fn end_for_overload(&mut self) -> Option<StopReason> {
        if self.phase != StreamPhase::Thinking {
            return None;
        }
        let fired = self.state.stop_for_overload();
        if fired.is_some() {
            self.start_forcing();
        }
        fired
    }

    /// Whether an EAT probe is due (a reasoning line just ended); clears the flag.
    pub fn take_probe_due(&mut self) -> bool {
        std::mem::take(&mut self.probe_due)
    }

    /// The result of an EAT probe. Ignored unless the request is still thinking (a probe that
    /// returns after the reasoning ended is late, not wrong).
    pub fn on_eat_probe(&mut self, eat_entropy_nats: f32) -> Option<StopReason> {
        if self.phase != StreamPhase::Thinking {
            return None;
        }
        let fired = self.state.on_eat_probe(&self.control, eat_entropy_nats);
        if fired.is_some() {
            self.start_forcing();
        }
        fired
    }

    /// Sets the request's class TTFAT attainment (load-aware budget); see
    /// [`ThinkingState::set_ttfat_attainment`].
    pub fn set_ttfat_attainment(&mut self, attainment: f64) {
        self.state.set_ttfat_attainment(attainment);
    }

    /// Where the request stands.
    pub fn phase(&self) -> StreamPhase {
        self.phase
    }

    /// The control in force.
    pub fn control(&self) -> &ThinkingControl {
        &self.control
    }

    /// The decision state (signals, firing, ignored inputs).
    pub fn state(&self) -> &ThinkingState {
        &self.state
    }

    /// Forced tokens emitted so far.
    pub fn num_forced_tokens(&self) -> u32 {
        self.num_forced_tokens
    }

    /// Forced positions where a different token came out (then forced again).
    pub fn num_mismatched_forced(&self) -> u32 {
        self.num_mismatched_forced
    }
}

/// Whether the prompt's last reasoning-start marker ends after its last end marker.
fn prompt_opens_reasoning(prompt: &[u32], start: &SequenceMatcher, end: &SequenceMatcher) -> bool {
    match start.last_end_in(prompt) {
        Some(start) => end.last_end_in(prompt).is_none_or(|end| start > end),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::thinking::Boundaries;

    const START: u32 = 1;
    const END: u32 = 2;
    const CLOSE: u32 = 3;
    const WORD: u32 = 10;

    fn control(json: &str) -> ThinkingControl {
        ThinkingControl::for_request(&ThinkingControl::default(), Some(json), None).unwrap()
    }

    fn stream(json: &str, prompt: &[u32]) -> ThinkingStream {
        ThinkingStream::new(control(json), prompt, vec![START], vec![END], vec![CLOSE, END]).unwrap()
    }

    fn word(s: &mut ThinkingStream) -> Option<StopReason> {
        s.on_token(WORD, " w", TokenSignals::default())
    }

    #[test]
    fn a_prompt_that_opens_the_reasoning_starts_thinking() {
        assert_eq!(stream("{}", &[7, START]).phase(), StreamPhase::Thinking);
        assert_eq!(stream("{}", &[START, 5, END, 6]).phase(), StreamPhase::BeforeThinking);
        assert_eq!(stream("{}", &[START, END, START, 9]).phase(), StreamPhase::Thinking);
        assert_eq!(stream("{}", &[7]).phase(), StreamPhase::BeforeThinking);
    }

    #[test]
    fn the_model_opening_its_reasoning_starts_thinking() {
        let mut s = stream(r#"{"budget_tokens": 2}"#, &[7]);
        assert_eq!(word(&mut s), None, "not thinking yet: the budget does not count it");
        s.on_token(START, "<think>", TokenSignals::default());
        assert_eq!(s.phase(), StreamPhase::Thinking);
        assert_eq!(word(&mut s), None);
        assert_eq!(word(&mut s), Some(StopReason::Budget));
    }

    #[test]
    fn a_budget_forces_the_closing_text_then_the_marker_once() {
        let mut s = stream(r#"{"budget_tokens": 3}"#, &[START]);
        assert_eq!(word(&mut s), None);
        assert_eq!(word(&mut s), None);
        assert_eq!(s.forced_token(), None);
        assert_eq!(word(&mut s), Some(StopReason::Budget));
        assert_eq!(s.state().fired().unwrap().num_think_tokens, 3);
        assert_eq!(s.forced_token(), Some(CLOSE));
        s.on_token(CLOSE, " so", TokenSignals::default());
        assert_eq!(s.forced_token(), Some(END));
        s.on_token(END, "</think>", TokenSignals::default());
        assert_eq!(s.phase(), StreamPhase::Answering);
        assert_eq!(s.forced_token(), None);
        assert_eq!(s.num_forced_tokens(), 2);
        assert_eq!(word(&mut s), None);
        assert_eq!(s.state().num_think_tokens(), 3, "answer tokens are not thinking");
    }

    #[test]
    fn an_overridden_forced_token_is_forced_again() {
        let mut s = stream(r#"{"budget_tokens": 1}"#, &[START]);
        word(&mut s);
        word(&mut s);
        assert_eq!(s.forced_token(), Some(CLOSE));
        assert_eq!(s.num_mismatched_forced(), 1);
    }

    #[test]
    fn a_natural_end_is_never_forced() {
        let mut s = stream(r#"{"budget_tokens": 3}"#, &[START]);
        word(&mut s);
        s.on_token(END, "</think>", TokenSignals::default());
        assert_eq!(s.phase(), StreamPhase::Answering);
        for _ in 0..10 {
            assert_eq!(word(&mut s), None);
        }
        assert_eq!(s.forced_token(), None);
        assert_eq!(s.state().fired(), None);
    }

    #[test]
    fn a_multi_token_end_marker_is_matched_across_tokens() {
        let control = control(r#"{"budget_tokens": 50}"#);
        let mut s = ThinkingStream::new(control, &[START], vec![START], vec![8, 9], vec![8, 9]).unwrap();
        s.on_token(8, "</", TokenSignals::default());
        assert_eq!(s.phase(), StreamPhase::Thinking);
        s.on_token(9, "think>", TokenSignals::default());
        assert_eq!(s.phase(), StreamPhase::Answering);
    }

    #[test]
    fn eat_probes_are_due_at_line_ends_only() {
        let mut s = stream(r#"{"eat": {"min_lines": 2}}"#, &[START]);
        s.on_token(WORD, "first.", TokenSignals::default());
        assert!(!s.take_probe_due(), "a sentence is not a line");
        s.on_token(WORD, "\n", TokenSignals::default());
        s.on_token(WORD, "\n", TokenSignals::default());
        assert!(s.take_probe_due(), "a line marker split over two tokens");
        assert!(!s.take_probe_due(), "taken once");
        assert_eq!(s.on_eat_probe(1.0), None);
        assert_eq!(s.on_eat_probe(1.0), Some(StopReason::Eat), "two equal probes: variance 0");
        assert_eq!(s.forced_token(), Some(CLOSE));
        assert_eq!(s.on_eat_probe(1.0), None, "late probes change nothing");
    }

    #[test]
    fn configured_boundaries_replace_the_defaults() {
        let mut s =
            stream(r#"{"eat": {}, "boundaries": {"line_end": ["hmm"], "sentence_end": []}}"#, &[START]);
        s.on_token(WORD, "\n\n", TokenSignals::default());
        assert!(!s.take_probe_due());
        s.on_token(WORD, "hmm", TokenSignals::default());
        assert!(s.take_probe_due());
    }

    #[test]
    fn boundary_of_finds_markers_once() {
        let b = Boundaries::default();
        assert_eq!(b.boundary_of("", "Done."), Boundary::Sentence);
        assert_eq!(b.boundary_of("", "Done. "), Boundary::Sentence);
        assert_eq!(b.boundary_of("abc", " so"), Boundary::None);
        assert_eq!(b.boundary_of("x\n\n", "next"), Boundary::None, "the marker ended before this token");
        assert_eq!(b.boundary_of("x\n", "\nnext"), Boundary::Line);
        assert_eq!(b.boundary_of("", "ok\u{3002}"), Boundary::Sentence);
        assert_eq!(b.boundary_of("\n", ""), Boundary::None);
    }

    #[test]
    fn signals_are_wanted_only_while_thinking_with_a_signal_rule() {
        assert!(!stream(r#"{"budget_tokens": 9}"#, &[START]).wants_signals());
        let mut s = stream(r#"{"rpdi": {}}"#, &[7]);
        assert!(!s.wants_signals(), "not thinking yet");
        s.on_token(START, "<think>", TokenSignals::default());
        assert!(s.wants_signals());
        assert!(stream(r#"{"proxy": {}}"#, &[START]).wants_signals());
    }

    #[test]
    fn missing_markers_are_errors() {
        let err = ThinkingStream::new(control("{}"), &[], vec![], vec![], vec![2]).unwrap_err();
        assert!(err.to_string().contains("end_ids"), "{err}");
        let err = ThinkingStream::new(control("{}"), &[], vec![], vec![2], vec![]).unwrap_err();
        assert!(err.to_string().contains("forced_ids"), "{err}");
    }

    #[test]
    fn request_arguments_are_validated_with_their_names() {
        let base = ThinkingControl::default();
        let err = ThinkingControl::for_request(&base, Some(r#"{"eat": {"alpha": 2}}"#), None).unwrap_err();
        assert!(err.to_string().contains("meridian_thinking.eat.alpha"), "{err}");
        assert!(matches!(err, Error::InvalidRequestArgs { .. }));
        let err = ThinkingControl::for_request(&base, Some(r#"{"budget": 3}"#), None).unwrap_err();
        assert!(err.to_string().contains("meridian_thinking") && err.to_string().contains("budget"), "{err}");
        let err = ThinkingControl::for_request(&base, Some("on"), None).unwrap_err();
        assert!(err.to_string().contains("\"off\""), "{err}");
        let err = ThinkingControl::for_request(&base, None, Some(0)).unwrap_err();
        assert!(err.to_string().contains("meridian_thinking_budget_tokens"), "{err}");
        let err = ThinkingControl::for_request(&base, None, Some(-5)).unwrap_err();
        assert!(err.to_string().contains("-5"), "{err}");
        let budgeted = control(r#"{"rpdi": {}}"#);
        let off = ThinkingControl::for_request(&budgeted, Some("off"), None).unwrap();
        assert!(!off.is_enabled());
        let both = ThinkingControl::for_request(&budgeted, None, Some(64)).unwrap();
        assert!(both.rpdi.is_some() && both.budget_tokens == Some(64));
    }

    proptest! {
        /// Multi-token markers, split anywhere across tokens and overlapping themselves: the
        /// reasoning opens at the first output ending with the start marker and closes at the
        /// first output after that ending with the end marker, or at once when the prompt's last
        /// start marker ends after its last end marker.
        #[test]
        fn markers_are_seen_wherever_they_are_split(
            start_ids in proptest::collection::vec(0u32..3, 1..4),
            end_ids in proptest::collection::vec(0u32..3, 1..4),
            prompt in proptest::collection::vec(0u32..3, 0..12),
            output in proptest::collection::vec(0u32..3, 0..60),
        ) {
            let mut s = ThinkingStream::new(control("{}"), &prompt, start_ids.clone(), end_ids.clone(), end_ids.clone())
                .unwrap();
            let last_end_of = |tokens: &[u32], marker: &[u32]| {
                (marker.len()..=tokens.len()).rev().find(|&e| tokens[..e].ends_with(marker))
            };
            let opens = last_end_of(&prompt, &start_ids)
                .is_some_and(|start| last_end_of(&prompt, &end_ids).is_none_or(|end| start > end));
            let mut expected = if opens { StreamPhase::Thinking } else { StreamPhase::BeforeThinking };
            prop_assert_eq!(s.phase(), expected);
            for i in 0..output.len() {
                s.on_token(output[i], " w", TokenSignals::default());
                let seen = &output[..=i];
                expected = match expected {
                    StreamPhase::BeforeThinking if seen.ends_with(&start_ids) => StreamPhase::Thinking,
                    StreamPhase::Thinking if seen.ends_with(&end_ids) => StreamPhase::Answering,
                    other => other,
                };
                prop_assert_eq!(s.phase(), expected, "after {:?}", seen);
            }
        }

        /// Whatever the token sequence and signals, forcing happens at most once, in order, and
        /// only after a firing; a natural end is never followed by forcing.
        #[test]
        fn forcing_is_once_and_in_order(
            tokens in proptest::collection::vec((0u32..6, proptest::option::of(-1.0f32..8.0)), 0..200),
            budget in 1u32..40,
        ) {
            let json = format!(r#"{{"budget_tokens": {budget}, "rpdi": {{"min_tokens": 4}}, "proxy": {{"min_tokens": 3}}}}"#);
            let mut s = stream(&json, &[START]);
            let mut forced_seen = Vec::new();
            let mut natural_end = false;
            for (id, entropy) in tokens {
                let token = s.forced_token().unwrap_or(id);
                let was = s.phase();
                let signals = TokenSignals { entropy_nats: entropy, end_prob: entropy.map(|e| e / 10.0), end_rank: None };
                s.on_token(token, if token == 4 { "\n\n" } else { " w" }, signals);
                if let StreamPhase::Forcing { .. } = was {
                    forced_seen.push(token);
                }
                if was == StreamPhase::Thinking && token == END && s.state().fired().is_none() {
                    natural_end = true;
                }
            }
            prop_assert!(forced_seen.len() <= 2);
            prop_assert_eq!(&forced_seen[..], &[CLOSE, END][..forced_seen.len()]);
            if natural_end {
                prop_assert!(forced_seen.is_empty());
            }
            if !forced_seen.is_empty() {
                prop_assert!(s.state().fired().unwrap().num_think_tokens <= budget);
            }
        }
    }
}
