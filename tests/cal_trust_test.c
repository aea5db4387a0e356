/* cal_trust_test.c — the rule of runtime/cal_trust.h on crafted calibrations: which figures fsdpc --calibrate
 * flags as untrusted, and that a plausible calibration flags none.
 *
 * Cases (a 2-CPU machine unless said): a quiet one (spreads 2-10 %, float64 at half float32: nothing flagged);
 * float64 faster than float32 (the busy-machine case seen: peak_tflops_f64 flagged, once); float64 equal to it
 * (flagged: not below); repeats 45 % apart on the float32 GEMM and 31 % on the triad (each flagged by its key,
 * 30 % itself is not); a float32 rate above 2 CPUs x 6 GHz x 64 FLOP (flagged) and the same rate on 16 CPUs (not);
 * a float64 rate above its 32-FLOP bound; bfloat16 under and over its 128-FLOP bound, float16 over float32's 64; no CPU count (the peak not checked); max smaller than the doubts
 * (truncated, never overrun).
 * Build: cc -std=c11 -Iruntime tests/cal_trust_test.c runtime/cal_trust.c.  Exit 0 on success, 1 on failure.
 */
#include <stdio.h>
#include <string.h>

#include "cal_trust.h"

static int failures;

/* a quiet 2-CPU calibration: float32 200 GFLOP/s, float64 half that, small spreads */
static RtCalFigures quiet(void)
{
    RtCalFigures f = {.f32 = 200e9, .f64 = 100e9, .ncpu = 2, .n = 5,
                      .key = {"peak_tflops_f32", "gemm_efficiency", "peak_tflops_f64", "mem_bw_gbs", "mem_efficiency"},
                      .spread = {0.02, 0.05, 0.03, 0.10, 0.08}};
    return f;
}

/* f's doubts must be exactly `want` reasons, the i-th starting with prefix[i] and holding needle[i] */
static void expect(const char *name, const RtCalFigures *f, int max, int want, const char *const *prefix,
                   const char *const *needle)
{
    char why[RT_CAL_MAX + 3][RT_CAL_WHY];
    int n = rt_cal_doubts(f, why, max);
    int ok = n == want;
    for (int i = 0; ok && i < n; i++)
        ok = !strncmp(why[i], prefix[i], strlen(prefix[i])) && strstr(why[i], needle[i]) && !strchr(why[i], '\n');
    if (!ok) {
        failures++;
        fprintf(stderr, "FAILED %s: expected %d doubts, got %d:\n", name, want, n);
        for (int i = 0; i < n; i++)
            fprintf(stderr, "  %s\n", why[i]);
        return;
    }
    printf("ok %s: %d flagged%s%s\n", name, n, n ? ": " : "", n ? why[0] : "");
}

int main(void)
{
    RtCalFigures f = quiet();
    expect("quiet machine", &f, RT_CAL_MAX + 3, 0, NULL, NULL);

    f = quiet(), f.f64 = 230e9;
    expect("float64 faster than float32", &f, RT_CAL_MAX + 3, 1, (const char *[]){"peak_tflops_f64 untrusted: "},
           (const char *[]){"not below the float32 GEMM's 0.2 "});
    f = quiet(), f.f64 = f.f32;
    expect("float64 as fast as float32", &f, RT_CAL_MAX + 3, 1, (const char *[]){"peak_tflops_f64 untrusted: "},
           (const char *[]){"half the work"});

    f = quiet(), f.spread[0] = 0.45, f.spread[3] = 0.31, f.spread[4] = RT_CAL_SPREAD;
    expect("repeats apart", &f, RT_CAL_MAX + 3, 2,
           (const char *[]){"peak_tflops_f32 untrusted: ", "mem_bw_gbs untrusted: "},
           (const char *[]){"differ by 45 %", "differ by 31 %"});

    f = quiet(), f.f32 = 800e9, f.f64 = 300e9; /* 2 x 6 GHz x 64 = 768 GFLOP/s (float64: 384) */
    expect("float32 above the plausible peak", &f, RT_CAL_MAX + 3, 1,
           (const char *[]){"peak_tflops_f32 untrusted: "}, (const char *[]){"plausible peak (2 CPUs"});
    f.ncpu = 16;
    expect("the same rate on 16 CPUs", &f, RT_CAL_MAX + 3, 0, NULL, NULL);
    f = quiet(), f.f32 = 700e9, f.f64 = 390e9; /* float64's bound: 2 x 6 GHz x 32 = 384 GFLOP/s */
    expect("float64 above its plausible peak", &f, RT_CAL_MAX + 3, 1,
           (const char *[]){"peak_tflops_f64 untrusted: "}, (const char *[]){"x 32 FLOP per cycle"});
    f.ncpu = 0;
    expect("no CPU count: the peak unchecked", &f, RT_CAL_MAX + 3, 0, NULL, NULL);
    f = quiet(), f.bf16 = 1500e9, f.f16 = 500e9; /* bfloat16's bound: 2 x 6 GHz x 128 = 1536 GFLOP/s */
    expect("bfloat16 at twice float32's bound, float16 at float32's", &f, RT_CAL_MAX + 3, 0, NULL, NULL);
    f.bf16 = 1600e9, f.f16 = 800e9;
    expect("bfloat16 and float16 above their plausible peaks", &f, RT_CAL_MAX + 3, 2,
           (const char *[]){"peak_tflops_bf16 untrusted: ", "peak_tflops_f16 untrusted: "},
           (const char *[]){"x 128 FLOP per cycle", "x 64 FLOP per cycle"});

    f = quiet(), f.f64 = 300e9, f.spread[0] = f.spread[1] = f.spread[2] = 0.9;
    expect("more doubts than room", &f, 2, 2,
           (const char *[]){"peak_tflops_f32 untrusted: ", "gemm_efficiency untrusted: "},
           (const char *[]){"differ by 90 %", "differ by 90 %"});
    if (failures)
        fprintf(stderr, "cal_trust_test: %d failures\n", failures);
    else
        printf("OK cal_trust_test\n");
    return failures != 0;
}
