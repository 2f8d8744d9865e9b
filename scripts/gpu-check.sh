#!/usr/bin/env bash
# The GPU acceptance run in one command, within 400 s of GPU time (one H100/H200):
#   parity  kiln against transformers/PyTorch run on the same GPU there and then, at real shapes
#           (scripts/gpu_parity.py: random Qwen2 models with head_dim 64 and 128, GQA 4:1 and 6:1,
#           the 1.5B model's vocab of 151,936, sequences up to 4,096 tokens in padded batches):
#           log-probs in f32 and bf16, greedy tokens, KV-cached decoding against full recompute,
#           one AdamW step (loss, gradient norm, weights) in f32 and bf16-mixed;
#   speed   kiln and torch/transformers side by side on the same GPU: generation (prefill,
#           decode, end to end) of the paper's 100M model at batch 64 and 256 (its own vocab and
#           151,936) and of Qwen2.5-Coder-1.5B in bf16 at batch 32; training tok/s and MFU
#           (against the peak of the dtype the matmuls run in) of the 100M model at 8 × 2,048
#           and of one 1.5B bf16-mixed step at 4,096 tokens; the device allocator's peak beside
#           `kiln plan`'s figure; the kernels burn's autotune chose;
#   nccl    a one-rank NCCL communicator (`--collective nccl`): a small pre-training step whose
#           gradients and starting weights go through ncclAllReduce ends with the same checkpoint,
#           byte for byte, as the step without (`scripts/multi-gpu-check.sh` does 2+ GPUs);
# and writes one table (results.md) and one JSON file (results.json) under $OUT.
#
# The GPU machine needs no Rust toolchain and no network. Build where cargo is, stripped and
# gzipped, so the binary travels with the checkout (64 MiB in all; the CUDA build is ~60 MB
# stripped, ~16 MB gzipped):
#
#   scripts/gpu-check.sh --build        # -> gpu-bin/kiln.gz, its size checked
#
# (built on Debian 12, it needs glibc 2.34 or later there: Ubuntu 22.04 or later), and on the
# GPU machine, from the checkout's root (gpu-bin/kiln.gz is unpacked first):
#
#   KILN_BIN=gpu-bin/kiln scripts/gpu-check.sh
#
# Every row without a GPU, at small shapes (CI runs it on lavapipe, tests/gpu_check.rs):
#
#   KILN_BIN=target/debug/kiln scripts/gpu-check.sh --backend wgpu --small [--only hd64_gqa4]
#
# (`--only` compares the parity rows of the models named only; CI's test takes the head_dim-64
# model, tests/packing.rs checks head_dim 128 on wgpu against transformers.)
#
# Its parity rows are checked against references torch made on the CPU, committed
# (tests/fixtures/gpu_check/small.json; `scripts/gpu_parity.py reference --shapes small` remakes
# them); its torch speed columns run where `python3 -c 'import torch'` works, else say so; it
# exits non-zero when a parity row or a kiln command fails, as the GPU run does.
#
# Settings (environment): KILN_BIN (default target/release/kiln), PYTHON (python3), OUT (where
# the figures go; default a temporary directory), PEAK_TFLOPS / PEAK_F32_TFLOPS (dense bf16 and
# f32 peaks; by default from the GPU's name). Kernels compiled and autotuned by one step are
# cached on disk (cubecl's cache under the checkout's target/, which kiln points compiled kernels
# to as well) for the next. `--dry-run` prints the plan, `budget N s` and every command without
# running any; CI runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/small-run.sh

MODE=run SMALL=0 BACKEND="${DEVICE:-cuda:0}" ONLY=()
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) MODE=dry ;;
        --build) MODE=build ;;
        --small) SMALL=1 ;;
        --backend) BACKEND="${2:?--backend needs a device, e.g. cuda:0 or wgpu}"; shift ;;
        --backend=*) BACKEND="${1#--backend=}" ;;
        --only) ONLY=(--only "${2:?--only needs model names, e.g. hd64_gqa4}"); shift ;;
        *) echo "usage: scripts/gpu-check.sh [--dry-run | --build] [--backend cuda:0|wgpu|cpu] [--small] [--only MODEL,...]" >&2; exit 2 ;;
    esac
    shift
