/* signature.c — what PyTorch's exporter and scripts/export_torch.py write beside the graph, read by the frontend
 * (frontend/onnx.c calls the fe_load_* and fe_check_state_records after the initializers).
 *
 * torch.onnx.export(..., dynamo=True) says what each lifted input of the
 * module is: a metadata_props entry SIG_KEY = PARAMETER, BUFFER,
 * CONSTANT_TENSOR, USER_INPUT... on the ValueInfoProto naming it (it writes
 * them on graph inputs and value_info; newer ONNX allows them on the
 * TensorProto too).  metadata_props is newer than the onnx.proto our code is
 * generated from (ValueInfoProto field 4, TensorProto field 16), so
 * protobuf-c leaves it among the message's unknown fields: its wire bytes,
 * read here, every length checked. */
#include "fe.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define SIG_KEY "pkg.torch.export.graph_signature.InputSpec.kind"
#define PROGRAM_SIG_KEY "pkg.torch.export.ExportedProgram.graph_signature"
#define FX_KEY "pkg.torch.onnx.fx_node"
#define PADDING_KEY "fsdpc.padding_idx."
#define NON_PERSISTENT_KEY "fsdpc.non_persistent." /* runtime/export.c reads it */
#define TIED_KEY "fsdpc.tied."                       /* + ALIAS = INIT: so does it */
enum { VI_METADATA = 4, NODE_METADATA = 9, TENSOR_METADATA = 16, GRAPH_METADATA = 16 };

typedef struct { const uint8_t *p; uint64_t n; } Bytes;

static int bytes_is(Bytes b, const char *s)
{
    return b.n == strlen(s) && !memcmp(b.p, s, b.n);
}

/* A StringStringEntryProto's key (field 1) and value (field 2); -1: malformed. */
static int string_entry(const uint8_t *p, const uint8_t *end, Bytes *key, Bytes *val)
{
    *key = *val = (Bytes){0};
    while (p < end) {
        uint64_t tag, len;
        const uint8_t *data;
        if (fe_next_field(&p, end, &tag, &data, &len))
            return -1;
        if (data && tag >> 3 == 1)
            *key = (Bytes){data, len};
        else if (data && tag >> 3 == 2)
            *val = (Bytes){data, len};
    }
    return 0;
}

/* The value of message m's metadata_props entry (its unknown field `field`) whose key is key; the last one
 * when several are, {NULL, 0} when none is.  A malformed entry is refused, naming what. */
static Bytes metadata(Fe *fe, const ProtobufCMessage *m, uint32_t field, const char *key_want, const char *what)
{
    Bytes found = {0};
    for (unsigned i = 0; i < m->n_unknown_fields; i++) {
        const ProtobufCMessageUnknownField *u = &m->unknown_fields[i];
        if (u->tag != field)
            continue;
        /* protobuf-c keeps a length-delimited field's bytes with their length prefix */
        const uint8_t *p = u->data, *end = u->data + u->len;
        uint64_t len;
        Bytes key, val;
        if (u->wire_type != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED || fe_varint(&p, end, &len) ||
            len != (uint64_t)(end - p) || string_entry(p, end, &key, &val))
            fe_bad(fe, "%s has a malformed metadata_props entry (field %u is no well-formed key/value entry: a bad "
                "length, tag or wire type); export the model again", what, (unsigned)field);
        if (bytes_is(key, key_want))
            found = val.p ? val : (Bytes){(const uint8_t *)"", 0};
    }
    return found;
}

/* What message m's metadata_props (its unknown field `field`) say of the value: SIG_NONE when no entry
 * has SIG_KEY. */
static SigKind sig_kind(Fe *fe, const ProtobufCMessage *m, uint32_t field, const char *what)
{
    Bytes val = metadata(fe, m, field, SIG_KEY, what);
    return !val.p ? SIG_NONE : bytes_is(val, "PARAMETER") ? SIG_PARAMETER : SIG_OTHER;
}

