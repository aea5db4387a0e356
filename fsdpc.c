/* fsdpc.c — the compiler driver: flags, then the pipeline as a literal list.
 *
 *   fsdpc MODEL.onnx -o OUT --loss KIND:PRED,TARGET [--optimizer adamw|adam|sgd] ...
 *
 * Each pass is one file in passes/ with one entry function; after each the
 * IR can be verified (--verify) and printed (--dump-after NAME).  The printed
 * text reads back (ir/parse.c): `fsdpc --run-pass NAME FILE.ir` runs that one
 * pass on it, its options the file's "flags:" line (tests/passes).
 */
#include "ir.h"
#include "afile.h"
#include "fsdpc_config.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *usage =
    "usage: fsdpc MODEL.onnx -o OUT --loss KIND:PRED,TARGET [options]\n"
    "  --target cuda|cpu       cuda (the default): NVIDIA GPUs (NVRTC kernels, cuBLASLt, NCCL,\n"
    "                          CUDA Graphs); cpu: CPUs (MPI collectives, CBLAS)\n"
    "  --arch sm_XY[,sm_XY..]  cuda: GPU archs to compile for (default " FSDPC_DEFAULT_ARCH "), plus PTX\n"
    "                          of the lowest for newer GPUs\n"
    "  --emulate               cuda: link the CUDA emulation instead of the GPU libraries (the same step and\n"
    "                          runtime, run on this machine's CPUs: a test of the cuda target without a GPU)\n"
    "  --cpu native|x86-64|x86-64-v2|x86-64-v3|x86-64-v4\n"
    "                          cpu: the CPU the step and kernels are built for (default native: this\n"
    "                          machine's; a level for nodes that differ); the executable checks it at start\n"
    "  --loss mse:PRED,TARGET | cross_entropy:LOGITS,LABELS | l1:PRED,TARGET | huber:PRED,TARGET\n"
    "         | smooth_l1:PRED,TARGET | bce:LOGITS,TARGET\n"
    "                          PRED/LOGITS: a value of the model; TARGET/LABELS: a new input fed from data;\n"
    "                          each PyTorch's loss with reduction mean (bce: BCEWithLogitsLoss, targets\n"
    "                          in [0, 1] of the logits' shape)\n"
    "  --huber-delta D         huber's delta (default 1)\n"
    "  --smooth-l1-beta B      smooth_l1's beta (default 1)\n"
    "  --label-smoothing E     cross_entropy's label smoothing, in [0, 1) (default 0)\n"
    "  --optimizer adamw|adam|sgd\n"
    "                          (default adamw: torch.optim.AdamW's decoupled weight decay; adam:\n"
    "                          torch.optim.Adam's, added to the gradient); hyper-parameters are run\n"
    "                          options of OUT\n"
    "  --dim NAME=VALUE        bind a symbolic dimension (repeatable)\n"
    "  --precision fp32|bf16|fp16\n"
    "                          bf16: parameters all-gathered and every MatMul computed in bfloat16\n"
    "                          (float32 accumulation); float32 master shards, optimizer state,\n"
    "                          gradient reduction and all other ops (default fp32).  fp16: the same\n"
    "                          in float16, with dynamic loss scaling (run options --loss-scale-*)\n"
    "  --reduce-dtype fp32|bf16\n"
    "                          the dtype gradients are averaged across ranks in (default fp32; bf16\n"
    "                          halves the bytes; the gradient shards and the optimizer stay fp32)\n"
    "  --shard full|grad_op|none|hybrid:F\n"
    "                          FULL_SHARD (default; the root unit, as PyTorch's, never resharded\n"
    "                          after forward); SHARD_GRAD_OP: no reshard after forward;\n"
    "                          NO_SHARD: every rank holds the model, gradients all-reduced (DDP);\n"
    "                          HYBRID_SHARD: shard in groups of F consecutive ranks, all-reduce\n"
    "                          across groups (the world size must be a multiple of F)\n"
    "  --wrap size:N           FSDP unit = consecutive layers holding >= N parameters (default 100000000)\n"
    "  --wrap blocks           one unit per repeated block (NAME.<i>. in the parameter names, e.g.\n"
    "                          transformer.h.0., layer1.1.), the rest the root unit\n"
    "  --wrap prefix:A,B,...   one unit per name prefix (the first that matches), the rest the root\n"
    "  --prefetch backward_pre|backward_post|none\n"
    "                          when a unit's backward all-gather starts: before the previous unit's\n"
    "                          gradients are computed (default), after its reduce-scatter starts, or\n"
    "                          when needed (collectives run beside compute: a thread on cpu, a stream\n"
    "                          on cuda)\n"
    "  --forward-prefetch      start each forward all-gather while the unit before computes\n"
    "  --max-inflight K        prefetch never keeps more than K gathered units live (default 2; one\n"
    "                          kept from forward to backward, grad_op's or the root's, not counted)\n"
    "  --params PATTERN        train exactly the float initializers matching the shell pattern\n"
    "                          (repeatable; overrides the graph signature and the default rule)\n"
    "  --freeze PATTERN        keep the initializers matching the shell pattern fixed: no gradient, no\n"
    "                          optimizer state (repeatable; they stay whole constants on every rank;\n"
    "                          applies after --params)\n"
    "  --recompute none|units|selective  units: each unit's activations are recomputed in the backward\n"
    "                          from its saved input, reusing the backward's gather; selective: the same,\n"
    "                          except that GEMM, convolution and attention outputs stay saved, so only\n"
    "                          the cheap ops (elementwise, norms, softmax, casts) run again (default none)\n"
    "  --dump-after PASS       print the IR after PASS (frontend fold shape gelu attention loss autodiff optim\n"
    "                          units shard precision recompute fuse schedule pack memplan), as text --run-pass reads\n"
    "  --dump-data             --dump-after / --run-pass write every constant's and parameter's bytes (default:\n"
    "                          float tensors of more than 256 elements as a digest, which --run-pass refuses\n"
    "                          to read values from)\n"
    "  --run-pass PASS FILE.ir read IR text (as --dump-after prints it) and print it after running PASS\n"
    "                          alone on it; the options are the file's flags: line, then the command line's\n"
    "                          (--verify checks the result; --run-pass frontend: read and print it back);\n"
    "                          no -o, --report, --dump-after or --emit-c\n"
    "  --eval                  a forward-only executable: OUT --input NAME=FILE --out-dir DIR\n"
    "  --report [--world N]    print units and the planned memory per rank for N ranks (default 2)\n"
    "  --hw PROFILE            --report also predicts the step time, TFLOPS per device, MFU and exposed\n"
    "                          communication of every strategy on PROFILE: a shipped one (a100-roce,\n"
    "                          a100-roce1600, a100-400g, h100-ib, h100-800g: codegen/hw) or a profile\n"
    "                          file (e.g. one fsdpc --calibrate wrote)\n"
    "  --report-json PATH      --report, also written to PATH as JSON\n"
    "  --calibrate [-o PATH] [--world N]\n"
    "                          measure this machine (GEMMs, memory, fsdpc's kernels, the collectives on N\n"
    "                          ranks started by mpirun, default 2, at most one per core) and write its\n"
    "                          profile for --hw (default calibrated.hw); no model\n"
    "  --no-fuse               every elementwise node its own kernel (no fused loops)\n"
    "  --verify                check the IR after every pass\n"
    "  --emit-c                keep the generated C as OUT.c\n"
    "  --init-only             write OUT.init alone, no executable: an OUT built before from this model\n"
    "                          with other weights (the same flags) trains from it; no C compiled\n"
    "  --cc PATH               C compiler for the generated step\n"
    "  --quiet                 no progress lines on stderr (the cuda target's NVRTC stages); notes,\n"
    "                          warnings and errors are still printed\n"
    "  --version               the version, the targets this fsdpc builds for and where its runtime is\n"
    "environment: FSDPC_HOME   the install prefix whose runtime (include/fsdpc, lib/fsdpc) executables\n"
    "                          are built with (default: the build tree fsdpc runs from, or the prefix\n"
    "                          above its bin/)\n";

