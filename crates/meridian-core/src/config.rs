//! Operator configuration: SLO classes, the priority → class map, the step-time seed profile, the
//! policy knobs and thinking control (off unless configured, for all classes or per class). A
//! [`Config`] only exists validated: [`Config::from_json`] rejects unknown keys and out-of-range
//! values with an [`Error::InvalidConfig`] that names the dotted key, so a bad
//! `--additional-config` stops vLLM at start-up instead of misbehaving under load. The same holds
//! for what only the model's vocabulary can settle: [`Config::resolve_tool_call_markers`] rejects a
//! configured tool-call marker that is not one token. Names the operator writes (policies) are
//! defined here once.
//!
//! Every key is declared once, as a row of the key tables below (`config_root!` for the top
//! level, `config_section!` for each block; the `table` module): its doc comment, type, default and
//! range check. From that row come the raw field the parser reads, the validated field, the
//! validation (whose error names the dotted key) and the serialization back, so this module is
//! also the one source of the configuration's reference: [`Config::json_schema`] derives a JSON
//! Schema from the raw structs (exactly the keys the parser accepts, with their types and doc
//! comments), and [`Config::to_json`] writes a validated configuration back as the block that
//! parses to it (for the defaults: `Config::default().to_json()`). The documentation's
//! configuration page is generated from the two; `Config::from_json(&c.to_json()) == c` holds for
//! every `c`. Only the keys whose validated form is not their raw one (the classes, the default
//! class, the priority map, the tool-call markers) are converted by hand.

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize, Serializer};

use crate::error::{Error, Result};
use crate::predictor::LearningRate;
use crate::slo::{ClassId, OnOverload, ShedUntil, SloClass, SloTargets, WaitingOrder};
use crate::thinking::ThinkingControl;

#[macro_use]
mod table;
mod check;

use check::{
    at_least_one, file_path, forgetting, fraction, in_unit_interval, length_sample, non_negative,
    open_unit_interval, positive, positive_u32, shed_status, thinking_rules,
};

/// What happens to the KV blocks of a finished reasoning request from the start of its reasoning on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningBlockRule {
    /// Evict them first, except when the request ended in a tool call (the follow-up keeps them).
    UnlessToolCall,
    /// Always evict them first.
    Always,
    /// Treat them like any other prefix-cache block.
    Never,
}
/// Which scheduling policy the core runs, named by [`Policy::name`] (key `policy`).
// Each variant's doc comment is its one description: the JSON Schema carries it to the
// configuration reference and, through the binding's `config_schema()`, to the replay's list of
// policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
#[schemars(rename_all = "snake_case")]
pub enum Policy {
    /// Dual queue with slack ordering, step budget, admission reserve and eviction tiers.
    Meridian,
    /// Ablation: answering requests first, everything else first-come first-served; vLLM's own
    /// budget and admission; no eviction tiers.
    AnswerFirst,
    /// Reasoning first (least recently served first), answering paced at the class's answer TPOT
    /// target and preempted first (after PASCAL, arXiv 2602.11530); vLLM's own budget and
    /// admission; no eviction tiers.
    Pascal,
    /// Prediction-free γ-boost between first-come first-served and shortest-job-first with
    /// KV-aware preemption (after UniBoost, arXiv 2606.18431): every request, waiting or running,
    /// is ordered by `arrival_ms + 1000 · num_tokens / uniboost_gamma_tokens_per_s`, its arrival
    /// pushed back by the work it has made known (prompt plus output so far), so γ → ∞ is FCFS
    /// and γ → 0 least-attained-service; the running request with the largest key — late and
    /// large, the one whose blocks free the most room — is vLLM's preemption victim. vLLM's own
    /// budget and admission; no eviction tiers. The paper's exact boost function is not in the
    /// sources we had (abstract and project page); this is our reading of it, documented as such.
    #[schemars(rename = "uniboost")]
    UniBoost,
    /// Least-deadline-first with a TTFT guard and a TPOT guard (after SCORPIO, arXiv 2505.23022):
    /// waiting requests in order of their TTFT deadline, those that can no longer make it (now +
    /// predicted prefill past the deadline) behind every one that can — SCORPIO rejects them; a
    /// vLLM scheduler cannot reject without the frontend, so they are queued last instead, which
    /// can only help the baseline; admission stops where the step-time model predicts the batch
    /// would exceed the tightest TPOT target (its virtual batch size). Running requests first come
    /// first served; vLLM's own budget; no eviction tiers; SCORPIO's credit-based batching is not
    /// reproduced.
    Scorpio,
}

impl Policy {
    /// Every policy, in declaration order (the product first).
    pub const ALL: [Policy; 5] =
        [Policy::Meridian, Policy::AnswerFirst, Policy::Pascal, Policy::UniBoost, Policy::Scorpio];

    /// The name the configuration and the bindings use: `meridian`, `answer_first`, `pascal`,
    /// `uniboost` or `scorpio`.
    pub const fn name(self) -> &'static str {
        match self {
            Policy::Meridian => "meridian",
            Policy::AnswerFirst => "answer_first",
            Policy::Pascal => "pascal",
            Policy::UniBoost => "uniboost",
            Policy::Scorpio => "scorpio",
        }
    }

    /// The policy of a [`Policy::name`], exactly.
    pub fn from_name(name: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.name() == name)
    }
}

impl<'de> Deserialize<'de> for Policy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Names;
        impl de::Expected for Names {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let names: Vec<String> = Policy::ALL.iter().map(|p| format!("`{}`", p.name())).collect();
                write!(f, "one of {}", names.join(", "))
            }
        }
        let name = String::deserialize(deserializer)?;
        Policy::from_name(&name).ok_or_else(|| de::Error::invalid_value(de::Unexpected::Str(&name), &Names))
    }
}

impl Serialize for Policy {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

config_section! {
    /// Raw `step_time` block.
    #[schemars(rename = "StepTimeProfile")]
    raw RawStepTime at "step_time.";
    /// The validated `step_time` block ([`Config::step_time`]): the step-time model's seed,
    /// `step_ms = base_ms + per_prefill_token_ms · prompt tokens computed + per_decode_request_ms
    /// · requests decoding + per_context_token_ms · KV tokens read`. The defaults are an H200
    /// serving an 8B-class model in bf16, read off the replay profile `h200-qwen3-8b` (whose file
    /// cites every number): ~5.5 ms for a one-request decode (16 GB of weights at ~3.8 TB/s
    /// effective plus launch overhead); ~0.028 ms per prompt token (16 GFLOP at ~590 TFLOP/s
    /// effective); ~3.8e-5 ms per context token (147 kB of KV at ~3.8 TB/s); a small per-request
    /// cost for sampling and per-request kernels.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub struct StepTimeProfile {
        /// Fixed cost of one forward pass (weights read, launch overhead).
        base_ms: f64 = 5.5 => non_negative,
        /// Marginal cost of one prompt token computed (compute-bound).
        per_prefill_token_ms: f64 = 0.028 => positive,
        /// Marginal cost of one more request decoding (sampling, per-request kernels).
        per_decode_request_ms: f64 = 0.005 => non_negative,
        /// Marginal cost of one token of KV context read by attention.
        per_context_token_ms: f64 = 3.8e-5 => non_negative,
        /// Refit the coefficients online from observed step times.
        online_fit: bool = true,
        /// Forgetting factor of the online fit, in (0.5, 1]; 1 never forgets.
        forgetting: f64 = 0.98 => forgetting,
    }
    optional {}
}

/// Whether a request whose prefix a KV tier holds loads it back (key `kv_tier.restore`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RestoreMode {
    /// Load where the cost model says loading is cheaper than recomputing (the default).
    Auto,
    /// Load every hit, as vLLM does on its own.
    Always,
    /// Recompute every hit (the tier still stores; a baseline for measuring it).
    Never,
}

