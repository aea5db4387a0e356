/* regions.c — how many OpenMP parallel regions a run forks (issue 32 item 2's census: the step's regions), an
 * LD_PRELOAD shim over libgomp's GOMP_parallel that counts, per outlined function, the calls made outside any
 * active region (forks), those made inside one (nested: inactive where nesting is off, no fork) and those asking
 * for one thread, and writes them at exit.
 *
 *   cc -O2 -shared -fPIC bench/regions.c -o /tmp/regions.so -ldl
 *   LD_PRELOAD=/tmp/regions.so REGIONS_OUT=/tmp/r13 OMP_NUM_THREADS=2 ./gpt --data ... --steps 13 --quiet
 *   LD_PRELOAD=/tmp/regions.so REGIONS_OUT=/tmp/r3 OMP_NUM_THREADS=2 ./gpt --data ... --steps 3 --quiet
 *
 * Each line of REGIONS_OUT (stderr without it): forks, nested, one-thread, the object, the function's offset in
 * it.  The regions of a step are those of 13 steps less those of 3, over 10 (start-up and the first steps' own
 * regions cancel); name an offset with `nm -n` of the executable (the outlined functions are NAME._omp_fn.K: the
 * step's phases forward / backward / optimizer, or a kernel's own region), or by the object (libopenblas,
 * libdnnl: a GEMM's own team).  2026-11-28 (oneteam3): the 128/4/128/8 GPT's float32 step at 2 threads forks 3,
 * one a phase (39 on the commit before); (bf16team) its --precision bf16 step 3 too, where it forked 142 (oneDNN's
 * bf16 GEMMs), 89 (widened: DNNL_MAX_CPU_ISA=AVX512_CORE), and --precision fp16's 3 where 90.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define NF 1024 /* outlined functions told apart; more are not counted */

static void *fns[NF];
static long forks[NF], nested[NF], one[NF];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

typedef void (*par_t)(void (*)(void *), void *, unsigned, unsigned);

void GOMP_parallel(void (*fn)(void *), void *data, unsigned nt, unsigned flags)
{
    static par_t real;
    static int (*in_parallel)(void);
    if (!real) {
        real = (par_t)dlsym(RTLD_NEXT, "GOMP_parallel");
        in_parallel = (int (*)(void))dlsym(RTLD_DEFAULT, "omp_in_parallel");
        if (!real) {
            fprintf(stderr, "regions.so: no GOMP_parallel after this library\n");
            abort();
        }
    }
    const int in = in_parallel && in_parallel();
    pthread_mutex_lock(&mu);
    int i = 0;
    while (i < NF && fns[i] && fns[i] != (void *)fn)
        i++;
    if (i < NF) {
        fns[i] = (void *)fn;
        if (nt == 1)
            one[i]++;
        else if (in)
            nested[i]++;
        else
            forks[i]++;
    }
    pthread_mutex_unlock(&mu);
    real(fn, data, nt, flags);
}

__attribute__((destructor)) static void report(void)
{
    const char *out = getenv("REGIONS_OUT");
    int fd = out ? open(out, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644) : -1; /* no planted link */
    FILE *f = out ? (fd >= 0 ? fdopen(fd, "w") : NULL) : stderr;
    if (!f)
        return;
    for (int i = 0; i < NF && fns[i]; i++) {
        Dl_info d;
        const char *obj = "?";
        unsigned long off = 0;
        if (dladdr(fns[i], &d)) {
            obj = d.dli_fname;
            off = (unsigned long)((char *)fns[i] - (char *)d.dli_fbase);
        }
        fprintf(f, "%ld %ld %ld %s 0x%lx\n", forks[i], nested[i], one[i], obj, off);
    }
    if (out)
        fclose(f);
}
