#!/usr/bin/env bash
# One GRPO pilot on a `--scale cpu` release's base, evaluated as the release evaluates (the RL
# pilots of docs/interplay-cpu.md):
#
#   scripts/interplay-cpu-pilot.sh ROOT NAME OPS LR STEPS PROMPTS N [KL]
#   scripts/interplay-cpu-pilot.sh kiln-cpu-release p1 "5, 6" 1e-4 30 16 8
#
# ROOT is the release root after `kiln release run --config examples/configs/release/release.toml
# --scale cpu --stages data,pretrain --out ROOT`; the run goes to ROOT/pilots/NAME, its evaluation
# (50 test prompts per op x 8 samples, temperature 0.7) to ROOT/pilots/NAME-eval. The config is
# the scale's RL run (examples/configs/release/020305/rl_op11_14.toml with [scale.cpu.rl]) with
# the ops, rate, steps, prompts per step, samples per prompt and KL coefficient given; the
# mini-batch is half the prompts (two updates a step). KILN: the kiln binary (default: kiln).
set -euo pipefail
[ $# -ge 7 ] || { sed -n '2,13p' "$0" >&2; exit 2; }
root=$1; name=$2; ops=$3; lr=$4; steps=$5; prompts=$6; n=$7; kl=${8:-0.001}
kiln=${KILN:-kiln}
out="$root/pilots/$name"
mkdir -p "$root/pilots"
cat > "$root/pilots/$name.toml" <<T
[model]
from = "$(realpath "$root")/020305/pretrain/checkpoint-3000"

[data]
kind = "prompts"
dir = "$(realpath "$root")/data/heldout"
ops = [$ops]
max_prompt_length = 1024
seed = 1

[rollout]
n = $n
temperature = 1.0
max_response_length = 384
batch_size = 128

[train]
steps = $steps
prompts_per_step = $prompts
mini_batch = $((prompts / 2))
micro_batch = 16

[optimizer]
lr = $lr
weight_decay = 0.01
max_grad_norm = 1.0

[schedule]
kind = "constant"

[loss]
kl_coef = $kl

[reward]
kind = "outcome"

[output]
dir = "$(realpath -m "$out")"
save_steps = $steps
T
"$kiln" rl --config "$root/pilots/$name.toml"
"$kiln" eval interplay --models "$out/checkpoint-$steps" --data "$root/data/test" --samples 8 \
    --max-new-tokens 512 --batch-size 128 --shard-prompts 25 --id-op-threshold 4 --out "$out-eval"
