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
   bit); with the toolkit, --target cuda --emulate (the installed emulation library, kernels/cuda headers
   and the C++ compiler) trains 3 steps at world 2 with the cpu losses within 1e-5; a copy of fsdpc outside
   any prefix compiles with FSDPC_HOME=Q; a FSDPC_HOME without a runtime is one error line.
3. pkg-config reads the moved prefix's fsdpc.pc (its fsdpc variable is the installed compiler, its Libs the
   installed archives: the prefix is found from the file's place); the man page starts with .TH and holds
   the option list.

usage: install.py --minimal BUILD_DIR SOURCE_DIR WORKDIR

A second build tree, WORKDIR/build, configured with -DBUILD_TESTING=OFF and BUILD_DIR's generator, compiler,
compiler launcher (ccache: the objects are mostly cache hits), build type, FSDPC_WERROR and FSDPC_SANITIZE:
1. `cmake --build --target fsdpc` alone, then `cmake --install` into a prefix: the man page, which fsdpc's
   target does not make, is rendered at install.
2. the default target builds no test binary and no fuzzer (the only executable made is fsdpc); installed
   again, its fsdpc compiles examples/mlp.onnx and the executable trains one step (a finite loss).
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


def cache_args(build):
    """the -G and -D options that configure a tree as BUILD_DIR was (its CMakeCache.txt); ccache as the
    launcher where BUILD_DIR has none and ccache is installed"""
    keep = ("CMAKE_BUILD_TYPE", "CMAKE_C_COMPILER", "CMAKE_C_COMPILER_LAUNCHER", "FSDPC_WERROR", "FSDPC_SANITIZE")
    args, have = [], {}
    for line in open(os.path.join(build, "CMakeCache.txt")):
        key, sep, value = line.rstrip("\n").partition("=")
        name = key.split(":")[0]
        if sep and name == "CMAKE_GENERATOR":
            args += ["-G", value]
        elif sep and name in keep:
            have[name] = value
    if "CMAKE_C_COMPILER_LAUNCHER" not in have and shutil.which("ccache"):
        have["CMAKE_C_COMPILER_LAUNCHER"] = "ccache"
    return args + ["-D%s=%s" % kv for kv in sorted(have.items())]


def executables(tree):
    """the executable files under tree, but CMake's own (CMakeFiles: the compiler checks)"""
    found = []
    for d, subdirs, files in os.walk(tree):
        subdirs[:] = [s for s in subdirs if s != "CMakeFiles"]
        found += [os.path.relpath(os.path.join(d, f), tree) for f in files
                  if os.access(os.path.join(d, f), os.X_OK) and os.path.isfile(os.path.join(d, f))]
    return sorted(found)


def minimal(build, source, work):
    """-DBUILD_TESTING=OFF: the compiler, the runtime and the kernels only, installable from fsdpc's target"""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    tree, pre = os.path.join(work, "build"), os.path.join(work, "prefix")
    run(["cmake", "-S", source, "-B", tree, "-DBUILD_TESTING=OFF"] + cache_args(build))
    run(["cmake", "--build", tree, "--target", "fsdpc"], timeout=1200)
    run(["cmake", "--install", tree, "--prefix", pre])
    man = os.path.join(pre, "share/man/man1/fsdpc.1")
    check(os.path.isfile(man) and open(man).read().startswith(".TH FSDPC 1"),
          "cmake --install after --target fsdpc: no man page rendered at %s" % man)
    print("ok --target fsdpc alone, then cmake --install: the man page rendered at install")
    run(["cmake", "--build", tree], timeout=1200)
    made = executables(tree)
    check(made == ["fsdpc"], "-DBUILD_TESTING=OFF built executables other than fsdpc: %s" % made)
    check(not os.path.exists(os.path.join(tree, "tests")), "-DBUILD_TESTING=OFF read tests/ (%s/tests)" % tree)
    print("ok -DBUILD_TESTING=OFF: the default target made no test binary, no fuzzer (executables: %s)" % made)
    run(["cmake", "--install", tree, "--prefix", pre])
    rng = np.random.default_rng(0)
    np.save(os.path.join(work, "x.npy"), rng.standard_normal((4, 16)).astype(np.float32))
    np.save(os.path.join(work, "t.npy"), rng.standard_normal((4, 1)).astype(np.float32))
    exe, metrics = os.path.join(work, "mlp"), os.path.join(work, "mlp.jsonl")
    run([os.path.join(pre, "bin", "fsdpc"), os.path.join(source, "examples", "mlp.onnx"), "-o", exe,
         "--target", "cpu", "--loss", "mse:y,target", "--dim", "batch=4"])
    run([exe, "--data", "x=" + os.path.join(work, "x.npy"), "--data", "target=" + os.path.join(work, "t.npy"),
         "--steps", "1", "--lr", "1e-3", "--metrics", metrics, "--quiet"])
    got = losses(metrics)
    check(len(got) == 1 and np.isfinite(got[0]), "one step of the installed fsdpc's MLP: losses %s" % got)
    print("ok the installed fsdpc's examples/mlp.onnx trains a step: loss %.6f" % got[0])
    print("OK install_minimal")


