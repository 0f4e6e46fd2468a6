//! The signals the entropy rules read: the EAT series (entropy after the reasoning-end marker,
//! one value per reasoning line) and the RPDI series (the rate of high-entropy transition tokens,
//! local against global). The updates run in f32 with a fixed operation order and no fused
//! multiply-add, so a decision depends on the signals alone, never on the device that measured
//! them. Invariant: an update takes any value; which values are usable (finite, within
//! ±[`MAX_ENTROPY_NATS`]) is said here once, and the decision state feeds only those.

/// Largest entropy, in nats, accepted as a signal. No distribution over a vocabulary that `u32`
/// token ids can index exceeds `ln 2³² ≈ 22.2` nats, so a larger value is a caller bug; the
/// bound also keeps every EMA finite (`|d| ≤ 64`, so `d²` cannot overflow f32). Values are
/// accepted when `|x| ≤ 32`: tiny negative entropies from rounding go through as measured.
pub const MAX_ENTROPY_NATS: f32 = 32.0;

/// EAT signal state of one request, updated by [`eat_update`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EatSignal {
    /// Exponentially weighted mean of the EAT values, nats.
    pub mean: f32,
    /// Exponentially weighted variance (West form), nats².
    pub var: f32,
    /// Probes taken.
    pub count: u32,
}

/// RPDI signal state of one request, updated by [`rpdi_update`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RpdiSignal {
    /// Tokens with a usable entropy.
    pub num_tokens: u32,
    /// Of those, tokens whose entropy exceeded the threshold (transition tokens).
    pub num_high: u32,
    /// EMA of the transition indicator (starts at 0).
    pub local_rate: f32,
}

/// One EAT probe, in f32, in this operation order and without fused multiply-add: the first
/// probe sets `mean = x, var = 0`; later ones `d = x − mean; mean += α·d; var = (1 − α)(var +
/// α·d·d)`. It takes any value: the caller filters unusable ones (see [`MAX_ENTROPY_NATS`]).
pub fn eat_update(signal: &mut EatSignal, x: f32, alpha: f32) {
    if signal.count == 0 {
        signal.mean = x;
        signal.var = 0.0;
    } else {
        let d = x - signal.mean;
        signal.mean += alpha * d;
        signal.var = (1.0 - alpha) * (signal.var + alpha * d * d);
    }
    signal.count = signal.count.saturating_add(1);
}

/// One ordinary reasoning token, in f32, in this operation order: `high = x > threshold ? 1 :
/// 0`; count it; `local += α·(high − local)`.
pub fn rpdi_update(signal: &mut RpdiSignal, x: f32, high_entropy_nats: f32, alpha: f32) {
    let is_high = x > high_entropy_nats;
    let high: f32 = if is_high { 1.0 } else { 0.0 };
    signal.num_tokens = signal.num_tokens.saturating_add(1);
    signal.num_high = signal.num_high.saturating_add(u32::from(is_high));
    signal.local_rate += alpha * (high - signal.local_rate);
}

/// Whether an entropy may enter an EMA: finite and within ±[`MAX_ENTROPY_NATS`].
pub(super) fn usable_entropy(x: f32) -> bool {
    x.abs() <= MAX_ENTROPY_NATS
}
