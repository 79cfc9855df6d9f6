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

// Which chunks of `chunk` elements (a multiple of 4) of an arena hold a NaN:
// flags[c] = 1 when some element's magnitude bits exceed the infinity's,
// else 0 (every block writes its flag). The host skips its own NaN scan of
// a read-back span whose chunks are all 0: the canonical NaN policy then
// has nothing to change, and the bytes are hashed where they lie.

extern "C" __global__ void fp_nan_chunks(const unsigned int* __restrict__ arena,
                                         unsigned long long n,
                                         unsigned int chunk,
                                         unsigned int* __restrict__ flags) {
    unsigned long long lo = (unsigned long long)blockIdx.x * chunk;
    unsigned long long hi = lo + chunk < n ? lo + chunk : n;
    unsigned long long body = lo + ((hi - lo) & ~3ULL);
    unsigned int top = 0;
    for (unsigned long long i = lo + 4ULL * threadIdx.x; i < body; i += 4ULL * blockDim.x) {
        uint4 a = *reinterpret_cast<const uint4*>(arena + i);
        top = max(top, max(max(a.x & 0x7FFFFFFFu, a.y & 0x7FFFFFFFu),
                           max(a.z & 0x7FFFFFFFu, a.w & 0x7FFFFFFFu)));
    }
    for (unsigned long long i = body + threadIdx.x; i < hi; i += blockDim.x) {
        top = max(top, arena[i] & 0x7FFFFFFFu);
    }
    int any = __syncthreads_or(top > 0x7F800000u);
    if (threadIdx.x == 0) {
        flags[blockIdx.x] = any ? 1u : 0u;
    }
}

// SHA-256 of each chunk of `chunk` elements (a multiple of 16) of an arena,
// over exactly the bytes the host hashes: each element's bits after the NaN
// policy (`canonical`: every NaN becomes FP_CANONICAL_NAN), little-endian.
// One thread per chunk; chunk c's digest lands as 8 big-endian words at
// out[8 * c]. The host compares a sample against its own SHA-256 in tests.

__constant__ unsigned int FP_SHA_K[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
    0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
    0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
    0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u};

__device__ __forceinline__ unsigned int fp_rotr(unsigned int x, unsigned int n) {
    return __funnelshift_r(x, x, n);
}

// One element as a SHA-256 message word: its hashed bytes are the policy's
// bits in little-endian order, and SHA-256 reads words big-endian.
__device__ __forceinline__ unsigned int fp_word(unsigned int bits, unsigned int canonical) {
    if (canonical && (bits & 0x7FFFFFFFu) > 0x7F800000u) {
        bits = FP_CANONICAL_NAN;
    }
    return __byte_perm(bits, 0u, 0x0123);
}

__device__ __forceinline__ void fp_sha_block(unsigned int h[8], unsigned int w[16]) {
    unsigned int a = h[0], b = h[1], c = h[2], d = h[3];
    unsigned int e = h[4], f = h[5], g = h[6], k = h[7];
#pragma unroll
    for (int i = 0; i < 64; ++i) {
        unsigned int wi;
        if (i < 16) {
            wi = w[i];
        } else {
            unsigned int x = w[(i + 1) & 15], y = w[(i + 14) & 15];
            unsigned int s0 = fp_rotr(x, 7) ^ fp_rotr(x, 18) ^ (x >> 3);
            unsigned int s1 = fp_rotr(y, 17) ^ fp_rotr(y, 19) ^ (y >> 10);
            wi = w[i & 15] = w[i & 15] + s0 + w[(i + 9) & 15] + s1;
        }
        unsigned int t1 = k + (fp_rotr(e, 6) ^ fp_rotr(e, 11) ^ fp_rotr(e, 25)) +
                          ((e & f) ^ (~e & g)) + FP_SHA_K[i] + wi;
        unsigned int t2 = (fp_rotr(a, 2) ^ fp_rotr(a, 13) ^ fp_rotr(a, 22)) +
                          ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d;
    h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

extern "C" __global__ void fp_chunk_sha256(const unsigned int* __restrict__ arena,
                                           unsigned long long n,
                                           unsigned int chunk,
                                           unsigned int canonical,
                                           unsigned int* __restrict__ out) {
    unsigned long long chunks = (n + chunk - 1) / chunk;
    unsigned long long c = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= chunks) {
        return;
    }
    unsigned long long lo = c * chunk;
    unsigned long long len = n - lo < chunk ? n - lo : chunk;
    const unsigned int* p = arena + lo;
    unsigned int h[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                         0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    unsigned int w[16];
    unsigned long long full = len / 16;
    for (unsigned long long blk = 0; blk < full; ++blk) {
        // 64 bytes: four 16-byte loads (chunks start 16-byte aligned).
        const uint4* q = reinterpret_cast<const uint4*>(p + blk * 16);
#pragma unroll
        for (int v = 0; v < 4; ++v) {
            uint4 x = q[v];
            w[4 * v + 0] = fp_word(x.x, canonical);
            w[4 * v + 1] = fp_word(x.y, canonical);
            w[4 * v + 2] = fp_word(x.z, canonical);
            w[4 * v + 3] = fp_word(x.w, canonical);
        }
        fp_sha_block(h, w);
    }
    // The tail: r < 16 elements, the 0x80 byte, zeros, the bit length.
    unsigned int r = (unsigned int)(len - full * 16);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        unsigned int word = 0u;
        if ((unsigned int)i < r) {
            word = fp_word(p[full * 16 + i], canonical);
        } else if ((unsigned int)i == r) {
            word = 0x80000000u;
        }
        w[i] = word;
    }
    if (r >= 14) {
        fp_sha_block(h, w);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            w[i] = 0u;
        }
    }
    unsigned long long bits = len * 32ULL;
    w[14] = (unsigned int)(bits >> 32);
    w[15] = (unsigned int)bits;
    fp_sha_block(h, w);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        out[8 * c + i] = h[i];
    }
}

// fp_rank_diff over a 16-bit arena: `chunk` (a multiple of 8) 2-byte
// elements per block, 16-byte loads on the body, single elements after.
extern "C" __global__ void fp_rank_diff16(const unsigned short* __restrict__ ref,
                                          const unsigned short* __restrict__ other,
                                          unsigned long long n,
                                          unsigned int chunk,
                                          unsigned int* __restrict__ flags) {
    unsigned long long lo = (unsigned long long)blockIdx.x * chunk;
    unsigned long long hi = lo + chunk < n ? lo + chunk : n;
    unsigned long long body = lo + ((hi - lo) & ~7ULL);
    unsigned int diff = 0;
    for (unsigned long long i = lo + 8ULL * threadIdx.x; i < body; i += 8ULL * blockDim.x) {
        uint4 a = *reinterpret_cast<const uint4*>(ref + i);
        uint4 b = *reinterpret_cast<const uint4*>(other + i);
        diff |= (a.x ^ b.x) | (a.y ^ b.y) | (a.z ^ b.z) | (a.w ^ b.w);
    }
    for (unsigned long long i = body + threadIdx.x; i < hi; i += blockDim.x) {
        diff |= (unsigned int)(ref[i] ^ other[i]);
    }
    int any = __syncthreads_or(diff != 0u);
    if (threadIdx.x == 0) {
        flags[blockIdx.x] = any ? 1u : 0u;
    }
}
