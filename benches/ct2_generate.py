#!/usr/bin/env python3
"""CTranslate2's CPU generation throughput, measured exactly as `kiln bench` measures kiln.

Two steps, which `benches/compare.sh` runs for you:

    # 1. a random-weights Qwen2 model directory that kiln, transformers and the converter all read
    python benches/ct2_generate.py --make-hf DIR --config tests/fixtures/interplay/qwen2_100M/config.json
    ct2-transformers-converter --model DIR --output_dir DIR.ct2 --quantization float32
    # 2. the figures (compare with `kiln bench --model DIR --batch B`)
    python benches/ct2_generate.py --model DIR.ct2 --batch 8

`--make-hf` initialises the model as transformers does (seed 0), saves it in f32 safetensors and
gives it a word-level tokenizer of exactly `vocab_size` tokens (`t0`, `t1`, ...), so that the
converter's vocabulary has one entry per embedding row whatever the config.

The measurement: random prompts of `--prompt-len` token ids (seed 0), batch `--batch`,
`Generator.generate_batch(..., sampling_topk=1, max_length=N, min_length=N,
include_prompt_in_result=False)` (greedy; `min_length` keeps the end token out, so every row has
exactly N new tokens, which is checked). The prompt is forwarded at once (include_prompt_in_result
False), as kiln's and transformers' prefill. Prefill time is a run with N = 1; decode throughput is
`batch * (new_tokens - 1)` tokens over the N = new_tokens run minus the prefill time. Best of
`--repeats` after a warm-up; one JSON line with the same keys as `kiln bench`.
"""

import argparse
import json
import os
import random
import time


def make_hf(out, config_path, seed):
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(config_path)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    model.config.torch_dtype = torch.float32
    model.save_pretrained(out, safe_serialization=True)
    vocab = {f"t{i}": i for i in range(config.vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    eos = config.eos_token_id if isinstance(config.eos_token_id, int) else 0
    bos = config.bos_token_id if isinstance(config.bos_token_id, int) else eos
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token=f"t{eos}", bos_token=f"t{bos}",
                            pad_token=f"t{eos}").save_pretrained(out)
    print(json.dumps({"hf_model": out, "parameters": sum(p.numel() for p in model.parameters())}))


def vocabulary(model_dir):
    for name in ("vocabulary.json", "vocabulary.txt"):
        path = os.path.join(model_dir, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                return json.load(f) if name.endswith(".json") else [line.rstrip("\n") for line in f]
    raise SystemExit(f"ct2_generate.py: no vocabulary.json/.txt in {model_dir} (not a CTranslate2 model?)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--make-hf", metavar="DIR", help="write a random-weights HF model directory from --config and stop")
    p.add_argument("--config", help="config.json for --make-hf")
    p.add_argument("--model", help="a CTranslate2 model directory (ct2-transformers-converter's output)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="CTranslate2 intra_threads (default: all cores)")
    p.add_argument("--compute-type", default="float32")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.make_hf:
        if not a.config:
            p.error("--make-hf needs --config")
        return make_hf(a.make_hf, a.config, a.seed)
    if not a.model:
        p.error("--model (a CTranslate2 model directory) or --make-hf DIR is required")

    import ctranslate2

    generator = ctranslate2.Generator(a.model, device="cpu", compute_type=a.compute_type,
                                      intra_threads=a.threads, inter_threads=1)
    vocab = vocabulary(a.model)
    rng = random.Random(a.seed)
    prompts = [[vocab[rng.randrange(len(vocab))] for _ in range(a.prompt_len)] for _ in range(a.batch)]

    def run(new_tokens):
        start = time.perf_counter()
        results = generator.generate_batch(prompts, max_batch_size=a.batch, sampling_topk=1,
                                           max_length=new_tokens, min_length=new_tokens,
                                           include_prompt_in_result=False)
        elapsed = time.perf_counter() - start
        lengths = {len(r.sequences_ids[0]) for r in results}
        assert lengths == {new_tokens}, f"CTranslate2 generated {sorted(lengths)} tokens per row, not {new_tokens}"
        return elapsed

    run(a.new_tokens)  # warm-up
    prefill = min(run(1) for _ in range(a.repeats))
    total = min(run(a.new_tokens) for _ in range(a.repeats))
    decoded = a.batch * (a.new_tokens - 1)
    print(json.dumps({
        "engine": f"ctranslate2 {ctranslate2.__version__}",
        "backend": f"cpu ({a.threads} intra threads, 1 inter thread)",
        "threads": a.threads, "compute_type": generator.compute_type,
        "batch": a.batch, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens,
        "prefill_s": prefill, "total_s": total,
        "prefill_tokens_per_s": a.batch * a.prompt_len / prefill,
        "decode_tokens_per_s": decoded / (total - prefill),
        "end_to_end_tokens_per_s": a.batch * a.new_tokens / total,
    }))


if __name__ == "__main__":
    main()
