#!/usr/bin/env bash
# GPU acceptance for kiln in one command (≤ 8 minutes on one H100/H200): the parity tests on CUDA
# in f32 and bf16, `kiln bench` generation and training for the paper's 100M model in f32 and
# bf16, and one Qwen2.5-Coder-1.5B bf16 SFT-shaped step at sequence 4096; then one table of
# tokens/s, MFU against the GPU's bf16 dense peak, and peak device memory.
#
# The GPU machine needs no Rust toolchain and no network: build the binaries where cargo is and
# carry them over (the checkout itself is needed too, for the fixtures and configs):
#
#   cargo build --release --features cuda                  # -> target/release/kiln
#   cargo test --release --features cuda --no-run --test hf_parity --test half_precision
#                                                          # -> target/release/deps/{hf_parity,half_precision}-<hash>
#   mkdir -p gpu-bin && cp target/release/kiln gpu-bin/ \
#     && find target/release/deps -maxdepth 1 -type f -executable \( -name 'hf_parity-*' -o -name 'half_precision-*' \) -exec cp {} gpu-bin/ \;
#
# and on the GPU machine, from the checkout's root:
#
#   KILN_BIN=gpu-bin/kiln TEST_BIN_DIR=gpu-bin scripts/gpu-check.sh
#
# Settings (environment): KILN_BIN (default target/release/kiln), TEST_BIN_DIR (default: the
# directory of KILN_BIN), DEVICE (cuda:0), PEAK_TFLOPS (bf16 dense peak of the GPU; by default
# from its name: H100/H200 SXM 989, H100 PCIe 756, A100 312, L40S 362), OUT (where the
# figures go; default a temporary directory). `--dry-run` prints what would run (and the plans
# it computes on the CPU) without touching a GPU; CI runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
KILN="${KILN_BIN:-target/release/kiln}"
TEST_BIN_DIR="${TEST_BIN_DIR:-$(dirname "$KILN")}"
DEVICE="${DEVICE:-cuda:0}"
if [ -z "${OUT:-}" ]; then
    OUT=$(mktemp -d)
    [ "$DRY" = 1 ] && trap 'rm -rf "$OUT"' EXIT
fi
M100=tests/fixtures/interplay/qwen2_100M/config.json
M15=examples/configs/qwen2.5-coder-1.5b/config.json
mkdir -p "$OUT"
ROWS="$OUT/rows.tsv"
: >"$ROWS"
START=$(date +%s)

say() { printf '\n=== %s (%ss)\n' "$1" "$(($(date +%s) - START))"; }
die() { echo "gpu-check: $*" >&2; exit 1; }
[ -x "$KILN" ] || die "no kiln binary at $KILN (build it with \`cargo build --release --features cuda\`, or set KILN_BIN)"

# Peak device memory of one command: nvidia-smi sampled every 100 ms while it runs.
run_measured() { # name, timeout_s, command...
    local name=$1 limit=$2
    shift 2
    echo "+ $*"
    [ "$DRY" = 1 ] && return 0
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$OUT/$name.mem" &
    local sampler=$!
    local rc=0
    timeout "$limit" "$@" >"$OUT/$name.json" 2>"$OUT/$name.err" || rc=$?
    kill "$sampler" 2>/dev/null || true
    wait "$sampler" 2>/dev/null || true
    if [ "$rc" -ne 0 ]; then
        tail -5 "$OUT/$name.err" >&2
        echo "$name: failed (exit $rc)" >&2
        FAILED=1
    fi
}

# FLOPs per token of a training step or of a decoding step, from `kiln plan` (runs on the CPU).
flops_per_token() { # config batch seq precision kind(train|decode) [--recompute]
    "$KILN" plan --json --config "$1" --batch "$2" --seq "$3" --precision "$4" ${6:-} | python3 -c '
import json, sys
p = json.load(sys.stdin)
print(p["training_flops"] / (p["batch_per_device"] * p["seq"]) if sys.argv[1] == "train" else p["decode_flops_per_token"])' "$5"
}

planned_gib() { # config batch seq precision [--recompute]
    "$KILN" plan --json --config "$1" --batch "$2" --seq "$3" --precision "$4" ${5:-} | python3 -c '
import json, sys; print(round(json.load(sys.stdin)["training_peak"] / 2**30, 1))'
}

row() { # name kind flops_per_token
    echo -e "$1\t$2\t$3" >>"$ROWS"
}

FAILED=0
say "device"
if [ "$DRY" = 1 ]; then
    GPU="(dry run)"
    MEM_GIB=80
else
    command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this script needs an NVIDIA GPU (use --dry-run elsewhere)"
    GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    MEM_GIB=$(($(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1) / 1024))
