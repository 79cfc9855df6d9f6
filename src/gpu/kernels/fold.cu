// The fold. `stacked` holds `world` rows of stride `ld` (a multiple of 4)
// with slot = source rank; `out + i` and every `stacked + r*ld + i` share
// one 16-byte phase (the host places rows so), which lets `fast` use float4
// on both sides. Every add is an explicit round-to-nearest add in program
// order, so nothing is contracted and the mean scale stays its own rounding.
//
// FP_STACK and FP_ADD_OP are #defines that the Rust side prepends
// (kernels/source.rs), generated from its own constants.

typedef unsigned long long u64;
typedef unsigned int u32;

// __fadd_rn/__fmul_rn: never contracted into an FMA whatever --fmad says;
// their denormal handling follows --ftz (through NVVM reflect).
__device__ __forceinline__ float fp_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float4 fp_add(float4 a, float4 b) {
    return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z),
                       __fadd_rn(a.w, b.w));
}
__device__ __forceinline__ float fp_scale(float a, float s) { return __fmul_rn(a, s); }
__device__ __forceinline__ float4 fp_scale(float4 a, float s) {
    return make_float4(__fmul_rn(a.x, s), __fmul_rn(a.y, s), __fmul_rn(a.z, s), __fmul_rn(a.w, s));
}

