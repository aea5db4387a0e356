"""Compiling without the weights: memory bounded by the graph, weights streamed into OUT.init.

usage: weightless.py FSDPC WORKDIR [--no-rss]

Models from scripts/shaped_model.py (a nanoGPT-shaped transformer, every initializer external data in one file:
--mask buffer, nanoGPT's float mask buffer among them).

(a) A GPT-3-175B-shaped model (96 layers, d 12288, 96 heads, T 2048, vocab 50257, batch 1) whose data file does not
    exist: `--report --world 512 --target cuda --precision bf16 --recompute units --wrap blocks` succeeds within
    60 s, its peak RSS (a fresh child's RUSAGE_CHILDREN) is below 300 MB, and its parameter count equals the one
    computed from the shapes; `--dump-after units` works too; with -o it is one line naming the initializer and the
    missing file, exit 1, nothing written; a data file too short is one line naming it, with --report too.  Bytes
    a pass needs are read when it needs them: Clip's external float bounds (fold), and without their file that
    is one line naming the initializer.
(b) A small model with random data, compiled from the external data and saved inline (onnx.save): the two OUT.init
    files hold the same bytes in their parameter units and constants, equal to the initializers' (the generated
    C's tables say where), and both executables train 3 AdamW steps to identical losses.
(c) A model of ~1 GB of sparse (zero) external data compiled with -o: fsdpc's own peak RSS (its VmHWM) stays below
    150 MB, whatever the weights' size, and with the C compiler it ran below the largest tensor + 150 MB; OUT.init
    is as large as its header says, holds every tensor, the table of their checksums and at most 64 bytes of
    padding per piece, and its
    parameters are the data file's (zeros) around the mask's ones.
With --no-rss (the sanitizer build) the memory bounds are not checked.
"""
import os
import re
import subprocess
import sys
import time

import numpy as np

from common import check, read_metrics, run

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import shaped_model  # noqa: E402

MB = 1e6


def shaped(path, layers, embd, heads, block, batch, vocab, data):
    run([sys.executable, os.path.join(HERE, "..", "..", "scripts", "shaped_model.py"), path, "--layers", str(layers),
         "--embd", str(embd), "--heads", str(heads), "--block", str(block), "--batch", str(batch), "--vocab",
         str(vocab), "--mask", "buffer"] + (["--data", data] if data else ["--no-data"]))


