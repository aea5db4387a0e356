/* build.h — private to codegen/exe.c, init.c and team.c: what a build of
 * OUT has made so far, the init file's layout and writer, and the step's
 * runs of nodes in one team. */
#ifndef FSDPC_CG_BUILD_H
#define FSDPC_CG_BUILD_H

#include "cg.h"
#include "afile.h"

/* ---- what a build has made ----------------------------------------------
 * Everything a build writes before it succeeds is aside, removed again if it
 * fails: OUT.init's temporary (rt_afile), the private folder the C compiler
 * works in, the device images' folder (cuda). */
typedef struct {
    const char *out;      /* -o OUT */
    int dirfd;            /* OUT's folder */
    char *base;           /* OUT's last component */
    char priv[300];       /* the private folder in OUT's folder ("" none yet) */
    const char *priv_path; /* its path, for the C compiler */
    int privfd;
    RtAFile init;         /* OUT.init, written aside (fd, dirfd -1: none) */
    const char *cuda_dir; /* cuda: the device images' folder, and how many */
    int nimage;
} Build;

/* everything b made removed; then the one-line error msg, which says the old pair is as it was (exe.c) */
_Noreturn void cg_build_fail(Build *b, const char *msg);
/* Run the C compiler (argv), its messages passed on when it succeeds: NULL, or one line: what went wrong and how
 * it ended (exe.c) */
const char *cg_spawn_cc(char *const *argv);
/* src compiled by cc (the compiler and its flags, NULL-terminated) into the object obj, or obj copied from the
 * object cache (objcache.c; the compiler's list of headers, obj.d, is made and removed beside it): NULL, or
 * cg_spawn_cc's line on why not */
const char *cg_object(const char *src, char *const *cc, const char *obj);

/* ---- the init file ------------------------------------------------------
 * Laid out first (offsets only), then written in one pass that sums what it
 * writes (runtime/isum.h): each section — the model bytes, each constant,
 * each unit's parameters, each kept external initializer — gets its own
 * checksum, kept in a table that ends the file (the table's checksum in the
 * header), which the executable checks as it reads.  The file's id, in its
 * header and in the executable, is the graph's structure (cg_init_id), not
 * the weights' values: an init file for other weights of the same model
 * (--init-only) fits the same executable.  A weight still in its external
 * data file is copied from there IR_CHUNK bytes at a time, so the compiler
 * never holds more of the weights than one chunk, and never reads the file
 * back. */
typedef struct {
    int64_t model_off, size;
    int64_t *const_off;  /* per value id, -1 if not stored */
    int64_t *unit_off;
    int64_t *ext_off;    /* per ONNX initializer: its external data, kept for export (untrained ones), or -1 */
    int *ext_val;        /* per ONNX initializer with ext_off >= 0: its value */
    int next;
    uint64_t *sum;       /* the sections' checksums: the model, each constant, each unit, each external initializer */
    int nsum;
    int64_t sum_off;     /* where their table starts: the last 8 * nsum bytes of the file */
} InitLayout;

InitLayout cg_init_layout(const Graph *g);
/* The init file's id: a hash of the step's text (len bytes), the units' sizes and the file's */
uint64_t cg_init_id(const Graph *g, const InitLayout *L, const char *step, size_t len);
/* Writes OUT.init aside (b->init; b NULL: nothing written, only summed): the sections, the table of their
 * checksums, then the header with the id, the table's checksum and the header's own. */
void cg_write_init(const Graph *g, InitLayout *L, uint64_t id, Build *b);
/* FNV-1a-64 of n bytes, continuing h (the init file's id, the executable's key) */
uint64_t cg_fnv(uint64_t h, const void *p, size_t n);

/* ---- one team for a run of nodes (team.c) -------------------------------
 * Consecutive nodes of the step whose code calls only kernels that share a
 * team's work run in one OpenMP team, with a barrier where bytes conflict. */
typedef struct {
    int64_t space[64], lo[64], hi[64]; /* byte ranges [lo, hi) of a space (the arena, a slot, a shard) */
    int n;
} CgRanges;

#define CG_TEAM_BARRIER "    _Pragma(\"omp barrier\")\n"
/* --trace's mark of node %d in a team: every thread at a barrier (c->trace is the same on all of them), then the
 * step's thread marks the node's end, so each node's time is its own (an untraced step takes no barrier) */
#define CG_TEAM_TRACE                                                                                           \
    "    if (c->trace) {\n        _Pragma(\"omp barrier\")\n        _Pragma(\"omp master\")\n        RT_TRACE(c, %d);\n    }\n"

/* may node n join a run (its code, text, calling only the kernels that share: *calls of them; a fused loop
 * emitted for the team) whose reads and writes since the last barrier are rd and wr?  *barrier: 1 where it
 * must wait for them first */
int cg_team_node(const Graph *g, const Node *n, const char *text, int *calls, const CgRanges *rd,
                 const CgRanges *wr, int *barrier);
/* 1: n starts a collective, 2: n waits for one, on the first thread of a run's team; 0: neither, or one that does
 * not join */
int cg_team_coll(const Node *n);
/* node n joined (after its barrier, if any): its reads and writes added to rd, wr; 1 where it splits its work */
int cg_team_take(const Graph *g, const Node *n, CgRanges *rd, CgRanges *wr);
/* the run [first, first + k) into body (text: its code for a team with CG_TEAM_BARRIER where needed; plain:
 * its code alone; big: its nodes that split their work; both with --trace's mark after each node): one team
 * where big is 2 or more, else the plain code */
void cg_team_flush(Buf *body, Buf *text, Buf *plain, int k, int big);

#endif