config_section! {
    /// Raw `kv_tier` block.
    #[schemars(rename = "KvTierConfig")]
    raw RawKvTier at "kv_tier.";
    /// The validated `kv_tier` block ([`Config::kv_tier`]).
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub struct KvTierConfig {
        /// Restore or recompute (default `auto`).
        restore: RestoreMode = RestoreMode::Auto,
        /// Seed of each tier's load cost in ms per token (default 0.005: an 8B-class model's
        /// 147 kB of KV per token over ~30 GB/s of host link, the `h200-qwen3-8b` profile's numbers).
        load_ms_per_token: f64 = 0.005 => non_negative,
        /// Refit the load cost from finished transfers (default true).
        online_fit: bool = true,
        /// Prefetch: this many waiting requests next in line after those admitted this step have
        /// their prefixes looked up in a staged tier (one with slower tiers behind it, such as
        /// vLLM's tiering spec with a disk tier), which starts moving them up before their turn
        /// (default 4; 0: off).
        prefetch_requests: u32 = 4,
    }
    optional {}
}

config_section! {
    /// Raw `arrival_preemption` block.
    #[schemars(rename = "ArrivalPreemption")]
    raw RawArrivalPreemption at "arrival_preemption.";
    /// The validated `arrival_preemption` block ([`Config::arrival_preemption`]).
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub struct ArrivalPreemption {
        /// Whether the rule runs.
        enabled: bool = true,
        /// A request is not preempted on arrival again within this long, in ms (≥ 0).
        min_interval_ms: f64 = 10_000.0 => non_negative,
        /// At most this many victims per step (≥ 1).
        max_per_step: u32 = 2 => positive_u32,
    }
    optional {}
}

config_section! {
    /// Raw `prefix_affinity` block.
    #[schemars(rename = "PrefixAffinity")]
    raw RawPrefixAffinity at "prefix_affinity.";
    /// The validated `prefix_affinity` block ([`Config::prefix_affinity`]).
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub struct PrefixAffinity {
        /// Whether the rule runs.
        enabled: bool = true,
        /// A waiting request with more slack than this many times its class's TTFT target may let
        /// requests with a cached prefix go first (≥ 0; 0.5: one that has used less than half its
        /// TTFT target, its prefill included; at 1 or more the rule never applies, as a waiting
        /// request's TTFT slack is always below its target).
        slack_guard_ttft_factor: f64 = 0.5 => non_negative,
    }
    optional {}
}

config_section! {
    /// Raw `overload` block.
    #[schemars(rename = "Overload")]
    raw RawOverload at "overload.";
    /// The validated `overload` block ([`Config::overload`]).
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub struct Overload {
        /// Below this probability of meeting its TTFT and TTFAT targets a request is late, in
        /// (0, 1). 0.1 came out best on every trace family of the scenario corpus (0.1, 0.3 and 0.5
        /// within 2 % of each other).
        min_success_probability: f64 = crate::predictor::DEFAULT_VIABLE_LEVEL => open_unit_interval,
        /// Under `shed`, a started request that has not begun answering is shed too when it turns
        /// late (only while others wait for the room); a waiting one always is.
        shed_running: bool = true,
        /// Light load: a waiting request with more slack than this many times its class's TTFT
        /// target waits in arrival order behind every request with less, so no class's slack is
        /// spent while every class is safely inside its targets (≥ 0; 0: off — class rank and slack
        /// alone order the queue).
        fcfs_slack_ttft_factor: f64 = 0.5 => non_negative,
        /// Admission stops where the step-time model predicts that the decode step would pass the
        /// tightest answer TPOT target among the running and admitted requests (with
        /// `tpot_headroom`), as SCORPIO's virtual batch size does.
        tpot_guard: bool = true,
        /// Under `degrade`, a thinking request's reasoning is ended this long, in ms (≥ 0), plus four
        /// decode steps for the closing sequence, before its TTFAT deadline (500 ms: the scheduler's
        /// word reaches a worker in another process within that).
        degrade_margin_ms: f64 = 500.0 => non_negative,
        /// The triage of every class that names no `on_overload` of its own.
        on_overload: OnOverload = OnOverload::default(),
        /// How waiting requests between the light-load band and the late ones are ordered within a
        /// class rank.
        waiting_order: WaitingOrder = WaitingOrder::default(),
        /// How long after arrival a late request of a `shed` class can still be shed for its TTFAT.
        shed_until: ShedUntil = ShedUntil::default(),
        /// A request of a `shed` class that would wait past its TTFT target behind the queue the
        /// engine publishes is refused in the API server as it arrives (HTTP `shed_status` with
        /// `Retry-After`; needs `--middleware meridian.vllm.frontend.MeridianFrontend`), before it
        /// joins the queue.
        admit_at_arrival: bool = true,
        /// Admission at arrival refuses a request whose predicted wait for its first token exceeds
        /// this many times its class's TTFT target (> 0).
        arrival_wait_ttft_factor: f64 = 1.0 => positive,
        /// The HTTP status of a refusal at arrival or a shed before the first token: 429 or 503,
        /// both with `Retry-After`. Routers retry both elsewhere; vllm-router's circuit breaker
        /// counts a 503 as a failure of the server (ten in a row eject it for every class) and a 429
        /// as a success.
        shed_status: u16 = 429 => shed_status,
    }
    optional {}
}

/// The HTTP statuses a shed may be answered with (`overload.shed_status`), both with
/// `Retry-After`: 429 Too Many Requests and 503 Service Unavailable.
pub const SHED_STATUSES: [u16; 2] = [429, 503];

config_section! {
    /// Raw `predictor` block.
    #[schemars(rename = "Predictor")]
    raw RawPredictor at "predictor.";
    // The validated block is the predictor's own type, whose `Default` holds the defaults.
    use struct LearningRate {
        /// The priors' total weight, in pseudo-observations (> 0); each finished request of the
        /// class counts as one.
        prior_weight: f64 => positive,
        /// The predictors' memory, in finished requests of the class (≥ 1): each new observation
        /// multiplies the weight of everything before it (the priors included) by
        /// `1 − 1/memory_requests`.
        memory_requests: f64 => at_least_one,
    }
    optional {
        /// The priors' own memory, in finished requests of the class (≥ 1): each one also shrinks
        /// what is left of the priors by `1/prior_memory_requests`, so after a few times this many
        /// the server's own lengths alone make the prediction. Unset: the priors decay like any
        /// observation. Off by default because the priors also correct for the long requests that
        /// have not finished yet: fading them after 50 completions cost the Mooncake replay 2.5 % of
        /// its goodput; it helps a server whose lengths are far from the priors.
        prior_memory_requests: f64 => at_least_one,
    }
}

/// Raw, unvalidated per-class targets as the operator writes them (key `classes.<name>`).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "SloClass")]
struct RawClass {
    /// Time to first token: arrival → first generated token, in ms (> 0).
    ttft_ms: f64,
    /// Time to first answer token: arrival → first token after the reasoning, in ms (> 0); the
    /// same as the TTFT for a request that does not reason.
    ttfat_ms: f64,
    /// Mean inter-token time within the answer, in ms (> 0). Steps are sized so that running
    /// answers stay inside the tightest of these (times `tpot_headroom`).
    answer_tpot_ms: f64,
    /// Arrival → last token, in ms (> 0); unset: the class has no end-to-end target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    e2e_ms: Option<f64>,
    /// Admission rank: 0 is admitted first; aging moves a waiting request up one rank per
    /// `aging_ms`.
    rank: u8,
    /// The class's own thinking control, which replaces the top-level `thinking_control` as a
    /// whole for its requests (`{}` turns every rule off for the class); unset: the top-level
    /// one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    thinking_control: Option<ThinkingControl>,
    /// What becomes of the class's requests that can no longer meet its targets; unset:
    /// `overload.on_overload`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    on_overload: Option<OnOverload>,
}