/* the passes in pipeline order, for --dump-after and --run-pass (compile() below is the pipeline itself) */
static const struct {
    const char *name;
    void (*run)(Graph *g);
} passes[] = {{"frontend", NULL}, {"fold", pass_fold}, {"shape", pass_shape}, {"gelu", pass_gelu},
              {"attention", pass_attention}, {"loss", pass_loss}, {"autodiff", pass_autodiff}, {"optim", pass_optim},
              {"units", pass_units}, {"shard", pass_shard}, {"precision", pass_precision}, {"recompute", pass_recompute},
              {"fuse", pass_fuse}, {"schedule", pass_schedule}, {"pack", pass_pack}, {"memplan", pass_memplan}, {NULL, NULL}};
#define PASS_NAMES "frontend fold shape gelu attention loss autodiff optim units shard precision recompute fuse schedule pack memplan"

/* the index of pass `name` in passes[], or a one-line error for flag */
static int find_pass(const char *flag, const char *name)
{
    for (int k = 0; passes[k].name; k++)
        if (!strcmp(passes[k].name, name))
            return k;
    fatal("%s %s: no such pass (" PASS_NAMES ")", flag, name);
}

/* The one parser of fsdpc's integer options: s, a decimal integer in [min, max] (the range of the field that
 * holds it, or less where more makes no sense); else one line naming flag, s and the range.  Every integer
 * option goes through it: strtoll's ERANGE and a narrowing cast would silently change the value. */
