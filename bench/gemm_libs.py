"""Which GEMM library is fastest here for the GEMMs fsdpc's training step makes: OpenBLAS, BLIS, oneDNN, MKL.

    /usr/bin/python3 bench/gemm_libs.py [--threads 2] [--repeat 3] [--fsdpc build/fsdpc]
                                        [--sizes 128/4/128/8,256/6/256/8,512/8/256/8,768/12/1024/1]

For each GPT size of bench/gpt_cpu.py (d/L/T/B; torch 1.13 exports it, fsdpc compiles it with --emit-c), the
float32 GEMMs of one training step are read from the generated step (every k_matmul_f32 / k_matmul_add_f32 call:
batch, m, n, k, transposes; a batch is that many calls of one matrix each, as fsdpc makes them).  Each library
then runs every distinct shape in a process of its own (bench/gemm_libs.c, built here), with its thread count set
to --threads through its own environment variable, and the repetitions are interleaved (library after library,
the order rotating).  A shape's time is its best over the repetitions; a library's step time is the sum over the
step's GEMM calls.  The table gives that per size, its GFLOP/s, and each library's ratio to OpenBLAS (below 1:
faster than the OpenBLAS fsdpc links).

Libraries (installed when missing, and said so): OpenBLAS (Debian's libopenblas-openmp-dev, the one fsdpc links),
BLIS (Debian's libblis-dev, its OpenMP build), oneDNN (Debian's libdnnl-dev: dnnl_sgemm), MKL (PyPI's `mkl` wheel,
unpacked into ~/.cache/fsdpc-bench/mkl: libmkl_rt with MKL_THREADING_LAYER=GNU, so it runs on the same libgomp).
"""
import argparse
import collections
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ARCH = "/usr/lib/x86_64-linux-gnu"
ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--repeat", type=int, default=3)
ap.add_argument("--fsdpc", default=os.path.join(HERE, "..", "build", "fsdpc"))
ap.add_argument("--sizes", default="128/4/128/8,256/6/256/8,512/8/256/8,768/12/1024/1", help="d/L/T/B,...")
ap.add_argument("--libs", default="openblas,blis,onednn,mkl")
args = ap.parse_args()
sys.path.insert(0, HERE)
from step_gemms import step_gemms as bench_step_gemms  # noqa: E402



