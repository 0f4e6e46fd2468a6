//! Request phases and the token-driven tracker that moves a request through them. The reasoning
//! markers are token-id *sequences* (some models close reasoning with several tokens), matched
//! incrementally across steps with a KMP automaton, so a marker split over two engine steps is
//! still seen. Invariant: a tracker's phase only moves forward, `Prefill → Think → Answer → Done`
//! (non-reasoning requests skip `Think`).

/// Where a request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// No token generated yet (waiting, or prompt being computed).
    Prefill,
    /// Generating hidden reasoning tokens.
    Think,
    /// Generating the visible answer.
    Answer,
    /// Finished (any reason).
    Done,
}

/// What one observed output token was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// A reasoning token.
    Think,
    /// The token that completed the reasoning-end marker (still part of the hidden reasoning).
    ReasoningEnd,
    /// A visible answer token.
    Answer,
}

/// Incremental matcher of one token sequence (Knuth–Morris–Pratt failure table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceMatcher {
    pattern: Vec<u32>,
    failure: Vec<u16>,
}

impl SequenceMatcher {
    /// Builds a matcher; an empty pattern never matches.
    pub fn new(pattern: Vec<u32>) -> Self {
        let mut failure = vec![0u16; pattern.len()];
        let mut k = 0usize;
        for i in 1..pattern.len() {
            while k > 0 && pattern[i] != pattern[k] {
                k = usize::from(failure[k - 1]);
            }
            if pattern[i] == pattern[k] {
                k += 1;
            }
            failure[i] = k as u16;
        }
        Self { pattern, failure }
    }

    /// True when the pattern is empty (the marker is not configured).
    pub fn is_empty(&self) -> bool {
        self.pattern.is_empty()
    }

    /// Feeds one token; returns the new state and whether the pattern just completed.
    pub fn advance(&self, state: u16, token: u32) -> (u16, bool) {
        if self.pattern.is_empty() {
            return (0, false);
        }
        let mut k = usize::from(state);
        while k > 0 && self.pattern[k] != token {
            k = usize::from(self.failure[k - 1]);
        }
        if self.pattern[k] == token {
            k += 1;
        }
        if k == self.pattern.len() {
            (self.failure[k - 1], true)
        } else {
            (k as u16, false)
        }
    }

    /// Token index just past the last complete occurrence of the pattern in `tokens`.
    pub fn last_end_in(&self, tokens: &[u32]) -> Option<usize> {
        let mut state = 0;
        let mut last = None;
        for (i, &t) in tokens.iter().enumerate() {
            let (next, matched) = self.advance(state, t);
            state = next;
            if matched {
                last = Some(i + 1);
            }
        }
        last
    }
}

/// The model's reasoning markers as token ids (from vLLM's `ReasoningConfig`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReasoningMarkers {
    start: SequenceMatcher,
    end: SequenceMatcher,
    tool_calls: Vec<SequenceMatcher>,
}

impl ReasoningMarkers {
    /// Markers of a reasoning model. An empty `end` means the model does not reason: every
    /// request goes straight from prefill to answer.
    pub fn new(start: Vec<u32>, end: Vec<u32>, tool_calls: Vec<Vec<u32>>) -> Self {
        Self {
            start: SequenceMatcher::new(start),
            end: SequenceMatcher::new(end),
            tool_calls: tool_calls.into_iter().filter(|t| !t.is_empty()).map(SequenceMatcher::new).collect(),
        }
    }

    /// Markers of a model that does not reason.
    pub fn none() -> Self {
        Self::new(Vec::new(), Vec::new(), Vec::new())
    }

    /// Whether reasoning tracking is on.
    pub fn reasons(&self) -> bool {
        !self.end.is_empty()
    }

    /// Decides from the prompt whether generation starts in reasoning, and where the reasoning
    /// region starts (token index): the open start marker when the prompt holds one (chat
    /// templates that pre-open `<think>`), else the first generated token.
    pub fn classify_prompt(&self, prompt_token_ids: &[u32], num_prompt_tokens: u32) -> PromptReasoning {
        if !self.reasons() {
            return PromptReasoning { starts_thinking: false, reasoning_start: num_prompt_tokens };
        }
        let last_end = self.end.last_end_in(prompt_token_ids);
        let last_start_end = self.start.last_end_in(prompt_token_ids);
        let closed = match (last_end, last_start_end) {
            (Some(end), Some(start)) => end > start,
            (Some(_), None) => true,
            (None, _) => false,
        };
        let reasoning_start = match (closed, last_start_end) {
            (false, Some(after_start)) => (after_start - self.start.pattern.len()) as u32,
            _ => num_prompt_tokens,
        };
        PromptReasoning { starts_thinking: !closed, reasoning_start }
    }
}

/// What the prompt says about reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptReasoning {
    /// Generation starts inside a reasoning block.
    pub starts_thinking: bool,
    /// Token index where the request's never-reusable reasoning region begins.
    pub reasoning_start: u32,
}

/// Per-request phase state: current phase plus partial-marker match progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhaseTracker {
    phase: Phase,
    starts_thinking: bool,
    end_state: u16,
    tool_states: Vec<u16>,
    ended_in_tool_call: bool,
}

