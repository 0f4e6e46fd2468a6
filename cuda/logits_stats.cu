// Per-row statistics of next-token logits in one pass over each row: the log-sum-exp, the
// entropy of the softmax in nats, and for each of a small shared set of target token ids (e.g.
// the reasoning-end marker) its probability and its rank (how many tokens have a strictly larger
// logit). One block per row; each thread keeps an online-softmax triple (max m, sum s = Σe^(x-m),
// u = Σe^(x-m)(x-m)) over a strided slice, and the block merges the triples, so every logit is
// read from device memory exactly once. Entropy = log s − u/s. Tokens masked to -inf contribute
// nothing; a row that is entirely -inf yields lse = -inf, entropy = 0, probabilities 0.
//
// Entry points (extern "C", no name mangling), all with the same signature:
//   logits_stats_{f32,bf16}_k{2,8}          16-byte vector loads (row stride and base aligned)
//   logits_stats_{f32,bf16}_scalar_k{2,8}   any stride and alignment
// where k is the most target ids the variant handles (the launcher picks the smallest that fits).
// Launch: grid = num_rows, block = LOGITS_STATS_THREADS, no dynamic shared memory.

// bf16 is handled as its raw 16 bits (no cuda_bf16.h: NVRTC then needs no toolkit headers):
// the float with the same sign, exponent and top 7 mantissa bits.
typedef unsigned short bf16_bits;

#define LOGITS_STATS_THREADS 1024
#define MAX_TARGETS 8
#define NEG_INF (-__int_as_float(0x7f800000))

struct Triple {
    float m;  // running max
    float s;  // sum of exp(x - m)
    float u;  // sum of exp(x - m) * (x - m)
};

// Moves the triple to a larger max: e^(m-new) shrinks the sums; u also shifts by (m - new) per
// unit of mass. From m = -inf the sums are still zero (and (-inf)·0 would be NaN), so only m moves.
__device__ __forceinline__ void triple_raise_max(Triple& t, float new_max) {
    if (t.m > NEG_INF) {
        const float d = t.m - new_max;
        const float scale = __expf(d);
        t.u = scale * (t.u + d * t.s);
        t.s = scale * t.s;
    }
    t.m = new_max;
}

__device__ __forceinline__ void triple_add(Triple& t, float x) {
    if (!(x > NEG_INF)) return;  // masked token (or NaN): no probability mass
    if (x > t.m) triple_raise_max(t, x);
    float d = x - t.m;
    float e = __expf(d);
    t.s += e;
    t.u += e * d;
}

__device__ __forceinline__ Triple triple_merge(Triple a, Triple b) {
    if (!(a.m > NEG_INF)) return b;
    if (!(b.m > NEG_INF)) return a;
    float m = fmaxf(a.m, b.m);
    float da = a.m - m, db = b.m - m;
    float ea = __expf(da), eb = __expf(db);
    Triple r;
    r.m = m;
    r.s = ea * a.s + eb * b.s;
    r.u = ea * (a.u + da * a.s) + eb * (b.u + db * b.s);
    return r;
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16_bits x) { return __uint_as_float(((unsigned int)x) << 16); }

template <typename T>
struct Vec16;  // 16 bytes of T
template <>
struct Vec16<float> {
    static constexpr int N = 4;
    __device__ __forceinline__ static void load(const float* p, float* out) {
        float4 v = *reinterpret_cast<const float4*>(p);
        out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
    }
};
template <>
struct Vec16<bf16_bits> {
    static constexpr int N = 8;
    __device__ __forceinline__ static void load(const bf16_bits* p, float* out) {
        uint4 v = *reinterpret_cast<const uint4*>(p);
        const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            out[2 * i] = __uint_as_float(w[i] << 16);
            out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
};

// One thread's running statistics: the softmax triple plus, for each of K target slots, how many
// values exceeded the target's logit. Unused slots hold +inf, so they never count and need no
// predicate. K is a compile-time constant: the arrays stay in registers.
template <int K>
struct Acc {
    Triple t;
    float target_logit[K];
    int greater[K];

    __device__ __forceinline__ void add(float v) {
        triple_add(t, v);
#pragma unroll
        for (int k = 0; k < K; ++k) greater[k] += v > target_logit[k] ? 1 : 0;
    }

    // A whole loaded vector at once: one max and at most one rescale per vector instead of a
    // compare-and-branch per element, which is what bounds the bf16 path (8 values per load).
    template <int N>
    __device__ __forceinline__ void add_vector(const float (&v)[N]) {
        float vmax = v[0];
#pragma unroll
        for (int j = 1; j < N; ++j) vmax = fmaxf(vmax, v[j]);
        if (!(vmax > NEG_INF)) return;  // all masked
        if (vmax > t.m) triple_raise_max(t, vmax);
#pragma unroll
        for (int j = 0; j < N; ++j) {
            // Masked values give d = -inf: clamp so that e·d is 0·(-FLT_MAX) = 0, not NaN.
            const float d = fmaxf(v[j] - t.m, -3.0e38f);
            const float e = __expf(d);
            t.s += e;
            t.u = fmaf(e, d, t.u);
#pragma unroll
            for (int k = 0; k < K; ++k) greater[k] += v[j] > target_logit[k] ? 1 : 0;
        }
    }

