/* fuzz_compile.c — libFuzzer target: any bytes, as an ONNX model, through the whole compiler in process.
 *
 * Each input is compiled as these two runs of fsdpc would compile it:
 *
 *   fsdpc IN --target cpu --loss mse:OUT0,fuzz.target --wrap size:10000 --verify --report --world 4 \
 *         --hw a100-roce -o OUT
 *   fsdpc IN --target cpu --eval --verify -o OUT
 *
 * with every symbolic dim 2 (Options.dim_default).  OUT0 is the first graph output; without --loss when a graph output is the model's own loss
 * (SoftmaxCrossEntropyLoss, NegativeLogLikelihoodLoss).  The pipelines are fsdpc.c's own (the file is
 * included here, its main renamed); in place of cg_build, cg_source_cpu emits the C source into memory
 * (no files, no cc).  A user error (fatal, node_fatal) prints its line and longjmps back here: the
 * expected end of most inputs.  An internal error (die: abort), a sanitizer report, a leak, a timeout or
 * a memory blow-up is a finding.  After every input the arena is freed (ir_reset), so memory stays flat
 * and no input sees another's.
 *
 * Built with clang -fsanitize=fuzzer,address,undefined by tests/fuzz/CMakeLists.txt; run by the ctest
 * fuzz_compile (tests/fuzz/run.sh).
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#define main fsdpc_main
#include "../fsdpc.c"
#undef main

#include <errno.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[4096], model_path[4200]; /* an empty directory of our own: external data resolves inside it */
static FILE *devnull;

static void remove_dir(void)
{
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/fsdpc-fuzz-XXXXXX", t && *t ? t : "/tmp");
    devnull = fopen("/dev/null", "w");
    if (!mkdtemp(dir) || !devnull) {
        fprintf(stderr, "fuzz_compile: cannot create %s or open /dev/null: %s\n", dir, strerror(errno));
        exit(1);
    }
    atexit(remove_dir);
    snprintf(model_path, sizeof model_path, "%s/fuzz.onnx", dir);
    return 0;
}

/* the value to give --loss: NULL when a graph output is the model's own loss (or there is none) */
static const char *loss_pred(const Graph *g)
{
    for (int i = 0; i < g->noutput; i++)
        for (int n = 0; n < g->nnode; n++)
            if ((g->node[n].op == OP_SoftmaxCrossEntropyLoss || g->node[n].op == OP_NegativeLogLikelihoodLoss) &&
                g->node[n].nout > 0 && g->node[n].out[0] == g->output[i])
                return NULL;
    return g->noutput ? g->val[g->output[0]].name : NULL;
}

static void train(const uint8_t *data, size_t size)
{
    Options o = {.model = model_path, .model_data = data, .model_size = size, .out = "fuzz.out",
                 .target = "cpu", .dim_default = 2, .wrap = WRAP_SIZE, .wrap_size = 10000, .world = 4, .report = 1, .verify = 1};
    const Graph *g0 = onnx_load(&o); /* to name the loss, as a user reads the model's outputs */
    const char *pred = loss_pred(g0);
    if (pred) {
        o.loss = LOSS_MSE;
        o.loss_pred = pred;
        o.loss_target = "fuzz.target";
    }
    CgHw hw;
    cg_hw_load("a100-roce", &hw);
    Graph *g = compile(&o);
    cg_report(devnull, g, o.world, &hw);
    compare_strategies(&o, g, &hw);
    size_t len;
    const char *src = cg_source_cpu(g, &len);
    if (strlen(src) != len)
        die("the emitted source has a NUL byte");
}

static void eval(const uint8_t *data, size_t size)
{
    Options o = {.model = model_path, .model_data = data, .model_size = size, .out = "fuzz.out",
                 .target = "cpu", .dim_default = 2, .wrap_size = 100000000, .world = 2, .eval = 1, .verify = 1};
    Graph *g = compile_eval(&o);
    size_t len;
    const char *src = cg_source_cpu(g, &len);
    if (strlen(src) != len)
        die("the emitted source has a NUL byte");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    jmp_buf jb;
    ir_fatal_jump = &jb;
    if (!setjmp(jb))
        train(data, size);
    ir_reset();
    if (!setjmp(jb))
        eval(data, size);
    ir_reset();
    ir_fatal_jump = NULL;
    fflush(stdout);
    return 0;
}