fi
case "${PEAK_TFLOPS:-}:$GPU" in
    :*H100*PCIe*) PEAK_TFLOPS=756 ;;
    :*H100*|:*H200*|:*GH200*) PEAK_TFLOPS=989 ;;
    :*A100*) PEAK_TFLOPS=312 ;;
    :*L40S*) PEAK_TFLOPS=362 ;;
    :*) PEAK_TFLOPS=989 ;;
    *) ;;
esac
echo "$GPU, ${MEM_GIB} GiB; bf16 dense peak ${PEAK_TFLOPS} TFLOP/s; figures in $OUT"

say "parity on CUDA: f32 and bf16 logits against transformers"
for test in hf_parity half_precision; do
    bin=$(find "$TEST_BIN_DIR" -maxdepth 1 -type f -name "$test-*" ! -name '*.d' | head -1)
    if [ -z "$bin" ]; then
        [ "$DRY" = 1 ] && bin="$TEST_BIN_DIR/$test-<hash>" || die "no $test test binary in $TEST_BIN_DIR (see the header of this script)"
    fi
    echo "+ KILN_REPO_DIR=$PWD $bin cuda --test-threads 1"
    if [ "$DRY" = 0 ]; then
        KILN_REPO_DIR="$PWD" timeout 90 "$bin" cuda --test-threads 1 || FAILED=1
    fi
done

say "generation, 100M (batch 64, prompt 128, 128 new tokens)"
for dtype in f32 bf16; do
    run_measured "gen-100M-$dtype" 90 "$KILN" bench --backend "$DEVICE" --config "$M100" --dtype "$dtype" \
        --batch 64 --prompt-len 128 --new-tokens 128 --repeats 2
    row "gen-100M-$dtype" decode "$(flops_per_token "$M100" 64 256 "$( [ $dtype = f32 ] && echo f32 || echo bf16-mixed)" decode)"
done

say "training, 100M (batch 16 × 512 tokens, AdamW)"
for precision in f32 bf16-mixed; do
    run_measured "train-100M-$precision" 120 "$KILN" bench --train --backend "$DEVICE" --config "$M100" \
        --precision "$precision" --batch 16 --prompt-len 512 --repeats 3
    row "train-100M-$precision" train "$(flops_per_token "$M100" 16 512 "$precision" train)"
done

say "Qwen2.5-Coder-1.5B: one bf16 SFT step at sequence 4096"
# bf16-mixed (f32 masters) with recomputation needs ~85 GiB; on an 80 GB GPU bf16-pure does it.
PRECISION=bf16-mixed
need=$(planned_gib "$M15" 1 4096 bf16-mixed --recompute)
if python3 -c "import sys; sys.exit(0 if $need < $MEM_GIB * 0.95 else 1)"; then :; else PRECISION=bf16-pure; fi
echo "planned peak $need GiB for bf16-mixed; running $PRECISION ($(planned_gib "$M15" 1 4096 "$PRECISION" --recompute) GiB planned)"
run_measured "sft-1.5B-$PRECISION" 210 "$KILN" bench --train --backend "$DEVICE" --config "$M15" \
    --precision "$PRECISION" --recompute --batch 1 --prompt-len 4096 --repeats 1
row "sft-1.5B-$PRECISION" train "$(flops_per_token "$M15" 1 4096 "$PRECISION" train --recompute)"

say "results"
python3 - "$OUT" "$ROWS" "$PEAK_TFLOPS" "$DRY" "$GPU" <<'PY'
import json, os, sys
out, rows, peak, dry, gpu = sys.argv[1], sys.argv[2], float(sys.argv[3]) * 1e12, sys.argv[4] == "1", sys.argv[5]
print(f"| run ({gpu}) | tok/s | MFU (bf16 peak) | peak memory |")
print("|---|---:|---:|---:|")
for line in open(rows):
    name, kind, flops = line.rstrip("\n").split("\t")
    tps = mfu = mem = "-"
    path = os.path.join(out, name + ".json")
    if not dry and os.path.exists(path) and os.path.getsize(path):
        figures = json.loads(open(path).read().strip().splitlines()[-1])
        rate = figures.get("tokens_per_s") if kind == "train" else figures.get("decode_tokens_per_s")
        if rate:
            tps = f"{rate:,.0f}"
            mfu = f"{100 * rate * float(flops) / peak:.1f}%"
        used = [int(x) for x in open(os.path.join(out, name + ".mem")).read().split() if x.isdigit()]
        if used:
            mem = f"{max(used) / 1024:.1f} GiB"
    print(f"| {name} | {tps} | {mfu} | {mem} |")
print(f"\n({'dry run: nothing was run' if dry else 'tok/s: training steps or decoding; MFU from kiln plan FLOPs'}; {float(flops):.3g} FLOP/token in the last row)")
PY
say "done"
[ "$FAILED" = 0 ] || die "some checks failed (see above and $OUT)"