impl PhaseTracker {
    /// Bytes it owns on the heap (its tool-call matchers' states).
    pub fn heap_bytes(&self) -> usize {
        self.tool_states.capacity() * std::mem::size_of::<u16>()
    }

    /// A tracker for a request whose prompt was classified as `prompt`.
    pub fn new(markers: &ReasoningMarkers, prompt: PromptReasoning) -> Self {
        Self {
            phase: Phase::Prefill,
            starts_thinking: prompt.starts_thinking,
            end_state: 0,
            tool_states: vec![0; markers.tool_calls.len()],
            ended_in_tool_call: false,
        }
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Whether the request produced a tool-call marker in its visible output.
    pub fn ended_in_tool_call(&self) -> bool {
        self.ended_in_tool_call
    }

    /// Whether this request reasons at all.
    pub fn is_reasoning(&self) -> bool {
        self.starts_thinking
    }

    /// Feeds one generated token and classifies it.
    pub fn on_token(&mut self, markers: &ReasoningMarkers, token: u32) -> TokenKind {
        if self.phase == Phase::Prefill {
            self.phase = if self.starts_thinking { Phase::Think } else { Phase::Answer };
        }
        let tool_call = self.feed_tool_markers(markers, token);
        match self.phase {
            Phase::Think => {
                let (state, ended) = markers.end.advance(self.end_state, token);
                self.end_state = state;
                if ended {
                    self.phase = Phase::Answer;
                    TokenKind::ReasoningEnd
                } else if tool_call {
                    // Qwen3-style templates treat a tool call as an implicit end of reasoning;
                    // the call itself is visible output.
                    self.phase = Phase::Answer;
                    self.ended_in_tool_call = true;
                    TokenKind::Answer
                } else {
                    TokenKind::Think
                }
            }
            _ => {
                self.ended_in_tool_call |= tool_call;
                TokenKind::Answer
            }
        }
    }

    /// Marks the request finished; phases never move back.
    pub fn finish(&mut self) {
        self.phase = Phase::Done;
    }

    fn feed_tool_markers(&mut self, markers: &ReasoningMarkers, token: u32) -> bool {
        let mut any = false;
        for (matcher, state) in markers.tool_calls.iter().zip(self.tool_states.iter_mut()) {
            let (next, matched) = matcher.advance(*state, token);
            *state = next;
            any |= matched;
        }
        any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const THINK: u32 = 10;
    const END: u32 = 11;
    const TOOL: u32 = 12;

    fn markers() -> ReasoningMarkers {
        ReasoningMarkers::new(vec![THINK], vec![END], vec![vec![TOOL]])
    }

    #[test]
    fn matcher_finds_multi_token_marker_split_across_calls() {
        let m = SequenceMatcher::new(vec![5, 5, 6]);
        let mut state = 0;
        let mut hits = Vec::new();
        for (i, t) in [5, 5, 5, 6, 1, 5, 5, 6].into_iter().enumerate() {
            let (s, hit) = m.advance(state, t);
            state = s;
            if hit {
                hits.push(i);
            }
        }
        assert_eq!(hits, vec![3, 7]);
        assert_eq!(m.last_end_in(&[1, 5, 5, 6, 2]), Some(4));
    }

    #[test]
    fn prompt_with_open_think_starts_thinking_at_the_marker() {
        let p = markers().classify_prompt(&[1, 2, THINK, 3], 4);
        assert_eq!(p, PromptReasoning { starts_thinking: true, reasoning_start: 2 });
    }

    #[test]
    fn prompt_that_closes_reasoning_starts_in_answer() {
        let m = markers();
        let p = m.classify_prompt(&[1, THINK, END, 3], 4);
        assert!(!p.starts_thinking);
        let mut t = PhaseTracker::new(&m, p);
        assert_eq!(t.on_token(&m, 7), TokenKind::Answer);
        assert_eq!(t.phase(), Phase::Answer);
    }

    #[test]
    fn think_then_end_then_answer() {
        let m = markers();
        let p = m.classify_prompt(&[1, 2], 2);
        assert_eq!(p, PromptReasoning { starts_thinking: true, reasoning_start: 2 });
        let mut t = PhaseTracker::new(&m, p);
        assert_eq!(t.phase(), Phase::Prefill);
        assert_eq!(t.on_token(&m, THINK), TokenKind::Think);
        assert_eq!(t.on_token(&m, 3), TokenKind::Think);
        assert_eq!(t.on_token(&m, END), TokenKind::ReasoningEnd);
        assert_eq!(t.phase(), Phase::Answer);
        assert_eq!(t.on_token(&m, END), TokenKind::Answer);
        assert!(!t.ended_in_tool_call());
    }

    #[test]
    fn tool_call_during_thinking_is_an_implicit_end() {
        let m = markers();
        let mut t = PhaseTracker::new(&m, m.classify_prompt(&[1], 1));
        t.on_token(&m, 3);
        assert_eq!(t.on_token(&m, TOOL), TokenKind::Answer);
        assert!(t.ended_in_tool_call());
    }

    #[test]
    fn non_reasoning_model_goes_straight_to_answer() {
        let m = ReasoningMarkers::none();
        let mut t = PhaseTracker::new(&m, m.classify_prompt(&[END], 1));
        assert_eq!(t.on_token(&m, END), TokenKind::Answer);
    }
}
