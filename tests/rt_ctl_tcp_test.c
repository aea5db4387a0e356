/* rt_ctl_tcp_test.c — the cuda target's TCP control plane (runtime/ctl_tcp.c)
 * without a launcher: each case forks W ranks with RANK/WORLD_SIZE set and a
 * file rendezvous in a temporary directory.  Cases: the collectives (min,
 * max, sum, broadcasts, gathers of a few MB, to rank 0 and another root),
 * MASTER_ADDR/MASTER_PORT, a world of one; then failures, each of which
 * must end every rank non-zero within seconds: an abort and an early exit
 * while the others wait in a collective, the same while they are busy
 * elsewhere (the watchdog), a timeout, a rank running another executable,
 * and no rendezvous at all.
 */
#define _POSIX_C_SOURCE 200809L

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl_tcp.h"
#include "rt_ctl.h"
#include "rt_priv.h"

#define MAXW 8
#define KEY 0x1234abcd5678ef00ull

static char g_dir[256];
static int g_failed;

/* in a rank: a failed check ends it with status 20 */
#define CHECK(rank, cond)                                                                      \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "rank %d: %s:%d: check failed: %s\n", rank, __FILE__, __LINE__, #cond); \
            fflush(stderr);                                                                    \
            _exit(20);                                                                         \
        }                                                                                      \
    } while (0)

/* ------------------------------------------------------------- the ranks */

typedef struct {
    const char *name;
    int world;
    void (*body)(int rank, int world);
    const char *rendezvous; /* NULL: the file in g_dir; "" none (the environment's) */
    int master_port;        /* > 0: MASTER_ADDR=127.0.0.1 MASTER_PORT=this */
    int no_env;             /* no RANK/WORLD_SIZE at all */
    int late0;              /* rank 0 starts this many ms late, after a stale rendezvous file is left */
    const char *timeout;    /* FSDPC_CTL_TIMEOUT (default 60) */
    int other_key;          /* > 0: rank other_key runs "another executable" */
    int fails;              /* 0: every rank exits 0; else every rank exits non-zero (and < 20: no
                             * failed check, no crash), with status `code` when that is not 0 */
    int code;
    unsigned quits;         /* bit r: rank r quits on purpose, its own status does not count */
    double within;          /* seconds for all to be gone */
    int msg_rank;           /* whose stderr holds msg and msg2 (when not NULL) */
    const char *msg, *msg2;
} Case;

static void collectives(int rank, int world)
{
    CHECK(rank, rt_ctl_local_rank() == rank % 2);
    int64_t x[4] = {rank, -rank, (int64_t)rank * rank, 7}, y[4], z[4];
    memcpy(y, x, sizeof x);
    memcpy(z, x, sizeof x);
    rt_ctl_allreduce_i64(x, 4, RT_CTL_MIN);
    rt_ctl_allreduce_i64(y, 4, RT_CTL_MAX);
    rt_ctl_allreduce_i64(z, 4, RT_CTL_SUM);
    int64_t W = world, sq = (W - 1) * W * (2 * W - 1) / 6;
    CHECK(rank, x[0] == 0 && x[1] == -(W - 1) && x[2] == 0 && x[3] == 7);
    CHECK(rank, y[0] == W - 1 && y[1] == 0 && y[2] == (W - 1) * (W - 1) && y[3] == 7);
    CHECK(rank, z[0] == W * (W - 1) / 2 && z[1] == -W * (W - 1) / 2 && z[2] == sq && z[3] == 7 * W);
    rt_ctl_allreduce_i64(x, 0, RT_CTL_SUM); /* nothing: not even a message */

    for (int root = 0; root < world; root += world - 1) {
        unsigned char b[1000];
        for (int i = 0; i < 1000; i++)
            b[i] = rank == root ? (unsigned char)(i * 7 + root) : 0;
        rt_ctl_bcast(b, sizeof b, root);
        for (int i = 0; i < 1000; i++)
            CHECK(rank, b[i] == (unsigned char)(i * 7 + root));
    }

    const int64_t n = 3 << 20; /* 3 MiB per rank */
    int roots[2] = {0, world > 2 ? 2 : 1};
    unsigned char *mine = malloc((size_t)n), *all = malloc((size_t)n * (size_t)world);
    CHECK(rank, mine && all);
    for (int k = 0; k < 2; k++) {
        int root = roots[k];
        for (int64_t i = 0; i < n; i++)
            mine[i] = (unsigned char)(i * 13 + 31 * rank + root);
        memset(all, 0xee, (size_t)n * (size_t)world);
        rt_ctl_gather(mine, n, all, root);
        for (int q = 0; rank == root && q < world; q++)
            for (int64_t i = 0; i < n; i += 4099)
                CHECK(rank, all[q * n + i] == (unsigned char)(i * 13 + 31 * q + root));
        if (rank != root)
            CHECK(rank, all[0] == 0xee && all[n * world - 1] == 0xee);
    }
    free(mine);
    free(all);
}

