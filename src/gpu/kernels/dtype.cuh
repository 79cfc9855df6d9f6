// Conversions between float32 bits and the 16-bit dtypes. The exact ones
// are integer operations written line for line after src/dtype.rs: the
// host and the device agree on every input, NaN payloads included. The
// f16 folds' fast path uses the hardware's (fp_*_f16_hw, below) where no
// NaN can be involved. The GPU suite checks both on every input.
// FP_DTYPE_* are #defines the Rust side prepends (kernels/source.rs).

typedef unsigned short u16;

// bfloat16 is the top half of a binary32: widening appends 16 zero bits.
__device__ __forceinline__ unsigned int fp_widen_bf16(unsigned int h) { return h << 16; }

// binary32 to bfloat16, nearest-even; a NaN keeps its sign and the top of
// its payload and is made quiet.
__device__ __forceinline__ unsigned int fp_narrow_bf16(unsigned int b) {
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) return ((b >> 16) | 0x0040u) & 0xFFFFu;
    // 0x7FFF plus the kept part's lowest bit rounds half to even; a carry
    // out of the fraction steps the exponent, up to infinity.
    return (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
}

// binary16 to binary32, exactly.
__device__ __forceinline__ unsigned int fp_widen_f16(unsigned int h) {
    unsigned int sign = (h & 0x8000u) << 16;
    unsigned int exp = (h >> 10) & 0x1Fu;
    unsigned int frac = h & 0x3FFu;
    if (exp == 0x1Fu) return sign | 0x7F800000u | (frac << 13);
    if (exp != 0u) return sign | ((exp + 112u) << 23) | (frac << 13);
    if (frac == 0u) return sign;
    // Subnormal: frac * 2^-24, normal in binary32; `top` is the position
    // of frac's leading one (0..=9).
    unsigned int top = 31u - (unsigned int)__clz(frac);
    return sign | ((top + 103u) << 23) | ((frac << (23u - top)) & 0x7FFFFFu);
}

// binary32 to binary16, nearest-even, overflow to infinity, subnormals
// kept; a NaN keeps its sign and the top of its payload and is made quiet.
__device__ __forceinline__ unsigned int fp_narrow_f16(unsigned int b) {
    unsigned int sign = (b >> 16) & 0x8000u;
    unsigned int a = b & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return sign | 0x7C00u | 0x0200u | ((a >> 13) & 0x3FFu);
    // 65520, halfway between 65504 and 2^16, ties to infinity (even).
    if (a >= 0x477FF000u) return sign | 0x7C00u;
    if (a >= 0x38800000u) {
        unsigned int h = (a >> 13) - 0x1C000u;
        unsigned int rest = a & 0x1FFFu;
        unsigned int up = (rest > 0x1000u || (rest == 0x1000u && (h & 1u) == 1u)) ? 1u : 0u;
        return sign | (h + up);
    }
    // At most 2^-25: a tie to even zero, or below it.
    if (a <= 0x33000000u) return sign;
    unsigned int exp = a >> 23;
    unsigned int sig = (a & 0x7FFFFFu) | 0x800000u;
    unsigned int shift = 126u - exp;
    unsigned int h = sig >> shift;
    unsigned int rest = sig & ((1u << shift) - 1u);
    unsigned int half = 1u << (shift - 1u);
    unsigned int up = (rest > half || (rest == half && (h & 1u) == 1u)) ? 1u : 0u;
    return sign | (h + up);
}

// The dtype chosen at launch (a uniform branch).
__device__ __forceinline__ unsigned int fp_widen16(unsigned int h, unsigned int dtype) {
    return dtype == FP_DTYPE_BF16 ? fp_widen_bf16(h) : fp_widen_f16(h);
}

__device__ __forceinline__ unsigned int fp_narrow16(unsigned int b, unsigned int dtype) {
    return dtype == FP_DTYPE_BF16 ? fp_narrow_bf16(b) : fp_narrow_f16(b);
}

// Whether 16-bit `h` of `dtype` is a NaN.
__device__ __forceinline__ bool fp_is_nan16(unsigned int h, unsigned int dtype) {
    return dtype == FP_DTYPE_BF16 ? (h & 0x7FFFu) > 0x7F80u : (h & 0x7FFFu) > 0x7C00u;
}

// The hardware's f16 conversions, as inline PTX (no header, and immune to
// --ftz, which only steers the compiler's own float instructions).
// `cvt.f32.f16` is exact for every non-NaN half, subnormals included;
// `cvt.rn.f16.f32` rounds to nearest-even, overflows to infinity and keeps
// subnormals: both equal the integer code on every non-NaN input. A NaN
// comes out as a NaN with the hardware's payload, not the contract's, so
// a fold uses them only on values it then checks for NaN (fold.cu).
__device__ __forceinline__ void fp_widen_f16x2_hw(unsigned int w, float& lo, float& hi) {
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\t"
        "cvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
        : "=f"(lo), "=f"(hi)
        : "r"(w));
}

__device__ __forceinline__ unsigned int fp_narrow_f16_hw(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
