# Sourced by scripts/gpu-check.sh and scripts/multi-gpu-check.sh: the small pre-training run both
# compare across collectives (a 2-layer, 128-wide Qwen2 on generated op-2 problems).
#
#   small_run DIR NAME STEPS MICRO_BATCH TOKENS [OPTIMIZER_LINE [TRAIN_LINE]]
#
# writes DIR/model/config.json and DIR/NAME.toml (output in DIR/NAME, data read from DIR/data).
small_run() {
    local dir=$1 name=$2 steps=$3 micro=$4 tokens=$5 optimizer=${6:-} train=${7:-}
    mkdir -p "$dir/model"
    cat >"$dir/model/config.json" <<'JSON'
{"vocab_size": 2200, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "tie_word_embeddings": true, "max_position_embeddings": 256, "rope_theta": 1000000.0, "eos_token_id": 3}
JSON
    cat >"$dir/$name.toml" <<TOML
[model]
init = "model/config.json"
tokenizer = "$PWD/tests/fixtures/interplay/qwen2_100M"
seed = 3
[data]
kind = "mixture"
root = "data"
ops = [2]
probs = [1.0]
tokens = $tokens
cutoff_len = 128
[train]
steps = $steps
micro_batch = $micro
grad_accum = 2
seed = 5
$train
[optimizer]
lr = 3e-3
$optimizer
[output]
dir = "$name"
TOML
}