def emulated(build, source, fz, tmp, compile_cpu, train):
    """--target cuda --emulate from the installed tree (its emulation library, kernels/cuda headers and the C++
    compiler for the model's fused kernels), the trees hidden: trains 3 steps at world 2 (the emulated NCCL)
    with the cpu target's losses within 1e-5 (FSDPC_NO_TF32=1: exact float32 GEMMs)"""
    env = {"FSDPC_NO_TF32": "1"}
    q = hidden(build, source, " && ".join([compile_cpu.replace("--target cpu", "--target cuda --emulate")
                                          % (fz, "train_emu"), train % ("train_emu", "train_emu")]), env=env)
    check(q.returncode == 0, "--target cuda --emulate from the installed tree: exit %d\n%s%s"
          % (q.returncode, q.stdout[-1000:], q.stderr[-2000:]))
    got, want = losses(os.path.join(tmp, "train_emu.jsonl")), losses(os.path.join(tmp, "train.jsonl"))
    check(len(got) == 3 and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, want)),
          "the installed fsdpc's emulated cuda losses %s, the cpu target's %s" % (got, want))
    print("ok --target cuda --emulate from the installed tree trains at world 2: losses %s = cpu's within 1e-5" % got)


def main():
    if sys.argv[1] == "--minimal":
        return minimal(*sys.argv[2:5])
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
            # (one arch.  The kernel library's entries the suite's cache already holds (kernels-KEY.ARCH: the same
            # embedded sources, NVRTC and options, so the same key) are copied into this compile's own cache,
            # which the hidden build tree would hide: a cold library is ~30 CPU s per arch, already checked by
            # cuda_target; what is checked here is the moved prefix's fsdpc loading NVRTC and compiling the
            # model's own program, which no entry holds)
            cache = os.path.join(tmp, "cache")
            os.makedirs(cache, mode=0o700)
            shared = os.environ.get("FSDPC_CACHE_DIR", "")
            copied = [f for f in (os.listdir(shared) if os.path.isdir(shared) else [])
                      if f.startswith("kernels-") and not f.endswith(".lock")]
            for f in copied:
                shutil.copy(os.path.join(shared, f), cache)
            q = hidden(build, source, "%s %s/gpt.onnx -o %s/train_cuda --target cuda --arch sm_80 --loss "
                       "cross_entropy:logits,labels --dim batch=2" % (fz, tmp, tmp), env={"FSDPC_CACHE_DIR": cache})
            check(q.returncode == 0 and os.path.isfile(os.path.join(tmp, "train_cuda")),
                  "--target cuda from the installed tree: exit %d %s" % (q.returncode, q.stderr[-1000:]))
            model = [l for l in q.stderr.splitlines() if "program" in l or "compil" in l]
            print("ok --target cuda builds from the installed tree (%d library entries from the suite's cache)%s"
                  % (len(copied), "".join("\n    " + l for l in model[:4])))
            emulated(build, source, fz, tmp, compile_cpu, train)
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