config_root! {
    /// Raw configuration as deserialized from JSON (the `meridian` block of vLLM's
    /// `--additional-config`); every field is optional, and unknown keys are rejected.
    #[schemars(title = "Meridian configuration")]
    raw RawConfig;
    /// Validated configuration of the policy.
    #[derive(Debug, Clone, PartialEq)]
    pub struct Config {
        /// The scheduling policy. `meridian` is the product; the others exist so that a replay
        /// can measure it against its own ablation and published alternatives with the same
        /// engine, the same shim and the same metrics. Only `meridian` triages overload.
        policy: Policy = Policy::Meridian,
        /// A step in which no request answers may take this many times the answer TPOT target
        /// (≥ 1): larger prompt chunks for thinking-only batches.
        think_batch_multiplier: f64 = 2.5 => at_least_one,
        /// Fraction of the answer TPOT target a step may take, in (0, 1].
        tpot_headroom: f64 = 0.9 => in_unit_interval,
        /// Floor of the per-step token budget (≥ 1): the budget never starves progress.
        min_token_budget: u32 = 16 => positive_u32,
        /// Hold KV blocks back from admission for the running answers' expected remaining tokens,
        /// so they can finish without preemption.
        answer_kv_reserve: bool = true,
        /// Fraction, in [0, 1], of the running thinking requests' expected remaining growth (the
        /// rest of the thinking plus a mean answer) also held back from admission: fewer
        /// preemptions, at some cost in TTFAT when set too high.
        think_kv_reserve: f64 = 0.0 => fraction,
        /// A waiting request moves up one class rank per this much waiting, in ms (> 0).
        aging_ms: f64 = 10_000.0 => positive,
        /// Past this much waiting, in ms (> 0), a request goes ahead of every new one.
        starvation_ms: f64 = 60_000.0 => positive,
        /// The waiting side's tail rule: a waiting request expected to miss its targets waits
        /// behind the ones that can still make theirs for at most this many times its class's TTFT
        /// target (never past `starvation_ms`), then goes ahead of every new one (> 0).
        late_wait_ttft_factor: f64 = 5.0 => positive,
        /// The running side's tail rule: a running thinker that can no longer make its TTFAT target
        /// yields its decode to prompt chunks until it has been in the system (1 + this) × its
        /// class's TTFAT target, then decodes every step ahead of them (≥ 0; 0: a late decode never
        /// yields). 0 is the largest factor of the measured sweep (`bench/replay_late_think_sweep.py`)
        /// that kept every class's TTFT and TTFAT p99 within FCFS's on both development workloads;
        /// larger factors buy goodput with the TTFAT tail.
        late_think_ttfat_factor: f64 = 0.0 => non_negative,
        /// The `uniboost` policy's γ: tokens of known work that push a request back by one second
        /// of arrival (> 0; → ∞: FCFS; → 0: least attained service).
        uniboost_gamma_tokens_per_s: f64 = 1_000.0 => positive,
        /// Which finished requests' reasoning blocks (from the start of their reasoning on, which no
        /// later request can reuse: chat templates drop earlier turns' reasoning) leave the prefix
        /// cache first.
        evict_reasoning_blocks: ReasoningBlockRule = ReasoningBlockRule::UnlessToolCall,
        /// An answer gap above this many times the class's answer TPOT target counts as a stall
        /// (≥ 1).
        stall_factor: f64 = 5.0 => at_least_one,
        /// Sample thinking lengths, in tokens (each ≥ 1), seeding every class's remaining-thinking
        /// predictor. Default: quantiles of production DeepSeek-R1 thinking lengths (ServeGen), so
        /// the predictor starts heavy-tailed.
        think_tokens_prior: Vec<u32> = DEFAULT_THINK_PRIOR.to_vec() => length_sample,
        /// Sample answer lengths, in tokens (each ≥ 1), seeding every class's remaining-answer
        /// predictor. Default: the visible answer lengths of the same production sources.
        answer_tokens_prior: Vec<u32> = DEFAULT_ANSWER_PRIOR.to_vec() => length_sample,
        /// Learn the length predictors from a previous run's finished requests at start, so a
        /// restarted or newly added server does not start from the production priors: the last
        /// `predictor.memory_requests` lines of `warm_start_path`, or of `request_log_path` when that
        /// file exists from an earlier run.
        warm_start: bool = true,
        /// Publish Meridian's series on vLLM's `/metrics`.
        metrics: bool = true,
        /// Thinking control of every class that sets none of its own (`classes.<name>.thinking_control`
        /// replaces it for that class). Every rule is off unless its key is present (`"eat": {}`
        /// turns EAT on with its defaults); when several are on, the first to fire ends the
        /// reasoning. On a vLLM server the rules need the logits processor
        /// (`--logits-processors meridian.vllm.thinking:MeridianThinkingProcessor`), except the
        /// budgets: without it the scheduler sets vLLM's own `thinking_token_budget` from
        /// `budget_tokens`, `reasoning_effort` and `load_aware` (at the request's admission). The
        /// replay applies `budget_tokens` and `load_aware` without one.
        thinking_control: ThinkingControl = ThinkingControl::default() => thinking_rules,
    }
    optional {
        /// File to append one JSON line per finished request to: class, finish reason, every
        /// latency (TTFT, TTFAT, transition gap, TPOT by phase, end to end), token counts and
        /// preemptions by phase, whether it met every target, and the thinking-control rule that
        /// ended its reasoning with the token count at that point. Unset: no request log. Under data
        /// parallelism, rank 0 writes this file and rank N > 0 `<stem>.dpN<suffix>` next to it.
        request_log_path: String => file_path,
        /// A request log (the format `request_log_path` writes) to learn from at start, e.g. a copy
        /// of another replica's. Unset: the server's own `request_log_path`.
        warm_start_path: String => file_path,
        /// File to append one JSON line per engine step to (`num_prefill_tokens`,
        /// `num_decode_requests`, `num_context_tokens`, `step_ms`): the input of
        /// `meridian.replay.profiles.fit_profile`, which fits a replay profile to your hardware.
        /// Each line also says what the step-time model predicted for the step before measuring it
        /// (`predicted_ms`), the decode step the plan judged deadlines with (`decode_step_ms`), the
        /// requests it shed (`num_shed`), ran and left waiting, and when (`t_ms`, the engine's
        /// clock): the model's error beside the decisions it drove. Unset: no step log. Under data
        /// parallelism, named per rank as `request_log_path` is.
        step_log_path: String => file_path,
    }
    blocks {
        /// Seed of the step-time model, `step_ms = base + per_prefill_token · prompt tokens
        /// computed + per_decode_request · requests decoding + per_context_token · KV tokens read`,
        /// refitted online by exponentially weighted least squares with a ridge pull toward the
        /// seed, every coefficient constrained to be non-negative (the constrained optimum, not an
        /// unconstrained fit clamped, which predicted decode steps 1.3–3× long), unless
        /// `online_fit` is false (the default seed: an H200 serving an 8B-class model); no
        /// prediction falls below the shortest decode step measured.
        /// Every running decode gets its token each step; prompt chunks fill the rest of the answer
        /// TPOT target, each prompt token priced at no less than what steps with long chunks (≥ 256
        /// prompt tokens) cost per token: a step's time is not linear in its prompt tokens (short
        /// chunks ride on a decode step's weight reads, long ones are compute-bound), and a fit over
        /// mostly decode steps would price them near zero and overshoot the target by several times.
        step_time: RawStepTime => StepTimeProfile,
        /// The KV tiers beyond the device (vLLM's offloading connector: host memory, disk, a shared
        /// store): whether a tier hit is loaded or recomputed, the seed of each tier's load cost
        /// (refitted from the connector's own transfer timings unless `online_fit` is false), and
        /// prefetch from slower tiers.
        kv_tier: RawKvTier => KvTierConfig,
        /// How fast each class's length predictors (one for thinking, one for the answer) move from
        /// the priors to the class's own finished requests.
        predictor: RawPredictor => LearningRate,
        /// Preemption on arrival: when the most urgent waiting request has waited through half of
        /// its class's TTFT target without a seat or enough KV blocks, lower-class thinking (or
        /// still prefilling) requests yield — most slack net of their recompute cost first, never an
        /// answering request.
        arrival_preemption: RawArrivalPreemption => ArrivalPreemption,
        /// Prefix-aware admission: among the first 64 waiting requests, those with more slack than
        /// the guard go longest cached prefill first (in the device cache, or in a tier that would
        /// load it); the others keep least slack first, so nobody is pushed past a deadline by it.
        prefix_affinity: RawPrefixAffinity => PrefixAffinity,
        /// How late work is judged and triaged. A request is late when its probability of meeting
        /// its TTFT and TTFAT targets (from its class's remaining-thinking distribution given what it
        /// has thought, the time left and the predicted step) is below `min_success_probability`;
        /// its class's `on_overload` decides what becomes of it. Only the `meridian` policy triages.
        overload: RawOverload => Overload,
    }
    hand_raw {
        /// The SLO classes, by name (at least one, at most 255). Giving this key replaces the three
        /// default classes as a whole. A request names its class with the request argument
        /// `meridian_class`; without it, its vLLM priority picks one (`priority_map`).
        classes: BTreeMap<String, RawClass>,
        /// Class of a request that names none and whose priority maps to none; it must be one of
        /// `classes`.
        default_class: String,
        /// vLLM priority → class name: a priority maps to the class of the largest key ≤ it (below
        /// all keys: the smallest key's class). Keys are integers written as strings. Unset: `-1` →
        /// the first class by rank, `0` → the second (or the last), `1` → the last.
        priority_map: BTreeMap<String, String>,
        /// Strings that mark a tool call (a request that ends in one keeps its reasoning blocks
        /// under `unless_tool_call`). Each must be a single token of the model's vocabulary: a
        /// configured marker that is not one stops vLLM at start-up with `ConfigError` naming
        /// `tool_call_markers[i]`. Unset: `["<tool_call>"]` (Qwen3, Hermes and most open
        /// tool-calling chat templates), dropped with a warning where the model lacks it (then no
        /// request counts as ending in a tool call).
        tool_call_markers: Vec<String>,
    }
    hand {
        /// `classes`, validated: indexed by [`ClassId`] (the block's name order).
        classes: Vec<SloClass>,
        /// `default_class`, resolved to its class.
        default_class: ClassId,
        /// `priority_map`, resolved: thresholds in ascending order, each with its class.
        priority_map: Vec<(i64, ClassId)>,
        /// `tool_call_markers`, or the default `["<tool_call>"]` (resolved to token ids by the
        /// shim's tokenizer: [`Config::resolve_tool_call_markers`]).
        tool_call_markers: Vec<String>,
        /// Whether the operator gave `tool_call_markers` (`false`: the default, dropped where the
        /// model lacks it instead of stopping the server).
        tool_call_markers_explicit: bool,
        /// Per class (indexed by [`ClassId`]): its `classes.<name>.thinking_control`, if it sets
        /// one.
        class_thinking_control: Vec<Option<ThinkingControl>>,
    }
    from_hand {
        let (classes, class_thinking_control) = validate_classes(classes, overload.on_overload)?;
        let default_class = class_id(&classes, "default_class", default_class.as_deref().unwrap_or("standard"))?;
        let priority_map = match priority_map {
            None => default_priority_map(&classes),
            Some(map) => parse_priority_map(&classes, &map)?,
        };
        let tool_call_markers_explicit = tool_call_markers.is_some();
        let tool_call_markers = tool_call_markers.unwrap_or_else(|| vec![DEFAULT_TOOL_CALL_MARKER.to_owned()]);
        (classes, default_class, priority_map, tool_call_markers, tool_call_markers_explicit, class_thinking_control)
    }
    to_hand(config) {
        let class_name = |id: ClassId| config.classes[id.index()].name.clone();
        let classes = config
            .classes
            .iter()
            .zip(&config.class_thinking_control)
            .map(|(c, thinking_control)| {
                let raw = RawClass {
                    ttft_ms: c.targets.ttft_ms,
                    ttfat_ms: c.targets.ttfat_ms,
                    answer_tpot_ms: c.targets.answer_tpot_ms,
                    e2e_ms: c.targets.e2e_ms,
                    rank: c.rank,
                    thinking_control: thinking_control.clone(),
                    on_overload: Some(c.on_overload),
                };
                (c.name.clone(), raw)
            })
            .collect();
        let priority_map = config
            .priority_map
            .iter()
            .map(|(threshold, class)| (threshold.to_string(), class_name(*class)))
            .collect();
        (
            Some(classes),
            Some(class_name(config.default_class)),
            Some(priority_map),
            config.tool_call_markers_explicit.then(|| config.tool_call_markers.clone()),
        )
    }
}