/* Records kind k for the initializer called name, if one is (a user input's kind is not kept). */
static void note_sig(Fe *fe, const char *name, SigKind k, const char *what)
{
    if (k == SIG_NONE)
        return;
    fe->g->signature = 1;
    int v = name ? fe_find(fe, name) : UNSEEN;
    if (v < 0 || fe->g->val[v].init_index < 0)
        return;
    if (fe->g->val[v].sig != SIG_NONE && fe->g->val[v].sig != k)
        fe_bad(fe, "%s: the graph signature (%s) calls it a PARAMETER in one place and another kind in another; "
            "export the model again", what, SIG_KEY);
    fe->g->val[v].sig = k;
}

/* The graph signature's kind of every initializer it names (after load_initializers). */
void fe_load_signature(Fe *fe, const Onnx__GraphProto *gp)
{
    for (size_t i = 0; i < gp->n_initializer; i++) {
        const Onnx__TensorProto *t = gp->initializer[i];
        const char *what = ir_fmt("initializer '%s'", ir_q(t->name));
        note_sig(fe, t->name, sig_kind(fe, &t->base, TENSOR_METADATA, what), what);
    }
    size_t n[2] = {gp->n_input, gp->n_value_info};
    Onnx__ValueInfoProto **vi[2] = {gp->input, gp->value_info};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < n[k]; i++) {
            const char *name = vi[k][i]->name;
            const char *what = ir_fmt("%s '%s'", k ? "value_info" : "graph input", name ? ir_q(name) : "");
            note_sig(fe, name, sig_kind(fe, &vi[k][i]->base, VI_METADATA, what), what);
        }
}

/* The exported program's whole signature, a text on the graph (GraphProto metadata_props PROGRAM_SIG_KEY),
 * lists every parameter of the module, one line each: "p_c_bias: PARAMETER target='c.bias'".  One the graph
 * has no initializer of was removed by the exporter's optimizer (a zero bias: onnxscript's
 * RemoveOptionalBiasFromConv) or folded into another constant -- or is tied to one the graph has under its
 * other name (GPT-2's wte is lm_head.weight), or the forward pass never reads it (every export drops it, and
 * PyTorch's training leaves it as it is).  The nodes' fx_node metadata (NODE_METADATA FX_KEY, the same text on
 * every ONNX node one torch operation became: "%conv2d : ... = call_function[...](args = (%x, %p_c_weight,
 * %p_c_bias), ...)") tells which: where the nodes of one operation name k parameters of the signature, a lost
 * one among them, but read fewer than k distinct parameter initializers, the lost ones it names are in
 * G->sig_lost, which autodiff refuses.  A tied weight is read under its other name (k read), an unused one is
 * named by no operation.  Without fx_node metadata (stripped) nothing is concluded.  Signature lines quoted
 * otherwise (names with a quote) are skipped. */
typedef struct {
    const char *ph, *target;  /* the placeholder ("p_c_bias") and the parameter ("c.bias") */
    int lost;                 /* the graph has no initializer named target */
    int listed;               /* in G->sig_lost */
    int stamp;                /* each_named's mark: named already by this text */
} SigParam;

static int ph_cmp(const void *a, const void *b)
{
    return strcmp(((const SigParam *)a)->ph, ((const SigParam *)b)->ph);
}

/* The signature's PARAMETER lines, sorted by placeholder; lost: the graph has no initializer of the target. */
static SigParam *sig_parameters(Fe *fe, Bytes t, int *np)
{
    static const char tag[] = ": PARAMETER target='";
    if (t.n > INT_MAX)  /* no lines to read as "%.*s" (a 2 GB signature is no torch export's) */
        t = (Bytes){0};
    if (!t.p || !t.n) { /* none (t.p may be NULL: no pointer arithmetic on it) */
        *np = 0;
        return ir_alloc(sizeof(SigParam));
    }
    size_t lines = 1;
    for (uint64_t i = 0; i < t.n; i++)
        lines += t.p[i] == '\n';
    SigParam *l = ir_alloc(lines * sizeof *l);
    int n = 0;
    for (const uint8_t *p = t.p, *end = t.p + t.n; p && p < end;) {
        const uint8_t *eol = memchr(p, '\n', (size_t)(end - p));
        eol = eol ? eol : end;
        const uint8_t *at = NULL;
        for (const uint8_t *q = p; !at && q + sizeof tag - 1 < eol; q++)
            if (!memcmp(q, tag, sizeof tag - 1))
                at = q + sizeof tag - 1;
        if (at && eol[-1] == '\'' && eol - 1 > at && !memchr(at, '\\', (size_t)(eol - 1 - at))) {
            const char *name = ir_fmt("%.*s", (int)(eol - 1 - at), (const char *)at);
            int v = fe_find(fe, name);
            l[n++] = (SigParam){ir_fmt("%.*s", (int)(at - (sizeof tag - 1) - p), (const char *)p), name,
                                v < 0 || fe->g->val[v].init_index < 0, 0, -1};
        }
        p = eol + 1;
    }
    qsort(l, (size_t)n, sizeof *l, ph_cmp);
    *np = n;
    return l;
}

