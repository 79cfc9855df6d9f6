// Bitwise comparison of one rank's reduced arena with rank 0's, per chunk.
//
// One block per chunk of `chunk` elements (a multiple of 4, so every chunk
// starts 16-byte aligned on cuMemAlloc'd arenas): flags[c] = 1 when any
// element's bits differ, 0 otherwise. Every block writes its flag, so the
// flags need no clearing. Integer code only: no float is ever compared as a
// float (NaN payloads and -0.0 count as differences).

extern "C" __global__ void fp_rank_diff(const unsigned int* __restrict__ ref,
                                        const unsigned int* __restrict__ other,
                                        unsigned long long n,
                                        unsigned int chunk,
                                        unsigned int* __restrict__ flags) {
    unsigned long long lo = (unsigned long long)blockIdx.x * chunk;
    unsigned long long hi = lo + chunk < n ? lo + chunk : n;
    unsigned long long body = lo + ((hi - lo) & ~3ULL);
    unsigned int diff = 0;
    for (unsigned long long i = lo + 4ULL * threadIdx.x; i < body; i += 4ULL * blockDim.x) {
        uint4 a = *reinterpret_cast<const uint4*>(ref + i);
        uint4 b = *reinterpret_cast<const uint4*>(other + i);
        diff |= (a.x ^ b.x) | (a.y ^ b.y) | (a.z ^ b.z) | (a.w ^ b.w);
    }
    for (unsigned long long i = body + threadIdx.x; i < hi; i += blockDim.x) {
        diff |= ref[i] ^ other[i];
    }
    int any = __syncthreads_or(diff != 0u);
    if (threadIdx.x == 0) {
        flags[blockIdx.x] = any ? 1u : 0u;
    }
}
