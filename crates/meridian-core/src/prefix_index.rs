//! Where the KV of prompt prefixes lives: a hash-chain index over the block hashes vLLM computes,
//! fed by the device prefix cache's events and the tiers' stores and evictions, answering how
//! much of a waiting request's prompt is already cached and where. vLLM's block hash of block `i`
//! covers every token up to the end of that block (it chains its parent's hash), so a request's
//! cached prefix is the longest run of its hashes, from the first, that the index holds; a cache
//! drops a request's blocks tail first (vLLM frees them in reverse and evicts the oldest free
//! block), so presence along a chain is monotone in practice and the run's end is found by
//! binary search. Invariant: a hash is in the map exactly while at least one medium holds it
//! (its residency mask is never 0); the map never grows past [`MAX_INDEXED_BLOCKS`] (stores past
//! it are dropped: the index answers less, never wrongly more).

use std::collections::hash_map::RandomState;

use hashbrown::HashMap;
use std::hash::{BuildHasher, Hasher};

use crate::kv_tier::{TierId, MAX_TIERS};

/// Most block hashes the index holds (a 16-byte-per-entry map: about 1 GiB at the bound).
pub const MAX_INDEXED_BLOCKS: usize = 1 << 25;

/// Where a block can be: the device's prefix cache or one of the registered KV tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Medium {
    /// vLLM's own prefix cache in device memory.
    Device,
    /// A tier beyond the device ([`crate::kv_tier`]).
    Tier(TierId),
}

impl Medium {
    fn bit(self) -> u32 {
        match self {
            Medium::Device => 1,
            Medium::Tier(t) => 2 << (t.index() % MAX_TIERS),
        }
    }
}

/// How much of a prompt is cached: `num_device_blocks` from the start in the device cache, then
/// `num_tier_blocks` more in `tier` (the first tier holding the block after the device's run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CachedPrefix {
    /// Blocks from the first on that the device cache holds.
    pub num_device_blocks: u32,
    /// Blocks after those that a tier holds.
    pub num_tier_blocks: u32,
    /// That tier (meaningful when `num_tier_blocks` > 0).
    pub tier: TierId,
}

/// Hashes a block hash (already a uniform 64-bit value) with one keyed multiply-rotate instead of
/// SipHash: a plan probes the index a few hundred times, and SipHash was most of its cost. The key
/// comes from the process's random state, so prompts cannot be crafted to pile into one bucket
/// without knowing it.
#[derive(Debug, Clone, Copy)]
struct KeyedMix {
    key: u64,
}

impl Default for KeyedMix {
    fn default() -> Self {
        Self { key: RandomState::new().hash_one(0x6d65_7269_6469_616e_u64) | 1 }
    }
}

impl BuildHasher for KeyedMix {
    type Hasher = MixHasher;

    fn build_hasher(&self) -> MixHasher {
        MixHasher { key: self.key, state: 0 }
    }
}

#[derive(Debug)]
struct MixHasher {
    key: u64,
    state: u64,
}

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.state
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.state = (self.state ^ x ^ self.key).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    }
}

/// The index; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct PrefixIndex {
    residency: HashMap<u64, u32, KeyedMix>,
}

impl PrefixIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Blocks the index knows of (in any medium).
    pub fn len(&self) -> usize {
        self.residency.len()
    }

    /// Bytes its map has allocated.
    pub fn heap_bytes(&self) -> usize {
        self.residency.allocation_size()
    }

    /// Whether it knows of none.
    pub fn is_empty(&self) -> bool {
        self.residency.is_empty()
    }

    /// `medium` now holds these blocks.
    pub fn on_stored(&mut self, medium: Medium, block_hashes: &[u64]) {
        let bit = medium.bit();
        for &hash in block_hashes {
            if let Some(mask) = self.residency.get_mut(&hash) {
                *mask |= bit;
            } else if self.residency.len() < MAX_INDEXED_BLOCKS {
                self.residency.insert(hash, bit);
            }
        }
    }

    /// `medium` no longer holds these blocks.
    pub fn on_removed(&mut self, medium: Medium, block_hashes: &[u64]) {
        let bit = medium.bit();
        for hash in block_hashes {
            if let Some(mask) = self.residency.get_mut(hash) {
                *mask &= !bit;
                if *mask == 0 {
                    self.residency.remove(hash);
                }
            }
        }
    }

    /// `medium` dropped everything (vLLM's `AllBlocksCleared`, a tier's reset).
    pub fn on_cleared(&mut self, medium: Medium) {
        let bit = medium.bit();
        self.residency.retain(|_, mask| {
            *mask &= !bit;
            *mask != 0
        });
    }

    /// How much of the chain `block_hashes` (a prompt's, in order) is cached, and where.
    pub fn cached_prefix(&self, block_hashes: &[u64]) -> CachedPrefix {
        if self.residency.is_empty() || block_hashes.is_empty() {
            return CachedPrefix::default();
        }
        let mask_at = |i: usize| self.residency.get(&block_hashes[i]).copied().unwrap_or(0);
        let num_device = longest_run(block_hashes.len(), |i| mask_at(i) & 1 != 0);
        let num_any = longest_run(block_hashes.len(), |i| mask_at(i) != 0).max(num_device);
        let mut cached = CachedPrefix { num_device_blocks: num_device as u32, ..CachedPrefix::default() };
        if num_any > num_device {
            let tiers = mask_at(num_device) >> 1;
            if tiers != 0 {
                cached.tier = TierId(tiers.trailing_zeros() as u8);
                cached.num_tier_blocks = (num_any - num_device) as u32;
            }
        }
        cached
    }
}

