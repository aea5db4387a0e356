/* philox.h — the counter-based random bits of Dropout (random.c) and of the
 * fused attention's dropout (attn_impl.h), one definition for both.
 *
 * Philox-4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as
 * easy as 1, 2, 3", SC 2011) maps the 128-bit counter {i/4 (64 bits), step,
 * stream} under the 64-bit key `seed` to four 32-bit words; element i takes
 * word i % 4 and is kept when word >= ratio 2^32 (random.c says why).  The
 * fused attention draws, for its probability element (problem b, row i,
 * column j), the flag of flat index (b t + i) s + j: the flag the Dropout
 * node it replaced drew there (passes/attention.c).  philox_keep takes the
 * blocks of a range PHILOX_LANES at a time in a loop the compiler
 * vectorises (omp simd: the 32 x 32 -> 64-bit products in lanes).  Static
 * inline, so each includer has its copy; no state.
 */
#ifndef FSDPC_PHILOX_H
#define FSDPC_PHILOX_H

#include <stdint.h>

/* Philox-4x32 constants: the multipliers and the Weyl key increments. */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u
#define PHILOX_LANES 16 /* blocks (4 elements each) per vector pass of philox_keep */

/* the 10 rounds on counter {c0, c1, c2, c3} under key {k0, k1}: the words in c0..c3 */
#define PHILOX_ROUNDS(c0, c1, c2, c3, k0, k1)                                                                          \
    for (int r_ = 0; r_ < 10; r_++) {                                                                                  \
        const uint64_t p0_ = (uint64_t)PHILOX_M0 * c0, p1_ = (uint64_t)PHILOX_M1 * c2;                                 \
        c0 = (uint32_t)(p1_ >> 32) ^ c1 ^ k0;                                                                          \
        c1 = (uint32_t)p1_;                                                                                            \
        c2 = (uint32_t)(p0_ >> 32) ^ c3 ^ k1;                                                                          \
        c3 = (uint32_t)p0_;                                                                                            \
        k0 += PHILOX_W0;                                                                                               \
        k1 += PHILOX_W1;                                                                                               \
    }

static inline void philox4x32_10(uint32_t out[4], const uint32_t ctr[4], const uint32_t key[2])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    PHILOX_ROUNDS(c0, c1, c2, c3, k0, k1)
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* keep[0 .. hi - lo) = the keep flags of elements [lo, hi) (0 <= lo <= hi): word >= ratio 2^32, compared as
 * word >= ceil(ratio 2^32) (the same for an integer word; ratio in [0, 1)) */
static inline void philox_keep(uint8_t *keep, int64_t lo, int64_t hi, double ratio, uint64_t seed, uint32_t stream,
                               uint32_t step)
{
    const uint32_t key0 = (uint32_t)seed, key1 = (uint32_t)(seed >> 32);
    const double thr = ratio * 4294967296.0;
    const uint64_t ct = (uint64_t)thr + ((double)(uint64_t)thr < thr);
    for (int64_t blk = lo / 4; blk * 4 < hi; blk += PHILOX_LANES) {
        uint32_t w[PHILOX_LANES * 4]; /* element blk 4 + e's word at w[e] */
#pragma omp simd
        for (int k = 0; k < PHILOX_LANES; k++) {
            const uint64_t bk = (uint64_t)(blk + k);
            uint32_t c0 = (uint32_t)bk, c1 = (uint32_t)(bk >> 32), c2 = step, c3 = stream, k0 = key0, k1 = key1;
            PHILOX_ROUNDS(c0, c1, c2, c3, k0, k1)
            w[4 * k] = c0, w[4 * k + 1] = c1, w[4 * k + 2] = c2, w[4 * k + 3] = c3;
        }
        const int64_t base = blk * 4, e0 = lo > base ? lo - base : 0;
        const int64_t e1 = hi - base < PHILOX_LANES * 4 ? hi - base : PHILOX_LANES * 4;
        uint8_t *out = keep + (base - lo);
#pragma omp simd
        for (int64_t e = e0; e < e1; e++)
            out[e] = w[e] >= ct;
    }
}

/* a dropout's draw: ratio (0: none), the key and the counter's step and stream words */
typedef struct {
    double ratio;
    uint64_t seed;
    uint32_t stream, step;
} KDrop;

#endif