static void small(int rank, int world)
{
    int64_t x = rank + 1;
    rt_ctl_allreduce_i64(&x, 1, RT_CTL_SUM);
    CHECK(rank, x == (int64_t)world * (world + 1) / 2);
    char a[3] = {'a', 'b', (char)('0' + rank)}, b[3 * MAXW] = {0};
    rt_ctl_gather(a, 3, b, 0); /* world 1: a copy */
    for (int q = 0; rank == 0 && q < world; q++)
        CHECK(rank, b[3 * q] == 'a' && b[3 * q + 2] == '0' + q);
}

/* rank 1 aborts; the others wait in a collective */
static void abort_in_op(int rank, int world)
{
    (void)world;
    if (rank == 1) {
        ctl_nap(300);
        fprintf(stderr, "rank 1: giving up\n");
        rt_ctl_abort(3);
    }
    int64_t x = 0;
    rt_ctl_allreduce_i64(&x, 1, RT_CTL_SUM);
    CHECK(rank, !"allreduce returned although rank 1 aborted");
}

/* the last rank exits without a word; the others wait in an allreduce */
static void exit_in_op(int rank, int world)
{
    if (rank == world - 1)
        _exit(0);
    int64_t x = 0;
    rt_ctl_allreduce_i64(&x, 1, RT_CTL_MAX);
    CHECK(rank, !"allreduce returned although a rank is gone");
}

/* rank 1 aborts; the others are busy outside the control plane */
static void abort_while_busy(int rank, int world)
{
    (void)world;
    if (rank == 1) {
        ctl_nap(300);
        rt_ctl_abort(4);
    }
    ctl_nap(20000);
    CHECK(rank, !"still alive 20 s after rank 1 aborted");
}

/* rank 0 dies while the others are busy */
static void rank0_exits(int rank, int world)
{
    (void)world;
    if (rank == 0) {
        ctl_nap(300);
        _exit(0);
    }
    ctl_nap(20000);
    CHECK(rank, !"still alive 20 s after rank 0 died");
}

/* rank 1 is late for an allreduce beyond FSDPC_CTL_TIMEOUT */
static void late(int rank, int world)
{
    (void)world;
    if (rank == 1)
        ctl_nap(6000);
    int64_t x = 0;
    rt_ctl_allreduce_i64(&x, 1, RT_CTL_SUM);
    CHECK(rank, !"allreduce returned although rank 1 was late");
}

static void unset_launchers(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                       "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "SLURM_PROCID", "SLURM_NTASKS",
                                       "SLURM_LOCALID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                       "MASTER_PORT", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE",
                                       "FSDPC_CTL_TIMEOUT", "FSDPC_CTL_CONNECT_TIMEOUT"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
}

static void err_path(char *buf, size_t cap, const Case *c, int rank)
{
    snprintf(buf, cap, "%s/%s.err.%d", g_dir, c->name, rank);
}