/// Quantiles of production DeepSeek-R1 thinking lengths (ServeGen's published distribution):
/// p10…p99 spread as a small sample so the predictor starts heavy-tailed.
const DEFAULT_THINK_PRIOR: [u32; 10] = [90, 180, 300, 420, 515, 680, 950, 1500, 2327, 9301];
/// Visible answer lengths of the same sources: short and fairly stable.
const DEFAULT_ANSWER_PRIOR: [u32; 10] = [40, 80, 120, 150, 184, 240, 330, 520, 985, 4666];
/// The tool-call marker of Qwen3, Hermes and most open tool-calling chat templates.
const DEFAULT_TOOL_CALL_MARKER: &str = "<tool_call>";

impl Default for Config {
    fn default() -> Self {
        Self::from_raw(RawConfig::default()).expect("the built-in defaults are valid")
    }
}

impl Config {
    /// Parses and validates the JSON object an operator passes under `"meridian"` in vLLM's
    /// `--additional-config`. An empty object gives the defaults.
    pub fn from_json(text: &str) -> Result<Self> {
        let deserializer = &mut serde_json::Deserializer::from_str(text);
        let raw: RawConfig = serde_path_to_error::deserialize(deserializer).map_err(|err| {
            let path = err.path().to_string();
            let key = if path == "." { "meridian".to_owned() } else { path };
            Error::config(key, err.inner().to_string())
        })?;
        Self::from_raw(raw)
    }

    /// Looks a class up by name.
    pub fn class_by_name(&self, name: &str) -> Option<ClassId> {
        self.classes.iter().position(|c| c.name == name).map(|i| ClassId(i as u8))
    }

    /// Whether the API server refuses requests at arrival ([`crate::admission`]): the `meridian`
    /// policy, `overload.admit_at_arrival`, and a class that sheds. The engine publishes its queue
    /// only then.
    pub fn admits_at_arrival(&self) -> bool {
        self.policy == Policy::Meridian
            && self.overload.admit_at_arrival
            && self.classes.iter().any(|c| c.on_overload == crate::slo::OnOverload::Shed)
    }

    /// The class a vLLM priority maps to.
    pub fn class_for_priority(&self, priority: i64) -> ClassId {
        let below_or_equal = self.priority_map.iter().rev().find(|(threshold, _)| *threshold <= priority);
        match (below_or_equal, self.priority_map.first()) {
            (Some((_, class)), _) => *class,
            (None, Some((_, lowest))) => *lowest,
            (None, None) => self.default_class,
        }
    }

    /// The thinking control in force for a class: its own, else the top-level one.
    pub fn thinking_control_for(&self, class: ClassId) -> &ThinkingControl {
        match self.class_thinking_control.get(class.index()) {
            Some(Some(own)) => own,
            _ => &self.thinking_control,
        }
    }

