#!/usr/bin/env python3
"""PyTorch/transformers training-step throughput, measured as `kiln bench --train` measures kiln.

    python benches/torch_train_step.py --config tests/fixtures/interplay/qwen2_100M/config.json

Random token batches of `--batch` × `--seq`, causal-LM loss on every token, AdamW (lr 1e-4,
weight decay 0.1, HF decay groups), gradient clipping at 1.0, f32, PyTorch eager mode (no
torch.compile). The thread count (`--threads`, default: all cores) and the attention
implementation (`--attn`, default `sdpa`, transformers' own default and PyTorch's fastest on CPU;
`eager` is the plain matmul-softmax one) are pinned and printed with the figures.
`--autocast bf16` runs the forward pass (and so its backward) under
`torch.autocast(<device>, torch.bfloat16)`, weights and AdamW state staying f32: PyTorch's
counterpart of `kiln bench --train --precision bf16-mixed`.
Reports the median step time over `--steps` steps after `--warmup` and tokens/s; `--device cuda`
waits for each step and reports the allocator's peak.
"""

import argparse
import contextlib
import json
import os
import statistics
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def measure(config_path, batch, seq, steps=10, warmup=2, device="cpu", autocast="none", attn=None):
    """The figures of one training-step benchmark (the keys of `kiln bench --train`'s JSON line)."""
    device = torch.device(device)
    attn = attn or ("sdpa" if hasattr(torch.nn.functional, "scaled_dot_product_attention") else "eager")
    torch.manual_seed(0)
    config = Qwen2Config.from_pretrained(config_path)
    config._attn_implementation = attn
    model = Qwen2ForCausalLM(config).to(torch.float32).to(device).train()
    no_decay = [n for n, _ in model.named_parameters() if any(k in n.lower() for k in ("bias", "layernorm", "rmsnorm"))]
    groups = [{"params": [p for n, p in model.named_parameters() if n not in no_decay], "weight_decay": 0.1},
              {"params": [p for n, p in model.named_parameters() if n in no_decay], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=1e-4)
    if autocast == "bf16":
        context = lambda: torch.autocast(device.type, dtype=torch.bfloat16)  # noqa: E731
    else:
        context = contextlib.nullcontext
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for step in range(warmup + steps):
        ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        with context():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # waits for the step
        elapsed = time.perf_counter() - start
        if step >= warmup:
            times.append(elapsed)
    median = statistics.median(times)
    return {
        "engine": f"transformers {__import__('transformers').__version__} / torch {torch.__version__}",
        "backend": f"cpu ({torch.get_num_threads()} threads)" if device.type == "cpu" else torch.cuda.get_device_name(device),
        "threads": torch.get_num_threads(), "attn": model.config._attn_implementation,
        "precision": "f32" if autocast == "none" else "autocast-bf16",
        "batch": batch, "seq": seq, "step_s": median,
        "tokens_per_s": batch * seq / median,
        "peak_memory_bytes": torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None,
    }


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
                   help="forward under torch.autocast(<device>, torch.bfloat16); weights stay f32")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    print(json.dumps(measure(a.config, a.batch, a.seq, a.steps, a.warmup, a.device, a.autocast, a.attn)))


if __name__ == "__main__":
    main()