done
DRY=0
[ "$MODE" = dry ] && DRY=1
BUDGET=400   # seconds of GPU time for the whole check (full shapes)
PYTHON="${PYTHON:-python3}"

if [ "$MODE" = build ]; then
    # Symbols stripped: unstripped, the binary is ~4× larger and may not travel.
    export CARGO_PROFILE_RELEASE_STRIP=symbols
    cargo build --locked --release --features cuda
    rm -rf gpu-bin && mkdir -p gpu-bin
    gzip -9 -c "${CARGO_TARGET_DIR:-target}/release/kiln" >gpu-bin/kiln.gz
    echo "gpu-bin/kiln.gz: $(($(stat -c %s gpu-bin/kiln.gz) >> 20)) MiB (the binary: $(($(stat -c %s "${CARGO_TARGET_DIR:-target}/release/kiln") >> 20)) MiB)"
    size=$(stat -c %s gpu-bin/kiln.gz)
    [ "$size" -le $((48 << 20)) ] || { echo "gpu-bin/kiln.gz is $((size >> 20)) MiB: with the checkout it may not fit the 64 MiB that travels" >&2; exit 1; }
    echo "carry gpu-bin with the working tree and run: KILN_BIN=gpu-bin/kiln scripts/gpu-check.sh"
    exit 0
fi

KILN="${KILN_BIN:-target/release/kiln}"
# The binary travels gzipped (--build): unpack it next to itself.
if [ ! -x "$KILN" ] && [ -f "$KILN.gz" ]; then
    gunzip -c "$KILN.gz" >"$KILN" && chmod +x "$KILN"
fi
if [ -z "${OUT:-}" ]; then
    OUT=$(mktemp -d)
    [ "$DRY" = 1 ] && trap 'rm -rf "$OUT"' EXIT
fi
mkdir -p "$OUT"
ROWS="$OUT/rows.tsv"
: >"$ROWS"
START=$(date +%s)
FAILED=0
GPU_RUN=0
case "$BACKEND" in cuda*) GPU_RUN=1 ;; esac

say() { printf '\n=== %s (%ss)\n' "$1" "$(($(date +%s) - START))"; }
die() { echo "gpu-check: $*" >&2; exit 1; }
[ -x "$KILN" ] || die "no kiln binary at $KILN (build it with \`scripts/gpu-check.sh --build\`, or set KILN_BIN)"
TORCH=0
"$PYTHON" -c 'import torch, transformers' 2>/dev/null && TORCH=1

# The shapes. Full: the models the issue names. Small: stand-ins with the same structure (GQA,
# head_dim 64/128, a vocab larger than the 100M model's) that lavapipe runs in minutes.
M100=tests/fixtures/interplay/qwen2_100M/config.json
M15=examples/configs/qwen2.5-coder-1.5b/config.json
M100V="$OUT/qwen2_100M_vocab151936.json"
derive() { # source out key=value...
    "$PYTHON" - "$@" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
for kv in sys.argv[3:]:
    k, v = kv.split("=", 1)
    c[k] = json.loads(v)
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
}
if [ "$SMALL" = 1 ]; then
    SHAPES=small HALF=f16
    # WGSL has no bf16: f16 stands for it on wgpu (and in the committed references).
    S100="$OUT/small_100M.json" S100V="$OUT/small_100M_vocab8192.json" S15="$OUT/small_1.5B.json"
    derive "$M100" "$S100" hidden_size=128 intermediate_size=256 num_hidden_layers=2 num_attention_heads=4 num_key_value_heads=2
    derive "$S100" "$S100V" vocab_size=8192
    derive "$M15" "$S15" hidden_size=256 intermediate_size=512 num_hidden_layers=2 num_attention_heads=2 num_key_value_heads=1 vocab_size=8192 max_position_embeddings=512 bos_token_id=null eos_token_id=null
    C100=$S100 C100V=$S100V C15=$S15
    B64=4 B256=8 B32=4 PROMPT=16 NEW=8 TB=2 TSEQ=64 LSEQ=128
    L_REF=0 L_CMP=1500 L_GEN=240 L_TRAIN=300 L_TORCH=600 L_NCCL=0
else
    SHAPES=full HALF=bf16
    derive "$M100" "$M100V" vocab_size=151936
    C100=$M100 C100V=$M100V C15=$M15
    B64=64 B256=256 B32=32 PROMPT=128 NEW=128 TB=8 TSEQ=2048 LSEQ=4096
    L_REF=45 L_CMP=80 L_GEN=15 L_TRAIN=20 L_TORCH=55 L_NCCL=20