    /// Whether a request of `class` under `control` (its class's, or its own) needs its thinking
    /// followed token by token: a rule is on, or the class degrades under overload (the scheduler
    /// may end its thinking).
    pub fn thinking_stream_wanted(&self, class: ClassId, control: &ThinkingControl) -> bool {
        control.is_enabled()
            || self.classes.get(class.index()).is_some_and(|c| c.on_overload == OnOverload::Degrade)
    }

    /// The token ids of the tool-call markers, given `found`: per configured marker, in order,
    /// the single token id the marker is in the model's vocabulary, or `None` when it is not one
    /// token (absent, or split into several).
    ///
    /// The rule: a marker the operator configured (`tool_call_markers` given) must be one token,
    /// so a `None` is an [`Error::InvalidConfig`] on `tool_call_markers[i]` naming the marker. The
    /// default marker (`<tool_call>`, no key given) is only a guess at the model's template: a
    /// `None` drops it silently, so the result is shorter than the configured list (the caller may
    /// warn on that) and no request is ever seen ending in a tool call. `found` must hold one
    /// entry per configured marker ([`Error::InvalidArgument`] otherwise).
    pub fn resolve_tool_call_markers(&self, found: &[Option<u32>]) -> Result<Vec<u32>> {
        if found.len() != self.tool_call_markers.len() {
            return Err(Error::argument(
                "found",
                format!("{} entries for {} configured marker(s)", found.len(), self.tool_call_markers.len()),
                "needs one entry per configured tool-call marker, in order",
            ));
        }
        let mut ids = Vec::with_capacity(found.len());
        for (i, (marker, id)) in self.tool_call_markers.iter().zip(found).enumerate() {
            match id {
                Some(id) => ids.push(*id),
                None if self.tool_call_markers_explicit => {
                    return Err(Error::config(
                        format!("tool_call_markers[{i}]"),
                        format!(
                            "`{marker}` is not a single token of this model's vocabulary; a tool-call \
                             marker must be one token"
                        ),
                    ))
                }
                None => {}
            }
        }
        Ok(ids)
    }

    /// Comma-separated class names, for error messages.
    pub fn class_names(&self) -> String {
        self.classes.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
    }

    /// The JSON Schema (draft 2020-12) of the block [`Config::from_json`] parses, derived from
    /// the very structs it deserializes: every accepted key, its type, its explanation (the
    /// struct's doc comment) and, where a whole block has defaults, their values. Defaults of
    /// the top-level keys are in `Config::default().to_json()`.
    pub fn json_schema() -> String {
        let schema = schemars::schema_for!(RawConfig);
        serde_json::to_string_pretty(&schema).expect("a JSON Schema is plain JSON")
    }

    /// The configuration as the JSON block that parses back to it, every key given except those
    /// left unset (the log paths, `e2e_ms`, `predictor.prior_memory_requests`, and
    /// `tool_call_markers` when the operator gave none, which keeps the default marker's
    /// leniency). `Config::from_json(&c.to_json())` is `c` up to the order of its classes, which
    /// the block keys by name: parsing puts them in name order.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.to_raw()).expect("a configuration is plain JSON")
    }
}

/// The classes a server gets without `classes`. The replay runs with its own, looser TTFT and
/// TTFAT targets for `interactive` and `standard` (`python/meridian/replay/runner.py`,
/// `DEFAULT_CLASSES_FILE`, says why; `tests/replay/test_class_targets.py` holds the two sets to
/// differing only there).
fn default_classes(triage: OnOverload) -> Vec<SloClass> {
    let class = |name: &str, rank, ttft_ms, ttfat_ms, answer_tpot_ms| SloClass {
        name: name.to_owned(),
        rank,
        targets: SloTargets { ttft_ms, ttfat_ms, answer_tpot_ms, e2e_ms: None },
        on_overload: triage,
    };
    vec![
        class("interactive", 0, 1_000.0, 15_000.0, 50.0),
        class("standard", 1, 3_000.0, 60_000.0, 100.0),
        class("batch", 2, 60_000.0, 1_800_000.0, 1_000.0),
    ]
}

fn default_priority_map(classes: &[SloClass]) -> Vec<(i64, ClassId)> {
    let mut by_rank: Vec<usize> = (0..classes.len()).collect();
    by_rank.sort_by_key(|&i| (classes[i].rank, i));
    match by_rank.as_slice() {
        [only] => vec![(0, ClassId(*only as u8))],
        [first, middle @ .., last] => {
            let standard = middle.first().copied().unwrap_or(*last);
            vec![(-1, ClassId(*first as u8)), (0, ClassId(standard as u8)), (1, ClassId(*last as u8))]
        }
        [] => Vec::new(),
    }
}

/// Validated classes, and each class's own thinking control (same order).
type ValidatedClasses = (Vec<SloClass>, Vec<Option<ThinkingControl>>);

fn validate_classes(raw: Option<BTreeMap<String, RawClass>>, triage: OnOverload) -> Result<ValidatedClasses> {
    let Some(raw) = raw else {
        let classes = default_classes(triage);
        let no_overrides = vec![None; classes.len()];
        return Ok((classes, no_overrides));
    };
    if raw.is_empty() {
        return Err(Error::config("classes", "at least one SLO class is required"));
    }
    if raw.len() > usize::from(u8::MAX) {
        return Err(Error::config("classes", "at most 255 SLO classes are supported"));
    }
    raw.into_iter()
        .map(|(name, c)| {
            let key = |field: &str| format!("classes.{name}.{field}");
            let e2e_ms = match c.e2e_ms {
                Some(v) => Some(positive(&key("e2e_ms"), v)?),
                None => None,
            };
            if let Some(thinking) = &c.thinking_control {
                thinking.validate(&key("thinking_control"))?;
            }
            let class = SloClass {
                targets: SloTargets {
                    ttft_ms: positive(&key("ttft_ms"), c.ttft_ms)?,
                    ttfat_ms: positive(&key("ttfat_ms"), c.ttfat_ms)?,
                    answer_tpot_ms: positive(&key("answer_tpot_ms"), c.answer_tpot_ms)?,
                    e2e_ms,
                },
                name,
                rank: c.rank,
                on_overload: c.on_overload.unwrap_or(triage),
            };
            Ok((class, c.thinking_control))
        })
        .collect::<Result<Vec<_>>>()
        .map(|pairs| pairs.into_iter().unzip())
}

/// The class called `name`, or an error on `key` saying it is not defined.
fn class_id(classes: &[SloClass], key: &str, name: &str) -> Result<ClassId> {
    classes
        .iter()
        .position(|c| c.name == name)
        .map(|i| ClassId(i as u8))
        .ok_or_else(|| Error::config(key, format!("class `{name}` is not defined")))
}

