// Per-request thinking-control signal state, updated on the device from one step's per-row
// entropies. Requests live in fixed slots; a launch covers the active slots in CSR form
// (`slot_ids[i]` owns rows `row_offsets[i] .. row_offsets[i+1]`, in generation order), so one
// thread walks one request's rows sequentially: no two threads ever touch the same slot, and
// spec-decode steps with several rows per request stay ordered and race-free.
//
// Per row, either
//   - an EAT probe row (`row_is_probe` = 1): its entropy is the EAT value; update the
//     exponentially weighted mean and variance:  d = x − mean; mean += a·d; var = (1 − a)(var + a·d²)
//     (the first probe sets mean = x, var = 0), and count it;
//   - an ordinary reasoning row: RPDI counters — tokens seen, tokens whose entropy exceeds
//     `high_entropy_nats` ("transition" tokens), and the local (EMA) rate of such tokens.
//
// Entry point (extern "C"): update_signals. Launch: one thread per active slot, any block size.

extern "C" __global__ void update_signals(
    const float* __restrict__ entropy, const unsigned char* __restrict__ row_is_probe,
    const int* __restrict__ slot_ids, const int* __restrict__ row_offsets, int num_active,
    float eat_alpha, float high_entropy_nats, float rpdi_alpha,
    float* __restrict__ eat_mean, float* __restrict__ eat_var, int* __restrict__ eat_count,
    int* __restrict__ rpdi_num_tokens, int* __restrict__ rpdi_num_high, float* __restrict__ rpdi_local_rate) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= num_active) return;
    const int slot = slot_ids[i];
    float mean = eat_mean[slot], var = eat_var[slot];
    int count = eat_count[slot];
    int num_tokens = rpdi_num_tokens[slot], num_high = rpdi_num_high[slot];
    float local = rpdi_local_rate[slot];
    for (int r = row_offsets[i]; r < row_offsets[i + 1]; ++r) {
        const float x = entropy[r];
        // A non-finite or impossible entropy (no vocabulary reaches 32 nats) would poison the
        // EMAs for good: skip the row, exactly as the CPU decider does.
        if (!(fabsf(x) <= 32.0f)) continue;
        if (row_is_probe[r]) {
            if (count == 0) {
                mean = x;
                var = 0.0f;
            } else {
                const float d = x - mean;
                mean += eat_alpha * d;
                var = (1.0f - eat_alpha) * (var + eat_alpha * d * d);
            }
            ++count;
        } else {
            const float high = x > high_entropy_nats ? 1.0f : 0.0f;
            ++num_tokens;
            num_high += (int)high;
            local += rpdi_alpha * (high - local);
        }
    }
    eat_mean[slot] = mean;
    eat_var[slot] = var;
    eat_count[slot] = count;
    rpdi_num_tokens[slot] = num_tokens;
    rpdi_num_high[slot] = num_high;
    rpdi_local_rate[slot] = local;
}