def measured(cmd):
    """cmd run in a fresh child: (returncode, stdout, stderr, wall s, the child's own peak RSS (VmHWM, polled) in
    bytes, the peak RSS of it and its children (RUSAGE_CHILDREN) in bytes)"""
    probe = r'''
import os, resource, subprocess, sys, time
p = subprocess.Popen(sys.argv[1:], stdout=open(os.environ["OUT"], "w"), stderr=open(os.environ["ERR"], "w"))
hwm, t = 0, time.time()
while p.poll() is None:
    try:
        hwm = max([hwm] + [int(l.split()[1]) * 1024 for l in open("/proc/%d/status" % p.pid) if l.startswith("VmHWM:")])
    except (OSError, ValueError):
        pass
    time.sleep(0.005)
print(p.returncode, time.time() - t, hwm, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
'''
    work = os.path.dirname(cmd[1])
    out, err = os.path.join(work, "probe.out"), os.path.join(work, "probe.err")
    env = dict(os.environ, OUT=out, ERR=err, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", probe] + cmd, capture_output=True, text=True, env=env, timeout=600)
    check(p.returncode == 0, "the probe failed: %s" % p.stderr)
    rc, wall, hwm, maxrss = p.stdout.split()
    return int(rc), open(out).read(), open(err).read(), float(wall), int(hwm), int(maxrss)


def one_line_error(p, *words):
    lines = p.stderr.strip().split("\n")
    check(p.returncode == 1 and len(lines) == 1 and lines[0].startswith("fsdpc: error: ") and
          all(w in lines[0] for w in words), "expected one error line with %s, exit 1; got %d:\n%s"
          % (words, p.returncode, p.stderr))


def nothing_written(work, out):
    left = [f for f in os.listdir(work) if f.startswith(os.path.basename(out))]
    check(not left, "files written after an error: %s" % left)


def gpt3(fsdpc, work, rss):
    L, D, H, T, V = 96, 12288, 96, 2048, 50257
    model = os.path.join(work, "gpt3.onnx")
    shaped(model, L, D, H, T, 1, V, None)
    check(not os.path.exists(model + ".data"), "the data file exists")
    flags = ["--world", "512", "--target", "cuda", "--precision", "bf16", "--recompute", "units", "--wrap", "blocks",
             "--loss", "cross_entropy:logits,labels"]
    rc, out, err, wall, hwm, maxrss = measured([fsdpc, model, "--report"] + flags)
    check(rc == 0, "--report without the data failed:\n%s" % err)
    m = re.search(r"^parameters: (\d+) in (\d+) units$", out, re.M)
    want = shaped_model.param_count(L, D, T, V)
    check(m and int(m.group(1)) == want, "--report counts %s parameters, the shapes %d" % (m and m.group(1), want))
    check(int(m.group(2)) == L + 1, "%s units, expected %d (--wrap blocks)" % (m.group(2), L + 1))
    check("strategies at world 512" in out and "recompute units:" in out, "the report lacks its strategies")
    print("(a) GPT-3 175B shape, data absent: --report in %.2f s, peak RSS %.1f MB, %d parameters in %s units"
          % (wall, maxrss / MB, want, m.group(2)))
    check(wall < 60, "--report took %.1f s" % wall)
    if rss:
        check(maxrss < 300 * MB, "--report's peak RSS %.1f MB is not below 300 MB" % (maxrss / MB))
    p = run([fsdpc, model, "--dump-after", "units"] + flags)
    check("# after units" in p.stdout, "--dump-after units printed no IR")
    out = os.path.join(work, "gpt3_train")
    p = run([fsdpc, model, "-o", out] + flags, check=False)
    one_line_error(p, "initializer 'transformer.wte.weight'", "gpt3.onnx.data", "No such file")
    nothing_written(work, out)
    with open(model + ".data", "wb") as f:  # present but too short: an error even for --report
        f.truncate(1 << 20)
    for extra in (["--report"], ["-o", out]):
        p = run([fsdpc, model] + extra + flags, check=False)
        one_line_error(p, "gpt3.onnx.data", "truncated")
    nothing_written(work, out)
    print("(a) -o without the data, and a truncated data file: one line each, nothing written")


def on_demand(fsdpc, work):
    """a weight's bytes a pass needs are read when it needs them: Clip's bounds, external float scalars"""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(np.ones((4, 4), np.float32), "W"),
             numpy_helper.from_array(np.array(-0.25, np.float32), "lo"),
             numpy_helper.from_array(np.array(0.75, np.float32), "hi")]
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Clip", ["h", "lo", "hi"],
                                                                                          ["y"])], "clip",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = os.path.join(work, "clip.onnx")
    onnx.save_model(m, path, save_as_external_data=True, location="clip.data", size_threshold=0)
    flags = ["--target", "cpu", "--loss", "mse:y,t", "--dump-after", "fold"]
    p = run([fsdpc, path] + flags)
    check(re.search(r"Clip %\d+ min=-0.25 max=0.75", p.stdout), "Clip's bounds not read:\n" + p.stdout)
    os.unlink(os.path.join(work, "clip.data"))
    p = run([fsdpc, path] + flags, check=False)
    one_line_error(p, "initializer 'lo'", "clip.data", "No such file")
    print("(a) Clip's external bounds read when fold needs them; without the file, one line naming 'lo'")


def c_tables(src):
    """the generated C's units {name, numel, dtype, nstate, off}, params {name, unit, offset, numel}, consts
    {file off, arena off, bytes}"""
    c = open(src).read()

    def table(name):
        body = re.search(r"static const \w+ %s\[\] = \{\n(.*?)\n\};" % name, c, re.S).group(1)
        return [row.strip().rstrip(",") for row in body.split("\n")]
    units = [re.match(r'\{"(.*)", (\d+), (\d+), (\d+), (\d+)\}', r).groups() for r in table("units")]
    params = [re.match(r'\{"(.*)", (\d+), (\d+), (\d+), (\d+)\}', r).groups() for r in table("params")]
    consts = [re.match(r"\{(\d+), (\d+), (\d+)", r).groups() for r in table("consts")]
    return ([(n, int(k), int(o)) for n, k, _, _, o in units], [(n, int(u), int(o), int(k)) for n, u, o, k, _ in params],
            [tuple(map(int, x)) for x in consts])


def sections(init, src):
    """{parameter name: its bytes in OUT.init}, [the constants' bytes]"""
    units, params, consts = c_tables(src)
    data = open(init, "rb").read()
    got = {}
    for name, u, off, numel in params:
        at = units[u][2] + 4 * off
        got[name] = data[at:at + 4 * numel]
    return got, [data[f:f + n] for f, _, n in consts]


