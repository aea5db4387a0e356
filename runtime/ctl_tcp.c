/* ctl_tcp.c — the control plane of the cuda target (rt_ctl.h), without MPI.
 *
 * Where ranks and rank 0's address come from, and how the connections are
 * made: ctl_tcp_rdv.c (ctl_tcp.h).  This file runs the protocol over them.
 * Every rank sends a hello (rank, world, the executable's key, host); rank 0
 * waits for all of them and answers OK, or ABORT after the first bad one
 * (which it reports).
 *
 * Wire: frames of a 16-byte little-endian header {magic, type, op, arg},
 * then arg payload bytes for HELLO and DATA.  Collectives run through rank 0
 * (a star): the others send theirs, rank 0 reduces or forwards.  Sockets
 * are non-blocking and one poll() loop (exchange) moves every frame of a
 * step of an operation at once, so rank 0 receives all gather pieces
 * concurrently and, while it waits, watches the other ranks for an ABORT or
 * a hang-up.  Nothing read from the wire is trusted: every frame must be the
 * operation and length this rank expects.
 *
 * Failures: no progress from a peer within FSDPC_CTL_TIMEOUT seconds
 * (default 300; start-up: FSDPC_CTL_CONNECT_TIMEOUT, default 120), a
 * closed connection, or a frame out of step is fatal: rt_fatal prints a
 * message naming both ranks, then rt_ctl_abort sends ABORT to rank 0, which
 * relays it (rank 0 sends it to all); a rank that gets an ABORT exits with
 * its code, quietly.  Between operations (while the step runs NCCL, say) a
 * watchdog thread does the watching.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ctl_tcp.h"
#include "rt_ctl.h"
#include "rt_priv.h"

#define MAGIC 0x4c544346u     /* "FCTL" */
#define IO_CHUNK ((size_t)1 << 30)
#define HELLO_WAIT 5.0        /* seconds a new connection has to say hello */

enum { FR_HELLO = 1, FR_OK, FR_DATA, FR_ABORT };
enum { OP_START = 1, OP_ALLREDUCE, OP_BCAST, OP_GATHER, OP_FINALIZE, NOP };
static const char *const op_name[NOP] = {"?", "start-up", "allreduce", "broadcast", "gather", "finalize"};

typedef struct {
    uint32_t magic;
    uint16_t type, op;
    uint64_t arg;             /* payload bytes; ABORT: the exit status */
} Frame;
_Static_assert(sizeof(Frame) == 16, "the frame header is 16 bytes on the wire");

typedef struct {
    int32_t rank, world;
    uint64_t key;
    char host[64];
} Hello;
_Static_assert(sizeof(Hello) == 80, "the hello is 80 bytes on the wire");

/* one peer: rank 0 has one per other rank, the others one (rank 0) */
typedef struct {
    int fd;                   /* -1: none */
    int ahead;                /* it sent data of a later operation: not watched until then */
    int tx, rx;               /* a frame to send / to receive in the current exchange */
    Frame th, rh;
    const char *tp;
    char *rp;
    uint64_t tdone, rdone;    /* bytes moved, header included */
    int rtype, rop;           /* the expected frame: type, operation, payload bytes */
    uint64_t rlen;
    double last;              /* last progress */
} Peer;

