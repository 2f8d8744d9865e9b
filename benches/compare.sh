#!/usr/bin/env bash
# kiln against PyTorch/transformers and CTranslate2 on this machine, one benchmark after the
# other, as ONE table with ratios, headed by the CPU model, its flags, the library versions and the
# thread counts (issues 13, 21, 25). Run it on a quiet machine: every figure is wall-clock
# throughput.
#
#   benches/compare.sh --setup              # once: a venv with CPU torch, transformers, ctranslate2
#   benches/compare.sh                      # CPU: kiln (Flex) vs transformers/PyTorch and CTranslate2
#   benches/compare.sh --backends cpu,wgpu  # adds kiln's other backends as extra columns
#   benches/compare.sh --ct2-batches "1 8"  # the batch sizes of the CTranslate2 rows (default 1 8 32 128)
#   benches/compare.sh --quick              # fewer repeats (not for the README)
#   benches/compare.sh --smoke              # the whole script at tiny sizes (checks it works; figures meaningless)
#
# Python: $PYTHON if set; else the venv that --setup makes (KILN_BENCH_VENV, default
# ${XDG_CACHE_HOME:-~/.cache}/kiln-bench-venv); else python3 if it imports torch and transformers;
# else an error saying how to make one. ctranslate2 is optional: without it the CTranslate2 rows
# are left out, saying so.
# KILN: the kiln binary (default: builds target/release/kiln with the features the backends need).
#
# Rows: generation of the 100M config at batch 8 x 64 -> 128 (prefill, decode, end to end),
# decoding at batch 32 and 128, RL rollouts through an autodiff-loaded model (`--rollout`, vs
# plain `kiln bench` at the same batch), training steps (forward, backward, clip, AdamW) of the
# 100M config at 8 x 256 in f32 and in bf16 (kiln's bf16-mixed vs torch.autocast("cpu",
# torch.bfloat16)) and of the quickstart's tiny config at 8 x 512, the f32 matrix products alone
# at the 100M training step's shapes (`kiln bench --matmul` vs benches/torch_matmul.py, GFLOP/s
# weighted as a step runs them), this machine's sgemm rate (torch.mm 2048^3), the ceiling the
# training figures compare with, and its memory read bandwidth (torch.sum over 1 GiB,
# benches/memory_bandwidth.py), the ceiling decoding's weight throughput compares with; then
# kiln vs CTranslate2 f32
# end to end (64 -> 128 tokens, greedy) at each --ct2-batches size, both reading the same
# random-weights model directory (made by transformers, converted by ct2-transformers-converter).
set -euo pipefail
cd "$(dirname "$0")/.."

backends=cpu
repeats=3
smoke=0
setup=0
ct2_batches=""
while [ $# -gt 0 ]; do
  case "$1" in
    --backends) backends="$2"; shift 2 ;;
    --quick) repeats=1; shift ;;
    --smoke) smoke=1; repeats=1; shift ;;
    --setup) setup=1; shift ;;
    --ct2-batches) ct2_batches="$2"; shift 2 ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done

venv="${KILN_BENCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln-bench-venv}"
has_torch() { "$1" -c "import torch, transformers" >/dev/null 2>&1; }

if [ "$setup" = 1 ]; then
  base="${SETUP_PYTHON:-python3}"
  echo "compare.sh --setup: creating $venv from $base" >&2
  "$base" -m venv "$venv" || {
    echo "compare.sh: '$base -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)" >&2; exit 1; }
  pip=("$venv/bin/python" -m pip install --disable-pip-version-check)
  # PyTorch's own index serves the CPU-only build (~200 MB); PyPI's torch is the CUDA build,
  # which brings ~5 GB of nvidia-* packages.
  if "${pip[@]}" --retries 1 --timeout 30 torch --index-url https://download.pytorch.org/whl/cpu; then
    echo "compare.sh --setup: torch is PyTorch's CPU build" >&2
  else
    free=$(df -Pk "$(dirname "$venv")" | awk 'NR == 2 { print int($4 / 1048576) }')
    echo "compare.sh --setup: PyTorch's CPU index is unreachable from here; falling back to PyPI's torch (the CUDA build, ~6 GB installed); $free GiB free" >&2
    if [ "$free" -lt 8 ]; then
      echo "compare.sh: not installing PyPI's torch with $free GiB free (it needs ~6 GB, 8 to be safe): free some space, or set PYTHON to a Python that has torch and transformers" >&2
      exit 1
    fi
    "${pip[@]}" torch
  fi
  "${pip[@]}" transformers ctranslate2
  "$venv/bin/python" -c "import torch, transformers, ctranslate2; print('compare.sh --setup: torch', torch.__version__, '/ transformers', transformers.__version__, '/ ctranslate2', ctranslate2.__version__)"
  echo "compare.sh --setup: done; now run benches/compare.sh" >&2
  exit 0
