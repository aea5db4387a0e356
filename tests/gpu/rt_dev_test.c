/* rt_dev_test.c — the cuda device layer (runtime/dev_cuda.c, kc_rt.c,
 * comm_nccl.c) on its own, with the control plane and the core stubbed
 * (world 1) and hand-written PTX kernels standing in for kernels/cuda.
 *
 * usage: cuda_rt_dev_test nodriver   no GPU: rt_dev_init fails with its one
 *                                    line (exit 77 if a GPU is present)
 *        cuda_rt_dev_test graph      GPU: GEMMs (every transpose, batch and
 *        cuda_rt_dev_test eager      broadcast case, against a double
 *                                    reference), world-1 collectives, copies,
 *                                    five steps (CUDA Graph replays or eager):
 *                                    fresh step parameters every step, the
 *                                    loss downloaded, teardown
 *        (FSDPC_NCCL_ALWAYS=1 runs the step's collectives through a one-rank
 *        NCCL communicator: its set-up, fork/join, capture, teardown)
 *        cuda_rt_dev_test check      GPU: a device check fired in step 6 (a
 *                                    replay) ends the run through
 *                                    rt_step_fail with its message
 * The PTX image names its kernels after kc_names (built here from
 * kernels.def): entry 0 writes y[i] = i, entry 1 copies the step parameters
 * out, entry 2 fires the check from step 6 on; the rest are empty.
 *
 *        mpirun -np N cuda_rt_dev_test world
 *                                    N ranks (FULL_SHARD over all): the
 *                                    step's all-gather and reduce-scatter
 *                                    through NCCL, eager then replayed, with
 *                                    each rank's own shard values (the NCCL
 *                                    id travels through files in /tmp)
 * Built with -DFSDPC_CUEMU (cuemu_rt_dev_test, linked against the CUDA
 * emulation, runtime/cuemu_*.c, instead of the CUDA runtime, cuBLASLt and
 * NCCL) the same three kernels are host functions in a kernel table
 * "rt_dev_test" and the image is the emulated "cuemu:rt_dev_test" for
 * sm_90; everything else, and the device layer's object code, is the same.
 */
#define _POSIX_C_SOURCE 200809L

#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_check.h"
#include "kernels.h" /* the bfloat16 rounding of the CPU target */
#include "rt_ctl.h"
#include "rt_dev.h"
#include "rt_priv.h"

/* ------------------------------------------------ stubs: core, control plane */

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);           \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
            exit(1);                                                       \
        }                                                                  \
    } while (0)

const char *rt_prog = "cuda_rt_dev_test";

/* kc_names: from launch.c (libfsdpc_kernels_cuda), linked for the collectives' casts */

static const char *g_expect_fail; /* rt_step_fail with this text ends the test well */

/* world mode: this process's rank and the job's size (mpirun's environment), 1 and 0 otherwise */
static int g_rank, g_world = 1;

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

int rt_ctl_local_rank(void) { return env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0); }
void rt_ctl_allreduce_i64(int64_t *x, int n, int op) { (void)x, (void)n, (void)op; }

/* At world > 1 (only the NCCL id travels): through files in /tmp named
 * after the mpirun job; the root writes one, each other rank reads it and
 * answers with an acknowledgement, the root removes them all. */
static void wait_file(const char *path)
{
    for (int i = 0; access(path, F_OK) != 0; i++) {
        CHECK(i < 600000, "rt_ctl_bcast: %s did not appear within a minute", path);
        struct timespec nap = {0, 100 * 1000};
        nanosleep(&nap, NULL);
    }
}

/* path created for writing, never through a link or over a file another
 * process planted there (O_EXCL | O_NOFOLLOW); NULL if it cannot be */
static FILE *create_new(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (fd >= 0 && !f)
        close(fd);
    return f;
}

void rt_ctl_bcast(void *buf, int64_t bytes, int root)
{
    static int seq;
    if (g_world == 1)
        return;
    const char *job = getenv("OMPI_MCA_ess_base_jobid") ? getenv("OMPI_MCA_ess_base_jobid") : getenv("PMIX_NAMESPACE");
    CHECK(job && !strchr(job, '/'), "world mode needs mpirun's OMPI_MCA_ess_base_jobid or PMIX_NAMESPACE");
    char path[512], tmp[600], ack[600];
    snprintf(path, sizeof path, "/tmp/cuda_rt_dev_test-%s-%d", job, seq++);
    if (g_rank == root) {
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = create_new(tmp);
        CHECK(f && fwrite(buf, 1, (size_t)bytes, f) == (size_t)bytes && fclose(f) == 0 && rename(tmp, path) == 0,
              "rt_ctl_bcast: cannot write %s", path);
        for (int r = 0; r < g_world; r++) {
            if (r == root)
                continue;
            snprintf(ack, sizeof ack, "%s.ack%d", path, r);
            wait_file(ack);
            unlink(ack);
        }
        unlink(path);
        return;
    }
    wait_file(path);
    FILE *f = fopen(path, "rb");
    CHECK(f && fread(buf, 1, (size_t)bytes, f) == (size_t)bytes && fclose(f) == 0, "rt_ctl_bcast: cannot read %s",
          path);
    snprintf(ack, sizeof ack, "%s.ack%d", path, g_rank);
    f = create_new(ack);
    CHECK(f && fclose(f) == 0, "rt_ctl_bcast: cannot write %s", ack);
}
_Noreturn void rt_ctl_abort(int code) { exit(code ? code : 1); }
void rt_fatal_claim(void) {}

