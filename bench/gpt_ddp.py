"""fsdpc FULL_SHARD on 2 ranks against PyTorch on 2 ranks (gloo): the same GPTs, the same global batch.

    bench/gpt_ddp.py [--steps 5] [--fsdpc build/fsdpc] [--torch2 PYTHON] [--sizes 128/4/128/8,...]

Run with Debian's /usr/bin/python3 (torch 1.13, CPU: DDP, the second line).
PyTorch 2 from PyPI runs DDP and FSDP2 (`fully_shard` on each transformer
block, then on the model: FULL_SHARD, as fsdpc's --wrap blocks) under
--torch2 (default: the python3 on PATH when it has torch >= 2, else a
virtual environment bench/torch2.py makes once in ~/.cache/fsdpc-bench/torch2
and installs torch into from PyPI, saying so; --torch2 none leaves those
columns out).  Each rank gets one
thread (OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = 1, set explicitly for both
sides: this machine has 2 cores).  A step = forward + cross-entropy +
backward + gradient averaging + AdamW; the table gives the median step time
after one warm-up step (the best of --repeat interleaved runs of each side:
this machine's speed drifts by tens of percent from minute to minute), the ratio fsdpc/DDP, and per rank: the model state
(parameters, gradients, AdamW's two moments: fsdpc's shards of 1/2, DDP's
whole copies) and the peak resident memory of the rank process (VmHWM).

fsdpc wraps one unit per transformer block (--wrap blocks) and runs twice
from one executable: as it decides by itself (here, 1 core per rank: the
collectives inside the step) and with FSDPC_COMM_THREAD=1 (a communication
thread: the collectives overlap compute as the schedule pass placed them).
A third run, threaded, writes --trace for 2 steps; "overlap" is the share of
the collectives' time on the communication thread during which the step's
thread computed (not waiting), rank 0, step 2.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--repeat", type=int, default=3, help="runs of each side, interleaved; the best median counts")
ap.add_argument("--fsdpc", default=os.path.join(os.path.dirname(__file__), "..", "build", "fsdpc"))
ap.add_argument("--torch2", default="", help="a python with torch >= 2 (default: python3 on PATH if it has it, else one "
                "installed in ~/.cache/fsdpc-bench/torch2; none: leave PyTorch 2 out)")
ap.add_argument("--sizes", default="128/4/128/8,256/6/256/8,512/8/256/8", help="d/L/T/B,...")
ap.add_argument("--ddp-rank", type=int, default=-1, help=argparse.SUPPRESS)  # internal: one PyTorch rank
ap.add_argument("--mode", default="ddp", help=argparse.SUPPRESS)  # internal: ddp or fsdp2
ap.add_argument("--size", default="", help=argparse.SUPPRESS)
ap.add_argument("--out", default="", help=argparse.SUPPRESS)
args = ap.parse_args()
for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ[k] = "1"  # before numpy/torch load OpenBLAS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch2 import ensure_debian_torch, torch2_python  # noqa: E402

if args.ddp_rank < 0:  # the driver (a rank runs under the torch 2 python, which needs no onnx)
    ensure_debian_torch()
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from gpt import GPT, GPTConfig, export  # noqa: E402

torch.set_num_threads(1)
VOCAB, WORLD = 256, 2


def vm_hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def model_of(d, L, T):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, n_layer=L, n_head=max(1, d // 64), n_embd=d, block_size=T, dropout=0.0))


def ddp_rank():
    """one PyTorch rank (a subprocess of this script, under either python): times its steps, writes a JSON line"""
    import torch.distributed as dist
    d, L, T, B = (int(x) for x in args.size.split(","))
    dist.init_process_group("gloo", rank=args.ddp_rank, world_size=WORLD)
    model = model_of(d, L, T)
    n = sum(p.numel() for p in model.parameters())
    if args.mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(args.ddp_rank)
    b = B // WORLD
    idx, lab = torch.randint(0, VOCAB, (b, T), generator=g), torch.randint(0, VOCAB, (b, T), generator=g)
    times = []
    for _ in range(args.steps + 1):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(idx).reshape(-1, VOCAB), lab.reshape(-1))
        loss.backward()
        opt.step()
        loss.item()
        times.append((time.perf_counter() - t) * 1e3)
    state = 4 * 4 * n // (WORLD if args.mode == "fsdp2" else 1)
    with open(args.out, "w") as f:
        json.dump(dict(ms=float(np.median(times[1:])), state=state, hwm=vm_hwm()), f)
    dist.destroy_process_group()


def ddp(d, L, T, B, work, py=sys.executable, mode="ddp"):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + d), OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    outs = [os.path.join(work, "ddp%d.json" % r) for r in range(WORLD)]
    procs = [subprocess.Popen([py, __file__, "--ddp-rank", str(r), "--size", "%d,%d,%d,%d" % (d, L, T, B),
                               "--out", outs[r], "--steps", str(args.steps), "--mode", mode], env=env)
             for r in range(WORLD)]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit("%s %s rank failed" % (py, mode))
    rs = [json.load(open(o)) for o in outs]
    return max(r["ms"] for r in rs), rs[0]["state"], max(r["hwm"] for r in rs)


def overlap_share(trace):
    """rank 0, step 2: the share of the communication thread's busy time during which the step computed"""
    ev = [e for e in json.load(open(trace))["traceEvents"] if e["ph"] == "X" and e["pid"] == 0
          and e["args"]["step"] == 2]
    busy = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["tid"] == 0 and "(Wait)" not in e["name"]]
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["tid"] == 1]
    total = sum(b - a for a, b in comm)
    both = sum(max(0.0, min(b, y) - max(a, x)) for a, b in comm for x, y in busy)
    return both / total if total else 0.0


