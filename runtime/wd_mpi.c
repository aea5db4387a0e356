/* wd_mpi.c — the cpu target's watchdog (rt_mpi.h): the thread that notices a
 * wait on the other ranks that makes no progress.
 *
 * Nothing here runs on the step's path: the step and the control plane
 * only write the progress record (rt_priv.h, progress.c).  The thread wakes
 * every 100 ms: it answers the other ranks' questions, and samples the
 * record; the wait in flight (what, and the count of waits begun) unchanged
 * for the timeout is a stall.  Then it asks every other rank, over UDP, for
 * its record: step, wait, waits begun, and for how long.  A rank that has
 * begun fewer waits did not arrive (it is behind: named with its step and
 * what it does); one that does not answer within 1.5 s (asked three times)
 * is stopped, hung inside a system call, or cut off.  The ranks issue the
 * same waits in the same order (the step's collectives in start order, the
 * control plane's in program order), so the counts compare.
 *
 * The side channel listens only where the peers are and answers only them.
 * At start-up (rt_wd_start) one MPI_Allgather shares the host names: a rank
 * with a peer on its own host binds a socket to 127.0.0.1; one with a peer on
 * another host binds one to the address its kernel sends from to reach the
 * first of those whose name resolves (the route's source: the interface the
 * peers reach it on).  A second MPI_Allgather shares these bound addresses
 * and ports, and rank 0's random 64-bit token, which every datagram carries.
 * A question is answered only when it comes from the address and port its
 * sender rank bound and carries the token, so neither another host nor
 * another process on a peer's host can read the ranks' steps.  Nothing read
 * from the wire is trusted: a datagram must have exactly the size and magic
 * of a question or of an answer to this rank's question, and names are
 * looked up in this rank's own tables.
 */
#define _GNU_SOURCE /* getaddrinfo, pipe2, getrandom */

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
#include <sys/random.h>
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
    uint64_t token;        /* the job's (rank 0's random number) */
    uint64_t nonce;        /* a question's, echoed by its answers */
    int64_t step, seq;     /* answers: the record */
    int32_t what, pad;
    int64_t for_ms;        /* answers: how long the record has read so */
} Msg;
_Static_assert(sizeof(Msg) == 56, "the watchdog's datagram is 56 bytes");

/* where a rank listens, shared by the second MPI_Allgather (addr in network byte order; the rest in the
 * hosts' own, as every integer MPI_BYTE carries between the job's ranks of one executable) */
typedef struct {
    uint64_t token;        /* rank 0's is the job's */
    uint32_t addr;         /* the network socket's address; 0: none */
    uint16_t lo_port, net_port; /* 0: no such socket */
} Addr;
_Static_assert(sizeof(Addr) == 16, "the watchdog's address record is 16 bytes");

enum { LO, NET };          /* the sockets: on 127.0.0.1 for peers on this host, on the route's source for the others */

static struct {
    int rank, world, fd[2], wake[2], on;
    double timeout;               /* seconds */
    uint64_t token;
    struct sockaddr_in *peer;     /* world entries: where the rank listens for this one; sin_port 0: nowhere */
    char (*host)[64];
    pthread_t thread;
    int64_t step, seq, since;     /* the sample: step, waits begun, what, since when (ns) */
    int what;
    const RtModel *m;
} w = {.fd = {-1, -1}, .wake = {-1, -1}};

static int64_t now_ns(void) { return rt_now_ns(); }

static int64_t for_ms(void) { return (now_ns() - w.since) / 1000000; }

/* this rank's record, into an answer */
static void fill(Msg *a, uint64_t nonce)
{
    *a = (Msg){.magic = TELL, .rank = w.rank, .token = w.token, .nonce = nonce,
               .step = w.step, .seq = w.seq, .what = w.what, .for_ms = for_ms()};
}

/* the socket that reaches peer r (-1: none) */
static int fd_for(int r)
{
    return w.peer[r].sin_addr.s_addr == htonl(INADDR_LOOPBACK) ? w.fd[LO] : w.fd[NET];
}

/* a datagram of peer r: from where it listens (its only socket towards this rank), with the job's token */
static int from_peer(const Msg *m, const struct sockaddr_in *from)
{
    if (m->token != w.token || m->rank < 0 || m->rank >= w.world || m->rank == w.rank)
        return 0;
    const struct sockaddr_in *p = &w.peer[m->rank];
    return p->sin_port && from->sin_family == AF_INET && from->sin_port == p->sin_port &&
           from->sin_addr.s_addr == p->sin_addr.s_addr;
}

