"""The executable and its OUT.init: written aside, replaced as a pair, checked as read.

usage: init_pair.py FSDPC WORKDIR

(a) -o over a planted link at OUT, OUT.init and OUT.c (--emit-c) replaces each link and leaves its target alone;
    nothing but OUT, OUT.init and OUT.c is left in the folder.
(b) A failing C compiler with a good pair in place (--cc a script that exits 3 silently; one that really compiles
    and links, then says "ld: cannot open output file ...: No space left on device" and exits 1; one that does
    not exist): one line naming the tool's message, exit 1; OUT and OUT.init byte-identical to before and the old
    executable still runs a step; no temporary left beside them.
(c) The pair's replacement, stopped between its renames (the state a crash leaves), by a build of another structure
    (--optimizer sgd: another step, so another id): the new executable beside the old OUT.init finds its own init
    under .OUT.init.<id> and trains as the new pair does; without that file it is one line ("another build"); the
    next build of OUT removes the leftover.
(d) A flipped bit in OUT.init: in a unit's parameters (at world 1, and at world 2 in each rank's shard, the
    shards meeting inside an 8-byte word, and with --shard none, where both ranks read it all), in the header's id, size and reserved bytes, in the table of checksums that ends the file, in a constant: one line
    naming the file and "compile the model again", exit 1; in the embedded model: only a run that exports (or
    dumps gradients) reads it, and that run says so at start.
(e) The object cache (codegen/objcache.c, in $FSDPC_CACHE_DIR): a build fills it with one entry; a build of the
    model with other weights (m2) takes the step from it (the entry untouched, no other written) and trains as a
    build from an empty cache does, from its own weights; --cpu x86-64 is another entry; an entry whose headers
    changed (--cc adding -include of a file, which then changes) is compiled again; a corrupted entry is
    compiled again and rewritten, and its build trains as before.  A cache folder others can write into (0777,
    0775) or another user's is not used: one warning naming it, nothing written there, the build trains the same.
(f) --init-only: m2's init file alone, written over m's OUT.init, is byte-identical to m2's own build's; m's
    executable, untouched, trains from it as m2's does (world 1 and 2), and from an init-only file passed with
    --init; an init-only file of another structure (--optimizer sgd) is refused in one line ("another build");
    --init-only with --emit-c is a usage error.
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from common import check, mpirun, run

A = ["--target", "cpu", "--loss", "mse:y,target", "--dim", "batch=4"]


def model(path, scale=1.0, n=5):
    """x [batch, 5] -> MatMul w [5, n] -> Gather of its columns by a constant permutation idx -> y [batch, n].
    25 weights: the unit's bytes end inside an 8-byte word, and at world 2 the shards (13 and 12 weights) meet
    inside one"""
    w = numpy_helper.from_array((np.arange(5 * n, dtype=np.float32).reshape(5, n) / 10 - 1) * scale, "w")
    idx = numpy_helper.from_array(np.arange(n, dtype=np.int64)[::-1].copy(), "idx")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Gather", ["h", "idx"], ["y"], axis=1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n])], [w, idx])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def digest(*paths):
    return [hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths]


def one_line(p, *needles):
    lines = [l for l in p.stderr.strip().splitlines() if l.strip()]
    check(p.returncode == 1 and len(lines) == 1 and all(n in lines[0] for n in needles),
          "expected one error line with %s, exit 1; got %d:\n%s" % (needles, p.returncode, p.stderr))
    return lines[0]


def loss(exe, data, world=1, extra=()):
    p = run(mpirun(world, [exe] + data + ["--steps", "1"] + list(extra)))
    return re.search(r"^step 1/1 +loss (\S+)", p.stdout, re.M).group(1)


def flip(path, off, bit=0):
    d = bytearray(open(path, "rb").read())
    d[off] ^= 1 << bit
    open(path, "wb").write(d)


def tables(src):
    """the units {file off, numel} and constants {file off, bytes} of the generated C (--emit-c)"""
    c = open(src).read()
    units = [tuple(map(int, m)) for m in re.findall(r'\{"[^"]*", (\d+), \d+, \d+, (\d+)\},', c.split("RtUnit units")[1]
                                                                         .split("};")[0])]
    consts = [tuple(map(int, m)) for m in re.findall(r"\{(\d+), \d+, (\d+), ", c.split("RtConst consts")[1]
                                                       .split("};")[0])]
    return [(off, numel) for numel, off in units], consts


def planted_links(fsdpc, work, J):
    victim = J("victim")
    for name in ("train", "train.init", "train.c"):
        open(victim + name, "w").write("precious")
        os.symlink(victim + name, J("out", name))
    run([fsdpc, J("m.onnx"), "-o", J("out", "train"), "--emit-c"] + A)
    for name in ("train", "train.init", "train.c"):
        check(not os.path.islink(J("out", name)) and os.path.isfile(J("out", name)), "%s is still a link" % name)
        check(open(victim + name).read() == "precious", "the write followed the link at %s" % name)
    check(sorted(os.listdir(J("out"))) == ["train", "train.c", "train.init"], "left: %s" % os.listdir(J("out")))
    print("(a) planted links at OUT, OUT.init, OUT.c replaced, their targets untouched")


def failing_cc(fsdpc, work, J, data):
    exe = J("out", "train")
    before, want = digest(exe, exe + ".init"), loss(exe, data)
    fail = J("fail.sh")
    open(fail, "w").write("#!/bin/sh\nexit 3\n")
    ld = J("ldfail.sh")
    open(ld, "w").write('#!/bin/sh\ncc "$@" || exit\necho "/usr/bin/ld: cannot open output file %s: No space '
                        'left on device" >&2\necho "collect2: error: ld returned 1 exit status" >&2\nexit 1\n' % exe)
    for f in (fail, ld):
        os.chmod(f, 0o755)
    cases = ((fail, ("fail.sh", "exit status 3", "left as they were")),
             (ld, ("ld: cannot open output file", "No space left on device", "left as they were")),
             (J("no-such-cc"), ("no-such-cc", "No such file")))
    for cc, needles in cases:  # a new model, so that a replaced OUT.init would not be the old one
        p = run([fsdpc, J("m2.onnx"), "-o", exe, "--emit-c", "--cc", cc] + A, check=False)
        line = one_line(p, *needles)
        check(digest(exe, exe + ".init") == before, "%s: the old pair was replaced" % os.path.basename(cc))
        check(loss(exe, data) == want, "%s: the old executable does not train as before" % os.path.basename(cc))
        left = [f for f in os.listdir(J("out")) if f not in ("train", "train.c", "train.init")]
        check(not left, "%s: left beside the pair: %s" % (os.path.basename(cc), left))
        print("(b) --cc %s: %s" % (os.path.basename(cc), line[:160]))


def stopped_between(fsdpc, work, J, data):
    """the old pair in out/, the new one in new/; then the state between the last two renames"""
    old, new = J("out", "train"), J("new", "train")
    os.unlink(old + ".c")
    run([fsdpc, J("m.onnx"), "-o", old] + A)
    run([fsdpc, J("m2.onnx"), "-o", new, "--optimizer", "sgd"] + A)  # another step: another id
    want = loss(new, data)
    check(want != loss(old, data), "the two models train alike: the test cannot tell them apart")
    ident = int.from_bytes(open(new + ".init", "rb").read()[16:24], "little")
    aside = J("out", ".train.init.%016x" % ident)
    shutil.copy(new + ".init", aside)
    shutil.copy(new, old)
    check(loss(old, data) == want, "the new executable beside the old OUT.init does not train from its own init")
    os.rename(aside, aside + "x")
    one_line(run([old] + data + ["--steps", "1"], check=False), "train.init", "another build")
    os.rename(aside + "x", aside)
    run([fsdpc, J("m.onnx"), "-o", old] + A)
    check(sorted(os.listdir(J("out"))) == ["train", "train.init"], "after the next build: %s" % os.listdir(J("out")))
    print("(c) stopped between the renames: the new executable trains from .OUT.init.<id> (loss %s); the next "
          "build removes it" % want)


def flipped_bits(fsdpc, work, J, data):
    exe = J("out", "train")
    run([fsdpc, J("m.onnx"), "-o", exe, "--emit-c"] + A)
    init = exe + ".init"
    good = open(init, "rb").read()
    units, consts = tables(exe + ".c")
    check(len(units) == 1 and consts, "the model's tables: units %s, constants %s" % (units, consts))
    uoff, numel = units[0]
    half = (numel + 1) // 2 * 4  # world 2: rank 1's shard starts here, inside an 8-byte word
    check(half % 8 != 0, "the shards of world 2 meet on a word boundary: %d" % half)
    cases = [("a weight", uoff + 5, 1, "unit"), ("the last weight", uoff + numel * 4 - 1, 1, "unit"),
             ("rank 0's last weight", uoff + half - 1, 2, "unit"), ("rank 1's first weight", uoff + half, 2, "unit"),
             ("rank 1's second word", uoff + half + 4, 2, "unit"),
             ("the header's id", 17, 1, "header"), ("the header's size", 25, 1, "header"),
             ("a reserved header byte", 50, 1, "header"), ("a constant", consts[0][0] + 3, 1, "constant"),
             ("the table of checksums", len(good) - 3, 1, "table of checksums")]
    for what, off, world, needle in cases:
        open(init, "wb").write(good)
        flip(init, off, 6)
        p = run(mpirun(world, [exe] + data + ["--steps", "1"]), check=False)
        if world == 1:
            one_line(p, init, "corrupt", needle, "compile the model again")
        else:
            check(p.returncode != 0 and "corrupt" in p.stderr and "compile the model again" in p.stderr,
                  "%s at world 2: exit %d\n%s" % (what, p.returncode, p.stderr))
        print("(d) flipped bit in %s (world %d): exit %d, %s" % (what, world, p.returncode,
                                                                 re.search(r"corrupt.*", p.stderr).group(0)[:100]))
    ddp = J("out", "ddp")  # --shard none at world 2: both ranks read the whole unit (two shard groups)
    run([fsdpc, J("m.onnx"), "-o", ddp, "--shard", "none"] + A)
    loss(ddp, data, 2)
    flip(ddp + ".init", uoff + 9, 3)
    p = run(mpirun(2, [ddp] + data + ["--steps", "1"]), check=False)
    check(p.returncode != 0 and "corrupt" in p.stderr, "--shard none at world 2: a flipped bit trains:\n%s" % p.stderr)
    for f in (ddp, ddp + ".init"):
        os.unlink(f)
    print("(d) flipped bit in a weight, --shard none (world 2): exit %d" % p.returncode)
    open(init, "wb").write(good)
    flip(init, 64 + 10, 6)  # the embedded model: read by --export-onnx, checked at start by such a run
    loss(exe, data)
    one_line(run([exe] + data + ["--steps", "1", "--export-onnx", J("e.onnx")], check=False), "corrupt",
             "the embedded model")
    check(not os.path.exists(J("e.onnx")), "an export from a corrupt model section")
    open(init, "wb").write(good)
    loss(exe, data, 2, ["--export-onnx", J("e.onnx")])
    print("(d) flipped bit in the embedded model: a run without export trains, one with --export-onnx refuses")


def step_cache(fsdpc, work, J, data):
    cache, fresh = J("stepcache"), J("stepcache2")
    os.makedirs(J("sc"))
    build = lambda m, out, c=cache, extra=(): run([fsdpc, J(m), "-o", J("sc", out)] + A + list(extra),
                                                  env={"FSDPC_CACHE_DIR": c})
    stamps = lambda: {e: os.stat(os.path.join(cache, e)).st_mtime_ns for e in os.listdir(cache)}
    build("m.onnx", "a")
    first = stamps()
    check(len(first) == 1 and list(first)[0].endswith(".o"), "the object cache after a build: %s" % list(first))
    build("m2.onnx", "b")
    check(stamps() == first, "a build whose weights alone differ compiled its step again: %s" % list(stamps()))
    build("m2.onnx", "c", fresh)  # the same model from an empty cache: the step compiled
    want_a, want_b = loss(J("sc", "a"), data), loss(J("sc", "c"), data)
    check(want_a != want_b and loss(J("sc", "b"), data) == want_b,
          "from the cached step m2 trains to %s, from an empty cache to %s (m: %s)"
          % (loss(J("sc", "b"), data), want_b, want_a))
    build("m.onnx", "d", extra=("--cpu", "x86-64"))
    check(len(stamps()) == 2, "--cpu x86-64 did not make its own entry: %s" % list(stamps()))
    # a header the compiler read changes (--cc adding -include of one): the entry is stale, compiled again
    hdr, cc = J("sc", "extra.h"), J("sc", "cc_include.sh")
    open(hdr, "w").write("#define FSDPC_TEST_EXTRA 1\n")
    open(cc, "w").write('#!/bin/sh\nexec cc -include %s "$@"\n' % hdr)
    os.chmod(cc, 0o755)
    build("m.onnx", "e", extra=("--cc", cc))
    before = stamps()
    build("m2.onnx", "e", extra=("--cc", cc))
    check(stamps() == before, "a build with --cc whose headers did not change compiled its step again")
    open(hdr, "w").write("#define FSDPC_TEST_EXTRA 2\n")
    build("m.onnx", "e", extra=("--cc", cc))
    check(len(stamps()) == len(before) and stamps() != before, "a changed header did not make the entry stale")
    entry = os.path.join(cache, list(first)[0])
    good = open(entry, "rb").read()
    flip(entry, len(good) - 100, 2)
    bad = open(entry, "rb").read()
    build("m.onnx", "a")
    # rewritten: not the corrupted bytes, and the next build takes it (an ASan build's object holds the path it was
    # compiled at, so the new object need not be the old one's bytes)
    check(open(entry, "rb").read() != bad, "a corrupted entry was not compiled again and rewritten")
    after = stamps()
    build("m2.onnx", "b")
    check(stamps() == after, "the rewritten entry was not used by the next build")
    check(loss(J("sc", "a"), data) == want_a and loss(J("sc", "b"), data) == want_b,
          "after the corrupted entry m or m2 trains differently")
    # a folder others could plant an object in: not used (one warning), the build compiles and trains the same
    for name, spoil in (("open", lambda d: os.chmod(d, 0o777)), ("theirs", lambda d: os.chown(d, 65534, 65534)),
                        ("group", lambda d: os.chmod(d, 0o775))):
        d = J("cache_" + name)
        os.makedirs(d)
        spoil(d)
        p = run([fsdpc, J("m.onnx"), "-o", J("sc", name)] + A, env={"FSDPC_CACHE_DIR": d})
        warn = [l for l in p.stderr.splitlines() if "not using the cache folder" in l]
        check(len(warn) == 1 and d in warn[0] and not os.listdir(d) and loss(J("sc", name), data) == want_a,
              "a cache folder %s (%s): warnings %s, entries %s" % (name, oct(os.stat(d).st_mode), warn, os.listdir(d)))
    print("(e) object cache: m2 built from m's step (one entry) trains as from an empty cache (loss %s, m %s); "
          "--cpu x86-64 another entry; a changed header or a corrupted entry compiled again; a folder others can "
          "write into or another user's is not used (one warning)" % (want_b, want_a))


def init_only(fsdpc, work, J, data):
    exe, own = J("io", "m"), J("io", "own")
    os.makedirs(J("io"))
    run([fsdpc, J("m.onnx"), "-o", exe] + A)
    run([fsdpc, J("m2.onnx"), "-o", own] + A)
    want, want2, was = loss(own, data), loss(own, data, 2), loss(exe, data)
    check(want != was, "m and m2 train alike: the test cannot tell them apart")
    before = digest(exe)
    p = run([fsdpc, J("m2.onnx"), "-o", exe, "--init-only"] + A)
    check(not p.stderr.strip(), "--init-only said: %s" % p.stderr)
    check(digest(exe) == before, "--init-only changed the executable")
    check(digest(exe + ".init") == digest(own + ".init"), "--init-only's OUT.init is not m2's build's")
    check(sorted(os.listdir(J("io"))) == ["m", "m.init", "own", "own.init"], "left: %s" % os.listdir(J("io")))
    got = (loss(exe, data), loss(exe, data, 2))
    check(got == (want, want2), "m's executable from m2's init-only file trains to %s, m2's own build to %s"
          % (got, (want, want2)))
    run([fsdpc, J("m.onnx"), "-o", J("io", "w"), "--init-only"] + A)
    check(loss(exe, data, 1, ["--init", J("io", "w.init")]) == was, "--init of m's init-only file: not m's loss")
    run([fsdpc, J("m2.onnx"), "-o", J("io", "sgd"), "--init-only", "--optimizer", "sgd"] + A)
    one_line(run([exe] + data + ["--steps", "1", "--init", J("io", "sgd.init")], check=False), "sgd.init",
             "another build")
    one_line(run([fsdpc, J("m.onnx"), "-o", J("io", "x"), "--init-only", "--emit-c"] + A, check=False),
             "--init-only", "--emit-c")
    print("(f) --init-only: m's executable trains from m2's init file as m2's build does (loss %s; world 2 %s); "
          "another structure's refused" % (want, want2))


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    for d in ("out", "new"):
        os.makedirs(os.path.join(work, d))
    J = lambda *p: os.path.join(work, *p)
    model(J("m.onnx"))
    model(J("m2.onnx"), scale=-0.5)
    rng = np.random.default_rng(0)
    np.save(J("x.npy"), rng.standard_normal((16, 5)).astype(np.float32))
    np.save(J("t.npy"), rng.standard_normal((16, 5)).astype(np.float32))
    data = ["--data", "x=" + J("x.npy"), "--data", "target=" + J("t.npy")]
    planted_links(fsdpc, work, J)
    failing_cc(fsdpc, work, J, data)
    stopped_between(fsdpc, work, J, data)
    flipped_bits(fsdpc, work, J, data)
    step_cache(fsdpc, work, J, data)
    init_only(fsdpc, work, J, data)
    print("OK init_pair")


if __name__ == "__main__":
    main()
