/* fatal.c — the errors that end a run at once: rt_fatal (a message, then
 * every rank down through the control plane), rt_step_fail (a failure inside
 * the step), and the claim that keeps two failing threads from printing two
 * messages.  Start-up errors, which the ranks agree on before exiting
 * normally, are err.c's rt_err_set / rt_err_sync.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "rt_ctl.h"
#include "rt_priv.h"

const char *rt_prog = "fsdpc-train";

static atomic_flag g_dying = ATOMIC_FLAG_INIT;
static _Thread_local int t_owner; /* this thread holds the claim */

void rt_fatal_claim(void)
{
    if (t_owner)
        return;
    if (atomic_flag_test_and_set(&g_dying))
        for (;;)
            pause(); /* another thread is bringing the process down */
    t_owner = 1;
}

static _Noreturn void vfatal(int code, const char *fmt, va_list ap)
{
    rt_fatal_claim();
    char msg[1536];
    vsnprintf(msg, sizeof msg, fmt, ap);
    fflush(stdout);
    fprintf(stderr, "%s: error: %s\n", rt_prog, msg);
    fflush(stderr);
    rt_ctl_abort(code);
}

_Noreturn void rt_fatal(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfatal(code, fmt, ap);
}

_Noreturn void rt_step_fail(RtCtx *c, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c)
        rt_fatal(1, "step %lld, rank %d: %s", (long long)c->step, c->rank, msg);
    rt_fatal(1, "%s", msg);
}
