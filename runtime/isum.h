/* isum.h — the init file's checksum (OUT.init), shared by the compiler, which
 * computes it as it writes the file, and the executables, which check it as
 * they read.
 *
 * The file is seen as 8-byte little-endian words w_i at byte offsets 8i.  A
 * range's checksum is the sum, mod 2^64, of mix(w_i ^ i·K) over the words
 * that start in it (the last one zero-padded: fsdpc pads every section with
 * zeros).  mix is MurmurHash3's 64-bit finaliser, a bijection, so changing
 * any one word always changes the sum, and any other change goes unnoticed
 * with odds of about 2^-64.  Because it is a sum, it splits at any word
 * boundary: ranks that each read one shard of a unit add their shares, and
 * the shares of all the ranks of a run add up to the unit's checksum times
 * the number of copies read (runtime/load.c).  Two multiplies per 8 bytes:
 * about 1-2 cycles per word, so the check costs less than reading the file.
 */
#ifndef FSDPC_ISUM_H
#define FSDPC_ISUM_H

#include <stdint.h>

/* the checksum of the n words at p (unaligned is fine), the first being word `first` of the file */
uint64_t rt_isum(const void *p, uint64_t n, uint64_t first);

#endif
