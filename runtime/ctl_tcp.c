/* ctl_tcp.c — the control plane of the cuda target (rt_ctl.h), without MPI.
 *
 * Ranks come from the launcher's environment: the first set of
 * OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK (mpirun), PMI_RANK/PMI_SIZE/
 * MPI_LOCALRANKID, SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID (srun),
 * RANK/WORLD_SIZE/LOCAL_RANK (torchrun style); none: a world of one, which
 * needs no sockets.  Rendezvous: rank 0 listens on TCP, the others connect:
 *   --rendezvous file:PATH      rank 0 takes an ephemeral port and writes
 *                               "HOST PORT\n" to PATH (rt_afile_write);
 *                               the others poll PATH
 *   --rendezvous tcp:HOST:PORT  rank 0 listens on PORT (also MASTER_ADDR and
 *                               MASTER_PORT when there is no --rendezvous)
 *   --rendezvous mpi            rank 0 takes an ephemeral port; MPI (Open MPI
 *                               loaded at run time: rdv_mpi.c) broadcasts
 *                               "HOST PORT" to the others
 *   neither, under mpirun/srun  mpi if Open MPI's library loads, else
 *                               file:/tmp/fsdpc-rdv-<job id>-<uid> (one node)
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
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "rt_ctl.h"
#include "rt_priv.h"

#define MAGIC 0x4c544346u     /* "FCTL" */
#define MAX_WORLD (1 << 20)
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

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void nap(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

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
            nap(10);
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
            p->last = now();
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
            p->last = now();
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
    double t0 = now(), limit = op_timeout();
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
        double left = deadline - now();
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
        nap(100);
    }
    return NULL;
}

/* --------------------------------------------------------------- ranks */

/* a decimal integer in [lo, hi] from env variable name; 1 read, 0 unset, -1 bad (err) */
static int env_int(const char *name, long lo, long hi, long *out, char *err, size_t errlen)
{
    const char *s = getenv(name);
    if (!s)
        return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != 0 || errno == ERANGE || v < lo || v > hi) {
        snprintf(err, errlen, "environment variable %s=%.40s: expected an integer in [%ld, %ld]", name, s, lo, hi);
        return -1;
    }
    *out = v;
    return 1;
}

/* rank, world and local rank from the first launcher variables that are set */
static int find_ranks(const char **source, char *err, size_t errlen)
{
    static const char *const vars[][3] = {
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
        {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
        {"RANK", "WORLD_SIZE", "LOCAL_RANK"},
    };
    g.rank = 0;
    g.world = 1;
    g.local = 0;
    *source = NULL;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        if (!getenv(vars[i][0]))
            continue;
        long rank = 0, world = 1, local = -1;
        int r = env_int(vars[i][1], 1, MAX_WORLD, &world, err, errlen);
        if (r == 0)
            snprintf(err, errlen, "environment variable %s is set but %s is not", vars[i][0], vars[i][1]);
        if (r <= 0 || env_int(vars[i][0], 0, world - 1, &rank, err, errlen) < 0 ||
            env_int(vars[i][2], 0, world - 1, &local, err, errlen) < 0)
            return -1;
        g.rank = (int)rank;
        g.world = (int)world;
        g.local = local >= 0 ? (int)local : (int)rank;
        *source = vars[i][0];
        return 0;
    }
    return 0;
}

/* ---------------------------------------------------------- rendezvous */

typedef struct {
    int file;                 /* 1: PATH holds "HOST PORT"; 0: HOST:PORT given */
    int mpi;                  /* 1: MPI carries "HOST PORT"; 2: MPI if it loads, else the file (if set) */
    char path[PATH_MAX];
    int check_owner;          /* the default file in /tmp: written by this user */
    char host[256];
    char port[8];             /* decimal; "0" for an ephemeral one */
    char what[PATH_MAX + 64]; /* for messages */
} Rdv;

static int parse_port(const char *s, char *out, size_t cap)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != 0 || errno || v < 1 || v > 65535)
        return -1;
    snprintf(out, cap, "%ld", v);
    return 0;
}

