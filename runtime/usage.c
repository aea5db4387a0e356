/* usage.c — the --help text of a training or forward-only (eval) executable:
 * its options (opts.c, args.c), the run files' form (runcfg.c), and the
 * model's inputs (and, for eval, outputs) as this build fixed them.
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "rt_priv.h"

static void usage_inputs(const RtModel *m)
{
    printf("\nModel inputs (one .npy each, N rows, or --tokens samples; b = rows per rank and step,\n"
           "so the global batch is b * ranks; at step s = 0, 1, ... rank r reads rows\n"
           "(s*b*ranks + r*b + i) mod N, i < b):\n");
    if (m->ninput == 0)
        printf("  (none)\n");
    for (int i = 0; i < m->ninput; i++) {
        const RtInput *in = &m->input[i];
        printf("  %-16s %s [", in->name, npy_dtype_name(in->dtype));
        for (int d = 0; d < in->rank && d < RT_MAX_RANK; d++) {
            if (d == 0)
                printf("N");
            else
                printf(", %" PRId64, in->shape[d]);
        }
        printf("]  (b = %" PRId64 ")\n", in->rank > 0 ? in->shape[0] : 0);
    }
    int ti, tl;
    char why[1024];
    if (rt_token_inputs(m, NULL, &ti, &tl, why, sizeof why) == 0)
        printf("--tokens feeds '%s' (tokens) and '%s' (labels: the tokens shifted by one) by default.\n",
               m->input[ti].name, m->input[tl].name);
}

/* the cuda target's flags (both kinds) */
static void usage_cuda(const RtModel *m)
{
    if (!m->target_cuda)
        return;
    printf("  --rendezvous SPEC       how the ranks find rank 0: file:PATH (a file every rank can\n"
           "                          read; rank 0 writes its address there), tcp:HOST:PORT (rank 0\n"
           "                          listens on PORT) or mpi (Open MPI's library, loaded at run\n"
           "                          time, broadcasts rank 0's address).  Default: MASTER_ADDR and\n"
           "                          MASTER_PORT, else under mpirun or srun mpi when libmpi.so.40\n"
           "                          loads ($FSDPC_MPI_LIB: another path, or none), else (mpirun,\n"
           "                          one node) a file in /tmp.  Ranks come from mpirun, srun, or\n"
           "                          RANK and WORLD_SIZE\n"
           "  --no-cuda-graph         run every step eagerly instead of replaying a CUDA Graph\n");
}

static void usage_fp16(const RtModel *m)
{
    if (!m->loss_scaling)
        return;
    printf("  --loss-scale-init S     built with --precision fp16: dynamic loss scaling starts at S\n"
           "                          (default 65536 = 2^16).  A step whose gradient overflows (a\n"
           "                          non-finite global norm, the same on every rank) is skipped and\n"
           "                          S halves; S doubles after N steps without one\n"
           "  --loss-scale-growth-interval N\n"
           "                          that N (default 2000)\n"
           "  --loss-scale S          a fixed loss scale instead (overflowing steps are still skipped)\n");
}

/* the form of --config files and run.toml (runcfg.c) */
static void usage_run_files(void)
{
    printf("\nRun files (--config FILE, and the run.toml of every checkpoint) are TOML: one line\n"
           "per option, its long name without '--' as the key ('_' or '-'), # comments:\n"
           "    steps = 1000                         # integers\n"
           "    lr = 3e-4                            # numbers\n"
           "    lr-schedule = \"cosine\"               # other values are \"strings\"\n"
           "    shuffle = true                       # switches: true or false\n"
           "    data = [\"x=x.npy\", \"target=t.npy\"]   # a repeatable flag: an array of strings\n"
           "Paths are relative to the working directory, as on the command line.  A key unknown,\n"
           "given twice or of the wrong type is an error naming FILE:LINE.  Precedence: the\n"
           "command line, then --config, then --resume's run.toml, then the defaults.\n");
}

