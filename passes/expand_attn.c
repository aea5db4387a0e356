/* expand_attn.c — fold's expansions of opset 23's attention ops: Attention (opsets 23-25: heads, grouped
 * key/value heads repeated, the causal and padding masks, softcap, the scores' Softmax in float32 where the
 * inputs are 16-bit) and RotaryEmbedding, written with ops fsdpc computes (and differentiates), as expand.c's
 * others, through its builders (fold.h). */
#include "fold.h"
#include "rules/nn.h"
#include "rules/tensor.h"

#include <math.h>
#include <string.h>

/* ---- Attention (opsets 23-25) ------------------------------------------------ */

/* x [B, S, H * Dh] as [B, H, S, Dh] */
static int attn_heads(Sweep *s, int id, int x, int64_t h)
{
    Shape xs = s->g->val[x].shape;
    int64_t d[4] = {xs.dim[0], xs.dim[1], h, xs.dim[2] / h};
    static const int64_t perm[4] = {0, 2, 1, 3};
    return expand_perm(s, id, expand_reshape(s, id, x, d, 4), perm, 4, "heads");
}

/* x [B, Hkv, S, D] with each head repeated reps times in place: [B, Hkv * reps, S, D] */
static int attn_repeat(Sweep *s, int id, int x, int64_t reps)
{
    Shape xs = s->g->val[x].shape;
    int64_t d5[5] = {xs.dim[0], xs.dim[1], 1, xs.dim[2], xs.dim[3]};
    int64_t e5[5] = {xs.dim[0], xs.dim[1], reps, xs.dim[2], xs.dim[3]};
    int64_t d4[4] = {xs.dim[0], xs.dim[1] * reps, xs.dim[2], xs.dim[3]};
    int c = expand_node(s, id, OP_Expand, expand_reshape(s, id, x, d5, 5), -1, "repeat", -1);
    ir_attr_ints_add(s->g, c, "shape", e5, 5);
    fold_visit(s, c);
    return expand_reshape(s, id, s->g->node[c].out[0], d4, 4);
}

/* 0 where bool ok holds, -inf elsewhere, of dtype t; its output */
static int attn_allow(Sweep *s, int id, DType t, int ok)
{
    return expand3(s, id, OP_Where, ok, expand_scalar(s, id, t, 0, "zero"), expand_scalar(s, id, t, -INFINITY, "ninf"),
                   "allowed", -1);
}

/* nonpad_kv_seqlen's bias (opset 24: an external cache of len[b] valid keys
 * per batch), built at run time from the int64 lengths: 0 where key j is
 * allowed, -inf elsewhere, [B, 1, sq, skv].  Key j is a key (j < len[b]) and,
 * with the query block at the end of the valid keys (offset len[b] - sq,
 * d = i + offset - j), causal keeps d >= 0 and the windows d <= left,
 * -d <= right.  Its output. */