static struct {
    int up, rank, world, local;
    int timeout, connect_timeout; /* seconds */
    int op;                   /* OP_* in progress, 0 between operations */
    Peer *peer;               /* world entries */
    struct pollfd *pfd;
    int *who;
    char host[256];           /* gethostname */
    pthread_mutex_t lock;     /* one thread on the sockets: an operation, or the watchdog */
    pthread_t watchdog;
    int watchdog_on;
    atomic_int stop;
} g = {.world = 1, .lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local int t_locked;

static void lock(void)
{
    pthread_mutex_lock(&g.lock);
    t_locked = 1;
}

static void unlock(void)
{
    g.op = 0;
    t_locked = 0;
    pthread_mutex_unlock(&g.lock);
}

/* the peers of this rank: 1 .. world-1 on rank 0, else 0 alone */
static int first_peer(void) { return g.rank == 0 ? 1 : 0; }
static int end_peer(void) { return g.rank == 0 ? g.world : 1; }

/* ------------------------------------------------------------ failures */

/* Best effort, any thread: an ABORT frame to every peer that is not in the
 * middle of receiving a frame from us (those just see the connection close),
 * our half of every connection closed after it. */
static void tell_all(int code)
{
    if (g.world == 1 || !g.peer)
        return;
    int locked = t_locked;
    for (int i = 0; !locked && i < 100; i++) {
        if (pthread_mutex_trylock(&g.lock) == 0)
            locked = 2;
        else
            ctl_nap(10);
    }
    Frame f = {MAGIC, FR_ABORT, 0, (uint64_t)code};
    for (int q = first_peer(); q < end_peer(); q++) {
        Peer *p = &g.peer[q];
        if (p->fd < 0)
            continue;
        if (locked && !(p->tx && p->tdone > 0)) {
            char junk[4096]; /* unread input would turn our close into a reset, which may drop the ABORT */
            for (int i = 0; i < 64 && recv(p->fd, junk, sizeof junk, MSG_DONTWAIT) > 0; i++) {
            }
            ssize_t k = send(p->fd, &f, sizeof f, MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)k;
        }
        shutdown(p->fd, SHUT_WR);
    }
    if (locked == 2)
        pthread_mutex_unlock(&g.lock);
}

_Noreturn void rt_ctl_abort(int code)
{
    rt_fatal_claim();
    int c = code >= 1 && code <= 255 ? code : 1;
    fflush(stdout);
    fflush(stderr);
    tell_all(c);
    _exit(c);
}

/* a peer told us to go: its rank printed why */
static _Noreturn void aborted(uint64_t code) { rt_ctl_abort(code >= 1 && code <= 255 ? (int)code : 1); }

static _Noreturn void lost(int q)
{
    char during[64] = "";
    if (g.op)
        snprintf(during, sizeof during, " during %s", op_name[g.op]);
    if (g.rank == 0)
        rt_fatal(1, "rank 0: rank %d closed its connection%s (it exited or crashed; its own message, if any, says "
                    "why)", q, during);
    rt_fatal(1, "rank %d: lost the connection to rank 0%s (it exited or crashed)", g.rank, during);
}

static const char *timeout_env(void) { return g.op == OP_START ? "FSDPC_CTL_CONNECT_TIMEOUT" : "FSDPC_CTL_TIMEOUT"; }

static int op_timeout(void) { return g.op == OP_START ? g.connect_timeout + (int)HELLO_WAIT + 5 : g.timeout; }

static _Noreturn void no_answer(int q)
{
    rt_fatal(1, "rank %d: no answer from rank %d within %d s (%s; set %s to wait longer)", g.rank, q, op_timeout(),
             op_name[g.op], timeout_env());
}

static const char *frame_name(int type, int op)
{
    switch (type) {
    case FR_HELLO: return "a hello";
    case FR_OK: return "the start-up answer";
    case FR_DATA: return op > 0 && op < NOP ? op_name[op] : "data of an unknown operation";
    default: return "an unknown frame";
    }
}

static _Noreturn void out_of_step(int q, const Frame *h, const Peer *p)
{
    if (h->magic != MAGIC)
        rt_fatal(1, "rank %d: rank %d sent bytes that are not a control-plane message (a corrupt stream)", g.rank, q);
    rt_fatal(1, "rank %d: rank %d sent %s of %" PRIu64 " bytes where %s of %" PRIu64 " bytes was due (the ranks are "
                "out of step: do all run the same executable with the same flags?)",
             g.rank, q, frame_name(h->type, h->op), h->arg, frame_name(p->rtype, p->rop), p->rlen);
}

/* ------------------------------------------------------------- exchange */

static void put(int q, int type, int op, const void *buf, uint64_t n)
{
    Peer *p = &g.peer[q];
    p->th = (Frame){MAGIC, (uint16_t)type, (uint16_t)op, n};
    p->tp = buf;
    p->tdone = 0;
    p->tx = 1;
}

static void expect(int q, int type, int op, void *buf, uint64_t n)
{
    Peer *p = &g.peer[q];
    p->rtype = type;
    p->rop = op;
    p->rp = buf;
    p->rlen = n;
    p->rdone = 0;
    p->rx = 1;
}

static void pump_tx(int q)
{
    Peer *p = &g.peer[q];
    uint64_t total = sizeof p->th + p->th.arg;
    while (p->tdone < total) {
        const char *b;
        size_t n;
        if (p->tdone < sizeof p->th) {
            b = (const char *)&p->th + p->tdone;
            n = sizeof p->th - (size_t)p->tdone;
        } else {
            uint64_t off = p->tdone - sizeof p->th, left = p->th.arg - off;
            b = p->tp + off;
            n = left < IO_CHUNK ? (size_t)left : IO_CHUNK;
        }
        ssize_t k = send(p->fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            p->tdone += (uint64_t)k;
            p->last = ctl_now();
        } else if (k < 0 && errno == EINTR) {
            continue;
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return;
        } else {
            lost(q);
        }
    }
    p->tx = 0;
}

/* the header is in: is it the frame this rank waits for? */
static void check_header(int q)
{
    Peer *p = &g.peer[q];
    const Frame *h = &p->rh;
    if (h->magic == MAGIC && h->type == FR_ABORT)
        aborted(h->arg);
    if (h->magic != MAGIC || h->type != p->rtype || h->op != p->rop || h->arg != p->rlen)
        out_of_step(q, h, p);
}

static void pump_rx(int q)
{
    Peer *p = &g.peer[q];
    while (p->rx) {
        char *b;
        size_t n;
        if (p->rdone < sizeof p->rh) {
            b = (char *)&p->rh + p->rdone;
            n = sizeof p->rh - (size_t)p->rdone;
        } else {
            uint64_t off = p->rdone - sizeof p->rh, left = p->rlen - off;
            b = p->rp + off;
            n = left < IO_CHUNK ? (size_t)left : IO_CHUNK;
        }
        ssize_t k = recv(p->fd, b, n, MSG_DONTWAIT);
        if (k > 0) {
            p->rdone += (uint64_t)k;
            p->last = ctl_now();
            if (p->rdone == sizeof p->rh)
                check_header(q);
            if (p->rdone == sizeof p->rh + p->rlen)
                p->rx = 0;
        } else if (k < 0 && errno == EINTR) {
            continue;
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return;
        } else {
            lost(q);
        }
    }
}

/* A peer we expect nothing from is readable: an ABORT (exit), a hang-up
 * (fatal), or data of a later operation (leave it for then). */
static void idle_peer(int q)
{
    Peer *p = &g.peer[q];
    Frame h;
    ssize_t k;
    do
        k = recv(p->fd, &h, sizeof h, MSG_PEEK | MSG_DONTWAIT);
    while (k < 0 && errno == EINTR);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return;
    if (k <= 0)
        lost(q);
    if ((size_t)k == sizeof h && h.magic == MAGIC && h.type == FR_ABORT)
        aborted(h.arg);
    p->ahead = 1;
}

/* Move every queued frame and take in every expected one.  watch: also
 * watch the other peers (for an ABORT or a hang-up).  Fatal when a peer
 * with a frame pending makes no progress within the operation's timeout. */
static void exchange(int watch)
{
    double t0 = ctl_now(), limit = op_timeout();
    for (int q = first_peer(); q < end_peer(); q++) {
        g.peer[q].last = t0;
        g.peer[q].ahead = 0;
    }
    for (;;) {
        int n = 0, late = -1;
        double deadline = INFINITY;
        for (int q = first_peer(); q < end_peer(); q++) {
            Peer *p = &g.peer[q];
            short ev = (short)((p->tx ? POLLOUT : 0) | (p->rx || (watch && !p->ahead) ? POLLIN : 0));
            if (p->fd < 0 || ev == 0)
                continue;
            if ((p->tx || p->rx) && p->last + limit < deadline) {
                deadline = p->last + limit;
                late = q;
            }
            g.pfd[n] = (struct pollfd){.fd = p->fd, .events = ev};
            g.who[n++] = q;
        }
        if (late < 0)
            return;
        double left = deadline - ctl_now();
        if (left <= 0)
            no_answer(late);
        int k = poll(g.pfd, (nfds_t)n, left > 1 ? 1000 : (int)ceil(left * 1000));
        if (k < 0 && errno != EINTR)
            rt_fatal(1, "rank %d: poll: %s", g.rank, strerror(errno));
        for (int i = 0; k > 0 && i < n; i++) {
            short re = g.pfd[i].revents;
            int q = g.who[i];
            Peer *p = &g.peer[q];
            if (p->tx && (re & (POLLOUT | POLLERR | POLLHUP)))
                pump_tx(q);
            if (re & (POLLIN | POLLERR | POLLHUP)) {
                if (p->rx)
                    pump_rx(q);
                else
                    idle_peer(q); /* an ABORT, a hang-up, or data ahead (then no longer polled) */
            }
        }
    }
}

/* ------------------------------------------------------------- watchdog */

static void *watchdog(void *arg)
{
    (void)arg;
    while (!atomic_load(&g.stop)) {
        lock();
        int n = 0;
        for (int q = first_peer(); !atomic_load(&g.stop) && q < end_peer(); q++)
            if (g.peer[q].fd >= 0 && !g.peer[q].ahead) {
                g.pfd[n] = (struct pollfd){.fd = g.peer[q].fd, .events = POLLIN};
                g.who[n++] = q;
            }
        if (n > 0 && poll(g.pfd, (nfds_t)n, 0) > 0)
            for (int i = 0; i < n; i++)
                if (g.pfd[i].revents)
                    idle_peer(g.who[i]);
        unlock();
        ctl_nap(100);
    }
    return NULL;
}

/* [buf, buf+n) from fd before deadline: 0, or -1 */
static int read_by(int fd, void *buf, size_t n, double deadline)
{
    char *b = buf;
    while (n > 0) {
        ssize_t k = recv(fd, b, n, MSG_DONTWAIT);
        if (k > 0) {
            b += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return -1;
        double left = deadline - ctl_now();
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || (poll(&p, 1, (int)ceil(left * 1000)) < 0 && errno != EINTR))
            return -1;
    }
    return 0;
}

/* printable, NUL-terminated (the host name comes from the wire) */
static void clean(char *s, size_t cap)
{
    s[cap - 1] = 0;
    for (; *s; s++)
        if ((unsigned char)*s < 0x21 || (unsigned char)*s > 0x7e)
            *s = '?';
}

/* rank 0: a new connection's hello, checked against ours.  0: a rank (its
 * socket stored); 1: not one of ours (closed); -1: a rank that must be refused
 * (the first such reason in bad) */
static int greet(int fd, uint64_t key, char (*hosts)[64], char *bad, size_t badlen, double deadline)
{
    Frame f;
    Hello h;
    double by = ctl_now() + HELLO_WAIT < deadline ? ctl_now() + HELLO_WAIT : deadline;
    if (ctl_set_socket(fd) != 0 || read_by(fd, &f, sizeof f, by) != 0 || f.magic != MAGIC || f.type != FR_HELLO ||
        f.op != OP_START || f.arg != sizeof h || read_by(fd, &h, sizeof h, by) != 0) {
        close(fd);
        fprintf(stderr, "%s: warning: rank 0: ignored a connection that is not an fsdpc rank\n", rt_prog);
        return 1;
    }
    clean(h.host, sizeof h.host);
    char why[512] = "";
    if (h.world != g.world)
        snprintf(why, sizeof why, "rank %d (host %s) was started for %d ranks, rank 0 for %d: check the launcher's "
                 "environment", (int)h.rank, h.host, (int)h.world, g.world);
    else if (h.rank < 1 || h.rank >= g.world)
        snprintf(why, sizeof why, "a process on host %s claims rank %d (world %d)", h.host, (int)h.rank, g.world);
    else if (g.peer[h.rank].fd >= 0)
        snprintf(why, sizeof why, "two processes claim rank %d (hosts %s and %s)", (int)h.rank, hosts[h.rank], h.host);
    else if (h.key != key)
        snprintf(why, sizeof why, "rank %d (host %s) runs another executable (key %016" PRIx64 "; rank 0 on %s "
                 "runs %016" PRIx64 "): start every rank with the same one", (int)h.rank, h.host, h.key, g.host, key);
    if (why[0] && !bad[0])
        snprintf(bad, badlen, "%s", why);
    if (why[0] && (h.rank < 1 || h.rank >= g.world || g.peer[h.rank].fd >= 0)) {
        Frame ab = {MAGIC, FR_ABORT, 0, 1};
        ssize_t k = send(fd, &ab, sizeof ab, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)k;
        close(fd);
        return -1;
    }
    g.peer[h.rank].fd = fd;
    memcpy(hosts[h.rank], h.host, sizeof h.host);
    return why[0] ? -1 : 0;
}

/* rank 0: every other rank connects and says hello; then OK to all, or
 * ABORT to all and the first bad hello's reason in err */
static int host_world(Rdv *r, uint64_t key, char *err, size_t errlen)
{
    int port;
    int lfd = ctl_rdv_listen(r, g.host, &port, err, errlen);
    if (lfd < 0)
        return -1;
    char (*hosts)[64] = calloc((size_t)g.world, sizeof *hosts);
    char bad[768] = "";
    double deadline = ctl_now() + g.connect_timeout;
    int joined = 0, rc = 0;
    while (rc == 0 && joined < g.world - 1) {
        double left = deadline - ctl_now();
        if (!hosts) {
            snprintf(err, errlen, "rank 0: out of memory");
            rc = -1;
        } else if (left <= 0) {
            int q = 1;
            while (q < g.world && g.peer[q].fd >= 0)
                q++;
            snprintf(err, errlen, "rank 0: no answer from rank %d within %d s (it never connected to port %d; %s; "
                     "set FSDPC_CTL_CONNECT_TIMEOUT to wait longer)", q, g.connect_timeout, port, r->what);
            rc = -1;
        } else {
            struct pollfd p = {.fd = lfd, .events = POLLIN};
            if (poll(&p, 1, left > 1 ? 1000 : (int)ceil(left * 1000)) <= 0)
                continue;
            int fd = accept(lfd, NULL, NULL);
            if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
                snprintf(err, errlen, "rank 0: accepting rank connections: %s (raise `ulimit -n`)", strerror(errno));
                rc = -1;
            } else if (fd >= 0 && greet(fd, key, hosts, bad, sizeof bad, deadline) <= 0) {
                joined++;
            }
        }
    }
    close(lfd);
    if (r->file)
        unlink(r->path); /* everyone is in (or going): no later run should find it */
    free(hosts);
    if (rc == 0 && bad[0]) {
        snprintf(err, errlen, "%s", bad);
        rc = -1;
    }
    if (rc != 0) {
        tell_all(1);
        return -1;
    }
    for (int q = 1; q < g.world; q++)
        put(q, FR_OK, OP_START, NULL, 0);
    exchange(1);
    return 0;
}

