"""The model zoo (tests/zoo/, written by tests/zoo/generate.py with torch 2.15): every committed export compiles
unmodified and trains as PyTorch did.

usage: zoo.py FSDPC WORKDIR [NAME ...]

For each model and exporter (dynamo, torchscript): the parameters' external data file is written again from
ref.json's recipe (param_values, NumPy only), then fsdpc compiles the committed ONNX file as it is (--target cpu
--loss cross_entropy:logits,labels --optimizer adamw --wrap size:2000 --verify) and the executable trains 3
AdamW steps at world 2 under mpirun on the committed batch; the 3 losses within 1e-4 (relative) of PyTorch's,
and every parameter's final values (at ref.json's positions, and its L2 norm) within 1e-4 of its max |w|.  The
--export-safetensors file holds no non-persistent buffer (the export's metadata: export_torch.py records them, as
a rotary embedding's inv_freq) and its header names those it left out; it holds each tied parameter under every
name the metadata records (GPT-2's lm_head.weight beside transformer.wte.weight).  Each model's package versions
(ref.json's "versions") are printed.
Each compile's attentions are fused as FUSED says (FusedAttention nodes after the attention pass, both exports; 0
where a model is not listed): nanoGPT, GPT-2, Llama, opset 23's Attention (llama_sdpa23), the Llama as Hugging
Face builds it by default (llama_sdpa: torch's decomposition of scaled_dot_product_attention at the exporter's
default opset, its causal mask of finfo.min one per batch row: fused with causal=1, no mask tensor), BERT and both
ViTs 2, T5 all 6 (their learned relative-position bias gets its gradient from the fused op), Falcon 2.  The
grouped-query and multi-query ones (GQA: Llama's repeat_kv, Falcon's MatMuls broadcast over the heads) read their
K/V heads in place: no Expand is left after fuse, in float32 and under --precision bf16 (compiled once more, not
trained).
On the HF Llama and GPT-2 (where they compile) also --shard full, grad_op and hybrid:2 at world 4 (per-rank
batch 2 over the 4-sample file: ranks 2-3 repeat ranks 0-1's samples, the same mean) and --wrap blocks at world 2.
The decoders (nanoGPT, GPT-2, Llama, Llama with SDPA at opset 23 and at the default opset, Falcon) also train their dynamo export under --precision bf16
against PyTorch's torch.autocast(bfloat16) trajectory (ref.json's "bf16", generate.py --bf16): the losses and
each parameter's update within the BF16_* tolerances below, the attentions fused as in float32.

BLOCKED lists the exports fsdpc refuses today with its exact error line (or the exporter's own failure, from
ref.json): such an export must still fail with that line; one that compiles fails the test until it is moved
out of BLOCKED (and must then train as PyTorch).  Nothing is skipped silently: the test prints each case.
"""
import json
import os
import re
import shutil
import sys

import numpy as np

from common import check, mpirun, read_metrics, run, tidy

HERE = os.path.dirname(os.path.abspath(__file__))
ZOO = os.path.join(HERE, "..", "zoo")
GLOBAL_B, STEPS, WORLD = 4, 3, 2
ADAMW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}
TOL = 1e-4
STRATEGY_MODELS = ("llama", "gpt2")
# --precision bf16 against PyTorch's torch.autocast(bfloat16) trajectory (ref.json's "bf16": the decoders, the
# dynamo export): both keep float32 master weights and round activations to bf16, but not at the same places, so
# the weights agree in their updates, not to the bit: each parameter's update (final - initial, at the sampled
# positions) within cosine BF16_COS of PyTorch's and within BF16_NORM of its size, all parameters' together within
# BF16_COS_ALL; the losses within BF16_LOSS_TOL (PyTorch's own bf16 moves them 1e-6 to 3e-5 from its float32)
BF16_LOSS_TOL, BF16_COS, BF16_NORM, BF16_COS_ALL = 2e-4, 0.95, 0.1, 0.99
# Attention's key bias: its exact gradient is 0 (adding q.b_k to every score of a query leaves the softmax
# unchanged), so both implementations compute rounding noise (~1e-9) there, and AdamW turns any noise into steps
# of about lr: its final values are noise in PyTorch as in fsdpc. Those elements (the key third of a packed
# in_proj_bias) are checked to have moved at most STEPS * lr, not against PyTorch's; the rest of the parameter
# is compared as usual, and its norm is not (it includes them).
KEY_BIAS = {"k_proj.bias": (0, 1), "in_proj_bias": (1, 3), "c_attn.bias": (1, 3)}  # suffix -> (k, parts): part k