    __device__ __forceinline__ void merge_from_lane(int offset) {
        Triple o;
        o.m = __shfl_down_sync(0xffffffff, t.m, offset);
        o.s = __shfl_down_sync(0xffffffff, t.s, offset);
        o.u = __shfl_down_sync(0xffffffff, t.u, offset);
        t = triple_merge(t, o);
#pragma unroll
        for (int k = 0; k < K; ++k) greater[k] += __shfl_down_sync(0xffffffff, greater[k], offset);
    }
};

template <typename T, bool VECTOR, int K>
__device__ __forceinline__ void logits_stats_row(const T* __restrict__ logits, long long row_stride,
                                                 int vocab_size, const int* __restrict__ target_ids,
                                                 int num_targets, float* __restrict__ lse_out,
                                                 float* __restrict__ entropy_out,
                                                 float* __restrict__ target_prob_out,
                                                 int* __restrict__ target_rank_out) {
    __shared__ float shared_target_logit[MAX_TARGETS];
    __shared__ Triple shared_triples[LOGITS_STATS_THREADS / 32];
    __shared__ int shared_counts[LOGITS_STATS_THREADS / 32][K];

    const int row = blockIdx.x;
    const T* x = logits + (long long)row * row_stride;
    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;

    if (tid < MAX_TARGETS) {
        const int id = tid < num_targets ? target_ids[tid] : -1;
        shared_target_logit[tid] = (id >= 0 && id < vocab_size) ? to_float(x[id]) : NEG_INF;
    }
    __syncthreads();
    Acc<K> acc;
    acc.t = Triple{NEG_INF, 0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < K; ++k) {
        acc.target_logit[k] = k < num_targets ? shared_target_logit[k] : __int_as_float(0x7f800000);
        acc.greater[k] = 0;
    }

    int start = 0;
    if (VECTOR) {
        constexpr int N = Vec16<T>::N;
        const int num_vectors = vocab_size / N;
        const int step = blockDim.x;
        int i = tid;
        // Two 16-byte loads in flight per thread before any arithmetic: with one 1,024-thread block
        // per SM that is 32 KiB outstanding, enough to cover HBM latency at full bandwidth.
        for (; i + step < num_vectors; i += 2 * step) {
            float a[N], b[N];
            Vec16<T>::load(x + (long long)i * N, a);
            Vec16<T>::load(x + (long long)(i + step) * N, b);
            acc.add_vector(a);
            acc.add_vector(b);
        }
        if (i < num_vectors) {
            float a[N];
            Vec16<T>::load(x + (long long)i * N, a);
            acc.add_vector(a);
        }
        start = num_vectors * N;
    }
    for (int i = start + tid; i < vocab_size; i += blockDim.x) acc.add(to_float(x[i]));

    // Warp reduction, then one warp merges the per-warp results.
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) acc.merge_from_lane(offset);
    if (lane == 0) {
        shared_triples[warp] = acc.t;
#pragma unroll
        for (int k = 0; k < K; ++k) shared_counts[warp][k] = acc.greater[k];
    }
    __syncthreads();
    if (warp != 0) return;
    const int num_warps = blockDim.x >> 5;
    acc.t = lane < num_warps ? shared_triples[lane] : Triple{NEG_INF, 0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < K; ++k) acc.greater[k] = lane < num_warps ? shared_counts[lane][k] : 0;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) acc.merge_from_lane(offset);
    if (lane != 0) return;
    const Triple t = acc.t;
    const bool any = t.m > NEG_INF;
    const float lse = any ? t.m + __logf(t.s) : NEG_INF;
    lse_out[row] = lse;
    entropy_out[row] = any ? fmaxf(__logf(t.s) - t.u / t.s, 0.0f) : 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        if (k < num_targets) {
            const float xk = shared_target_logit[k];
            target_prob_out[row * num_targets + k] = (any && xk > NEG_INF) ? __expf(xk - lse) : 0.0f;
            target_rank_out[row * num_targets + k] = acc.greater[k];
        }
    }
}

#define LOGITS_STATS_ENTRY(NAME, T, VECTOR, K)                                                            \
    extern "C" __global__ void __launch_bounds__(LOGITS_STATS_THREADS)                                   \
        NAME(const T* __restrict__ logits, long long row_stride, int vocab_size,                         \
             const int* __restrict__ target_ids, int num_targets, float* __restrict__ lse_out,          \
             float* __restrict__ entropy_out, float* __restrict__ target_prob_out,                      \
             int* __restrict__ target_rank_out) {                                                        \
        logits_stats_row<T, VECTOR, K>(logits, row_stride, vocab_size, target_ids, num_targets, lse_out, \
                                       entropy_out, target_prob_out, target_rank_out);                  \
    }

// Suffix _k<K>: compiled for at most K target ids (the launcher picks the smallest that fits).
LOGITS_STATS_ENTRY(logits_stats_f32_k2, float, true, 2)
LOGITS_STATS_ENTRY(logits_stats_f32_k8, float, true, 8)
LOGITS_STATS_ENTRY(logits_stats_bf16_k2, bf16_bits, true, 2)
LOGITS_STATS_ENTRY(logits_stats_bf16_k8, bf16_bits, true, 8)
LOGITS_STATS_ENTRY(logits_stats_f32_scalar_k2, float, false, 2)
LOGITS_STATS_ENTRY(logits_stats_f32_scalar_k8, float, false, 8)
LOGITS_STATS_ENTRY(logits_stats_bf16_scalar_k2, bf16_bits, false, 2)
LOGITS_STATS_ENTRY(logits_stats_bf16_scalar_k8, bf16_bits, false, 8)