/* the others: hello to rank 0, then its answer (an ABORT ends this process) */
static int say_hello(Rdv *r, uint64_t key, char *err, size_t errlen)
{
    int fd = ctl_rdv_join(r, err, errlen);
    if (fd < 0)
        return -1;
    g.peer[0].fd = fd;
    Hello h = {.rank = g.rank, .world = g.world, .key = key};
    snprintf(h.host, sizeof h.host, "%.63s", g.host);
    put(0, FR_HELLO, OP_START, &h, sizeof h);
    expect(0, FR_OK, OP_START, NULL, 0);
    exchange(1);
    return 0;
}

/* ------------------------------------------------------------ rt_ctl.h */

static void drop(void)
{
    for (int q = 0; g.peer && q < g.world; q++)
        if (g.peer[q].fd >= 0)
            close(g.peer[q].fd);
    free(g.peer);
    free(g.pfd);
    free(g.who);
    g.peer = NULL;
    g.pfd = NULL;
    g.who = NULL;
    g.up = 0;
}

int rt_ctl_init(int *argc, char ***argv, const char *rendezvous, uint64_t key, int *rank, int *world, char *err,
                size_t errlen)
{
    (void)argc, (void)argv;
    const char *source = NULL;
    long t = 0;
    err[0] = 0;
    g.timeout = 300;
    g.connect_timeout = 120;
    if (ctl_find_ranks(&g.rank, &g.world, &g.local, &source, err, errlen) != 0)
        return -1;
    int rc = ctl_env_int("FSDPC_CTL_TIMEOUT", 1, 31536000, &t, err, errlen);
    if (rc > 0)
        g.timeout = (int)t;
    if (rc >= 0 && (rc = ctl_env_int("FSDPC_CTL_CONNECT_TIMEOUT", 1, 31536000, &t, err, errlen)) > 0)
        g.connect_timeout = (int)t;
    if (rc < 0)
        return -1;
    *rank = g.rank;
    *world = g.world;
    g.up = 1;
    if (g.world == 1)
        return 0;
    Rdv r;
    if (ctl_rdv_pick(&r, rendezvous, source, g.rank, g.world, g.connect_timeout, err, errlen) != 0)
        return -1;
    if (gethostname(g.host, sizeof g.host) != 0)
        snprintf(g.host, sizeof g.host, "localhost");
    clean(g.host, sizeof g.host);
    g.peer = calloc((size_t)g.world, sizeof *g.peer);
    g.pfd = calloc((size_t)g.world, sizeof *g.pfd);
    g.who = calloc((size_t)g.world, sizeof *g.who);
    if (!g.peer || !g.pfd || !g.who) {
        snprintf(err, errlen, "rank %d: out of memory", g.rank);
        drop();
        return -1;
    }
    for (int q = 0; q < g.world; q++)
        g.peer[q].fd = -1;
    g.op = OP_START;
    lock();
    rc = g.rank == 0 ? host_world(&r, key, err, errlen) : say_hello(&r, key, err, errlen);
    unlock();
    atomic_store(&g.stop, 0);
    if (rc == 0 && pthread_create(&g.watchdog, NULL, watchdog, NULL) != 0) {
        snprintf(err, errlen, "rank %d: cannot start the control plane's watchdog thread", g.rank);
        tell_all(1);
        rc = -1;
    }
    if (rc != 0) {
        drop();
        return -1;
    }
    g.watchdog_on = 1;
    return 0;
}