/* one forked rank: what rt_main does around the body */
static _Noreturn void rank_main(const Case *c, int rank)
{
    char path[512], num[32], rdv[512];
    err_path(path, sizeof path, c, rank);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        dup2(fd, 2);
        close(fd);
    }
    unset_launchers();
    if (!c->no_env) {
        snprintf(num, sizeof num, "%d", rank);
        setenv("RANK", num, 1);
        snprintf(num, sizeof num, "%d", rank % 2);
        setenv("LOCAL_RANK", num, 1);
        snprintf(num, sizeof num, "%d", c->world);
        setenv("WORLD_SIZE", num, 1);
    }
    if (c->master_port > 0) {
        snprintf(num, sizeof num, "%d", c->master_port);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", num, 1);
    }
    setenv("FSDPC_CTL_TIMEOUT", c->timeout ? c->timeout : "60", 1);
    setenv("FSDPC_CTL_CONNECT_TIMEOUT", "20", 1);
    snprintf(rdv, sizeof rdv, "file:%s/%s.rdv", g_dir, c->name);
    const char *spec = c->rendezvous ? (c->rendezvous[0] ? c->rendezvous : NULL) : rdv;
    if (rank == 0 && c->late0)
        ctl_nap(c->late0);
    int r = -1, w = 0;
    char err[1024];
    int argc = 1;
    char *args[] = {(char *)"rt_ctl_tcp_test", NULL}, **argv = args;
    uint64_t key = c->other_key > 0 && rank == c->other_key ? KEY + 1 : KEY;
    if (rt_ctl_init(&argc, &argv, spec, key, &r, &w, err, sizeof err) != 0) {
        if (err[0])
            fprintf(stderr, "%s: error: %s\n", rt_prog, err);
        _exit(1);
    }
    CHECK(rank, c->no_env ? r == 0 && w == 1 : r == rank && w == c->world);
    c->body(r, w);
    rt_ctl_finalize();
    _exit(0);
}

/* --------------------------------------------------------------- parent */

static int file_has(const char *path, const char *needle)
{
    char buf[8192];
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strstr(buf, needle) != NULL;
}

static int fail(const Case *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(const Case *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL %s: ", c->name);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    for (int q = 0; q < c->world; q++) {
        char path[512], line[512];
        err_path(path, sizeof path, c, q);
        FILE *f = fopen(path, "r");
        while (f && fgets(line, sizeof line, f))
            fprintf(stderr, "    rank %d stderr: %s", q, line);
        if (f)
            fclose(f);
    }
    g_failed = 1;
    return 1;
}

/* a TCP port that was free a moment ago */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        perror("free_port");
        exit(2);
    }
    close(fd);
    return ntohs(a.sin_port);
}