static int64_t parse_int(const char *flag, const char *s, int64_t min, int64_t max)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || isspace((unsigned char)*s) || *s == '+')
        fatal("%s: '%s' is not an integer (expected one in [%lld, %lld])", flag, ir_q(s), (long long)min,
              (long long)max);
    if (errno == ERANGE || v < min || v > max)
        fatal("%s: %s is out of range: expected an integer in [%lld, %lld]", flag, ir_q(s), (long long)min,
              (long long)max);
    return v;
}

/* v's index in names (NULL-terminated); a one-line error naming `expected` otherwise */
static int pick(const char *flag, const char *v, const char *const *names, const char *expected)
{
    for (int k = 0; names[k]; k++)
        if (!strcmp(v, names[k]))
            return k;
    fatal("%s %s: expected %s", flag, v, expected);
}

static void parse_loss(Options *o, const char *s)
{
    const char *colon = strchr(s, ':'), *comma = colon ? strchr(colon, ',') : NULL;
    if (!colon || !comma || comma == colon + 1 || !comma[1] || strchr(comma + 1, ','))
        fatal("--loss '%s': expected KIND:PRED,TARGET, e.g. --loss mse:y,target", s);
    static const struct {
        const char *name;
        LossKind kind;
    } kinds[] = {{"mse", LOSS_MSE}, {"cross_entropy", LOSS_CE}, {"l1", LOSS_L1}, {"huber", LOSS_HUBER},
                 {"smooth_l1", LOSS_SMOOTH_L1}, {"bce", LOSS_BCE}};
    size_t k = (size_t)(colon - s);
    o->loss = LOSS_NONE;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (strlen(kinds[i].name) == k && !strncmp(s, kinds[i].name, k))
            o->loss = kinds[i].kind;
    if (o->loss == LOSS_NONE)
        fatal("--loss '%s': unknown kind (supported: mse, cross_entropy, l1, huber, smooth_l1, bce)", s);
    o->loss_pred = ir_fmt("%.*s", (int)(comma - colon - 1), colon + 1);
    o->loss_target = ir_strdup(comma + 1);
}

/* the one line when one of the outputs out[] (-o, OUT.init, OUT.c, --report-json; NULL: not written) is in */
static void refuse_input(const char *const out[4], const char *what, const char *in)
{
    static const char *const flag[4] = {"-o", "-o OUT's init file", "-o OUT's --emit-c source", "--report-json"};
    for (int k = 0; k < 4; k++)
        if (out[k] && rt_same_file(out[k], in))
            fatal("%s %s is %s %s: the compile would overwrite its input; write it elsewhere", flag[k],
                  out[k], what, in);
}

/* Refuse, in one line naming both, an output (-o OUT, OUT.init, --emit-c's OUT.c, --report-json) that is one of the
 * compile's inputs: by identity (afile.h's rt_same_file), so ./m.onnx, m.onnx and a hard link are one file and an
 * output not there yet is none.  Inputs: g NULL (the option checks, before the model is read) the model, the --hw
 * profile, --cc, fsdpc itself and the runtime libraries executables are linked from; g given (after the frontend,
 * before anything is written) the model's external data files. */
