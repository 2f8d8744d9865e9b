#!/usr/bin/env bash
# The gradient all-reduce overlapped with the backward pass, on the CPU: `kiln pretrain` of the
# 100M config as two processes over 127.0.0.1 (one replica each, kiln's TCP ring), 4 steps of
# 2 × 256 tokens per process, `[train] overlap_grad_reduce` off and on, alternating, ROUNDS times
# (default 2), with and without `recompute` (RECOMPUTE="false true" by default). Prints for
# each run the mean over steps 2-4 of the metrics step_s and grad_reduce_wait_s (the time a step
# waits for its sums after the backward pass) and grad_values_overlapped (values summed during
# it), and whether the runs' final weights are the same bytes.
# On one machine the ring's traffic is memory copies that compete with the training for the same
# cores; LINK=4gbit (root, Linux `tc`) instead shapes all loopback traffic to that rate for the
# runs (a token bucket on `lo`, removed at exit), a stand-in for the network between two nodes.
# Usage: [LINK=4gbit] [ROUNDS=2] [RECOMPUTE="false true"] benches/overlap_grad_reduce.sh [KILN_BIN]
# (default target/release/kiln). About a minute a run on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
KILN="$(realpath "${1:-${KILN_BIN:-target/release/kiln}}")"
FIX="$PWD/tests/fixtures/interplay/qwen2_100M"
ROUNDS="${ROUNDS:-2}"
RECOMPUTE="${RECOMPUTE:-false true}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"; [ -z "${LINK:-}" ] || tc qdisc del dev lo root 2>/dev/null || true' EXIT
if [ -n "${LINK:-}" ]; then
    tc qdisc replace dev lo root tbf rate "$LINK" burst 4mb latency 200ms
    echo "loopback shaped to $LINK: $(tc qdisc show dev lo)"
fi
"$KILN" data interplay --ops 2 --per-op 200 --seed 1 --split train --out "$TMP/data" >/dev/null 2>&1
port=$((29600 + RANDOM % 1000))
printf '%-10s %-9s %-6s %10s %20s %24s\n' recompute overlap round step_s grad_reduce_wait_s grad_values_overlapped
for round in $(seq "$ROUNDS"); do
    for recompute in $RECOMPUTE; do
        for overlap in false true; do
            run="r${recompute}_o${overlap}_$round"
            cat >"$TMP/$run.toml" <<EOF
[model]
init = "$FIX/config.json"
tokenizer = "$FIX"
seed = 3

[data]
kind = "mixture"
root = "data"
ops = [2]
probs = [1.0]
tokens = 20000
cutoff_len = 256

[train]
steps = 4
micro_batch = 2
recompute = $recompute
overlap_grad_reduce = $overlap

[optimizer]
lr = 1e-4

[output]
dir = "out_$run"
save_steps = 4
EOF
            port=$((port + 1))
            pids=()
            for rank in 0 1; do
                (cd "$TMP" && "$KILN" pretrain --config "$run.toml" --nnodes 2 --node-rank $rank \
                    --master-addr "127.0.0.1:$port" >"log_${run}_$rank" 2>&1) &
                pids+=($!)
            done
            for rank in 0 1; do
                wait "${pids[$rank]}" || { cat "$TMP/log_${run}_$rank" >&2; exit 1; }
            done
            python3 - "$TMP/out_$run/metrics.jsonl" "$recompute" "$overlap" "$round" <<'PY'
import json, sys
records = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [r for r in records if "step_s" in r][1:]
mean = lambda key: sum(r[key] for r in steps) / len(steps)
print(f"{sys.argv[2]:<10} {sys.argv[3]:<9} {sys.argv[4]:<6} {mean('step_s'):>10.2f} {mean('grad_reduce_wait_s'):>20.3f} {mean('grad_values_overlapped'):>24,.0f}")
PY
        done
        if cmp -s "$TMP/out_r${recompute}_ofalse_$round/checkpoint-4/model.safetensors" "$TMP/out_r${recompute}_otrue_$round/checkpoint-4/model.safetensors"; then
            echo "  recompute=$recompute round $round: final weights the same bytes with and without overlap"
        else
            echo "  recompute=$recompute round $round: final weights DIFFER"
        fi
    done
done