static int attn_nonpad(Sweep *s, int id, int len, DType t, int64_t b, int64_t sq, int64_t skv, int causal,
                       int64_t lw, int64_t rw)
{
    Graph *g = s->g;
    Node *n = &g->node[id];
    Shape ls = g->val[len].shape;
    if (ls.rank != 1 || ls.dim[0] != b || (g->val[len].dtype != DT_I64 && g->val[len].dtype != DT_I32))
        node_fatal(g, n, "nonpad_kv_seqlen must be int64 or int32 of shape [%lld] (the batch), not %s %s",
                   (long long)b, dtype_name(g->val[len].dtype), shape_str(&ls));
    if (sq * skv > ((int64_t)1 << 24))
        node_fatal(g, n, "a %lld x %lld nonpad_kv_seqlen mask is beyond 2^24 elements per batch", (long long)sq,
                   (long long)skv);
    if (g->val[len].dtype != DT_I64)
        len = fold_cast(s, id, len, DT_I64, "nonpad_i64", -1);
    int lb = expand_reshape(s, id, len, (int64_t[4]){b, 1, 1, 1}, 4);
    int64_t *j = ir_alloc(sizeof(int64_t) * (size_t)skv);
    for (int64_t k = 0; k < skv; k++)
        j[k] = k;
    Shape js = {.rank = 1, .dim = {skv}};
    int keys = ir_const(g, ir_fmt("%s/key_index.%d", g->node[id].name, s->nnew++), DT_I64, &js, j);
    int bias = attn_allow(s, id, t, fold_expand(s, id, OP_Less, keys, lb, "is_key", -1));
    if (causal || lw >= 0 || rw >= 0) {
        int64_t *ij = ir_alloc(sizeof(int64_t) * (size_t)(sq * skv)); /* i - sq - j: d without len[b] */
        for (int64_t i = 0; i < sq; i++)
            for (int64_t k = 0; k < skv; k++)
                ij[i * skv + k] = i - sq - k;
        Shape ds = {.rank = 2, .dim = {sq, skv}};
        int d = fold_expand(s, id, OP_Add, ir_const(g, ir_fmt("%s/diag.%d", g->node[id].name, s->nnew++), DT_I64, &ds, ij),
                       lb, "offset_diag", -1);
        struct { int on; Op op; double at; } cond[3] = {
            {causal, OP_GreaterOrEqual, 0}, {lw >= 0, OP_LessOrEqual, (double)lw}, {rw >= 0, OP_GreaterOrEqual, -(double)rw}};
        for (int c = 0; c < 3; c++)
            if (cond[c].on) {
                int at = expand_scalar(s, id, DT_I64, cond[c].at, "frontier");
                int ok = attn_allow(s, id, t, fold_expand(s, id, cond[c].op, d, at, "frontier_ok", -1));
                bias = fold_expand(s, id, OP_Add, bias, ok, "nonpad_bias", -1);
            }
    }
    return bias;
}

/* Attention as the ops of its definition: 3-D Q, K, V split into heads;
 * past_key / past_value concatenated before K, V (present_key /
 * present_value); grouped heads of K, V repeated; scores Q * scale x K^T,
 * softcap; the bias: attn_mask (bool: 0 / -inf; float; a shorter last axis
 * padded with -inf) plus is_causal's j <= i + past and opset 25's windows,
 * computed at compile time; Softmax over the keys, a row whose bias is all
 * -inf giving zeros (its scores replaced before the Softmax, so no NaN
 * reaches the gradient); times V, merged back to 3-D.  qk_matmul_output
 * takes the scores of its mode.  nonpad_kv_seqlen (not with a past) masks
 * each batch's keys beyond its length and moves causal and window frontiers
 * to its end (attn_nonpad). */