_Noreturn void rt_fatal(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: error: ", rt_prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(code ? code : 1);
}

_Noreturn void rt_step_fail(RtCtx *c, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g_expect_fail && strstr(msg, g_expect_fail) && c && c->step == 6) {
        printf("OK check: step %lld failed as expected: %s\n", (long long)c->step, msg);
        exit(0);
    }
    fprintf(stderr, "%s: error: step %lld: %s\n", rt_prog, c ? (long long)c->step : 0LL, msg);
    exit(1);
}

int64_t rt_elem_size(int dtype)
{
    switch (dtype) {
    case RT_F32: case RT_I32: return 4;
    case RT_F64: case RT_I64: return 8;
    case RT_BOOL: return 1;
    default: return 0;
    }
}

/* ------------------------------------------------------------------ helpers */

static uint64_t g_rng = 88172645463325252ull;
static float frand(void) /* uniform in [-1, 1) */
{
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* the PTX image: see the header comment */
static char *make_ptx(void)
{
    size_t cap = 4096 + (size_t)KC_COUNT * 160, n = 0;
    char *s = malloc(cap);
    CHECK(s, "out of memory");
    n += (size_t)snprintf(s + n, cap - n, ".version 7.0\n.target sm_80\n.address_size 64\n\n");
    n += (size_t)snprintf(s + n, cap - n,
        ".visible .entry %s(.param .u64 y, .param .u64 n)\n{\n"
        "  .reg .pred %%p<2>;\n  .reg .b32 %%r<5>;\n  .reg .f32 %%f<2>;\n  .reg .b64 %%rd<7>;\n"
        "  ld.param.u64 %%rd1, [y];\n  ld.param.u64 %%rd2, [n];\n"
        "  mov.u32 %%r1, %%ctaid.x;\n  mov.u32 %%r2, %%ntid.x;\n  mov.u32 %%r3, %%tid.x;\n"
        "  mad.lo.s32 %%r4, %%r1, %%r2, %%r3;\n  cvt.u64.u32 %%rd3, %%r4;\n"
        "  setp.ge.u64 %%p1, %%rd3, %%rd2;\n  @%%p1 bra DONE;\n"
        "  cvta.to.global.u64 %%rd4, %%rd1;\n  shl.b64 %%rd5, %%rd3, 2;\n  add.s64 %%rd6, %%rd4, %%rd5;\n"
        "  cvt.rn.f32.u32 %%f1, %%r4;\n  st.global.f32 [%%rd6], %%f1;\nDONE:\n  ret;\n}\n\n", kc_names[0]);
    n += (size_t)snprintf(s + n, cap - n,
        ".visible .entry %s(.param .u64 prm, .param .u64 out)\n{\n"
        "  .reg .b64 %%rd<6>;\n  .reg .f64 %%fd<2>;\n  .reg .f32 %%f<2>;\n"
        "  ld.param.u64 %%rd1, [prm];\n  ld.param.u64 %%rd2, [out];\n"
        "  cvta.to.global.u64 %%rd3, %%rd1;\n  cvta.to.global.u64 %%rd4, %%rd2;\n"
        "  ld.global.u64 %%rd5, [%%rd3+%zu];\n  ld.global.f64 %%fd1, [%%rd3+%zu];\n"
        "  st.global.u64 [%%rd4], %%rd5;\n  st.global.f64 [%%rd4+8], %%fd1;\n"
        "  cvt.rn.f32.s64 %%f1, %%rd5;\n  st.global.f32 [%%rd4+16], %%f1;\n  ret;\n}\n\n", kc_names[1],
        offsetof(KcStepParams, step), offsetof(KcStepParams, lr));
    n += (size_t)snprintf(s + n, cap - n,
        ".visible .entry %s(.param .u64 prm, .param .u64 slot)\n{\n"
        "  .reg .pred %%p<2>;\n  .reg .b64 %%rd<6>;\n"
        "  ld.param.u64 %%rd1, [prm];\n  ld.param.u64 %%rd2, [slot];\n"
        "  cvta.to.global.u64 %%rd3, %%rd1;\n  cvta.to.global.u64 %%rd4, %%rd2;\n"
        "  ld.global.s64 %%rd5, [%%rd3+%zu];\n  setp.lt.s64 %%p1, %%rd5, 6;\n  @%%p1 bra DONE;\n"
        "  mov.u64 %%rd5, 7;\n  st.global.u64 [%%rd4], %%rd5;\nDONE:\n  ret;\n}\n\n", kc_names[2],
        offsetof(KcStepParams, step));
    for (int i = 3; i < KC_COUNT; i++)
        n += (size_t)snprintf(s + n, cap - n, ".visible .entry %s()\n{\n  ret;\n}\n", kc_names[i]);
    CHECK(n < cap, "PTX buffer too small");
    return s;
}

#ifdef FSDPC_CUEMU
#include "cuemu_kernel.h"

/* the three kernels of make_ptx on the host: grid x block threads each */
static void emu_iota(void *const *args, unsigned grid, unsigned block, unsigned smem)
{
    (void)smem;
    float *y = *(float **)args[0];
    uint64_t n = *(uint64_t *)args[1];
    for (uint64_t i = 0; i < n && i < (uint64_t)grid * block; i++)
        y[i] = (float)i;
}

static void emu_params(void *const *args, unsigned grid, unsigned block, unsigned smem)
{
    (void)grid, (void)block, (void)smem;
    const KcStepParams *prm = *(const KcStepParams **)args[0];
    char *out = *(char **)args[1];
    float f = (float)prm->step;
    memcpy(out, &prm->step, 8);
    memcpy(out + 8, &prm->lr, 8);
    memcpy(out + 16, &f, 4);
}

static void emu_check(void *const *args, unsigned grid, unsigned block, unsigned smem)
{
    (void)grid, (void)block, (void)smem;
    const KcStepParams *prm = *(const KcStepParams **)args[0];
    int64_t *slot = *(int64_t **)args[1];
    if (prm->step >= 6)
        *slot = 7;
}

static void emu_empty(void *const *args, unsigned grid, unsigned block, unsigned smem)
{
    (void)args, (void)grid, (void)block, (void)smem;
}

/* the table "rt_dev_test" (kc_names, the first three as above) and its image */
static char *make_emu_image(void)
{
    static CuemuKernel table[KC_COUNT];
    static const size_t two[2] = {8, 8};
    static const unsigned char ptrs[2] = {1, 1}, ptr_int[2] = {1, 0};
    for (int i = 0; i < KC_COUNT; i++)
        table[i] = (CuemuKernel){kc_names[i], i < 3 ? 2 : 0, two, i == 0 ? ptr_int : ptrs,
                                 i == 0 ? emu_iota : i == 1 ? emu_params : i == 2 ? emu_check : emu_empty};
    CHECK(cuemu_kernels_add("rt_dev_test", table, KC_COUNT) == 0, "cannot register the test's kernels");
    char *s = strdup("cuemu:rt_dev_test");
    CHECK(s, "out of memory");
    return s;
}
#endif

/* ------------------------------------------------------------ the fake model */

enum { NUMEL = 1000, SHARD = 1003, ARENA = 8 << 20, OFF_IOTA = 0, N_IOTA = 5000, OFF_OUT = 32768,
       OFF_LOSS = 32768 + 64, OFF_A = 65536, OFF_B = OFF_A + (2 << 20), OFF_C = OFF_B + (2 << 20),
       OFF_G = OFF_C + (2 << 20), G = 16,
       /* the lanes' check (lanes_step): a second full buffer, the reduce-scatter's input and output, the gathered
        * buffer's copy, and slow compute work */
       OFF_FULL2 = OFF_G + 8192, OFF_G2 = OFF_FULL2 + 16384, OFF_SH2 = OFF_G2 + 16384, OFF_OUT2 = OFF_SH2 + 8192,
       OFF_SLOW = OFF_OUT2 + 16384, N_SLOW = 1 << 18, SLOW_ROUNDS = 8 };

static RtModel g_m;
static RtCtx g_c;
static RtUnit g_unit = {"u0", NUMEL, RT_F32, 2, 0};
static int64_t g_numel = NUMEL; /* the unit's elements: NUMEL at world 1, world * SHARD - 5 in world mode */
static const char *g_checks[] = {"label out of range in the test's check kernel"};
static RtImage g_image;

/* y[i] = i for i < n, on cu.cur */
static void iota(void *y, uint64_t n)
{
    void *args[] = {&y, &n};
    kc_launch(0, (unsigned)((n + 255) / 256), 256, 0, args);
}

/* the lanes' jobs: a gather of the parameter shard into the second full buffer; a reduce-scatter of G2 */
static void job_gather(RtCtx *c)
{
    rt_allgather(c, c->dev_arena + OFF_FULL2, c->dev_shard[RT_S_PARAM], c->shard_len[0], RT_F32);
}

static void job_reduce(RtCtx *c)
{
    rt_reduce_scatter_avg(c, c->dev_arena + OFF_SH2, c->dev_arena + OFF_G2, g_numel, c->shard_len[0], RT_F32);
}

/* Both lanes in flight at once (rt_coll_start, as the generated step), each
 * against compute work that only the waits between the streams order.  The
 * compute stream is first kept busy (SLOW_ROUNDS iota launches); then it
 * zeroes the gathered buffer and writes the reduce-scatter's input: a lane
 * that did not wait for that (rt_coll_start's fork) gathers into a buffer
 * zeroed after it, and reduces the zeros the previous step left.  The
 * gathered buffer is copied at once after its wait, and the input zeroed
 * after the reduce-scatter's: a compute stream that did not wait for the
 * lanes (rt_coll_wait's join; the emulation delays the lanes' operations)
 * copies zeros, and zeroes the input under the reduce-scatter.  steps()
 * checks the copy and the reduced shard. */
static void lanes_step(RtCtx *c)
{
    char *a = c->dev_arena;
    int64_t full = (int64_t)c->sf * c->shard_len[0] * 4;
    for (int i = 0; i < SLOW_ROUNDS; i++)
        iota(a + OFF_SLOW, N_SLOW);
    rt_memset(a + OFF_FULL2, 0, full);
    iota(a + OFF_G2, (uint64_t)(full / 4));
    rt_coll_start(c, 0, 0, RT_LANE_GATHER, job_gather);
    rt_coll_start(c, 1, 0, RT_LANE_REDUCE, job_reduce);
    rt_coll_wait(c, 0);
    rt_memcpy(a + OFF_OUT2, a + OFF_FULL2, full);
    rt_coll_wait(c, 1);
    rt_memset(a + OFF_G2, 0, full);
}

/* the step: an iota kernel, a 16x16x16 GEMM, the step parameters out, the
 * check, the loss (= step) by a copy, an all-gather and a reduce-scatter,
 * then the same two as jobs on their lanes (lanes_step) */
static void test_step(RtCtx *c)
{
    char *a = c->dev_arena;
    float *y = (float *)(a + OFF_IOTA);
    uint64_t n = N_IOTA;
    void *args0[] = {&y, &n};
    kc_launch(0, (unsigned)((N_IOTA + 255) / 256), 256, 0, args0);
    kc_gemm_f32((float *)(a + OFF_G + 2 * G * G * 4), (const float *)(a + OFF_G), (const float *)(a + OFF_G + G * G * 4),
                1, 0, 0, G, G, G, 0, 0, 0.0);
    const KcStepParams *prm = kc_step_params();
    char *out = a + OFF_OUT;
    void *args1[] = {&prm, &out};
    kc_launch(1, 1, 1, 0, args1);
    int64_t *slot = kc_next_check();
    void *args2[] = {&prm, &slot};
    kc_launch(2, 1, 1, 0, args2);
    rt_memcpy(a + OFF_LOSS, out + 16, 4);
    rt_allgather(c, c->dev_slot[0], c->dev_shard[RT_S_PARAM], c->shard_len[0], RT_F32);
    rt_reduce_scatter_avg(c, c->dev_shard[RT_S_GRAD], c->dev_slot[0], g_numel, c->shard_len[0], RT_F32);
    lanes_step(c);
}

static char *g_base;
static int64_t g_bytes;
static char *g_slot[1], *g_shard[RT_NSTATE];
static int64_t g_shard_len[1] = {SHARD};

static void setup(const char *ptx)
{
    g_m.id = 1;
    g_m.name = "rt_dev_test";
    g_m.nunit = 1, g_m.unit = &g_unit;
    g_m.arena_bytes = ARENA;
    static const int slot_esize[1] = {4}, slot_unit[1] = {0};
    g_m.nslot = 1, g_m.slot_esize = slot_esize, g_m.slot_unit = slot_unit;
    g_m.loss_off = OFF_LOSS, g_m.loss_dtype = RT_F32;
    g_m.optimizer = RT_ADAMW;
    g_m.step = test_step;
    g_m.ncoll = 2; /* lanes_step's jobs */
    g_m.target_cuda = 1;
#ifdef FSDPC_CUEMU
    g_image = (RtImage){"sm_90", (const unsigned char *)ptx, (int64_t)strlen(ptx) + 1, RT_IMAGE_KERNELS};
#else
    g_image = (RtImage){"compute_80", (const unsigned char *)ptx, (int64_t)strlen(ptx) + 1, RT_IMAGE_KERNELS};
#endif
    g_m.nimage = 1, g_m.image = &g_image;
    g_m.ncheck = 1, g_m.check = g_checks;
    /* the host carving: arena, one slot, param and grad shards (m, v unused) */
    g_numel = g_world == 1 ? NUMEL : (int64_t)g_world * SHARD - 5;
    g_unit.numel = g_numel;
    int64_t full = (int64_t)g_world * SHARD * 4;
    g_bytes = ARENA + full + 2 * SHARD * 4;
    g_base = calloc(1, (size_t)g_bytes);
    CHECK(g_base, "out of memory");
    g_slot[0] = g_base + ARENA;
    g_shard[RT_S_PARAM] = g_base + ARENA + full;
    g_shard[RT_S_GRAD] = g_base + ARENA + full + SHARD * 4;
    g_c.m = &g_m;
    g_c.rank = g_rank, g_c.world = g_world, g_c.sf = g_world, g_c.srank = g_rank;
    g_c.arena = g_base, g_c.slot = g_slot, g_c.shard = g_shard, g_c.shard_len = g_shard_len;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- the tests */

static int nodriver(void)
{
    RtModel m;
    memset(&m, 0, sizeof m);
    m.target_cuda = 1;
    m.step = test_step;
    char err[1024] = "";
    rt_dev_finish(NULL); /* before anything: nothing to release */
    int rc = rt_dev_init(&m, 0, 1, 1 << 20, err, sizeof err);
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) {
        rt_dev_finish(NULL);
        printf("SKIP nodriver: a GPU is present (rt_dev_init: %s)\n", rc ? err : "ok");
        return 77;
    }
    CHECK(rc == -1, "rt_dev_init returned %d without a GPU", rc);
    CHECK(!strchr(err, '\n') && (strstr(err, "no CUDA driver found (libcuda.so.1)") || strstr(err, "no CUDA device")),
          "unexpected reason: %s", err);
    rt_dev_finish(NULL);
    printf("OK nodriver: %s\n", err);
    return 0;
}

/* C_i = op(A_i) op(B_i) + beta C_i in double, row-major, as k_matmul */
static void ref_gemm(double *c, const float *a, const float *b, int64_t batch, int64_t sa, int64_t sb, int64_t m,
                     int64_t n, int64_t k, int ta, int tb, double beta, const float *c0)
{
    for (int64_t q = 0; q < batch; q++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0;
                for (int64_t l = 0; l < k; l++) {
                    double x = ta ? a[q * sa + l * m + i] : a[q * sa + i * k + l];
                    double y = tb ? b[q * sb + j * k + l] : b[q * sb + l * n + j];
                    s += x * y;
                }
                int64_t o = q * m * n + i * n + j;
                c[o] = s + (beta != 0 ? beta * c0[o] : 0);
            }
}

/* the float32 operand x of n elements, rounded to bfloat16: the rounded
 * values back in x, their bits at bits */
static void round_bf16(float *x, uint16_t *bits, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = k_bf16_to_f32(bits[i] = k_bf16_from_f32(x[i]));
}

/* the same in float16 */
static void round_f16(float *x, uint16_t *bits, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = k_f16_to_f32(bits[i] = k_f16_from_f32(x[i]));
}

/* one GEMM case on the device against the reference; returns the error.
 * bf16: A and B go to the device as bfloat16 (kc_gemm_bf16), the reference
 * multiplies the rounded values; f16: the same in float16 (kc_gemm_f16) */
static double gemm_case(int64_t m, int64_t n, int64_t k, int64_t batch, int bca, int bcb, int ta, int tb,
                        double beta, int misalign, int bf16, int f16)
{
    int64_t sa = bca ? 0 : m * k, sb = bcb ? 0 : k * n;
    int64_t na = (bca ? 1 : batch) * m * k, nb = (bcb ? 1 : batch) * k * n, nc = batch * m * n;
    CHECK((na + 1) * 4 <= (2 << 20) && (nb + 1) * 4 <= (2 << 20) && (nc + 1) * 4 <= (2 << 20), "case too big");
    float *ha = (float *)(g_base + OFF_A) + misalign, *hb = (float *)(g_base + OFF_B) + misalign;
    float *hc = (float *)(g_base + OFF_C) + misalign;
    for (int64_t i = 0; i < na; i++)
        ha[i] = frand();
    for (int64_t i = 0; i < nb; i++)
        hb[i] = frand();
    for (int64_t i = 0; i < nc; i++)
        hc[i] = beta != 0 ? frand() : NAN; /* beta 0 never reads C */
    float *c0 = malloc((size_t)nc * sizeof *c0);
    double *want = malloc((size_t)nc * sizeof *want);
    CHECK(c0 && want, "out of memory");
    memcpy(c0, hc, (size_t)nc * sizeof *c0);
    /* bf16: the bits replace the floats in place, from the start of the
     * float array (2-byte misalignment: misalign bf16 elements) */
    uint16_t *a16 = (uint16_t *)(g_base + OFF_A) + misalign, *b16 = (uint16_t *)(g_base + OFF_B) + misalign;
    float *ra = malloc((size_t)na * sizeof *ra), *rb = malloc((size_t)nb * sizeof *rb);
    CHECK(ra && rb, "out of memory");
    memcpy(ra, ha, (size_t)na * sizeof *ra);
    memcpy(rb, hb, (size_t)nb * sizeof *rb);
    if (bf16) {
        round_bf16(ra, a16, na);
        round_bf16(rb, b16, nb);
    } else if (f16) {
        round_f16(ra, a16, na);
        round_f16(rb, b16, nb);
    }
    ref_gemm(want, ra, rb, batch, sa, sb, m, n, k, ta, tb, beta, c0);
    free(ra);
    free(rb);
    int64_t es = bf16 || f16 ? 2 : 4;
    rt_dev_upload(&g_c, es == 2 ? (void *)a16 : (void *)ha, na * es);
    rt_dev_upload(&g_c, es == 2 ? (void *)b16 : (void *)hb, nb * es);
    rt_dev_upload(&g_c, hc, nc * 4);
    char *d = g_c.dev_arena;
    if (f16)
        kc_gemm_f16((float *)(d + OFF_C) + misalign, (const uint16_t *)(d + OFF_A) + misalign,
                    (const uint16_t *)(d + OFF_B) + misalign, batch, sa, sb, m, n, k, ta, tb, beta);
    else if (bf16)
        kc_gemm_bf16((float *)(d + OFF_C) + misalign, (const uint16_t *)(d + OFF_A) + misalign,
                     (const uint16_t *)(d + OFF_B) + misalign, batch, sa, sb, m, n, k, ta, tb, beta);
    else
        kc_gemm_f32((float *)(d + OFF_C) + misalign, (const float *)(d + OFF_A) + misalign,
                    (const float *)(d + OFF_B) + misalign, batch, sa, sb, m, n, k, ta, tb, beta);
    rt_dev_download(&g_c, hc, nc * 4);
    double err = 0, scale = 1e-30;
    for (int64_t i = 0; i < nc; i++) {
        err = fmax(err, fabs((double)hc[i] - want[i]));
        scale = fmax(scale, fabs(want[i]));
    }
    free(c0);
    free(want);
    return err / scale;
}

static void gemms(void)
{
    static const int64_t shapes[][3] = {{5, 7, 3}, {64, 48, 32}, {33, 17, 129}, {1, 256, 64}};
    int ncase = 0;
    double worst = 0, worst_tf32 = 0, worst_bf16 = 0, worst_f16 = 0;
    for (int mode = 0; mode < 4; mode++) { /* FP32, TF32, BF16 operands, FP16 operands */
        int tf32 = mode == 1, bf16 = mode == 2, f16 = mode == 3;
        cu.tf32 = tf32;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int batch = 1; batch <= 3; batch += 2)
                for (int bc = 0; bc < 4; bc++)
                    for (int t = 0; t < 4; t++)
                        for (int bi = 0; bi < 2; bi++) {
                            int bca = bc & 1, bcb = bc >> 1, ta = t & 1, tb = t >> 1;
                            double beta = bi ? 0.5 : 0.0;
                            int mis = (int)((s + (size_t)t) % 2); /* 4-byte aligned pointers too */
                            double e = gemm_case(shapes[s][0], shapes[s][1], shapes[s][2], batch, bca, bcb, ta, tb,
                                                 beta, mis, bf16, f16);
                            double tol = tf32 ? 2e-2 : 1e-5;
                            CHECK(e <= tol, "GEMM m %lld n %lld k %lld batch %d bcast %d/%d ta %d tb %d beta %g "
                                  "misaligned %d %s: relative error %.3g > %g", (long long)shapes[s][0],
                                  (long long)shapes[s][1], (long long)shapes[s][2], batch, bca, bcb, ta, tb, beta,
                                  mis, f16 ? "FP16 operands" : bf16 ? "BF16 operands" : tf32 ? "TF32" : "FP32", e, tol);
                            double *w = f16 ? &worst_f16 : bf16 ? &worst_bf16 : tf32 ? &worst_tf32 : &worst;
                            *w = fmax(*w, e);
                            ncase++;
                        }
    }
    cu.tf32 = 1;
    /* k = 0: C = beta C, beta 0 or 1 */
    float *hc = (float *)(g_base + OFF_C);
    for (int i = 0; i < 12; i++)
        hc[i] = 3.0f;
    rt_dev_upload(&g_c, hc, 48);
    kc_gemm_f32((float *)(g_c.dev_arena + OFF_C), (const float *)(g_c.dev_arena + OFF_A),
                (const float *)(g_c.dev_arena + OFF_B), 2, 0, 0, 2, 3, 0, 0, 0, 1.0);
    rt_dev_download(&g_c, hc, 48);
    CHECK(hc[11] == 3.0f, "k = 0, beta 1 changed C");
    kc_gemm_f32((float *)(g_c.dev_arena + OFF_C), (const float *)(g_c.dev_arena + OFF_A),
                (const float *)(g_c.dev_arena + OFF_B), 2, 0, 0, 2, 3, 0, 0, 0, 0.0);
    rt_dev_download(&g_c, hc, 48);
    CHECK(hc[0] == 0.0f && hc[11] == 0.0f, "k = 0, beta 0 left C");
    printf("OK gemm: %d cases; worst relative error FP32 %.2e, TF32 %.2e, BF16 operands (against the rounded "
           "operands) %.2e, FP16 operands %.2e\n", ncase, worst, worst_tf32, worst_bf16, worst_f16);
}

