/* team.c — one OpenMP team for a run of copies in the emitted step (exe.c's
 * emit_phase_fn asks, node by node, whether the node joins the run).
 *
 * Every kernel call of the step forks the OpenMP team and joins it (a parallel region each: about 210 a step of
 * the 128/4/128/8 GPT at 2 threads), and at every join the team waits for its slowest thread: on cores shared
 * with other work, for the thread that is not running.  The copy kernels (k_copy_strided, k_transpose_*) can
 * instead take their thread's share inside a team the step already runs (k_share: each element is copied alike
 * however the range is split, so the bits do not change), so a run of consecutive nodes whose code calls only
 * them (a Split's three copies, the attention's transposes, the views between) is one parallel region, with a
 * barrier only where a node writes arena bytes that a node of the run read or wrote since the last barrier, or
 * reads bytes one wrote.  A node touching anything outside the arena, or calling anything else, ends the run.
 * A run becomes a team only where two of its outputs or more are large enough to split (K_PAR_MIN elements; a
 * smaller copy runs on the team's first thread): copies the kernels would not split stay as they were.
 * --trace marks the run's nodes when the run ends. */
#include "build.h"

#include <ctype.h>
#include <string.h>

static int team_kernel(const char *name, size_t len)
{
    return (len == 14 && !strncmp(name, "k_copy_strided", 14)) || (len > 12 && !strncmp(name, "k_transpose_", 12));
}

/* is text (a node's code) only team-kernel calls and `static const` tables (and braces, comments), so that every
 * thread of a team may run it?  *calls: how many calls */
static int team_text(const char *s, int *calls)
{
    *calls = 0;
    const char *stmt = NULL; /* the statement being read: its first character */
    for (const char *p = s; p && *p; p++) {
        if (p[0] == '/' && p[1] == '*') { /* comments are not code */
            p = strstr(p + 2, "*/");
            if (!p)
                return 0;
            p++;
        } else if (!stmt && !isspace((unsigned char)*p) && *p != '{' && *p != '}') {
            stmt = p;
            if (*p == ';')
                stmt = NULL;
        } else if (stmt && *p == ';') {
            const char *q = stmt;
            while (isalnum((unsigned char)*q) || *q == '_')
                q++;
            if (!strncmp(stmt, "static const ", 13))
                ;
            else if (*q == '(' && team_kernel(stmt, (size_t)(q - stmt)))
                ++*calls;
            else
                return 0;
            stmt = NULL;
        }
    }
    return !stmt;
}

int cg_value_range(const Graph *g, int v, int64_t *lo, int64_t *hi)
{
    const Value *x = &g->val[v];
    if (x->loc.kind != LOC_ARENA)
        return 0;
    *lo = x->loc.off;
    *hi = *lo + value_numel(g, v) * (int64_t)dtype_size(x->dtype);
    return 1;
}

static int overlaps(const CgRanges *r, int64_t lo, int64_t hi)
{
    for (int k = 0; k < r->n; k++)
        if (lo < r->hi[k] && r->lo[k] < hi)
            return 1;
    return 0;
}

void cg_ranges_add(CgRanges *r, int64_t lo, int64_t hi)
{
    r->lo[r->n] = lo;
    r->hi[r->n++] = hi;
}

/* may node n join a run of copies (its code, text, calling only copy kernels: *calls of them) whose
 * reads and writes since the last barrier are rd and wr?  *barrier: 1 where it must wait for them first */
int cg_team_node(const Graph *g, const Node *n, const char *text, int *calls, const CgRanges *rd,
                 const CgRanges *wr, int *barrier)
{
    int64_t lo, hi;
    if (!team_text(text, calls) || n->nin > 32 || n->nout > 32)
        return 0;
    *barrier = 0;
    if (!*calls)
        return 1; /* a view or a comment: touches nothing */
    if (*calls > 1 && n->op != OP_Split && n->op != OP_Concat)
        return 0; /* its calls might depend on each other; a Split's or a Concat's write apart */
    if (n->nin + n->nout + rd->n > 32 || n->nout + wr->n > 32)
        *barrier = 1;
    for (int j = 0; j < n->nin; j++) {
        if (n->in[j] < 0)
            continue;
        if (!cg_value_range(g, n->in[j], &lo, &hi))
            return 0;
        *barrier |= overlaps(wr, lo, hi);
    }
    for (int j = 0; j < n->nout; j++) {
        if (!cg_value_range(g, n->out[j], &lo, &hi))
            return 0;
        *barrier |= overlaps(rd, lo, hi) || overlaps(wr, lo, hi);
    }
    return 1;
}

/* a run of nodes [first, first + k) (text: their code with a barrier where needed, big: their outputs large
 * enough to split): one team where big is 2 or more, else the code alone */
void cg_team_flush(Buf *body, Buf *text, int first, int k, int big)
{
    if (!k)
        return;
    if (big > 1)
        cg_put(body, "    _Pragma(\"omp parallel\")\n    { k_share(1);\n%s      k_share(0); }\n", text->buf);
    else
        for (const char *p = text->len ? text->buf : ""; *p;) { /* without the barriers */
            const char *e = strchr(p, '\n');
            size_t len = e ? (size_t)(e - p + 1) : strlen(p);
            if (strncmp(p, CG_TEAM_BARRIER, len) || len != strlen(CG_TEAM_BARRIER))
                cg_put(body, "%.*s", (int)len, p);
            p += len;
        }
    for (int i = first; i < first + k; i++) /* --trace: node i ended */
        cg_put(body, "    RT_TRACE(c, %d);\n", i);
    text->len = 0; /* the buffer kept for the next run */
}
