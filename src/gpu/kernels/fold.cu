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
// narrowed once to the dtype. `fast` moves 8 elements per 16-byte load;
// the batch keeps the raw 16-byte words, widened as they are added, so the
// registers hold 8 x 4 words rather than 8 x 8 floats.

struct fp_f8 {
    float v[8];
};

__device__ __forceinline__ fp_f8 fp_add(const fp_f8& a, const fp_f8& b) {
    fp_f8 r;
#pragma unroll
    for (int k = 0; k < 8; ++k) r.v[k] = __fadd_rn(a.v[k], b.v[k]);
    return r;
}
__device__ __forceinline__ fp_f8 fp_scale(fp_f8 a, float s) {
#pragma unroll
    for (int k = 0; k < 8; ++k) a.v[k] = __fmul_rn(a.v[k], s);
    return a;
}

// R: what one load brings (one u16, or a uint4 of 8); V: its float32 value(s).
template <typename R> __device__ __forceinline__ R fp_raw(const u16* p);
template <> __device__ __forceinline__ u16 fp_raw<u16>(const u16* p) { return *p; }
template <> __device__ __forceinline__ uint4 fp_raw<uint4>(const u16* p) {
    return *reinterpret_cast<const uint4*>(p);
}

__device__ __forceinline__ float fp_wide(u16 r, u32 dtype) {
    return __uint_as_float(fp_widen16(r, dtype));
}
// Element 0 is the low half of the first word (little-endian).
__device__ __forceinline__ fp_f8 fp_wide(uint4 q, u32 dtype) {
    u32 w[4] = {q.x, q.y, q.z, q.w};
    fp_f8 r;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        r.v[2 * k] = __uint_as_float(fp_widen16(w[k] & 0xFFFFu, dtype));
        r.v[2 * k + 1] = __uint_as_float(fp_widen16(w[k] >> 16, dtype));
    }
    return r;
}

__device__ __forceinline__ void fp_store16(u16* p, float v, u32 dtype) {
    *p = (u16)fp_narrow16(__float_as_uint(v), dtype);
}
__device__ __forceinline__ void fp_store16(u16* p, const fp_f8& v, u32 dtype) {
    u32 w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        w[k] = fp_narrow16(__float_as_uint(v.v[2 * k]), dtype) |
               (fp_narrow16(__float_as_uint(v.v[2 * k + 1]), dtype) << 16);
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

// fp_fold_at over 16-bit rows: the same modes, adds and order.
template <int MODE, typename V, typename R>
__device__ __forceinline__ V fp_fold_at16(const u16* __restrict__ s, u64 ld, u64 i, u32 world,
                                          const u32* __restrict__ prog, u32 prog_len, u32 dtype) {
    if (MODE != 2) {
        const u16* base = s + i;
        V acc = fp_wide(fp_raw<R>(base + (u64)(MODE == 0 ? 0u : prog[0]) * ld), dtype);
        for (u32 r = 1; r < world; r += FP_BATCH) {
            R v[FP_BATCH];
#pragma unroll
            for (u32 j = 0; j < FP_BATCH; ++j)
                if (r + j < world) v[j] = fp_raw<R>(base + (u64)(MODE == 0 ? r + j : prog[r + j]) * ld);
#pragma unroll
            for (u32 j = 0; j < FP_BATCH; ++j)
                if (r + j < world) acc = fp_add(acc, fp_wide(v[j], dtype));
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
                st[top++] = fp_wide(fp_raw<R>(s + (u64)op * ld + i), dtype);
            }
        }
        return st[0];
    }
}

template <int MODE>
__device__ __forceinline__ void fp_fold_seed16(u16* __restrict__ out, const u16* __restrict__ s,
                                               u64 ld, u64 len, u32 world,
                                               const u32* __restrict__ prog, u32 prog_len,
                                               float scale, u32 use_scale, u32 dtype) {
    u64 i = (u64)blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i >= len) return;
    float acc = fp_fold_at16<MODE, float, u16>(s, ld, i, world, prog, prog_len, dtype);
    if (use_scale) acc = fp_scale(acc, scale);
    fp_store16(out + i, acc, dtype);
}

template <int MODE>
__device__ __forceinline__ void fp_fold_fast16(u16* __restrict__ out, const u16* __restrict__ s,
                                               u64 ld, u64 len, u32 world,
                                               const u32* __restrict__ prog, u32 prog_len,
                                               float scale, u32 use_scale, u32 dtype) {
    // Scalar head up to the first 16-byte boundary of out (< 8 elements),
    // 8-element body, scalar tail of < 8 elements.
    u64 head = ((16ULL - ((u64)out & 15ULL)) & 15ULL) >> 1;
    if (head > len) head = len;
    u64 nvec = (len - head) >> 3;
    u64 tail = head + nvec * 8ULL;
    u64 tid = (u64)blockIdx.x * (u64)blockDim.x + threadIdx.x;
    u64 stride = (u64)gridDim.x * (u64)blockDim.x;
    for (u64 v = tid; v < nvec; v += stride) {
        u64 i = head + v * 8ULL;
        fp_f8 acc = fp_fold_at16<MODE, fp_f8, uint4>(s, ld, i, world, prog, prog_len, dtype);
        if (use_scale) acc = fp_scale(acc, scale);
        fp_store16(out + i, acc, dtype);
    }
    if (tid < head) {
        float acc = fp_fold_at16<MODE, float, u16>(s, ld, tid, world, prog, prog_len, dtype);
        if (use_scale) acc = fp_scale(acc, scale);
        fp_store16(out + tid, acc, dtype);
    }
    if (tail + tid < len) {
        u64 i = tail + tid;
        float acc = fp_fold_at16<MODE, float, u16>(s, ld, i, world, prog, prog_len, dtype);
        if (use_scale) acc = fp_scale(acc, scale);
        fp_store16(out + i, acc, dtype);
    }
}

#define FP_FOLD16_ENTRY(NAME, IMPL, MODE)                                                 \
    extern "C" __global__ void __launch_bounds__(1024)                                    \
        NAME(u16* __restrict__ out, const u16* __restrict__ s, u64 ld, u64 len,           \
             u32 world, const u32* __restrict__ prog, u32 prog_len, float scale,          \
             u32 use_scale, u32 dtype) {                                                  \
        IMPL<MODE>(out, s, ld, len, world, prog, prog_len, scale, use_scale, dtype);      \
    }

FP_FOLD16_ENTRY(fp_fold_fixed_seed16, fp_fold_seed16, 0)
FP_FOLD16_ENTRY(fp_fold_order_seed16, fp_fold_seed16, 1)
FP_FOLD16_ENTRY(fp_fold_tree_seed16, fp_fold_seed16, 2)
FP_FOLD16_ENTRY(fp_fold_fixed_fast16, fp_fold_fast16, 0)
FP_FOLD16_ENTRY(fp_fold_order_fast16, fp_fold_fast16, 1)
FP_FOLD16_ENTRY(fp_fold_tree_fast16, fp_fold_fast16, 2)
