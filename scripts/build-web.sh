#!/usr/bin/env bash
# Builds kiln's web page into OUT_DIR: index.html, app.js, the wasm module and its JavaScript
# glue (kiln_web_bg.wasm, kiln_web.js). Serve OUT_DIR over HTTP and open index.html in a browser
# with WebGPU; the page loads the model directory `model/` beside it unless `?model=URL` says
# otherwise (see web/README.md).
#
#   scripts/build-web.sh OUT_DIR [--model MODEL_DIR]
#
# --model copies a Hugging Face model directory (config.json, model.safetensors, tokenizer
# files) into OUT_DIR/model, e.g. the quickstart's last checkpoint:
#   scripts/build-web.sh site --model kiln-quickstart/release/pretrain/checkpoint-400
#
# Needs the wasm32 standard library (`rustup target add wasm32-unknown-unknown`, or where rustup
# cannot download: ../shared/toolchains/install-wasm32-std.sh) and wasm-bindgen-cli at exactly
# the version of the `wasm-bindgen` crate in Cargo.lock (on PATH, or WASM_BINDGEN=/path):
#   cargo install --locked wasm-bindgen-cli --version <that version>
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

usage() { echo "usage: scripts/build-web.sh OUT_DIR [--model MODEL_DIR]" >&2; exit 2; }
[ $# -ge 1 ] || usage
out=$1; shift
model=""
while [ $# -gt 0 ]; do
    case $1 in
        --model) [ $# -ge 2 ] || usage; model=$2; shift 2 ;;
        *) usage ;;
    esac
done

version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' "$root/Cargo.lock")
[ -n "$version" ] || { echo "build-web: no wasm-bindgen in $root/Cargo.lock" >&2; exit 1; }
bindgen=${WASM_BINDGEN:-wasm-bindgen}
have=$("$bindgen" --version 2>/dev/null | awk '{print $2}') || true
if [ "$have" != "$version" ]; then
    echo "build-web: needs wasm-bindgen-cli $version (the wasm-bindgen crate in Cargo.lock); found: ${have:-none} ($bindgen)." >&2
    echo "  install: cargo install --locked wasm-bindgen-cli --version $version (then put it on PATH or set WASM_BINDGEN)" >&2
    exit 1
fi
sysroot=$(rustc --print sysroot)
if ! ls "$sysroot"/lib/rustlib/wasm32-unknown-unknown/lib/libstd-*.rlib >/dev/null 2>&1; then
    echo "build-web: the wasm32-unknown-unknown standard library is not installed for $(rustc -V)." >&2
    echo "  install: rustup target add wasm32-unknown-unknown" >&2
    echo "  (offline, for rustc 1.95.0: ../shared/toolchains/install-wasm32-std.sh)" >&2
    exit 1
fi

target_dir=${CARGO_TARGET_DIR:-$root/target}
echo "build-web: cargo build --release --target wasm32-unknown-unknown -p kiln-web" >&2
(cd "$root" && cargo build --locked --release --target wasm32-unknown-unknown -p kiln-web)

mkdir -p "$out"
# Without the function-name section (2 MB; panics still name their message and place).
"$bindgen" --target web --no-typescript --remove-name-section --out-dir "$out" "$target_dir/wasm32-unknown-unknown/release/kiln_web.wasm"
cp "$root"/web/static/* "$out"/
if [ -n "$model" ]; then
    rm -rf "$out/model"
    mkdir -p "$out/model"
    for f in config.json generation_config.json model.safetensors model.safetensors.index.json \
             tokenizer.json tokenizer_config.json special_tokens_map.json; do
        if [ -f "$model/$f" ]; then cp "$model/$f" "$out/model/"; fi
    done
    if [ -f "$model/model.safetensors.index.json" ]; then cp "$model"/model-*.safetensors "$out/model/"; fi
fi

wasm="$out/kiln_web_bg.wasm"
awk -v f="$wasm" -v raw="$(wc -c < "$wasm")" -v gz="$(gzip -9c "$wasm" | wc -c)" \
    'BEGIN { printf "build-web: %s: %.2f MB, %.2f MB gzipped (gzip -9)\n", f, raw / 1e6, gz / 1e6 }' >&2