def fsdpc(model, d, L, T, B, work, thread=None, trace=None):
    path = os.path.join(work, "gpt.onnx")
    exe = os.path.join(work, "train")
    if not os.path.exists(exe):
        export(model, path, B=B // WORLD, T=T)
        subprocess.run([args.fsdpc, path, "-o", exe, "--target", "cpu", "--loss", "cross_entropy:logits,labels",
                        "--dim", "batch=%d" % (B // WORLD), "--wrap", "blocks"], check=True, capture_output=True)
        rng = np.random.default_rng(0)
        rng.integers(0, VOCAB, (args.steps + 2) * B * T + 1).astype("<u2").tofile(os.path.join(work, "tok.bin"))
    m = os.path.join(work, "m.jsonl")
    # each rank's peak resident memory: GNU time's %M (Debian package "time"), into a file per rank
    hwm_file = os.path.join(work, "hwm.")
    for r in range(WORLD):
        if os.path.exists(hwm_file + str(r)):
            os.unlink(hwm_file + str(r))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("FSDPC_COMM_THREAD", None)
    if thread is not None:
        env["FSDPC_COMM_THREAD"] = "1" if thread else "0"
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(WORLD), "-x", "OPENBLAS_NUM_THREADS=1",
           "-x", "OMP_NUM_THREADS=1", "sh", "-c",
           'exec /usr/bin/time -f "HWM %M" -o "$0$OMPI_COMM_WORLD_RANK" "$@"', hwm_file, exe, "--tokens", os.path.join(work, "tok.bin"), "--steps", str(2 if trace else args.steps + 1), "--lr", "1e-4",
           "--metrics", m, "--quiet"] + (["--trace", trace] if trace else [])
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit("fsdpc failed:\n" + p.stderr[-2000:])
    hwm = max(int(open(hwm_file + str(r)).read().split()[1]) * 1024 for r in range(WORLD))
    rows = [json.loads(l) for l in open(m)]
    times = [r["time_ms"] for r in rows if "step" in r]
    return float(np.median(times[1:])), rows[0]["memory"]["state_bytes"], hwm


def main():
    if args.ddp_rank >= 0:
        ddp_rank()
        return
    py2, v2 = torch2_python(args.torch2)
    if not py2:
        print("note: --torch2 none: the DDP and FSDP2 columns of PyTorch 2 are left out")
    sides = ["fsdpc", "fsdpc thread", "DDP %s" % torch.__version__.split("+")[0]]
    if py2:
        sides += ["DDP %s" % v2, "FSDP2 %s" % v2]
    print("2 ranks x 1 thread each; %d timed steps after 1 warm-up; global batch B, B/2 per rank; best of %d "
          "interleaved medians (ms per step)" % (args.steps, args.repeat))
    print("%-14s %9s | %s | %s | %s | %8s | %s" % (
        "d/L/T/B", "params", " ".join("%14s" % s for s in sides),
        " ".join("%14s" % ("f/" + s) for s in sides[2:]),
        " ".join("%12s" % s.split()[0] for s in ["fsdpc"] + sides[2:]), "overlap",
        " ".join("%14s" % s.split()[0] for s in ["fsdpc"] + sides[2:])))
    print("%-14s %9s | %s | %s | %s | %8s | %s" % ("", "", "ms per step".center(15 * len(sides) - 1),
                                                  "ratio".center(15 * len(sides[2:]) - 1),
                                                  "model state per rank".center(13 * len(sides[1:]) - 1), "",
                                                  "peak RSS per rank".center(15 * len(sides[1:]) - 1)))
    for size in args.sizes.split(","):
        d, L, T, B = (int(x) for x in size.split("/"))
        model = model_of(d, L, T)
        n = sum(p.numel() for p in model.parameters())
        with tempfile.TemporaryDirectory() as work:
            runs = {s: [] for s in sides}
            for _ in range(args.repeat):  # interleaved: a slow minute of the machine hits every side
                runs["fsdpc"].append(fsdpc(model, d, L, T, B, work))
                runs["fsdpc thread"].append(fsdpc(model, d, L, T, B, work, thread=True))
                runs[sides[2]].append(ddp(d, L, T, B, work))
                if py2:
                    runs[sides[3]].append(ddp(d, L, T, B, work, py2, "ddp"))
                    runs[sides[4]].append(ddp(d, L, T, B, work, py2, "fsdp2"))
            best = {s: min(r, key=lambda x: x[0]) for s, r in runs.items()}
            fsdpc(model, d, L, T, B, work, thread=True, trace=os.path.join(work, "t.json"))
            share = overlap_share(os.path.join(work, "t.json"))
        f = best["fsdpc"][0]
        print("%-14s %9d | %s | %s | %s | %7.0f%% | %s" % (
            size, n, " ".join("%14.1f" % best[s][0] for s in sides),
            " ".join("%14.2f" % (f / best[s][0]) for s in sides[2:]),
            " ".join("%9.1f MB" % (best[s][1] / 1e6) for s in ["fsdpc"] + sides[2:]), 100 * share,
            " ".join("%11.1f MB" % (best[s][2] / 1e6) for s in ["fsdpc"] + sides[2:])), flush=True)


if __name__ == "__main__":
    main()