fi
MIXED=$HALF-mixed

# Each step's time limit, and the plan's sum (the dry run prints it; on a GPU it must stay ≤ BUDGET).
PLANNED=0
plan() { PLANNED=$((PLANNED + $1)); }
plan $L_REF; plan $L_CMP                       # parity: torch's references, then kiln against them
plan $((3 * L_GEN)); plan $((2 * L_GEN))       # generation: 100M ×3, 1.5B (twice the time)
plan $((2 * L_TRAIN)); plan $((3 * L_TRAIN))   # training: 100M ×2, 1.5B at 4,096 tokens (three times)
[ "$TORCH" = 1 ] || [ "$GPU_RUN" = 1 ] && plan $L_TORCH   # torch's side of the speed rows, one process
[ "$GPU_RUN" = 1 ] && plan $((2 * L_NCCL))     # NCCL: one small step with and without a one-rank communicator
if [ "$GPU_RUN" = 1 ] && [ "$PLANNED" -gt "$BUDGET" ]; then die "the plan needs $PLANNED s, over the budget of $BUDGET s"; fi

# Time left of the plan, and a step's limit: its own, or what is left if that is less.
limit() { local left=$((PLANNED - ($(date +%s) - START))); [ "$left" -lt "$1" ] && echo $((left > 1 ? left : 1)) || echo "$1"; }

# One step: prints its command and limit, runs it (stdout to $OUT/<name>.json), records a failure.
step() { # name timeout_s command...
    local name=$1 seconds rc=0
    seconds=$(limit "$2")
    shift 2
    echo "+ (≤ ${seconds}s) $*"
    [ "$DRY" = 1 ] && return 0
    timeout "$seconds" "$@" >"$OUT/$name.json" 2>"$OUT/$name.err" || rc=$?
    if [ "$rc" -ne 0 ]; then
        tail -3 "$OUT/$name.err" >&2
        echo "$name: failed (exit $rc$([ "$rc" = 124 ] && echo ", after its ${seconds} s"))" >&2
        FAILED=1
    fi
}

kiln_plan() { # config batch seq precision flops_key peak_key [--recompute]: "<flops per token>\t<peak bytes>"
    "$KILN" plan --json --config "$1" --batch "$2" --seq "$3" --precision "$4" ${7:-} | "$PYTHON" -c '
import json, sys
p = json.load(sys.stdin)
value = lambda key: p["training_flops"] / (p["batch_per_device"] * p["seq"]) if key == "train_flops" else p[key]
print(*(value(k) for k in sys.argv[1:]), sep="\t")' "$5" "$6"
}

say "device and libraries"
if [ "$GPU_RUN" = 1 ] && [ "$DRY" = 0 ]; then
    command -v nvidia-smi >/dev/null || die "nvidia-smi not found: --backend $BACKEND needs an NVIDIA GPU (--dry-run, or --backend wgpu --small, elsewhere)"
    GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    MEM_GIB=$(($(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1) / 1024))
    [ "$TORCH" = 1 ] || die "the GPU run compares against torch on the same GPU: \`$PYTHON -c 'import torch, transformers'\` failed"
elif [ "$GPU_RUN" = 1 ]; then
    GPU="(dry run)" MEM_GIB=141
else
    GPU="$BACKEND on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')" MEM_GIB=-
fi
# Dense peaks (TFLOP/s): bf16 tensor cores, and f32 (what burn's f32 matmuls are measured against).
PEAK_BF16="" PEAK_F32=""
case "$GPU" in
    *H100*PCIe*) PEAK_BF16=756; PEAK_F32=51 ;;
    *H100*|*H200*|*GH200*|"(dry run)") PEAK_BF16=989; PEAK_F32=67 ;;
    *A100*) PEAK_BF16=312; PEAK_F32=19.5 ;;
    *L40S*) PEAK_BF16=362; PEAK_F32=91.6 ;;
