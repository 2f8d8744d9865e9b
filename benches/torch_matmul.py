#!/usr/bin/env python3
"""torch.mm at the shapes of one training step, laid out as the step's products are: the
PyTorch side of `kiln bench --matmul` (same config, same shapes, same JSON keys).

    python benches/torch_matmul.py --config config.json [--batch 8 --seq 256] [--repeats 3]

Every projection appears three times: forward x @ W, dx = dy @ W^T and dW = x^T @ dy, with x
[batch*seq, in]; transposed operands are views (no copy), as in autograd. Best of --repeats after
one warm-up; the last line weighs the shapes by how often a step runs them.
"""

import argparse
import json
import os

import torch

from sgemm_peak import best_mm_seconds


def shapes(c, rows):
    h, ff = c["hidden_size"], c["intermediate_size"]
    heads = c["num_attention_heads"]
    head_dim = c.get("head_dim") or h // heads
    kv = c.get("num_key_value_heads") or heads
    layers = c["num_hidden_layers"]
    projections = [("q", h, heads * head_dim, layers), ("k+v", h, kv * head_dim, 2 * layers),
                   ("o", heads * head_dim, h, layers), ("gate+up", h, ff, 2 * layers),
                   ("down", ff, h, layers), ("head", h, c["vocab_size"], 1)]
    for name, i, o, count in projections:
        yield f"{name} forward", rows, i, o, False, False, count
        yield f"{name} dx", rows, o, i, False, True, count
        yield f"{name} dW", i, rows, o, True, False, count


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    config = json.load(open(a.config))
    total_s, total_flop = 0.0, 0.0
    for name, m, k, n, a_t, b_t, count in shapes(config, a.batch * a.seq):
        x = torch.randn(k, m).t() if a_t else torch.randn(m, k)
        w = torch.randn(n, k).t() if b_t else torch.randn(k, n)
        best = best_mm_seconds(x, w, a.repeats)
        flop = 2.0 * m * k * n
        print(json.dumps({"engine": "torch", "mode": "matmul", "shape": name, "m": m, "k": k, "n": n,
                          "a_transposed": a_t, "b_transposed": b_t, "per_step": count,
                          "gflops": flop / best / 1e9}))
        total_s += best * count
        total_flop += flop * count
    print(json.dumps({"engine": "torch", "mode": "matmul", "shape": "step", "rows": a.batch * a.seq,
                      "threads": torch.get_num_threads(), "torch": torch.__version__,
                      "s": total_s, "gflops": total_flop / total_s / 1e9}))


if __name__ == "__main__":
    main()