int rt_ctl_local_rank(void) { return g.local; }

int rt_ctl_threads(void) { return 1; } /* every operation holds g.lock */

int rt_ctl_local_size(void) { return 0; } /* unknown */

void rt_ctl_finalize(void)
{
    if (!g.up)
        return;
    if (g.world > 1) {
        if (g.watchdog_on) {
            atomic_store(&g.stop, 1);
            pthread_join(g.watchdog, NULL);
            g.watchdog_on = 0;
        }
        /* a barrier, so that no rank takes another's closing for a crash */
        lock();
        g.op = OP_FINALIZE;
        if (g.rank != 0) {
            put(0, FR_DATA, OP_FINALIZE, NULL, 0);
            exchange(1);
            expect(0, FR_DATA, OP_FINALIZE, NULL, 0);
            exchange(1);
        } else {
            for (int q = 1; q < g.world; q++)
                expect(q, FR_DATA, OP_FINALIZE, NULL, 0);
            exchange(1);
            for (int q = 1; q < g.world; q++)
                put(q, FR_DATA, OP_FINALIZE, NULL, 0);
            exchange(0); /* a rank that has its answer closes: no watching */
        }
        unlock();
    }
    drop();
}

static void check_root(const char *what, int root)
{
    if (root < 0 || root >= g.world)
        rt_fatal(1, "rank %d: %s: root %d outside the world of %d ranks", g.rank, what, root, g.world);
}

