// Shapes of the 16-bit fixed-order `fast` fold, measured side by side in
// one session (`gpu_diagnostics fold16-sweep`) to choose fold.cu's
// production shape (FP_F16_CONV, FP_FAST16_N, FP_FAST16_BATCH). Every one
// makes the same adds in the same order, so the same bits; the sweep
// checks them. Built after fold.cu, as a program of its own: the runs
// never load it.

#define FP_FOLD16_TRIAL(NAME, CONV, N, B, AHEAD, MIN_BLOCKS)                             \
    extern "C" __global__ void __launch_bounds__(1024, MIN_BLOCKS)                        \
        NAME(u16* __restrict__ out, const u16* __restrict__ s, u64 ld, u64 len,           \
             u32 world, const u32* __restrict__ prog, u32 prog_len, float scale,          \
             u32 use_scale, u32 dtype) {                                                  \
        if (dtype == FP_DTYPE_BF16)                                                       \
            fp_fold_fast16<0, FP_DTYPE_BF16, CONV, N, B, AHEAD>(out, s, ld, len, world,   \
                                                                prog, prog_len, scale,    \
                                                                use_scale, dtype);        \
        else                                                                              \
            fp_fold_fast16<0, FP_DTYPE_F16, CONV, N, B, AHEAD>(out, s, ld, len, world,    \
                                                               prog, prog_len, scale,     \
                                                               use_scale, dtype);         \
    }

// The fold as first written: the dtype chosen per element, exact integer
// conversions, 8 elements per thread, batches of 8 rows.
extern "C" __global__ void __launch_bounds__(1024)
    fp_fold16_before(u16* __restrict__ out, const u16* __restrict__ s, u64 ld, u64 len,
                     u32 world, const u32* __restrict__ prog, u32 prog_len, float scale,
                     u32 use_scale, u32 dtype) {
    fp_fold_fast16<0, 0, 0, 8, 8>(out, s, ld, len, world, prog, prog_len, scale, use_scale,
                                  dtype);
}

// int: exact conversions; hw: f16 through the hardware's (bf16 is the
// same code either way). nN: elements per thread; bB: rows per batch;
// ahead: the next batch's loads before this batch's adds; occ2: at most
// 32 registers, so that twice the threads fit an SM (spills allowed).
FP_FOLD16_TRIAL(fp_fold16_int_n8_b8, 0, 8, 8, 0, 1)
FP_FOLD16_TRIAL(fp_fold16_hw_n8_b8, 1, 8, 8, 0, 1)
FP_FOLD16_TRIAL(fp_fold16_hw_n8_b4, 1, 8, 4, 0, 1)
FP_FOLD16_TRIAL(fp_fold16_hw_n4_b8, 1, 4, 8, 0, 1)
FP_FOLD16_TRIAL(fp_fold16_hw_n4_b16, 1, 4, 16, 0, 1)
FP_FOLD16_TRIAL(fp_fold16_hw_n16_b4, 1, 16, 4, 0, 1)
FP_FOLD16_TRIAL(fp_fold16_hw_n4_b8_ahead, 1, 4, 8, 1, 1)
FP_FOLD16_TRIAL(fp_fold16_hw_n8_b4_ahead, 1, 8, 4, 1, 1)
FP_FOLD16_TRIAL(fp_fold16_hw_n4_b4_occ2, 1, 4, 4, 0, 2)
FP_FOLD16_TRIAL(fp_fold16_hw_n8_b2_occ2, 1, 8, 2, 0, 2)
