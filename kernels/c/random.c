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
 * are in random_impl.h; the Philox bits in philox.h (shared with the fused
 * attention's dropout, attn_impl.h).
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "philox.h"
#include "walk.h"

void k_philox4x32_10(uint32_t out[4], const uint32_t ctr[4], const uint32_t key[2])
{
    philox4x32_10(out, ctr, key);
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
