#!/usr/bin/env bash
# A training step's memory on wgpu against its sequence length (issue 20: memory linear in T).
# For each length, one fresh `kiln bench --train --backend wgpu` process (batch 1, f32, the
# quickstart's tiny model with 8,192 positions): the device allocator's largest in-use and
# reserved figures, the process's peak RSS (on lavapipe, GPU memory is host memory), and
# `kiln plan`'s training peak for the same step. A step the device refuses fails the command.
# Usage: benches/wgpu_memory.sh [KILN_BIN] [LENGTHS...]  (defaults: target/release/kiln,
# 512 4096 8192). Minutes on lavapipe; run on a quiet machine. KILN_KERNELS=reference measures
# burn's operations instead of kiln's CubeCL kernels (flash attention, RoPE, AdamW; the plan
# column stays that of kiln's kernels); RECOMPUTE=1 measures and plans `--recompute` (every layer
# checkpointed).
set -euo pipefail
cd "$(dirname "$0")/.."
KILN="${1:-${KILN_BIN:-target/release/kiln}}"
shift || true
LENGTHS=("$@")
RECOMPUTE_FLAG=()
[ "${RECOMPUTE:-0}" = 1 ] && RECOMPUTE_FLAG=(--recompute)
[ ${#LENGTHS[@]} -gt 0 ] || LENGTHS=(512 4096 8192)
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
python3 - "$TMP" <<'PY'
import json, sys
src = open("core/src/tasks/interplay/tiny_model.rs").read()
config = json.loads(src.split('r#"', 1)[1].split('"#', 1)[0])
config["max_position_embeddings"] = 8192
json.dump(config, open(sys.argv[1] + "/tiny8k.json", "w"))
PY
printf '%6s %12s %12s %12s %12s %9s\n' seq in_use_MiB reserved_MiB peak_RSS_MiB planned_MiB step_s
for t in "${LENGTHS[@]}"; do
    "$KILN" bench --train --backend wgpu --repeats 1 --config "$TMP/tiny8k.json" --batch 1 --prompt-len "$t" "${RECOMPUTE_FLAG[@]}" > "$TMP/bench.json"
    "$KILN" plan --json --backend wgpu --config "$TMP/tiny8k.json" --batch 1 --seq "$t" "${RECOMPUTE_FLAG[@]}" > "$TMP/plan.json"
    python3 - "$TMP/bench.json" "$TMP/plan.json" "$t" <<'PY'
import json, sys
b, p = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
m = b["device_memory"] or {}
mib = lambda x: x / 2**20 if x is not None else float("nan")
print(f'{sys.argv[3]:>6} {mib(m.get("in_use_max_bytes")):>12.1f} {mib(m.get("reserved_max_bytes")):>12.1f} {b["peak_rss_mib"]:>12.1f} {mib(p["training_peak"]):>12.1f} {b["step_s"]:>9.2f}')
PY
done
