/* inline.c — the frontend's model-local functions (frontend/onnx.c calls fe_load_functions, then fe_flatten on
 * each graph node).
 *
 * ModelProto.functions are inlined before anything is loaded: a node whose
 * (domain, op_type, overload) names a function is replaced by the function's
 * body, each body node a copy whose inputs and outputs are renamed — formal
 * inputs and outputs to the caller's values, internal values to fresh names
 * (reserved like every name of the file, so they clash with none) — and whose
 * attributes that refer to the caller's (ref_attr_name) take the caller's
 * value, or the function's default (attribute_proto), or are left out.  A
 * body node calling a function is inlined in turn: at most MAX_INLINE deep,
 * never recursively.  What comes out is a flat list of nodes, each with the
 * default-domain opset it was written at (its function's opset_import).
 *
 * The system's onnx.proto may predate FunctionProto.attribute_proto (field 11,
 * onnx 1.13) and the overload fields (NodeProto 8, FunctionProto 13, onnx
 * 1.16): those are read from the fields protobuf-c kept unparsed. */
#include "fe.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_INLINE = 32, MAX_FLAT = 1 << 20 };  /* bounds the memory a hostile model can take */

typedef struct Func {
    const Onnx__FunctionProto *f;
    const char *domain, *overload, *label;
    Onnx__AttributeProto **dflt; /* attribute_proto: defaults */
    size_t ndflt;
    int64_t opset;               /* of the default domain; -1: the caller's */
    int active;                  /* being inlined (recursion check) */
} Func;


/* The payload of unknown field u of m if it is length-delimited with this
 * tag (protobuf-c keeps the length prefix in u->data), checked; else NULL. */
static const uint8_t *unknown_bytes(Fe *fe, const ProtobufCMessageUnknownField *u, uint32_t tag, size_t *len,
                                    const char *what)
{
    if (u->tag != tag || u->wire_type != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED)
        return NULL;
    const uint8_t *p = u->data, *end = u->data + u->len;
    uint64_t n;
    if (fe_varint(&p, end, &n) || n != (uint64_t)(end - p))
        fe_bad(fe, "%s has a malformed field %u", what, (unsigned)tag);
    *len = (size_t)n;
    return p;
}

/* The last length-delimited unknown field `tag` of m as a string, or "". */
static const char *unknown_string(Fe *fe, const ProtobufCMessage *m, uint32_t tag, const char *what)
{
    const char *s = "";
    for (unsigned i = 0; i < m->n_unknown_fields; i++) {
        size_t len;
        const uint8_t *p = unknown_bytes(fe, &m->unknown_fields[i], tag, &len, what);
        if (!p)
            continue;
        if (len && memchr(p, 0, len))
            fe_bad(fe, "%s has a NUL byte in a name", what);
        char *c = ir_alloc(len + 1);
        if (len)
            memcpy(c, p, len);
        s = c;
    }
    return s;
}

static const char *str(const char *s) { return s ? s : ""; }

static void load_function(Fe *fe, Func *fn, const Onnx__FunctionProto *f, size_t i)
{
    fn->f = f;
    fn->domain = fe_default_domain(f->domain) ? "" : f->domain;
    const char *w = ir_fmt("model-local function #%zu", i);
    if (!f->name || !*f->name)
        fe_bad(fe, "%s has no name", w);
    fn->overload = unknown_string(fe, &f->base, 13, w);
    fn->label = ir_fmt("function '%s'%s%s%s%s%s", ir_q(f->name), *fn->domain ? " [domain " : "",
                       ir_q(fn->domain), *fn->domain ? "]" : "", *fn->overload ? " overload " : "",
                       *fn->overload ? ir_q(fn->overload) : "");
    fn->opset = -1;
    for (size_t k = 0; k < f->n_opset_import; k++)
        if (fe_default_domain(f->opset_import[k]->domain)) {
            int64_t v = f->opset_import[k]->version;
            if (v < OPSET_MIN || v > OPSET_MAX)
                fe_bad(fe, "%s imports ONNX opset %lld; fsdpc supports opsets %d to %d (export it again at one of those)",
                    fn->label, (long long)v, OPSET_MIN, OPSET_MAX);
            fn->opset = v;
        }
    for (unsigned k = 0; k < f->base.n_unknown_fields; k++) {
        size_t len;
        const uint8_t *p = unknown_bytes(fe, &f->base.unknown_fields[k], 11, &len, fn->label);
        if (!p)
            continue;
        /* ModelProto > FunctionProto > AttributeProto: depth 2 */
        Onnx__AttributeProto *a = fe_check_depth(&onnx__attribute_proto__descriptor, p, p + len, 2)
                                      ? NULL : onnx__attribute_proto__unpack(&fe_arena, len, p);
        if (!a || !a->name || !*a->name)
            fe_bad(fe, "%s has a malformed default attribute (attribute_proto)", fn->label);
        Onnx__AttributeProto **d = ir_alloc(sizeof *d * (fn->ndflt + 1));
        if (fn->ndflt)
            memcpy(d, fn->dflt, sizeof *d * fn->ndflt);
        d[fn->ndflt++] = a;
        fn->dflt = d;
    }
}