static void refuse_clobber(const Options *o, const Graph *g)
{
    const char *out[4] = {o->out, o->out ? ir_fmt("%s.init", o->out) : NULL,
                          o->out && o->keep_c ? ir_fmt("%s.c", o->out) : NULL, o->report_json};
    if (g) {
        for (int i = 0; i < g->ninit; i++)
            if (g->ext[i].file)
                refuse_input(out, "an external data file of the model", g->ext[i].file);
        return;
    }
    refuse_input(out, "the model", o->model);
    refuse_input(out, "fsdpc itself", "/proc/self/exe");
    if (o->hw)
        refuse_input(out, "the --hw profile", o->hw);
    if (o->cc)
        refuse_input(out, "the --cc compiler", o->cc);
    const char *inc, *lib;
    if (!o->out) /* a --report needs no runtime */
        return;
    cg_runtime_dirs(&inc, &lib);
    DIR *d = opendir(lib);
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        size_t n = strlen(e->d_name);
        if (n > 2 && !strcmp(e->d_name + n - 2, ".a"))
            refuse_input(out, "a runtime library of fsdpc", ir_fmt("%s/%s", lib, e->d_name));
    }
    if (d)
        closedir(d);
}

static void parse_args(Options *o, int argc, char **argv)
{
    o->target = "cuda";
    o->wrap_size = 100000000;
    o->world = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define VALUE() (i + 1 < argc ? argv[++i] : (fatal("%s needs a value (see --help)", a), ""))
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            exit(0);
        } else if (!strcmp(a, "--version")) {
            const char *inc, *lib;
            cg_runtime_dirs(&inc, &lib);
            printf("fsdpc %s\ntargets: cpu (MPI, CBLAS; kernels for %s)%s\nruntime: %s, %s\n", FSDPC_VERSION,
                   *FSDPC_KERNEL_LEVELS ? "x86-64, x86-64-v3, x86-64-v4" : "this machine's baseline",
                   *FSDPC_LIBS_CUDA ? ", cuda (NVRTC, cuBLASLt, NCCL; default archs " FSDPC_DEFAULT_ARCH ")"
                                    : " (built without the CUDA toolkit: no cuda target)", inc, lib);
            exit(0);
        } else if (!strcmp(a, "-o")) {
            o->out = VALUE();
        } else if (!strcmp(a, "--target")) {
            o->target = VALUE();
            if (strcmp(o->target, "cpu") && strcmp(o->target, "cuda"))
                fatal("--target %s: expected cuda or cpu", o->target);
        } else if (!strcmp(a, "--arch")) {
            o->arch = VALUE();
        } else if (!strcmp(a, "--emulate")) {
            o->emulate = 1;
        } else if (!strcmp(a, "--cpu")) {
            o->cpu = VALUE();
            cg_cpu_check_name(o->cpu);
        } else if (!strcmp(a, "--loss")) {
            parse_loss(o, VALUE());
        } else if (!strcmp(a, "--optimizer")) {
            static const char *const names[] = {"adamw", "sgd", "adam", NULL}; /* OptKind order */
            o->optimizer = (OptKind)pick(a, VALUE(), names, "adamw, adam or sgd");
        } else if (!strcmp(a, "--dim")) {
            const char *v = VALUE(), *eq = strchr(v, '=');
            if (!eq || eq == v)
                fatal("--dim '%s': expected NAME=VALUE", v);
            if (o->ndims == 64)
                fatal("--dim: at most 64 dimensions");
            o->dim_name[o->ndims] = ir_fmt("%.*s", (int)(eq - v), v);
            for (int k = 0; k < o->ndims; k++)
                if (!strcmp(o->dim_name[k], o->dim_name[o->ndims]))
                    fatal("--dim %s is given twice", ir_q(o->dim_name[k]));
            /* no tensor holds more than MAX_NUMEL elements: neither can one dimension */
            o->dim_value[o->ndims] = parse_int(ir_fmt("--dim %s", ir_q(o->dim_name[o->ndims])), eq + 1, 1, MAX_NUMEL);
            o->ndims++;
        } else if (!strcmp(a, "--precision")) {
            static const char *const names[] = {"fp32", "bf16", "fp16", NULL}; /* Precision order */
            o->precision = (Precision)pick(a, VALUE(), names, "fp32, bf16 or fp16");
        } else if (!strcmp(a, "--reduce-dtype")) {
            static const char *const names[] = {"fp32", "bf16", NULL}; /* Precision order */
            const char *v = VALUE();
            if (!strcmp(v, "fp16"))
                fatal("--reduce-dtype fp16 is not supported (float16 sums of gradients overflow without care): "
                      "use fp32 or bf16 (with --precision fp16 too)");
            o->reduce_dtype = (Precision)pick(a, v, names, "fp32 or bf16");
        } else if (!strcmp(a, "--shard")) {
            static const char *const names[] = {"full", "grad_op", "none", NULL}; /* ShardMode order */
            const char *v = VALUE();
            if (!strncmp(v, "hybrid:", 7)) {
                o->shard = SHARD_HYBRID;
                o->hybrid = (int)parse_int("--shard hybrid:F", v + 7, 1, MAX_WORLD);
            } else {
                o->shard = (ShardMode)pick(a, v, names, "full, grad_op, none or hybrid:F");
            }
        } else if (!strcmp(a, "--wrap")) {
            const char *v = VALUE();
            if (!strncmp(v, "size:", 5)) {
                o->wrap = WRAP_SIZE;
                o->wrap_size = parse_int("--wrap size:N", v + 5, 1, INT64_MAX);
            } else if (!strcmp(v, "blocks")) {
                o->wrap = WRAP_BLOCKS;
            } else if (!strncmp(v, "prefix:", 7)) {
                o->wrap = WRAP_PREFIX;
                o->nprefix = 0;
                for (const char *p = v + 7; *p;) {
                    const char *e = strchr(p, ',');
                    size_t n = e ? (size_t)(e - p) : strlen(p);
                    if (!n || o->nprefix == 64)
                        fatal("--wrap '%s': expected prefix:A,B,... (1 to 64 non-empty prefixes)", v);
                    o->prefix[o->nprefix++] = ir_fmt("%.*s", (int)n, p);
                    p += n + (e != NULL);
                }
                if (!o->nprefix)
                    fatal("--wrap '%s': expected prefix:A,B,... (1 to 64 non-empty prefixes)", v);
            } else {
                fatal("--wrap '%s': expected size:N, blocks or prefix:A,B,...", v);
            }
        } else if (!strcmp(a, "--prefetch")) {
            static const char *const names[] = {"backward_pre", "backward_post", "none", NULL}; /* Prefetch order */
            o->prefetch = (Prefetch)pick(a, VALUE(), names, "backward_pre, backward_post or none");
        } else if (!strcmp(a, "--forward-prefetch")) {
            o->forward_prefetch = 1;
        } else if (!strcmp(a, "--max-inflight")) {
            o->max_inflight = (int)parse_int("--max-inflight", VALUE(), 1, INT_MAX);
        } else if (!strcmp(a, "--huber-delta") || !strcmp(a, "--smooth-l1-beta") ||
                   !strcmp(a, "--label-smoothing")) {
            const char *v = VALUE();
            char *end;
            double x = strtod(v, &end);
            int ls = !strcmp(a, "--label-smoothing");
            if (!*v || *end || !(ls ? x >= 0 && x < 1 : x > 0 && x < 1e30))
                fatal("%s: '%s' is not a number in %s", a, v, ls ? "[0, 1)" : "(0, 1e30)");
            if (ls)
                o->label_smoothing = x;
            else
                o->loss_param = x, o->loss_param_flag = a;
        } else if (!strcmp(a, "--freeze")) {
            if (o->nfreeze == 64)
                fatal("--freeze: at most 64 patterns");
            o->freeze[o->nfreeze++] = VALUE();
        } else if (!strcmp(a, "--params")) {
            if (o->nparams == 64)
                fatal("--params: at most 64 patterns");
            o->params[o->nparams++] = VALUE();
        } else if (!strcmp(a, "--dump-after")) {
            o->dump_after = VALUE();
            find_pass(a, o->dump_after);
        } else if (!strcmp(a, "--dump-data")) {
            o->dump_data = 1;
        } else if (!strcmp(a, "--run-pass")) {
            o->run_pass = VALUE();
            find_pass(a, o->run_pass);
        } else if (!strcmp(a, "--recompute")) {
            static const char *const names[] = {"none", "units", "selective", NULL};
            o->recompute = pick(a, VALUE(), names, "none, units or selective");
        } else if (!strcmp(a, "--no-fuse")) {
            o->no_fuse = 1;
        } else if (!strcmp(a, "--eval")) {
            o->eval = 1;
        } else if (!strcmp(a, "--report")) {
            o->report = 1;
        } else if (!strcmp(a, "--hw")) {
            o->hw = VALUE();
        } else if (!strcmp(a, "--report-json")) {
            o->report_json = VALUE();
            o->report = 1;
        } else if (!strcmp(a, "--calibrate")) {
            o->calibrate = 1;
        } else if (!strcmp(a, "--world")) {
            o->world = (int)parse_int("--world", VALUE(), 1, MAX_WORLD);
        } else if (!strcmp(a, "--verify")) {
            o->verify = 1;
        } else if (!strcmp(a, "--emit-c")) {
            o->keep_c = 1;
        } else if (!strcmp(a, "--init-only")) {
            o->init_only = 1;
        } else if (!strcmp(a, "--cc")) {
            o->cc = VALUE();
        } else if (!strcmp(a, "--quiet")) {
            o->quiet = 1;
        } else if (a[0] == '-') {
            fatal("unknown flag '%s' (see --help)", a);
        } else if (o->model) {
            fatal("two models given ('%s' and '%s')", o->model, a);
        } else {
            o->model = a;
        }
