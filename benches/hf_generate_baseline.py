#!/usr/bin/env python3
"""transformers' CPU generation throughput, measured exactly as `kiln bench` measures kiln.

    python benches/hf_generate_baseline.py --config tests/fixtures/interplay/qwen2_100M/config.json

Random prompts of `--prompt-len` tokens, batch `--batch`, greedy, EOS disabled, f32. Prefill time
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
    a = p.parse_args()
    if a.attn is None:
        a.attn = "sdpa" if hasattr(torch.nn.functional, "scaled_dot_product_attention") else "eager"
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    config = Qwen2Config.from_pretrained(a.config)
    config._attn_implementation = a.attn
    model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    prompts = torch.randint(0, config.vocab_size, (a.batch, a.prompt_len))
    mask = torch.ones_like(prompts)

    def run(new_tokens):
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompts, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0)
        assert out.shape[1] == a.prompt_len + new_tokens
        return time.perf_counter() - start

    run(a.new_tokens)  # warm-up
    prefill = min(run(1) for _ in range(a.repeats))
    total = min(run(a.new_tokens) for _ in range(a.repeats))
    decoded = a.batch * (a.new_tokens - 1)
    print(json.dumps({
        "engine": f"transformers {__import__('transformers').__version__} / torch {torch.__version__}",
        "backend": f"cpu ({torch.get_num_threads()} threads)",
        "threads": torch.get_num_threads(), "attn": a.attn,
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch": a.batch, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens,
        "prefill_s": prefill, "total_s": total,
        "prefill_tokens_per_s": a.batch * a.prompt_len / prefill,
        "decode_tokens_per_s": decoded / (total - prefill),
        "end_to_end_tokens_per_s": a.batch * a.new_tokens / total,
    }))


if __name__ == "__main__":
    main()
