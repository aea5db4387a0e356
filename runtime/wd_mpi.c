/* wd_mpi.c — the cpu target's watchdog (rt_mpi.h): the thread that notices a
 * wait on the other ranks that makes no progress.
 *
 * Nothing here runs on the step's path: the step and the control plane
 * only write the progress record (rt_priv.h, progress.c).  The thread wakes
 * every 100 ms: it answers the other ranks' questions, and samples the
 * record; the wait in
 * flight (what, and the count of waits begun) unchanged for the timeout is a
 * stall.  Then it asks every other rank, over UDP (IPv4: every rank binds an
 * ephemeral port on all interfaces; the ranks' "host port" pairs are
 * exchanged at start-up with MPI_Allgather, and a rank on this rank's host
 * is asked on 127.0.0.1), for its record: step, wait, waits begun, and for
 * how long.  A rank that has begun fewer waits did not arrive (it is
 * behind: named with its step and what it does); one that does not answer
 * within 1.5 s (asked three times) is stopped, or hung inside a system call.
 * The ranks issue the same waits in the same order (the step's collectives
 * in start order, the control plane's in program order), so the counts
 * compare.  Nothing read from the wire is trusted: a datagram must have
 * exactly the size and magic of a question or of an answer to this rank's
 * question, and names are looked up in this rank's own tables.
 */
#define _GNU_SOURCE /* getaddrinfo, pipe2 */

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rt_mpi.h"
#include "rt_priv.h"

#define ASK 0x4b534157u  /* "WASK" */
#define TELL 0x4c455457u /* "WTEL" */
#define POLL_MS 100
#define ANSWER_S 1.5     /* a peer's time to answer */
#define NAMED 8          /* ranks named in the message; the rest counted */

/* ------------------------------------------------------------------- the wire */

typedef struct {
    uint32_t magic;
    int32_t rank;          /* the sender */
    uint64_t nonce;        /* a question's, echoed by its answers */
    int64_t step, seq;     /* answers: the record */
    int32_t what, pad;
    int64_t for_ms;        /* answers: how long the record has read so */
} Msg;
_Static_assert(sizeof(Msg) == 48, "the watchdog's datagram is 48 bytes");

typedef struct {
    char host[64];
    int32_t port, pad;
} Addr;

static struct {
    int rank, world, fd, wake[2], on;
    double timeout;               /* seconds */
    struct sockaddr_in *peer;     /* world entries; sin_port 0: cannot be asked */
    char (*host)[64];
    pthread_t thread;
    int64_t step, seq, since;     /* the sample: step, waits begun, what, since when (ns) */
    int what;
    const RtModel *m;
} w = {.fd = -1, .wake = {-1, -1}};

static int64_t now_ns(void) { return rt_now_ns(); }

static int64_t for_ms(void) { return (now_ns() - w.since) / 1000000; }

/* this rank's record, into an answer */
static void fill(Msg *a, uint64_t nonce)
{
    *a = (Msg){.magic = TELL, .rank = w.rank, .nonce = nonce,
               .step = w.step, .seq = w.seq, .what = w.what, .for_ms = for_ms()};
}

/* one datagram: answer a question; an answer to ours (nonce) into got/ans */
static void serve(uint64_t nonce, char *got, Msg *ans)
{
    Msg m;
    struct sockaddr_in from;
    socklen_t flen = sizeof from;
    ssize_t n = recvfrom(w.fd, &m, sizeof m, MSG_DONTWAIT, (struct sockaddr *)&from, &flen);
    if (n != (ssize_t)sizeof m || m.rank < 0 || m.rank >= w.world || m.rank == w.rank)
        return;
    if (m.magic == ASK) {
        Msg a;
        fill(&a, m.nonce);
        sendto(w.fd, &a, sizeof a, MSG_DONTWAIT, (struct sockaddr *)&from, flen);
    } else if (m.magic == TELL && got && nonce && m.nonce == nonce) {
        got[m.rank] = 1;
        ans[m.rank] = m;
    }
}

/* ------------------------------------------------------------- the message */

typedef struct {
    char *p;
    size_t left;
} Out;

static void put(Out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Out *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->p, o->left, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    size_t k = (size_t)n < o->left ? (size_t)n : o->left ? o->left - 1 : 0;
    o->p += k;
    o->left -= k;
}

