#!/usr/bin/env bash
# `kiln plan` against measured peak memory on the CPU: for each case, one fresh
# `kiln bench --train` process (its peak RSS, the kernel's high-water mark, less the pages that map
# files such as the binary, whose residency depends on the page cache, minus the same figure of the
# same process with a model of a few hundred parameters) next to the plan's training peak.
# Usage: benches/plan_vs_rss.sh [KILN_BIN] [CONFIG...]   (defaults: target/release/kiln, the
# tiny and 100M configs). Takes minutes for the 100M model; run on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
KILN="${1:-${KILN_BIN:-target/release/kiln}}"
shift || true
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
python3 - "$TMP" <<'PY'
import re, sys
src = open("core/src/tasks/interplay/tiny_model.rs").read()
open(sys.argv[1] + "/tiny.json", "w").write(src.split('r#"', 1)[1].split('"#', 1)[0])
open(sys.argv[1] + "/empty.json", "w").write('{"vocab_size": 16, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1, "max_position_embeddings": 16}')
PY
CONFIGS=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=("$TMP/tiny.json" tests/fixtures/interplay/qwen2_100M/config.json)
peak() { MIMALLOC_PURGE_DELAY=0 RAYON_NUM_THREADS=1 "$KILN" bench --train --repeats 1 --config "$1" --batch "$2" --prompt-len "$3" --precision "$4" ${5:+--recompute} | python3 -c 'import json,sys; d = json.load(sys.stdin); print(d["peak_rss_mib"] - d["file_rss_mib"])'; }
planned() { "$KILN" plan --json --backend cpu --config "$1" --batch "$2" --seq "$3" --precision "$4" ${5:+--recompute} | python3 -c 'import json,sys; print(json.load(sys.stdin)["training_peak"] / 2**20)'; }
BASE=$(peak "$TMP/empty.json" 1 4 f32 "")
printf 'process without a model: %.1f MiB\n' "$BASE"
printf '%-40s %6s %6s %-11s %-9s %10s %10s %6s\n' config batch seq precision recompute planned measured ratio
for config in "${CONFIGS[@]}"; do
    for case in "4 256 f32 " "4 256 f32 1" "4 256 bf16-mixed " "4 256 bf16-mixed 1" "4 256 bf16-pure "; do
        read -r b t p r <<<"$case"
        m=$(peak "$config" "$b" "$t" "$p" "${r:-}")
        pl=$(planned "$config" "$b" "$t" "$p" "${r:-}")
        python3 -c "import sys; c,b,t,p,r,pl,m,base=sys.argv[1:]; m=float(m)-float(base); print(f'{c[-40:]:<40} {b:>6} {t:>6} {p:<11} {r or \"-\":<9} {float(pl):>10.1f} {m:>10.1f} {float(pl)/m:>6.3f}')" \
            "$config" "$b" "$t" "$p" "${r:-}" "$pl" "$m" "$BASE"
    done
done