template <typename V> __device__ __forceinline__ V fp_load(const float* p);
template <> __device__ __forceinline__ float fp_load<float>(const float* p) { return *p; }
template <> __device__ __forceinline__ float4 fp_load<float4>(const float* p) {
    return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ void fp_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void fp_store(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

// Rows loaded before their adds in the chains (see fp_fold_at).
#define FP_BATCH 8u

// MODE 0: ascending chain from slot 0. MODE 1: chain over prog[0..world)
// (delivery order). MODE 2: postfix program (slot index = push, FP_ADD_OP =
// pop right, pop left, push left + right): the pairwise tree.
template <int MODE, typename V>
__device__ __forceinline__ V fp_fold_at(const float* __restrict__ s, u64 ld, u64 i, u32 world,
                                        const u32* __restrict__ prog, u32 prog_len) {
    if (MODE != 2) {
        // The chains load a batch of up to FP_BATCH rows, then add them in
        // order. Adding each row as it arrives keeps one load in flight per
        // thread (a loop of W-1 < 8 trips under `unroll 8` is not unrolled
        // at all): too few bytes in flight to fill HBM with 4-byte loads.
        // Batching changes when rows are loaded, never which adds happen.
        const float* base = s + i;
        V acc = fp_load<V>(base + (u64)(MODE == 0 ? 0u : prog[0]) * ld);
        for (u32 r = 1; r < world; r += FP_BATCH) {
            V v[FP_BATCH];
#pragma unroll
            for (u32 j = 0; j < FP_BATCH; ++j)
                if (r + j < world) v[j] = fp_load<V>(base + (u64)(MODE == 0 ? r + j : prog[r + j]) * ld);
#pragma unroll
            for (u32 j = 0; j < FP_BATCH; ++j)
                if (r + j < world) acc = fp_add(acc, v[j]);
        }
        return acc;
    } else {
        V st[FP_STACK];
        int top = 0;
        for (u32 k = 0; k < prog_len; ++k) {
            u32 op = prog[k];
            if (op == FP_ADD_OP) {
                V right = st[--top];
                V left = st[--top];
                st[top++] = fp_add(left, right);
            } else {
                st[top++] = fp_load<V>(s + (u64)op * ld + i);
            }
        }
        return st[0];
    }
}

template <int MODE>
__device__ __forceinline__ void fp_fold_seed(float* __restrict__ out, const float* __restrict__ s,
                                             u64 ld, u64 len, u32 world,
                                             const u32* __restrict__ prog, u32 prog_len,
                                             float scale, u32 use_scale) {
    u64 i = (u64)blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i >= len) return;
    float acc = fp_fold_at<MODE, float>(s, ld, i, world, prog, prog_len);
    if (use_scale) acc = fp_scale(acc, scale);
    out[i] = acc;
}

template <int MODE>
__device__ __forceinline__ void fp_fold_fast(float* __restrict__ out, const float* __restrict__ s,
                                             u64 ld, u64 len, u32 world,
                                             const u32* __restrict__ prog, u32 prog_len,
                                             float scale, u32 use_scale) {
    // Scalar head up to the first 16-byte boundary of out, float4 body,
    // scalar tail of < 4 elements.
    u64 head = ((16ULL - ((u64)out & 15ULL)) & 15ULL) >> 2;
    if (head > len) head = len;
    u64 nvec = (len - head) >> 2;
    u64 tail = head + nvec * 4ULL;
    u64 tid = (u64)blockIdx.x * (u64)blockDim.x + threadIdx.x;
    u64 stride = (u64)gridDim.x * (u64)blockDim.x;
    for (u64 v = tid; v < nvec; v += stride) {
        u64 i = head + v * 4ULL;
        float4 acc = fp_fold_at<MODE, float4>(s, ld, i, world, prog, prog_len);
        if (use_scale) acc = fp_scale(acc, scale);
        fp_store(out + i, acc);
    }
    if (tid < head) {
        float acc = fp_fold_at<MODE, float>(s, ld, tid, world, prog, prog_len);
        if (use_scale) acc = fp_scale(acc, scale);
        out[tid] = acc;
    }
    if (tail + tid < len) {
        u64 i = tail + tid;
        float acc = fp_fold_at<MODE, float>(s, ld, i, world, prog, prog_len);
        if (use_scale) acc = fp_scale(acc, scale);
        out[i] = acc;
    }
}

// Every entry launches with any block size up to 1024 (`--block`): the
// bound caps registers at 64 per thread, which an unbounded build of the
// order chain exceeded (68 with NVRTC 12.4 and 12.8).
#define FP_FOLD_ENTRY(NAME, IMPL, MODE)                                                   \
    extern "C" __global__ void __launch_bounds__(1024)                                    \
        NAME(float* __restrict__ out, const float* __restrict__ s, u64 ld, u64 len,       \
             u32 world, const u32* __restrict__ prog, u32 prog_len, float scale,          \
             u32 use_scale) {                                                             \
        IMPL<MODE>(out, s, ld, len, world, prog, prog_len, scale, use_scale);             \
    }

FP_FOLD_ENTRY(fp_fold_fixed_seed, fp_fold_seed, 0)
FP_FOLD_ENTRY(fp_fold_order_seed, fp_fold_seed, 1)
FP_FOLD_ENTRY(fp_fold_tree_seed, fp_fold_seed, 2)
FP_FOLD_ENTRY(fp_fold_fixed_fast, fp_fold_fast, 0)
FP_FOLD_ENTRY(fp_fold_order_fast, fp_fold_fast, 1)
FP_FOLD_ENTRY(fp_fold_tree_fast, fp_fold_fast, 2)

// The 16-bit folds (bf16, f16; `dtype` is FP_DTYPE_BF16 or FP_DTYPE_F16):
// rows and out hold the dtype's bits, 2 bytes an element. Each slot is
// widened exactly to float32 (dtype.cuh), the chain above runs in float32
// (same adds, same order), the mean scales in float32, and the result is
// narrowed once to the dtype.
//
// Template parameters, none of which changes a bit of the result:
// - DT: the dtype, FP_DTYPE_BF16 or FP_DTYPE_F16. Each entry dispatches on
//   `dtype` once, so each dtype's body is compiled on its own (0: chosen per
//   element at run time, the fold as first written; kept for measuring).
// - CONV (f16 only; bf16 widens by a shift either way): 0, the exact
//   integer conversions throughout. 1, the hardware's (dtype.cuh): they
//   equal the exact ones on every non-NaN input, and a NaN addend makes its
//   element's result a NaN (every add and the scale propagate NaN). So a
//   result with no NaN element had no NaN addend and holds the exact path's
//   bits; a result with one (a NaN addend, or inf - inf) is folded again
//   with the exact conversions.
// - N: elements of one row per thread and load: 1 (the edges), 4 (one
//   8-byte load), 8 (16 bytes) or 16 (two 16-byte loads).
// - B: rows whose loads are issued before their adds (FP_BATCH above).
// - AHEAD (fixed order): 1 issues the next batch's loads before this
//   batch's adds.

// The production shape of every 16-bit entry (fold16_trials.cu measures
// others beside it). A batch of 4 rows beat 8 at every W of the bench on
// an H100 (docs/BENCHMARKS.md, the 16-bit fold's trial sweep).
constexpr int FP_F16_CONV = 1;
constexpr int FP_FAST16_N = 8;
constexpr int FP_FAST16_BATCH = 4;
constexpr int FP_FAST16_AHEAD = 0;

// N float32 values, and the N raw 16-bit elements they come from (element
// 2k is the low half of w[k], little-endian; N = 1 uses w[0]'s low half).
template <int N> struct fp_fv {
    float v[N];
};
template <int N> struct fp_rv {
    u32 w[(N + 1) / 2];
};

template <int N>
__device__ __forceinline__ fp_fv<N> fp_add(const fp_fv<N>& a, const fp_fv<N>& b) {
    fp_fv<N> r;
#pragma unroll
    for (int k = 0; k < N; ++k) r.v[k] = __fadd_rn(a.v[k], b.v[k]);
    return r;
}
template <int N> __device__ __forceinline__ fp_fv<N> fp_scale(fp_fv<N> a, float s) {
#pragma unroll
    for (int k = 0; k < N; ++k) a.v[k] = __fmul_rn(a.v[k], s);
    return a;
}
template <int N> __device__ __forceinline__ bool fp_any_nan(const fp_fv<N>& a) {
    bool nan = false;
#pragma unroll
    for (int k = 0; k < N; ++k) nan |= a.v[k] != a.v[k];
    return nan;
}

template <int N> __device__ __forceinline__ fp_rv<N> fp_raw16(const u16* p) {
    fp_rv<N> r;
    if constexpr (N == 1) {
        r.w[0] = *p;
    } else if constexpr (N == 4) {
        uint2 q = *reinterpret_cast<const uint2*>(p);
        r.w[0] = q.x;
        r.w[1] = q.y;
    } else {
#pragma unroll
        for (int k = 0; k < N / 8; ++k) {
            uint4 q = reinterpret_cast<const uint4*>(p)[k];
            r.w[4 * k] = q.x;
            r.w[4 * k + 1] = q.y;
            r.w[4 * k + 2] = q.z;
            r.w[4 * k + 3] = q.w;
        }
    }
    return r;
}

// The two elements of word `w` widened to float32 (only `lo` for N = 1).
template <int DT, int CONV>
__device__ __forceinline__ void fp_wide2(u32 w, u32 dtype, float& lo, float& hi) {
    const u32 d = DT != 0 ? (u32)DT : dtype;
    if (DT == 0) {
        lo = __uint_as_float(fp_widen16(w & 0xFFFFu, d));
        hi = __uint_as_float(fp_widen16(w >> 16, d));
    } else if (d == FP_DTYPE_BF16) {
        lo = __uint_as_float(w << 16);
        hi = __uint_as_float(w & 0xFFFF0000u);
    } else if (CONV == 1) {
        fp_widen_f16x2_hw(w, lo, hi);
    } else {
        lo = __uint_as_float(fp_widen_f16(w & 0xFFFFu));
        hi = __uint_as_float(fp_widen_f16(w >> 16));
    }
}

template <int DT, int CONV, int N>
__device__ __forceinline__ fp_fv<N> fp_wide16(const fp_rv<N>& r, u32 dtype) {
    fp_fv<N> o;
    if constexpr (N == 1) {
        float unused;
        fp_wide2<DT, CONV>(r.w[0], dtype, o.v[0], unused);
    } else {
#pragma unroll
        for (int k = 0; k < N / 2; ++k) fp_wide2<DT, CONV>(r.w[k], dtype, o.v[2 * k], o.v[2 * k + 1]);
    }
    return o;
}

// One float32 narrowed to the dtype (CONV 1 only on a value that is not a
// NaN: see above).
template <int DT, int CONV> __device__ __forceinline__ u32 fp_narrow1(float f, u32 dtype) {
    const u32 d = DT != 0 ? (u32)DT : dtype;
    if (DT != 0 && CONV == 1 && d == FP_DTYPE_F16) return fp_narrow_f16_hw(f);
    return fp_narrow16(__float_as_uint(f), d);
}

template <int DT, int CONV, int N>
__device__ __forceinline__ void fp_store16(u16* p, const fp_fv<N>& v, u32 dtype) {
    if constexpr (N == 1) {
        *p = (u16)fp_narrow1<DT, CONV>(v.v[0], dtype);
    } else {
        u32 w[N / 2];
#pragma unroll
        for (int k = 0; k < N / 2; ++k)
            w[k] = fp_narrow1<DT, CONV>(v.v[2 * k], dtype) |
                   (fp_narrow1<DT, CONV>(v.v[2 * k + 1], dtype) << 16);
        if constexpr (N == 4) {
            *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
        } else {
#pragma unroll
            for (int k = 0; k < N / 8; ++k)
                reinterpret_cast<uint4*>(p)[k] =
                    make_uint4(w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]);
        }
    }
}

