#!/usr/bin/env bash
# Data parallel on a machine with 2+ GPUs, in one command (issue #22's checks; the one-GPU NCCL
# row is in scripts/gpu-check.sh):
#   equivalence  N processes, one per GPU, placed by torchrun's environment (what
#                `torchrun --nproc-per-node N --no-python kiln pretrain ...` sets), each with
#                micro-batch 2, against one process on cuda:0 with micro-batch 2N: the same
#                losses and weights within 1e-4 relative after 3 steps;
#   bandwidth    `kiln bench --all-reduce` (NCCL) against torch.distributed's all-reduce (NCCL)
#                on the same GPUs, per size: algbw and busbw, and kiln / torch; and nccl-tests'
#                `all_reduce_perf` where it is on the path; the same for the all-gather that
#                hands out ZeRO-1's weights (`kiln bench --all-gather`, `all_gather_perf`);
#   ZeRO-1       the equivalence run again with `shard_optimizer = true`;
#   overlap      not measured: kiln all-reduces after the backward pass (burn hands out the
#                gradients only then), so there is no overlap to measure yet.
# Writes results.md and results.json under $OUT.
#
# Build where cargo is (`scripts/gpu-check.sh --build` -> gpu-bin/kiln.gz), then on the GPU machine:
#
#   KILN_BIN=gpu-bin/kiln scripts/multi-gpu-check.sh [--gpus N]
#
# Without GPUs, `--backend cpu` runs the same checks on CPU replicas (kiln's TCP ring; torch's
# gloo where torch is installed): tests/gpu_check.rs runs it so, and `--dry-run` prints the plan.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/small-run.sh

MODE=run BACKEND=cuda NPROC=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) MODE=dry ;;
        --backend) BACKEND="${2:?--backend needs cuda or cpu}"; shift ;;
        --gpus|--nproc) NPROC="${2:?$1 needs a number}"; shift ;;
        *) echo "usage: scripts/multi-gpu-check.sh [--dry-run] [--backend cuda|cpu] [--gpus N]" >&2; exit 2 ;;
    esac
    shift
done
KILN="${KILN_BIN:-target/release/kiln}"
# The binary travels gzipped (scripts/gpu-check.sh --build): unpack it next to itself.
if [ "$MODE" = run ] && [ ! -x "$KILN" ] && [ -f "$KILN.gz" ]; then
    gunzip -c "$KILN.gz" >"$KILN" && chmod +x "$KILN"
fi
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
die() { echo "multi-gpu-check: $*" >&2; exit 1; }
say() { printf '\n=== %s\n' "$1"; }
FAILED=0

if [ "$BACKEND" = cuda ]; then
    if [ "$MODE" = run ]; then
        command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this check needs NVIDIA GPUs (--backend cpu, or --dry-run, elsewhere)"
        GPUS=$(nvidia-smi -L | grep -c '^GPU')
        NPROC=${NPROC:-$GPUS}
        [ "$NPROC" -ge 2 ] || die "$GPUS GPU(s) here: the multi-GPU check needs 2 or more (scripts/gpu-check.sh has the one-GPU NCCL row)"
        MACHINE="$NPROC × $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
    else
        NPROC=${NPROC:-8}
        MACHINE="$NPROC GPUs (dry run)"
    fi
    SIZES=1048576,16777216,268435456,1073741824 REPEATS=20
else
    NPROC=${NPROC:-2}
    MACHINE="$NPROC CPU replicas on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
    SIZES=65536,4194304 REPEATS=3
