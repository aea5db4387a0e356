#!/bin/sh
# make_cases.sh FSDPC — writes the golden cases of tests/passes that are dumps of tiny models: each
# PASS/CASE.ir is the IR before PASS (--dump-after the pass before it) of examples/mlp.onnx or of
# tiny_gpt.onnx (examples/gpt.py tiny_gpt.onnx --vocab 8 --layers 1 --heads 2 --embd 4 --block 4 --batch 1),
# with the flags its name says; the gpt_dropout cases of tiny_gpt_drop.onnx (the same with --dropout 0.1: a training
# Dropout on the attention probabilities).  Run it when the IR text itself changes; then `run.py FSDPC --update` writes
# the expected outputs (review both diffs).  The other cases are written by hand and kept as they are.
set -eu
F=$(realpath "$1")
cd "$(dirname "$0")"
MLP="../../examples/mlp.onnx --loss mse:y,target --dim batch=2 --target cpu --wrap size:1000"
GPT="tiny_gpt.onnx --loss cross_entropy:logits,labels --dim batch=1 --target cpu --wrap size:100"
GPTD="tiny_gpt_drop.onnx --loss cross_entropy:logits,labels --dim batch=1 --target cpu --wrap size:100"
PASSES="frontend fold shape gelu attention loss autodiff optim units shard precision recompute fuse schedule pack memplan"

# case PASS NAME MODEL-AND-FLAGS...: PASS/NAME.ir = the dump after the pass before PASS
case_() {
    pass=$1 name=$2
    shift 2
    prev=
    for p in $PASSES; do
        [ "$p" = "$pass" ] && break
        prev=$p
    done
    mkdir -p "$pass"
    # (--dump-after does not stop the pipeline: a refusal by PASS itself comes after the dump)
    { echo "# made by make_cases.sh: fsdpc $* --dump-after $prev"; "$F" "$@" --dump-after "$prev" 2>/dev/null || true; } \
        > "$pass/$name.ir"
    grep -q '^nodes:' "$pass/$name.ir" || { echo "make_cases.sh: no dump for $pass/$name" >&2; exit 1; }
}

case_ fold mlp $MLP
case_ fold gpt $GPT
case_ shape mlp $MLP
case_ shape gpt $GPT
case_ gelu gpt $GPT
case_ gelu gpt_nofuse $GPT --no-fuse
case_ attention gpt $GPT
case_ attention gpt_cuda_bf16 $GPT --target cuda --precision bf16
case_ attention gpt_nofuse $GPT --no-fuse
case_ attention gpt_dropout $GPTD
case_ attention gpt_dropout_cuda $GPTD --target cuda
case_ loss mlp_mse $MLP
case_ loss mlp_huber $MLP --loss huber:y,target --huber-delta 0.5
case_ loss mlp_l1 $MLP --loss l1:y,target
case_ loss mlp_bce $MLP --loss bce:y,target
case_ loss mlp_smooth_l1 $MLP --loss smooth_l1:y,target --smooth-l1-beta 0.25
case_ loss gpt_ce_smoothing $GPT --label-smoothing 0.1
case_ autodiff mlp $MLP
case_ autodiff mlp_freeze $MLP --freeze 'fc1.*'
case_ autodiff gpt $GPT
case_ optim mlp_adamw $MLP
case_ optim mlp_sgd $MLP --optimizer sgd
case_ optim mlp_adam_frozen $MLP --optimizer adam --freeze 'fc2.*'
case_ units mlp_size $MLP
case_ units mlp_prefix $MLP --wrap prefix:fc1,fc2
case_ units gpt_blocks_refused $GPT --wrap blocks
case_ shard mlp_full $MLP
case_ shard mlp_grad_op $MLP --shard grad_op
case_ shard mlp_none $MLP --shard none
case_ shard mlp_hybrid $MLP --shard hybrid:2
case_ precision mlp_bf16 $MLP --precision bf16
case_ precision mlp_fp16_reduce_bf16 $MLP --precision fp16 --reduce-dtype bf16
case_ precision gpt_bf16 $GPT --precision bf16
case_ precision mlp_fp32 $MLP
case_ recompute gpt_units $GPT --recompute units
case_ recompute gpt_selective $GPT --recompute selective
case_ recompute mlp_none $MLP
case_ fuse gpt $GPT
case_ fuse gpt_bf16 $GPT --precision bf16
case_ fuse gpt_nofuse $GPT --no-fuse
case_ schedule mlp_pre $MLP
case_ schedule mlp_post_forward $MLP --prefetch backward_post --forward-prefetch
case_ schedule mlp_none_k1 $MLP --prefetch none --max-inflight 1
case_ pack gpt $GPT
case_ pack gpt_bf16 $GPT --precision bf16 --recompute units
case_ pack gpt_cuda $GPT --target cuda
case_ memplan mlp $MLP
case_ memplan mlp_none $MLP --shard none
case_ memplan gpt_bf16 $GPT --precision bf16 --recompute units

# derive PASS NAME FROM 'SED' 'WHY': PASS/NAME.ir = PASS/FROM.ir edited (a refusal the flags or a field cause)
derive() {
    { echo "# $5 (make_cases.sh: $1/$3.ir with sed '$4')"; sed "$4" "$1/$3.ir" | grep -v '^# made by'; } > "$1/$2.ir"
}

derive autodiff params_nomatch_refused mlp 's/^flags: .*/& --params zz*/' "refusal: --params matching no initializer"
derive autodiff all_frozen_refused mlp 's/^flags: .*/& --freeze */' "refusal: every initializer frozen, nothing to train"
derive units prefix_nomatch_refused mlp_size 's/--wrap size:1000/--wrap prefix:fc1,zz/' "refusal: a --wrap prefix that starts no parameter name"
derive precision f64_refused mlp_bf16 's/elements f32 params/elements f64 params/' "refusal: --precision bf16 on a unit of float64 parameters"
derive gelu gpt_wrong_sqrt2 gpt 's/data=\[1.4142135\]/data=[1.4142]/' "kept: the GELU's sqrt 2 written 1.4142 (not GELU's constant within float rounding), the composition stays"
derive attention elided_mask_refused gpt 's/\(attn.mask" init [0-9]* persistent\) data=\[[^]]*\]/\1 data=elided:0123456789abcdef/' "refusal: the mask's values are not in the file, and attention reads them"
