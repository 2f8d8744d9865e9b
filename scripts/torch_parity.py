#!/usr/bin/env python3
"""kiln against PyTorch/transformers on the same device, computed there and then (the GPU
acceptance run's parity rows, `scripts/gpu-check.sh`; runs on the CPU too).

For each reference model of tests/fixtures/hf and each dtype (f32, bf16), transformers on
`--device` computes
  - the next-token log-probs of the fixture's sequences (teacher forcing), and
  - 32 greedy tokens after each sequence (`generate(do_sample=False)`),
and `kiln logprobs` / `kiln generate --temperature 0` compute the same on `--backend`. Reported per
row: the largest |log-prob difference| and the greedy tokens that agree before the first
difference (bf16 greedy paths may part where two logits are within bf16's rounding; the row says
where). f32 rows must agree: log-probs within 1e-3 and every greedy token, else the exit code is 1.

    python3 scripts/torch_parity.py --kiln target/release/kiln --device cuda --backend cuda:0 --out DIR
    python3 scripts/torch_parity.py --kiln target/release/kiln --device cpu --backend cpu --out DIR
    python3 scripts/torch_parity.py --kiln target/release/kiln --device cpu --backend wgpu --dtypes f32,f16 --out DIR

Writes DIR/torch_parity.json and DIR/torch_parity.md.
"""

import argparse
import json
import os
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM

MODELS = ["tied_gqa2", "untied_mha", "gqa3_headdim_bf16_sharded"]
NEW_TOKENS = 32
F32_LOGPROB_TOL = 1e-3


def kiln(args, cmd):
    out = subprocess.run([args.kiln, *cmd, "--backend", args.backend, "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"kiln {' '.join(cmd)} failed: {out.stderr.strip()}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def compare(args, name, dtype):
    path = os.path.join(args.fixtures, name)
    sequences = json.load(open(os.path.join(path, "expected.json")))["sequences"]
    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(args.device).eval()
    # kiln's greedy tokens for all the sequences in one batched call (left-padded).
    prompts = os.path.join(args.out, f"prompts_{name}.jsonl")
    with open(prompts, "w") as f:
        f.writelines(json.dumps({"prompt_ids": seq}) + "\n" for seq in sequences)
    kiln_greedy = [r["token_ids"] for r in kiln(args, ["generate", "--model", path, "--prompts", prompts, "--temperature", "0",
                                                      "--max-new-tokens", str(NEW_TOKENS), "--ignore-eos", "--dtype", dtype])]
    worst, agree, compared = 0.0, [], 0
    for seq, mine in zip(sequences, kiln_greedy):
        ids = torch.tensor([seq], device=args.device)
        with torch.no_grad():
            logits = model(ids).logits.float()
            ref = torch.log_softmax(logits[0, :-1], dim=-1).gather(1, ids[0, 1:, None])[:, 0].cpu()
            greedy = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, min_new_tokens=NEW_TOKENS,
                                    pad_token_id=0, eos_token_id=None)[0, len(seq):].tolist()
        got = kiln(args, ["logprobs", "--model", path, "--ids", ",".join(map(str, seq)), "--dtype", dtype])[0]["logprobs"][1:]
        worst = max(worst, (torch.tensor(got) - ref).abs().max().item())
        same = next((i for i, (a, b) in enumerate(zip(mine, greedy)) if a != b), len(greedy))
        agree.append(same)
        compared += len(greedy)
    ok = dtype != "f32" or (worst <= F32_LOGPROB_TOL and all(a == NEW_TOKENS for a in agree))
    return {"model": name, "dtype": dtype, "max_abs_logprob_diff": worst, "greedy_agree_before_first_difference": agree,
            "greedy_tokens": compared, "ok": ok}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kiln", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--backend", default="cuda:0")
    p.add_argument("--fixtures", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "hf"))
    p.add_argument("--dtypes", default="f32,bf16", help="comma-separated: f32, bf16, f16 (wgpu has no bf16)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    rows = [compare(args, name, dtype) for name in MODELS for dtype in args.dtypes.split(",")]
    device_name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    lines = [f"| model | dtype | max abs log-prob diff | greedy tokens agreeing before the first difference (of {NEW_TOKENS} per prompt) | |",
             "|---|---|---:|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['dtype']} | {r['max_abs_logprob_diff']:.2e} | {r['greedy_agree_before_first_difference']} "
                     f"| {'ok' if r['ok'] else 'FAILED'} |")
    table = "\n".join(lines)
    print(f"kiln --backend {args.backend} against torch {torch.__version__} on {device_name}")
    print(table)
    open(os.path.join(args.out, "torch_parity.md"), "w").write(table + "\n")
    json.dump({"device": device_name, "torch": torch.__version__, "backend": args.backend, "rows": rows},
              open(os.path.join(args.out, "torch_parity.json"), "w"), indent=1)
    sys.exit(0 if all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()
