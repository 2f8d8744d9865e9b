#!/usr/bin/env python3
"""Where `kiln plan --backend cpu`'s activation coefficients come from: the peak RSS of
`kiln bench --train` steps (one worker thread, freed memory returned at once, the smaller of two
processes, the process's own memory taken off as in tests/plan.rs) on 24 shapes from 1.3M to 100M
parameters, fitted by least squares (relative errors) with the weights and AdamW's moments
(12 bytes a parameter) held fixed; then the plan's own figure for each shape beside the measured one.

Usage: python3 benches/plan_fit.py [KILN_BIN] [--precision f32|bf16-mixed]
(default target/release/kiln, f32; about 3 minutes in f32 on a 2-core machine; run it on a quiet
machine). For bf16-mixed on a CPU with AVX512-BF16 it fits what that path adds to the f32 one.
"""
import json, os, subprocess, sys, tempfile

args = [a for a in sys.argv[1:] if not a.startswith("--")]
KILN = args[0] if args else os.environ.get("KILN_BIN", "target/release/kiln")
PRECISION = sys.argv[sys.argv.index("--precision") + 1] if "--precision" in sys.argv else "f32"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = json.loads(open(os.path.join(ROOT, "core/src/tasks/interplay/tiny_model.rs")).read().split('r#"', 1)[1].split('"#', 1)[0])
EMPTY = dict(vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=16)
MIB = 2**20
# (layers, intermediate, hidden, heads, kv heads, head size, vocab, batch, seq)
GRID = [
    (1, 512, 128, 4, 2, 32, 2200, 4, 256), (2, 512, 128, 4, 2, 32, 2200, 4, 256), (4, 512, 128, 4, 2, 32, 2200, 4, 256),
    (8, 512, 128, 4, 2, 32, 2200, 4, 256), (4, 512, 256, 4, 2, 32, 2200, 4, 256), (8, 512, 256, 4, 2, 32, 2200, 4, 256),
    (4, 512, 128, 4, 2, 32, 2200, 4, 512), (4, 512, 128, 4, 2, 32, 2200, 8, 512), (4, 1024, 128, 4, 2, 32, 2200, 4, 256),
    (4, 1024, 256, 8, 2, 32, 2200, 4, 256), (4, 4096, 256, 4, 2, 64, 2200, 4, 256), (2, 2048, 768, 8, 2, 64, 2200, 4, 256),
    (2, 2048, 512, 8, 2, 64, 2200, 4, 256), (6, 2048, 512, 8, 2, 64, 2200, 4, 256), (6, 1024, 512, 8, 2, 64, 2200, 4, 256),
    (6, 2048, 768, 8, 2, 64, 2200, 4, 256), (6, 2048, 512, 16, 2, 64, 2200, 4, 256), (6, 2048, 512, 8, 4, 64, 2200, 4, 256),
    (6, 2048, 512, 8, 2, 64, 2200, 4, 512), (6, 2048, 512, 8, 2, 64, 2200, 8, 256), (4, 2048, 512, 8, 2, 64, 2200, 2, 256),
    (2, 2048, 512, 8, 2, 64, 8800, 4, 256), (12, 3072, 768, 12, 2, 64, 2200, 4, 256), (12, 3072, 768, 12, 2, 64, 2200, 2, 512),
]
# The f32 path's coefficients (core/src/plan.rs), held fixed when fitting bf16-mixed's addition.
F32 = dict(Lh=12.5, Li=13.5, Lq=15.0, Lkv=4.0, h=28.0, v=10.0)


def peak(config, batch, seq, precision):
    env = dict(os.environ, RAYON_NUM_THREADS="1", MIMALLOC_PURGE_DELAY="0")
    cmd = [KILN, "bench", "--train", "--repeats", "1", "--config", config, "--batch", str(batch), "--prompt-len", str(seq), "--precision", precision]
    figures = [json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout) for _ in range(2)]
    # Less the pages that map files (the binary), whose residency depends on the page cache.
    return min(f["peak_rss_mib"] - f["file_rss_mib"] for f in figures) * MIB


def planned(config, batch, seq, precision):
    cmd = [KILN, "plan", "--json", "--backend", "cpu", "--config", config, "--batch", str(batch), "--seq", str(seq), "--precision", precision]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def lstsq(X, y):
    """Least squares by the normal equations (no numpy needed)."""
    n = len(X[0])
    A = [[sum(r[i] * r[j] for r in X) for j in range(n)] + [sum(r[i] * t for r, t in zip(X, y))] for i in range(n)]
    for i in range(n):
        p = max(range(i, n), key=lambda r: abs(A[r][i]))
        A[i], A[p] = A[p], A[i]
        for r in range(n):
            if r != i:
                f = A[r][i] / A[i][i]
                A[r] = [a - f * b for a, b in zip(A[r], A[i])]
    return [A[i][n] / A[i][i] for i in range(n)]


def features(s):
    layers, inter, hidden, heads, kv_heads, d, vocab, batch, seq = s
    n = batch * seq
    return dict(Lh=n * layers * hidden, Li=n * layers * inter, Lq=n * layers * heads * d, Lkv=n * layers * kv_heads * d, h=n * hidden, v=n * vocab)


with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "config.json")
    json.dump(EMPTY, open(path, "w"))
    runtime = peak(path, 1, 4, "f32") - planned(path, 1, 4, "f32")["training_peak"]
    print(f"process without a model: {runtime / MIB:.1f} MiB ({KILN}, {PRECISION})")
    rows = []
    for s in GRID:
        layers, inter, hidden, heads, kv_heads, d, vocab, batch, seq = s
        json.dump(dict(TINY, num_hidden_layers=layers, intermediate_size=inter, hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=d, vocab_size=vocab), open(path, "w"))
        plan = planned(path, batch, seq, PRECISION)
        rows.append((s, peak(path, batch, seq, PRECISION) - runtime, plan["parameters"], plan["training_peak"]))
        print(f"{s}: measured {rows[-1][1] / MIB:8.1f} MiB, planned {plan['training_peak'] / MIB:8.1f} ({plan['training_peak'] / rows[-1][1]:.3f})", flush=True)

fixed = {} if PRECISION == "f32" else F32
names = ["Lh", "Li", "Lq", "Lkv", "h", "v"] if PRECISION == "f32" else ["v", "i"]
X, y, w = [], [], []
for s, measured, params, _ in rows:
    f = dict(features(s), i=s[7] * s[8] * s[1])
    X.append([f[k] / measured for k in names])
    y.append((measured - 12 * params - sum(c * f[k] for k, c in fixed.items())) / measured)
fit = dict(zip(names, lstsq(X, y)))
print("bytes per token (L…: per layer; h, i, q, kv, v: hidden, intermediate, heads × head size, kv heads × head size, vocabulary:")
print("  " + ", ".join(f"{k} {c:.2f}" for k, c in fit.items()))
