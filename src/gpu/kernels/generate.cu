// The addend generator on the device: `crate::data` step for step, integer
// operations only. The only float operations are exact int -> f32
// conversions of integers below 2^24 and one multiply by 2^-24 whose
// results are normal.
//
// FP_GAMMA, FP_MIX64_M1/M2 and the FP_DIST_* codes are #defines that the
// Rust side prepends (kernels/source.rs), generated from its own constants.

typedef unsigned long long u64;
typedef unsigned int u32;

__device__ __forceinline__ u64 fp_mix64(u64 z) {
    z = (z ^ (z >> 30)) * FP_MIX64_M1;
    z = (z ^ (z >> 27)) * FP_MIX64_M2;
    return z ^ (z >> 31);
}

__device__ __forceinline__ u64 fp_element_bits(u64 key, u64 index) {
    return fp_mix64(key + index * FP_GAMMA);
}

__device__ __forceinline__ u32 fp_parts(u64 sign, u64 exponent, u64 mantissa) {
    return ((u32)sign << 31) | ((u32)exponent << 23) | ((u32)mantissa & 0x007FFFFFu);
}

__device__ __forceinline__ u32 fp_mixed_magnitude(u64 u) {
    u64 e = 115ULL + ((((u >> 32) & 0xFFULL) * 24ULL) >> 8);
    return fp_parts(u >> 63, e, u);
}

__device__ __forceinline__ u32 fp_addend_bits(u32 dist, u64 u, u64 pair_u, u32 rank) {
    switch (dist) {
    case FP_DIST_MIXED_MAGNITUDE:
        return fp_mixed_magnitude(u);
    case FP_DIST_UNIFORM: {
        int i = (int)(u >> 39) - (1 << 24);
        return __float_as_uint(__fmul_rn(__int2float_rn(i), 5.9604644775390625e-08f));
    }
    case FP_DIST_CANCELLATION: {
        u64 e = 137ULL + ((((pair_u >> 32) & 0xFFULL) * 11ULL) >> 8);
        if ((rank & 1u) == 0u) return fp_parts(0, e, pair_u);
        return fp_parts(1, e, (pair_u & ~0xFFULL) | (u & 0xFFULL));
    }
    case FP_DIST_SUBNORMAL_HEAVY: {
        u64 sel = (u >> 32) & 3ULL;
        u64 e = sel == 3ULL ? 1ULL + ((u >> 34) & 3ULL) : 0ULL;
        return fp_parts(u >> 63, e, u);
    }
    case FP_DIST_SPECIALS:
        switch ((u32)((u >> 32) & 63ULL)) {
        case 0: return 0x7F800000u;
        case 1: return 0xFF800000u;
        case 2: return ((u32)(u >> 63) << 31) | 0x7FC00000u | ((u32)u & 0x003FFFFFu);
        case 3: return 0x80000000u;
        case 4: return 0x00000000u;
        default: return fp_mixed_magnitude(u);
        }
    case FP_DIST_EXACT_INTEGERS: {
        int i = (int)(u >> 48) - (1 << 15);
        return __float_as_uint(__int2float_rn(i));
    }
    default:
        // A code the host does not send: a bug, never data. Stop the
        // kernel (the launch fails) instead of inventing addends.
        __trap();
        return 0u;
    }
}

// out[j] = bits of element first + j of one lane, j < n.
extern "C" __global__ void fp_generate(u32* __restrict__ out, u64 n, u64 first,
                                       u64 key, u64 pair_key, u32 rank, u32 dist) {
    u64 stride = (u64)gridDim.x * (u64)blockDim.x;
    for (u64 j = (u64)blockIdx.x * (u64)blockDim.x + threadIdx.x; j < n; j += stride) {
        u64 idx = first + j;
        u64 u = fp_element_bits(key, idx);
        u64 pu = dist == FP_DIST_CANCELLATION ? fp_element_bits(pair_key, idx) : 0ULL;
        out[j] = fp_addend_bits(dist, u, pu, rank);
    }
}

// The same lane in a 16-bit dtype: each element's float32 bits rounded
// once (dtype.cuh), stored as 2 bytes.
extern "C" __global__ void fp_generate16(u16* __restrict__ out, u64 n, u64 first, u64 key,
                                         u64 pair_key, u32 rank, u32 dist, u32 dtype) {
    u64 stride = (u64)gridDim.x * (u64)blockDim.x;
    for (u64 j = (u64)blockIdx.x * (u64)blockDim.x + threadIdx.x; j < n; j += stride) {
        u64 idx = first + j;
        u64 u = fp_element_bits(key, idx);
        u64 pu = dist == FP_DIST_CANCELLATION ? fp_element_bits(pair_key, idx) : 0ULL;
        out[j] = (u16)fp_narrow16(fp_addend_bits(dist, u, pu, rank), dtype);
    }
}

// The conversions alone, for checking them against the host's on every
// input: out[j] = narrow(first + j) and wide[j] = widen(first + j). `hw` 1
// checks what the f16 folds' fast path runs (dtype.cuh's fp_*_f16_hw, the
// widening two elements of a word at a time as the folds load them); 0, and
// every bf16 call, the exact conversions.
extern "C" __global__ void fp_narrow_bits(u16* __restrict__ out, u64 n, u32 first, u32 dtype,
                                          u32 hw) {
    u64 stride = (u64)gridDim.x * (u64)blockDim.x;
    for (u64 j = (u64)blockIdx.x * (u64)blockDim.x + threadIdx.x; j < n; j += stride) {
        u32 b = first + (u32)j;
        out[j] = (u16)(hw && dtype == FP_DTYPE_F16 ? fp_narrow_f16_hw(__uint_as_float(b))
                                                   : fp_narrow16(b, dtype));
    }
}

// With `hw`, n must be even (pairs).
extern "C" __global__ void fp_widen_bits(u32* __restrict__ wide, u64 n, u32 first, u32 dtype,
                                         u32 hw) {
    u64 stride = (u64)gridDim.x * (u64)blockDim.x;
    for (u64 j = (u64)blockIdx.x * (u64)blockDim.x + threadIdx.x; j < n; j += stride) {
        if (hw && dtype == FP_DTYPE_F16) {
            if (2 * j + 1 >= n) break;
            u32 lo_bits = (first + 2 * (u32)j) & 0xFFFFu;
            u32 hi_bits = (first + 2 * (u32)j + 1) & 0xFFFFu;
            float lo, hi;
            fp_widen_f16x2_hw(lo_bits | (hi_bits << 16), lo, hi);
            wide[2 * j] = __float_as_uint(lo);
            wide[2 * j + 1] = __float_as_uint(hi);
        } else {
            wide[j] = fp_widen16((first + (u32)j) & 0xFFFFu, dtype);
        }
    }
}
