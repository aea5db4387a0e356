"""The executable's --tokens feed and --dump-grads, against NumPy.

usage: tokens_grads.py FSDPC WORKDIR

Model: logits[b, T, V] = x[b, T, C] @ W, loss cross_entropy:logits,labels, and an
int64 input `ids` [b, T] that nothing consumes (the op set may not read int64
yet).  A token stream (raw uint16, and with llm.c's 1024-byte header: version 1
uint16, version 2 uint32) feeds `ids` and `labels` at world 1 and 2 with --lr 0, x from --data; every step's
loss must equal NumPy's cross-entropy of the expected samples (sample k = tokens
[kT, kT+T), labels shifted by one; step s takes samples (s*B + j) mod N, rank r
the r-th slice), once with the default inputs (labels = the shifted window) and
once with --token-inputs labels,ids (labels = the unshifted window).  Step 1's
gradient of W from --dump-grads (shape [C, V]) must equal NumPy's.  Then the
bad cases: one error line each; among them x.npy and the token file
truncated to 0 bytes while a long run reads them (after its step 1): one
line naming the file, exit 1, never SIGBUS.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from common import check, mpirun, run

T, C, V, N, STEPS = 5, 8, 11, 7, 6


def ce(x, W, lab):
    z = x.astype(np.float64) @ W
    z = z - z.max(-1, keepdims=True)
    lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    loss = -np.take_along_axis(lp, lab[..., None].astype(np.int64), -1).mean()
    g = (np.exp(lp) - np.eye(V)[lab]) / lab.size
    return loss, np.einsum("btc,btv->cv", x.astype(np.float64), g)


def shrinks(cmd, victim):
    """cmd's exit status and stderr when victim is truncated to 0 bytes after its step 1 (a hang fails)"""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for line in p.stdout:
        if line.startswith("step 1/"):
            break
    os.truncate(victim, 0)
    try:
        _, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        return "none within 120 s", p.communicate()[1]
    return p.returncode, err


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    J = lambda *p: os.path.join(work, *p)
    rng = np.random.default_rng(1)
    W = (rng.standard_normal((C, V)) * 0.5).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["logits"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", T, C]),
                           helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", T])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", T, V])],
                          [numpy_helper.from_array(W, "W")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), J("m.onnx"))
    toks = rng.integers(0, V, N * T + 1 + 2).astype("<u2")  # 2 tokens short of another sample
    toks.tofile(J("tok.bin"))
    hdr = np.zeros(256, "<i4")
    hdr[:3] = (20240520, 1, len(toks))
    with open(J("llmc.bin"), "wb") as f:
        f.write(hdr.tobytes() + toks.tobytes())
    hdr[1] = 2  # llm.c's version 2: uint32 tokens
    with open(J("llmc_u32.bin"), "wb") as f:
        f.write(hdr.tobytes() + toks.astype("<u4").tobytes())
    x = rng.standard_normal((N, T, C)).astype(np.float32)
    np.save(J("x.npy"), x)

    exes = {}
    for world, b in ((1, 3), (2, 2)):
        exes[world] = J("train_w%d" % world)
        run([fsdpc, J("m.onnx"), "-o", exes[world], "--target", "cpu", "--loss", "cross_entropy:logits,labels",
             "--dim", "batch=%d" % b, "--verify"])
        B = b * world
        for tokfile in ("tok.bin", "llmc.bin", "llmc_u32.bin"):
            for spec in (None, "labels,ids"):
                metrics, dump = J("m.jsonl"), J("grads")
                cmd = [exes[world], "--tokens", J(tokfile), "--data", "x=" + J("x.npy"), "--steps", str(STEPS),
                       "--lr", "0", "--metrics", metrics, "--dump-grads", dump]
                if spec:
                    cmd += ["--token-inputs", spec]
                p = run(mpirun(world, cmd))
                check("samples of T+1 = %d" % (T + 1) in p.stdout, "no --tokens line: " + p.stdout)
                losses = [json.loads(l)["loss"] for l in open(metrics) if '"step"' in l]
                check(len(losses) == STEPS, "%d losses" % len(losses))
                shift = 0 if spec else 1
                for s in range(STEPS):
                    ks = [(s * B + j) % N for j in range(B)]
                    lab = np.stack([toks[k * T + shift: k * T + shift + T] for k in ks])
                    ref, gW = ce(x[ks], W.astype(np.float64), lab)
                    check(abs(losses[s] - ref) <= 1e-5 * ref, "world %d %s %s step %d: loss %.9g, NumPy %.9g"
                          % (world, tokfile, spec, s + 1, losses[s], ref))
                    if s == 0:
                        got = np.load(os.path.join(dump, "W.npy"))
                        check(got.shape == (C, V) and got.dtype == np.float32, "W.npy: %s %s" % (got.dtype, got.shape))
                        e = np.abs(got - gW).max() / np.abs(gW).max()
                        check(e <= 1e-5, "world %d: dumped gradient of W off by %.3g" % (world, e))
                print("ok  world %d --tokens %s %s: %d losses and the step-1 gradient" % (world, tokfile,
                      "--token-inputs " + spec if spec else "(default inputs)", STEPS))

    # bad cases: one line, exit 1 or 2
    with open(J("odd.bin"), "wb") as f:
        f.write(toks.tobytes()[:37])
    with open(J("short.bin"), "wb") as f:
        f.write(toks.tobytes()[:10])
    hdr[1] = 3
    with open(J("llmc3.bin"), "wb") as f:
        f.write(hdr.tobytes() + toks.tobytes())
    hdr[1] = 2  # uint32 tokens, but the file holds uint16's bytes
    with open(J("llmc2_short.bin"), "wb") as f:
        f.write(hdr.tobytes() + toks.tobytes())
    np.save(J("x6.npy"), x[:6])
    open(J("afile"), "w").close()
    exe, xd = exes[1], "x=" + J("x.npy")
    cases = [
        ([exe, "--tokens", J("odd.bin"), "--data", xd], "odd number"),
        ([exe, "--tokens", J("short.bin"), "--data", xd], "needs at least 6"),
        ([exe, "--tokens", J("llmc3.bin"), "--data", xd], "version 3"),
        ([exe, "--tokens", J("llmc2_short.bin"), "--data", xd], "uint32 tokens"),
        ([exe, "--tokens", J("nope.bin"), "--data", xd], "nope.bin"),
        ([exe, "--tokens", J("tok.bin")], "no data for model input 'x'"),
        ([exe, "--tokens", J("tok.bin"), "--data", xd, "--data", "ids=" + J("x.npy")], "fed by --tokens"),
        ([exe, "--tokens", J("tok.bin"), "--data", "x=" + J("x6.npy")], "must agree"),
        ([exe, "--token-inputs", "ids,labels", "--data", xd], "--tokens FILE.bin, which is missing"),
        ([exe, "--tokens", J("tok.bin"), "--token-inputs", "ids", "--data", xd], "INPUT,LABELS"),
        ([exe, "--tokens", J("tok.bin"), "--token-inputs", "ids,x", "--data", xd], "input 'x' is float32"),
        ([exe, "--tokens", J("tok.bin"), "--token-inputs", "ids,nope", "--data", xd], "no input 'nope'"),
        ([exe, "--tokens", J("tok.bin"), "--data", xd, "--dump-grads", J("afile")], "not a directory"),
        ([exe, "--tokens", J("tok.bin"), "--data", xd, "--dump-grads", J("g"), "--steps", "0"], "--steps 0"),
    ]
    bad = []
    for cmd, needle in cases:
        p = run(cmd, check=False)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        if p.returncode not in (1, 2) or len(lines) != 1 or needle not in p.stderr:
            bad.append("%s: exit %d, stderr %r (wanted one line with %r)" % (" ".join(cmd[1:]), p.returncode,
                                                                           p.stderr[-400:], needle))
        else:
            print("ok  %-40s -> %s" % (needle, lines[0][:120]))
    # a data file that shrinks under the run (truncated once step 1 is done): one line naming it, exit 1, no SIGBUS
    for victim in ("x.npy", "tok.bin"):
        shutil.copy(J(victim), J("shrink_" + victim))
        cmd = [exe, "--tokens", J("shrink_tok.bin" if victim == "tok.bin" else "tok.bin"),
               "--data", "x=" + J("shrink_x.npy" if victim == "x.npy" else "x.npy"), "--steps", "100000000"]
        rc, err = shrinks(cmd, J("shrink_" + victim))
        lines = [l for l in err.splitlines() if l.strip()]
        if rc != 1 or len(lines) != 1 or "shrink_%s: the file shrank while the run read it" % victim not in err:
            bad.append("%s truncated under the run: exit %s, stderr %r" % (victim, rc, err[-400:]))
        else:
            print("ok  %-40s -> %s" % (victim + " truncated under the run", lines[0][:120]))
    # ranks reading different token files
    toks2 = toks.copy()
    toks2[3] ^= 1
    toks2.tofile(J("tok2.bin"))
    p = run(["mpirun", "--allow-run-as-root", "-np", "1", exes[2], "--tokens", J("tok.bin"), "--data", xd, ":",
             "-np", "1", exes[2], "--tokens", J("tok2.bin"), "--data", xd], check=False)
    if p.returncode == 0 or "differs from rank 0's" not in p.stderr:
        bad.append("different token files per rank: exit %d, %s" % (p.returncode, p.stderr[-400:]))
    else:
        print("ok  ranks with different token files refused")
    check(not bad, "\n".join(bad))
    print("OK tokens_grads")


if __name__ == "__main__":
    main()
