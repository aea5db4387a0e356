/* fe.h — what the frontend's files share (private to frontend/): one load's state (Fe), its flat node list,
 * the helpers of frontend/onnx.c that the others call, and what frontend/inline.c (model-local functions),
 * frontend/tensor.c (tensors into R_CONST values) and frontend/signature.c (PyTorch's records beside the
 * graph) give onnx.c. */
#ifndef FSDPC_FE_H
#define FSDPC_FE_H

#include "ir.h"
#include "onnx.pb-c.h"

#include <stddef.h>
#include <stdint.h>

enum {
    OPSET_MIN = 7, OPSET_MAX = 28,   /* 28: the newest onnx 1.23 defines */
    OPSET_IR = 13,                   /* the versions the IR's nodes follow (older ones: opset_old.c) */
    MAX_DEPTH = 100,                 /* protobuf message nesting we accept */
    MAX_KINDS = 4,                   /* unsupported op types named in the message */
};
#define AT(t) ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__##t
#define MAX_MODEL_BYTES ((size_t)2 << 30)

enum { UNSEEN = -3, RESERVED = -2 };  /* name table ids besides value ids */

typedef struct { const char *key; int id; } Name;

/* One compile's reading of its model: every function of the frontend takes it, so that nothing outlives
 * onnx_load but the Graph (and what the arena holds), and two loads share nothing (fsdpc --report loads the
 * model once per strategy; tests/fuzz_compile.c many models in one process). */
typedef struct {
    Graph *g;
    const char *path;                 /* opt->model, prefix of every message */
    const char *dir, *dir_real;       /* the model's directory, as given and resolved */
    uint8_t *bytes;                   /* the file (in the arena), kept for export */
    Onnx__ModelProto *model;          /* in the arena */
    Name *names;                      /* the name table: ncap slots (a power of two), nused used */
    size_t ncap, nused;
    int64_t opset;                    /* of the default domain: the model's, then each node's as it is loaded */
    struct Func *funcs;               /* the model-local functions */
    size_t nfuncs;
    struct Flat *flat;                /* the graph's nodes, functions inlined: nflat of flatcap */
    size_t nflat, flatcap;
} Fe;

/* one node of the graph with the model-local functions inlined (frontend/inline.c) */
typedef struct Flat {
    const Onnx__NodeProto *n;
    const char *what;            /* its label in messages */
    int64_t opset;
    size_t idx;                  /* the graph's node it comes from */
} Flat;

/* onnx.c: one fatal line "MODEL: message" */
__attribute__((format(printf, 2, 3))) _Noreturn void fe_bad(Fe *fe, const char *fmt, ...);
/* onnx.c's name table: FNV-1a of s; key's entry (RESERVED if new); base or base_1, ... unused; that, reserved */
uint64_t fe_hash(const char *s);
int fe_find(Fe *fe, const char *key); /* key's id: a value's, RESERVED or UNSEEN */
Name *fe_slot(Fe *fe, const char *key);
const char *fe_fresh(Fe *fe, const char *base);
const char *fe_fresh_reserved(Fe *fe, const char *base);
/* onnx.c's wire-format readers: a varint at *p (-1: malformed); messages nesting at most MAX_DEPTH below d
 * (-1: malformed; 1: too deep) */
int fe_varint(const uint8_t **p, const uint8_t *end, uint64_t *v);
/* the field at *p: its tag, a length-delimited one's *len bytes at *data (else NULL); -1: malformed */
int fe_next_field(const uint8_t **p, const uint8_t *end, uint64_t *tag, const uint8_t **data, uint64_t *len);
int fe_check_depth(const ProtobufCMessageDescriptor *d, const uint8_t *p, const uint8_t *end, int depth);
/* onnx.c: protobuf-c's allocator for unpacking: the IR arena */
extern ProtobufCAllocator fe_arena;
/* onnx.c: file opened for reading (ir_open_regular: no FIFO, device or directory), its size into *size */
int fe_open_regular(Fe *fe, const char *file, const char *what, int64_t *size);
/* onnx.c: "" or "ai.onnx"; "node 'NAME' (OP)" or "node #I (OP)" */
int fe_default_domain(const char *d);
const char *fe_node_label(size_t i, const Onnx__NodeProto *n);
/* inline.c: the model's functions read (before any node); n appended to fe->flat, a call to a function
 * replaced by its body (what: its label; ops: the default-domain opset it is written at; idx: its graph node) */
void fe_load_functions(Fe *fe, const Onnx__ModelProto *m);
void fe_flatten(Fe *fe, const Onnx__NodeProto *n, const char *what, int64_t ops, int depth, size_t idx);

/* tensor.c: t → a new R_CONST value named name (init: its initializer index, or -1); n scalars of dt
 * (float32 or int64) → an R_CONST of shape [n] ([] when scalar); "what has dtype X, which fsdpc does not
 * support (...)" */
int fe_const_tensor(Fe *fe, const char *name, const Onnx__TensorProto *t, const char *what, int init);
int fe_const_list(Fe *fe, const char *name, DType dt, const void *src, size_t n, int scalar);
_Noreturn void fe_bad_dtype(Fe *fe, const char *what, int32_t t);
/* signature.c: the exporter's graph signature (Value.sig, g->sig_lost), scripts/export_torch.py's padding_idx
 * (Value.pad_row) and its state records (checked to name initializers); after the initializers are loaded */
void fe_load_signature(Fe *fe, const Onnx__GraphProto *gp);
void fe_load_program_signature(Fe *fe, const Onnx__GraphProto *gp);
void fe_load_padding(Fe *fe);
void fe_check_state_records(Fe *fe);

#endif