# model -> its FusedAttention nodes (passes/attention.c), either export
FUSED = {"nanogpt": 2, "gpt2": 2, "llama": 2, "whisper_enc": 2, "llama_sdpa23": 2, "bert": 2, "hf_vit": 2, "tv_vit": 2, "t5": 6,
         "falcon": 2, "llama_sdpa": 2}
# model -> its FusedAttention nodes that compute the causal band themselves (causal=1: no mask tensor)
CAUSAL = {"llama_sdpa": 2}
# model -> its FusedAttention nodes that read q, k, v and write y in the projections'
# [B, T, H, dh] (heads: no head Transpose copies; passes/attention.c heads_views); 0 where not listed.  Not the
# Llamas (rotary embeddings between the projections' Transposes and the products), Falcon, torchvision's ViT
HEADS = {"nanogpt": 2, "gpt2": 2, "bert": 2, "hf_vit": 2, "t5": 6, "whisper_enc": 2}
# model -> its Gelu nodes, either export: the exporters' own (opset 20) and GPT-2's gelu_new, a tanh composition
# passes/gelu.c rewrites (no Tanh left)
GELU = {"nanogpt": 2, "gpt2": 2, "whisper_enc": 4, "bert": 3, "hf_vit": 2, "tv_vit": 2, "falcon": 2}
# models whose attention has fewer K/V heads than query heads (FusedAttention's kvrep > 1, no Expand left)
GQA = ("llama", "llama_sdpa23", "falcon", "llama_sdpa")

# (model, exporter) -> the first line fsdpc prints when it refuses the export ("export: ..." when the exporter
# itself failed in generate.py)
BLOCKED = {("llama_sdpa23", "torchscript"):
           "export: AssertionError: conversion of scaled_dot_product_attention not implemented if enable_gqa is True",
           ("llama_sdpa", "torchscript"):
           "export: AssertionError: conversion of scaled_dot_product_attention not implemented if enable_gqa is True"}


def param_values(seed, index, shape, mean, std, dtype):
    """a parameter's initial value: normal(mean, std) from NumPy's PCG64 seeded by (model seed, parameter
    index), drawn in float64 and rounded to dtype (generate.py sets the PyTorch module's parameters to it)"""
    rng = np.random.default_rng([seed, index])
    return (mean + std * rng.standard_normal(tuple(shape))).astype(dtype)


def adamw_flags():
    # the committed trajectories (tests/zoo/generate.py) decay every parameter: --no-decay none
    return ["--lr", repr(ADAMW["lr"]), "--beta1", repr(ADAMW["beta1"]), "--beta2", repr(ADAMW["beta2"]),
            "--eps", repr(ADAMW["eps"]), "--weight-decay", repr(ADAMW["weight_decay"]), "--no-decay", "none"]


def read_safetensors(path):
    """(name -> array, the header's __metadata__)"""
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    head = json.loads(raw[8:8 + n])
    meta = head.pop("__metadata__", {})
    dt = {"F32": np.float32, "F64": np.float64}
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                             dt[v["dtype"]]).reshape(v["shape"]) for k, v in head.items()}, meta


def check_state_dict(tag, exp, w, meta):
    """the --export-safetensors file is the module's state_dict: the non-persistent buffers the export's metadata
    records (ref.json, from export_torch.py) left out and named in the header's left_out; each other name of a
    tied parameter it records held too, equal to the initializer's tensor"""
    np_bufs = exp.get("non_persistent", [])
    kept = [n for n in np_bufs if n in w]
    left = meta.get("left_out", "").split(",") if meta.get("left_out") else []
    check(not kept and sorted(left) == sorted(np_bufs),
          "%s: non-persistent buffers %s: %s in the safetensors file, its header's left_out %s"
          % (tag, np_bufs, kept, left))
    for alias, init in exp.get("tied", {}).items():
        check(alias in w and init in w and np.array_equal(w[alias], w[init]),
              "%s: tied %s (initializer %s): %s in the safetensors file" % (tag, alias, init,
                                                                       "differs" if alias in w else "not"))