void rt_ctl_allreduce_i64(int64_t *x, int n, int op)
{
    if (g.world == 1 || n <= 0)
        return;
    uint64_t bytes = (uint64_t)n * sizeof *x;
    lock();
    g.op = OP_ALLREDUCE;
    if (g.rank != 0) {
        put(0, FR_DATA, OP_ALLREDUCE, x, bytes);
        exchange(1);
        expect(0, FR_DATA, OP_ALLREDUCE, x, bytes);
        exchange(1);
    } else {
        int64_t *all = malloc(bytes * (uint64_t)g.world);
        if (!all)
            rt_fatal(1, "rank 0: out of memory");
        for (int q = 1; q < g.world; q++)
            expect(q, FR_DATA, OP_ALLREDUCE, all + (size_t)q * (size_t)n, bytes);
        exchange(1);
        for (int q = 1; q < g.world; q++)
            for (int i = 0; i < n; i++) {
                int64_t v = all[(size_t)q * (size_t)n + (size_t)i];
                x[i] = op == RT_CTL_MIN   ? (v < x[i] ? v : x[i])
                       : op == RT_CTL_MAX ? (v > x[i] ? v : x[i])
                                          : (int64_t)((uint64_t)x[i] + (uint64_t)v); /* wraps, never UB */
            }
        free(all);
        for (int q = 1; q < g.world; q++)
            put(q, FR_DATA, OP_ALLREDUCE, x, bytes);
        exchange(1);
    }
    unlock();
}

