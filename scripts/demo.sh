#!/usr/bin/env bash
# The README's demo: install what is missing, build fsdpc, compile the shipped
# example MLP into a training executable and train it on 2 ranks with MPI.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cmake -S . -B build -G Ninja >/dev/null
cmake --build build >/dev/null
out=build/demo
mkdir -p $out
/usr/bin/python3 examples/make_data.py $out 8192

echo "== compile: examples/mlp.onnx -> $out/train (2 ranks x batch 64, FULL_SHARD)"
build/fsdpc examples/mlp.onnx -o $out/train --target cpu --loss mse:y,target --optimizer adamw \
  --dim batch=64 --wrap size:1000 --report --world 2

echo "== train on 2 ranks"
mpirun -np 2 $out/train --data x=$out/x.npy --data target=$out/y.npy \
  --steps 400 --lr 3e-3 --log-every 40 --metrics $out/metrics.jsonl --export-onnx $out/trained.onnx

/usr/bin/python3 - "$out/metrics.jsonl" <<'PY'
import json, sys
loss = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"step"' in l]
k = max(1, len(loss) // 10)
first, last = sum(loss[:k]) / k, sum(loss[-k:]) / k
print("== loss fell from %.4f (first %d steps) to %.4f (last %d steps)" % (first, k, last, k))
sys.exit(0 if last < 0.5 * first else 1)
PY
echo "== trained model: $out/trained.onnx"
