/* random.c — Dropout with a counter-based RNG, forward and backward.
 *
 * How it works.  The random number for element i is a pure function of
 * (seed, stream, step, i): Philox-4x32-10 (Salmon, Moraes, Dror, Shaw,
 * "Parallel random numbers: as easy as 1, 2, 3", SC 2011) maps the 128-bit
 * counter {i/4 (64 bits), step, stream} under the 64-bit key `seed` to four
 * 32-bit words, and element i takes word i % 4.  Nothing is carried from
 * call to call, so the mask does not depend on how elements are split
 * across threads, a recomputed forward (activation checkpointing) draws the
 * same mask, and a CUDA kernel evaluating the same function reproduces it
 * bit for bit.  The caller picks stream (say, the Dropout node's id, mixed
 * with the rank if ranks should differ) and step (the training step).
 *
 * Element i is kept when word / 2^32 >= ratio, i.e. word >= ratio 2^32,
 * compared exactly in double: keep probability 1 - ratio to 2^-32.  Kept
 * elements are scaled by s = 1/(1 - ratio) rounded to the dtype, as
 * torch's dropout multiplies by its float noise tensor.  The typed bodies
 * are in random_impl.h.
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "walk.h"

/* Philox-4x32 constants: the multipliers and the Weyl key increments. */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void k_philox4x32_10(uint32_t out[4], const uint32_t ctr[4], const uint32_t key[2])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* Keep flags of elements [lo, hi) into mask[0 .. hi - lo). */
static void dropout_mask(uint8_t *mask, int64_t lo, int64_t hi, double ratio,
                         uint64_t seed, uint32_t stream, uint32_t step)
{
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    const double thr = ratio * 4294967296.0;
    uint32_t out[4];
    for (int64_t i = lo; i < hi; i++) {
        if (i == lo || i % 4 == 0) {
            uint64_t blk = (uint64_t)i / 4;
            const uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)(blk >> 32), step, stream};
            k_philox4x32_10(out, ctr, key);
        }
        mask[i - lo] = (double)out[i % 4] >= thr;
    }
}

/* Elements per mask chunk on the stack in the forward. */
#define K_CHUNK 1024

#define T float
#define S f32
#include "random_impl.h"
#undef T
#undef S

#define T double
#define S f64
#include "random_impl.h"
#undef T
#undef S
