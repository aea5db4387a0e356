#!/bin/sh
# run.sh FUZZER SRC WORK PYTHON — the ctest fuzz_compile: FUZZER (tests/fuzz_compile.c under libFuzzer, ASan,
# UBSan) for $FSDPC_FUZZ_SECONDS seconds (default 60), seeded with examples/*.onnx, tests/data/opset23/*.onnx
# (Attention, RotaryEmbedding, RMSNormalization) and ONNX's node-test models
# (libonnx-testdata), raw and as tests/fuzz/seeds.py prepares them (made once, in WORK/gen), its corpus kept
# in WORK/corpus (so that longer and later runs build on it).  Fails on
# any crash, sanitizer report, leak, input slower than $FSDPC_FUZZ_TIMEOUT s (default 60) or over 2 GiB;
# the input is then WORK/artifacts/*: rerun it with `FUZZER FILE`.  Exit 77 (skipped) without a fuzzer.
# The limit is wall-clock (libFuzzer's) and catches hangs, not slowness: legal inputs with Resize tables of
# 2^20 positions compile 6 pipelines twice (the leak check) in 6-7 s of CPU under the sanitizers, 17-30 s
# of wall time on a loaded 2-core machine; 60 s leaves room for that.
set -u
fuzzer=$1 src=$2 work=$3 python=$4
if [ ! -x "$fuzzer" ]; then
  echo "fuzz_compile: skipped: no libFuzzer build of the compiler (needs clang and libclang-rt-14-dev at" \
       "configure time: scripts/setup.sh --test installs them)"
  exit 77
fi
secs=${FSDPC_FUZZ_SECONDS:-60}
mkdir -p "$work/corpus" "$work/seeds" "$work/artifacts" || exit 1
# tests/fuzz/found: inputs a fuzz run once failed on (crashes, leaks), kept as seeds: replayed first, every run
for f in "$src"/examples/*.onnx "$src"/tests/data/opset23/*.onnx "$src"/tests/fuzz/found/*; do ln -sf "$f" "$work/seeds/"; done
n=0
for d in /usr/share/libonnx-testdata/data/node/*/; do
  [ -f "$d/model.onnx" ] && ln -sf "$d/model.onnx" "$work/seeds/$(basename "$d").onnx" && n=$((n + 1))
done
if [ "$n" -gt 0 ] && [ ! -f "$work/gen.done" ]; then
  "$python" "$src/tests/fuzz/seeds.py" "$work/gen" && touch "$work/gen.done"
fi
[ "$n" -gt 0 ] || echo "fuzz_compile: note: no /usr/share/libonnx-testdata (package libonnx-testdata): seeded" \
  "with examples/ only"
# a dictionary: the ONNX op types fsdpc accepts, the default domain, some attribute names
{
  sed -n -e 's/^OP(\([A-Za-z]*\), *[1-9][0-9]*,.*/"\1"/p' -e 's/^EW[12](\([A-Za-z]*\),.*/"\1"/p' \
    -e 's/^EW2D(\([A-Za-z]*\), *[1-9][0-9]*,.*/"\1"/p' "$src/ir/ops.def"
  for w in ai.onnx axis axes perm keepdims epsilon training_mode transA transB alpha beta kernel_shape strides \
           pads dilations group value to split momentum reduction ignore_index batch_dims equation mode \
           coordinate_transformation_mode nearest_mode cubic_coeff_a exclude_outside is_causal q_num_heads \
           kv_num_heads softcap scale num_heads interleaved rotary_embedding_dim exclusive reverse \
           select_last_index "..." "->"; do
    echo "\"$w\""
  done
} > "$work/onnx.dict"
rm -f "$work"/artifacts/*
# -report_slow_units at the limit too: libFuzzer's default (10 s) writes a slow-unit-* artifact, which failed the
# run, for inputs of 1-2 s alone that a loaded machine stretched past 10 s (seen: 3 of 1.03M executions, 28 s)
lim=${FSDPC_FUZZ_TIMEOUT:-60}
# libFuzzer's own codes (77 on a crash) would read as ctest's skip: 1 for every failure instead
"$fuzzer" -max_total_time="$secs" -timeout="$lim" -report_slow_units="$lim" -rss_limit_mb=2048 \
  -error_exitcode=1 -timeout_exitcode=1 -close_fd_mask=3 -print_final_stats=1 \
  -dict="$work/onnx.dict" -artifact_prefix="$work/artifacts/" "$work/corpus" "$work/seeds" $(ls -d "$work/gen" 2>/dev/null)
rc=$?
found=$(ls "$work/artifacts")
if [ "$rc" -ne 0 ] || [ -n "$found" ]; then
  echo "fuzz_compile: FAILED (exit $rc); the inputs: ${found:-none written} in $work/artifacts"
  exit 1
fi
echo "fuzz_compile: ${secs} s, no crash, leak, timeout or blow-up"