/* Calls fn(the signature parameter) for each distinct one text names ("%p_c_bias"); stamp: this text's mark. */
static void each_named(const char *text, SigParam *l, int n, int stamp, void (*fn)(SigParam *, void *), void *ctx)
{
    for (const char *p = strchr(text, '%'); p; p = strchr(p, '%')) {
        const char *q = ++p;
        while (*q == '_' || (*q >= '0' && *q <= '9') || ((*q | 32) >= 'a' && (*q | 32) <= 'z'))
            q++;
        SigParam key = {ir_fmt("%.*s", (int)(q - p), p), NULL, 0, 0, 0};
        SigParam *hit = bsearch(&key, l, (size_t)n, sizeof *l, ph_cmp);
        if (hit && hit->stamp != stamp) {
            hit->stamp = stamp;
            fn(hit, ctx);
        }
        p = q;
    }
}

typedef struct { int named, lost; } Named;

static void count_named(SigParam *s, void *ctx)
{
    ((Named *)ctx)->named++;
    ((Named *)ctx)->lost += s->lost;
}

static void keep_lost(SigParam *s, void *ctx)
{
    Fe *fe = ctx;
    if (s->lost && !s->listed) {
        s->listed = 1;
        fe->g->sig_lost[fe->g->nsig_lost++] = s->target;
    }
}

typedef struct { const char *fx; int node; } FxNode;

static int fx_cmp(const void *a, const void *b)
{
    return strcmp(((const FxNode *)a)->fx, ((const FxNode *)b)->fx);
}

/* The distinct parameter initializers (graph signature PARAMETERs) nodes f[0..k) read; seen: per value. */
static int params_read(Fe *fe, const Onnx__GraphProto *gp, const FxNode *f, int k, int *seen, int stamp)
{
    int r = 0;
    for (int i = 0; i < k; i++) {
        const Onnx__NodeProto *np = gp->node[f[i].node];
        for (size_t j = 0; j < np->n_input; j++) {
            int v = np->input[j] && *np->input[j] ? fe_find(fe, np->input[j]) : -1;
            if (v >= 0 && fe->g->val[v].init_index >= 0 && fe->g->val[v].sig == SIG_PARAMETER && seen[v] != stamp) {
                seen[v] = stamp;
                r++;
            }
        }
    }
    return r;
}

/* G->sig_lost: the signature's parameters an operation reads but the graph lacks (see above). */
void fe_load_program_signature(Fe *fe, const Onnx__GraphProto *gp)
{
    int n, nlost = 0, nfx = 0;
    SigParam *l = sig_parameters(fe, metadata(fe, &gp->base, GRAPH_METADATA, PROGRAM_SIG_KEY, "the graph"), &n);
    for (int i = 0; i < n; i++)
        nlost += l[i].lost;
    if (!nlost)
        return;
    FxNode *f = ir_alloc(gp->n_node * sizeof *f + 1);
    for (size_t i = 0; i < gp->n_node; i++) {
        Bytes t = metadata(fe, &gp->node[i]->base, NODE_METADATA, FX_KEY,
                           ir_fmt("node '%s'", gp->node[i]->name ? ir_q(gp->node[i]->name) : ""));
        if (t.p && t.n <= INT_MAX)
            f[nfx++] = (FxNode){ir_fmt("%.*s", (int)t.n, (const char *)t.p), (int)i};
    }
    qsort(f, (size_t)nfx, sizeof *f, fx_cmp);
    int *seen = ir_alloc((size_t)fe->g->nval * sizeof *seen + 1);
    fe->g->sig_lost = ir_alloc((size_t)nlost * sizeof *fe->g->sig_lost);
    for (int a = 0, b, stamp = 1; a < nfx; a = b, stamp += 2) {
        for (b = a + 1; b < nfx && !strcmp(f[a].fx, f[b].fx); b++) {}
        Named c = {0, 0};
        each_named(f[a].fx, l, n, stamp, count_named, &c);
        if (c.lost && params_read(fe, gp, f + a, b - a, seen, stamp) < c.named)
            each_named(f[a].fx, l, n, stamp + 1, keep_lost, fe);
    }
}