/* one datagram on fd: answer a peer's question; a peer's answer to ours (nonce) into got/ans */
static void serve(int fd, uint64_t nonce, char *got, Msg *ans)
{
    Msg m;
    struct sockaddr_in from;
    socklen_t flen = sizeof from;
    ssize_t n = recvfrom(fd, &m, sizeof m, MSG_DONTWAIT | MSG_TRUNC, (struct sockaddr *)&from, &flen);
    if (n != (ssize_t)sizeof m || flen != sizeof from || !from_peer(&m, &from))
        return;
    if (m.magic == ASK) {
        Msg a;
        fill(&a, m.nonce);
        sendto(fd, &a, sizeof a, MSG_DONTWAIT, (struct sockaddr *)&from, flen);
    } else if (m.magic == TELL && got && nonce && m.nonce == nonce) {
        got[m.rank] = 1;
        ans[m.rank] = m;
    }
}

/* wait up to ms for a datagram on either socket, or for the wake pipe when wake; p: what poll saw */
static void await_(struct pollfd p[3], int ms, int wake)
{
    p[0] = (struct pollfd){.fd = w.fd[LO], .events = POLLIN};
    p[1] = (struct pollfd){.fd = w.fd[NET], .events = POLLIN};
    p[2] = (struct pollfd){.fd = wake ? w.wake[0] : -1, .events = POLLIN};
    if (poll(p, 3, ms) <= 0)
        p[0].revents = p[1].revents = p[2].revents = 0;
}

/* serve the datagram waiting on each socket that await_ saw readable */
static void serve_ready(const struct pollfd p[3], uint64_t nonce, char *got, Msg *ans)
{
    for (int i = 0; i < 2; i++)
        if (p[i].revents)
            serve(p[i].fd, nonce, got, ans);
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
        Msg q = {.magic = ASK, .rank = w.rank, .token = w.token, .nonce = nonce};
        for (int r = 0; r < W; r++)
            if (r != w.rank && !got[r] && w.peer[r].sin_port)
                sendto(fd_for(r), &q, sizeof q, MSG_DONTWAIT, (struct sockaddr *)&w.peer[r], sizeof w.peer[r]);
        int64_t until = t0 + (int64_t)((round + 1) * ANSWER_S / 3 * 1e9);
        for (int64_t t = now_ns(); t < until; t = now_ns()) {
            int all = 1;
            for (int r = 0; r < W; r++)
                all &= r == w.rank || got[r] || !w.peer[r].sin_port;
            if (all)
                break;
            struct pollfd p[3];
            await_(p, (int)((until - t) / 1000000) + 1, 0);
            serve_ready(p, nonce, got, ans);
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
            put(&o, w.fd[NET] < 0 ? " (host '%s' does not resolve: not asked)"
                                  : " (on host '%s', which resolves no other host's name: not asked)", w.host[r]);
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
        struct pollfd p[3];
        await_(p, POLL_MS, 1);
        if (p[2].revents)
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
        serve_ready(p, 0, NULL, NULL);
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
    for (int i = LO; i <= NET; i++)
        w.fd[i] = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (w.fd[LO] < 0 || w.fd[NET] < 0 || pipe2(w.wake, O_CLOEXEC) != 0) {
        snprintf(err, errlen, "rank %d: cannot open the watchdog's UDP socket: %s", rank, strerror(errno));
        rt_wd_stop();
        return -1;
    }
    return 0;
}

/* every rank's host name into w.host (printable: it is printed in a message) */
static void gather_hosts(void)
{
    char me[64] = "";
    if (gethostname(me, sizeof me) != 0)
        snprintf(me, sizeof me, "localhost");
    me[sizeof me - 1] = 0;
    rt_progress_begin(RT_WAIT_GATHER);
    RT_MPI(MPI_Allgather(me, (int)sizeof me, MPI_BYTE, w.host, (int)sizeof me, MPI_BYTE, MPI_COMM_WORLD));
    rt_progress_end();
    for (int r = 0; r < w.world; r++) {
        w.host[r][sizeof w.host[r] - 1] = 0;
        for (char *c = w.host[r]; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f || *c == '\'')
                *c = '?';
    }
}

/* the source address of this host's route to host name (network byte order); 0: it does not resolve, or
 * has no route (a connected UDP socket sends nothing: connect only picks the route) */
static uint32_t route_source(const char *name)
{
    struct addrinfo hint = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *res = NULL;
    if (getaddrinfo(name, "9", &hint, &res) != 0 || !res)
        return 0;
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t alen = sizeof a;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
             getsockname(fd, (struct sockaddr *)&a, &alen) == 0;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return ok ? a.sin_addr.s_addr : 0;
}

/* socket i bound to addr (network byte order), an ephemeral port, which is returned (fatal on failure) */
static uint16_t bind_at(int i, uint32_t addr)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = addr};
    socklen_t alen = sizeof a;
    if (bind(w.fd[i], (struct sockaddr *)&a, sizeof a) != 0 || getsockname(w.fd[i], (struct sockaddr *)&a, &alen) != 0)
        rt_fatal(1, "rank %d: cannot bind the watchdog's UDP socket to %s: %s", w.rank,
                 i == LO ? "127.0.0.1" : "this host's address on the route to the other hosts", strerror(errno));
    return ntohs(a.sin_port);
}

