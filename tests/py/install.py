"""fsdpc installed like a tool: `cmake --install` into a prefix, the prefix moved, and the build and source
trees gone while the installed fsdpc compiles and the executable trains.

usage: install.py FSDPC BUILD_DIR SOURCE_DIR WORKDIR

1. cmake --install BUILD_DIR --prefix P: bin/fsdpc, lib/fsdpc/ (the runtime's libraries), include/fsdpc/
   (the headers the emitted code includes), lib/pkgconfig/fsdpc.pc, share/man/man1/fsdpc.1 (--help rendered).
2. P is moved to Q (a relocated prefix).  Then, in a mount namespace where empty tmpfs mounts cover BUILD_DIR
   and SOURCE_DIR (unshare -m: the trees are absent for those processes, untouched for the rest of the suite):
   Q/bin/fsdpc --version names Q's directories; it compiles examples/gpt.onnx (copied out first) for the cpu
   target, and for cuda when this fsdpc has the CUDA toolkit (NVRTC; not run: no GPU); the cpu executable
   trains 3 steps at world 2 with the same losses as the build tree's fsdpc gives (the same code, bit for
   bit); a copy of fsdpc outside any prefix compiles with FSDPC_HOME=Q; a FSDPC_HOME without a runtime is
   one error line.
3. pkg-config reads the moved prefix's fsdpc.pc (its fsdpc variable is the installed compiler, its Libs the
   installed archives: the prefix is found from the file's place); the man page starts with .TH and holds
   the option list.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from common import check, run


def hidden(build, source, script, env=None):
    """run sh -c script with BUILD and SOURCE covered by empty tmpfs mounts"""
    cover = "mount -t tmpfs fsdpc-hidden %s && mount -t tmpfs fsdpc-hidden %s && " % (build, source)
    e = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", **(env or {}))
    p = subprocess.run(["unshare", "-m", "sh", "-c", cover + script], capture_output=True, text=True, env=e)
    return p


def losses(metrics):
    return [json.loads(l)["loss"] for l in open(metrics) if '"step"' in l]


def main():
    fsdpc, build, source, work = sys.argv[1:5]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    # outside both trees, so that hiding them hides nothing the test needs
    tmp = tempfile.mkdtemp(prefix="fsdpc-install-")
    try:
        pre, moved = os.path.join(tmp, "p"), os.path.join(tmp, "moved")
        run(["cmake", "--install", build, "--prefix", pre])
        for f in ("bin/fsdpc", "lib/fsdpc/libfsdpc_rt.a", "lib/fsdpc/libfsdpc_kernels.a", "lib/fsdpc/libonnxproto.a",
                  "include/fsdpc/runtime/rt.h", "include/fsdpc/kernels/c/kernels.h",
                  "include/fsdpc/kernels/c/fused.h", "lib/pkgconfig/fsdpc.pc", "share/man/man1/fsdpc.1"):
            check(os.path.isfile(os.path.join(pre, f)), "cmake --install did not install %s" % f)
        man = open(os.path.join(pre, "share/man/man1/fsdpc.1")).read()
        check(man.startswith(".TH FSDPC 1") and "--shard full|grad_op|none|hybrid:F" in man,
              "the man page is not fsdpc --help rendered: %r" % man[:200])
        os.rename(pre, moved)  # a relocated prefix
        pc = lambda *a: subprocess.run(["pkg-config"] + list(a) + ["fsdpc"], capture_output=True, text=True,
                                       env=dict(os.environ, PKG_CONFIG_PATH=os.path.join(moved, "lib/pkgconfig")))
        comp, libs = pc("--variable=fsdpc"), pc("--libs")
        check(comp.returncode == 0 and os.path.realpath(comp.stdout.strip()) == os.path.join(moved, "bin/fsdpc"),
              "pkg-config --variable=fsdpc fsdpc: %r %r" % (comp.stdout, comp.stderr))
        check(libs.returncode == 0 and os.path.join(moved, "lib/fsdpc/libfsdpc_rt.a") in
              [os.path.realpath(t) for t in libs.stdout.split()], "pkg-config --libs fsdpc: %r" % libs.stdout)
        print("ok installed: bin, lib/fsdpc, include/fsdpc, fsdpc.1, fsdpc.pc (the moved prefix's: %s)"
              % os.path.realpath(comp.stdout.strip()))
        shutil.copy(os.path.join(source, "examples", "gpt.onnx"), tmp)
        text = np.frombuffer(open(os.path.join(source, "README.md"), "rb").read(), np.uint8).astype("<u2")
        text.tofile(os.path.join(tmp, "text.bin"))
        fz = os.path.join(moved, "bin", "fsdpc")
        compile_cpu = "%%s %s/gpt.onnx -o %s/%%s --target cpu --loss cross_entropy:logits,labels --dim batch=2 " \
                      "--wrap size:30000" % (tmp, tmp)
        train = "mpirun -np 2 %s/%%s --tokens %s/text.bin --steps 3 --lr 1e-3 --quiet --metrics %s/%%s.jsonl" % (
            tmp, tmp, tmp)
        p = hidden(build, source, " && ".join([
            "test ! -e %s/CMakeCache.txt && test ! -e %s/README.md" % (build, source),
            "%s --version" % fz, compile_cpu % (fz, "train"), train % ("train", "train")]))
        check(p.returncode == 0, "installed fsdpc with the trees hidden: exit %d\n%s%s" % (p.returncode, p.stdout,
                                                                                            p.stderr))
        check("runtime: %s/include/fsdpc, %s/lib/fsdpc" % (moved, moved) in p.stdout,
              "--version does not name the moved prefix: %r" % p.stdout)
        want = "kernels for x86-64, x86-64-v3, x86-64-v4" if os.uname().machine == "x86_64" else "kernels for"
        check(want in p.stdout, "--version does not name the kernels' CPU levels (%r): %r" % (want, p.stdout))
        print("ok with %s and %s hidden: the moved prefix's fsdpc compiles, its executable trains" % (build, source))
        # the build tree's fsdpc on the same model and data: the same losses
        run(["sh", "-c", compile_cpu % (fsdpc, "ref")])
        run(["sh", "-c", train % ("ref", "ref")], env=dict(os.environ))
        got, want = losses(os.path.join(tmp, "train.jsonl")), losses(os.path.join(tmp, "ref.jsonl"))
        check(len(got) == 3 and got == want, "installed losses %s, build tree's %s" % (got, want))
        print("ok losses equal the build tree's: %s" % got)
        # cuda, when this fsdpc has the toolkit: NVRTC from the installed headers (nothing to run it on)
        if "cuda (NVRTC" in p.stdout:
            q = hidden(build, source, "%s %s/gpt.onnx -o %s/train_cuda --target cuda --loss cross_entropy:logits,"
                       "labels --dim batch=2" % (fz, tmp, tmp), env={"FSDPC_CACHE_DIR": os.path.join(tmp, "cache")})
            check(q.returncode == 0 and os.path.isfile(os.path.join(tmp, "train_cuda")),
                  "--target cuda from the installed tree: exit %d %s" % (q.returncode, q.stderr[-1000:]))
            print("ok --target cuda builds from the installed tree")
        else:
            print("note: this fsdpc has no cuda target (built without the CUDA toolkit): cuda install not checked")
        # FSDPC_HOME: a copy of fsdpc outside any prefix
        lone = os.path.join(tmp, "elsewhere")
        os.makedirs(lone)
        shutil.copy(fz, lone)
        r = hidden(build, source, compile_cpu % (os.path.join(lone, "fsdpc"), "train2"), env={"FSDPC_HOME": moved})
        check(r.returncode == 0, "FSDPC_HOME=%s: exit %d %s" % (moved, r.returncode, r.stderr))
        r = hidden(build, source, compile_cpu % (os.path.join(lone, "fsdpc"), "train3"), env={"FSDPC_HOME": lone})
        err = r.stderr.strip()
        check(r.returncode == 1 and len(err.splitlines()) == 1 and "cannot find the fsdpc runtime" in err and
              "FSDPC_HOME" in err, "FSDPC_HOME without a runtime: exit %d %r" % (r.returncode, err))
        print("ok FSDPC_HOME: a prefix works; one without a runtime: %s" % err)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("OK install")


if __name__ == "__main__":
    main()