void expand_attention(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    int in[7];
    for (int i = 0; i < 7; i++)
        in[i] = i < n.nin ? n.in[i] : -1;
    DType t = g->val[in[0]].dtype;
    int r = g->val[in[0]].shape.rank;
    for (int i = 0; i < 3; i++)
        if (g->val[in[i]].dtype != t || !dtype_is_float(t) || g->val[in[i]].shape.rank != r || (r != 3 && r != 4))
            node_fatal(g, &n, "Q, K and V must be float32 or float64 of one dtype and all of rank 3 or 4 (%c is %s, "
                       "rank %d)", "QKV"[i], dtype_name(g->val[in[i]].dtype), g->val[in[i]].shape.rank);
    if (in[6] >= 0 && in[4] >= 0)
        node_fatal(g, &n, "%s", "nonpad_kv_seqlen cannot be combined with past_key and past_value (ONNX forbids it)");
    if ((in[4] >= 0) != (in[5] >= 0))
        node_fatal(g, &n, "%s", "past_key and past_value go together");
    int64_t mode = ir_attr_i(&n, "qk_matmul_output_mode", 0), sp = ir_attr_i(&n, "softmax_precision", 0);
    if (mode < 0 || mode > 3)
        node_fatal(g, &n, "qk_matmul_output_mode %lld is not one of 0-3", (long long)mode);
    if (sp && sp != tensor_to_onnx(DT_F32) && sp != tensor_to_onnx(DT_F64))
        node_fatal(g, &n, "softmax_precision %lld is not supported (1: float, 11: double)", (long long)sp);
    int Q = in[0], K = in[1], V = in[2];
    if (r == 3) {
        int64_t hq = ir_attr_i(&n, "q_num_heads", 0), hkv = ir_attr_i(&n, "kv_num_heads", 0);
        if (hq < 1 || hkv < 1 || g->val[Q].shape.dim[2] % hq || g->val[K].shape.dim[2] % hkv ||
            g->val[V].shape.dim[2] % hkv)
            node_fatal(g, &n, "3-D Q, K and V need q_num_heads and kv_num_heads that divide their last dims "
                       "(%lld, %lld, %lld)", (long long)g->val[Q].shape.dim[2], (long long)g->val[K].shape.dim[2],
                       (long long)g->val[V].shape.dim[2]);
        Q = attn_heads(s, id, Q, hq);
        K = attn_heads(s, id, K, hkv);
        V = attn_heads(s, id, V, hkv);
    }
    int64_t past = 0;
    if (in[4] >= 0) {
        past = g->val[in[4]].shape.rank == 4 ? g->val[in[4]].shape.dim[2] : 0;
        for (int j = 0; j < 2; j++) {
            int c = expand_node(s, id, OP_Concat, in[4 + j], j ? V : K, j ? "present_value" : "present_key", -1);
            ir_attr_add(g, c, "axis", A_INT)->i = 2;
            fold_visit(s, c);
            *(j ? &V : &K) = g->node[c].out[0];
        }
    }
    Shape qs = g->val[Q].shape, ks = g->val[K].shape, vs = g->val[V].shape;
    if (ks.dim[0] != qs.dim[0] || vs.dim[0] != qs.dim[0] || ks.dim[3] != qs.dim[3] || vs.dim[1] != ks.dim[1] ||
        vs.dim[2] != ks.dim[2] || ks.dim[1] < 1 || qs.dim[1] % ks.dim[1])
        node_fatal(g, &n, "Q %s, K %s and V %s (as batch, heads, sequence, head size) do not fit", shape_str(&qs),
                   shape_str(&ks), shape_str(&vs));
    for (int j = 1; j < 3; j++) /* present_key, present_value */
        if (n.nout > j && n.out[j] >= 0 && ir_is_read(g, n.out[j]))
            fold_expand(s, id, OP_Identity, j == 1 ? K : V, -1, j == 1 ? "present_key_out" : "present_value_out", n.out[j]);
    int64_t sq = qs.dim[2], skv = ks.dim[2];
    if (qs.dim[1] != ks.dim[1]) {
        K = attn_repeat(s, id, K, qs.dim[1] / ks.dim[1]);
        V = attn_repeat(s, id, V, qs.dim[1] / ks.dim[1]);
    }
    double scale = ir_attr_f(&n, "scale", 1 / sqrt((double)qs.dim[3]));
    if (scale != 1)
        Q = fold_expand(s, id, OP_Mul, Q, expand_scalar(s, id, t, scale, "scale"), "scaled_q", -1);
    int mm = expand_node(s, id, OP_MatMul, Q, K, "scores", -1);
    ir_attr_add(g, mm, "transB", A_INT)->i = 1;
    fold_visit(s, mm);
    int sc = g->node[mm].out[0], raw = sc;
    double cap = ir_attr_f(&n, "softcap", 0);
    if (cap > 0)
        sc = fold_expand(s, id, OP_Mul, fold_expand(s, id, OP_Tanh, fold_expand(s, id, OP_Mul, sc, expand_scalar(s, id, t, 1 / cap, "cap"),
                    "capped_in", -1), -1, "tanh", -1), expand_scalar(s, id, t, cap, "cap"), "capped", -1);
    int capped = sc;
    /* the bias known at compile time: causal and windows; with
     * nonpad_kv_seqlen, a run-time one (attn_nonpad) */
    int causal = ir_attr_i(&n, "is_causal", 0) != 0, full = 0, bias = -1;
    int64_t lw = ir_attr_i(&n, "left_window_size", -1), rw = ir_attr_i(&n, "right_window_size", -1);
    if (in[6] >= 0) {
        bias = attn_nonpad(s, id, in[6], t, qs.dim[0], sq, skv, causal, lw, rw);
        full = 1; /* a short sequence masks whole rows */
    } else if (causal || lw >= 0 || rw >= 0) {
        if (sq * skv > ((int64_t)1 << 24)) /* the bias is a constant of the executable */
            node_fatal(g, &n, "a %lld x %lld causal or window mask is beyond 2^24 elements (fsdpc builds it as a "
                       "constant): give the mask as attn_mask instead", (long long)sq, (long long)skv);
        void *m = ir_alloc(dtype_size(t) * (size_t)(sq * skv));
        for (int64_t i = 0; i < sq; i++) {
            int any = 0;
            for (int64_t j = 0; j < skv; j++) {
                int64_t dij = i + past - j;
                int ok = (!causal || dij >= 0) && (lw < 0 || dij <= lw) && (rw < 0 || -dij <= rw);
                any |= ok;
                dtype_set_f(m, i * skv + j, t, ok ? 0.0 : -INFINITY);
            }
            full |= !any;
        }
        Shape bs = {.rank = 2, .dim = {sq, skv}};
        bias = ir_const(g, ir_fmt("%s/causal.%d", n.name, s->nnew++), t, &bs, m);
    }
    if (in[3] >= 0) {
        int mv = in[3];
        Shape ms = g->val[mv].shape;
        DType mt = g->val[mv].dtype;
        if (mt == DT_BOOL)
            mv = expand3(s, id, OP_Where, mv, expand_scalar(s, id, t, 0, "zero"), expand_scalar(s, id, t, -INFINITY, "ninf"),
                         "mask_bias", -1);
        else if (mt != t)
            node_fatal(g, &n, "attn_mask is %s; it must be bool or Q's dtype %s", dtype_name(mt), dtype_name(t));
        if (ms.rank < 1 || ms.dim[ms.rank - 1] > skv)
            node_fatal(g, &n, "attn_mask %s: its last dim must be at most the %lld keys", shape_str(&ms), (long long)skv);
        if (ms.dim[ms.rank - 1] < skv) { /* the missing keys are masked */
            int c = expand_node(s, id, OP_Pad, mv, -1, "mask_pad", -1);
            int64_t pads[2 * MAX_RANK] = {0};
            pads[2 * ms.rank - 1] = skv - ms.dim[ms.rank - 1];
            ir_attr_ints_add(g, c, "pads", pads, 2 * ms.rank);
            ir_attr_add(g, c, "value", A_TENSOR)->t = expand_scalar(s, id, t, -INFINITY, "ninf");
            fold_visit(s, c);
            mv = g->node[c].out[0];
        }
        bias = bias < 0 ? mv : fold_expand(s, id, OP_Add, mv, bias, "bias", -1);
        full = 1; /* a run-time mask may mask whole rows */
    }
    if (bias >= 0)
        sc = fold_expand(s, id, OP_Add, sc, bias, "biased", -1);
    int biased = sc, whole = -1;
    if (full) {
        int brank = g->val[bias].shape.rank;
        int bm = expand_reduce(s, id, OP_ReduceMax, bias, brank - 1, 1, "bias_max", -1);
        whole = fold_expand(s, id, OP_Equal, bm, expand_scalar(s, id, t, -INFINITY, "ninf"), "masked_row", -1);
        sc = expand3(s, id, OP_Where, whole, expand_scalar(s, id, t, 0, "zero"), sc, "safe_scores", -1);
    }
    DType st = sp == tensor_to_onnx(DT_F64) ? DT_F64 : sp == tensor_to_onnx(DT_F32) ? DT_F32 : t;
    if (st != t) {
        int c = expand_node(s, id, OP_Cast, sc, -1, "softmax_cast", -1);
        ir_attr_add(g, c, "to", A_INT)->i = tensor_to_onnx(st);
        fold_visit(s, c);
        sc = g->node[c].out[0];
    }
    int sm = expand_node(s, id, OP_Softmax, sc, -1, "softmax", -1);
    ir_attr_add(g, sm, "axis", A_INT)->i = -1;
    fold_visit(s, sm);
    int p = g->node[sm].out[0];
    if (st != t) {
        int c = expand_node(s, id, OP_Cast, p, -1, "softmax_back", -1);
        ir_attr_add(g, c, "to", A_INT)->i = tensor_to_onnx(t);
        fold_visit(s, c);
        p = g->node[c].out[0];
    }
    if (full)
        p = expand3(s, id, OP_Where, whole, expand_scalar(s, id, t, 0, "zero"), p, "probs", -1);
    if (n.nout > 3 && n.out[3] >= 0 && ir_is_read(g, n.out[3]))
        fold_expand(s, id, OP_Identity, mode == 0 ? raw : mode == 1 ? capped : mode == 2 ? biased : p, -1, "qk_out", n.out[3]);
    int y = fold_expand(s, id, OP_MatMul, p, V, "output", r == 4 ? n.out[0] : -1);
    if (r == 3) {
        static const int64_t perm[4] = {0, 2, 1, 3};
        int64_t d[3] = {qs.dim[0], sq, qs.dim[1] * vs.dim[3]};
        y = expand_perm(s, id, y, perm, 4, "merge");
        Shape cs = {.rank = 1, .dim = {3}};
        fold_expand(s, id, OP_Reshape, y, ir_const(g, ir_fmt("%s/shape.%d", n.name, s->nnew++), DT_I64, &cs, d), "merged",
               n.out[0]);
    }
}