fi

how="run benches/compare.sh --setup (creates $venv with CPU torch, transformers and ctranslate2), or set PYTHON to a Python that has torch and transformers"
if [ -n "${PYTHON:-}" ]; then
  has_torch "$PYTHON" || { echo "compare.sh: PYTHON=$PYTHON cannot import torch and transformers: $how" >&2; exit 1; }
elif [ -x "$venv/bin/python" ] && has_torch "$venv/bin/python"; then
  PYTHON="$venv/bin/python"
elif command -v python3 >/dev/null && has_torch python3; then
  PYTHON=python3
else
  echo "compare.sh: no Python with torch and transformers found (\$PYTHON unset, $venv absent or incomplete, python3 lacks them): $how" >&2
  exit 1
fi
ct2=1
"$PYTHON" -c "import ctranslate2" >/dev/null 2>&1 || ct2=0

features=""
for b in ${backends//,/ }; do
  case "$b" in cpu) ;; wgpu|cuda) features="$features,$b" ;; *) echo "unknown backend $b" >&2; exit 2 ;; esac
done
if [ -z "${KILN:-}" ]; then
  cargo build --release --quiet --features "cpu$features"
  KILN="${CARGO_TARGET_DIR:-target}/release/kiln"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tiny="$work/tiny.json"
# The quickstart's model (core/src/tasks/interplay/tiny_model.rs).
sed -n '/^pub const TINY_CONFIG: &str = r#"/,/^"#;/p' core/src/tasks/interplay/tiny_model.rs | sed '1s/.*/{/; $d' > "$tiny"

# Sizes: the benchmark's, or --smoke's (tiny model, short runs: checks the script, not figures).
big=tests/fixtures/interplay/qwen2_100M/config.json; bigname=100M
prompt=64; new=128; new128=64; tseq=256; tinyseq=512; gemm_n=2048; bw_mib=1024
if [ "$smoke" = 1 ]; then
  big="$tiny"; bigname="tiny, smoke"
  prompt=8; new=8; new128=4; tseq=32; tinyseq=32; gemm_n=256; bw_mib=64
  ct2_batches="${ct2_batches:-1 4}"
fi
ct2_batches="${ct2_batches:-1 8 32 128}"

# The header: what the figures depend on.
cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || true)
flags=$(awk -F': ' '/^flags/ { print " " $2 " "; exit }' /proc/cpuinfo 2>/dev/null || true)
has=""
for f in avx2 avx512f avx512_bf16 amx_bf16 amx_tile; do
  case "$flags" in *" $f "*) has="$has $f" ;; *) has="$has no-$f" ;; esac
done
echo "CPU: ${cpu:-unknown ($(uname -m))}, $(nproc) cores available; flags:$has"
"$PYTHON" - "$ct2" <<'EOF'
import os, sys
import torch, transformers
cap = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: "?")()
line = (f"Python {sys.version.split()[0]} ({sys.executable}): torch {torch.__version__} (CPU capability {cap}, "
        f"{os.cpu_count()} threads in the bench scripts), transformers {transformers.__version__}")
if sys.argv[1] == "1":
    import ctranslate2
    line += f", ctranslate2 {ctranslate2.__version__} ({os.cpu_count()} intra threads, 1 inter)"
else:
    line += ", ctranslate2 not installed (its rows are left out; benches/compare.sh --setup installs it)"
print(line)
EOF
echo "kiln: $KILN, $(nproc) threads (rayon)${RAYON_NUM_THREADS:+, RAYON_NUM_THREADS=$RAYON_NUM_THREADS}${OMP_NUM_THREADS:+; OMP_NUM_THREADS=$OMP_NUM_THREADS}; backends $backends"
[ "$smoke" = 1 ] && echo "SMOKE RUN: tiny model and sizes, one repeat; these figures only show that the script works"

out="$work/results.jsonl"
run() { # label, command...
  local label="$1"; shift
  echo "  $label" >&2
  local line
  line=$("$@" 2>"$work/stderr" | tail -n 1) || {
    echo "compare.sh: '$label' failed: $*" >&2; tail -n 20 "$work/stderr" >&2; exit 1; }
  printf '{"label": "%s", "result": %s}\n' "$label" "$line" >> "$out"
}

