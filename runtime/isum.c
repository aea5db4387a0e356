/* isum.c — the init file's checksum (see isum.h). */
#include "isum.h"

#include <string.h>

#define ISUM_K 0x9e3779b97f4a7c15ull /* the word index's key: an odd constant (2^64 / golden ratio) */

/* MurmurHash3's fmix64: a bijection of 64-bit values */
static inline uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

uint64_t rt_isum(const void *p, uint64_t n, uint64_t first)
{
    const unsigned char *b = p;
    uint64_t s = 0, k = first * ISUM_K;
    for (uint64_t i = 0; i < n; i++, b += 8, k += ISUM_K) {
        uint64_t w;
        memcpy(&w, b, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        w = __builtin_bswap64(w);
#endif
        s += mix(w ^ k);
    }
    return s;
}