/* ---- RotaryEmbedding (opset 23) ---------------------------------------------- */

/* x[..., lo:hi:step] on the last axis, visited; its output */
static int expand_slice_last(Sweep *s, int id, int x, int64_t lo, int64_t hi, int64_t step, const char *suffix)
{
    Graph *g = s->g;
    int c = expand_node(s, id, OP_Slice, x, -1, suffix, -1);
    ir_attr_ints_add(g, c, "starts", &lo, 1);
    ir_attr_ints_add(g, c, "ends", &hi, 1);
    ir_attr_ints_add(g, c, "axes", &(int64_t){-1}, 1);
    ir_attr_ints_add(g, c, "steps", &step, 1);
    fold_visit(s, c);
    return g->node[c].out[0];
}

/* Concat of in[0..n) on axis, named NODE/suffix, writing out (new if -1); its output */
static int expand_concat(Sweep *s, int id, const int *in, int n, int64_t axis, const char *suffix, int out)
{
    Graph *g = s->g;
    int c = expand_node_n(s, id, OP_Concat, in, n, suffix, out);
    ir_attr_add(g, c, "axis", A_INT)->i = axis;
    fold_visit(s, c);
    return g->node[c].out[0];
}

/* RotaryEmbedding as its definition: X ([B, H, S, D], or [B, S, H * D] as
 * [B, S, H, D]), its first rotary_embedding_dim R of D rotated by the angles
 * of cos_cache / sin_cache ([B, S, R/2], or rows of them picked by
 * position_ids: a Gather), the pairs being the halves or (interleaved)
 * neighbours: real = cos x1 - sin x2, imag = sin x1 + cos x2. */