fi
[ "$MODE" = run ] && { [ -x "$KILN" ] || die "no kiln binary at $KILN (scripts/gpu-check.sh --build, or set KILN_BIN)"; }
TORCH=0
"$PYTHON" -c 'import torch' 2>/dev/null && TORCH=1
echo "$MACHINE; kiln $KILN; torch $([ "$TORCH" = 1 ] && echo found || echo "not installed (kiln's figures only)"); figures in $OUT"

# N processes with torchrun's environment, one per device (torchrun --no-python sets the same).
launch() { # name command...
    local name=$1 port rank pids=() rc=0
    shift
    port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    echo "+ RANK=0..$((NPROC - 1)) WORLD_SIZE=$NPROC LOCAL_RANK=0..$((NPROC - 1)) MASTER_ADDR=127.0.0.1 MASTER_PORT=$port $*"
    [ "$MODE" = dry ] && return 0
    for rank in $(seq 0 $((NPROC - 1))); do
        RANK=$rank WORLD_SIZE=$NPROC LOCAL_RANK=$rank LOCAL_WORLD_SIZE=$NPROC MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            timeout 600 "$@" >"$OUT/$name.$rank.out" 2>"$OUT/$name.$rank.err" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
    if [ "$rc" -ne 0 ]; then
        tail -3 "$OUT/$name".*.err >&2
        echo "$name: failed (exit $rc)" >&2
        FAILED=1
    fi
}
run1() { # name command...
    local name=$1
    shift
    echo "+ $*"
    [ "$MODE" = dry ] && return 0
    "$@" >"$OUT/$name.out" 2>"$OUT/$name.err" || { tail -3 "$OUT/$name.err" >&2; echo "$name: failed" >&2; FAILED=1; }
}

say "equivalence: $NPROC processes × micro-batch 2 against one with micro-batch $((2 * NPROC))"
E="$OUT/equivalence"
for run in single multi sharded; do
    small_run "$E" "$run" 3 "$([ "$run" = single ] && echo $((2 * NPROC)) || echo 2)" 40000 "max_grad_norm = 0.5" \
        "$([ "$run" = sharded ] && echo "shard_optimizer = true")"
done
run1 data "$KILN" data interplay --ops 2 --per-op 400 --seed 1 --split train --out "$E/data"
run1 single "$KILN" pretrain --config "$E/single.toml" --backend "$([ "$BACKEND" = cuda ] && echo cuda:0 || echo cpu)"
launch multi "$KILN" pretrain --config "$E/multi.toml" --backend "$BACKEND"
# ZeRO-1: the same, each process keeping 1/N of AdamW's state (the updated weights all-gathered).
launch sharded "$KILN" pretrain --config "$E/sharded.toml" --backend "$BACKEND"
# The verdict on run $2 against run $1 (the one-device run).
compare() {
    "$PYTHON" - "$1" "$2" <<'PY' 2>&1 || true
import json, struct, sys
from array import array

def tensors(path):
    # safetensors: an 8-byte header length, a JSON header, the data (F32 here).
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", f"{name}: {t['dtype']}"
        start, end = t["data_offsets"]
        out[name] = array("f", raw[8 + n + start:8 + n + end])
    return out

single, multi = sys.argv[1], sys.argv[2]
a, b = tensors(f"{single}/checkpoint-3/model.safetensors"), tensors(f"{multi}/checkpoint-3/model.safetensors")
assert a.keys() == b.keys(), "parameter names differ"
# ||a - b|| / ||a|| per tensor, as tests/data_parallel_cli.rs measures it; not the key biases,
# whose exact gradient is zero (softmax ignores a constant per query), so that AdamW turns their
# rounding noise into full-size steps in any two runs that sum in another order.
norm = lambda v: sum(x * x for x in v) ** 0.5
worst = max(norm([x - y for x, y in zip(a[k], b[k])]) / max(norm(a[k]), 1e-30) for k in a if not k.endswith("k_proj.bias"))
loss = lambda run: [json.loads(l)["loss"] for l in open(f"{run}/metrics.jsonl") if '"loss"' in l]
la, lb = loss(single), loss(multi)
close = len(la) == len(lb) == 3 and all(abs(x - y) <= 1e-4 * abs(x) for x, y in zip(la, lb))
verdict = "passed" if worst <= 1e-4 and close else "FAILED"
print(f"{verdict}: weights within {worst:.1e} relative (L2, key biases aside); losses {', '.join(f'{x:.5f}' for x in lb)} against {', '.join(f'{x:.5f}' for x in la)}")
PY
}
EQUIV="not run" SHARDED="not run"
if [ "$MODE" = run ]; then
    EQUIV=$(compare "$E/single" "$E/multi")
    SHARDED=$(compare "$E/single" "$E/sharded")
    # ZeRO-1 changes no value: the sharded run's weights and losses are the unsharded one's, byte
    # for byte (every replica's optimizer step is elementwise; the weights are copied).
    same=$("$PYTHON" - "$E/multi" "$E/sharded" <<'PY' 2>&1 || true
import json, sys
a, b = sys.argv[1:3]
weights = lambda run: open(f"{run}/checkpoint-3/model.safetensors", "rb").read()
losses = lambda run: [json.loads(l)["loss"] for l in open(f"{run}/metrics.jsonl") if '"loss"' in l]
same = weights(a) == weights(b) and losses(a) == losses(b)
print("and byte for byte the unsharded run's weights and losses" if same else "but NOT the unsharded run's weights and losses byte for byte")
PY
)
    SHARDED="$SHARDED; $same"
    case "$same" in and*) ;; *) SHARDED="FAILED: $SHARDED" ;; esac
    case "$EQUIV" in passed*) ;; *) FAILED=1 ;; esac
    case "$SHARDED" in passed*) ;; *) FAILED=1 ;; esac
    grep -h '^kiln: NCCL' "$OUT"/multi.*.err | head -1 || true
