#!/usr/bin/env bash
# The figures of README "In the browser": the page's bundle size (wasm, gzip), and for the
# quickstart's tiny model (random weights, batch 1, a 32-token prompt, greedy) the model load time
# and decoding tok/s in headless Chromium on WebGPU/SwiftShader, next to `kiln bench` at the same
# shape on native wgpu (Vulkan: lavapipe here) and on the CPU backend. A benchmark, not a test:
# it prints figures (noisy on a shared machine).
#
#   scripts/bench-web.sh [--new-tokens N]       (default 64)
#
# Needs what scripts/build-web.sh needs, Chromium, python3 (a static server on 127.0.0.1) and a
# Vulkan driver for the wgpu row. Work files go to $CARGO_TARGET_DIR/web-bench (or target/).
set -euo pipefail
cd "$(dirname "$0")/.."

new_tokens=64
case "${1:-}" in
    --new-tokens) new_tokens=$2 ;;
    "") ;;
    *) echo "usage: scripts/bench-web.sh [--new-tokens N]" >&2; exit 2 ;;
esac
target=${CARGO_TARGET_DIR:-target}
work=$target/web-bench
rm -rf "$work" && mkdir -p "$work"

scripts/build-web.sh "$work/site" 2> "$work/build.log" || { cat "$work/build.log" >&2; exit 1; }
bundle=$(tail -n 1 "$work/build.log" | sed 's/^build-web: [^:]*: //')
cargo build --locked --release --features wgpu --bin kiln 2> "$work/cargo.log" || { tail -n 20 "$work/cargo.log" >&2; exit 1; }
kiln=$target/release/kiln

# The quickstart's model (core/src/tasks/interplay/tiny_model.rs), random weights.
tiny=$work/tiny
mkdir -p "$tiny"
sed -n '/^pub const TINY_CONFIG: &str = r#"/,/^"#;/p' core/src/tasks/interplay/tiny_model.rs | sed '1s/.*/{/; $d' > "$tiny/config.json"
"$kiln" init --config "$tiny/config.json" --out "$work/site/model" --seed 7 \
    --tokenizer-from tests/fixtures/interplay/qwen2_100M > /dev/null
prompt_len=32
prompt=$(seq -s, 10 $((9 + prompt_len)))

# The page in headless Chromium (one untimed generation first, as `kiln bench` warms up).
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server --bind 127.0.0.1 --directory "$work/site" "$port" > /dev/null 2>&1 &
server=$!
chromium --headless=new --no-sandbox --enable-unsafe-webgpu --enable-features=Vulkan \
    --use-vulkan=swiftshader --use-webgpu-adapter=swiftshader --enable-logging=stderr \
    --disable-background-networking --disable-component-update --disable-sync --no-first-run \
    --disable-quic --user-data-dir="$work/profile" \
    "http://127.0.0.1:$port/index.html?prompt_ids=$prompt&max_new_tokens=$new_tokens&warmup=1" 2> "$work/chromium.log" &
browser=$!
trap 'kill $browser $server 2>/dev/null || true' EXIT
for _ in $(seq 900); do
    grep -q 'KILN_RESULT \|KILN_ERROR ' "$work/chromium.log" && break
    sleep 1
done
kill $browser $server 2>/dev/null || true
page=$(grep -o 'KILN_RESULT {.*}' "$work/chromium.log" | head -n 1 | sed 's/^KILN_RESULT //')
[ -n "$page" ] || { echo "bench-web: the page gave no result; $work/chromium.log:" >&2; grep KILN_ "$work/chromium.log" >&2; exit 1; }
echo "$page" > "$work/page.json"

native() { "$kiln" bench --backend "$1" --config "$tiny/config.json" --batch 1 --prompt-len $prompt_len --new-tokens "$new_tokens" 2>/dev/null | tail -n 1; }
cpu=$(native cpu)
wgpu=$(native wgpu)

python3 - "$bundle" "$page" "$wgpu" "$cpu" <<'EOF'
import json, sys
bundle, page, wgpu, cpu = sys.argv[1], *map(json.loads, sys.argv[2:])
print(f"bundle: {bundle}")
print(f"tiny model, batch 1, prompt {cpu['prompt_len']}, greedy, {len(page['token_ids'])} new tokens in the browser ({cpu['new_tokens']} natively)")
print(f"| | load | prefill | decode |")
print(f"|---|---:|---:|---:|")
print(f"| browser, WebGPU on SwiftShader ({page['adapter']}) | {page['load_ms']:.0f} ms | {page['prefill_ms']:.0f} ms | {page['tokens_per_s']:.1f} tok/s |")
for name, r in (("native wgpu (Vulkan)", wgpu), ("native CPU backend", cpu)):
    print(f"| {name} | | {r['prefill_s'] * 1e3:.0f} ms | {r['decode_tokens_per_s']:.1f} tok/s |")
EOF
