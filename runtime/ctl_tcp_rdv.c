/* ctl_tcp_rdv.c — where this rank stands and how it reaches rank 0: the
 * first half of the cuda target's TCP control plane (ctl_tcp.h; ctl_tcp.c
 * speaks the protocol over the connections made here).
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
 * Rank 0 listens on every interface (IPv6 and IPv4 where it can); the
 * others retry (the file not written yet, the port not open yet, the name
 * not resolved yet) until FSDPC_CTL_CONNECT_TIMEOUT (Rdv.timeout) runs out,
 * then fail with one line naming the rendezvous and the last reason.
 * Every socket made here is non-blocking.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctl_tcp.h"
#include "rt_ctl.h"
#include "rt_priv.h"

#define MAX_WORLD (1 << 20)

double ctl_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void ctl_nap(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

/* --------------------------------------------------------------- ranks */

int ctl_env_int(const char *name, long lo, long hi, long *out, char *err, size_t errlen)
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

int ctl_find_ranks(int *rank_, int *world_, int *local_, const char **source, char *err, size_t errlen)
{
    static const char *const vars[][3] = {
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
        {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
        {"RANK", "WORLD_SIZE", "LOCAL_RANK"},
    };
    *rank_ = 0;
    *world_ = 1;
    *local_ = 0;
    *source = NULL;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        if (!getenv(vars[i][0]))
            continue;
        long rank = 0, world = 1, local = -1;
        int r = ctl_env_int(vars[i][1], 1, MAX_WORLD, &world, err, errlen);
        if (r == 0)
            snprintf(err, errlen, "environment variable %s is set but %s is not", vars[i][0], vars[i][1]);
        if (r <= 0 || ctl_env_int(vars[i][0], 0, world - 1, &rank, err, errlen) < 0 ||
            ctl_env_int(vars[i][2], 0, world - 1, &local, err, errlen) < 0)
            return -1;
        *rank_ = (int)rank;
        *world_ = (int)world;
        *local_ = local >= 0 ? (int)local : (int)rank;
        *source = vars[i][0];
        return 0;
    }
    return 0;
}

/* ---------------------------------------------------------- rendezvous */


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

int ctl_rdv_pick(Rdv *r, const char *spec, const char *source, int rank, int world, int timeout, char *err,
                 size_t errlen)
{
    memset(r, 0, sizeof *r);
    r->rank = rank;
    r->world = world;
    r->timeout = timeout;
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
                 "rank can read) or tcp:HOST:PORT, or set MASTER_ADDR and MASTER_PORT", r->rank, r->world, source);
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

int ctl_set_socket(int fd)
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
    if (fd < 0 || listen(fd, SOMAXCONN) != 0 || ctl_set_socket(fd) != 0 ||
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
static int write_rdv_file(const Rdv *r, const char *host, int port, char *err, size_t errlen)
{
    char line[300];
    int n = snprintf(line, sizeof line, "%s %d\n", host, port);
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
        snprintf(err, errlen, "rank %d: the %s does not hold \"HOST PORT\"", r->rank, r->what);
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
        snprintf(err, errlen, "rank %d: cannot read the %s: %s", r->rank, r->what, rt_open_why(fd));
        return -1;
    }
    char buf[RDV_LINE];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0)
        return 0;
    if (r->check_owner && st.st_uid != geteuid()) {
        snprintf(err, errlen, "rank %d: the %s belongs to another user; pass --rendezvous", r->rank, r->what);
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
    int rc = rt_rdv_mpi(line, RDV_LINE, r->rank, r->world, err, errlen);
    if (rc == 0 && r->mpi == 2) {
        r->mpi = 0;
        return 0;
    }
    if (rc == 0)
        snprintf(err, errlen, "rank %d: rendezvous through MPI, but Open MPI's library (libmpi.so.40, or "
                 "$FSDPC_MPI_LIB) is not here; pass --rendezvous file:PATH or tcp:HOST:PORT, or set MASTER_ADDR and "
                 "MASTER_PORT", r->rank);
    if (rc <= 0)
        return -1;
    r->file = 0;
    snprintf(r->what, sizeof r->what, "rendezvous through MPI");
    return 1;
}

int ctl_rdv_listen(Rdv *r, const char *host, int *port, char *err, size_t errlen)
{
    *port = r->file || r->mpi ? 0 : atoi(r->port);
    int lfd = listen_any(port, err, errlen);
    if (lfd < 0)
        return -1;
    char line[RDV_LINE];
    snprintf(line, sizeof line, "%s %d\n", host, *port);
    if ((r->mpi && rdv_mpi(r, line, err, errlen) < 0) ||
        (r->file && write_rdv_file(r, host, *port, err, errlen) != 0)) {
        close(lfd);
        return -1;
    }
    return lfd;
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
        snprintf(err, errlen, "rank %d: cannot resolve rank 0's host '%s' (%s): %s", r->rank, r->host, r->what,
                 gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0 || ctl_set_socket(fd) != 0) {
            snprintf(why, whylen, "socket: %s", strerror(errno));
        } else if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
            break;
        } else if (errno == EINPROGRESS || errno == EINTR) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            double left = deadline - ctl_now();
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

int ctl_rdv_join(Rdv *r, char *err, size_t errlen)
{
    char line[RDV_LINE] = "";
    int shared = r->mpi ? rdv_mpi(r, line, err, errlen) : 0;
    if (shared < 0 || (shared > 0 && parse_rdv_line(r, line, err, errlen) < 0))
        return -1;
    double deadline = ctl_now() + r->timeout;
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
        if (ctl_now() >= deadline) {
            snprintf(err, errlen, "rank %d: no answer from rank 0 within %d s (%s: %s; set FSDPC_CTL_CONNECT_TIMEOUT "
                     "to wait longer)", r->rank, r->timeout, r->what, why);
            return -1;
        }
        ctl_nap(100);
    }
}
