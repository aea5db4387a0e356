/* ctl_tcp.h — what the two halves of the cuda target's TCP control plane
 * share: runtime/ctl_tcp_rdv.c finds this rank's place in the world and rank
 * 0's address (the launcher's environment, --rendezvous, MASTER_ADDR) and
 * makes the connections; runtime/ctl_tcp.c speaks the protocol over them
 * (hello, frames, collectives, aborts, the watchdog).  Internal: nothing
 * outside those two files and their test (tests/rt_ctl_tcp_test.c, which
 * uses the clock and the nap) includes it.
 */
#ifndef FSDPC_CTL_TCP_H
#define FSDPC_CTL_TCP_H

#include <limits.h>
#include <stddef.h>

/* how this rank finds rank 0 (ctl_rdv_pick fills it in) */
typedef struct {
    int file;                 /* 1: PATH holds "HOST PORT"; 0: HOST:PORT given */
    int mpi;                  /* 1: MPI carries "HOST PORT"; 2: MPI if it loads, else the file (if set) */
    char path[PATH_MAX];
    int check_owner;          /* the default file in /tmp: written by this user */
    char host[256];
    char port[8];             /* decimal; "0" for an ephemeral one */
    char what[PATH_MAX + 64]; /* for messages */
    int rank, world;          /* this rank and the world, for messages and MPI */
    int timeout;              /* seconds the others wait for rank 0 (FSDPC_CTL_CONNECT_TIMEOUT) */
} Rdv;

/* seconds on CLOCK_MONOTONIC */
double ctl_now(void);
/* sleep ms milliseconds (through signals) */
void ctl_nap(int ms);
/* a decimal integer in [lo, hi] from env variable name; 1 read, 0 unset, -1 bad (err) */
int ctl_env_int(const char *name, long lo, long hi, long *out, char *err, size_t errlen);
/* rank, world and local rank from the first launcher variables that are set (*source: the rank variable's name,
 * NULL when none is: a world of one).  0, or -1 (err) */
int ctl_find_ranks(int *rank, int *world, int *local, const char **source, char *err, size_t errlen);
/* r := the rendezvous of --rendezvous spec (NULL: none given; then MASTER_ADDR/PORT, mpirun's job file, MPI) for
 * rank of world (ranks from env variable source), waiting timeout seconds at start-up.  0, or -1 (err) */
int ctl_rdv_pick(Rdv *r, const char *spec, const char *source, int rank, int world, int timeout, char *err,
                 size_t errlen);
/* fd non-blocking, close-on-exec, no Nagle delay: 0, or -1 */
int ctl_set_socket(int fd);
/* rank 0 on host: a listening socket (*port: its port) whose address r publishes (the file, MPI).  The socket, or
 * -1 (err) */
int ctl_rdv_listen(Rdv *r, const char *host, int *port, char *err, size_t errlen);
/* the others: a socket connected to rank 0 within r->timeout seconds, or -1 (err) */
int ctl_rdv_join(Rdv *r, char *err, size_t errlen);

#endif