#undef VALUE
    }
    if (o->calibrate) {
        if (o->model || o->report || o->dump_after || o->eval || o->hw)
            fatal("--calibrate measures this machine: it takes no model and no other action (-o PATH, --world N, "
                  "--cc)");
        return;
    }
    if (!o->model)
        fatal("no model given (see --help)");
    if (o->arch && strcmp(o->target, "cuda"))
        fatal("--arch applies to --target cuda only");
    if (o->emulate && strcmp(o->target, "cuda"))
        fatal("--emulate applies to --target cuda only");
    if (o->emulate && o->arch)
        fatal("--emulate runs no GPU code: it takes no --arch");
    if (o->cpu && strcmp(o->target, "cpu"))
        fatal("--cpu applies to --target cpu only (the cuda step runs on the GPU)");
    int huber = o->loss_param_flag && !strcmp(o->loss_param_flag, "--huber-delta");
    if (o->loss_param_flag && o->loss != (huber ? LOSS_HUBER : LOSS_SMOOTH_L1))
        fatal("%s shapes --loss %s, which is not given", o->loss_param_flag, huber ? "huber" : "smooth_l1");
    if (o->label_smoothing > 0 && o->loss != LOSS_CE)
        fatal("--label-smoothing shapes --loss cross_entropy, which is not given");
    if (!o->loss_param_flag)
        o->loss_param = 1;
    if (o->eval && (o->loss != LOSS_NONE || o->report))
        fatal("--eval builds a forward-only executable: --loss and --report do not apply");
    if (o->shard == SHARD_HYBRID && o->report && o->world % o->hybrid)
        fatal("--shard hybrid:%d needs a world size that is a multiple of %d; --world %d is not", o->hybrid,
              o->hybrid, o->world);
    if (o->eval && o->shard != SHARD_FULL)
        fatal("--eval builds a forward-only executable: --shard does not apply");
    if (o->eval && o->reduce_dtype != PREC_FP32)
        fatal("--eval builds a forward-only executable: --reduce-dtype does not apply");
    if (o->eval && o->recompute)
        fatal("--eval builds a forward-only executable: --recompute does not apply");
    if (o->eval && o->precision != PREC_FP32)
        fatal("--eval builds a forward-only executable in the model's dtype: --precision does not apply");
    if (o->hw && !o->report)
        fatal("--hw %s: the profile is for --report's prediction; add --report", o->hw);
    if (o->dump_data && !o->dump_after && !o->run_pass)
        fatal("--dump-data shapes the IR text of --dump-after or --run-pass, and neither is given");
    if (o->run_pass && (o->out || o->report || o->dump_after || o->keep_c))
        fatal("--run-pass %s prints the IR after that pass: it takes no -o, --report, --dump-after or --emit-c",
              o->run_pass);
    if (o->run_pass)
        return;
    if (!o->out && !o->report && !o->dump_after)
        fatal("nothing to do: give -o OUT, --report or --dump-after PASS");
    if (o->init_only && (!o->out || o->keep_c))
        fatal("--init-only writes OUT.init alone: it takes -o OUT and no --emit-c");
    refuse_clobber(o, NULL);
}

