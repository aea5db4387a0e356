/* parse.c — the reader of the IR text ir/print.c writes (fsdpc --run-pass).
 *
 * The text is line-oriented and its sections come in print.c's order:
 * "graph:" (the counts, which size every array before a line refers to an
 * id), "flags:" (read by ir_parse_flags and handed to fsdpc's own flag
 * parser: the options a pass reads are the file's), "state:", "inputs:",
 * "outputs:", "sig_lost:", units, slots, fusions with their members,
 * "values:", "nodes:".  Blank lines and lines starting with '#' (the
 * "# after PASS" header, a test's comments) are skipped.  The reader builds
 * the Graph directly (arrays of the counts given, then ir_link), so
 * print(parse(print(g))) == print(g).
 *
 * The file is user input: every number is range-checked, every id must name
 * an existing value / unit, every array length is bounded by the number of
 * lines (a count cannot make it allocate more than the file can describe),
 * and the structure the passes assume is checked here: each op's arity as
 * ops.def gives it, one producer per value, every value read after it is
 * produced (or one that needs no producer), data as many elements as the
 * shape.  A fault is ONE line, "fsdpc: error: FILE:LINE: what is wrong".
 * A graph that passes these checks but breaks a pass's own invariants (a
 * hand-edited schedule, say) is the pass's to report.
 */
#include "ir.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define IR_MAX_FILE ((int64_t)1 << 31) /* bytes of a .ir file the reader accepts */

typedef struct {
    const char *path;
    char **line;     /* the file's lines, NUL-terminated, blank and comment lines dropped */
    int *lineno;     /* their numbers in the file */
    int nline, at;   /* lines, the current one */
    const char *p;   /* the cursor in the current line */
    Graph *g;
} Rd;