static void eval_usage(const RtModel *m)
{
    printf("usage: %s --out-dir DIR --input NAME=FILE ... [options]\n"
           "Runs the forward pass of %s once (built by fsdpc --eval) and writes every graph\n"
           "output to DIR/NAME.npy.\n"
           "\n"
           "  --input NAME=FILE       model input NAME from FILE.npy, or FILE.pb (a serialized ONNX\n"
           "                          TensorProto); one per input, of its exact dtype and shape\n"
           "  --out-dir DIR           where the outputs go (created if missing); required\n"
           "  --init FILE             constants (default: this executable's path + .init)\n"
           "  --config FILE           these options from a TOML file (key = value; see a training\n"
           "                          executable's --help); the command line's flags override it\n"
           "  --quiet                 no progress lines\n"
           "  --help                  this text\n",
           rt_prog, m->name ? m->name : "the model");
    usage_cuda(m);
    printf("\nModel inputs:\n");
    char dims[256];
    if (m->ninput == 0)
        printf("  (none)\n");
    for (int i = 0; i < m->ninput; i++) {
        rt_dims_str(dims, sizeof dims, m->input[i].rank, m->input[i].shape, 0);
        printf("  %-16s %s %s\n", m->input[i].name, npy_dtype_name(m->input[i].dtype), dims);
    }
    printf("Model outputs:\n");
    if (m->noutput == 0 || !m->output)
        printf("  (none)\n");
    for (int i = 0; m->output && i < m->noutput; i++) {
        const RtOutput *out = &m->output[i];
        char *f = out->name ? rt_output_file_name(out->name) : NULL;
        rt_dims_str(dims, sizeof dims, out->rank, out->shape, 0);
        printf("  %-16s %s %s  -> DIR/%s\n", out->name ? out->name : "?", npy_dtype_name(out->dtype), dims,
               f ? f : "?");
        free(f);
    }
    fflush(stdout);
}

