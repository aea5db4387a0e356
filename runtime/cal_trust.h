/* cal_trust.h — which figures of fsdpc --calibrate (runtime/calibrate.c) cannot be trusted, and why.
 *
 * A calibration on a busy machine measures the other programs as much as this one: a GEMM that shared its cores
 * comes out slow, one that did not comes out right, and the profile says the machine is what it is not (seen: a
 * float64 GEMM faster than the float32 one).  The figures are best-of-N, so a slowdown shows as a spread between
 * the repeats; and some figures bound others.  A figure is flagged when
 *   - its repeats differ by more than RT_CAL_SPREAD: (slowest - best) / best, on the rank where it is widest
 *     (the machine was busy while it ran), in each of RT_CAL_ROUNDS rounds of them;
 *   - the float64 GEMM rate is not below the float32 one (a float64 multiply-add does half the lanes' work on
 *     every x86 vector unit: one of the two runs was slowed);
 *   - a GEMM rate is above this machine's plausible peak: its online CPUs x RT_CAL_MAX_GHZ x the most
 *     multiply-adds a core can issue per cycle (two AVX-512 FMA pipes: 64 float32 FLOP, 32 float64; 128
 *     bfloat16 by AVX512-BF16's pair dot products; float16 widened: float32's) — a wrong timer or a GEMM that
 *     skipped its work.
 * The rule is a pure function of the measured numbers, so tests feed it crafted ones (tests/cal_trust_test.c).
 */
#ifndef FSDPC_CAL_TRUST_H
#define FSDPC_CAL_TRUST_H

#define RT_CAL_SPREAD 0.30  /* repeats differing more than this share of the best: untrusted */
#define RT_CAL_ROUNDS 3     /* rounds of repeats calibrate.c measures while they differ by more than that */
#define RT_CAL_MAX_GHZ 6.0  /* no x86 core runs its vector units faster */
#define RT_CAL_WHY 256      /* a reason's characters, with its NUL */
#define RT_CAL_MAX 16       /* spread-checked figures at most */

typedef struct {
    double f32, f64;        /* GEMM FLOP/s: float32 (the peak), float64 */
    double bf16, f16;       /* bfloat16 and float16 GEMM FLOP/s (0: not measured) */
    int ncpu;               /* CPUs online (the bound of the plausible peak); <= 0: not checked */
    int n;                  /* the figures whose repeats are checked: */
    const char *key[RT_CAL_MAX];    /* its profile key */
    double spread[RT_CAL_MAX];      /* (slowest - best) / best over its repeats, the widest rank's */
} RtCalFigures;

/* The untrusted figures of f: one reason each into why[0..max-1] (one line, no newline, naming the profile key
 * first); returns how many (at most max) */
int rt_cal_doubts(const RtCalFigures *f, char (*why)[RT_CAL_WHY], int max);

#endif