void fe_load_functions(Fe *fe, const Onnx__ModelProto *m)
{
    fe->nfuncs = m->n_functions;
    fe->funcs = ir_alloc(sizeof *fe->funcs * (fe->nfuncs + 1));
    for (size_t i = 0; i < fe->nfuncs; i++) {
        const Func *f = &fe->funcs[i];
        load_function(fe, &fe->funcs[i], m->functions[i], i);
        for (const Func *o = fe->funcs; o < f; o++)
            if (!strcmp(o->f->name, f->f->name) && !strcmp(o->domain, f->domain) && !strcmp(o->overload, f->overload))
                fe_bad(fe, "%s is defined twice among the model's functions", f->label);
    }
}

/* The function node n calls, or NULL. */
static Func *func_of(Fe *fe, const Onnx__NodeProto *n)
{
    if (!fe->nfuncs || !n->op_type)
        return NULL;
    const char *dom = fe_default_domain(n->domain) ? "" : n->domain, *ov = NULL;
    for (size_t i = 0; i < fe->nfuncs; i++)
        if (!strcmp(fe->funcs[i].f->name, n->op_type) && !strcmp(fe->funcs[i].domain, dom)) {
            if (!ov)
                ov = unknown_string(fe, &n->base, 8, ir_fmt("node '%s'", ir_q(str(n->name))));
            if (!strcmp(fe->funcs[i].overload, ov))
                return &fe->funcs[i];
        }
    return NULL;
}

static void flat_add(Fe *fe, const Onnx__NodeProto *n, const char *what, int64_t ops, size_t idx)
{
    if (fe->nflat == MAX_FLAT)
        fe_bad(fe, "inlining the model's functions gives more than %d nodes; fsdpc does not compile such a model",
            MAX_FLAT);
    if (fe->nflat == fe->flatcap) {
        size_t cap = fe->flatcap ? 2 * fe->flatcap : 256;
        Flat *f = ir_alloc(sizeof *f * cap);
        if (fe->nflat)
            memcpy(f, fe->flat, sizeof *f * fe->nflat);
        fe->flat = f;
        fe->flatcap = cap;
    }
    fe->flat[fe->nflat++] = (Flat){n, what, ops, idx};
}

/* A function call's renaming: formal name -> the caller's or a fresh name. */
typedef struct { const char *key, *val; int defined; } Pair;

static Pair *pair(Pair *t, size_t cap, const char *key)
{
    size_t i = fe_hash(key) & (cap - 1);
    while (t[i].key && strcmp(t[i].key, key))
        i = (i + 1) & (cap - 1);
    return &t[i];
}

/* A name no value of the file or of earlier inlining has, reserved. */
static const char *fresh_internal(Fe *fe, const char *prefix, const char *name)
{
    return fe_fresh_reserved(fe, ir_fmt("%s/%s", prefix, name));
}

static const Onnx__AttributeProto *attr_named(Onnx__AttributeProto *const *a, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (a[i]->name && !strcmp(a[i]->name, name))
            return a[i];
    return NULL;
}

/* Body node b's attributes, references to the call's resolved. */
static void bind_attrs(Fe *fe, Onnx__NodeProto *c, const Onnx__NodeProto *call, const Func *fn, const char *bw)
{
    const Onnx__NodeProto *b = c;
    Onnx__AttributeProto **out = ir_alloc(sizeof *out * (b->n_attribute + 1));
    size_t n = 0;
    for (size_t i = 0; i < b->n_attribute; i++) {
        Onnx__AttributeProto *a = b->attribute[i];
        const char *ref = a->ref_attr_name;
        if (!ref || !*ref) {
            out[n++] = a;
            continue;
        }
        const Onnx__AttributeProto *v = attr_named(call->attribute, call->n_attribute, ref);
        if (!v)
            v = attr_named(fn->dflt, fn->ndflt, ref);
        if (!v) {
            int declared = 0;
            for (size_t k = 0; k < fn->f->n_attribute; k++)
                declared |= fn->f->attribute[k] && !strcmp(fn->f->attribute[k], ref);
            if (!declared)
                fe_bad(fe, "%s refers to attribute '%s', which %s does not declare", bw, ir_q(ref), fn->label);
            continue; /* not given, no default: the attribute is absent */
        }
        if (a->type && v->type != a->type)
            fe_bad(fe, "%s: attribute '%s' of the call has type %d, but %s uses it as type %d", bw, ir_q(ref),
                (int)v->type, fn->label, (int)a->type);
        Onnx__AttributeProto *r = ir_alloc(sizeof *r);
        *r = *v;
        r->name = a->name;
        r->ref_attr_name = NULL;
        out[n++] = r;
    }
    c->attribute = out;
    c->n_attribute = n;
}