def stage(ref, exp, src, dst):
    """the committed ONNX file copied to dst, its parameters' data file written beside it"""
    os.makedirs(dst, exist_ok=True)
    path = os.path.join(dst, exp["file"])
    shutil.copyfile(os.path.join(src, exp["file"]), path)
    data = bytearray()
    for e in exp["table"]:
        r = ref["params"][e["param"]]
        raw = param_values(ref["seed"], r["index"], r["shape"], r["mean"], r["std"], ref["dtype"]).tobytes()
        check(len(raw) == e["length"], "%s: %s: %d bytes, the table says %d" % (path, e["init"], len(raw),
                                                                                e["length"]))
        data += b"\0" * (e["offset"] - len(data)) + raw
    with open(path + ".params", "wb") as f:
        f.write(bytes(data))
    return path


def first_error(p, where):
    """the first error line, the work directory's path and the list of supported ops cut out"""
    lines = [ln for ln in (p.stderr + p.stdout).splitlines() if ln.strip()]
    errs = [ln for ln in lines if "error" in ln.lower()]
    line = (errs or lines or ["(no output, exit %d)" % p.returncode])[0].strip()
    return line.replace(where + os.sep, "").split("; fsdpc supports:")[0]


def check_gqa(tag, onnx_path):
    """a GQA model's attentions fused with their K/V read in place (kvrep), no Expand after fuse, in float32 and
    under --precision bf16"""
    want = FUSED[os.path.basename(os.path.dirname(onnx_path))]
    for prec in ("fp32", "bf16"):
        out = run([os.environ["FSDPC"], onnx_path, "-o", onnx_path + ".gqa", "--target", "cpu", "--loss",
                   "cross_entropy:logits,labels", "--precision", prec, "--dump-after", "fuse"]).stdout
        fused = re.findall(r"= FusedAttention .* kvrep=(\d+)", out)
        check(len(fused) == want and out.count("= FusedAttentionGrad ") == want and "= Expand " not in out,
              "%s --precision %s: %d of %d attentions fused with kvrep, %d Expand left" % (tag, prec, len(fused), want,
                                                                                       out.count("= Expand ")))
    print("%s: %d attentions fused with their K/V heads read in place (kvrep %s), no Expand (fp32, bf16)"
          % (tag, want, fused[0]))


