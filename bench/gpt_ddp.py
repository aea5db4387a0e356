"""fsdpc FULL_SHARD on 2 ranks against PyTorch DDP (gloo) on 2 ranks: the same GPTs, the same global batch.

    bench/gpt_ddp.py [--steps 5] [--fsdpc build/fsdpc]

Run with Debian's /usr/bin/python3 (torch 1.13, CPU).  Each rank gets one
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
ap.add_argument("--ddp-rank", type=int, default=-1, help=argparse.SUPPRESS)  # internal: one DDP rank
ap.add_argument("--size", default="", help=argparse.SUPPRESS)
ap.add_argument("--out", default="", help=argparse.SUPPRESS)
args = ap.parse_args()
for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ[k] = "1"  # before numpy/torch load OpenBLAS

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from gpt import GPT, GPTConfig, export  # noqa: E402

torch.set_num_threads(1)
SIZES = [(128, 4, 128, 8), (256, 6, 256, 8), (512, 8, 256, 8)]  # d, L, T, global B
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
    """one DDP rank (a subprocess of this script): times its steps, writes a JSON line"""
    import torch.distributed as dist
    d, L, T, B = (int(x) for x in args.size.split(","))
    dist.init_process_group("gloo", rank=args.ddp_rank, world_size=WORLD)
    model = torch.nn.parallel.DistributedDataParallel(model_of(d, L, T))
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
    n = sum(p.numel() for p in model.parameters())
    with open(args.out, "w") as f:
        json.dump(dict(ms=float(np.median(times[1:])), state=4 * 4 * n, hwm=vm_hwm()), f)
    dist.destroy_process_group()


def ddp(d, L, T, B, work):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + d), OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1")
    outs = [os.path.join(work, "ddp%d.json" % r) for r in range(WORLD)]
    procs = [subprocess.Popen([sys.executable, __file__, "--ddp-rank", str(r), "--size", "%d,%d,%d,%d" % (d, L, T, B),
                               "--out", outs[r], "--steps", str(args.steps)], env=env) for r in range(WORLD)]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit("DDP rank failed")
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
    print("2 ranks x 1 thread each; %d timed steps after 1 warm-up; global batch B, B/2 per rank" % args.steps)
    print("%-14s %9s | %9s %9s %6s | %12s %8s | %12s %12s | %12s %12s" % (
        "d/L/T/B", "params", "DDP ms", "fsdpc ms", "ratio", "thread ms", "overlap", "DDP state", "fsdpc state",
        "DDP peak RSS", "fsdpc RSS"))
    for d, L, T, B in SIZES:
        model = model_of(d, L, T)
        n = sum(p.numel() for p in model.parameters())
        with tempfile.TemporaryDirectory() as work:
            runs = []
            for _ in range(args.repeat):  # interleaved: a slow minute of the machine hits every side
                runs.append((fsdpc(model, d, L, T, B, work), fsdpc(model, d, L, T, B, work, thread=True)[0],
                             ddp(d, L, T, B, work)))
            f_ms, f_state, f_hwm = min((r[0] for r in runs), key=lambda x: x[0])
            s_ms = min(r[1] for r in runs)
            t_ms, t_state, t_hwm = min((r[2] for r in runs), key=lambda x: x[0])
            fsdpc(model, d, L, T, B, work, thread=True, trace=os.path.join(work, "t.json"))
            share = overlap_share(os.path.join(work, "t.json"))
        print("%-14s %9d | %9.1f %9.1f %6.2f | %12.1f %7.0f%% | %10.1f MB %10.1f MB | %10.1f MB %10.1f MB" % (
            "%d/%d/%d/%d" % (d, L, T, B), n, t_ms, f_ms, f_ms / t_ms, s_ms, 100 * share, t_state / 1e6,
            f_state / 1e6, t_hwm / 1e6, f_hwm / 1e6))


if __name__ == "__main__":
    main()