def apt_install(pkg, probe):
    if glob.glob(probe):
        return
    print("installing %s (apt-get) for the benchmark" % pkg, flush=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", pkg], check=True, stdout=subprocess.DEVNULL)


def mkl_lib():
    cache = os.path.expanduser("~/.cache/fsdpc-bench/mkl")
    found = glob.glob(os.path.join(cache, "**", "libmkl_rt.so.2"), recursive=True)
    if found:
        return found[0]
    print("downloading MKL from PyPI (pip download mkl) into %s for the benchmark" % cache, flush=True)
    os.makedirs(cache, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", cache, "mkl"], check=True)
    for whl in glob.glob(os.path.join(cache, "mkl-*.whl")):
        zipfile.ZipFile(whl).extractall(cache)
    found = glob.glob(os.path.join(cache, "**", "libmkl_rt.so.2"), recursive=True)
    if not found:
        raise SystemExit("gemm_libs: the mkl wheel has no libmkl_rt.so.2")
    return found[0]


def libraries(names):
    libs = []
    for name in names:
        if name == "openblas":
            apt_install("libopenblas-openmp-dev", ARCH + "/openblas-openmp/libopenblas.so*")
            libs.append(("OpenBLAS", sorted(glob.glob(ARCH + "/openblas-openmp/libopenblas.so*"))[0], "cblas",
                         {"OPENBLAS_NUM_THREADS": str(args.threads)}))
        elif name == "blis":
            apt_install("libblis-dev", ARCH + "/blis-openmp/libblis.so*")
            libs.append(("BLIS", sorted(glob.glob(ARCH + "/blis-openmp/libblis.so*"))[0], "cblas",
                         {"BLIS_NUM_THREADS": str(args.threads)}))
        elif name == "onednn":
            apt_install("libdnnl-dev", ARCH + "/libdnnl.so*")
            libs.append(("oneDNN", sorted(glob.glob(ARCH + "/libdnnl.so*"))[0], "dnnl", {}))
        elif name == "mkl":
            lib = mkl_lib()  # libmkl_rt loads its threading and kernel libraries from its own directory
            libs.append(("MKL", lib, "cblas", {"MKL_NUM_THREADS": str(args.threads), "MKL_THREADING_LAYER": "GNU",
                                               "LD_LIBRARY_PATH": os.path.dirname(lib)}))
        else:
            raise SystemExit("gemm_libs: unknown library %s" % name)
    return libs


def step_gemms(fsdpc, work, d, L, T, B):
    """{(batch, m, n, k, ta, tb): calls} of one training step of the d/L/T/B GPT"""
    shapes = collections.Counter()
    for (batch, _, _, mm, nn, kk, ta, tb, _), calls in bench_step_gemms(fsdpc, work, d, L, T, B).items():
        shapes[(batch, mm, nn, kk, ta, tb)] += calls
    return shapes


def main():
    libs = libraries(args.libs.split(","))
    root = tempfile.mkdtemp(prefix="fsdpc-gemm-")
    try:
        exe = os.path.join(root, "gemm_libs")
        subprocess.run(["cc", "-O2", "-o", exe, os.path.join(HERE, "gemm_libs.c"), "-ldl"], check=True)
        sizes = [tuple(int(v) for v in s.split("/")) for s in args.sizes.split(",")]
        shapes = {}
        for size in sizes:
            work = os.path.join(root, "%d_%d_%d_%d" % size)
            os.makedirs(work)
            shapes[size] = step_gemms(args.fsdpc, work, *size)
            with open(os.path.join(work, "shapes.txt"), "w") as f:
                for (b, m, n, k, ta, tb), c in sorted(shapes[size].items()):
                    f.write("%d %d %d %d %d %d %d\n" % (c, b, m, n, k, ta, tb))
        print("threads %d, %d interleaved repetitions; libraries: %s" % (
            args.threads, args.repeat, ", ".join("%s (%s)" % (n, p) for n, p, _, _ in libs)), flush=True)
        best = {}  # (lib, size, shape) -> seconds
        for rep in range(args.repeat):
            order = libs[rep % len(libs):] + libs[:rep % len(libs)]
            for name, path, kind, env in order:
                for size in sizes:
                    e = dict(os.environ, OMP_NUM_THREADS=str(args.threads), **env)
                    out = subprocess.run([exe, path, kind, os.path.join(root, "%d_%d_%d_%d" % size, "shapes.txt"),
                                          "3"], env=e, check=True, capture_output=True, text=True).stdout
                    for line in out.split("\n"):
                        if line.strip():
                            c, b, m, n, k, ta, tb, t = line.split()
                            key = (name, size, (int(b), int(m), int(n), int(k), int(ta), int(tb)))
                            best[key] = min(best.get(key, 1e30), float(t))
            print("  repetition %d done" % (rep + 1), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    names = [n for n, _, _, _ in libs]
    print()
    print("| d/L/T/B | GEMMs per step (distinct shapes) | GFLOP per step | " +
          " | ".join("%s ms (GFLOP/s)" % n for n in names) + " | " +
          " | ".join("%s / OpenBLAS" % n for n in names if n != "OpenBLAS") + " |")
    print("|---" * (3 + len(names) + len(names) - 1) + "|")
    for size in sizes:
        gflop = sum(c * 2.0 * b * m * n * k for (b, m, n, k, _, _), c in shapes[size].items()) / 1e9
        tot = {n: sum(c * best[(n, size, s)] for s, c in shapes[size].items()) for n in names}
        base = tot.get("OpenBLAS")
        print("| %s | %d (%d) | %.2f | " % ("/".join(map(str, size)), sum(shapes[size].values()), len(shapes[size]),
                                           gflop) +
              " | ".join("%.1f (%.0f)" % (1e3 * tot[n], gflop / tot[n]) for n in names) + " | " +
              " | ".join("%.2f" % (tot[n] / base) if base else "-" for n in names if n != "OpenBLAS") + " |")


if __name__ == "__main__":
    main()