void rt_ctl_bcast(void *buf, int64_t bytes, int root)
{
    check_root("rt_ctl_bcast", root);
    if (g.world == 1 || bytes <= 0)
        return;
    lock();
    g.op = OP_BCAST;
    if (root != 0 && g.rank == root) {
        put(0, FR_DATA, OP_BCAST, buf, (uint64_t)bytes);
        exchange(1);
    } else if (root != 0 && g.rank == 0) {
        expect(root, FR_DATA, OP_BCAST, buf, (uint64_t)bytes);
        exchange(1);
    }
    if (g.rank == 0) {
        for (int q = 1; q < g.world; q++)
            if (q != root)
                put(q, FR_DATA, OP_BCAST, buf, (uint64_t)bytes);
        exchange(1);
    } else if (g.rank != root) {
        expect(0, FR_DATA, OP_BCAST, buf, (uint64_t)bytes);
        exchange(1);
    }
    unlock();
}

void rt_ctl_gather(const void *mine, int64_t bytes, void *all, int root)
{
    check_root("rt_ctl_gather", root);
    if (bytes <= 0)
        return;
    if (g.world == 1) {
        if (all != mine)
            memmove(all, mine, (size_t)bytes);
        return;
    }
    if (bytes > INT64_MAX / g.world)
        rt_fatal(1, "rank %d: rt_ctl_gather: %d ranks of %" PRId64 " bytes do not fit a buffer", g.rank, g.world,
                 bytes);
    uint64_t total = (uint64_t)bytes * (uint64_t)g.world;
    lock();
    g.op = OP_GATHER;
    if (g.rank == 0) {
        char *dst = root == 0 ? all : malloc((size_t)total);
        if (!dst)
            rt_fatal(1, "rank 0: out of memory gathering %" PRIu64 " bytes for rank %d", total, root);
        memmove(dst, mine, (size_t)bytes);
        for (int q = 1; q < g.world; q++)
            expect(q, FR_DATA, OP_GATHER, dst + (uint64_t)q * (uint64_t)bytes, (uint64_t)bytes);
        exchange(1);
        if (root != 0) {
            put(root, FR_DATA, OP_GATHER, dst, total);
            exchange(1);
            free(dst);
        }
    } else {
        put(0, FR_DATA, OP_GATHER, mine, (uint64_t)bytes);
        exchange(1);
        if (g.rank == root) {
            expect(0, FR_DATA, OP_GATHER, all, total);
            exchange(1);
        }
    }
    unlock();
}