static void collectives(void)
{
    RtCtx *c = &g_c;
    float *slot = (float *)c->slot[0], *pa = (float *)c->shard[RT_S_PARAM], *gr = (float *)c->shard[RT_S_GRAD];
    for (int i = 0; i < SHARD; i++)
        pa[i] = (float)i, slot[i] = -1.0f, gr[i] = -2.0f;
    rt_dev_upload(c, c->slot[0], (int64_t)g_bytes - ARENA);
    rt_allgather(c, c->dev_slot[0], c->dev_shard[RT_S_PARAM], SHARD, RT_F32);
    rt_dev_download(c, slot, SHARD * 4);
    CHECK(slot[0] == 0.0f && slot[SHARD - 1] == (float)(SHARD - 1), "world-1 all-gather did not copy the shard");
    for (int i = 0; i < SHARD; i++)
        slot[i] = 5.0f;
    rt_dev_upload(c, slot, SHARD * 4);
    rt_reduce_scatter_avg(c, c->dev_shard[RT_S_GRAD], c->dev_slot[0], NUMEL, SHARD, RT_F32);
    rt_dev_download(c, gr, SHARD * 4);
    rt_dev_download(c, slot, SHARD * 4);
    CHECK(gr[0] == 5.0f && gr[NUMEL - 1] == 5.0f && gr[NUMEL] == 0.0f && gr[SHARD - 1] == 0.0f,
          "world-1 reduce-scatter: %g %g %g %g", gr[0], gr[NUMEL - 1], gr[NUMEL], gr[SHARD - 1]);
    CHECK(slot[NUMEL] == 0.0f, "the padding of the full buffer was not zeroed");
    /* in place: the shard is the full buffer's own piece */
    rt_reduce_scatter_avg(c, c->dev_slot[0], c->dev_slot[0], NUMEL, SHARD, RT_F32);
    rt_allgather(c, c->dev_slot[0], c->dev_slot[0], SHARD, RT_F32);
    rt_allreduce_avg(c, c->dev_slot[0], SHARD, RT_F32);
    rt_dev_download(c, slot, SHARD * 4);
    CHECK(slot[0] == 5.0f && slot[NUMEL] == 0.0f, "in-place world-1 collectives changed the buffer");
    rt_memset(c->dev_slot[0], 0, 8);
    rt_memcpy(c->dev_slot[0] + 8, c->dev_shard[RT_S_PARAM] + 4, 4);
    rt_dev_download(c, slot, 12);
    CHECK(slot[0] == 0.0f && slot[1] == 0.0f && slot[2] == 1.0f, "rt_memset / rt_memcpy");
    printf("OK collectives at world 1, copies and fills\n");
}

