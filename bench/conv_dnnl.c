/* conv_dnnl.c — times ResNet-18's convolutions three ways, per shape and
 * direction (the measurements behind kernels/c/conv_dnnl.c's rule).
 *
 *   cc -O2 -fopenmp -Ikernels/c bench/conv_dnnl.c build/libfsdpc_kernels_v4.a -lopenblas -ldnnl -lm \
 *      -o /tmp/conv_dnnl
 *   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /tmp/conv_dnnl [BATCH 8] [REPS 4]
 *
 * Sides: im2col (conv.c's im2col + OpenBLAS: FSDPC_CONV=im2col is set here
 * before the first call), plain (oneDNN on nchw / oihw) and blocked (oneDNN
 * on its own layouts, the reorders included), each direction (forward with
 * the bias; data gradient; weight gradient with the bias gradient).  Every
 * repetition runs every side in turn; printed: the best CPU time
 * (CLOCK_PROCESS_CPUTIME_ID) after the first repetition, which creates the
 * primitives, and the implementations oneDNN picked.  DNNL_MAX_CPU_ISA and
 * OPENBLAS_CORETYPE emulate other CPUs (AVX512_CORE / SkylakeX: a Cascade
 * Lake; AVX2 / Haswell).
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels.h"

static double cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float *rnd(int64_t n)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    if (!p)
        exit(2);
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    return p;
}

/* c, h (= w), m, k (= kh = kw), stride, pad, groups: ResNet-18 at 112^2, and one depthwise */
static const int shapes[][7] = {
    {3, 112, 64, 7, 2, 3, 1},  {64, 28, 64, 3, 1, 1, 1},   {64, 28, 128, 3, 2, 1, 1}, {128, 14, 128, 3, 1, 1, 1},
    {64, 28, 128, 1, 2, 0, 1}, {128, 14, 256, 3, 2, 1, 1}, {256, 7, 256, 3, 1, 1, 1}, {128, 14, 256, 1, 2, 0, 1},
    {256, 7, 512, 3, 2, 1, 1}, {512, 4, 512, 3, 1, 1, 1},  {256, 7, 512, 1, 2, 0, 1}, {32, 28, 32, 3, 1, 1, 32},
};

typedef struct {
    KConv2d p;
    float *x, *y, *w, *b, *ws, *dy, *dx, *dw, *db;
} Case;

static void run(Case *c, int side, int dir)
{
    const KConv2d *p = &c->p;
    if (side == 0) {
        if (dir == K_CONV_FWD)
            k_conv2d_f32(p, c->y, c->x, c->w, c->b, c->ws);
        else if (dir == K_CONV_BWD_X)
            k_conv2d_grad_x_f32(p, c->dx, c->dy, c->w, c->ws);
        else {
            k_conv2d_grad_w_f32(p, c->dw, c->dy, c->x, c->ws);
            k_conv2d_grad_b_f32(p, c->db, c->dy);
        }
        return;
    }
    const int l = side == 1 ? K_CONV_DNNL_PLAIN : K_CONV_DNNL_BLOCKED;
    if (dir == K_CONV_FWD)
        k_conv2d_dnnl_f32(p, dir, l, c->y, c->x, c->w, c->b, NULL);
    else if (dir == K_CONV_BWD_X)
        k_conv2d_dnnl_f32(p, dir, l, c->dx, c->dy, c->w, NULL, NULL);
    else
        k_conv2d_dnnl_f32(p, dir, l, c->dw, c->x, c->dy, NULL, c->db);
}

int main(int argc, char **argv)
{
    const int n = argc > 1 ? atoi(argv[1]) : 8, reps = argc > 2 ? atoi(argv[2]) : 4;
    const char *dirs[3] = {"fwd", "dx", "dw"};
    double tot[3][3] = {{0}};
    setenv("FSDPC_CONV", "im2col", 1);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int *v = shapes[s];
        Case c = {.p = {.n = n, .c = v[0], .h = v[1], .w = v[1], .m = v[2], .kh = v[3], .kw = v[3], .sh = v[4],
                        .sw = v[4], .dh = 1, .dw = 1, .pt = v[5], .pl = v[5], .pb = v[5], .pr = v[5], .groups = v[6]}};
        KConv2d *p = &c.p;
        p->oh = p->ow = k_pool_out_dim(v[1], v[3], v[4], v[5], v[5], 1, 0);
        const int64_t nx = n * p->c * p->h * p->w, ny = n * p->m * p->oh * p->ow, nw = p->m * p->c / p->groups * 9;
        c.x = rnd(nx), c.dx = rnd(nx), c.y = rnd(ny), c.dy = rnd(ny), c.w = rnd(nw * 6), c.dw = rnd(nw * 6);
        c.b = rnd(p->m), c.db = rnd(p->m), c.ws = rnd(k_conv2d_workspace(p));
        double best[3][3];
        for (int i = 0; i < 9; i++)
            best[i / 3][i % 3] = 1e30;
        for (int r = 0; r < reps; r++)
            for (int side = 0; side < 3; side++)
                for (int dir = 0; dir < 3; dir++) {
                    double t0 = cpu();
                    run(&c, side, dir);
                    t0 = cpu() - t0;
                    if (r > 0 && t0 < best[side][dir])
                        best[side][dir] = t0;
                }
        printf("c %3d h %3d m %3d %dx%d s%d g%2d |", v[0], v[1], v[2], v[3], v[3], v[4], v[6]);
        for (int dir = 0; dir < 3; dir++) {
            printf(" %s im2col %6.2f plain %6.2f blocked %6.2f |", dirs[dir], best[0][dir] * 1e3,
                   best[1][dir] * 1e3, best[2][dir] * 1e3);
            for (int side = 0; side < 3; side++)
                tot[side][dir] += best[side][dir];
        }
        printf(" %s / %s\n", k_conv2d_dnnl_impl(p, K_CONV_FWD, K_CONV_DNNL_PLAIN, 1, K_DT_F32),
               k_conv2d_dnnl_impl(p, K_CONV_FWD, K_CONV_DNNL_BLOCKED, 1, K_DT_F32));
        free(c.x), free(c.dx), free(c.y), free(c.dy), free(c.w), free(c.dw), free(c.b), free(c.db), free(c.ws);
    }
    for (int dir = 0; dir < 3; dir++)
        printf("total %s: im2col %.1f plain %.1f blocked %.1f ms\n", dirs[dir], tot[0][dir] * 1e3,
               tot[1][dir] * 1e3, tot[2][dir] * 1e3);
    printf("oneDNN's shared buffer: %lld bytes\n", (long long)k_conv2d_dnnl_bytes());
    return 0;
}