/* --calibrate's -o PATH, checked before its measurement (20 s and more) rather than after: a new or regular
 * file (not a directory, FIFO or device), in a folder that exists and this user may write */
static void check_output(const char *flag, const char *path)
{
    struct stat st;
    if (!*path)
        fatal("%s: an empty path", flag);
    if (!stat(path, &st) && !S_ISREG(st.st_mode))
        fatal("%s %s: not a regular file (%s): give the path of a file to write", flag, ir_q(path),
              S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket");
    const char *slash = strrchr(path, '/');
    const char *dir = !slash ? "." : slash == path ? "/" : ir_fmt("%.*s", (int)(slash - path), path);
    if (stat(dir, &st) || !S_ISDIR(st.st_mode))
        fatal("%s %s: its folder %s does not exist", flag, ir_q(path), ir_q(dir));
    if (access(dir, W_OK | X_OK))
        fatal("%s %s: its folder %s is not writable: %s", flag, ir_q(path), ir_q(dir), strerror(errno));
}

/* --calibrate's checks, all before it measures: one rank per core at most (more ranks would time-share the
 * cores, and the profile would describe no machine: a --world 4 profile of a 2-core machine predicts nothing),
 * and an output it can write */
static void check_calibrate(const Options *o)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores > 0 && o->world > cores)
        fatal("--calibrate --world %d: this machine has %ld cores; the profile measures one rank per core (more "
              "would share cores and describe no real machine): give --world %ld or less", o->world, cores, cores);
    check_output("--calibrate -o", o->out ? o->out : "calibrated.hw");
}

