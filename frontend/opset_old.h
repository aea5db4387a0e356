/* opset_old.h — frontend/opset_old.c: nodes of opsets 7 to 12 rewritten into their opset 13 form. */
#ifndef FSDPC_OPSET_OLD_H
#define FSDPC_OPSET_OLD_H

#include "ir.h"

typedef struct {
    Graph *g;
    const char *path;                       /* the model: the first word of every message */
    const char *what;                       /* the node's label ("node 'sm' (Softmax)") */
    int64_t opset;                          /* the node's default-domain opset, 7 to 12 */
    void *fe;                               /* the frontend's reading of the model, for fresh */
    const char *(*fresh)(void *fe, const char *base); /* base or base_N: a name no value of the file or the IR
                                                        * has, reserved */
} OldNode;

/* Rewrites node id (just loaded, its attributes added) from its opset's version to opset 13's form, adding the
 * nodes and constants that takes; refuses in one line a form it does not read. */
void onnx_old_node(const OldNode *c, int id);

/* Rewrites Upsample node id (opsets 7 to 9, read as OP_Resize) into the opset 13 Resize it equals. */
void onnx_upsample(const OldNode *c, int id);

#endif