void rt_usage(const RtModel *m)
{
    if (m->eval) {
        eval_usage(m);
        return;
    }
    printf("usage: %s [options]            (one rank)\n"
           "       mpirun -np N %s [options]   (N ranks; or srun)\n"
           "Trains %s (built by fsdpc; optimizer %s).\n"
           "\n"
           "  --data NAME=FILE.npy    training data of model input NAME (one per input)\n"
           "  --tokens FILE.bin       a token stream (uint16 little-endian, as nanoGPT's train.bin;\n"
           "                          or llm.c's .bin with its 1024-byte header: version 1 uint16,\n"
           "                          version 2 uint32 tokens) feeding two int64\n"
           "                          [N, T] inputs: sample k is tokens [k*T, k*T+T) and its labels\n"
           "                          tokens [k*T+1, k*T+T+1); (ntokens-1)/T samples.  Other inputs\n"
           "                          still come from --data (with as many rows as samples)\n"
           "  --shuffle               each epoch visits the samples in its own order: a permutation of\n"
           "                          the N samples drawn from --seed and the epoch (a bijection, no\n"
           "                          table), the same at every world size; without it sample k of\n"
           "                          global position p is p mod N\n"
           "  --random-windows        --tokens: the window of global position p starts at a token\n"
           "                          drawn uniformly from [0, ntokens - T) by (--seed, p), as\n"
           "                          nanoGPT's get_batch (independent draws, the same at every world\n"
           "                          size; resumed runs continue the draws); validation keeps fixed\n"
           "                          windows\n"
           "  --seed S                seeds --shuffle, --random-windows and Dropout's masks (default 0:\n"
           "                          the build's dropout seed)\n"
           "  --token-inputs IN,LAB   the inputs --tokens feeds (default: the model's first int64\n"
           "                          [N, T] input and the other one, e.g. the labels input of\n"
           "                          --loss cross_entropy:logits,labels)\n"
           "  --val-data NAME=FILE.npy, --val-tokens FILE.bin\n"
           "                          held-out data, as --data / --tokens: the mean loss over it is\n"
           "                          computed every --eval-every K steps and after the last one,\n"
           "                          forward only (Dropout off, BatchNorm on its running statistics, as\n"
           "                          torch's eval mode; no optimizer state or statistic touched),\n"
           "                          sharded as training; the step line and --metrics get val_loss\n"
           "  --eval-every K          validate after every K-th step (default: after the last only)\n"
           "  --eval-steps N          batches per validation, from the set's start each time (default:\n"
           "                          one pass: its samples / the global batch, at least 1)\n"
           "  --save-best             keep the checkpoint of the best validation loss in --ckpt-dir's\n"
           "                          best/ (--resume DIR/best continues from it)\n"
           "  --steps N               optimizer steps (default 10)\n"
           "  --lr X                  learning rate (default 1e-3)\n"
           "  --weight-decay X        weight decay (default 0.01 for adamw, 0 for adam and sgd: PyTorch's);\n"
           "                          adamw decouples it (p -= lr*X*p), adam and sgd add X*p to the\n"
           "                          gradient\n"
           "  --no-decay PATTERN      the parameters weight decay skips: those whose ONNX name matches\n"
           "                          PATTERN (a glob; repeatable); default: every parameter of rank\n"
           "                          < 2 (biases, norm scales), as nanoGPT and Hugging Face do;\n"
           "                          --no-decay none: every parameter decays\n"
           "  --lr-mult PATTERN=X     the parameters whose ONNX name matches PATTERN (a glob;\n"
           "                          repeatable, the first match counts) train at X times the learning\n"
           "                          rate (and its schedule), as a PyTorch param group with lr*X\n"
           "  --momentum X            sgd momentum (default 0)\n"
           "  --nesterov              sgd: Nesterov momentum (torch.optim.SGD nesterov=True; needs\n"
           "                          --momentum > 0)\n"
           "  --beta1 X, --beta2 X    adamw/adam betas (default 0.9, 0.999)\n"
           "  --eps X                 adamw/adam epsilon (default 1e-8)\n"
           "  --clip-grad-norm X      scale the gradient to global L2 norm at most X before each\n"
           "                          update (torch.nn.utils.clip_grad_norm_; the norm over every\n"
           "                          rank's shard); metrics then report grad_norm (default: none)\n"
           "  --lr-schedule constant|cosine|linear|wsd\n"
           "                          every one: lr * s/W for steps s <= W (--warmup-steps W, default 0);\n"
           "                          then constant (the default): lr; cosine: cosine decay from lr to\n"
           "                          --min-lr X (default lr/10) at step --decay-steps D (default\n"
           "                          --steps), min-lr after it; linear: the same, linear; wsd\n"
           "                          (warmup-stable-decay): lr until D - K, then linear to min-lr at D\n"
           "                          (--wsd-decay-steps K, default (D - W)/5 rounded up)\n"
           "  --on-nonfinite stop|skip\n"
           "                          a step whose loss or gradient norm is not finite (NaN, inf) is\n"
           "                          never applied; stop (the default): the run stops there with an\n"
           "                          error, before any checkpoint or export of it; skip: the update is\n"
           "                          skipped (counted in the step line and --metrics) and training goes on\n"
           "  --metrics FILE.jsonl    rank 0 writes one JSON object per step\n"
           "  --trace FILE.json       a Chrome trace (chrome://tracing, Perfetto) of the first steps:\n"
           "                          every node of every rank, compute and collectives apart (cpu)\n"
           "  --trace-steps N         steps traced (default 2)\n"
           "  --accum K               gradient accumulation: each step runs K micro-steps of the batch\n"
           "                          this was built for and updates once: as a batch K times larger\n"
           "  --accum-mode comm|local comm (default): each micro-step's gradient is reduce-scattered into\n"
           "                          the gradient shards; local: summed in an unsharded gradient per unit\n"
           "                          (more memory), reduce-scattered once, after the last micro-step\n"
           "  --ckpt-dir DIR          sharded checkpoints DIR/step-NNNNNNNN (DIR/latest names the newest\n"
           "                          complete one) after every --ckpt-every K-th step and the last\n"
           "  --resume PATH           continue from a checkpoint (PATH, or a --ckpt-dir's latest): at\n"
           "                          its step + 1 up to --steps; any world size, --shard or layout of\n"
           "                          the same model.  Its run.toml restores the run's options (all but\n"
           "                          --config, --resume, --trace, --trace-steps, --dump-grads, --quiet\n"
           "                          and --rendezvous): --resume PATH alone goes on as the run would\n"
           "                          have, to the same --steps; a flag or --config given too overrides it\n"
           "  --config FILE           options from FILE (below); a flag on the command line overrides\n"
           "                          FILE's, wherever it stands\n"
           "  --export-onnx FILE.onnx write the trained model as ONNX at the end\n"
           "  --export-safetensors FILE\n"
           "                          write the trained parameters (and BatchNorm statistics) as\n"
           "                          safetensors at the end, named as the model's initializers\n"
           "  --init FILE             initial weights (default: this executable's path + .init)\n"
           "  --dump-grads DIR        after step 1, write the gradient of every parameter (averaged\n"
           "                          over the global batch, before the optimizer) to DIR/NAME.npy\n"
           "                          (rank 0; NAME sanitised as in --eval outputs; DIR is created)\n"
           "  --log-every N           print the step line of step 1, every N-th step and the\n"
           "                          last step (default 1: every step; --metrics gets all): loss, lr,\n"
           "                          grad norm (when computed), step time, tokens/s (or samples/s) over\n"
           "                          all ranks, TFLOPS and MFU per rank, peak memory, ETA\n"
           "  --peak-tflops X         the per-rank peak MFU is computed against (default: measured once\n"
           "                          at start on cpu, a float32 GEMM on this rank's BLAS threads over\n"
           "                          their CPU time, flagged untrusted on a busy machine; cuda: no MFU\n"
           "                          unless given)\n"
           "  --quiet                 no per-step lines\n"
           "  --help                  this text\n"
           "A switch also takes =true or =false (--shuffle=false undoes a run file's shuffle = true).\n",
           rt_prog, rt_prog, m->name ? m->name : "the model", rt_opt_name(m->optimizer));
    usage_cuda(m);
    usage_fp16(m);
    usage_run_files();
    usage_inputs(m);
    fflush(stdout);
}