// The fixed-order chain with the next batch's loads issued before this
// batch's adds (two batches of raw words in registers): the same adds in
// the same order.
template <int DT, int CONV, int N, int B>
__device__ __forceinline__ fp_fv<N> fp_fold_fixed_ahead16(const u16* __restrict__ s, u64 ld,
                                                          u64 i, u32 world, u32 dtype) {
    const u16* base = s + i;
    fp_fv<N> acc = fp_wide16<DT, CONV, N>(fp_raw16<N>(base), dtype);
    fp_rv<N> cur[B];
#pragma unroll
    for (u32 j = 0; j < (u32)B; ++j)
        if (1 + j < world) cur[j] = fp_raw16<N>(base + (u64)(1 + j) * ld);
    for (u32 r = 1; r < world; r += B) {
        fp_rv<N> next[B];
#pragma unroll
        for (u32 j = 0; j < (u32)B; ++j)
            if (r + B + j < world) next[j] = fp_raw16<N>(base + (u64)(r + B + j) * ld);
#pragma unroll
        for (u32 j = 0; j < (u32)B; ++j)
            if (r + j < world) acc = fp_add(acc, fp_wide16<DT, CONV, N>(cur[j], dtype));
#pragma unroll
        for (u32 j = 0; j < (u32)B; ++j) cur[j] = next[j];
    }
    return acc;
}