/* scripts/export_torch.py's record of an nn.Embedding's padding_idx: model metadata_props PADDING_KEY + the
 * weight's initializer name = the row, which PyTorch's lookup gives no gradient (Value.pad_row; autodiff's
 * Gather rule keeps that row of the lookup's gradient zero). */
void fe_load_padding(Fe *fe)
{
    for (size_t i = 0; i < fe->model->n_metadata_props; i++) {
        const Onnx__StringStringEntryProto *e = fe->model->metadata_props[i];
        if (!e->key || strncmp(e->key, PADDING_KEY, strlen(PADDING_KEY)))
            continue;
        const char *name = e->key + strlen(PADDING_KEY), *what = ir_fmt("metadata_props '%s'", ir_q(e->key));
        int v = fe_find(fe, name);
        const Value *x = v >= 0 ? &fe->g->val[v] : NULL;
        if (!x || x->init_index < 0 || (x->dtype != DT_F32 && x->dtype != DT_F64) || x->shape.rank != 2)
            fe_bad(fe, "%s: '%s' is no float initializer of rank 2 (an embedding's weight); export the model again "
                "with scripts/export_torch.py", what, ir_q(name));
        char *endp = NULL;
        errno = 0;
        long long row = e->value ? strtoll(e->value, &endp, 10) : -1;
        if (!e->value || !*e->value || *endp || errno || row < 0 || row >= x->shape.dim[0])
            fe_bad(fe, "%s: padding_idx '%s' is no row of '%s' (0..%lld); export the model again with "
                "scripts/export_torch.py", what, e->value ? ir_q(e->value) : "", ir_q(name),
                (long long)x->shape.dim[0] - 1);
        fe->g->val[v].pad_row = row;
    }
}

/* scripts/export_torch.py's records for runtime/export.c's --export-safetensors: model metadata_props
 * NON_PERSISTENT_KEY + an initializer's name (a non-persistent buffer, which no state_dict holds: left out) and
 * TIED_KEY + ALIAS = an initializer's name (a tied parameter's other name: written with its data).  The names
 * must be initializers' (an alias must not be one: the file would hold the name twice). */
void fe_check_state_records(Fe *fe)
{
    size_t kn = strlen(NON_PERSISTENT_KEY), kt = strlen(TIED_KEY);
    for (size_t i = 0; i < fe->model->n_metadata_props; i++) {
        const char *key = fe->model->metadata_props[i]->key, *val = fe->model->metadata_props[i]->value;
        int v;
        if (key && !strncmp(key, NON_PERSISTENT_KEY, kn) &&
            ((v = fe_find(fe, key + kn)) < 0 || fe->g->val[v].init_index < 0))
            fe_bad(fe, "metadata_props '%s': '%s' is no initializer (a non-persistent buffer's); export the model again "
                "with scripts/export_torch.py", ir_q(key), ir_q(key + kn));
        if (key && !strncmp(key, TIED_KEY, kt) &&
            (!val || (v = fe_find(fe, val)) < 0 || fe->g->val[v].init_index < 0 ||
             ((v = fe_find(fe, key + kt)) >= 0 && fe->g->val[v].init_index >= 0)))
            fe_bad(fe, "metadata_props '%s' = '%s': a tied parameter's other name and the initializer holding it (the "
                "name no initializer's); export the model again with scripts/export_torch.py", ir_q(key),
                val ? ir_q(val) : "");
    }
}