/* after steps(): lanes_step's gathered copy holds every rank's parameter shard (rank * 10000 + i), its reduced
 * shard this rank's piece of 0, 1, 2, ... with the padding zeroed */
static void lanes_check(RtCtx *c, const char *mode)
{
    int64_t nfull = (int64_t)c->sf * SHARD;
    float *out2 = malloc((size_t)nfull * 4), *sh2 = malloc(SHARD * 4);
    CHECK(out2 && sh2, "out of memory");
    rt_dev_download(c, g_base + OFF_OUT2, nfull * 4);
    rt_dev_download(c, g_base + OFF_SH2, SHARD * 4);
    memcpy(out2, g_base + OFF_OUT2, (size_t)nfull * 4);
    memcpy(sh2, g_base + OFF_SH2, SHARD * 4);
    for (int64_t j = 0; j < nfull; j++)
        CHECK(out2[j] == (float)(j / SHARD * 10000 + j % SHARD), "%s: the lanes' gathered copy [%lld] = %g (a wait "
              "between the gather's stream and the compute stream missing?)", mode, (long long)j, out2[j]);
    for (int64_t i = 0, j = (int64_t)c->srank * SHARD; i < SHARD; i++, j++)
        CHECK(sh2[i] == (j < g_numel ? (float)j : 0.0f), "%s: the lanes' reduced shard [%lld] = %g, not %g (a wait "
              "between the reductions' stream and the compute stream missing?)", mode, (long long)i, sh2[i],
              j < g_numel ? (float)j : 0.0f);
    free(out2);
    free(sh2);
}

