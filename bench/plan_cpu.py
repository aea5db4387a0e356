"""The cost model on this machine: fsdpc --report --hw (calibrated here) against the measured step.

    /usr/bin/python3 bench/plan_cpu.py [--fsdpc build/fsdpc] [--worlds 1,2] [--sizes 128/4/128/8,...]
                                       [--steps 6] [--repeat 2]

For each world W (default 1 to the core count: --calibrate refuses more ranks than cores): `fsdpc --calibrate --world W` measures this machine on W ranks (GEMMs, memory, fsdpc's
kernels, the collectives; each rank with the threads a training executable would take: the cores / W, set
explicitly through OMP_NUM_THREADS and OPENBLAS_NUM_THREADS for both the calibration and the runs).  Then for
each GPT size (bench/'s GPT: d/L/T/B, B per rank, --wrap blocks) and strategy (full, grad_op, none; hybrid:2 at
world 4), the predicted step (`--report --hw W.hw --report-json`) beside the measured one (the median step of
--steps after one warm-up, rank 0's metrics; the best of --repeat interleaved runs).  Prints the table and the
share within 15 %.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--fsdpc", default=os.path.join(HERE, "..", "build", "fsdpc"))
ap.add_argument("--worlds", default=",".join(str(w) for w in range(1, (os.cpu_count() or 1) + 1)))
ap.add_argument("--sizes", default="128/4/128/8,256/6/256/8")
ap.add_argument("--steps", type=int, default=6)
ap.add_argument("--repeat", type=int, default=2)
args = ap.parse_args()

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "examples"))
from gpt import GPT, GPTConfig, export  # noqa: E402

VOCAB = 256
CORES = os.cpu_count() or 1
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
ENV.pop("FSDPC_COMM_THREAD", None)


def threads(world):
    return max(1, CORES // world)


def env(world):
    t = str(threads(world))
    return dict(ENV, OMP_NUM_THREADS=t, OPENBLAS_NUM_THREADS=t)


def mpi(world, argv):
    if world == 1:
        return argv
    t = str(threads(world))
    return ["mpirun", "--oversubscribe", "-np", str(world), "-x", "OMP_NUM_THREADS=" + t, "-x",
            "OPENBLAS_NUM_THREADS=" + t] + argv


def measure(work, exe, world):
    m = os.path.join(work, "m.jsonl")
    if os.path.exists(m):
        os.unlink(m)
    subprocess.run(mpi(world, [exe, "--tokens", os.path.join(work, "tok.bin"), "--steps", str(args.steps + 1),
                               "--lr", "1e-4", "--metrics", m, "--quiet"]), check=True, env=env(world),
                   stdout=subprocess.DEVNULL)
    rows = [json.loads(l) for l in open(m) if '"step"' in l]
    return statistics.median(r["time_ms"] for r in rows[1:])


def main():
    worlds = [int(w) for w in args.worlds.split(",")]
    sizes = [tuple(int(v) for v in s.split("/")) for s in args.sizes.split(",")]
    root = tempfile.mkdtemp(prefix="fsdpc-plan-")
    print("%d cores; per rank: cores / world threads; %d timed steps after 1 warm-up; best of %d interleaved "
          "medians; fsdpc --calibrate per world" % (CORES, args.steps, args.repeat), flush=True)
    runs = []
    for W in worlds:
        hw = os.path.join(root, "w%d.hw" % W)
        p = subprocess.run([args.fsdpc, "--calibrate", "--world", str(W), "-o", hw], env=env(W), check=True,
                           capture_output=True, text=True)
        print(p.stdout.strip(), flush=True)
        for d, L, T, B in sizes:
            work = os.path.join(root, "%d_%d_%d_%d_w%d" % (d, L, T, B, W))
            os.makedirs(work)
            torch.manual_seed(0)
            model = GPT(GPTConfig(vocab_size=VOCAB, n_layer=L, n_head=max(1, d // 64), n_embd=d, block_size=T))
            export(model, os.path.join(work, "gpt.onnx"), B=B, T=T)
            np.random.default_rng(0).integers(0, VOCAB, (args.steps + 2) * W * B * T + 1).astype("<u2").tofile(
                os.path.join(work, "tok.bin"))
            for s in ["full", "grad_op", "none"] + (["hybrid:2"] if W == 4 else []):
                exe = os.path.join(work, "train_" + s.replace(":", ""))
                rj = os.path.join(work, "r.json")
                subprocess.run([args.fsdpc, os.path.join(work, "gpt.onnx"), "-o", exe, "--target", "cpu", "--loss",
                                "cross_entropy:logits,labels", "--dim", "batch=%d" % B, "--wrap", "blocks",
                                "--shard", s, "--report", "--world", str(W), "--hw", hw, "--report-json", rj],
                               check=True, stdout=subprocess.DEVNULL)
                r = json.load(open(rj))
                runs.append(dict(size=(d, L, T, B), world=W, strategy=s, exe=exe, work=work,
                                 pred=r["step_time_s"] * 1e3, compute=r["compute_s"] * 1e3,
                                 exposed=r["exposed_comm_s"] * 1e3, times=[]))
    for rep in range(args.repeat):
        for r in runs:
            r["times"].append(measure(r["work"], r["exe"], r["world"]))
    print("\n| d/L/T/B | world | --shard | predicted ms (compute, exposed comm) | measured ms | predicted / measured |")
    print("|---|---|---|---|---|---|")
    good = 0
    for r in runs:
        meas = min(r["times"])
        ratio = r["pred"] / meas
        good += abs(ratio - 1) <= 0.15
        print("| %s | %d | %s | %.1f (%.1f, %.1f) | %.1f | %.2f |" % ("/".join(map(str, r["size"])), r["world"],
              r["strategy"], r["pred"], r["compute"], r["exposed"], meas, ratio))
    print("\nwithin 15 %%: %d of %d" % (good, len(runs)))


main()
