#!/usr/bin/env bash
# kiln against PyTorch/transformers on this machine, one benchmark after the other, as ONE table
# with ratios and the CPU model (issue 13's goals). Run it on a quiet machine: every figure is
# wall-clock throughput.
#
#   benches/compare.sh                      # CPU: kiln (Flex) vs transformers/PyTorch
#   benches/compare.sh --backends cpu,wgpu  # adds kiln's other backends as extra columns
#   benches/compare.sh --quick              # fewer repeats (a smoke run, not for the README)
#
# Environment: PYTHON (default /work/pyenv/bin/python, else python3) with torch + transformers;
# KILN (default: builds target/release/kiln, with the features the backends need).
# Rows: generation of the 100M config at batch 8 x 64 -> 128 (prefill, decode, end to end),
# decoding at batch 32 and 128, RL rollouts through an autodiff-loaded model (`--rollout`, vs
# plain `kiln bench` at the same batch), training steps (forward, backward, clip, AdamW) of the
# 100M config at 8 x 256 and of the quickstart's tiny config at 8 x 512, and this machine's
# sgemm rate (torch.mm 2048^3), the ceiling the training figures compare with.
set -euo pipefail
cd "$(dirname "$0")/.."

backends=cpu
repeats=3
while [ $# -gt 0 ]; do
  case "$1" in
    --backends) backends="$2"; shift 2 ;;
    --quick) repeats=1; shift ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done

PYTHON="${PYTHON:-/work/pyenv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
"$PYTHON" -c "import torch, transformers" 2>/dev/null || {
  echo "compare.sh: $PYTHON lacks torch/transformers (set PYTHON=... to a Python that has them)" >&2; exit 1; }

features=""
for b in ${backends//,/ }; do
  case "$b" in cpu) ;; wgpu|cuda) features="$features,$b" ;; *) echo "unknown backend $b" >&2; exit 2 ;; esac
done
if [ -z "${KILN:-}" ]; then
  cargo build --release --quiet --features "cpu$features"
  KILN="${CARGO_TARGET_DIR:-target}/release/kiln"
fi

big=tests/fixtures/interplay/qwen2_100M/config.json
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tiny="$work/tiny.json"
# The quickstart's model (core/src/tasks/interplay/tiny_model.rs).
sed -n '/^pub const TINY_CONFIG: &str = r#"/,/^"#;/p' core/src/tasks/interplay/tiny_model.rs | sed '1s/.*/{/; $d' > "$tiny"

out="$work/results.jsonl"
run() { # label, command...
  local label="$1"; shift
  echo "  $label" >&2
  local line
  line=$("$@" 2>/dev/null | tail -n 1) || { echo "compare.sh: '$label' failed: $*" >&2; exit 1; }
  printf '{"label": "%s", "result": %s}\n' "$label" "$line" >> "$out"
}

echo "running (one after the other):" >&2
for b in ${backends//,/ }; do
  run "kiln-$b gen b8"     "$KILN" bench --backend "$b" --config "$big" --batch 8 --repeats "$repeats"
  run "kiln-$b gen b32"    "$KILN" bench --backend "$b" --config "$big" --batch 32 --repeats "$repeats"
  run "kiln-$b gen b128"   "$KILN" bench --backend "$b" --config "$big" --batch 128 --new-tokens 64 --repeats 1
  run "kiln-$b rollout b8" "$KILN" bench --backend "$b" --config "$big" --batch 8 --rollout --repeats "$repeats"
  run "kiln-$b train 100M" "$KILN" bench --backend "$b" --config "$big" --train --batch 8 --prompt-len 256 --repeats "$repeats"
  run "kiln-$b train tiny" "$KILN" bench --backend "$b" --config "$tiny" --train --batch 8 --prompt-len 512 --repeats $((repeats + 2))
done
run "hf gen b8"     "$PYTHON" benches/hf_generate_baseline.py --config "$big" --batch 8 --repeats "$repeats"
run "torch train 100M" "$PYTHON" benches/torch_train_step.py --config "$big" --batch 8 --seq 256 --steps $((repeats + 2))
run "torch train tiny" "$PYTHON" benches/torch_train_step.py --config "$tiny" --batch 8 --seq 512 --steps $((repeats + 5))
run "sgemm"         "$PYTHON" benches/sgemm_peak.py

"$PYTHON" - "$out" "$backends" <<'EOF'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows[r["label"]] = r["result"]
backends = sys.argv[2].split(",")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
hf, torch_big, torch_tiny, gemm = rows["hf gen b8"], rows["torch train 100M"], rows["torch train tiny"], rows["sgemm"]
print(f"CPU: {cpu}, {gemm['threads']} threads; {hf['engine']} (attention {hf['attn']}); sgemm {gemm['gflops']:.0f} GFLOP/s")
head = f"| {'tokens/s':<38} |" + "".join(f" {'kiln ' + b:>10} |" for b in backends) + f" {'baseline':>10} | {'ratio':>6} |"
print(head)
print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
def row(name, key, label, base=None):
    vals = [rows.get(f"kiln-{b} {label}", {}).get(key) for b in backends]
    cells = "".join(f" {v:>10.1f} |" if v is not None else f" {'-':>10} |" for v in vals)
    if base is None:
        print(f"| {name:<38} |{cells} {'':>10} | {'':>6} |")
    else:
        ratio = vals[0] / base if vals[0] else float("nan")
        print(f"| {name:<38} |{cells} {base:>10.1f} | {ratio:>5.2f}x |")
row("prefill 8x64 (100M)", "prefill_tokens_per_s", "gen b8", hf["prefill_tokens_per_s"])
row("decode 8x64->128 (100M)", "decode_tokens_per_s", "gen b8", hf["decode_tokens_per_s"])
row("end to end 8x64->128 (100M)", "end_to_end_tokens_per_s", "gen b8", hf["end_to_end_tokens_per_s"])
row("decode batch 32 (100M)", "decode_tokens_per_s", "gen b32")
row("decode batch 128 (100M)", "decode_tokens_per_s", "gen b128")
row("rollout end to end b8 (vs kiln bench)", "end_to_end_tokens_per_s", "rollout b8", rows[f"kiln-{backends[0]} gen b8"]["end_to_end_tokens_per_s"])
row("train step 8x256 (100M)", "tokens_per_s", "train 100M", torch_big["tokens_per_s"])
row("train step 8x512 (tiny, quickstart)", "tokens_per_s", "train tiny", torch_tiny["tokens_per_s"])
params = rows[f"kiln-{backends[0]} train 100M"]["parameters"]
for who, tps in [("kiln", rows[f"kiln-{backends[0]} train 100M"]["tokens_per_s"]), ("torch", torch_big["tokens_per_s"])]:
    # 6 N flops per token (forward + backward), attention excluded.
    print(f"{who} training 100M: {6 * params * tps / 1e9:.0f} GFLOP/s ({6 * params * tps / 1e9 / gemm['gflops']:.0%} of sgemm)")
EOF