// fp_fold_at over 16-bit rows: the same modes, adds and order (AHEAD: the
// fixed order through fp_fold_fixed_ahead16).
template <int MODE, int DT, int CONV, int N, int B, int AHEAD = 0>
__device__ __forceinline__ fp_fv<N> fp_fold_at16(const u16* __restrict__ s, u64 ld, u64 i,
                                                 u32 world, const u32* __restrict__ prog,
                                                 u32 prog_len, u32 dtype) {
    if (MODE == 0 && AHEAD) {
        return fp_fold_fixed_ahead16<DT, CONV, N, B>(s, ld, i, world, dtype);
    } else if (MODE != 2) {
        // The batch keeps the raw words, widened as they are added: the
        // registers hold B x N/2 words rather than B x N floats.
        const u16* base = s + i;
        fp_fv<N> acc =
            fp_wide16<DT, CONV, N>(fp_raw16<N>(base + (u64)(MODE == 0 ? 0u : prog[0]) * ld), dtype);
        for (u32 r = 1; r < world; r += B) {
            fp_rv<N> v[B];
#pragma unroll
            for (u32 j = 0; j < (u32)B; ++j)
                if (r + j < world)
                    v[j] = fp_raw16<N>(base + (u64)(MODE == 0 ? r + j : prog[r + j]) * ld);
#pragma unroll
            for (u32 j = 0; j < (u32)B; ++j)
                if (r + j < world) acc = fp_add(acc, fp_wide16<DT, CONV, N>(v[j], dtype));
        }
        return acc;
    } else {
        fp_fv<N> st[FP_STACK];
        int top = 0;
        for (u32 k = 0; k < prog_len; ++k) {
            u32 op = prog[k];
            if (op == FP_ADD_OP) {
                fp_fv<N> right = st[--top];
                fp_fv<N> left = st[--top];
                st[top++] = fp_add(left, right);
            } else {
                st[top++] = fp_wide16<DT, CONV, N>(fp_raw16<N>(s + (u64)op * ld + i), dtype);
            }
        }
        return st[0];
    }
}

// out[i .. i+N) of the fold.
template <int MODE, int DT, int CONV, int N, int B, int AHEAD = 0>
__device__ __forceinline__ void fp_fold_elems16(u16* __restrict__ out,
                                                const u16* __restrict__ s, u64 ld, u64 i,
                                                u32 world, const u32* __restrict__ prog,
                                                u32 prog_len, float scale, u32 use_scale,
                                                u32 dtype) {
    constexpr bool fast = DT == FP_DTYPE_F16 && CONV == 1;
    fp_fv<N> acc =
        fp_fold_at16<MODE, DT, fast ? 1 : 0, N, B, AHEAD>(s, ld, i, world, prog, prog_len, dtype);
    if (use_scale) acc = fp_scale(acc, scale);
    if (fast && fp_any_nan(acc)) {
        // A NaN addend (its payload is the contract's) or inf - inf: the
        // exact conversions, same loads and adds.
        // One element at a time: few registers for the rare path.
#pragma unroll 1
        for (u64 k = 0; k < (u64)N; ++k)
            fp_fold_elems16<MODE, DT, 0, 1, B>(out, s, ld, i + k, world, prog, prog_len, scale,
                                               use_scale, dtype);
        return;
    }
    fp_store16<DT, fast ? 1 : 0, N>(out + i, acc, dtype);
}

