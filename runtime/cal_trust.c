/* cal_trust.c — the rule of cal_trust.h: which calibrated figures are untrusted and the one-line reason of each.
 * No I/O, no MPI: calibrate.c measures and writes, tests/cal_trust_test.c feeds crafted figures. */
#include "cal_trust.h"

#include <stdio.h>

/* append a reason to why[*n] unless max are there already */
static void doubt(char (*why)[RT_CAL_WHY], int *n, int max, const char *text)
{
    if (*n < max)
        snprintf(why[(*n)++], RT_CAL_WHY, "%s", text);
}

/* the GEMM rate of `key` (FLOP/s) above ncpu x RT_CAL_MAX_GHZ x flop_cycle: the reason, else nothing */
static void above_peak(char (*why)[RT_CAL_WHY], int *n, int max, const char *key, double rate, int ncpu,
                       int flop_cycle)
{
    double bound = ncpu * RT_CAL_MAX_GHZ * 1e9 * flop_cycle;
    char text[RT_CAL_WHY];
    if (ncpu <= 0 || !(rate > bound))
        return;
    snprintf(text, sizeof text, "%s untrusted: %.4g TFLOPS is above this machine's plausible peak (%d CPUs x "
             "%.0f GHz x %d FLOP per cycle = %.4g TFLOPS): a wrong timer or a skipped GEMM", key, rate / 1e12, ncpu,
             RT_CAL_MAX_GHZ, flop_cycle, bound / 1e12);
    doubt(why, n, max, text);
}

int rt_cal_doubts(const RtCalFigures *f, char (*why)[RT_CAL_WHY], int max)
{
    int n = 0;
    char text[RT_CAL_WHY];
    for (int i = 0; i < f->n && i < RT_CAL_MAX; i++)
        if (f->spread[i] > RT_CAL_SPREAD) {
            snprintf(text, sizeof text, "%s untrusted: its repeats differ by %.0f %% (more than %.0f %%): the "
                     "machine was busy", f->key[i], 100 * f->spread[i], 100 * RT_CAL_SPREAD);
            doubt(why, &n, max, text);
        }
    if (f->f64 >= f->f32 && f->f32 > 0) {
        snprintf(text, sizeof text, "peak_tflops_f64 untrusted: the float64 GEMM's %.4g TFLOPS is not below the "
                 "float32 GEMM's %.4g (float64 does half the work per lane): one of them was slowed",
                 f->f64 / 1e12, f->f32 / 1e12);
        doubt(why, &n, max, text);
    }
    above_peak(why, &n, max, "peak_tflops_f32", f->f32, f->ncpu, 64);
    above_peak(why, &n, max, "peak_tflops_f64", f->f64, f->ncpu, 32);
    above_peak(why, &n, max, "peak_tflops_bf16", f->bf16, f->ncpu, 128);
    above_peak(why, &n, max, "peak_tflops_f16", f->f16, f->ncpu, 64);
    return n;
}