echo "running (one after the other):" >&2
for b in ${backends//,/ }; do
  run "kiln-$b gen b8"     "$KILN" bench --backend "$b" --config "$big" --batch 8 --prompt-len $prompt --new-tokens $new --repeats "$repeats"
  run "kiln-$b gen b32"    "$KILN" bench --backend "$b" --config "$big" --batch 32 --prompt-len $prompt --new-tokens $new --repeats "$repeats"
  run "kiln-$b gen b128"   "$KILN" bench --backend "$b" --config "$big" --batch 128 --prompt-len $prompt --new-tokens $new128 --repeats 1
  run "kiln-$b rollout b8" "$KILN" bench --backend "$b" --config "$big" --batch 8 --prompt-len $prompt --new-tokens $new --rollout --repeats "$repeats"
  run "kiln-$b train 100M" "$KILN" bench --backend "$b" --config "$big" --train --batch 8 --prompt-len $tseq --repeats "$repeats"
  # WGSL has no bf16: wgpu has no bf16-mixed row.
  [ "$b" = wgpu ] || run "kiln-$b train 100M bf16" "$KILN" bench --backend "$b" --config "$big" --train --precision bf16-mixed --batch 8 --prompt-len $tseq --repeats "$repeats"
  run "kiln-$b train tiny" "$KILN" bench --backend "$b" --config "$tiny" --train --batch 8 --prompt-len $tinyseq --repeats $((repeats + 2))
done
# The f32 matrix products alone, at the training step's shapes (CPU).
run "kiln-cpu matmul"  "$KILN" bench --matmul --config "$big" --batch 8 --prompt-len $tseq --repeats "$repeats"
run "torch matmul"     "$PYTHON" benches/torch_matmul.py --config "$big" --batch 8 --seq $tseq --repeats "$repeats"
run "hf gen b8"        "$PYTHON" benches/hf_generate_baseline.py --config "$big" --batch 8 --prompt-len $prompt --new-tokens $new --repeats "$repeats"
run "torch train 100M" "$PYTHON" benches/torch_train_step.py --config "$big" --batch 8 --seq $tseq --steps $((repeats + 2))
run "torch train 100M bf16" "$PYTHON" benches/torch_train_step.py --config "$big" --batch 8 --seq $tseq --steps $((repeats + 2)) --autocast bf16
run "torch train tiny" "$PYTHON" benches/torch_train_step.py --config "$tiny" --batch 8 --seq $tinyseq --steps $((repeats + 5))
run "sgemm"            "$PYTHON" benches/sgemm_peak.py --n $gemm_n
run "bandwidth"        "$PYTHON" benches/memory_bandwidth.py --mib $bw_mib

# kiln vs CTranslate2 on one model directory: transformers makes it (random weights, seed 0),
# kiln reads it with --model, ct2-transformers-converter converts it to float32.
if [ "$ct2" = 1 ]; then
  run "hf model" "$PYTHON" benches/ct2_generate.py --make-hf "$work/hf" --config "$big"
  echo "  ct2-transformers-converter --quantization float32" >&2
  converter=("$(dirname "$PYTHON")/ct2-transformers-converter")
  [ -x "${converter[0]}" ] || converter=("$PYTHON" -m ctranslate2.converters.transformers)
  "${converter[@]}" --model "$work/hf" --output_dir "$work/ct2" --quantization float32 >"$work/stderr" 2>&1 || {
    echo "compare.sh: ct2-transformers-converter failed:" >&2; tail -n 20 "$work/stderr" >&2; exit 1; }
  for n in $ct2_batches; do
    run "kiln-cpu ct2 b$n" "$KILN" bench --backend cpu --model "$work/hf" --batch "$n" --prompt-len $prompt --new-tokens $new --repeats "$repeats"
    run "ct2 b$n" "$PYTHON" benches/ct2_generate.py --model "$work/ct2" --batch "$n" --prompt-len $prompt --new-tokens $new --repeats "$repeats"
  done
fi

"$PYTHON" - "$out" "$backends" "$bigname" "$prompt" "$new" "$new128" "$tseq" "$tinyseq" "$gemm_n" "$ct2" "$ct2_batches" <<'EOF'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows[r["label"]] = r["result"]
backends = sys.argv[2].split(",")
big, prompt, new, new128, tseq, tinyseq, gemm_n = sys.argv[3], *map(int, sys.argv[4:10])
ct2, ct2_batches = sys.argv[10] == "1", sys.argv[11].split()
hf, torch_big, torch_bf16, torch_tiny, gemm = (rows[k] for k in ("hf gen b8", "torch train 100M", "torch train 100M bf16", "torch train tiny", "sgemm"))
print(f"baselines: {hf['engine']} (attention {hf['attn']}, {hf['threads']} threads); sgemm {gemm_n}^3 {gemm['gflops']:.0f} GFLOP/s")
head = f"| {'tokens/s':<52} |" + "".join(f" {'kiln ' + b:>10} |" for b in backends) + f" {'baseline':>10} | {'ratio':>6} |"
rule = "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"
print(head)
print(rule)
def row(name, key, label, base=None):
    vals = [rows.get(f"kiln-{b} {label}", {}).get(key) for b in backends]
    cells = "".join(f" {v:>10.1f} |" if v is not None else f" {'-':>10} |" for v in vals)
    if base is None:
        print(f"| {name:<52} |{cells} {'':>10} | {'':>6} |")
    else:
        ratio = vals[0] / base if vals[0] else float("nan")
        print(f"| {name:<52} |{cells} {base:>10.1f} | {ratio:>5.2f}x |")
row(f"prefill 8x{prompt} ({big})", "prefill_tokens_per_s", "gen b8", hf["prefill_tokens_per_s"])
row(f"decode 8x{prompt}->{new} ({big})", "decode_tokens_per_s", "gen b8", hf["decode_tokens_per_s"])
row(f"end to end 8x{prompt}->{new} ({big})", "end_to_end_tokens_per_s", "gen b8", hf["end_to_end_tokens_per_s"])
row(f"decode batch 32 ({big})", "decode_tokens_per_s", "gen b32")
row(f"decode batch 128, {new128} new ({big})", "decode_tokens_per_s", "gen b128")
row("rollout end to end b8 (vs kiln bench)", "end_to_end_tokens_per_s", "rollout b8", rows[f"kiln-{backends[0]} gen b8"]["end_to_end_tokens_per_s"])
row(f"train step 8x{tseq} f32 ({big})", "tokens_per_s", "train 100M", torch_big["tokens_per_s"])
row(f"train step 8x{tseq} bf16 ({big}; torch autocast)", "tokens_per_s", "train 100M bf16", torch_bf16["tokens_per_s"])
row(f"train step 8x{tinyseq} (tiny, quickstart)", "tokens_per_s", "train tiny", torch_tiny["tokens_per_s"])
row(f"f32 GEMM GFLOP/s, step 8x{tseq} shapes (torch.mm)", "kiln_gflops", "matmul", rows["torch matmul"]["gflops"])
if ct2:
    c = rows[f"ct2 b{ct2_batches[0]}"]
    print(f"CTranslate2: {c['engine']}, compute type {c['compute_type']}, {c['threads']} intra threads; "
          f"both engines read the same model directory")
    h2 = f"| {'end to end tokens/s, ' + str(prompt) + '->' + str(new) + ' greedy (' + big + ')':<52} | {'kiln cpu':>10} | {'ct2 f32':>10} | {'ratio':>6} |"
    print(h2)
    print("|" + "|".join("-" * (len(c)) for c in h2.split("|")[1:-1]) + "|")
    for n in ct2_batches:
        k, t = rows[f"kiln-cpu ct2 b{n}"]["end_to_end_tokens_per_s"], rows[f"ct2 b{n}"]["end_to_end_tokens_per_s"]
        print(f"| {'batch ' + n:<52} | {k:>10.1f} | {t:>10.1f} | {k / t:>5.2f}x |")
else:
    print("CTranslate2: not installed in this Python, rows left out (benches/compare.sh --setup installs it)")
params = rows[f"kiln-{backends[0]} train 100M"]["parameters"]
for who, tps in [("kiln", rows[f"kiln-{backends[0]} train 100M"]["tokens_per_s"]), ("torch", torch_big["tokens_per_s"])]:
    # 6 N flops per token (forward + backward), attention excluded.
    print(f"{who} training f32 ({big}): {6 * params * tps / 1e9:.0f} GFLOP/s ({6 * params * tps / 1e9 / gemm['gflops']:.0%} of sgemm)")
# Decoding reads every f32 weight once a step (the tied head's embedding included).
bw = rows["bandwidth"]["read_gb_per_s"]
# Both from the decode row (8 rows a step); kiln's mean `decode_step_ms` also averages in the
# prefill step.
for who, step_s in [("kiln", 8 / rows[f"kiln-{backends[0]} gen b8"]["decode_tokens_per_s"]), ("transformers", 8 / hf["decode_tokens_per_s"])]:
    print(f"{who} decode b8 ({big}): weights at {4 * params / step_s / 1e9:.1f} GB/s ({4 * params / step_s / 1e9 / bw:.0%} of the "
          f"{bw:.1f} GB/s read bandwidth of torch.sum over {rows['bandwidth']['mib']} MiB)")
EOF