def train(tag, ref, onnx_path, src, exe, world, extra=(), bf16=False):
    """compile onnx_path with extra flags, run STEPS at world; compare with ref (ref["bf16"]'s trajectory and the
    bf16 tolerances when bf16); returns None or the compiler's first error line"""
    # parameters PyTorch does not train (requires_grad False: Whisper's sinusoidal positions) are given --freeze,
    # as scripts/export_torch.py tells a user to
    table = ref["exports"][os.path.basename(onnx_path).split(".")[0]]["table"]
    freeze = [e["init"] for e in table if e["param"] in ref.get("frozen", [])]
    p = run([os.environ["FSDPC"], onnx_path, "-o", exe, "--target", "cpu", "--loss",
             "cross_entropy:logits,labels", "--optimizer", "adamw", "--verify"]
            + ([] if "--wrap" in extra else ["--wrap", "size:2000"]) + list(extra) + ["--dump-after", "units"]
            + [a for f in freeze for a in ("--freeze", f)], check=False, timeout=1800)
    if p.returncode != 0:
        return first_error(p, os.path.dirname(onnx_path))
    fused, want = p.stdout.count("= FusedAttention "), FUSED.get(os.path.basename(os.path.dirname(onnx_path)), 0)
    check(fused == want, "%s: %d attentions fused, expected %d" % (tag, fused, want))
    causal, want = (len(re.findall(r"= FusedAttention [^\n]* causal=1", p.stdout)),
                    CAUSAL.get(os.path.basename(os.path.dirname(onnx_path)), -1))
    check(want < 0 or causal == want, "%s: %d attentions with the causal band computed, expected %d"
          % (tag, causal, want))
    model = os.path.basename(os.path.dirname(onnx_path))
    heads, want = len(re.findall(r"= FusedAttention [^\n]* heads=\d+", p.stdout)), HEADS.get(model, 0)
    check(heads == want, "%s: %d attentions read in the projections' layout (heads), expected %d"
          % (tag, heads, want))
    gelus, want = p.stdout.count("= Gelu "), GELU.get(os.path.basename(os.path.dirname(onnx_path)), 0)
    check(gelus == want and (not want or "= Tanh " not in p.stdout), "%s: %d Gelu nodes, expected %d%s"
          % (tag, gelus, want, ", and a Tanh left" if "= Tanh " in p.stdout else ""))
    # what fsdpc trains: exactly the module's parameters (a buffer on a path to the loss would be trained too)
    trained = re.findall(r'^\s+%\d+ \S+ param "((?:[^"\\]|\\.)*)"', p.stdout, re.M)
    extra_trained = sorted(set(trained) - {e["init"] for e in table})
    if extra_trained:
        return "trains initializers that are not parameters: " + ", ".join(extra_trained)
    check(len(trained) == len(table) - len(freeze), "%s: fsdpc trains %d initializers, the module has %d "
          "parameters, %d of them frozen" % (tag, len(trained), len(table), len(freeze)))
    data = []
    for name in ref["inputs"] + ["labels"]:
        data += ["--data", "%s=%s" % (name, os.path.join(src, name + ".npy"))]
    metrics, st = exe + ".jsonl", exe + ".safetensors"
    run(mpirun(world, [exe] + data + ["--steps", str(STEPS), "--metrics", metrics, "--export-safetensors", st,
                                      "--quiet"] + adamw_flags()), timeout=1800)
    losses, _ = read_metrics(metrics)
    check(len(losses) == STEPS, "%s: %d losses" % (tag, len(losses)))
    want = ref["bf16"] if bf16 else ref
    worst_l = max(abs(a - b) / abs(b) for a, b in zip(losses, want["losses"]))
    check(worst_l <= (BF16_LOSS_TOL if bf16 else TOL), "%s: losses %s, PyTorch %s (rel %.3g)"
          % (tag, losses, want["losses"], worst_l))
    w, meta = read_safetensors(st)
    check_state_dict(tag, ref["exports"][os.path.basename(onnx_path).split(".")[0]], w, meta)
    worst_w, seen, ups = (0.0, ""), set(), ([], [])
    for e in table:
        f = want["final"][e["param"]]
        check(e["init"] in w, "%s: %s (parameter %s) not exported" % (tag, e["init"], e["param"]))
        a = w[e["init"]].astype(np.float64).ravel()
        idx, vals = np.array(f["idx"]), np.array(f["vals"])
        r = ref["params"][e["param"]]
        a0 = param_values(ref["seed"], r["index"], r["shape"], r["mean"], r["std"], ref["dtype"]).astype(
            np.float64).ravel()
        key = [kp for s, kp in KEY_BIAS.items() if e["param"].endswith(s)]
        if key:
            k, parts = key[0]
            lo, hi = k * a.size // parts, (k + 1) * a.size // parts
            noise = (idx >= lo) & (idx < hi)
            moved = float(np.max(np.abs(a[lo:hi] - a0[lo:hi]))) if hi > lo else 0.0
            check(moved <= STEPS * ADAMW["lr"] * 1.05, "%s: the key bias %s moved by %.3g, more than AdamW's "
                  "%d steps of lr can" % (tag, e["param"], moved, STEPS))
            idx, vals = idx[~noise], vals[~noise]
        seen.add(e["param"])
        if bf16:  # the updates' direction (cosine) and size at the sampled positions
            du, dt = a[idx] - a0[idx], vals - a0[idx]
            nu, nt = float(np.linalg.norm(du)), float(np.linalg.norm(dt))
            cos = float(du @ dt) / (nu * nt) if nu * nt > 0 else float(nu == nt)
            ratio = nu / nt if nt > 0 else float(nu == 0)
            ups[0].append(du)
            ups[1].append(dt)
            worst_w = max(worst_w, (1 - cos, e["param"]))
            check(cos >= BF16_COS and abs(ratio - 1) <= BF16_NORM, "%s: %s's update (initializer %s) has cosine "
                  "%.4f with PyTorch's and %.3fx its size" % (tag, e["param"], e["init"], cos, ratio))
            continue
        err = float(np.max(np.abs(a[idx] - vals))) if idx.size else 0.0
        if not key:
            err = max(err, abs(float(np.linalg.norm(a)) - f["norm"]))
        err /= max(f["absmax"], 1e-30)
        worst_w = max(worst_w, (err, e["param"]))
        check(err <= TOL, "%s: final %s (initializer %s) differs from PyTorch's by %.3g of max |w|"
              % (tag, e["param"], e["init"], err))
    missing = sorted(set(want["final"]) - seen)
    check(not missing, "%s: parameters not in the ONNX file as initializers: %s" % (tag, missing[:8]))
    if bf16:
        du, dt = np.concatenate(ups[0]), np.concatenate(ups[1])
        cos = float(du @ dt) / float(np.linalg.norm(du) * np.linalg.norm(dt))
        check(cos >= BF16_COS_ALL, "%s: the updates of all parameters have cosine %.5f with PyTorch's" % (tag, cos))
        print("%s: trains as PyTorch's autocast bf16: %d losses within %.2g, the updates of %d parameters at "
              "cosine %.5f with PyTorch's (the least %.4f: %s); %d attentions fused"
              % (tag, STEPS, worst_l, len(seen), cos, 1 - worst_w[0], worst_w[1], fused))
        return None
    print("%s: trains as PyTorch: %d losses within %.2g, %d parameters' final weights within %.2g (%s); %d "
          "attentions fused" % (tag, STEPS, worst_l, len(seen), worst_w[0], worst_w[1], fused))
    return None


