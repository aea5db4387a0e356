/* progress.c — the progress record (rt_priv.h): what this rank waits on
 * with the other ranks and the step it is in, in relaxed atomics, written
 * by whichever thread makes the call and read by the cpu target's watchdog
 * thread (wd_mpi.c).  Nothing more on the step's path than a few stores.
 */
#include <stdatomic.h>

#include "rt_priv.h"

static struct {
    _Atomic(const RtModel *) m;
    _Atomic int64_t step, seq;
    atomic_int what;
} rec = {.what = RT_WAIT_NONE};

void rt_progress_step(const RtModel *m, int64_t step)
{
    atomic_store_explicit(&rec.m, m, memory_order_relaxed);
    atomic_store_explicit(&rec.step, step, memory_order_relaxed);
}

void rt_progress_begin(int what)
{
    atomic_fetch_add_explicit(&rec.seq, 1, memory_order_relaxed);
    atomic_store_explicit(&rec.what, what, memory_order_relaxed);
}

void rt_progress_end(void) { atomic_store_explicit(&rec.what, RT_WAIT_NONE, memory_order_relaxed); }

void rt_progress_read(RtProgress *p)
{
    p->m = atomic_load_explicit(&rec.m, memory_order_relaxed);
    p->step = atomic_load_explicit(&rec.step, memory_order_relaxed);
    p->seq = atomic_load_explicit(&rec.seq, memory_order_relaxed);
    p->what = atomic_load_explicit(&rec.what, memory_order_relaxed);
}