/// `priority_map` resolved: its keys parsed as vLLM priorities, in ascending order.
fn parse_priority_map(classes: &[SloClass], map: &BTreeMap<String, String>) -> Result<Vec<(i64, ClassId)>> {
    let mut out = Vec::with_capacity(map.len());
    for (key, name) in map {
        let threshold: i64 = key.trim().parse().map_err(|_| {
            Error::config(format!("priority_map.{key}"), "keys must be integers (vLLM priorities)")
        })?;
        out.push((threshold, class_id(classes, &format!("priority_map.{key}"), name)?));
    }
    out.sort_by_key(|(threshold, _)| *threshold);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::thinking::{EatRule, LoadAwareBudget, ProxyRule, RpdiRule};

    #[test]
    fn policies_parse_by_their_one_name() {
        assert_eq!(
            Policy::ALL.map(Policy::name),
            ["meridian", "answer_first", "pascal", "uniboost", "scorpio"]
        );
        for policy in Policy::ALL {
            assert_eq!(Policy::from_name(policy.name()), Some(policy));
            let config = Config::from_json(&format!(r#"{{"policy": "{}"}}"#, policy.name())).unwrap();
            assert_eq!(config.policy, policy);
        }
        assert_eq!(Config::default().policy, Policy::Meridian);
        assert_eq!(Policy::from_name("Meridian"), None);
        let msg = Config::from_json(r#"{"policy": "fcfs"}"#).unwrap_err().to_string();
        assert!(msg.contains("`policy`") && msg.contains("fcfs") && msg.contains("`answer_first`"), "{msg}");
        let msg = Config::from_json(r#"{"policy": 3}"#).unwrap_err().to_string();
        assert!(msg.contains("`policy`"), "{msg}");
    }

    #[test]
    fn the_schema_describes_each_policy_under_its_one_name() {
        let schema: serde_json::Value = serde_json::from_str(&Config::json_schema()).unwrap();
        let options = schema["$defs"]["Policy"]["oneOf"].as_array().unwrap();
        let names: Vec<_> = options.iter().map(|o| o["const"].as_str().unwrap()).collect();
        assert_eq!(names, Policy::ALL.map(Policy::name), "the schema's names are the parser's");
        for option in options {
            let text = option["description"].as_str().unwrap_or_default();
            assert!(text.len() > 40, "{option}");
        }
    }

    #[test]
    fn a_row_check_names_the_dotted_key_and_the_value() {
        for (json, key, said) in [
            (r#"{"tpot_headroom": 1.5}"#, "tpot_headroom", "1.5 is not in (0, 1]"),
            (r#"{"min_token_budget": 0}"#, "min_token_budget", "must be at least 1"),
            (r#"{"think_tokens_prior": []}"#, "think_tokens_prior", "at least one length"),
            (r#"{"step_log_path": " "}"#, "step_log_path", "not an empty string"),
            (r#"{"step_time": {"forgetting": 0.5}}"#, "step_time.forgetting", "0.5 is not in (0.5, 1]"),
            (
                r#"{"predictor": {"memory_requests": 0.5}}"#,
                "predictor.memory_requests",
                "0.5 must be a number ≥ 1",
            ),
            (
                r#"{"predictor": {"prior_memory_requests": 0}}"#,
                "predictor.prior_memory_requests",
                "0 must be",
            ),
            (
                r#"{"arrival_preemption": {"max_per_step": 0}}"#,
                "arrival_preemption.max_per_step",
                "at least 1",
            ),
            (
                r#"{"prefix_affinity": {"slack_guard_ttft_factor": -1}}"#,
                "prefix_affinity.slack_guard_ttft_factor",
                "-1",
            ),
            (
                r#"{"thinking_control": {"eat": {"alpha": 2}}}"#,
                "thinking_control.eat.alpha",
                "2 is not in (0, 1)",
            ),
        ] {
            let err = Config::from_json(json).unwrap_err();
            let Error::InvalidConfig { key: got, reason } = &err else { panic!("{json}: {err:?}") };
            assert_eq!(got, key, "{json}");
            assert!(reason.contains(said), "{json}: {reason}");
        }
    }

    #[test]
    fn classes_shed_by_default_and_overload_on_overload_sets_the_rest() {
        let config = Config::default();
        assert!(config.classes.iter().all(|c| c.on_overload == OnOverload::Shed));
        let queued = Config::from_json(r#"{"overload": {"on_overload": "queue"}}"#).unwrap();
        assert!(queued.classes.iter().all(|c| c.on_overload == OnOverload::Queue));
        let mixed = Config::from_json(
            r#"{"overload": {"on_overload": "degrade"}, "default_class": "a", "classes": {
                "a": {"ttft_ms": 1, "ttfat_ms": 2, "answer_tpot_ms": 3, "rank": 0, "on_overload": "shed"},
                "b": {"ttft_ms": 1, "ttfat_ms": 2, "answer_tpot_ms": 3, "rank": 1}}}"#,
        )
        .unwrap();
        let modes: Vec<_> = mixed.classes.iter().map(|c| c.on_overload.name()).collect();
        assert_eq!(modes, ["shed", "degrade"], "a class's own mode wins");
        assert_eq!(config.overload.shed_status, 429);
        let status = Config::from_json(r#"{"overload": {"shed_status": 503}}"#).unwrap().overload.shed_status;
        assert_eq!(status, 503);
        for (json, key) in [
            (r#"{"overload": {"on_overload": "drop"}}"#, "overload.on_overload"),
            (r#"{"overload": {"min_success_probability": 1.5}}"#, "overload.min_success_probability"),
            (r#"{"overload": {"degrade_margin_ms": -1}}"#, "overload.degrade_margin_ms"),
            (r#"{"overload": {"fcfs_slack_ttft_factor": "x"}}"#, "overload.fcfs_slack_ttft_factor"),
            (r#"{"overload": {"shed_until": "never"}}"#, "overload.shed_until"),
            (r#"{"overload": {"shed_status": 500}}"#, "overload.shed_status"),
            (r#"{"overload": {"shed_status": "429"}}"#, "overload.shed_status"),
            (r#"{"overload": {"spare": 1}}"#, "overload.spare"),
        ] {
            let err = Config::from_json(json).unwrap_err().to_string();
            assert!(err.contains(&format!("`{key}`")), "{json}: {err}");
        }
    }

    #[test]
    fn kv_tier_errors_name_the_key() {
        let config = Config::from_json(r#"{"kv_tier": {"restore": "never"}}"#).unwrap();
        assert_eq!(config.kv_tier.restore, RestoreMode::Never);
        assert_eq!(config.kv_tier.load_ms_per_token, KvTierConfig::default().load_ms_per_token);
        for (text, key) in [
            (r#"{"kv_tier": {"restore": "sometimes"}}"#, "kv_tier.restore"),
            (r#"{"kv_tier": {"load_ms_per_token": -1}}"#, "kv_tier.load_ms_per_token"),
            (r#"{"kv_tier": {"bandwidth": 1}}"#, "kv_tier"),
        ] {
            let msg = Config::from_json(text).unwrap_err().to_string();
            assert!(msg.contains(&format!("`{key}")), "{msg}");
        }
    }

    #[test]
    fn explicit_tool_call_markers_must_each_be_one_token() {
        let config = Config::from_json(r#"{"tool_call_markers": ["<tool_call>", "<tool>"]}"#).unwrap();
        assert!(config.tool_call_markers_explicit);
        assert_eq!(config.resolve_tool_call_markers(&[Some(7), Some(9)]), Ok(vec![7, 9]));
        let err = config.resolve_tool_call_markers(&[Some(7), None]).unwrap_err();
        let Error::InvalidConfig { key, reason } = &err else { panic!("{err:?}") };
        assert_eq!(key, "tool_call_markers[1]");
        assert_eq!(
            reason,
            "`<tool>` is not a single token of this model's vocabulary; a tool-call marker must be one token"
        );
        // Giving the default list explicitly is still explicit.
        let config = Config::from_json(r#"{"tool_call_markers": ["<tool_call>"]}"#).unwrap();
        assert!(config.tool_call_markers_explicit);
        let msg = config.resolve_tool_call_markers(&[None]).unwrap_err().to_string();
        assert!(msg.contains("tool_call_markers[0]") && msg.contains("`<tool_call>`"), "{msg}");
        // An explicit empty list resolves to no markers.
        let config = Config::from_json(r#"{"tool_call_markers": []}"#).unwrap();
        assert_eq!(config.resolve_tool_call_markers(&[]), Ok(vec![]));
    }

    #[test]
    fn the_default_tool_call_marker_is_dropped_when_not_one_token() {
        let config = Config::default();
        assert!(!config.tool_call_markers_explicit);
        assert_eq!(config.tool_call_markers, vec!["<tool_call>".to_owned()]);
        assert_eq!(config.resolve_tool_call_markers(&[Some(151_657)]), Ok(vec![151_657]));
        assert_eq!(config.resolve_tool_call_markers(&[None]), Ok(vec![]));
    }

    #[test]
    fn resolving_tool_call_markers_needs_one_entry_per_marker() {
        let config = Config::default();
        for found in [&[][..], &[Some(1), Some(2)][..]] {
            let err = config.resolve_tool_call_markers(found).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { name: "found", .. }), "{err:?}");
            let msg = err.to_string();
            assert!(msg.contains(&format!("{} entries for 1 configured marker(s)", found.len())), "{msg}");
        }
    }

    proptest! {
        #[test]
        fn resolved_tool_call_markers_keep_the_single_tokens_in_order(
            found in prop::collection::vec(prop::option::of(0u32..1000), 0..6),
            explicit: bool,
        ) {
            let config = Config {
                tool_call_markers: (0..found.len()).map(|i| format!("<m{i}>")).collect(),
                tool_call_markers_explicit: explicit,
                ..Config::default()
            };
            let single: Vec<u32> = found.iter().flatten().copied().collect();
            match config.resolve_tool_call_markers(&found) {
                Ok(ids) => {
                    prop_assert!(!explicit || ids.len() == found.len());
                    prop_assert_eq!(ids, single);
                }
                Err(Error::InvalidConfig { key, reason }) => {
                    let first_missing = found.iter().position(Option::is_none);
                    prop_assert!(explicit);
                    prop_assert_eq!(Some(key), first_missing.map(|i| format!("tool_call_markers[{i}]")));
                    prop_assert!(reason.contains(&format!("`<m{}>`", first_missing.unwrap_or(0))), "{}", reason);
                }
                Err(other) => prop_assert!(false, "{other:?}"),
            }
        }
    }

    #[test]
    fn empty_object_gives_defaults() {
        let config = Config::from_json("{}").unwrap();
        assert_eq!(config, Config::default());
        assert_eq!(config.classes.len(), 3);
        assert_eq!(config.classes[config.default_class.index()].name, "standard");
    }

    #[test]
    fn unknown_key_is_named() {
        let err = Config::from_json(r#"{"think_batch_multiplyer": 2}"#).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("think_batch_multiplyer"), "{msg}");
    }

    #[test]
    fn nested_bad_value_names_the_dotted_key() {
        let text = r#"{"classes": {"gold": {"ttft_ms": -1, "ttfat_ms": 5, "answer_tpot_ms": 5, "rank": 0}},
                       "default_class": "gold"}"#;
        let err = Config::from_json(text).unwrap_err();
        assert!(err.to_string().contains("classes.gold.ttft_ms"), "{err}");
        let err = Config::from_json(r#"{"step_time": {"per_prefill_token_ms": "fast"}}"#).unwrap_err();
        assert!(err.to_string().contains("step_time.per_prefill_token_ms"), "{err}");
    }

    #[test]
    fn default_class_must_exist() {
        let err = Config::from_json(r#"{"default_class": "gold"}"#).unwrap_err();
        assert!(err.to_string().contains("default_class"), "{err}");
    }

    #[test]
    fn priority_maps_by_threshold() {
        let config = Config::default();
        let name = |p| config.classes[config.class_for_priority(p).index()].name.clone();
        assert_eq!(name(-5), "interactive");
        assert_eq!(name(-1), "interactive");
        assert_eq!(name(0), "standard");
        assert_eq!(name(7), "batch");
    }

    #[test]
    fn thinking_control_is_off_by_default() {
        let config = Config::default();
        assert!(!config.thinking_control.is_enabled());
        assert_eq!(config.class_thinking_control, vec![None, None, None]);
        for class in 0..config.classes.len() {
            assert!(!config.thinking_control_for(ClassId(class as u8)).is_enabled());
        }
    }

    #[test]
    fn thinking_control_parses_the_documented_example() {
        let text = r#"{"thinking_control": {
            "budget_tokens": 8192,
            "load_aware": {"budget_tokens": 4096, "min_budget_tokens": 512, "attainment_floor": 0.9},
            "eat": {"alpha": 0.2, "variance_threshold": 1.25e-4, "min_lines": 25},
            "proxy": {"end_prob_threshold": 0.1, "max_end_rank": 0, "min_tokens": 128},
            "rpdi": {"high_entropy_nats": 2.0, "alpha": 0.02, "ratio_threshold": 3.0, "min_tokens": 512},
            "closing": {"closing_text": "Considering the limited time, I will answer now.\n"}
        }}"#;
        let config = Config::from_json(text).unwrap();
        let tc = &config.thinking_control;
        assert_eq!(tc.budget_tokens, Some(8192));
        assert_eq!(tc.load_aware, Some(LoadAwareBudget::default()));
        assert_eq!(tc.eat, Some(EatRule::default()));
        assert_eq!(tc.proxy, Some(ProxyRule::default()));
        assert_eq!(tc.rpdi, Some(RpdiRule::default()));
        assert_eq!(
            tc.closing.closing_text.as_deref(),
            Some("Considering the limited time, I will answer now.\n")
        );
        // An empty object per rule turns it on with the defaults; null keeps it off.
        let config = Config::from_json(r#"{"thinking_control": {"eat": {}, "rpdi": null}}"#).unwrap();
        assert_eq!(config.thinking_control.eat, Some(EatRule::default()));
        assert_eq!(config.thinking_control.rpdi, None);
        let config = Config::from_json(r#"{"thinking_control": {"proxy": {"max_end_rank": null}}}"#).unwrap();
        assert_eq!(config.thinking_control.proxy.unwrap().max_end_rank, None);
    }

    #[test]
    fn thinking_control_errors_name_the_dotted_key_and_value() {
        let err = |text: &str| Config::from_json(text).unwrap_err().to_string();
        let msg = err(r#"{"thinking_control": {"eat": {"alpha": 1.5}}}"#);
        assert!(
            msg.contains("`thinking_control.eat.alpha`") && msg.contains("1.5 is not in (0, 1)"),
            "{msg}"
        );
        let msg = err(r#"{"thinking_control": {"eat": {"alpah": 0.2}}}"#);
        assert!(msg.contains("thinking_control.eat") && msg.contains("alpah"), "{msg}");
        let msg = err(r#"{"thinking_control": {"budget_tokens": -5}}"#);
        assert!(msg.contains("thinking_control.budget_tokens"), "{msg}");
        let msg = err(r#"{"thinking_control": {"proxy": {"end_prob_threshold": 0}}}"#);
        assert!(
            msg.contains("thinking_control.proxy.end_prob_threshold") && msg.contains("0 is not"),
            "{msg}"
        );
        let msg = err(r#"{"thinking_control": {"rpdi": {"ratio_threshold": 0.5}}}"#);
        assert!(msg.contains("thinking_control.rpdi.ratio_threshold") && msg.contains("0.5"), "{msg}");
        let msg = err(r#"{"thinking_control": {"load_aware": {"attainment_floor": 1.2}}}"#);
        assert!(msg.contains("thinking_control.load_aware.attainment_floor") && msg.contains("1.2"), "{msg}");
        let msg = err(r#"{"thinking_control": {"closing": {"closing_text": ""}}}"#);
        assert!(msg.contains("thinking_control.closing.closing_text"), "{msg}");
    }

    #[test]
    fn a_class_thinking_control_replaces_the_top_level_one() {
        let text = r#"{"thinking_control": {"budget_tokens": 4000},
                       "classes": {
                         "gold": {"ttft_ms": 500, "ttfat_ms": 5000, "answer_tpot_ms": 40, "rank": 0,
                                  "thinking_control": {"eat": {}}},
                         "lead": {"ttft_ms": 5000, "ttfat_ms": 50000, "answer_tpot_ms": 400, "rank": 1},
                         "free": {"ttft_ms": 5000, "ttfat_ms": 50000, "answer_tpot_ms": 400, "rank": 2,
                                  "thinking_control": {}}
                       },
                       "default_class": "lead"}"#;
        let config = Config::from_json(text).unwrap();
        let for_class = |name| config.thinking_control_for(config.class_by_name(name).unwrap());
        assert_eq!(for_class("gold").budget_tokens, None, "replaced, not merged");
        assert_eq!(for_class("gold").eat, Some(EatRule::default()));
        assert_eq!(for_class("lead").budget_tokens, Some(4000), "no override: the top level");
        assert!(!for_class("free").is_enabled(), "an empty override turns everything off");
        let bad = text.replace(r#""eat": {}"#, r#""eat": {"min_lines": 0}"#);
        let msg = Config::from_json(&bad).unwrap_err().to_string();
        assert!(msg.contains("classes.gold.thinking_control.eat.min_lines"), "{msg}");
    }

    #[test]
    fn custom_priority_map_rejects_non_integer_keys() {
        let err = Config::from_json(r#"{"priority_map": {"high": "interactive"}}"#).unwrap_err();
        assert!(err.to_string().contains("priority_map.high"), "{err}");
    }

    /// A configuration with every key given, none at its default.
    const EVERY_KEY: &str = r#"{
        "policy": "scorpio", "default_class": "lead", "priority_map": {"-5": "gold", "3": "lead"},
        "classes": {
            "lead": {"ttft_ms": 5000, "ttfat_ms": 50000, "answer_tpot_ms": 400, "rank": 1},
            "gold": {"ttft_ms": 500, "ttfat_ms": 5000, "answer_tpot_ms": 40, "e2e_ms": 9000, "rank": 0,
                     "on_overload": "degrade",
                     "thinking_control": {"eat": {}, "proxy": {"max_end_rank": null}}}},
        "think_batch_multiplier": 3, "tpot_headroom": 0.8, "min_token_budget": 32,
        "step_time": {"base_ms": 4, "per_prefill_token_ms": 0.03, "per_decode_request_ms": 0.01,
                      "per_context_token_ms": 1e-5, "online_fit": false, "forgetting": 0.9},
        "kv_tier": {"restore": "never", "load_ms_per_token": 0.01, "online_fit": false,
                    "prefetch_requests": 2},
        "answer_kv_reserve": false, "think_kv_reserve": 0.5, "aging_ms": 2000, "starvation_ms": 30000,
        "late_wait_ttft_factor": 3, "late_think_ttfat_factor": 0.25, "uniboost_gamma_tokens_per_s": 50,
        "evict_reasoning_blocks": "never", "tool_call_markers": ["<tool>"], "stall_factor": 4,
        "think_tokens_prior": [10, 20], "answer_tokens_prior": [5],
        "predictor": {"prior_weight": 3, "memory_requests": 100, "prior_memory_requests": 50},
        "arrival_preemption": {"enabled": false, "min_interval_ms": 5, "max_per_step": 1},
        "prefix_affinity": {"enabled": false, "slack_guard_ttft_factor": 0.25},
        "overload": {"min_success_probability": 0.3, "shed_running": false, "fcfs_slack_ttft_factor": 0,
                     "tpot_guard": false, "degrade_margin_ms": 100, "on_overload": "queue",
                     "waiting_order": "slack", "shed_until": "ttft"},
        "request_log_path": "requests.jsonl", "step_log_path": "steps.jsonl", "metrics": false,
        "warm_start": false, "warm_start_path": "other.jsonl",
        "thinking_control": {"budget_tokens": 100, "load_aware": {"attainment_floor": 0.5},
                             "rpdi": {"alpha": 0.1}, "closing": {"closing_text": "Done."},
                             "boundaries": {"line_end": ["\n"], "sentence_end": ["."]}}
    }"#;

    #[test]
    fn to_json_parses_back_to_the_same_configuration() {
        for config in [Config::default(), Config::from_json(EVERY_KEY).unwrap()] {
            let text = config.to_json();
            let again = Config::from_json(&text).unwrap();
            assert_eq!(again.to_json(), text, "the same block, whatever the class order");
            let by_name = |c: &Config| {
                let mut classes = c.classes.clone();
                classes.sort_by(|a, b| a.name.cmp(&b.name));
                classes
            };
            assert_eq!(by_name(&again), by_name(&config));
            assert_eq!(Config::from_json(&again.to_json()).unwrap(), again, "exact once in name order");
        }
        // Unset keys stay unset, and the default tool-call marker stays lenient.
        let defaults: serde_json::Value = serde_json::from_str(&Config::default().to_json()).unwrap();
        for key in ["request_log_path", "step_log_path", "tool_call_markers", "warm_start_path"] {
            assert!(defaults.get(key).is_none(), "{key}");
        }
        assert!(!Config::from_json(&Config::default().to_json()).unwrap().tool_call_markers_explicit);
        assert_eq!(defaults["overload"]["min_success_probability"], 0.1);
        assert_eq!(defaults["classes"]["interactive"]["ttft_ms"], 1000.0);
        assert_eq!(defaults["priority_map"]["-1"], "interactive");
    }

    /// The schema's properties of the object at `schema` (following `$ref`s and `anyOf`s).
    fn properties<'a>(
        root: &'a serde_json::Value,
        schema: &'a serde_json::Value,
    ) -> Vec<&'a serde_json::Value> {
        if let Some(target) = schema.get("$ref").and_then(|r| r.as_str()) {
            return properties(root, root.pointer(target.trim_start_matches('#')).unwrap());
        }
        let mut found: Vec<_> = schema.get("properties").into_iter().collect();
        for options in schema.get("anyOf").and_then(|a| a.as_array()).into_iter().flatten() {
            found.extend(properties(root, options));
        }
        found
    }

    #[test]
    fn the_schema_describes_every_key_the_parser_reads() {
        let schema: serde_json::Value = serde_json::from_str(&Config::json_schema()).unwrap();
        assert_eq!(schema["additionalProperties"], false, "unknown keys are rejected");
        // Every key of a configuration with every key given is in the schema, with a description.
        fn walk(root: &serde_json::Value, schema: &serde_json::Value, value: &serde_json::Value, key: &str) {
            let Some(object) = value.as_object() else { return };
            let props = properties(root, schema);
            for (name, inner) in object {
                let dotted = format!("{key}{name}");
                let entry = props.iter().find_map(|p| p.get(name)).or_else(|| {
                    // A map such as `classes`: its values' schema.
                    let target = schema.get("additionalProperties").filter(|a| a.is_object());
                    target.map(|t| t as &serde_json::Value)
                });
                let entry = entry.unwrap_or_else(|| panic!("`{dotted}` is not in the schema"));
                if props.iter().any(|p| p.get(name).is_some()) {
                    assert!(entry.get("description").is_some(), "`{dotted}` has no description");
                }
                walk(root, entry, inner, &format!("{dotted}."));
            }
        }
        let every: serde_json::Value =
            serde_json::from_str(&Config::from_json(EVERY_KEY).unwrap().to_json()).unwrap();
        walk(&schema, &schema, &every, "");
        let policy = &properties(&schema, &schema)[0]["policy"];
        assert!(policy.to_string().contains("#/$defs/Policy"), "{policy}");
    }

    #[test]
    fn metrics_are_on_by_default_and_the_key_takes_a_bool_only() {
        assert!(Config::from_json("{}").unwrap().metrics);
        assert!(!Config::from_json(r#"{"metrics": false}"#).unwrap().metrics);
        let msg = Config::from_json(r#"{"metrics": "yes"}"#).unwrap_err().to_string();
        assert!(msg.contains("metrics"), "{msg}");
    }
}
