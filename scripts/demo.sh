#!/usr/bin/env bash
# The README's demo: install what is missing, build fsdpc, compile the shipped
# byte-level GPT (examples/gpt.onnx) into a training executable, train it on a
# text that ships with Debian (the GPL-3 licence; its last tenth held out for
# validation) on 2 ranks, draw the run
# (build/demo/run.png), sample a few lines from the trained model through a
# forward-only executable, export the ONNX.  Each stage prints a line as it
# starts; only what the demo needs is built (fsdpc's target: the compiler, its
# runtime and kernels; no test and no fuzzer).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== setup: the Debian packages fsdpc needs (scripts/setup.sh; only what is missing)"
scripts/setup.sh
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "== configure: cmake -S . -B build -G Ninja (warnings only)"
cmake -S . -B build -G Ninja --log-level=WARNING
echo "== build: the compiler, its runtime and kernels (cmake --build build --target fsdpc; minutes the first time)"
cmake --build build --target fsdpc
out=build/demo
mkdir -p $out
corpus=/usr/share/common-licenses/GPL-3
/usr/bin/python3 -c "
import numpy as np, sys
t = np.frombuffer(open(sys.argv[1], 'rb').read(), np.uint8).astype('<u2')
n = len(t) * 9 // 10
t[:n].tofile(sys.argv[2]); t[n:].tofile(sys.argv[3])" $corpus $out/text.bin $out/val.bin
echo "== corpus: $corpus ($(stat -c %s $corpus) bytes, one token per byte; the last tenth held out)"

echo "== compile: examples/gpt.onnx (2 layers, d 64, T 64, 121k parameters) -> $out/train, FULL_SHARD"
build/fsdpc examples/gpt.onnx -o $out/train --target cpu --loss cross_entropy:logits,labels \
  --optimizer adamw --dim batch=8 --wrap size:30000 --report --world 2

echo "== train on 2 ranks (global batch 16 x 64 tokens; --shuffle: each epoch visits the windows in its own order)"
mpirun -np 2 $out/train --tokens $out/text.bin --val-tokens $out/val.bin --eval-every 100 --steps 800 --shuffle \
  --lr 2e-3 --weight-decay 0.01 --log-every 50 --metrics $out/metrics.jsonl --export-onnx $out/trained.onnx

/usr/bin/python3 - "$out/metrics.jsonl" <<'PY'
import json, sys
loss = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"step"' in l]
k = max(1, len(loss) // 10)
first, last = sum(loss[:k]) / k, sum(loss[-k:]) / k
print("== loss fell from %.3f (first %d steps) to %.3f (last %d steps)" % (first, k, last, k))
sys.exit(0 if last < 0.7 * first else 1)
PY

/usr/bin/python3 scripts/plot_metrics.py $out/metrics.jsonl -o $out/run.png --title "examples/gpt.onnx, 2 ranks"

echo "== sample from the trained model (forward-only executable built from $out/trained.onnx)"
build/fsdpc $out/trained.onnx -o $out/sample --target cpu --eval --dim batch=1
/usr/bin/python3 examples/sample.py $out/sample $out/sampling --prompt "This License " --chars 240
echo "== trained model: $out/trained.onnx"