esac
PEAK_BF16=${PEAK_TFLOPS:-$PEAK_BF16}
PEAK_F32=${PEAK_F32_TFLOPS:-$PEAK_F32}
echo "$GPU, ${MEM_GIB} GiB; dense peaks: bf16 ${PEAK_BF16:--}, f32 ${PEAK_F32:--} TFLOP/s; $SHAPES shapes; torch $([ "$TORCH" = 1 ] && echo found || echo "not installed (kiln's figures only)"); figures in $OUT"
echo "budget $PLANNED s$([ "$GPU_RUN" = 1 ] && echo " of $BUDGET s")"
if [ "$GPU_RUN" = 1 ]; then
    # NVRTC (CUDA's runtime compiler, which cubecl compiles kernels with) and NCCL: from the
    # system, LD_LIBRARY_PATH, or the nvidia-* wheels that PyPI's torch brings.
    wheel_libs=$("$PYTHON" - <<'PY' 2>/dev/null || true
import glob, os, site
dirs = [p for d in site.getsitepackages() + [site.getusersitepackages()] for p in glob.glob(os.path.join(d, "nvidia", "*", "lib")) + glob.glob(os.path.join(d, "nvidia", "cu*", "lib"))]
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
fi

say "parity: kiln on $BACKEND against transformers/torch ($SHAPES shapes; f32 and $HALF)"
MODELS="$OUT/models"
if [ "$SMALL" = 1 ]; then
    REFERENCE=tests/fixtures/gpu_check/small.json
    echo "references: $REFERENCE (torch on the CPU, committed)"
else
    REFERENCE="$OUT/reference.json"
    step reference "$L_REF" "$PYTHON" scripts/gpu_parity.py reference --shapes full --device cuda --half "$HALF" \
        --kiln "$KILN" --models "$MODELS" --out "$REFERENCE"
fi
step compare "$L_CMP" "$PYTHON" scripts/gpu_parity.py compare --reference "$REFERENCE" --kiln "$KILN" --backend "$BACKEND" \
    --models "$MODELS" ${ONLY[@]+"${ONLY[@]}"} --out "$OUT"
[ "$DRY" = 0 ] && [ -f "$OUT/parity.md" ] && cat "$OUT/parity.md"

# The speed rows: name, kind (generate|train), config, dtype or precision, batch, prompt or
# sequence length, new tokens, limit, torch's dtype or autocast, extra kiln flags.
TORCH_ROWS="$OUT/torch_rows.json"
echo "[" >"$TORCH_ROWS"
speed_row() { # name kind config dtype batch len new seconds [flags]
    local name=$1 kind=$2 config=$3 dtype=$4 batch=$5 len=$6 new=$7 seconds=$8 flags=${9:-} flops planned matmul
    if [ "$kind" = generate ]; then
        step "$name" "$seconds" "$KILN" bench --backend "$BACKEND" --config "$config" --dtype "$dtype" \
            --batch "$batch" --prompt-len "$len" --new-tokens "$new" --repeats 1
        IFS=$'\t' read -r flops planned < <(kiln_plan "$config" "$batch" $((len + new)) \
            "$([ "$dtype" = f32 ] && echo f32 || echo "$dtype-mixed")" decode_flops_per_token generation_peak)
        matmul=$dtype
        echo "{\"name\": \"$name\", \"kind\": \"generate\", \"config\": \"$config\", \"batch\": $batch, \"prompt_len\": $len, \"new_tokens\": $new, \"dtype\": \"$dtype\"}," >>"$TORCH_ROWS"
    else
        step "$name" "$seconds" "$KILN" bench --train --backend "$BACKEND" --config "$config" --precision "$dtype" \
            --batch "$batch" --prompt-len "$len" --repeats 2 $flags
        IFS=$'\t' read -r flops planned < <(kiln_plan "$config" "$batch" "$len" "$dtype" train_flops training_peak $flags)
        matmul=$([ "$dtype" = f32 ] && echo f32 || echo "${dtype%-mixed}")
        echo "{\"name\": \"$name\", \"kind\": \"train\", \"config\": \"$config\", \"batch\": $batch, \"seq\": $len, \"steps\": 2, \"autocast\": \"$([ "$dtype" = f32 ] && echo none || echo bf16)\"}," >>"$TORCH_ROWS"
    fi
    echo -e "$name\t$kind\t$flops\t$matmul\t$planned" >>"$ROWS"
}

say "generation: 100M at batch $B64 and $B256 (its vocab and 151,936), 1.5B in $HALF at batch $B32; prompt $PROMPT, $NEW new tokens"
speed_row gen-100M-f32-b$B64 generate "$C100" f32 "$B64" "$PROMPT" "$NEW" "$L_GEN"
speed_row gen-100M-v151936-$HALF-b$B64 generate "$C100V" "$HALF" "$B64" "$PROMPT" "$NEW" "$L_GEN"
speed_row gen-100M-v151936-$HALF-b$B256 generate "$C100V" "$HALF" "$B256" "$PROMPT" "$NEW" "$L_GEN"
speed_row gen-1.5B-$HALF-b$B32 generate "$C15" "$HALF" "$B32" "$PROMPT" "$NEW" $((2 * L_GEN))

say "training: 100M at $TB × $TSEQ tokens (f32, $MIXED), 1.5B $MIXED at $LSEQ tokens (recompute)"
speed_row train-100M-f32 train "$C100" f32 "$TB" "$TSEQ" - "$L_TRAIN"
speed_row train-100M-$MIXED train "$C100" "$MIXED" "$TB" "$TSEQ" - "$L_TRAIN"
speed_row train-1.5B-$MIXED train "$C15" "$MIXED" 1 "$LSEQ" - $((3 * L_TRAIN)) --recompute
sed -i '$ s/,$//' "$TORCH_ROWS"
echo "]" >>"$TORCH_ROWS"

say "NCCL: a one-rank communicator all-reduces; the step equals the single-device step"
NCCL_RESULT="not run"
if [ "$GPU_RUN" = 1 ]; then
    N="$OUT/nccl"
    # One optimizer step of two micro-batches of the small model (scripts/small-run.sh).
    for run in single nccl; do small_run "$N" "$run" 1 4 20000; done
    echo "+ $KILN data interplay --ops 2 --per-op 200 --seed 1 --split train --out $N/data"
    [ "$DRY" = 1 ] || "$KILN" data interplay --ops 2 --per-op 200 --seed 1 --split train --out "$N/data" >/dev/null 2>"$OUT/nccl-data.err" || { tail -3 "$OUT/nccl-data.err" >&2; FAILED=1; }
    step nccl-off "$L_NCCL" "$KILN" pretrain --config "$N/single.toml" --backend "$BACKEND"
    step nccl-one-rank "$L_NCCL" "$KILN" pretrain --config "$N/nccl.toml" --backend "$BACKEND" --collective nccl
    if [ "$DRY" = 0 ]; then
        line=$(grep -m1 '^kiln: NCCL' "$OUT/nccl-one-rank.err" || true)
        if [ -z "$line" ]; then
            NCCL_RESULT="failed: no NCCL communicator ($(tail -1 "$OUT/nccl-one-rank.err"))"
        else
            # Byte-equal where the GPU's kernels are deterministic; else within 1e-5 relative.
            same=$("$PYTHON" - "$N/single/checkpoint-1" "$N/nccl/checkpoint-1" <<'PY' 2>&1 || true
import sys
from safetensors.numpy import load_file
worst = 0.0
for name in ("model.safetensors", "optimizer.safetensors"):
    a, b = load_file(f"{sys.argv[1]}/{name}"), load_file(f"{sys.argv[2]}/{name}")
    assert a.keys() == b.keys(), f"{name}: tensor names differ"
    for k in a:
        x, y = a[k].astype("float64"), b[k].astype("float64")
        scale = max(float(abs(x).max()), 1e-30)
        worst = max(worst, float(abs(x - y).max()) / scale)
print(f"max relative difference {worst:.1e}" if worst <= 1e-5 else f"DIFFERENT: max relative difference {worst:.1e}")
PY
)
            case "$same" in
                "max relative"*) NCCL_RESULT="passed: ${line#kiln: }; weights and optimizer state after the step equal the step without NCCL ($same)" ;;
                *) NCCL_RESULT="failed: ${line#kiln: }; $same" ;;
            esac
        fi
        case "$NCCL_RESULT" in passed*) ;; *) FAILED=1 ;; esac
    fi