static void after(Graph *g, const char *pass)
{
    if (g->opt->verify)
        ir_verify(g, pass);
    if (g->opt->dump_after && !strcmp(g->opt->dump_after, pass)) {
        printf("# after %s\n", pass);
        ir_print(stdout, g);
    }
}

#define RUN(p) (pass_##p(g), after(g, #p))

/* the training pipeline of o, frontend to memplan */
static Graph *compile(const Options *o)
{
    Graph *g = onnx_load(o);
    after(g, "frontend");
    RUN(fold);
    RUN(shape);
    RUN(gelu);
    RUN(attention);
    RUN(loss);
    RUN(autodiff);
    RUN(optim);
    RUN(units);
    RUN(shard);
    RUN(precision);
    RUN(recompute);
    RUN(fuse);
    RUN(schedule);
    RUN(pack);
    RUN(memplan);
    return g;
}

/* the forward-only pipeline of --eval: every initializer stays a constant */
static Graph *compile_eval(const Options *o)
{
    Graph *g = onnx_load(o);
    after(g, "frontend");
    RUN(fold);
    RUN(shape);
    RUN(fuse);
    RUN(memplan);
    return g;
}

/* --report: the planned memory, traffic (and on hw the predicted step) of one rank under every strategy;
 * --report-json writes them */
static void compare_strategies(const Options *o, const Graph *build, const CgHw *hw)
{
    static const char *const names[] = {"full", "grad_op", "none", "hybrid"};
    CgRow row[4];
    int nrow = 0, self = 0;
    printf("strategies at world %d (this build: %s%s):\n", o->world, names[o->shard],
           o->shard == SHARD_HYBRID ? ir_fmt(":%d", o->hybrid) : "");
    printf("  %-10s %16s %16s %20s", "--shard", "planned peak B", "shards B", "sent per step B");
    if (hw)
        printf(" %12s %10s %7s %12s", "step s", "TFLOPS", "MFU %", "exposed s");
    printf("\n");
    for (int s = SHARD_FULL; s <= SHARD_HYBRID; s++) {
        Options v = *o;
        v.shard = (ShardMode)s;
        v.dump_after = NULL;
        v.verify = 0;
        if (s == SHARD_HYBRID) /* the build's F, else 2 where it divides the world */
            v.hybrid = o->shard == SHARD_HYBRID ? o->hybrid : 2;
        if (s == SHARD_HYBRID && (o->world % v.hybrid || v.hybrid >= o->world))
            continue;
        CgRow *r = &row[nrow];
        r->strategy = s == SHARD_HYBRID ? ir_fmt("hybrid:%d", v.hybrid) : names[s];
        IrMark m = ir_mark(); /* one strategy's graph at a time */
        const Graph *g = compile(&v);
        cg_plan(g, o->world, &r->plan);
        if (hw)
            cg_cost(g, o->world, hw, &r->cost);
        ir_release(m);
        printf("  %-10s %16lld %16lld %20lld", r->strategy, (long long)r->plan.total, (long long)r->plan.state,
               (long long)r->plan.sent);
        if (hw)
            printf(" %12.4g %10.4g %7.1f %12.4g", r->cost.step_s, r->cost.tflops, 100 * r->cost.mfu,
                   r->cost.exposed_s);
        printf("\n");
        if (s == (int)o->shard)
            self = nrow;
        nrow++;
    }
    if (o->report_json)
        cg_report_json(o->report_json, build, o->world, hw, row, nrow, self);
}