def main():
    os.environ["FSDPC"] = os.path.abspath(sys.argv[1])
    work = sys.argv[2]
    names = sys.argv[3:] or sorted(d for d in os.listdir(ZOO) if os.path.isfile(os.path.join(ZOO, d, "ref.json")))
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    trained, blocked, failures = [], [], []
    for name in names:
        nfail = len(failures)
        src = os.path.join(ZOO, name)
        with open(os.path.join(src, "ref.json")) as f:
            ref = json.load(f)
        print("%s: generated with %s" % (name, ", ".join("%s %s" % kv for kv in sorted(ref.get("versions", {}).items()))
                                         or "(no versions recorded)"))
        for exporter in ("dynamo", "torchscript"):
            tag = "%s/%s" % (name, exporter)
            exp = ref["exports"][exporter]
            want = BLOCKED.get((name, exporter))
            if "export_error" in exp:
                got = "export: " + exp["export_error"]
            else:
                path = stage(ref, exp, src, os.path.join(work, name))
                try:
                    got = train(tag, ref, path, src, os.path.join(work, name, exporter), WORLD)
                except SystemExit as e:  # compiled, but trains otherwise than PyTorch: a failure, go on
                    print(e)
                    failures.append(str(e))
                    continue
            if got is None:
                trained.append(tag)
                if name in GQA:
                    check_gqa(tag, path)
                if "bf16" in ref and exporter == "dynamo":
                    err = train(tag + " --precision bf16", ref, path, src, os.path.join(work, name, exporter + "_bf16"),
                                WORLD, ["--precision", "bf16"], bf16=True)
                    check(err is None, "%s --precision bf16: %s" % (tag, err))
                if want is not None:
                    failures.append("%s compiles and trains now: move it out of BLOCKED (was: %s)" % (tag, want))
                if name in STRATEGY_MODELS:
                    for strategy in ("full", "grad_op", "hybrid:2"):
                        err = train("%s --shard %s world 4" % (tag, strategy), ref, path, src,
                              os.path.join(work, name, "%s_%s" % (exporter, strategy.replace(":", ""))), 4,
                              ["--shard", strategy])
                        check(err is None, "%s --shard %s: %s" % (tag, strategy, err))
                    err = train("%s --wrap blocks world 2" % tag, ref, path, src,
                          os.path.join(work, name, exporter + "_blocks"), WORLD, ["--wrap", "blocks"])
                    check(err is None, "%s --wrap blocks: %s" % (tag, err))
                continue
            blocked.append(tag)
            print("%s: BLOCKED: %s" % (tag, got))
            if want is None:
                failures.append("%s is blocked, not listed in BLOCKED: %s" % (tag, got))
            elif got != want:
                failures.append("%s: blocked by another error now: %s (BLOCKED says: %s)" % (tag, got, want))
        if len(failures) == nfail:
            tidy(os.path.join(work, name))  # this model's files, all checked
    print("trained as PyTorch: %d (%s); blocked: %d (%s)" % (len(trained), " ".join(trained), len(blocked),
                                                              " ".join(blocked)))
    check(not failures, "\n".join(failures))
    print("OK zoo")


if __name__ == "__main__":
    main()