static void run(const Case *c)
{
    pid_t pid[MAXW];
    int status[MAXW], done[MAXW] = {0};
    double t0 = ctl_now(), end[MAXW];
    if (c->late0) { /* a dead run's address, which the others must not wait on */
        char path[512];
        snprintf(path, sizeof path, "%s/%s.rdv", g_dir, c->name);
        FILE *f = fopen(path, "w");
        if (!f || fprintf(f, "127.0.0.1 %d\n", free_port()) < 0 || fclose(f) != 0) {
            perror(path);
            exit(2);
        }
    }
    fflush(NULL);
    for (int q = 0; q < c->world; q++) {
        pid[q] = fork();
        if (pid[q] < 0) {
            perror("fork");
            exit(2);
        }
        if (pid[q] == 0)
            rank_main(c, q);
    }
    int left = c->world;
    while (left > 0 && ctl_now() - t0 < 60) {
        for (int q = 0; q < c->world; q++)
            if (!done[q] && waitpid(pid[q], &status[q], WNOHANG) == pid[q]) {
                done[q] = 1;
                end[q] = ctl_now() - t0;
                left--;
            }
        ctl_nap(10);
    }
    for (int q = 0; q < c->world; q++)
        if (!done[q]) {
            kill(pid[q], SIGKILL);
            waitpid(pid[q], &status[q], 0);
            fail(c, "rank %d still ran after 60 s", q);
            return;
        }
    double last = 0;
    int bad = 0;
    for (int q = 0; q < c->world; q++) {
        int code = WIFEXITED(status[q]) ? WEXITSTATUS(status[q]) : 128 + WTERMSIG(status[q]);
        if (c->quits >> q & 1)
            ;
        else if (!c->fails ? code != 0 : code == 0 || code >= 20 || (c->code && code != c->code))
            bad = fail(c, "rank %d exited with status %d", q, code);
        if (end[q] > last)
            last = end[q];
    }
    if (last > c->within)
        bad = fail(c, "the last rank ended after %.2f s (at most %.0f s expected)", last, c->within);
    char path[512];
    err_path(path, sizeof path, c, c->msg_rank);
    if ((c->msg && !file_has(path, c->msg)) || (c->msg2 && !file_has(path, c->msg2)))
        bad = fail(c, "rank %d's stderr lacks '%s'%s%s", c->msg_rank, c->msg, c->msg2 ? " or " : "",
                   c->msg2 ? c->msg2 : "");
    printf("%-18s world %d: %s, %.2f s\n", c->name, c->world, bad ? "FAILED" : "ok", last);
    for (int q = 0; c->fails && q < c->world; q++) { /* what the user would see */
        char line[512];
        err_path(path, sizeof path, c, q);
        FILE *f = fopen(path, "r");
        while (f && fgets(line, sizeof line, f))
            printf("    rank %d: %s", q, line);
        if (f)
            fclose(f);
    }
    fflush(stdout);
}

int main(void)
{
    rt_prog = "rt_ctl_tcp_test";
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/fsdpc-ctl-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 2;
    }
    const Case cases[] = {
        {.name = "collectives", .world = 4, .body = collectives, .within = 30},
        {.name = "collectives_2", .world = 2, .body = collectives, .within = 30},
        {.name = "master_addr", .world = 3, .body = small, .rendezvous = "", .master_port = free_port(), .within = 30},
        {.name = "stale_file", .world = 3, .body = small, .late0 = 700, .within = 30},
        {.name = "world_1", .world = 1, .body = small, .rendezvous = "", .no_env = 1, .within = 5},
        {.name = "abort_in_op", .world = 3, .body = abort_in_op, .fails = 1, .code = 3, .within = 5},
        {.name = "exit_in_op", .world = 3, .body = exit_in_op, .fails = 1, .within = 5,
         .quits = 1u << 2, .msg = "rank 0: rank 2 closed its connection during allreduce"},
        {.name = "abort_while_busy", .world = 3, .body = abort_while_busy, .fails = 1, .code = 4, .within = 5},
        {.name = "rank0_exits", .world = 3, .body = rank0_exits, .fails = 1, .quits = 1, .within = 5, .msg_rank = 1,
         .msg = "rank 1: lost the connection to rank 0"},
        {.name = "timeout", .world = 2, .body = late, .timeout = "1", .fails = 1, .code = 1, .within = 5,
         .msg = "rank 0: no answer from rank 1 within 1 s (allreduce"},
        {.name = "other_key", .world = 4, .body = small, .other_key = 3, .fails = 1, .code = 1, .within = 10,
         .msg = "rank 3 (host ", .msg2 = "runs another executable (key"},
        {.name = "no_rendezvous", .world = 2, .body = small, .rendezvous = "", .fails = 1, .code = 1, .within = 5,
         .msg_rank = 1, .msg = "rank 1 of 2 (from RANK): no rendezvous"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run(&cases[i]);
    if (!g_failed) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "warning: could not remove %s\n", g_dir);
    }
    printf("%s\n", g_failed ? "FAILED" : "all passed");
    return g_failed;
}