/* --report --recompute units|selective: the planned activations beside those of --recompute none */
static void compare_recompute(const Options *o, const Graph *g)
{
    Options v = *o;
    v.recompute = 0;
    v.dump_after = NULL;
    v.verify = 0;
    IrMark m = ir_mark();
    int64_t h_act = compile(&v)->peak_act_bytes;
    ir_release(m);
    int n = 0;
    for (int i = 0; i < g->nnode; i++)
        n += strstr(g->node[i].name, "@recompute") != NULL;
    printf("recompute %s: %d nodes recomputed in the backward; planned activations %lld B, %lld B with "
           "--recompute none (%.1f %% less)\n", o->recompute == RECOMPUTE_SELECTIVE ? "selective" : "units", n,
           (long long)g->peak_act_bytes, (long long)h_act,
           h_act ? 100.0 * (double)(h_act - g->peak_act_bytes) / (double)h_act : 0.0);
}

/* --run-pass PASS FILE.ir: the options are FILE's "flags:" line followed by the command line's (a flag given
 * again overrides the file's); the IR is read, the one pass run, verified with --verify, and printed */
static void run_one_pass(Options *o, int argc, char **argv)
{
    int fc;
    char **fv;
    ir_parse_flags(o->model, &fc, &fv);
    char **av = ir_alloc(sizeof(char *) * ((size_t)fc + (size_t)argc + 1));
    av[0] = argv[0];
    memcpy(av + 1, fv, sizeof(char *) * (size_t)fc);
    memcpy(av + 1 + fc, argv + 1, sizeof(char *) * (size_t)(argc - 1));
    memset(o, 0, sizeof *o);
    parse_args(o, fc + argc, av);
    Graph *g = ir_parse(o);
    int k = find_pass("--run-pass", o->run_pass);
    if (passes[k].run) /* (frontend: the reader is the frontend of IR text) */
        passes[k].run(g);
    o->dump_after = o->run_pass;
    after(g, o->run_pass);
}

/* The command line as a shell would take it back: arguments of plain characters as they are, others in single
 * quotes (the emitted main.c's header says how it was made) */
static const char *command_line(int argc, char **argv)
{
    size_t n = 1;
    for (int i = 0; i < argc; i++)
        n += 4 * strlen(argv[i]) + 3;
    char *s = ir_alloc(n), *p = s;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int plain = *a && a[strspn(a, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-+=.,:/@%")] == 0;
        p += sprintf(p, i ? " " : "");
        if (plain) {
            p += sprintf(p, "%s", a);
            continue;
        }
        *p++ = '\'';
        for (; *a; a++)
            p += *a == '\'' ? sprintf(p, "'\\''") : sprintf(p, "%c", *a);
        *p++ = '\'';
        *p = 0;
    }
    return s;
}

int main(int argc, char **argv)
{
    Options o = {0};
    parse_args(&o, argc, argv);
    o.cmdline = command_line(argc, argv);
    if (o.run_pass) {
        run_one_pass(&o, argc, argv);
        return 0;
    }
    if (o.calibrate) {
        check_calibrate(&o);
        cg_calibrate(o.out ? o.out : "calibrated.hw", o.world, o.cc);
        return 0;
    }
    CgHw hw;
    if (o.hw)
        cg_hw_load(o.hw, &hw);
    Graph *g = o.eval ? compile_eval(&o) : compile(&o);
    refuse_clobber(&o, g);
    if (o.report) { /* not with --eval */
        cg_report(stdout, g, o.world, o.hw ? &hw : NULL);
        compare_strategies(&o, g, o.hw ? &hw : NULL);
        if (o.recompute)
            compare_recompute(&o, g);
    }
    if (o.out)
        cg_build(g);
    return 0;
}