fi
echo "equivalence: $EQUIV"
echo "equivalence with shard_optimizer: $SHARDED"

say "bandwidth: kiln bench --all-reduce and --all-gather against torch.distributed on the same devices"
launch kiln-all-reduce "$KILN" bench --all-reduce --backend "$BACKEND" --sizes "$SIZES" --repeats "$REPEATS"
launch kiln-all-gather "$KILN" bench --all-gather --backend "$BACKEND" --sizes "$SIZES" --repeats "$REPEATS"
if [ "$TORCH" = 1 ]; then
    launch torch-all-reduce "$PYTHON" benches/torch_all_reduce.py --sizes "$SIZES" --repeats "$REPEATS"
    launch torch-all-gather "$PYTHON" benches/torch_all_reduce.py --all-gather --sizes "$SIZES" --repeats "$REPEATS"
fi
if [ "$BACKEND" = cuda ] && command -v all_reduce_perf >/dev/null; then
    run1 nccl-tests all_reduce_perf -b 1M -e 1G -f 16 -g "$NPROC" -n "$REPEATS"
fi
if [ "$BACKEND" = cuda ] && command -v all_gather_perf >/dev/null; then
    run1 nccl-tests-all-gather all_gather_perf -b 1M -e 1G -f 16 -g "$NPROC" -n "$REPEATS"
fi

say "results"
"$PYTHON" - "$OUT" "$MACHINE" "$EQUIV" "$MODE" "$SHARDED" <<'PY'
import glob, json, os, sys
out, machine, equivalence, mode, sharded = sys.argv[1:6]
def rows(name):
    path = os.path.join(out, f"{name}.0.out")
    if not os.path.exists(path):
        return {}
    return {r["row"]["bytes"]: r["row"] for r in map(json.loads, filter(str.strip, open(path)))}
lines = [f"Data parallel on {machine}", "", f"- equivalence to one device: {equivalence}", f"- the same with shard_optimizer (ZeRO-1): {sharded}",
         "- overlap of the all-reduce with the backward pass: not measured (kiln reduces after it)"]
found = {}
for op in ("all-reduce", "all-gather"):
    kiln, torch = rows(f"kiln-{op}"), rows(f"torch-{op}")
    found[op] = (kiln, torch)
    lines += ["", f"| {op}, bytes | kiln busbw GB/s | torch busbw GB/s | kiln / torch |", "|---:|---:|---:|---:|"]
    for size in sorted(set(kiln) | set(torch)):
        k, t = kiln.get(size, {}).get("busbw_gb_s"), torch.get(size, {}).get("busbw_gb_s")
        f = lambda v: f"{v:.2f}" if v is not None else "-"
        lines.append(f"| {size:,} | {f(k)} | {f(t)} | {f'{k / t:.2f}x' if k and t else '-'} |")
table = "\n".join(lines)
print(table if mode == "run" else "(dry run: nothing was run)")
open(os.path.join(out, "results.md"), "w").write(table + "\n")
(kiln, torch), (kiln_gather, torch_gather) = found["all-reduce"], found["all-gather"]
json.dump({"machine": machine, "equivalence": equivalence, "sharded": sharded, "kiln": list(kiln.values()), "torch": list(torch.values()),
           "kiln_all_gather": list(kiln_gather.values()), "torch_all_gather": list(torch_gather.values())},
          open(os.path.join(out, "results.json"), "w"), indent=1)
PY
[ "$FAILED" = 0 ] || die "some checks failed (see above and $OUT)"