/* steps 1..last: every step sees its own parameters; the loss comes back */
static void steps(int last, const char *mode)
{
    RtCtx *c = &g_c;
    float *g = (float *)(g_base + OFF_G);
    for (int i = 0; i < 2 * G * G; i++)
        g[i] = frand();
    rt_dev_upload(c, g, 2 * G * G * 4);
    float *pa = (float *)c->shard[RT_S_PARAM]; /* this rank's parameter shard: rank * 10000 + i */
    for (int i = 0; i < SHARD; i++)
        pa[i] = (float)(g_rank * 10000 + i);
    rt_dev_upload(c, pa, SHARD * 4);
    double want[G * G];
    ref_gemm(want, g, g + G * G, 1, 0, 0, G, G, G, 0, 0, 0.0, NULL);
    double t0 = now_s(), t_first = 0;
    for (int s = 1; s <= last; s++) {
        c->step = s;
        c->lr = 1e-3 * s;
        c->beta1 = 0.9, c->beta2 = 0.999, c->eps = 1e-8, c->weight_decay = 0.01, c->momentum = 0;
        if (s == 6)
            g_expect_fail = g_checks[0];
        rt_dev_step(c);
        rt_dev_download(c, g_base + OFF_LOSS, 4); /* as the core does */
        if (s == 3)
            t_first = now_s();
        float loss;
        memcpy(&loss, g_base + OFF_LOSS, 4);
        CHECK(loss == (float)s, "%s step %d: the loss read back is %g", mode, s, loss);
        int64_t st;
        double lr;
        rt_dev_download(c, g_base + OFF_OUT, 16);
        memcpy(&st, g_base + OFF_OUT, 8);
        memcpy(&lr, g_base + OFF_OUT + 8, 8);
        CHECK(st == s && lr == 1e-3 * s, "%s step %d: the kernel saw step %lld, lr %g", mode, s, (long long)st, lr);
    }
    CHECK(last < 6, "step 6 should have failed its check");
    lanes_check(c, mode);
    double per = last > 3 ? (now_s() - t_first) / (last - 3) : 0;
    float *y = (float *)(g_base + OFF_IOTA), *cg = g + 2 * G * G;
    rt_dev_download(c, y, N_IOTA * 4);
    rt_dev_download(c, cg, G * G * 4);
    for (int i = 0; i < N_IOTA; i++)
        CHECK(y[i] == (float)i, "iota kernel: y[%d] = %g", i, y[i]);
    double err = 0;
    for (int i = 0; i < G * G; i++)
        err = fmax(err, fabs(cg[i] - want[i]));
    CHECK(err < 5e-2, "the step's GEMM is off by %g", err);
    /* the step's all-gather (param shard -> slot) and reduce-scatter (slot,
     * padding zeroed -> grad shard) */
    float *gr = (float *)c->shard[RT_S_GRAD];
    rt_dev_download(c, pa, SHARD * 4);
    rt_dev_download(c, gr, SHARD * 4);
    for (int i = 0; i < SHARD; i++)
        CHECK(gr[i] == ((int64_t)c->srank * SHARD + i < g_numel ? pa[i] : 0.0f), "%s: grad[%d] = %g after the step's collectives (param %g)",
              mode, i, gr[i], pa[i]);
    printf("OK %s%s: %d steps (%.1f us per step incl. parameter upload, wait and loss; %.3f s in all)\n", mode,
           cu.nccl ? (c->world > 1 ? " through NCCL" : " with a one-rank NCCL communicator") : "", last, per * 1e6,
           now_s() - t0);
}