#define TRIES 8 /* remote host names tried for a route before giving up */

/* this rank's sockets bound where its peers reach it, into me; the ones it does not need closed */
static void bind_sockets(Addr *me)
{
    const char *tried[TRIES];
    int local = 0, ntried = 0;
    for (int r = 0; r < w.world; r++) {
        if (r == w.rank)
            continue;
        if (!strcmp(w.host[r], w.host[w.rank])) {
            local = 1;
            continue;
        }
        int seen = 0; /* each host name once: hosts are few, ranks many */
        for (int i = 0; i < ntried; i++)
            seen |= !strcmp(tried[i], w.host[r]);
        if (!me->addr && !seen && ntried < TRIES) {
            tried[ntried++] = w.host[r];
            me->addr = route_source(w.host[r]);
        }
    }
    if (local)
        me->lo_port = bind_at(LO, htonl(INADDR_LOOPBACK));
    if (me->addr)
        me->net_port = bind_at(NET, me->addr);
    for (int i = LO; i <= NET; i++)
        if (!(i == LO ? me->lo_port : me->net_port)) {
            close(w.fd[i]);
            w.fd[i] = -1;
        }
}

/* a random 64-bit number (the job's token, drawn by rank 0) */
static uint64_t draw_token(void)
{
    uint64_t t = 0;
    if (getrandom(&t, sizeof t, GRND_NONBLOCK) != (ssize_t)sizeof t) /* no entropy yet: the clock and pid */
        t = (uint64_t)now_ns() * 0x9e3779b97f4a7c15u ^ (uint64_t)getpid() << 32;
    return t;
}

/* where every peer listens for this rank, from the record each published (sin_port 0: nowhere) */
static void set_peers(const Addr *all)
{
    for (int r = 0; r < w.world; r++) {
        struct sockaddr_in *p = &w.peer[r];
        *p = (struct sockaddr_in){.sin_family = AF_INET};
        if (r == w.rank)
            continue;
        if (!strcmp(w.host[r], w.host[w.rank])) {
            p->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            p->sin_port = htons(all[r].lo_port);
        } else if (w.fd[NET] >= 0 && all[r].addr) {
            p->sin_addr.s_addr = all[r].addr;
            p->sin_port = htons(all[r].net_port);
        }
    }
}

void rt_wd_start(void)
{
    if (w.world < 2 || w.fd[LO] < 0)
        return;
    Addr me = {.token = 0}, *all = calloc((size_t)w.world, sizeof *all);
    w.peer = calloc((size_t)w.world, sizeof *w.peer);
    w.host = calloc((size_t)w.world, sizeof *w.host);
    if (!all || !w.peer || !w.host)
        rt_fatal(1, "rank %d: out of memory for the watchdog", w.rank);
    gather_hosts();
    bind_sockets(&me);
    if (w.rank == 0)
        me.token = draw_token();
    rt_progress_begin(RT_WAIT_GATHER);
    RT_MPI(MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, MPI_COMM_WORLD));
    rt_progress_end();
    w.token = all[0].token;
    set_peers(all);
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
    for (int i = 0; i < 2; i++) {
        if (w.wake[i] >= 0)
            close(w.wake[i]);
        if (w.fd[i] >= 0)
            close(w.fd[i]);
        w.wake[i] = w.fd[i] = -1;
    }
    free(w.peer);
    free(w.host);
    w.peer = NULL;
    w.host = NULL;
}
