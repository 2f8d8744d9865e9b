#!/usr/bin/env python3
"""transformers' generation throughput, measured exactly as `kiln bench` measures kiln.

    python benches/hf_generate_baseline.py --config tests/fixtures/interplay/qwen2_100M/config.json

Random prompts of `--prompt-len` tokens, batch `--batch`, greedy, EOS disabled, in `--dtype` (f32)
on `--device` (cpu; `cuda` synchronises around each timing and reports the allocator's peak). Prefill time
is `generate(max_new_tokens=1)`; decode throughput is `batch * (new_tokens - 1)` tokens over
`generate(max_new_tokens=new_tokens)` minus the prefill time. Best of `--repeats` after a warm-up.
Prints one JSON line with the same keys as `kiln bench`.
"""

import argparse
import json
import os
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(config_path, batch, prompt_len, new_tokens, repeats=3, device="cpu", dtype="f32", attn=None):
    """The figures of one generation benchmark (the keys of `kiln bench`'s JSON line)."""
    device = torch.device(device)
    attn = attn or ("sdpa" if hasattr(torch.nn.functional, "scaled_dot_product_attention") else "eager")
    torch.manual_seed(0)
    config = Qwen2Config.from_pretrained(config_path)
    config._attn_implementation = attn
    model = Qwen2ForCausalLM(config).to(DTYPES[dtype]).to(device).eval()
    prompts = torch.randint(0, config.vocab_size, (batch, prompt_len), device=device)
    mask = torch.ones_like(prompts)

    def run(new):
        sync(device)
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompts, attention_mask=mask, do_sample=False, max_new_tokens=new,
                                 min_new_tokens=new, eos_token_id=None, pad_token_id=0)
        sync(device)
        assert out.shape[1] == prompt_len + new
        return time.perf_counter() - start

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    run(new_tokens)  # warm-up
    prefill = min(run(1) for _ in range(repeats))
    total = min(run(new_tokens) for _ in range(repeats))
    decoded = batch * (new_tokens - 1)
    return {
        "engine": f"transformers {__import__('transformers').__version__} / torch {torch.__version__}",
        "backend": f"cpu ({torch.get_num_threads()} threads)" if device.type == "cpu" else torch.cuda.get_device_name(device),
        "threads": torch.get_num_threads(), "attn": attn, "dtype": dtype,
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens,
        "prefill_s": prefill, "total_s": total,
        "prefill_tokens_per_s": batch * prompt_len / prefill,
        "decode_tokens_per_s": decoded / (total - prefill),
        "end_to_end_tokens_per_s": batch * new_tokens / total,
        "peak_memory_bytes": torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None,
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch intra-op threads (default: all cores)")
    p.add_argument("--attn", choices=["sdpa", "eager"],
                   help="transformers attention implementation (default: sdpa, eager where torch lacks sdpa)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--dtype", default="f32", choices=sorted(DTYPES), help="weights and activations")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    print(json.dumps(measure(a.config, a.batch, a.prompt_len, a.new_tokens, a.repeats, a.device, a.dtype, a.attn)))


if __name__ == "__main__":
    main()