template <int MODE, int DT, int CONV = FP_F16_CONV, int B = FP_FAST16_BATCH>
__device__ __forceinline__ void fp_fold_seed16(u16* __restrict__ out, const u16* __restrict__ s,
                                               u64 ld, u64 len, u32 world,
                                               const u32* __restrict__ prog, u32 prog_len,
                                               float scale, u32 use_scale, u32 dtype) {
    u64 i = (u64)blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i >= len) return;
    fp_fold_elems16<MODE, DT, CONV, 1, B>(out, s, ld, i, world, prog, prog_len, scale, use_scale,
                                          dtype);
}

template <int MODE, int DT, int CONV = FP_F16_CONV, int N = FP_FAST16_N, int B = FP_FAST16_BATCH,
          int AHEAD = FP_FAST16_AHEAD>
__device__ __forceinline__ void fp_fold_fast16(u16* __restrict__ out, const u16* __restrict__ s,
                                               u64 ld, u64 len, u32 world,
                                               const u32* __restrict__ prog, u32 prog_len,
                                               float scale, u32 use_scale, u32 dtype) {
    // Scalar head up to the first 16-byte boundary of out (< 8 elements),
    // N-element body, scalar tail of < N elements.
    u64 head = ((16ULL - ((u64)out & 15ULL)) & 15ULL) >> 1;
    if (head > len) head = len;
    u64 nvec = (len - head) / (u64)N;
    u64 tail = head + nvec * (u64)N;
    u64 tid = (u64)blockIdx.x * (u64)blockDim.x + threadIdx.x;
    u64 stride = (u64)gridDim.x * (u64)blockDim.x;
    // The edges first: nothing of them stays live across the body's loop,
    // whose registers the batch takes (spills went from 96 to 12 bytes on
    // sm_90). DT 0, the fold as first written, keeps them after it.
    if constexpr (DT != 0) {
        if (tid < head)
            fp_fold_elems16<MODE, DT, CONV, 1, B>(out, s, ld, tid, world, prog, prog_len, scale,
                                                  use_scale, dtype);
        if (tail + tid < len)
            fp_fold_elems16<MODE, DT, CONV, 1, B>(out, s, ld, tail + tid, world, prog, prog_len,
                                                  scale, use_scale, dtype);
    }
    for (u64 v = tid; v < nvec; v += stride)
        fp_fold_elems16<MODE, DT, CONV, N, B, AHEAD>(out, s, ld, head + v * (u64)N, world, prog,
                                                     prog_len, scale, use_scale, dtype);
    if constexpr (DT == 0) {
        if (tid < head)
            fp_fold_elems16<MODE, DT, CONV, 1, B>(out, s, ld, tid, world, prog, prog_len, scale,
                                                  use_scale, dtype);
        if (tail + tid < len)
            fp_fold_elems16<MODE, DT, CONV, 1, B>(out, s, ld, tail + tid, world, prog, prog_len,
                                                  scale, use_scale, dtype);
    }
}

// `dtype` is dispatched once per launch (a uniform branch).
#define FP_FOLD16_ENTRY(NAME, IMPL, MODE)                                                 \
    extern "C" __global__ void __launch_bounds__(1024)                                    \
        NAME(u16* __restrict__ out, const u16* __restrict__ s, u64 ld, u64 len,           \
             u32 world, const u32* __restrict__ prog, u32 prog_len, float scale,          \
             u32 use_scale, u32 dtype) {                                                  \
        if (dtype == FP_DTYPE_BF16)                                                       \
            IMPL<MODE, FP_DTYPE_BF16>(out, s, ld, len, world, prog, prog_len, scale,      \
                                      use_scale, dtype);                                  \
        else                                                                              \
            IMPL<MODE, FP_DTYPE_F16>(out, s, ld, len, world, prog, prog_len, scale,       \
                                     use_scale, dtype);                                   \
    }

FP_FOLD16_ENTRY(fp_fold_fixed_seed16, fp_fold_seed16, 0)
FP_FOLD16_ENTRY(fp_fold_order_seed16, fp_fold_seed16, 1)
FP_FOLD16_ENTRY(fp_fold_tree_seed16, fp_fold_seed16, 2)
FP_FOLD16_ENTRY(fp_fold_fixed_fast16, fp_fold_fast16, 0)
FP_FOLD16_ENTRY(fp_fold_order_fast16, fp_fold_fast16, 1)
FP_FOLD16_ENTRY(fp_fold_tree_fast16, fp_fold_fast16, 2)