void expand_rope(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    DType t = g->val[n.in[0]].dtype;
    Shape xs = g->val[n.in[0]].shape;
    int r = xs.rank, pos = n.nin > 3 ? n.in[3] : -1;
    for (int i = 0; i < 3; i++)
        if (g->val[n.in[i]].dtype != t || !dtype_is_float(t))
            node_fatal(g, &n, "X, cos_cache and sin_cache must be float32 or float64 of one dtype (input %d is %s)", i,
                       dtype_name(g->val[n.in[i]].dtype));
    if (r != 3 && r != 4)
        node_fatal(g, &n, "X has rank %d; it must be 3 or 4", r);
    int x = n.in[0];
    if (r == 3) {
        int64_t h = ir_attr_i(&n, "num_heads", 0);
        if (h < 1 || xs.dim[2] % h)
            node_fatal(g, &n, "3-D X needs num_heads dividing its last dim %lld", (long long)xs.dim[2]);
        int64_t d[4] = {xs.dim[0], xs.dim[1], h, xs.dim[2] / h};
        x = expand_reshape(s, id, x, d, 4);
    }
    Shape s4 = g->val[x].shape; /* [B, H, S, D] or [B, S, H, D] */
    int64_t hd = s4.dim[3], rd = ir_attr_i(&n, "rotary_embedding_dim", 0);
    rd = rd ? rd : hd;
    if (rd < 2 || rd > hd || rd % 2)
        node_fatal(g, &n, "rotary_embedding_dim %lld must be even and at most the head size %lld", (long long)rd,
                   (long long)hd);
    int cs[2] = {n.in[1], n.in[2]};
    for (int j = 0; j < 2; j++) {
        if (pos >= 0) {
            int c = expand_node(s, id, OP_Gather, cs[j], pos, j ? "sin_rows" : "cos_rows", -1);
            ir_attr_add(g, c, "axis", A_INT)->i = 0;
            fold_visit(s, c);
            cs[j] = g->node[c].out[0];
        }
        Shape c3 = g->val[cs[j]].shape; /* [B, S, R/2] */
        if (c3.rank != 3 || (c3.dim[0] != xs.dim[0] && c3.dim[0] != 1) || c3.dim[1] != s4.dim[r == 4 ? 2 : 1] ||
            c3.dim[2] != rd / 2)
            node_fatal(g, &n, "%s %s must be [batch %lld, sequence %lld, %lld]%s", j ? "sin" : "cos", shape_str(&c3),
                       (long long)xs.dim[0], (long long)s4.dim[r == 4 ? 2 : 1], (long long)(rd / 2),
                       pos >= 0 ? " once position_ids pick its rows" : "");
        int64_t d[4] = {c3.dim[0], 1, c3.dim[1], rd / 2}; /* broadcast over the heads */
        if (r == 3)
            d[1] = c3.dim[1], d[2] = 1;
        cs[j] = expand_reshape(s, id, cs[j], d, 4);
    }
    int il = ir_attr_i(&n, "interleaved", 0) != 0;
    int x1 = expand_slice_last(s, id, x, 0, il ? rd : rd / 2, il ? 2 : 1, "x1");
    int x2 = expand_slice_last(s, id, x, il ? 1 : rd / 2, rd, il ? 2 : 1, "x2");
    int re = fold_expand(s, id, OP_Sub, fold_expand(s, id, OP_Mul, cs[0], x1, "cos_x1", -1),
                    fold_expand(s, id, OP_Mul, cs[1], x2, "sin_x2", -1), "real", -1);
    int im = fold_expand(s, id, OP_Add, fold_expand(s, id, OP_Mul, cs[1], x1, "sin_x1", -1),
                    fold_expand(s, id, OP_Mul, cs[0], x2, "cos_x2", -1), "imag", -1);
    int parts[3], np = 0;
    if (il) { /* [..., R/2, 2] -> [..., R] */
        int ri[2] = {seq_part(s, id, OP_Unsqueeze, re, "real_pair", "axes", 4),
                     seq_part(s, id, OP_Unsqueeze, im, "imag_pair", "axes", 4)};
        int64_t d[4] = {s4.dim[0], s4.dim[1], s4.dim[2], rd};
        parts[np++] = expand_reshape(s, id, expand_concat(s, id, ri, 2, -1, "pairs", -1), d, 4);
    } else {
        parts[np++] = re;
        parts[np++] = im;
    }
    if (rd < hd)
        parts[np++] = expand_slice_last(s, id, x, rd, hd, 1, "pass");
    int y = np > 1 ? expand_concat(s, id, parts, np, -1, "rotated", r == 4 ? n.out[0] : -1) : parts[0];
    if (r == 3) {
        Shape os = {.rank = 1, .dim = {3}};
        fold_expand(s, id, OP_Reshape, y, ir_const(g, ir_fmt("%s/shape.%d", n.name, s->nnew++), DT_I64, &os, xs.dim),
               "merged", n.out[0]);
    } else if (np == 1)
        fold_expand(s, id, OP_Identity, y, -1, "out", n.out[0]);
}
