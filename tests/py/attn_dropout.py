"""The fused attention of a model trained with attention dropout: the same training as the unfused graph.

usage: attn_dropout.py FSDPC WORKDIR

examples/gpt.py's GPT (2 layers, d 32, 2 heads, T 16) with dropout 0.1 (on the attention probabilities, as
Hugging Face GPT-2's attn_pdrop, and on the residuals), exported in training mode:
  - --dump-after attention: one FusedAttention per layer carrying attrs dropout (the Dropout's ratio) and stream
    (its Philox stream), and no Softmax and no attention Dropout left (the residual Dropouts stay);
  - trained 3 steps fused and with --no-fuse (Softmax, Dropout, MatMul as exported), SGD at lr 0.5: every loss
    within 1e-5 relative and every exported weight within 1e-5 absolute (the steps move them by up to 0.1; the
    attention's c_attn weights by more than 1e-3): the kernels draw each probability's keep flag as the Dropout node
    would (kernels/c/philox.h), so the two steps compute the same function.  (SGD, not AdamW: the key bias's
    gradient is 0 up to rounding, softmax being invariant to it, and Adam's normalisation turns that rounding into
    lr-sized steps of either sign);
  - the dropout acts: the losses differ from the same model exported with dropout 0;
  - --precision bf16 and fp16 (the 16-bit kernels, attn_bf16.c and attn.c's f16, with the same flags): fused with
    the dropout attrs, the losses within 5e-4 relative of float32's fused ones (measured 1e-5 and 5e-6);
  - --target cuda keeps the attention Dropout unfused (kernels/cuda/attn.cu has no dropout yet): no FusedAttention
    with a dropout attr, the Dropout still there.
Prints the losses.
"""
import os
import re
import shutil
import subprocess
import sys

import numpy as np

from common import check, mpirun, onnx_weights, read_metrics, run

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STEPS = 3


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    J = lambda *p: os.path.join(work, *p)
    for name, p in (("drop", "0.1"), ("nodrop", "0")):
        run([sys.executable, os.path.join(ROOT, "examples", "gpt.py"), J(name + ".onnx"), "--vocab", "64",
             "--dropout", p])
    np.random.default_rng(0).integers(0, 64, 16 * 48 + 1).astype("<u2").tofile(J("tokens.bin"))
    flags = ["--target", "cpu", "--loss", "cross_entropy:logits,labels", "--dim", "batch=4"]
    w0 = onnx_weights(J("drop.onnx"))

    ir = run([fsdpc, J("drop.onnx"), "--dump-after", "attention"] + flags).stdout
    fused = re.findall(r"= FusedAttention .*", ir)
    check(len(fused) == 2, "%d FusedAttention nodes, expected 2 (one a layer):\n%s" % (len(fused), ir))
    for f in fused:
        check(re.search(r" dropout=0\.1\d* stream=\d+ ", f), "FusedAttention without the dropout attrs: %s" % f)
    check(not re.search(r"= Softmax ", ir), "a Softmax is left after the attention pass")
    check(not re.search(r"= Dropout .*attn_dropout", ir), "an attention Dropout is left after the attention pass")
    check(len(re.findall(r"= Dropout ", ir)) == 5, "the embedding and residual Dropouts (5) are not all there")

    res = {}
    for tag, model, extra in (("fused", "drop", []), ("unfused", "drop", ["--no-fuse"]), ("nodrop", "nodrop", []),
                              ("bf16", "drop", ["--precision", "bf16"]), ("fp16", "drop", ["--precision", "fp16"])):
        exe = J(tag)
        out = run([fsdpc, J(model + ".onnx"), "-o", exe, "--verify", "--optimizer", "sgd", "--dump-after", "attention"]
                  + flags + extra).stdout
        if tag in ("bf16", "fp16"):
            check(len(re.findall(r"= FusedAttention .* dropout=0\.1", out)) == 2, "%s: the attentions are not fused "
                  "with their dropout" % tag)
        run(mpirun(1, [exe, "--tokens", J("tokens.bin"), "--steps", str(STEPS), "--lr", "0.5", "--quiet", "--metrics",
                       exe + ".jsonl", "--export-onnx", exe + ".onnx"]))
        losses = read_metrics(exe + ".jsonl")[0]
        check(len(losses) == STEPS, "%s: %d steps" % (tag, len(losses)))
        res[tag] = losses, onnx_weights(exe + ".onnx")
        print("%-8s losses %s" % (tag, " ".join("%.7f" % x for x in losses)))
    (lf, wf), (lu, wu), (ln, _) = res["fused"], res["unfused"], res["nodrop"]
    for a, b in zip(lf, lu):
        check(abs(a - b) <= 1e-5 * abs(b), "losses fused %s, unfused %s: not within 1e-5" % (lf, lu))
    check(wf.keys() == wu.keys(), "exported tensors differ")
    worst = 0.0
    for k in wf:
        a, b = wf[k].astype(np.float64), wu[k].astype(np.float64)
        err = float(np.max(np.abs(a - b))) if a.size else 0.0
        worst = max(worst, err)
        check(err <= 1e-5, "weight %s fused against unfused: max |difference| %.3g > 1e-5" % (k, err))
        if "c_attn.weight" in k:
            moved = float(np.max(np.abs(b - w0[k].astype(np.float64))))
            check(moved > 1e-3, "%s moved by %.3g only: the comparison says little" % (k, moved))
    check(all(a != b for a, b in zip(lf, ln)), "dropout 0.1 trains as dropout 0: %s vs %s" % (lf, ln))
    for tag in ("bf16", "fp16"):
        for a, b in zip(res[tag][0], lf):
            check(abs(a - b) <= 5e-4 * abs(b), "%s fused losses %s against float32's %s: not within 5e-4"
                  % (tag, res[tag][0], lf))
    print("fused = unfused within %.3g (weights, absolute); the dropout acts (dropout-0 losses %s)" % (worst, ln))

    # (--dump-after needs no CUDA toolkit)
    cu = subprocess.run([fsdpc, J("drop.onnx"), "--dump-after", "attention", "--target", "cuda", "--loss",
                         "cross_entropy:logits,labels", "--dim", "batch=4"], capture_output=True, text=True)
    check(cu.returncode == 0, "--target cuda --dump-after attention failed: %s" % cu.stderr)
    check(not re.search(r"= FusedAttention .* dropout=", cu.stdout), "--target cuda fused the attention dropout")
    check(len(re.findall(r"= Dropout .*attn_dropout", cu.stdout)) == 2, "--target cuda: the attention Dropouts "
          "are not kept unfused")
    print("attn_dropout: ok")


if __name__ == "__main__":
    main()
