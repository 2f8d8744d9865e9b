#!/usr/bin/env bash
# GPU acceptance for kiln in one command, within 360 s of GPU time (one H100/H200): the parity
# tests on CUDA in f32 and bf16, kiln against transformers run on the same GPU there and then
# (scripts/torch_parity.py: log-probs and greedy tokens), `kiln bench` generation for the paper's 100M model (its own
# vocab and the 1.5B model's 151,936, so the host's share of a large vocab shows) and training
# at 8 × 2,048 tokens, and one Qwen2.5-Coder-1.5B bf16-mixed step at 4,096 tokens; then one
# table (Markdown) and one JSON file of tokens/s, MFU against the peak of the dtype the matmuls
# run in, peak device memory beside `kiln plan`'s figure, and the kernels autotune chose.
#
# The GPU machine needs no Rust toolchain and no network. Build where cargo is, stripped, so
# the binaries travel with the checkout (64 MiB in all):
#
#   scripts/gpu-check.sh --build        # -> gpu-bin/{kiln,hf_parity-*,half_precision-*}, sizes printed
#
# and on the GPU machine, from the checkout's root:
#
#   KILN_BIN=gpu-bin/kiln scripts/gpu-check.sh
#
# Settings (environment): KILN_BIN (default target/release/kiln), TEST_BIN_DIR (default: the
# directory of KILN_BIN), DEVICE (cuda:0), PEAK_TFLOPS / PEAK_F32_TFLOPS (dense bf16 and f32
# peaks; by default from the GPU's name), OUT (where the figures go; default a temporary
# directory). Kernels compiled and autotuned by one step are cached on disk (cubecl's cache in
# the checkout's target/, which kiln points compiled kernels to as well) for the next steps.
# `--dry-run` prints the plan, the budget and the commands without touching a GPU; CI runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=run
case "${1:-}" in
    --dry-run) MODE=dry ;;
    --build) MODE=build ;;
    "") ;;
    *) echo "usage: scripts/gpu-check.sh [--dry-run | --build]" >&2; exit 2 ;;
esac
DRY=0
[ "$MODE" = dry ] && DRY=1
BUDGET=360   # seconds of GPU time for the whole check

