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
