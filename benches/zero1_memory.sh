#!/usr/bin/env bash
# ZeRO-1's memory on the CPU: `kiln pretrain` of the 100M config as two replicas in one process
# (`devices = ["cpu", "cpu"]`), 3 steps of 2 × 128 tokens per replica, without and with
# `[train] shard_optimizer`. Prints, for each run, the metric optimizer_state_values (AdamW
# values a replica holds), the process's resident memory after the last step (the metric
# rss_mib: the steady state) and its peak (the kernel's high-water mark, which includes writing
# the final checkpoint, when rank 0 holds the whole moments), and the mean time of steps 2 and 3
# (the metric step_s; sharded, it includes handing out the updated weights).
# Usage: benches/zero1_memory.sh [KILN_BIN]   (default target/release/kiln). About a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
KILN="$(realpath "${1:-${KILN_BIN:-target/release/kiln}}")"
FIX="$PWD/tests/fixtures/interplay/qwen2_100M"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
"$KILN" data interplay --ops 2 --per-op 200 --seed 1 --split train --out "$TMP/data" >/dev/null 2>&1
printf '%-16s %22s %16s %14s %12s\n' shard_optimizer optimizer_state_values "rss after step 3" "peak rss" "steps 2-3 s"
for shard in false true; do
    cat >"$TMP/run_$shard.toml" <<EOF
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
cutoff_len = 128

[train]
steps = 3
micro_batch = 2
devices = ["cpu", "cpu"]
shard_optimizer = $shard

[optimizer]
lr = 1e-4

[output]
dir = "out_$shard"
EOF
    (cd "$TMP" && /usr/bin/time -f '%M' -o "peak_$shard" "$KILN" pretrain --config "run_$shard.toml" >"log_$shard" 2>&1) \
        || { cat "$TMP/log_$shard" >&2; exit 1; }
    python3 - "$TMP/out_$shard/metrics.jsonl" "$TMP/peak_$shard" "$shard" <<'PY'
import json, sys
records = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
last = [r for r in records if "optimizer_state_values" in r][-1]
peak_kib = int(open(sys.argv[2]).read().split()[-1])
steps = [r["step_s"] for r in records if "step_s" in r][1:]
print(f"{sys.argv[3]:<16} {last['optimizer_state_values']:>22,.0f} {last['rss_mib']:>12,.0f} MiB {peak_kib / 1024:>10,.0f} MiB {sum(steps) / max(len(steps), 1):>12.2f}")
PY
done