if [ "$MODE" = build ]; then
    # Symbols stripped: three unstripped binaries are ~4× larger and may not travel.
    export CARGO_PROFILE_RELEASE_STRIP=symbols
    cargo build --locked --release --features cuda
    cargo test --locked --release --features cuda --no-run --test hf_parity --test half_precision
    rm -rf gpu-bin && mkdir -p gpu-bin
    cp target/release/kiln gpu-bin/
    for test in hf_parity half_precision; do
        bin=$(find target/release/deps -maxdepth 1 -type f -executable -name "$test-*" -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2)
        cp "$bin" gpu-bin/
    done
    du -ch gpu-bin/* | sed 's/^/gpu-bin: /'
    total=$(du -cb gpu-bin/* | tail -1 | cut -f1)
    [ "$total" -le $((48 << 20)) ] || { echo "gpu-bin is $((total >> 20)) MiB: with the checkout it may not fit the 64 MiB that travels" >&2; exit 1; }
    echo "carry gpu-bin with the working tree and run: KILN_BIN=gpu-bin/kiln scripts/gpu-check.sh"
    exit 0
fi

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
FAILED=0

say() { printf '\n=== %s (%ss)\n' "$1" "$(($(date +%s) - START))"; }
die() { echo "gpu-check: $*" >&2; exit 1; }
[ -x "$KILN" ] || die "no kiln binary at $KILN (build it with \`scripts/gpu-check.sh --build\`, or set KILN_BIN)"

# Each step's time limit, and the plan's sum (the dry run prints it; it must stay ≤ BUDGET).
PLANNED=0
plan() { PLANNED=$((PLANNED + $1)); }
plan 60                 # parity: hf_parity, half_precision (30 s each)
plan 45                 # parity: PyTorch on this GPU, computed here (scripts/torch_parity.py)
plan $((4 * 25))        # generation: 100M f32/bf16 at its vocab and at 151,936 vocab
plan $((2 * 40))        # training: 100M f32 and bf16-mixed, 8 × 2,048
plan 75                 # training: 1.5B bf16-mixed, 1 × 4,096
[ "$PLANNED" -le "$BUDGET" ] || die "the plan needs $PLANNED s, over the budget of $BUDGET s"

# Time left of the budget, and a step's limit: its own, or what is left if that is less.
limit() { local left=$((BUDGET - ($(date +%s) - START))); [ "$left" -lt "$1" ] && echo $((left > 1 ? left : 1)) || echo "$1"; }

# Peak device memory of one command: nvidia-smi sampled every 100 ms while it runs.
run_measured() { # name, timeout_s, command...
    local name=$1 seconds
    seconds=$(limit "$2")
    shift 2
    echo "+ (≤ ${seconds}s) $*"
    [ "$DRY" = 1 ] && return 0
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$OUT/$name.mem" &
    local sampler=$!
    local rc=0
    timeout "$seconds" "$@" >"$OUT/$name.json" 2>"$OUT/$name.err" || rc=$?
    kill "$sampler" 2>/dev/null || true
    wait "$sampler" 2>/dev/null || true
    if [ "$rc" -ne 0 ]; then
        tail -3 "$OUT/$name.err" >&2
        echo "$name: failed (exit $rc)" >&2
        FAILED=1
    fi
}

# FLOPs per token of a training step or of a decoding step, from `kiln plan` (runs on the CPU).
flops_per_token() { # config batch seq precision kind(train|decode)
    "$KILN" plan --json --config "$1" --batch "$2" --seq "$3" --precision "$4" | python3 -c '
import json, sys
p = json.load(sys.stdin)
print(p["training_flops"] / (p["batch_per_device"] * p["seq"]) if sys.argv[1] == "train" else p["decode_flops_per_token"])' "$5"
}

planned_gib() { # config batch seq precision [--recompute]
    "$KILN" plan --json --config "$1" --batch "$2" --seq "$3" --precision "$4" ${5:-} | python3 -c '
import json, sys; print(round(json.load(sys.stdin)["training_peak"] / 2**30, 1))'
}

row() { # name kind(train|decode) flops_per_token matmul_dtype(f32|bf16) planned_gib
    echo -e "$1\t$2\t$3\t$4\t$5" >>"$ROWS"
}

say "device and libraries"
if [ "$DRY" = 1 ]; then
    GPU="(dry run)"
    MEM_GIB=141
else
    command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this script needs an NVIDIA GPU (use --dry-run elsewhere)"
    GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    MEM_GIB=$(($(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1) / 1024))
fi
# Dense peaks (TFLOP/s): bf16 tensor cores, and f32 (what burn's f32 matmuls are measured against).
case "$GPU" in
    *H100*PCIe*) PEAK_BF16=756; PEAK_F32=51 ;;
    *H100*|*H200*|*GH200*) PEAK_BF16=989; PEAK_F32=67 ;;
    *A100*) PEAK_BF16=312; PEAK_F32=19.5 ;;
    *L40S*) PEAK_BF16=362; PEAK_F32=91.6 ;;
    *) PEAK_BF16=989; PEAK_F32=67 ;;
esac
PEAK_BF16=${PEAK_TFLOPS:-$PEAK_BF16}
PEAK_F32=${PEAK_F32_TFLOPS:-$PEAK_F32}
echo "$GPU, ${MEM_GIB} GiB; dense peaks: bf16 ${PEAK_BF16}, f32 ${PEAK_F32} TFLOP/s; figures in $OUT; budget ${PLANNED} s of ${BUDGET} s"
echo "budget $PLANNED s"
# NVRTC (CUDA's runtime compiler, which cubecl compiles kernels with) and NCCL: from the system,
# LD_LIBRARY_PATH, or the nvidia-* wheels that PyPI's torch brings.
wheel_libs=$(python3 - <<'PY' 2>/dev/null || true
import glob, os, site
dirs = [p for d in site.getsitepackages() + [site.getusersitepackages()] for p in glob.glob(os.path.join(d, "nvidia", "*", "lib"))]
print(":".join(sorted(set(dirs))))
PY
)
[ -n "$wheel_libs" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$wheel_libs"
for lib in libnvrtc libnccl; do
    found=""
    ld_path=${LD_LIBRARY_PATH:-}
    for dir in ${ld_path//:/ } /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu; do
        found=$(ls "$dir"/$lib.so* 2>/dev/null | head -1 || true)
        [ -n "$found" ] && break
    done
    [ -z "$found" ] && found=$(ldconfig -p 2>/dev/null | awk -v l="$lib.so" '$1 ~ "^"l { print $NF; exit }')
    if [ -n "$found" ]; then
        echo "$lib: $found"
    else
        msg="$lib.so not found (looked in LD_LIBRARY_PATH, the nvidia-* wheels' lib directories, /usr/local/cuda/lib64, /usr/lib/x86_64-linux-gnu and ldconfig)"
        if [ "$lib" = libnvrtc ] && [ "$DRY" = 0 ]; then die "$msg"; else echo "$msg"; fi
    fi
done

say "parity on CUDA: f32 and bf16 logits against transformers"
for test in hf_parity half_precision; do
    bin=$(find "$TEST_BIN_DIR" -maxdepth 1 -type f -name "$test-*" ! -name '*.d' | head -1)
    if [ -z "$bin" ]; then
        [ "$DRY" = 1 ] && bin="$TEST_BIN_DIR/$test-<hash>" || die "no $test test binary in $TEST_BIN_DIR (build with \`scripts/gpu-check.sh --build\`)"
    fi
    seconds=$(limit 30)
    echo "+ (≤ ${seconds}s) KILN_REPO_DIR=$PWD $bin cuda --test-threads 1"
    if [ "$DRY" = 0 ]; then
        KILN_REPO_DIR="$PWD" timeout "$seconds" "$bin" cuda --test-threads 1 || FAILED=1
    fi
done

say "parity on this GPU: kiln on $DEVICE against transformers on cuda (log-probs, 32 greedy tokens; f32 must agree)"
seconds=$(limit 45)
echo "+ (≤ ${seconds}s) python3 scripts/torch_parity.py --kiln $KILN --device cuda --backend $DEVICE --out $OUT"
if [ "$DRY" = 0 ]; then
    timeout "$seconds" python3 scripts/torch_parity.py --kiln "$KILN" --device cuda --backend "$DEVICE" --out "$OUT" || FAILED=1
fi

say "generation, 100M (batch 64, prompt 128, 128 new tokens), its vocab and 151,936"
M100V="$OUT/qwen2_100M_vocab151936.json"
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["vocab_size"] = 151936; json.dump(c, open(sys.argv[2], "w"))' "$M100" "$M100V"
for vocab in 2200 151936; do
    config=$M100; [ "$vocab" = 151936 ] && config=$M100V
    for dtype in f32 bf16; do
        run_measured "gen-100M-v$vocab-$dtype" 25 "$KILN" bench --backend "$DEVICE" --config "$config" --dtype "$dtype" \
            --batch 64 --prompt-len 128 --new-tokens 128 --repeats 1
        row "gen-100M-v$vocab-$dtype" decode "$(flops_per_token "$config" 64 256 "$( [ $dtype = f32 ] && echo f32 || echo bf16-mixed)" decode)" "$dtype" -
    done
done

say "training, 100M (batch 8 × 2,048 tokens, AdamW)"
for precision in f32 bf16-mixed; do
    run_measured "train-100M-$precision" 40 "$KILN" bench --train --backend "$DEVICE" --config "$M100" \
        --precision "$precision" --batch 8 --prompt-len 2048 --repeats 2
    row "train-100M-$precision" train "$(flops_per_token "$M100" 8 2048 "$precision" train)" \
        "$( [ $precision = f32 ] && echo f32 || echo bf16)" "$(planned_gib "$M100" 8 2048 "$precision")"
done

say "Qwen2.5-Coder-1.5B: one bf16-mixed step at 4,096 tokens (recompute)"
need=$(planned_gib "$M15" 1 4096 bf16-mixed --recompute)
echo "planned peak $need GiB of ${MEM_GIB} GiB"
run_measured "train-1.5B-bf16-mixed" 75 "$KILN" bench --train --backend "$DEVICE" --config "$M15" \
    --precision bf16-mixed --recompute --batch 1 --prompt-len 4096 --repeats 1
row "train-1.5B-bf16-mixed" train "$(flops_per_token "$M15" 1 4096 bf16-mixed train)" bf16 "$need"

say "results"
python3 - "$OUT" "$ROWS" "$PEAK_BF16" "$PEAK_F32" "$DRY" "$GPU" <<'PY'
import json, os, sys
out, rows, peak_bf16, peak_f32, dry, gpu = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1", sys.argv[6]
peaks = {"bf16": peak_bf16 * 1e12, "f32": peak_f32 * 1e12}
lines = [f"| run ({gpu}) | tok/s | MFU (peak of the matmul dtype) | host share of a decoding step | peak memory | planned |", "|---|---:|---:|---:|---:|---:|"]
results = []
for line in open(rows):
    name, kind, flops, dtype, planned = line.rstrip("\n").split("\t")
    result = {"name": name, "kind": kind, "flops_per_token": float(flops), "matmul_dtype": dtype, "planned_gib": None if planned == "-" else float(planned)}
    path = os.path.join(out, name + ".json")
    if not dry and os.path.exists(path) and os.path.getsize(path):
        figures = json.loads(open(path).read().strip().splitlines()[-1])
        result["figures"] = figures
        rate = figures.get("tokens_per_s") if kind == "train" else figures.get("decode_tokens_per_s")
        if figures.get("host_share_of_step") is not None:
            result["host_share"] = figures["host_share_of_step"]
        if rate:
            result["tokens_per_s"] = rate
            result["mfu"] = rate * float(flops) / peaks[dtype]
        used = [int(x) for x in open(os.path.join(out, name + ".mem")).read().split() if x.isdigit()]
        if used:
            result["peak_memory_gib"] = max(used) / 1024
    results.append(result)
    fmt = lambda key, f: f(result[key]) if key in result and result[key] is not None else "-"
    lines.append(f"| {name} | {fmt('tokens_per_s', lambda v: f'{v:,.0f}')} | {fmt('mfu', lambda v: f'{100 * v:.1f}% ({dtype})')} "
                 f"| {fmt('host_share', lambda v: f'{100 * v:.0f}%')} "
                 f"| {fmt('peak_memory_gib', lambda v: f'{v:.1f} GiB')} | {fmt('planned_gib', lambda v: f'{v} GiB')} |")
table = "\n".join(lines)
print(table)
open(os.path.join(out, "results.md"), "w").write(table + "\n")
json.dump({"gpu": gpu, "peaks_tflops": {"bf16": peak_bf16, "f32": peak_f32}, "dry_run": dry, "rows": results}, open(os.path.join(out, "results.json"), "w"), indent=1)
print(f"\n({'dry run: nothing was run' if dry else 'tok/s: training steps or decoding; MFU from kiln plan FLOPs'}; written: results.md, results.json)")
PY
say "done"
[ "$FAILED" = 0 ] || die "some checks failed (see above and $OUT)"