/* a wait, as the message names it: the node's name from this rank's tables (printable bytes only) */
static void put_what(Out *o, int what)
{
    static const char *const ctl[] = {"the control plane's allreduce", "the control plane's broadcast",
                                      "the control plane's gather", "the closing barrier"};
    const RtModel *m = w.m;
    if (what <= RT_WAIT_ALLREDUCE && what >= RT_WAIT_FIRST) {
        put(o, "%s", ctl[RT_WAIT_ALLREDUCE - what]);
    } else if (what >= 0 && m && m->trace_name && what < m->nnode) {
        char name[160];
        size_t i = 0;
        for (const char *s = m->trace_name[what]; *s && i + 1 < sizeof name; s++)
            name[i++] = (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s;
        name[i] = 0;
        put(o, "collective '%s'", name);
    } else {
        put(o, "collective %d", what);
    }
}

static void put_step(Out *o, int64_t step)
{
    if (step > 0)
        put(o, "step %lld", (long long)step);
    else
        put(o, "start-up");
}

/* a stall: ask every other rank, print one line, bring the job down */
static _Noreturn void stalled(void)
{
    int W = w.world;
    char *got = calloc((size_t)W, 1);
    Msg *ans = calloc((size_t)W, sizeof *ans);
    if (!got || !ans)
        rt_fatal(1, "rank %d: a collective made no progress for %g s (FSDPC_STEP_TIMEOUT) (out of memory to ask "
                    "the other ranks why)", w.rank, w.timeout);
    uint64_t nonce = (uint64_t)now_ns() << 8 ^ (uint64_t)w.rank ^ 1;
    int64_t t0 = now_ns();
    for (int round = 0; round < 3; round++) {
        Msg q = {.magic = ASK, .rank = w.rank, .nonce = nonce};
        for (int r = 0; r < W; r++)
            if (r != w.rank && !got[r] && w.peer[r].sin_port)
                sendto(w.fd, &q, sizeof q, MSG_DONTWAIT, (struct sockaddr *)&w.peer[r], sizeof w.peer[r]);
        int64_t until = t0 + (int64_t)((round + 1) * ANSWER_S / 3 * 1e9);
        for (int64_t t = now_ns(); t < until; t = now_ns()) {
            int all = 1;
            for (int r = 0; r < W; r++)
                all &= r == w.rank || got[r] || !w.peer[r].sin_port;
            if (all)
                break;
            struct pollfd p = {.fd = w.fd, .events = POLLIN};
            if (poll(&p, 1, (int)((until - t) / 1000000) + 1) > 0)
                serve(nonce, got, ans);
        }
    }
    char msg[1200];
    Out o = {msg, sizeof msg};
    put(&o, "rank %d: ", w.rank);
    put_step(&o, w.step);
    put(&o, ": ");
    put_what(&o, w.what);
    put(&o, " made no progress for %g s (FSDPC_STEP_TIMEOUT)", w.timeout);
    int named = 0, more = 0;
    for (int r = 0; r < W; r++) {
        if (r == w.rank)
            continue;
        int silent = !got[r], behind = got[r] && ans[r].seq < w.seq;
        if (!silent && !behind)
            continue;
        if (named == NAMED) {
            more++;
            continue;
        }
        put(&o, "%s rank %d", named++ ? ";" : ": did not arrive:", r);
        if (!w.peer[r].sin_port) {
            put(&o, " (host '%s' does not resolve: not asked)", w.host[r]);
        } else if (silent) {
            put(&o, " not responding (stopped, or hung in a system call)");
        } else {
            put(&o, " is at ");
            put_step(&o, ans[r].step);
            if (ans[r].what == RT_WAIT_NONE)
                put(&o, ", outside any collective (computing or writing)");
            else {
                put(&o, ", in ");
                put_what(&o, ans[r].what);
            }
            put(&o, " for %.1f s", (double)ans[r].for_ms / 1e3);
        }
    }
    if (more)
        put(&o, "; and %d more", more);
    if (!named)
        put(&o, ": every other rank answered and has reached it (the MPI library made no progress)");
    rt_fatal(1, "%s", msg);
}

/* ---------------------------------------------------------------- the thread */

static void *watchdog(void *arg)
{
    (void)arg;
    w.since = now_ns();
    for (;;) {
        struct pollfd p[2] = {{.fd = w.fd, .events = POLLIN}, {.fd = w.wake[0], .events = POLLIN}};
        int n = poll(p, 2, POLL_MS);
        if (n > 0 && p[1].revents)
            return NULL;
        RtProgress r;
        rt_progress_read(&r);
        w.m = r.m;
        w.step = r.step;
        if (r.seq != w.seq || r.what != w.what) {
            w.seq = r.seq;
            w.what = r.what;
            w.since = now_ns();
        }
        if (n > 0 && p[0].revents)
            serve(0, NULL, NULL);
        if (w.what != RT_WAIT_NONE && (double)(now_ns() - w.since) > w.timeout * 1e9)
            stalled();
    }
}

int rt_wd_open(int rank, int world, double timeout_s, char *err, size_t errlen)
{
    w.rank = rank;
    w.world = world;
    w.timeout = timeout_s;
    if (world < 2)
        return 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    w.fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (w.fd < 0 || bind(w.fd, (struct sockaddr *)&a, sizeof a) != 0 || pipe2(w.wake, O_CLOEXEC) != 0) {
        snprintf(err, errlen, "rank %d: cannot open the watchdog's UDP socket: %s", rank, strerror(errno));
        rt_wd_stop();
        return -1;
    }
    return 0;
}

void rt_wd_start(void)
{
    if (w.world < 2 || w.fd < 0)
        return;
    Addr me = {.pad = 0}, *all = calloc((size_t)w.world, sizeof *all);
    w.peer = calloc((size_t)w.world, sizeof *w.peer);
    w.host = calloc((size_t)w.world, sizeof *w.host);
    if (!all || !w.peer || !w.host)
        rt_fatal(1, "rank %d: out of memory for the watchdog", w.rank);
    struct sockaddr_in a;
    socklen_t alen = sizeof a;
    if (getsockname(w.fd, (struct sockaddr *)&a, &alen) != 0)
        rt_fatal(1, "rank %d: the watchdog's UDP socket: getsockname: %s", w.rank, strerror(errno));
    if (gethostname(me.host, sizeof me.host) != 0)
        snprintf(me.host, sizeof me.host, "localhost");
    me.host[sizeof me.host - 1] = 0;
    me.port = ntohs(a.sin_port);
    rt_progress_begin(RT_WAIT_GATHER);
    RT_MPI(MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, MPI_COMM_WORLD));
    rt_progress_end();
    for (int r = 0; r < w.world; r++) {
        Addr *p = &all[r];
        p->host[sizeof p->host - 1] = 0;
        for (char *s = p->host; *s; s++) /* printed in a message */
            if ((unsigned char)*s < 0x20 || *s == 0x7f || *s == '\'')
                *s = '?';
        memcpy(w.host[r], p->host, sizeof p->host);
        if (r == w.rank || p->port <= 0 || p->port > 65535)
            continue;
        struct sockaddr_in *s = &w.peer[r];
        if (!strcmp(p->host, me.host)) {
            *s = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        } else {
            struct addrinfo hint = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *res = NULL;
            if (getaddrinfo(p->host, NULL, &hint, &res) != 0 || !res)
                continue;
            memcpy(s, res->ai_addr, sizeof *s);
            freeaddrinfo(res);
        }
        s->sin_port = htons((uint16_t)p->port);
    }
    free(all);
    int rc = pthread_create(&w.thread, NULL, watchdog, NULL);
    if (rc != 0)
        rt_fatal(1, "rank %d: cannot start the watchdog thread: %s", w.rank, strerror(rc));
    w.on = 1;
}

void rt_wd_stop(void)
{
    if (w.on) {
        char b = 1;
        while (write(w.wake[1], &b, 1) < 0 && errno == EINTR) {
        }
        pthread_join(w.thread, NULL);
        w.on = 0;
    }
    for (int i = 0; i < 2; i++)
        if (w.wake[i] >= 0)
            close(w.wake[i]);
    if (w.fd >= 0)
        close(w.fd);
    w.fd = w.wake[0] = w.wake[1] = -1;
    free(w.peer);
    free(w.host);
    w.peer = NULL;
    w.host = NULL;
}
