#!/usr/bin/env python3
"""PyTorch/transformers training-step throughput, measured as `kiln bench --train` measures kiln.

    python benches/torch_train_step.py --config tests/fixtures/interplay/qwen2_100M/config.json

Random token batches of `--batch` × `--seq`, causal-LM loss on every token, AdamW (lr 1e-4,
weight decay 0.1, HF decay groups), gradient clipping at 1.0, f32, PyTorch eager mode (no
torch.compile). The thread count (`--threads`, default: all cores) and the attention
implementation (`--attn`, default `sdpa`, transformers' own default and PyTorch's fastest on CPU;
`eager` is the plain matmul-softmax one) are pinned and printed with the figures.
`--autocast bf16` runs the forward pass (and so its backward) under
`torch.autocast("cpu", torch.bfloat16)`, weights and AdamW state staying f32: PyTorch's
counterpart of `kiln bench --train --precision bf16-mixed`.
Reports the median step time over `--steps` steps after `--warmup` and tokens/s.
"""

import argparse
import contextlib
import json
import os
import statistics
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch intra-op threads (default: all cores)")
    p.add_argument("--attn", choices=["sdpa", "eager"],
                   help="transformers attention implementation (default: sdpa, eager where torch lacks sdpa)")
    p.add_argument("--autocast", default="none", choices=["none", "bf16"],
                   help="forward under torch.autocast('cpu', torch.bfloat16); weights stay f32")
    a = p.parse_args()
    if a.attn is None:
        a.attn = "sdpa" if hasattr(torch.nn.functional, "scaled_dot_product_attention") else "eager"
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    config = Qwen2Config.from_pretrained(a.config)
    config._attn_implementation = a.attn
    model = Qwen2ForCausalLM(config).to(torch.float32).train()
    no_decay = [n for n, _ in model.named_parameters() if any(k in n.lower() for k in ("bias", "layernorm", "rmsnorm"))]
    groups = [{"params": [p for n, p in model.named_parameters() if n not in no_decay], "weight_decay": 0.1},
              {"params": [p for n, p in model.named_parameters() if n in no_decay], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=1e-4)
    if a.autocast == "bf16":
        autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    else:
        autocast = contextlib.nullcontext
    times = []
    for step in range(a.warmup + a.steps):
        ids = torch.randint(0, config.vocab_size, (a.batch, a.seq))
        start = time.perf_counter()
        with autocast():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        if step >= a.warmup:
            times.append(elapsed)
    median = statistics.median(times)
    print(json.dumps({
        "engine": f"transformers {__import__('transformers').__version__} / torch {torch.__version__}",
        "threads": torch.get_num_threads(), "attn": model.config._attn_implementation,
        "precision": "f32" if a.autocast == "none" else "autocast-bf16",
        "batch": a.batch, "seq": a.seq, "step_s": median,
        "tokens_per_s": a.batch * a.seq / median,
    }))


if __name__ == "__main__":
    main()