/* HOST:PORT (HOST may be [an IPv6 address]) */
static int parse_hostport(const char *s, Rdv *r)
{
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s || parse_port(colon + 1, r->port, sizeof r->port) != 0)
        return -1;
    size_t n = (size_t)(colon - s);
    if (s[0] == '[' && n >= 2 && s[n - 1] == ']') {
        s++;
        n -= 2;
    }
    if (n == 0 || n >= sizeof r->host)
        return -1;
    memcpy(r->host, s, n);
    r->host[n] = 0;
    return 0;
}

/* the job id of mpirun, sanitised for a file name; NULL if none */
static const char *mpirun_job(char *buf, size_t cap)
{
    const char *id = getenv("OMPI_MCA_ess_base_jobid");
    if (!id || !*id)
        id = getenv("PMIX_NAMESPACE");
    if (!id || !*id)
        return NULL;
    size_t n = 0;
    for (; id[n] && n + 1 < cap && n < 64; n++) {
        unsigned char ch = (unsigned char)id[n];
        int ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' ||
                 ch == '_' || ch == '.';
        buf[n] = ok ? (char)ch : '_';
    }
    buf[n] = 0;
    return buf;
}

static int pick_rendezvous(const char *spec, Rdv *r, const char *source, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    const char *ma = getenv("MASTER_ADDR"), *mp = getenv("MASTER_PORT");
    char job[80];
    if (spec && strncmp(spec, "file:", 5) == 0) {
        if (!spec[5] || strlen(spec + 5) >= sizeof r->path - 32) {
            snprintf(err, errlen, "--rendezvous %.200s: expected file:PATH with a PATH of at most %zu bytes", spec,
                     sizeof r->path - 32);
            return -1;
        }
        r->file = 1;
        snprintf(r->path, sizeof r->path, "%s", spec + 5);
    } else if (spec && strncmp(spec, "tcp:", 4) == 0) {
        if (parse_hostport(spec + 4, r) != 0) {
            snprintf(err, errlen, "--rendezvous %.200s: expected tcp:HOST:PORT with a PORT in 1..65535", spec);
            return -1;
        }
    } else if (spec && strcmp(spec, "mpi") == 0) {
        r->mpi = 1;
    } else if (spec) {
        snprintf(err, errlen, "--rendezvous %.200s: expected file:PATH, tcp:HOST:PORT or mpi", spec);
        return -1;
    } else if (ma || mp) {
        if (!ma || !mp || !*ma || strlen(ma) >= sizeof r->host || parse_port(mp, r->port, sizeof r->port) != 0) {
            snprintf(err, errlen, "MASTER_ADDR=%.100s, MASTER_PORT=%.20s: set both, to rank 0's host and a free "
                     "TCP port (1..65535)", ma ? ma : "(unset)", mp ? mp : "(unset)");
            return -1;
        }
        snprintf(r->host, sizeof r->host, "%s", ma);
    } else if (mpirun_job(job, sizeof job)) {
        r->mpi = 2;
        r->file = 1;
        r->check_owner = 1;
        snprintf(r->path, sizeof r->path, "/tmp/fsdpc-rdv-%s-%ld", job, (long)geteuid());
    } else if (strcmp(source, "RANK") != 0) { /* mpirun, srun, PMI: MPI may know */
        r->mpi = 1;
    } else {
        snprintf(err, errlen, "rank %d of %d (from %s): no rendezvous; pass --rendezvous file:PATH (a path every "
                 "rank can read) or tcp:HOST:PORT, or set MASTER_ADDR and MASTER_PORT", g.rank, g.world, source);
        return -1;
    }
    if (r->mpi == 1)
        snprintf(r->what, sizeof r->what, "rendezvous through MPI");
    else if (r->file)
        snprintf(r->what, sizeof r->what, "rendezvous file %s", r->path);
    else
        snprintf(r->what, sizeof r->what, "rendezvous at %s:%s", r->host, r->port);
    return 0;
}

static int set_socket(int fd)
{
    int one = 1;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) != 0)
        return -1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* small frames: no Nagle delay */
    return 0;
}

/* a listening socket on every interface (IPv6 and IPv4 where possible);
 * *port: the port, 0 for an ephemeral one, which is written back */