static void inline_call(Fe *fe, const Onnx__NodeProto *call, const char *what, Func *fn, int64_t ops, int depth,
                        size_t idx)
{
    const Onnx__FunctionProto *f = fn->f;
    if (fn->active)
        fe_bad(fe, "%s calls %s, which is being inlined already: a recursive function; fsdpc inlines functions "
            "and cannot inline recursion", what, fn->label);
    if (depth >= MAX_INLINE)
        fe_bad(fe, "%s: functions call functions more than %d deep; fsdpc does not inline deeper", what, MAX_INLINE);
    if (call->n_input > f->n_input || call->n_output > f->n_output)
        fe_bad(fe, "%s has %zu inputs and %zu outputs; %s takes %zu and %zu", what, call->n_input,
            call->n_output, fn->label, f->n_input, f->n_output);
    size_t cnt = f->n_input + f->n_output + 1;
    for (size_t i = 0; i < f->n_node; i++) {
        if (f->node[i]->n_output > MAX_FLAT)
            fe_bad(fe, "%s has a node with too many outputs", fn->label);
        cnt += f->node[i]->n_output;
        if (cnt > MAX_FLAT)
            fe_bad(fe, "%s is too large", fn->label);
    }
    size_t cap = 16;
    while (cap < 2 * cnt)
        cap *= 2;
    Pair *t = ir_alloc(sizeof *t * cap);
    const char *prefix = call->name && *call->name ? call->name : what;
    for (size_t i = 0; i < f->n_input + f->n_output; i++) {
        int isin = i < f->n_input;
        size_t k = isin ? i : i - f->n_input;
        const char *formal = isin ? f->input[k] : f->output[k];
        if (!formal || !*formal)
            fe_bad(fe, "%s has an empty %s name", fn->label, isin ? "input" : "output");
        Pair *p = pair(t, cap, formal);
        if (p->key)
            fe_bad(fe, "%s names '%s' twice among its inputs and outputs (fsdpc does not inline a function "
                "that returns an input)", fn->label, ir_q(formal));
        p->key = formal;
        if (isin) {
            p->val = k < call->n_input ? call->input[k] : "";
            p->defined = 1;
        } else {
            p->val = k < call->n_output && *call->output[k] ? call->output[k] : NULL;
        }
    }
    fn->active = 1;
    for (size_t j = 0; j < f->n_node; j++) {
        const Onnx__NodeProto *b = f->node[j];
        Onnx__NodeProto *c = ir_alloc(sizeof *c);
        *c = *b;
        const char *bn = b->name && *b->name ? b->name : ir_fmt("%s_%zu", str(b->op_type), j);
        c->name = (char *)ir_fmt("%s/%s", prefix, bn);
        const char *bw = fe_node_label(0, c);
        c->input = ir_alloc(sizeof(char *) * (b->n_input + 1));
        for (size_t i = 0; i < b->n_input; i++) {
            const char *x = str(b->input[i]);
            Pair *p = *x ? pair(t, cap, x) : NULL;
            if (p && (!p->key || !p->defined))
                fe_bad(fe, "%s (in %s) uses '%s', which neither the function's inputs nor an earlier node of "
                    "its body define", bw, fn->label, ir_q(x));
            c->input[i] = (char *)(p ? p->val : "");
        }
        c->output = ir_alloc(sizeof(char *) * (b->n_output + 1));
        for (size_t i = 0; i < b->n_output; i++) {
            const char *y = str(b->output[i]);
            if (!*y) {
                c->output[i] = "";
                continue;
            }
            Pair *p = pair(t, cap, y);
            if (p->key && p->defined)
                fe_bad(fe, "%s (in %s) defines '%s', which is already defined", bw, fn->label, ir_q(y));
            p->key = y;
            if (!p->val)
                p->val = fresh_internal(fe, prefix, y);
            p->defined = 1;
            c->output[i] = (char *)p->val;
        }
        bind_attrs(fe, c, call, fn, bw);
        fe_flatten(fe, c, bw, fn->opset >= 0 ? fn->opset : ops, depth + 1, idx);
    }
    fn->active = 0;
    for (size_t k = 0; k < f->n_output; k++)
        if (!pair(t, cap, f->output[k])->defined)
            fe_bad(fe, "%s: output '%s' of %s is not defined by any node of its body", what, ir_q(f->output[k]),
                fn->label);
}

void fe_flatten(Fe *fe, const Onnx__NodeProto *n, const char *what, int64_t ops, int depth, size_t idx)
{
    Func *fn = func_of(fe, n);
    if (fn)
        inline_call(fe, n, what, fn, ops, depth, idx);
    else
        flat_add(fe, n, what, ops, idx);
}