/// The length of the longest prefix `0..n` on which `present` holds, assuming presence is
/// monotone (a prefix); by binary search, `O(log n)` probes.
fn longest_run(n: usize, present: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0usize, n);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if present(mid - 1) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HOST: Medium = Medium::Tier(TierId(0));

    #[test]
    fn a_prefix_is_found_on_the_device_then_in_a_tier() {
        let mut index = PrefixIndex::new();
        let chain = [11, 12, 13, 14, 15, 16];
        assert_eq!(index.cached_prefix(&chain), CachedPrefix::default());
        index.on_stored(Medium::Device, &chain[..2]);
        index.on_stored(HOST, &chain[..5]);
        let cached = index.cached_prefix(&chain);
        assert_eq!((cached.num_device_blocks, cached.num_tier_blocks, cached.tier), (2, 3, TierId(0)));
        // Another prompt sharing the first block only.
        assert_eq!(index.cached_prefix(&[11, 99, 13]).num_device_blocks, 1);
        index.on_removed(HOST, &chain[3..5]);
        assert_eq!(index.cached_prefix(&chain).num_tier_blocks, 1);
        index.on_cleared(Medium::Device);
        let cached = index.cached_prefix(&chain);
        assert_eq!((cached.num_device_blocks, cached.num_tier_blocks), (0, 3));
        index.on_cleared(HOST);
        assert!(index.is_empty(), "a hash no medium holds leaves the map");
    }

    #[test]
    fn removing_what_is_not_there_changes_nothing() {
        let mut index = PrefixIndex::new();
        index.on_removed(Medium::Device, &[1, 2]);
        index.on_stored(Medium::Device, &[1]);
        index.on_removed(HOST, &[1]);
        assert_eq!(index.cached_prefix(&[1, 2]).num_device_blocks, 1);
    }

    proptest! {
        /// On a monotone chain the binary search finds exactly the linear walk's run.
        #[test]
        fn binary_search_matches_the_walk(len in 0usize..200, device in 0usize..200, tier in 0usize..200) {
            let chain: Vec<u64> = (0..len as u64).map(|i| i * 7919 + 1).collect();
            let (device, any) = (device.min(len), device.max(tier).min(len));
            let mut index = PrefixIndex::new();
            index.on_stored(Medium::Device, &chain[..device]);
            index.on_stored(HOST, &chain[..any]);
            let cached = index.cached_prefix(&chain);
            prop_assert_eq!(cached.num_device_blocks as usize, device);
            prop_assert_eq!(cached.num_device_blocks as usize + cached.num_tier_blocks as usize, any);
        }

        /// The mask invariant: after any sequence of events, a hash is present iff some medium
        /// stored it since it last removed it.
        #[test]
        fn residency_tracks_every_medium(events in prop::collection::vec((0u8..3, any::<bool>(), 0u64..8), 0..64)) {
            let mut index = PrefixIndex::new();
            let mut truth = std::collections::HashSet::new();
            for (m, stored, hash) in events {
                let medium = if m == 0 { Medium::Device } else { Medium::Tier(TierId(m - 1)) };
                if stored {
                    index.on_stored(medium, &[hash]);
                    truth.insert((m, hash));
                } else {
                    index.on_removed(medium, &[hash]);
                    truth.remove(&(m, hash));
                }
            }
            for hash in 0..8u64 {
                let held = truth.iter().any(|&(_, h)| h == hash);
                prop_assert_eq!(index.cached_prefix(&[hash]) != CachedPrefix::default(), held);
            }
            prop_assert_eq!(index.len(), (0..8u64).filter(|h| truth.iter().any(|&(_, x)| x == *h)).count());
        }
    }
}