static int listen_any(int *port, char *err, size_t errlen)
{
    int one = 1, zero = 0, fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_storage ss;
    socklen_t len;
    if (fd >= 0) {
        struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)*port),
                                 .sin6_addr = IN6ADDR_ANY_INIT};
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            close(fd);
            fd = -1;
        }
    }
    if (fd < 0) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)*port),
                                .sin_addr.s_addr = htonl(INADDR_ANY)};
        if (fd >= 0)
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            close(fd);
            fd = -1;
        }
    }
    len = sizeof ss;
    if (fd < 0 || listen(fd, SOMAXCONN) != 0 || set_socket(fd) != 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &len) != 0) {
        snprintf(err, errlen, "rank 0: cannot listen on TCP port %d: %s", *port, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                           : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

/* rank 0: "HOST PORT\n" into the rendezvous file, atomically */
static int write_rdv_file(const Rdv *r, int port, char *err, size_t errlen)
{
    char line[300];
    int n = snprintf(line, sizeof line, "%s %d\n", g.host, port);
    if (rt_afile_write(r->path, line, (size_t)n, 0644) != 0) {
        snprintf(err, errlen, "rank 0: cannot write the %s: %s", r->what, strerror(errno));
        return -1;
    }
    return 0;
}

enum { RDV_LINE = 300 };

/* "HOST PORT\n" (from the file or MPI) into r.  1, or -1 (err) */
static int parse_rdv_line(Rdv *r, char *buf, char *err, size_t errlen)
{
    char *sp = strchr(buf, ' '), *nl = strchr(buf, '\n');
    if (nl)
        *nl = 0;
    if (!nl || !sp || sp == buf || (size_t)(sp - buf) >= sizeof r->host ||
        parse_port(sp + 1, r->port, sizeof r->port) != 0) {
        snprintf(err, errlen, "rank %d: the %s does not hold \"HOST PORT\"", g.rank, r->what);
        return -1;
    }
    memcpy(r->host, buf, (size_t)(sp - buf));
    r->host[sp - buf] = 0;
    return 1;
}

/* the others: rank 0's address from the rendezvous file.  1: read; 0: not
 * there yet; -1: unusable (err) */
static int read_rdv_file(Rdv *r, char *err, size_t errlen)
{
    struct stat st;
    int fd = rt_open_regular(r->path, &st);
    if (fd == -1 && errno == ENOENT)
        return 0;
    if (fd < 0) {
        snprintf(err, errlen, "rank %d: cannot read the %s: %s", g.rank, r->what, rt_open_why(fd));
        return -1;
    }
    char buf[RDV_LINE];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0)
        return 0;
    if (r->check_owner && st.st_uid != geteuid()) {
        snprintf(err, errlen, "rank %d: the %s belongs to another user; pass --rendezvous", g.rank, r->what);
        return -1;
    }
    buf[n] = 0;
    if (!strchr(buf, '\n'))
        return 0; /* not complete (it is renamed into place, so only on odd file systems) */
    return parse_rdv_line(r, buf, err, errlen);
}

/* rank 0's "HOST PORT" line (rank 0: given; the others: received) through
 * MPI.  1: done (r->file cleared); 0: no MPI library and a file to fall back
 * to (r->mpi cleared); -1: err */
static int rdv_mpi(Rdv *r, char *line, char *err, size_t errlen)
{
    int rc = rt_rdv_mpi(line, RDV_LINE, g.rank, g.world, err, errlen);
    if (rc == 0 && r->mpi == 2) {
        r->mpi = 0;
        return 0;
    }
    if (rc == 0)
        snprintf(err, errlen, "rank %d: rendezvous through MPI, but Open MPI's library (libmpi.so.40, or "
                 "$FSDPC_MPI_LIB) is not here; pass --rendezvous file:PATH or tcp:HOST:PORT, or set MASTER_ADDR and "
                 "MASTER_PORT", g.rank);
    if (rc <= 0)
        return -1;
    r->file = 0;
    snprintf(r->what, sizeof r->what, "rendezvous through MPI");
    return 1;
}

/* one attempt to reach host:port before deadline.  fd; -2: not now (try
 * again); -1: hopeless (err) */
static int try_connect(const Rdv *r, double deadline, char *why, size_t whylen, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *res;
    int rc = getaddrinfo(r->host, r->port, &hints, &res);
    if (rc == EAI_AGAIN) {
        snprintf(why, whylen, "resolving %s: %s", r->host, gai_strerror(rc));
        return -2;
    }
    if (rc != 0) {
        snprintf(err, errlen, "rank %d: cannot resolve rank 0's host '%s' (%s): %s", g.rank, r->host, r->what,
                 gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0 || set_socket(fd) != 0) {
            snprintf(why, whylen, "socket: %s", strerror(errno));
        } else if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
            break;
        } else if (errno == EINPROGRESS || errno == EINTR) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            double left = deadline - now();
            int err_ = 0;
            socklen_t el = sizeof err_;
            int k = poll(&p, 1, left <= 0 ? 0 : left > 2 ? 2000 : (int)(left * 1000));
            if (k == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err_, &el) == 0 && err_ == 0)
                break;
            snprintf(why, whylen, "connecting to %s:%s: %s", r->host, r->port, k == 1 ? strerror(err_) : "timed out");
        } else {
            snprintf(why, whylen, "connecting to %s:%s: %s", r->host, r->port, strerror(errno));
        }
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd >= 0 ? fd : -2;
}