/* world mode: each rank's parameter shard is rank * 10000 + i; five
 * steps (the first eager, then captured and replayed) all-gather them and
 * reduce-scatter them back through NCCL; the full buffer must hold every
 * rank's shard (the padding zeroed), and steps() checks the gradient
 * shard = this rank's own piece, averaged over identical copies */
static void world_steps(void)
{
    RtCtx *c = &g_c;
    float *slot = (float *)c->slot[0];
    steps(5, "world");
    rt_dev_download(c, slot, (int64_t)g_world * SHARD * 4);
    for (int64_t j = 0; j < (int64_t)g_world * SHARD; j++)
        CHECK(slot[j] == (j < g_numel ? (float)(j / SHARD * 10000 + j % SHARD) : 0.0f),
              "rank %d: full[%lld] = %g after the all-gather", g_rank, (long long)j, slot[j]);
    printf("OK world: rank %d of %d: all-gather and reduce-scatter through NCCL, eager and replayed\n", g_rank, g_world);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "nodriver";
    if (!strcmp(mode, "nodriver"))
        return nodriver();
    int world_mode = !strcmp(mode, "world");
    int graph = !strcmp(mode, "graph") || !strcmp(mode, "check") || world_mode;
    CHECK(graph || !strcmp(mode, "eager"), "usage: cuda_rt_dev_test nodriver|graph|eager|check|world");
    if (world_mode) { /* under mpirun -np N: one rank each */
        g_rank = env_int("OMPI_COMM_WORLD_RANK", 0);
        g_world = env_int("OMPI_COMM_WORLD_SIZE", 1);
        CHECK(g_world >= 2 && g_rank >= 0 && g_rank < g_world, "world mode: run it under mpirun -np 2 or more");
    }
    CHECK(KC_COUNT >= 3, "kernels.def has %d kernels; the test needs 3", KC_COUNT);
#ifdef FSDPC_CUEMU
    char *ptx = make_emu_image();
#else
    char *ptx = make_ptx();
#endif
    if (argc > 2) { /* cuda_rt_dev_test MODE FILE: write the PTX (to check it with ptxas) */
        FILE *f = fopen(argv[2], "w");
        CHECK(f && fputs(ptx, f) >= 0 && fclose(f) == 0, "cannot write %s", argv[2]);
        return 0;
    }
    setup(ptx);
    char err[1024] = "";
    CHECK(rt_dev_init(&g_m, g_rank, g_world, g_bytes, err, sizeof err) == 0, "rt_dev_init: %s", err);
    printf("GPU %d: %s, sm_%d, %d SMs\n", cu.device, cu.name, cu.cc, cu.sm_count);
    rt_dev_set_graph(graph);
    CHECK(rt_dev_attach(&g_c, g_base, g_bytes, err, sizeof err) == 0, "rt_dev_attach: %s", err);
    CHECK(g_c.dev_arena && g_c.dev_slot[0] - g_c.dev_arena == ARENA && !g_c.dev_shard[RT_S_M] &&
          g_c.dev_shard[RT_S_GRAD] - g_c.dev_arena == g_shard[RT_S_GRAD] - g_base, "the device carving");
    if (!strcmp(mode, "check")) {
        steps(6, mode);
        return 1; /* not reached: step 6 fails */
    }
    if (world_mode) {
        world_steps();
    } else {
        gemms();
        collectives();
        steps(5, mode);
    }
    rt_dev_finish(&g_c);
    CHECK(!g_c.dev_arena && !g_c.dev_slot, "rt_dev_finish left the device pointers");
    free(g_base);
    free(ptx);
    printf("OK %s: the device layer\n", mode);
    return 0;
}