else
    NCCL_RESULT="skipped: NCCL needs CUDA devices, not $BACKEND"
fi
echo "nccl: $NCCL_RESULT"

if [ "$TORCH" = 1 ] || [ "$GPU_RUN" = 1 ]; then
    say "torch/transformers on the same device: the same rows, one process"
    device=cpu; [ "$GPU_RUN" = 1 ] && device=cuda
    step torch "$L_TORCH" "$PYTHON" benches/torch_rows.py --device "$device" --rows "$TORCH_ROWS" --out "$OUT" --seconds $((L_TORCH - 15))
else
    say "torch/transformers: not installed here, so the speed rows have kiln's figures only"
fi

say "results"
"$PYTHON" - "$OUT" "$ROWS" "${PEAK_BF16:-0}" "${PEAK_F32:-0}" "$DRY" "$GPU" "$NCCL_RESULT" <<'PY'
import json, os, sys
out, rows, peak_bf16, peak_f32, dry, gpu, nccl = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1", sys.argv[6], sys.argv[7]
peaks = {"bf16": peak_bf16 * 1e12, "f16": peak_bf16 * 1e12, "f32": peak_f32 * 1e12}

def figures(path):
    if dry or not os.path.exists(path) or not os.path.getsize(path):
        return None
    try:
        return json.loads(open(path).read().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None

gib = lambda b: f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"
lines = [f"| run ({gpu}) | kiln tok/s | torch tok/s | kiln / torch | MFU (peak of the matmul dtype) | host share of a decoding step | device peak: kiln (allocator) | torch (allocator) | planned |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
results = []
for line in open(rows):
    name, kind, flops, dtype, planned = line.rstrip("\n").split("\t")
    result = {"name": name, "kind": kind, "flops_per_token": float(flops), "matmul_dtype": dtype, "planned_bytes": float(planned)}
    key = "tokens_per_s" if kind == "train" else "decode_tokens_per_s"
    kiln, torch = figures(os.path.join(out, name + ".json")), figures(os.path.join(out, name + ".torch.json"))
    if kiln:
        result["kiln"] = kiln
        result["tokens_per_s"] = kiln.get(key)
        if kiln.get(key) and peaks[dtype]:
            result["mfu"] = kiln[key] * float(flops) / peaks[dtype]
        if kiln.get("host_share_of_step") is not None:
            result["host_share"] = kiln["host_share_of_step"]
        memory = kiln.get("device_memory") or {}
        result["peak_bytes"] = memory.get("reserved_max_bytes")
    if torch:
        result["torch"] = torch
        result["torch_tokens_per_s"] = torch.get(key)
        result["torch_peak_bytes"] = torch.get("peak_memory_bytes")
        if torch.get("error"):
            result["torch_error"] = torch["error"]
    if result.get("tokens_per_s") and result.get("torch_tokens_per_s"):
        result["ratio"] = result["tokens_per_s"] / result["torch_tokens_per_s"]
    results.append(result)
    fmt = lambda k, f: f(result[k]) if result.get(k) is not None else "-"
    lines.append(f"| {name} | {fmt('tokens_per_s', lambda v: f'{v:,.0f}')} | {fmt('torch_tokens_per_s', lambda v: f'{v:,.0f}')} "
                 f"| {fmt('ratio', lambda v: f'{v:.2f}x')} | {fmt('mfu', lambda v: f'{100 * v:.1f}% ({dtype})')} "
                 f"| {fmt('host_share', lambda v: f'{100 * v:.0f}%')} | {fmt('peak_bytes', gib)} | {fmt('torch_peak_bytes', gib)} "
                 f"| {fmt('planned_bytes', gib)} |")
parity = json.load(open(os.path.join(out, "parity.json"))) if not dry and os.path.exists(os.path.join(out, "parity.json")) else None
table = "\n".join(lines)
if parity:
    table += "\n\n" + open(os.path.join(out, "parity.md")).read().strip()
table += f"\n\nNCCL, one-rank communicator: {nccl}"
print(table)
open(os.path.join(out, "results.md"), "w").write(table + "\n")
json.dump({"gpu": gpu, "peaks_tflops": {"bf16": peak_bf16, "f32": peak_f32}, "dry_run": dry, "rows": results,
           "parity": parity, "nccl": nccl}, open(os.path.join(out, "results.json"), "w"), indent=1)
kind = "dry run: nothing was run" if dry else "tok/s: training steps, or decoding; MFU from kiln plan's FLOPs"
print(f"\n({kind}; written: results.md, results.json)")
PY
say "done"
[ "$FAILED" = 0 ] || die "some checks failed (see above and $OUT)"