/* the others: connect to rank 0 before the start-up deadline */
static int join(Rdv *r, char *err, size_t errlen)
{
    char line[RDV_LINE] = "";
    int shared = r->mpi ? rdv_mpi(r, line, err, errlen) : 0;
    if (shared < 0 || (shared > 0 && parse_rdv_line(r, line, err, errlen) < 0))
        return -1;
    double deadline = now() + g.connect_timeout;
    char why[512];
    snprintf(why, sizeof why, "waiting for rank 0 to write the %.400s", r->what);
    for (;;) {
        int got = r->file ? read_rdv_file(r, err, errlen) : 1;
        if (got < 0)
            return -1;
        if (got > 0) {
            int fd = try_connect(r, deadline, why, sizeof why, err, errlen);
            if (fd != -2)
                return fd;
        }
        if (now() >= deadline) {
            snprintf(err, errlen, "rank %d: no answer from rank 0 within %d s (%s: %s; set FSDPC_CTL_CONNECT_TIMEOUT "
                     "to wait longer)", g.rank, g.connect_timeout, r->what, why);
            return -1;
        }
        nap(100);
    }
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
        double left = deadline - now();
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
    double by = now() + HELLO_WAIT < deadline ? now() + HELLO_WAIT : deadline;
    if (set_socket(fd) != 0 || read_by(fd, &f, sizeof f, by) != 0 || f.magic != MAGIC || f.type != FR_HELLO ||
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
    int port = r->file || r->mpi ? 0 : atoi(r->port);
    int lfd = listen_any(&port, err, errlen);
    if (lfd < 0)
        return -1;
    char line[RDV_LINE];
    snprintf(line, sizeof line, "%s %d\n", g.host, port);
    if (r->mpi && rdv_mpi(r, line, err, errlen) < 0) {
        close(lfd);
        return -1;
    }
    if (r->file && write_rdv_file(r, port, err, errlen) != 0) {
        close(lfd);
        return -1;
    }
    char (*hosts)[64] = calloc((size_t)g.world, sizeof *hosts);
    char bad[768] = "";
    double deadline = now() + g.connect_timeout;
    int joined = 0, rc = 0;
    while (rc == 0 && joined < g.world - 1) {
        double left = deadline - now();
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
    int fd = join(r, err, errlen);
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
    if (find_ranks(&source, err, errlen) != 0)
        return -1;
    int rc = env_int("FSDPC_CTL_TIMEOUT", 1, 31536000, &t, err, errlen);
    if (rc > 0)
        g.timeout = (int)t;
    if (rc >= 0 && (rc = env_int("FSDPC_CTL_CONNECT_TIMEOUT", 1, 31536000, &t, err, errlen)) > 0)
        g.connect_timeout = (int)t;
    if (rc < 0)
        return -1;
    *rank = g.rank;
    *world = g.world;
    g.up = 1;
    if (g.world == 1)
        return 0;
    Rdv r;
    if (pick_rendezvous(rendezvous, &r, source, err, errlen) != 0)
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