def small(fsdpc, work):
    import onnx
    from onnx import numpy_helper
    ext = os.path.join(work, "small.onnx")
    shaped(ext, 2, 64, 4, 16, 2, 96, "random")
    m = onnx.load(ext)  # the data read in: saved inline
    inline = os.path.join(work, "small_inline.onnx")
    onnx.save(m, inline)
    check(all(t.HasField("raw_data") and not t.external_data for t in onnx.load(inline).graph.initializer),
          "the inline model has external tensors")
    want = {t.name: numpy_helper.to_array(t).tobytes() for t in m.graph.initializer}
    rng = np.random.default_rng(1)
    toks = os.path.join(work, "tokens.bin")
    rng.integers(0, 96, 12 * 16 + 1).astype("<u2").tofile(toks)
    result = {}
    for tag, path in (("external", ext), ("inline", inline)):
        exe = os.path.join(work, "small_" + tag)
        run([fsdpc, path, "-o", exe, "--target", "cpu", "--loss", "cross_entropy:logits,labels", "--emit-c"])
        params, consts = sections(exe + ".init", exe + ".c")
        check(set(params) == set(want) - {"causal_mask"}, "%s: trained %s" % (tag, sorted(params)))
        for name, b in params.items():
            check(b == want[name], "%s: OUT.init's %s differs from the initializer" % (tag, name))
        metrics = exe + ".jsonl"
        run([exe, "--tokens", toks, "--steps", "3", "--metrics", metrics, "--quiet"])
        losses = read_metrics(metrics)[0]
        check(len(losses) == 3, "%s: %d losses" % (tag, len(losses)))
        result[tag] = (params, consts, losses)
    (pe, ce, le), (pi, ci, li) = result["external"], result["inline"]
    check(pe == pi and ce == ci, "the parameter units or constants differ between the external and inline builds")
    check(want["causal_mask"] in ce, "the causal mask is not among the constants")
    check(le == li, "losses differ: external %s, inline %s" % (le, li))
    print("(b) external and inline: the same %d parameters and %d constants in OUT.init; losses %s both"
          % (len(pe), len(ce), le))


def big(fsdpc, work, rss):
    L, D, H, T, V = 10, 1280, 10, 64, 50257
    model = os.path.join(work, "big.onnx")
    shaped(model, L, D, H, T, 1, V, "sparse")
    size = os.path.getsize(model + ".data")
    largest = 4 * V * D
    exe = os.path.join(work, "big_train")
    rc, out, err, wall, hwm, maxrss = measured(
        [fsdpc, model, "-o", exe, "--target", "cpu", "--loss", "cross_entropy:logits,labels", "--emit-c"])
    check(rc == 0, "the compile failed:\n%s" % err)
    init = exe + ".init"
    isize = os.path.getsize(init)
    print("(c) %.0f MB of external data (largest tensor %.0f MB) compiled with -o in %.1f s: fsdpc's peak RSS "
          "%.1f MB, with the C compiler %.1f MB; OUT.init %d bytes" % (size / MB, largest / MB, wall, hwm / MB,
                                                                    maxrss / MB, isize))
    if rss:
        check(hwm < 150 * MB, "fsdpc's peak RSS %.1f MB is not below 150 MB" % (hwm / MB))
        check(maxrss < largest + 150 * MB, "peak RSS %.1f MB is not below the largest tensor + 150 MB" % (maxrss / MB))
    with open(init, "rb") as f:
        head = f.read(32)
    check(head[:13] == b"FSDPC-INIT-v3" and int.from_bytes(head[24:32], "little") == isize,
          "OUT.init is %d bytes, its header says %d" % (isize, int.from_bytes(head[24:32], "little")))
    units, params, consts = c_tables(exe + ".c")
    nparam = shaped_model.param_count(L, D, T, V)
    check(sum(k for _, k, _ in units) == nparam, "the units hold %d parameters, the shapes %d"
          % (sum(k for _, k, _ in units), nparam))
    pieces = 4 * nparam + sum(n for _, _, n in consts) + 4 * T * T + os.path.getsize(model)  # the mask kept twice
    pieces += 8 * (len(units) + len(consts) + 2)  # the table of the sections' checksums: the model, the mask, each
    check(pieces <= isize <= pieces + 64 * (len(units) + len(consts) + 3),
          "OUT.init is %d bytes for %d bytes of tensors and model" % (isize, pieces))
    with open(init, "rb") as f:  # the parameters are the data file's: zeros
        for _, numel, off in units:
            f.seek(off)
            for left in range(4 * numel, 0, -(1 << 24)):
                check(not any(f.read(min(left, 1 << 24))), "a parameter unit of OUT.init is not zero")
    mask = np.tril(np.ones((T, T), np.float32)).tobytes()
    with open(init, "rb") as f:
        check(any(f.seek(o) >= 0 and f.read(n) == mask for o, _, n in consts), "the mask is not among the constants")


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    rss = "--no-rss" not in sys.argv[3:]
    os.makedirs(work, exist_ok=True)
    for f in os.listdir(work):
        os.unlink(os.path.join(work, f))
    t = time.time()
    gpt3(fsdpc, work, rss)
    on_demand(fsdpc, work)
    small(fsdpc, work)
    big(fsdpc, work, rss)
    for f in os.listdir(work):  # the large files go
        if f.startswith("big"):
            os.unlink(os.path.join(work, f))
    print("ok (%.1f s)" % (time.time() - t))


if __name__ == "__main__":
    main()