static _Noreturn void bad(const Rd *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static _Noreturn void bad(const Rd *r, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int ln = r->at < r->nline ? r->lineno[r->at] : r->nline ? r->lineno[r->nline - 1] + 1 : 1;
    fatal("%s:%d: %s", r->path, ln, msg);
}

/* the file's bytes, NUL-terminated (one line on stderr when unreadable) */
static char *read_file(const char *path, size_t *len)
{
    int64_t size;
    const char *why;
    int fd = ir_open_regular(path, 0, &size, &why);
    if (fd < 0)
        fatal("%s: cannot read the IR file: %s", path, why);
    if (size > IR_MAX_FILE)
        fatal("%s: %lld bytes: an IR file is at most %lld bytes", path, (long long)size, (long long)IR_MAX_FILE);
    char *b = ir_alloc((size_t)size + 1);
    size_t n = 0;
    while (n < (size_t)size) {
        ssize_t k = read(fd, b + n, (size_t)size - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            fatal("%s: cannot read the IR file: %s", path, k ? strerror(errno) : "it became shorter");
        n += (size_t)k;
    }
    close(fd);
    if (memchr(b, 0, n))
        fatal("%s: a NUL byte: not an IR text file", path);
    *len = n;
    return b;
}

/* r's lines: blank and '#' lines dropped, trailing blanks cut */
static void split_lines(Rd *r, char *b, size_t len)
{
    int cap = 1;
    for (size_t i = 0; i < len; i++)
        cap += b[i] == '\n';
    r->line = ir_alloc(sizeof(char *) * (size_t)cap);
    r->lineno = ir_alloc(sizeof(int) * (size_t)cap);
    int ln = 0;
    for (char *s = b; s && *s;) {
        char *e = strchr(s, '\n'), *next = e ? e + 1 : NULL;
        if (!e)
            e = s + strlen(s);
        ln++;
        while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
            e--;
        *e = 0;
        const char *t = s + strspn(s, " \t");
        if (*t && *t != '#')
            r->lineno[r->nline] = ln, r->line[r->nline++] = s;
        s = next;
    }
}

static void skip_blank(Rd *r)
{
    while (*r->p == ' ' || *r->p == '\t')
        r->p++;
}

/* does the current line start (after blanks) with word w? then step over it */
static int line_is(Rd *r, const char *w)
{
    if (r->at >= r->nline)
        return 0;
    const char *s = r->line[r->at] + strspn(r->line[r->at], " \t");
    if (strncmp(s, w, strlen(w)))
        return 0;
    r->p = s + strlen(w);
    return 1;
}

static void need_line(Rd *r, const char *w)
{
    if (!line_is(r, w))
        bad(r, "expected a line starting with '%s'", w);
}

/* the current line must be read to its end; then the next */
static void end_line(Rd *r)
{
    skip_blank(r);
    if (*r->p)
        bad(r, "unexpected '%.40s'", r->p);
    r->at++;
}

static int accept(Rd *r, const char *s)
{
    skip_blank(r);
    if (strncmp(r->p, s, strlen(s)))
        return 0;
    r->p += strlen(s);
    return 1;
}

static void expect(Rd *r, const char *s)
{
    if (!accept(r, s))
        bad(r, "expected '%s' at '%.40s'", s, r->p);
}

/* a decimal integer in [min, max] */
static int64_t rd_int(Rd *r, const char *what, int64_t min, int64_t max)
{
    skip_blank(r);
    char *e;
    errno = 0;
    long long v = strtoll(r->p, &e, 10);
    if (e == r->p || !(isdigit((unsigned char)*r->p) || *r->p == '-'))
        bad(r, "expected %s (an integer) at '%.40s'", what, r->p);
    if (errno == ERANGE || v < min || v > max)
        bad(r, "%s %.*s is out of range [%lld, %lld]", what, (int)(e - r->p), r->p, (long long)min,
            (long long)max);
    r->p = e;
    return v;
}

/* a value id %N (N < nval; -1 too when none) */
static int rd_id(Rd *r, const char *what, int none)
{
    expect(r, "%");
    return (int)rd_int(r, what, none ? -1 : 0, r->g->nval - 1);
}

static double rd_double(Rd *r, const char *what)
{
    skip_blank(r);
    char *e;
    double v = strtod(r->p, &e);
    if (e == r->p)
        bad(r, "expected %s (a number) at '%.40s'", what, r->p);
    r->p = e;
    return v;
}

/* an identifier: letters, digits, '_', '.', '-' */
static const char *rd_word(Rd *r, const char *what)
{
    skip_blank(r);
    const char *s = r->p;
    while (isalnum((unsigned char)*r->p) || *r->p == '_' || *r->p == '.' || *r->p == '-')
        r->p++;
    if (r->p == s)
        bad(r, "expected %s at '%.40s'", what, s);
    return ir_fmt("%.*s", (int)(r->p - s), s);
}

static int hexval(int c)
{
    return isdigit(c) ? c - '0' : isxdigit(c) ? tolower(c) - 'a' + 10 : -1;
}

/* a quoted string with print.c's escapes (\" \\ \n \xHH) */
static char *rd_str(Rd *r, const char *what)
{
    skip_blank(r);
    if (*r->p != '"')
        bad(r, "expected %s (a quoted string) at '%.40s'", what, r->p);
    const char *s = ++r->p;
    char *out = ir_alloc(strlen(s) + 1), *o = out;
    for (; *s != '"'; s++) {
        if (!*s)
            bad(r, "%s: the string is not closed", what);
        if (*s != '\\') {
            *o++ = *s;
            continue;
        }
        s++;
        if (*s == 'n')
            *o++ = '\n';
        else if (*s == '"' || *s == '\\')
            *o++ = *s;
        else if (*s == 'x' && hexval((unsigned char)s[1]) >= 0 && hexval((unsigned char)s[2]) >= 0 &&
                 (hexval((unsigned char)s[1]) || hexval((unsigned char)s[2])))
            *o++ = (char)(hexval((unsigned char)s[1]) * 16 + hexval((unsigned char)s[2])), s += 2;
        else
            bad(r, "%s: unknown escape '\\%c' (\\\" \\\\ \\n \\xHH)", what, *s ? *s : ' ');
    }
    r->p = s + 1;
    return out;
}

/* the index of name in names[0..n), else a line listing what is known */
static int rd_enum(Rd *r, const char *what, const char *const *names, int n)
{
    const char *w = rd_word(r, what);
    for (int k = 0; k < n; k++)
        if (names[k] && !strcmp(names[k], w))
            return k;
    bad(r, "unknown %s '%s'", what, w);
}

/* a dtype as dtype_name spells it ("undef" too), running to its '[' */
static DType rd_dtype(Rd *r)
{
    skip_blank(r);
    const char *s = r->p;
    while (isalnum((unsigned char)*r->p))
        r->p++;
    size_t n = (size_t)(r->p - s);
    for (int t = 0; t < DT_COUNT; t++)
        if (strlen(dtype_name((DType)t)) == n && !strncmp(dtype_name((DType)t), s, n))
            return (DType)t;
    bad(r, "unknown dtype '%.*s'", (int)n, s);
}

/* [d0,d1,...]: at most MAX_RANK dims, a shape a tensor may have */
static Shape rd_shape(Rd *r)
{
    Shape s = {0};
    expect(r, "[");
    while (!accept(r, "]")) {
        if (s.rank && !accept(r, ","))
            bad(r, "expected ',' or ']' in a shape");
        if (s.rank == MAX_RANK)
            bad(r, "a shape of more than %d dims", MAX_RANK);
        s.dim[s.rank++] = rd_int(r, "a dimension", 0, MAX_NUMEL);
    }
    if (shape_count(&s) < 0)
        bad(r, "shape %s: beyond 2^40 elements", shape_str(&s));
    return s;
}

/* ---- the header ----------------------------------------------------------- */

/* "graph: N values, M nodes, U units": each count at most the lines left (every object is a line) */
static void rd_counts(Rd *r, int *nunit)
{
    Graph *g = r->g;
    need_line(r, "graph:");
    int most = r->nline;
    g->nval = g->capval = (int)rd_int(r, "the value count", 0, most);
    expect(r, "values,");
    g->nnode = g->capnode = (int)rd_int(r, "the node count", 0, most);
    expect(r, "nodes,");
    *nunit = (int)rd_int(r, "the unit count", 0, most);
    expect(r, "units");
    end_line(r);
    g->val = ir_alloc(sizeof(Value) * (size_t)(g->nval + 1));
    g->node = ir_alloc(sizeof(Node) * (size_t)(g->nnode + 1));
}

static void rd_state(Rd *r)
{
    static const char *const rule[] = {"default", "signature", "flag"}; /* ParamRule order */
    Graph *g = r->g;
    need_line(r, "state:");
    expect(r, "loss"), g->loss = rd_id(r, "the loss", 1);
    expect(r, "loss_avg"), g->loss_avg = rd_id(r, "loss_avg", 1);
    expect(r, "grad_norm_sq"), g->grad_norm_sq = rd_id(r, "grad_norm_sq", 1);
    expect(r, "nfwd"), g->nfwd = (int)rd_int(r, "nfwd", 0, g->nnode);
    expect(r, "signature"), g->signature = (int)rd_int(r, "signature", 0, 1);
    expect(r, "params"), g->param_rule = (ParamRule)rd_enum(r, "params rule", rule, 3);
    expect(r, "ncoll"), g->ncoll = (int)rd_int(r, "ncoll", 0, g->nnode);
    expect(r, "arena"), g->arena_bytes = rd_int(r, "arena", 0, INT64_MAX);
    expect(r, "consts"), g->const_bytes = rd_int(r, "consts", 0, INT64_MAX);
    expect(r, "peak_act"), g->peak_act_bytes = rd_int(r, "peak_act", 0, INT64_MAX);
    end_line(r);
}

/* "WHAT: %a %b ...": value ids (at most one per value) */
static int *rd_ids(Rd *r, const char *what, int *n)
{
    need_line(r, what);
    int *ids = ir_alloc(sizeof(int) * (size_t)(r->g->nval + 1));
    for (*n = 0; (skip_blank(r), *r->p);) {
        if (*n == r->g->nval)
            bad(r, "more ids than values");
        ids[(*n)++] = rd_id(r, what, 0);
    }
    end_line(r);
    return ids;
}

static void rd_sig_lost(Rd *r)
{
    Graph *g = r->g;
    if (!line_is(r, "sig_lost:"))
        return;
    int cap = 1;
    for (const char *s = r->p; *s; s++)
        cap += *s == '"';
    g->sig_lost = ir_alloc(sizeof(char *) * (size_t)cap);
    while ((skip_blank(r), *r->p))
        g->sig_lost[g->nsig_lost++] = rd_str(r, "a lost parameter's name");
    end_line(r);
}

/* unit K "NAME": P params, E elements DT params %a@off ... flat %f flatgrad %g shard %s gradshard %t state %x %y */
static void rd_unit(Rd *r, int k)
{
    Graph *g = r->g;
    Unit *u = &g->unit[k];
    need_line(r, "unit");
    rd_int(r, "the unit number", k, k);
    u->name = rd_str(r, "the unit's name");
    expect(r, ":");
    u->nparams = (int)rd_int(r, "the parameter count", 0, g->nval);
    expect(r, "params,");
    u->numel = rd_int(r, "the element count", 0, INT64_MAX);
    expect(r, "elements");
    u->dtype = rd_dtype(r);
    expect(r, "params");
    u->params = ir_alloc(sizeof(int) * (size_t)(u->nparams + 1));
    u->offset = ir_alloc(sizeof(int64_t) * (size_t)(u->nparams + 1));
    for (int i = 0; i < u->nparams; i++) {
        u->params[i] = rd_id(r, "a unit's parameter", 0);
        expect(r, "@");
        u->offset[i] = rd_int(r, "a parameter's offset", 0, u->numel);
    }
    expect(r, "flat"), u->flat = rd_id(r, "flat", 1);
    expect(r, "flatgrad"), u->flatgrad = rd_id(r, "flatgrad", 1);
    expect(r, "shard"), u->shard = rd_id(r, "shard", 1);
    expect(r, "gradshard"), u->gradshard = rd_id(r, "gradshard", 1);
    expect(r, "state"), u->state[0] = rd_id(r, "state", 1), u->state[1] = rd_id(r, "state", 1);
    end_line(r);
}

static void rd_slots(Rd *r)
{
    Graph *g = r->g;
    int n = 0;
    for (int k = r->at; k < r->nline && !strncmp(r->line[k], "slot ", 5); k++)
        n++;
    g->slot_esize = ir_alloc(sizeof(int) * (size_t)(n + 1));
    g->slot_alias = ir_alloc(sizeof(int) * (size_t)(n + 1));
    g->slot_unit = ir_alloc(sizeof(int) * (size_t)(n + 1));
    for (int s = 0; s < n; s++) {
        need_line(r, "slot");
        rd_int(r, "the slot number", s, s);
        expect(r, "esize"), g->slot_esize[s] = (int)rd_int(r, "esize", 1, 16);
        expect(r, "alias"), g->slot_alias[s] = (int)rd_int(r, "alias", 0, SLOT_PARAM | SLOT_GRAD | SLOT_OTHER);
        expect(r, "unit"), g->slot_unit[s] = (int)rd_int(r, "the slot's unit", 0, g->nunit - 1);
        end_line(r);
    }
    g->nslot = n;
}

/* ---- nodes ----------------------------------------------------------------- */

static Op rd_op(Rd *r)
{
    const char *w = rd_word(r, "an op");
    for (int o = 0; o < OP_COUNT; o++)
        if (!strcmp(op_info[o].name, w))
            return (Op)o;
    bad(r, "unknown op '%s'", w);
}

/* is the text at s a number a FLOAT reads (a '.', an exponent, inf or nan)? */
static int floaty(const char *s)
{
    size_t n = strcspn(s, ",] ");
    for (size_t i = 0; i < n; i++)
        if (strchr(".eEnN", s[i]))
            return 1;
    return 0;
}

/* [...] of ints, floats or strings */
static void rd_list(Rd *r, Attr *a)
{
    int cap = 1; /* (commas to the line's end: a string may hold a ']') */
    for (const char *s = r->p; *s; s++)
        cap += *s == ',';
    a->kind = *r->p == '"' ? A_STRINGS : A_INTS;
    for (const char *s = r->p; a->kind == A_INTS && *s && *s != ']'; s += strcspn(s, ",]"), s += *s == ',')
        if (floaty(s))
            a->kind = A_FLOATS;
    a->ints = ir_alloc(sizeof(int64_t) * (size_t)cap);
    a->floats = ir_alloc(sizeof(double) * (size_t)cap);
    a->strs = ir_alloc(sizeof(char *) * (size_t)cap);
    while (!accept(r, "]")) {
        if (a->n && !accept(r, ","))
            bad(r, "attribute %s: expected ',' or ']'", a->name);
        if (a->n == cap)
            bad(r, "attribute %s: a malformed list", a->name);
        if (a->kind == A_STRINGS)
            a->strs[a->n++] = rd_str(r, "a string");
        else if (a->kind == A_FLOATS)
            a->floats[a->n++] = rd_double(r, "a float");
        else
            a->ints[a->n++] = rd_int(r, "an int", INT64_MIN, INT64_MAX);
    }
}

/* NAME=VALUE: an int, a float (with '.', e, inf or nan), "string", %tensor, [list] or floats[] */
static void rd_attr(Rd *r, Attr *a, const char *name)
{
    a->name = (char *)name;
    a->t = -1;
    if (*r->p == '"') {
        a->kind = A_STRING, a->s = rd_str(r, "a string attribute");
    } else if (*r->p == '%') {
        a->kind = A_TENSOR, a->t = rd_id(r, "a tensor attribute", 0);
    } else if (accept(r, "floats[")) {
        a->kind = A_FLOATS;
        expect(r, "]");
    } else if (accept(r, "[")) {
        rd_list(r, a);
    } else if (floaty(r->p)) {
        a->kind = A_FLOAT, a->f = rd_double(r, name);
    } else {
        a->kind = A_INT, a->i = rd_int(r, name, INT64_MIN, INT64_MAX);
    }
}

/* "%a, %b" before " = ", or the inputs after the op ("_": none); into ids[], at most cap */
static int rd_operands(Rd *r, int *ids, int cap, int omit)
{
    int n = 0;
    do {
        skip_blank(r);
        if (n == cap)
            bad(r, "too many operands");
        if (omit && accept(r, "_"))
            ids[n++] = -1;
        else
            ids[n++] = rd_id(r, "an operand", 0);
    } while (accept(r, ","));
    return n;
}

/* [%o, ... =] OP [in, ...] [attr=v ...] [unit N]  # "name"   (the rest of the current line) */
static void rd_node(Rd *r, Node *n)
{
    Graph *g = r->g;
    int cap = 2;
    for (const char *s = r->p; *s; s++)
        cap += *s == '%' || *s == '_' || *s == '=';
    int *ids = ir_alloc(sizeof(int) * (size_t)cap);
    n->unit = -1;
    skip_blank(r);
    if (*r->p == '%') {
        n->nout = rd_operands(r, ids, cap, 0);
        expect(r, "=");
        n->out = ir_alloc(sizeof(int) * (size_t)(n->nout + 1));
        memcpy(n->out, ids, sizeof(int) * (size_t)n->nout);
    } else {
        n->out = ir_alloc(sizeof(int));
    }
    n->op = rd_op(r);
    skip_blank(r);
    n->in = ir_alloc(sizeof(int) * (size_t)cap);
    if (*r->p == '%' || (*r->p == '_' && !isalnum((unsigned char)r->p[1])))
        n->nin = rd_operands(r, n->in, cap, 1);
    n->attr = ir_alloc(sizeof(Attr) * (size_t)cap);
    while ((skip_blank(r), *r->p && *r->p != '#')) {
        const char *w = rd_word(r, "an attribute");
        if (!strcmp(w, "unit") && *r->p == ' ') {
            n->unit = (int)rd_int(r, "the node's unit", 0, g->nunit - 1);
            continue;
        }
        if (*r->p != '=')
            bad(r, "expected NAME=VALUE after '%s'", w);
        r->p++;
        if (n->nattr == cap)
            bad(r, "too many attributes");
        for (int i = 0; i < n->nattr; i++)
            if (!strcmp(n->attr[i].name, w))
                bad(r, "attribute %s given twice", w);
        rd_attr(r, &n->attr[n->nattr++], w);
    }
    expect(r, "#");
    n->name = rd_str(r, "the node's name");
    if (!*n->name)
        bad(r, "a node without a name");
    const OpInfo *oi = &op_info[n->op];
    if (n->nin < oi->inmin || (oi->inmax >= 0 && n->nin > oi->inmax))
        bad(r, "%s takes %d to %d inputs, not %d", oi->name, oi->inmin, oi->inmax, n->nin);
    if (n->nout < oi->outmin || (oi->outmax >= 0 && n->nout > oi->outmax))
        bad(r, "%s has %d to %d outputs, not %d", oi->name, oi->outmin, oi->outmax, n->nout);
}

static void rd_fusions(Rd *r)
{
    Graph *g = r->g;
    g->fusion = ir_alloc(sizeof(Fusion) * (size_t)(r->nline + 1));
    while (line_is(r, "fusion")) {
        Fusion *f = &g->fusion[g->nfusion];
        rd_int(r, "the fusion number", g->nfusion, g->nfusion);
        expect(r, ":");
        f->n = (int)rd_int(r, "the member count", 1, r->nline - r->at - 1);
        expect(r, "members");
        end_line(r);
        f->member = ir_alloc(sizeof(Node) * (size_t)f->n);
        for (int i = 0; i < f->n; i++) {
            need_line(r, "member");
            rd_node(r, &f->member[i]);
            end_line(r);
        }
        g->nfusion++;
    }
}

/* ---- values ---------------------------------------------------------------- */

/* element i of v's data from the text */
static void rd_elem(Rd *r, Value *v, DType dt, int64_t i)
{
    void *d = v->data;
    if (dt == DT_F32)
        ((float *)d)[i] = (float)rd_double(r, "a float32");
    else if (dt == DT_F64)
        ((double *)d)[i] = rd_double(r, "a float64");
    else if (dtype_kind(dt) == 'f') { /* a 16-bit float: its bits */
        skip_blank(r);
        char *e;
        unsigned long b = strncmp(r->p, "0x", 2) ? ULONG_MAX : strtoul(r->p + 2, &e, 16);
        if (b > 0xffff || e != r->p + 6)
            bad(r, "a 16-bit float is its bits as 0xHHHH, not '%.20s'", r->p);
        ((uint16_t *)d)[i] = (uint16_t)b, r->p = e;
    } else if (dtype_kind(dt)) {
        int64_t lo, hi;
        dtype_int_range(dt, &lo, &hi);
        dtype_set_int(d, i, dt, rd_int(r, ir_fmt("a%s %s", dtype_kind(dt) == 'i' ? "n" : "", dtype_name(dt)), lo, hi));
    } else
        bad(r, "data of dtype %s", dtype_name(dt));
}

/* data=[...] (as many elements as the shape), data=elided:HEX or data=external */
static void rd_data(Rd *r, int id)
{
    Value *v = &r->g->val[id];
    DType dt = ir_data_dtype(r->g, id);
    if (accept(r, "elided:") || accept(r, "external")) {
        const char *s = r->p[-1] == ':' ? r->p : NULL;
        if (s) {
            size_t n = strspn(s, "0123456789abcdef");
            if (n != 16)
                bad(r, "data=elided: expects a 16-digit hex digest");
            r->p += n;
        }
        v->digest = s ? ir_fmt("elided:%.16s", s) : "external";
        return;
    }
    int64_t n = shape_numel(&v->shape);
    if (dt == DT_UNDEF || n > (int64_t)strlen(r->p)) /* each element takes a byte at least */
        bad(r, "value '%s': data of %lld elements does not fit the line", ir_q(v->name), (long long)n);
    v->data = ir_alloc((size_t)n * dtype_size(dt) + 1);
    expect(r, "[");
    for (int64_t i = 0; i < n; i++) {
        if (i && !accept(r, ","))
            bad(r, "value '%s': %lld data elements, its shape %s holds %lld", ir_q(v->name), (long long)i,
                shape_str(&v->shape), (long long)n);
        rd_elem(r, v, dt, i);
    }
    if (!accept(r, "]"))
        bad(r, "value '%s': more data than its shape %s holds", ir_q(v->name), shape_str(&v->shape));
}

/* @arena+OFF | @slotS+OFF [(F=1: @shard(unit U, S)+OFF)] | @shard(unit U, S)+OFF */
static void rd_loc(Rd *r, Value *v)
{
    Loc *l = &v->loc;
    if (accept(r, "arena+")) {
        l->kind = LOC_ARENA;
    } else if (accept(r, "slot")) {
        l->kind = LOC_SLOT;
        l->slot = (int)rd_int(r, "the slot", 0, r->g->nslot - 1);
        expect(r, "+");
    } else {
        l->kind = LOC_SHARD;
        expect(r, "shard(unit");
        l->unit = (int)rd_int(r, "the shard's unit", 0, r->g->nunit - 1);
        expect(r, ",");
        l->state = (int)rd_int(r, "the shard's state", 0, 3);
        expect(r, ")+");
    }
    l->off = rd_int(r, "the offset", 0, INT64_MAX);
    if (l->kind == LOC_SLOT && accept(r, "(F=1: @shard(unit")) {
        l->unit = (int)rd_int(r, "the aliased unit", 0, r->g->nunit - 1);
        expect(r, ",");
        l->state = (int)rd_int(r, "the aliased state", 0, 1);
        l->alias = l->state ? SLOT_GRAD : SLOT_PARAM;
        expect(r, ")+");
        rd_int(r, "the offset", l->off, l->off);
        expect(r, ")");
    }
}

/* %i DT[dims] ROLE "name" [unit U] [view %A+OFF] [grad %G] [@loc] [init I] [sig S] [pad_row R] [state S]
 * [persistent] [data=...] */
static void rd_value(Rd *r, int i)
{
    static const char *const sig[] = {"none", "parameter", "other"}; /* SigKind order */
    const char *roles[R_COUNT];
    for (int k = 0; k < R_COUNT; k++)
        roles[k] = role_name((Role)k);
    Graph *g = r->g;
    Value *v = &g->val[i];
    v->unit = v->producer = v->init_index = v->grad = v->alias_of = -1;
    v->pad_row = -1;
    if (r->at >= r->nline)
        bad(r, "%d values expected, %d found", g->nval, i);
    r->p = r->line[r->at];
    expect(r, "%");
    rd_int(r, "the value id", i, i);
    v->dtype = rd_dtype(r);
    v->shape = rd_shape(r);
    v->role = (Role)rd_enum(r, "role", roles, R_COUNT);
    v->name = rd_str(r, "the value's name");
    while ((skip_blank(r), *r->p)) {
        if (accept(r, "@")) {
            rd_loc(r, v);
            continue;
        }
        const char *w = rd_word(r, "a value field");
        if (!strcmp(w, "unit"))
            v->unit = (int)rd_int(r, "the unit", 0, g->nunit - 1);
        else if (!strcmp(w, "view"))
            v->alias_of = rd_id(r, "view", 0), expect(r, "+"), v->alias_off = rd_int(r, "view offset", 0, INT64_MAX);
        else if (!strcmp(w, "ld"))
            v->alias_ld = rd_int(r, "a view's row stride", 1, INT64_MAX);
        else if (!strcmp(w, "grad"))
            v->grad = rd_id(r, "grad", 0);
        else if (!strcmp(w, "init"))
            v->init_index = (int)rd_int(r, "init", 0, INT_MAX);
        else if (!strcmp(w, "sig"))
            v->sig = (SigKind)rd_enum(r, "sig", sig, 3);
        else if (!strcmp(w, "pad_row"))
            v->pad_row = rd_int(r, "pad_row", 0, MAX_NUMEL);
        else if (!strcmp(w, "state"))
            v->state = (int)rd_int(r, "state", 2, 3);
        else if (!strcmp(w, "persistent"))
            v->persistent = 1;
        else if (!strcmp(w, "data") && accept(r, "="))
            rd_data(r, i);
        else
            bad(r, "unknown value field '%s'", w);
    }
    end_line(r);
}

/* ---- the checks the passes assume ------------------------------------------- */

static int needs_producer(Role role)
{
    return role == R_ACT || role == R_GRAD || role == R_FLAT || role == R_FLATGRAD;
}

/* views one deep, data only on constants and parameters; one producer per value, each value read after its
 * buffer is written (a view's output writes its root's) unless its role needs no producer (as ir/verify.c) */
static void check_graph(Rd *r, int value_line, const int *node_line)
{
    Graph *g = r->g;
    for (int i = 0; i < g->nval; i++) {
        const Value *v = &g->val[i];
        r->at = value_line + i;
        if (v->alias_of >= 0 && g->val[v->alias_of].alias_of >= 0)
            bad(r, "value %%%d is a view of a view", i);
        if (v->data && v->role != R_CONST && v->role != R_PARAM)
            bad(r, "value %%%d: only constants and parameters carry data", i);
    }
    char *made = ir_alloc((size_t)g->nval + 1), *written = ir_alloc((size_t)g->nval + 1);
    for (int i = 0; i < g->nnode; i++) {
        const Node *n = &g->node[i];
        r->at = node_line[i];
        for (int k = 0; k < n->nin; k++) {
            int root = n->in[k] >= 0 ? ir_root(g, n->in[k]) : -1;
            if (root >= 0 && !written[root] && needs_producer(g->val[root].role))
                bad(r, "reads %%%d before a node produces it", n->in[k]);
        }
        for (int k = 0; k < n->nout; k++) {
            if (made[n->out[k]]++)
                bad(r, "%%%d is produced twice", n->out[k]);
            written[ir_root(g, n->out[k])] = 1;
        }
    }
}

/* ---- entry points ----------------------------------------------------------- */

/* the lines of the file at path */
static void rd_open(Rd *r, const char *path)
{
    size_t len;
    char *b = read_file(path, &len);
    r->path = path;
    split_lines(r, b, len);
}

/* the tokens of path's "flags:" line (quoted ones unescaped) in argv[0..*argc) */
void ir_parse_flags(const char *path, int *argc, char ***argv)
{
    Rd r = {0};
    rd_open(&r, path);
    while (r.at < r.nline && !line_is(&r, "flags:"))
        r.at++;
    if (r.at == r.nline)
        r.at = 0, bad(&r, "no 'flags:' line (the options the passes read, as fsdpc writes them)");
    int cap = (int)strlen(r.p) + 1;
    *argv = ir_alloc(sizeof(char *) * (size_t)(cap + 1));
    *argc = 0;
    while ((skip_blank(&r), *r.p)) {
        if (*r.p == '"') {
            (*argv)[(*argc)++] = rd_str(&r, "a flag's value");
            continue;
        }
        size_t n = strcspn(r.p, " \t");
        (*argv)[(*argc)++] = ir_fmt("%.*s", (int)n, r.p);
        r.p += n;
    }
}

Graph *ir_parse(const Options *opt)
{
    Rd r = {0};
    rd_open(&r, opt->model);
    Graph *g = r.g = ir_new(opt);
    int nunit;
    rd_counts(&r, &nunit);
    need_line(&r, "flags:"), r.at++; /* (ir_parse_flags read them) */
    g->nunit = nunit; /* (the ids below are checked against it) */
    rd_state(&r);
    g->input = rd_ids(&r, "inputs:", &g->ninput);
    g->output = rd_ids(&r, "outputs:", &g->noutput);
    rd_sig_lost(&r);
    g->unit = ir_alloc(sizeof(Unit) * (size_t)(nunit + 1));
    for (int k = 0; k < nunit; k++)
        rd_unit(&r, k);
    rd_slots(&r);
    rd_fusions(&r);
    need_line(&r, "values:"), end_line(&r);
    int value_line = r.at;
    for (int i = 0; i < g->nval; i++)
        rd_value(&r, i);
    need_line(&r, "nodes:"), end_line(&r);
    int *node_line = ir_alloc(sizeof(int) * (size_t)(g->nnode + 1));
    for (int i = 0; i < g->nnode; i++) {
        node_line[i] = r.at;
        if (r.at >= r.nline)
            bad(&r, "%d nodes expected, %d found", g->nnode, i);
        r.p = r.line[r.at];
        rd_node(&r, &g->node[i]);
        end_line(&r);
    }
    if (r.at < r.nline)
        bad(&r, "more lines than 'graph:' counts");
    check_graph(&r, value_line, node_line);
    ir_link(g);
    return g;
}
