#!/usr/bin/env python3
"""kiln against PyTorch/transformers: the parity rows of the acceptance run (scripts/gpu-check.sh).

Two steps, so that the references are made where torch runs and checked where kiln runs:

    # torch on --device: what kiln must reproduce, as one JSON file
    python3 scripts/gpu_parity.py reference --shapes full --device cuda --half bf16 --kiln KILN --models DIR --out ref.json
    # kiln on --backend, checked against it: parity.json, parity.md; exit 1 when a row fails
    python3 scripts/gpu_parity.py compare --reference ref.json --kiln KILN --backend cuda:0 --models DIR --out OUT

Both build the models of `--shapes` with `kiln init` (seeded random Qwen2 weights, HF
directories that transformers loads); `compare` checks that their bytes are the ones the
reference was made from. `small` references are committed (tests/fixtures/gpu_check/small.json,
made with `reference --shapes small --device cpu --half f16`), so `compare` needs no torch:
CI checks kiln on wgpu (lavapipe) against them. `full` is made on the GPU machine itself.

The rows, per model (head_dim 64 and 128, GQA; `full`: the 1.5B model's vocab of 151,936 and
sequences up to 4,096 tokens; every batch left-padded by kiln's engine or right-padded by its
scorer and trainer, the references computed per sequence without padding):
  logprobs   the log-prob of every token of each sequence (`kiln generate --prompt-logprobs`),
             in f32 and the half dtype, against torch in the same dtype;
  greedy     NEW_TOKENS greedy tokens after each sequence (`kiln generate --temperature 0`);
  kv-decode  the log-probs kiln's KV-cached decoding gives its greedy tokens, against one full
             forward pass of torch over prompt + tokens (while the tokens agree);
  train-step one AdamW step (`kiln step`) in f32 and the half dtype's mixed precision: loss,
             gradient norm (before clipping) and the update of the weights, at sampled
             positions of every tensor.
Tolerances: f32 is checked to fixed bounds (F32_*). In half precision torch itself differs from
its f32 run; that difference (the "noise" each row prints) is the scale: kiln's half-precision
results must be within HALF_FACTOR of it from torch's, and a greedy path may part from torch's
only where torch's own top-2 logit margin is within that rounding.
"""

import argparse
import hashlib
import json
import math
import os
import random
import struct
import subprocess
import sys

SHAPES = {
    "small": {
        "models": {
            "hd64_gqa4": dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=1, head_dim=64, intermediate_size=512,
                              vocab_size=512, tie_word_embeddings=True, initializer_range=0.1),
            "hd128_gqa2": dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=128, intermediate_size=384,
                               vocab_size=1024, tie_word_embeddings=False, initializer_range=0.1),
        },
        "lengths": [96, 70, 41, 17],
        "new_tokens": 16,
        "positions": 256,
        "samples_per_tensor": 128,
    },
    "full": {
        "models": {
            "hd64_gqa4_v151936": dict(hidden_size=768, num_attention_heads=12, num_key_value_heads=3, head_dim=64, intermediate_size=2048,
                                      vocab_size=151936, tie_word_embeddings=False, initializer_range=0.05),
            "hd128_gqa6_v151936": dict(hidden_size=1536, num_attention_heads=12, num_key_value_heads=2, head_dim=128, intermediate_size=8960,
                                       vocab_size=151936, tie_word_embeddings=True, initializer_range=0.04),
        },
        "lengths": [4096, 2900, 1500, 333],
        "new_tokens": 32,
        "positions": 4608,
        "samples_per_tensor": 1024,
    },
}
SEED = 7
LAYERS = 2
LR, WEIGHT_DECAY, MAX_GRAD_NORM = 1e-3, 0.01, 1.0
PAD = 0
F16_LOSS_SCALE = 65536.0  # torch GradScaler's initial scale, and kiln's
F32_LOGPROB_TOL = 2e-3     # max |kiln - torch| of a log-prob in f32
F32_LOSS_TOL, F32_NORM_TOL, F32_UPDATE_TOL = 1e-4, 1e-3, 0.02  # relative
F32_MARGIN_TIE = 1e-4      # an f32 greedy step whose top-2 logits are closer than this is a tie
HALF_FACTOR = 2.0
MIXED = {"bf16": "bf16-mixed", "f16": "f16-mixed"}


def config_of(spec, shapes):
    return {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "attention_dropout": 0.0,
        "num_hidden_layers": LAYERS, "max_position_embeddings": shapes["positions"], "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "use_sliding_window": False, "sliding_window": None, "max_window_layers": LAYERS,
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "use_cache": True, "torch_dtype": "float32", **spec,
    }


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def build_models(args, shapes):
    """`kiln init` of every model of `shapes` under --models: {name: (dir, sha256 of its weights)}."""
    built = {}
    for name, spec in shapes["models"].items():
        model = os.path.join(args.models, name)
        weights = os.path.join(model, "model.safetensors")
        if not os.path.exists(weights):
            config_dir = os.path.join(args.models, f"{name}-config")
            os.makedirs(config_dir, exist_ok=True)
            with open(os.path.join(config_dir, "config.json"), "w") as f:
                json.dump(config_of(spec, shapes), f, indent=1)
            run([args.kiln, "init", "--config", os.path.join(config_dir, "config.json"), "--out", model, "--seed", str(SEED)])
        built[name] = (model, sha256(weights))
    return built


def sequences_of(shapes, vocab):
    rng = random.Random(f"{SEED}:sequences:{vocab}")
    return [[rng.randrange(1, vocab) for _ in range(n)] for n in shapes["lengths"]]


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {out.returncode}): {out.stderr.strip()[-2000:]}")
    return out.stdout


# --- safetensors, read at sampled positions (no torch or numpy needed) ---------------------------

def safetensors_header(path):
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return 8 + size, header


def sample_positions(name, numel, count):
    rng = random.Random(f"{SEED}:positions:{name}")
    return sorted(rng.sample(range(numel), min(count, numel)))


def read_at(path, positions_of):
    """{tensor: [f32 values at positions_of[tensor]]} of an f32 safetensors file."""
    base, header = safetensors_header(path)
    values = {}
    with open(path, "rb") as f:
        for name, positions in positions_of.items():
            entry = header[name]
            if entry["dtype"] != "F32":
                raise SystemExit(f"{path}: {name} is {entry['dtype']}, expected F32")
            start = base + entry["data_offsets"][0]
            got = []
            for i in positions:
                f.seek(start + 4 * i)
                got.append(struct.unpack("<f", f.read(4))[0])
            values[name] = got
    return values


# --- reference: torch ----------------------------------------------------------------------------

def reference(args):
    import copy

    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    shapes = SHAPES[args.shapes]
    device = torch.device(args.device)
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 means f32 (torch's default, pinned)
    torch.backends.cudnn.allow_tf32 = False
    models = build_models(args, shapes)
    report = {"shapes": args.shapes, "half": args.half, "seed": SEED, "lr": LR, "weight_decay": WEIGHT_DECAY,
              "max_grad_norm": MAX_GRAD_NORM, "new_tokens": shapes["new_tokens"],
              "made_with": {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                            "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"},
              "models": {}}
    for name, (path, digest) in models.items():
        spec = shapes["models"][name]
        sequences = sequences_of(shapes, spec["vocab_size"])
        entry = {"sha256": digest, "sequences": sequences, "dtypes": {}, "steps": {}}
        for dtype in ["f32", args.half]:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtypes[dtype], attn_implementation="sdpa").to(device).eval()
            logprobs, greedy, margins, recomputed = [], [], [], []
            with torch.no_grad():
                for seq in sequences:
                    ids = torch.tensor([seq], device=device)
                    logits = model(ids).logits[0].float()
                    logprobs.append(F.log_softmax(logits[:-1], -1).gather(1, ids[0, 1:, None])[:, 0].tolist())
                    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=shapes["new_tokens"],
                                         min_new_tokens=shapes["new_tokens"], eos_token_id=None, pad_token_id=PAD,
                                         output_logits=True, return_dict_in_generate=True, repetition_penalty=None,
                                         temperature=None, top_p=None, top_k=None)
                    tokens = out.sequences[0, len(seq):].tolist()
                    top2 = [torch.topk(step[0].float(), 2).values for step in out.logits]
                    full = torch.tensor([seq + tokens], device=device)
                    lp = F.log_softmax(model(full).logits[0, len(seq) - 1:-1].float(), -1)
                    greedy.append(tokens)
                    margins.append([float(t[0] - t[1]) for t in top2])
                    recomputed.append(lp.gather(1, full[0, len(seq):, None])[:, 0].tolist())
            r8 = lambda rows: [[float(f"{v:.8g}") for v in row] for row in rows]  # noqa: E731 (f32 needs 8 digits)
            entry["dtypes"][dtype] = {"logprobs": r8(logprobs), "greedy": greedy, "margins": r8(margins), "recomputed": r8(recomputed)}
            del model
        master0 = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
        before = {n: p.detach().flatten().clone() for n, p in master0.named_parameters()}
        positions = {n: sample_positions(n, v.numel(), shapes["samples_per_tensor"]) for n, v in before.items()}
        entry["positions"] = positions
        width = max(len(s) for s in sequences)
        ids = torch.full((len(sequences), width), PAD, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(sequences):
            ids[i, :len(s)] = torch.tensor(s)
            mask[i, :len(s)] = 1
        ids, mask = ids.to(device), mask.to(device)

        def loss_of(model):
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            valid = mask[:, 1:].bool()
            logp = F.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
            return -(logp * valid).sum() / valid.sum()

        for precision in ["f32", MIXED[args.half]]:
            master = copy.deepcopy(master0).to(device).train()
            opt = torch.optim.AdamW(master.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WEIGHT_DECAY, foreach=False)
            if precision == "f32":
                loss = loss_of(master)
                loss.backward()
            else:
                compute = copy.deepcopy(master).to(dtypes[args.half])
                scale = F16_LOSS_SCALE if args.half == "f16" else 1.0
                loss = loss_of(compute)
                (loss * scale).backward()
                for p, c in zip(master.parameters(), compute.parameters()):
                    p.grad = c.grad.float() / scale
                del compute
            norm = torch.nn.utils.clip_grad_norm_(master.parameters(), MAX_GRAD_NORM)
            opt.step()
            update = {}
            for n, p in master.named_parameters():
                at = torch.tensor(positions[n], device=device)
                after = p.detach().flatten()[at].double().cpu()
                update[n] = [float(f"{v:.7g}") for v in (after - before[n][positions[n]].double()).tolist()]
            entry["steps"][precision] = {"loss": loss.item(), "grad_norm": float(norm), "update": update}
            del master, opt
        report["models"][name] = entry
        print(f"reference {name}: {len(sequences)} sequences, dtypes f32/{args.half}, steps f32/{MIXED[args.half]}", file=sys.stderr)
    with open(args.out, "w") as f:
        json.dump(report, f, separators=(",", ":"))
        f.write("\n")


# --- compare: kiln -------------------------------------------------------------------------------

def stats(a, b):
    diffs = [abs(x - y) for x, y in zip(a, b)]
    return (max(diffs) if diffs else 0.0), (sum(diffs) / len(diffs) if diffs else 0.0)


def flat(rows):
    return [v for row in rows for v in row]


def compare(args):
    ref = json.load(open(args.reference))
    shapes = SHAPES[ref["shapes"]]
    half = ref["half"]
    os.makedirs(args.out, exist_ok=True)
    if args.only:
        only = args.only.split(",")
        unknown = [m for m in only if m not in shapes["models"]]
        if unknown:
            raise SystemExit(f"--only {','.join(unknown)}: the {ref['shapes']} shapes' models are {', '.join(shapes['models'])}")
        shapes = dict(shapes, models={k: v for k, v in shapes["models"].items() if k in only})
    models = build_models(args, shapes)
    rows = []
    for name, (path, digest) in models.items():
        entry = ref["models"][name]
        if digest != entry["sha256"]:
            raise SystemExit(f"{name}: `kiln init --seed {SEED}` wrote other weights than the reference was made from "
                             f"(sha256 {digest[:12]}… vs {entry['sha256'][:12]}…): remake the reference with "
                             f"`python3 scripts/gpu_parity.py reference --shapes {ref['shapes']} --device cpu --half {half} ...`")
        sequences = entry["sequences"]
        prompts = os.path.join(args.out, f"{name}.prompts.jsonl")
        with open(prompts, "w") as f:
            f.writelines(json.dumps({"prompt_ids": s}) + "\n" for s in sequences)
        f32 = entry["dtypes"]["f32"]
        noise_max, noise_mean = stats(flat(entry["dtypes"][half]["logprobs"]), flat(f32["logprobs"]))
        for dtype in ["f32", half]:
            theirs = entry["dtypes"][dtype]
            out = run([args.kiln, "generate", "--model", path, "--prompts", prompts, "--backend", args.backend, "--dtype", dtype,
                       "--temperature", "0", "--max-new-tokens", str(ref["new_tokens"]), "--ignore-eos", "--json", "--prompt-logprobs"])
            samples = [json.loads(line) for line in out.splitlines() if line.strip()]
            ours_lp = [s["prompt_logprobs"][1:] for s in samples]
            worst, mean = stats(flat(ours_lp), flat(theirs["logprobs"]))
            if dtype == "f32":
                ok = worst <= F32_LOGPROB_TOL
                bound = f"max <= {F32_LOGPROB_TOL:g}"
            else:
                ok = worst <= HALF_FACTOR * noise_max and mean <= HALF_FACTOR * noise_mean
                bound = f"max <= {HALF_FACTOR * noise_max:.3g}, mean <= {HALF_FACTOR * noise_mean:.3g} ({HALF_FACTOR:g}x torch {dtype} vs f32)"
            rows.append({"row": "logprobs", "model": name, "dtype": dtype, "ok": ok, "max_abs": worst, "mean_abs": mean, "bound": bound,
                         "tokens": len(flat(ours_lp))})

            # Greedy: where kiln's path first parts from torch's, torch's top-2 margin must be a tie
            # (f32) or within the half dtype's rounding.
            tie = F32_MARGIN_TIE if dtype == "f32" else HALF_FACTOR * 2 * noise_max
            agree, parted_ok, dec_ours, dec_theirs = [], True, [], []
            for s, tokens, margins, recomputed in zip(samples, theirs["greedy"], theirs["margins"], theirs["recomputed"]):
                mine = s["token_ids"]
                same = next((i for i, (a, b) in enumerate(zip(mine, tokens)) if a != b), len(tokens))
                agree.append(same)
                if same < len(tokens) and margins[same] > tie:
                    parted_ok = False
                dec_ours += s["raw_logprobs"][:same]
                dec_theirs += recomputed[:same]
            rows.append({"row": "greedy", "model": name, "dtype": dtype, "ok": parted_ok, "agree": agree, "of": ref["new_tokens"],
                         "bound": f"part only where torch's top-2 margin <= {tie:.3g}"})
            worst, mean = stats(dec_ours, dec_theirs)
            ok = worst <= F32_LOGPROB_TOL if dtype == "f32" else worst <= HALF_FACTOR * noise_max
            rows.append({"row": "kv-decode", "model": name, "dtype": dtype, "ok": ok and len(dec_ours) > 0, "max_abs": worst, "mean_abs": mean,
                         "tokens": len(dec_ours), "bound": "f32: max <= %g" % F32_LOGPROB_TOL if dtype == "f32" else f"max <= {HALF_FACTOR * noise_max:.3g}"})

        data = os.path.join(args.out, f"{name}.train.jsonl")
        with open(data, "w") as f:
            f.writelines(json.dumps({"input_ids": s}) + "\n" for s in sequences)
        positions = entry["positions"]
        weights = os.path.join(path, "model.safetensors")
        before = read_at(weights, positions)
        steps = entry["steps"]
        t32 = steps["f32"]
        for precision in ["f32", MIXED[half]]:
            theirs = steps[precision]
            stepped = os.path.join(args.out, f"{name}.{precision}")
            if os.path.exists(stepped):
                import shutil
                shutil.rmtree(stepped)
            out = run([args.kiln, "step", "--model", path, "--data", data, "--backend", args.backend, "--precision", precision,
                       "--lr", str(ref["lr"]), "--weight-decay", str(ref["weight_decay"]), "--max-grad-norm", str(ref["max_grad_norm"]),
                       "--out", stepped, "--json"])
            record = json.loads(out.strip().splitlines()[-1])
            after = read_at(os.path.join(stepped, "model.safetensors"), positions)
            ours_update = {n: [a - b for a, b in zip(after[n], before[n])] for n in positions}
            update_error = relative_error(ours_update, theirs["update"])
            loss_error = abs(record["loss"] - theirs["loss"]) / abs(theirs["loss"])
            norm_error = abs(record["grad_norm"] - theirs["grad_norm"]) / theirs["grad_norm"]
            if precision == "f32":
                ok = loss_error <= F32_LOSS_TOL and norm_error <= F32_NORM_TOL and update_error <= F32_UPDATE_TOL
                bound = f"loss {F32_LOSS_TOL:g}, norm {F32_NORM_TOL:g}, update {F32_UPDATE_TOL:g} (relative)"
            else:
                noise = (abs(theirs["loss"] - t32["loss"]) / abs(t32["loss"]), abs(theirs["grad_norm"] - t32["grad_norm"]) / t32["grad_norm"],
                         relative_error(theirs["update"], t32["update"]))
                bounds = [HALF_FACTOR * n + 1e-4 for n in noise]
                ok = loss_error <= bounds[0] and norm_error <= bounds[1] and update_error <= bounds[2]
                bound = f"loss {bounds[0]:.2g}, norm {bounds[1]:.2g}, update {bounds[2]:.2g} ({HALF_FACTOR:g}x torch {precision} vs f32)"
            rows.append({"row": "train-step", "model": name, "dtype": precision, "ok": ok, "loss": record["loss"], "torch_loss": theirs["loss"],
                         "loss_error": loss_error, "grad_norm": record["grad_norm"], "torch_grad_norm": theirs["grad_norm"],
                         "norm_error": norm_error, "update_error": update_error, "bound": bound})
    write_report(args, ref, rows)
    sys.exit(0 if all(r["ok"] for r in rows) else 1)


def relative_error(ours, theirs):
    """||ours - theirs|| / ||theirs|| over every tensor's sampled positions."""
    num = sum((a - b) ** 2 for n in theirs for a, b in zip(ours[n], theirs[n]))
    den = sum(b ** 2 for n in theirs for b in theirs[n])
    return math.sqrt(num / den) if den else math.inf


def figures(r):
    if r["row"] in ("logprobs", "kv-decode"):
        return f"max {r['max_abs']:.2e}, mean {r['mean_abs']:.2e} over {r['tokens']} tokens"
    if r["row"] == "greedy":
        return f"agree before the first difference: {r['agree']} of {r['of']}"
    return (f"loss {r['loss']:.6f} (torch {r['torch_loss']:.6f}, {r['loss_error']:.1e}), grad norm {r['grad_norm']:.5f} "
            f"(torch {r['torch_grad_norm']:.5f}, {r['norm_error']:.1e}), update {r['update_error']:.1e}")


def write_report(args, ref, rows):
    made = ref["made_with"]
    head = (f"kiln --backend {args.backend} against torch {made['torch']} / transformers {made['transformers']} "
            f"on {made['device']} ({ref['shapes']} shapes)")
    lines = [head, "", "| row | model | dtype | figures | bound | |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['row']} | {r['model']} | {r['dtype']} | {figures(r)} | {r['bound']} | {'ok' if r['ok'] else 'FAILED'} |")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(args.out, "parity.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(args.out, "parity.json"), "w") as f:
        json.dump({"backend": args.backend, "reference": made, "shapes": ref["shapes"], "rows": rows}, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="step", required=True)
    r = sub.add_parser("reference", help="torch's results, as JSON")
    r.add_argument("--shapes", choices=sorted(SHAPES), required=True)
    r.add_argument("--device", default="cuda")
    r.add_argument("--half", choices=["bf16", "f16"], default="bf16", help="the half dtype (WGSL has no bf16: f16 for wgpu)")
    r.add_argument("--kiln", required=True, help="the kiln binary (its `init` builds the models)")
    r.add_argument("--models", required=True, help="where the models are built (kept for compare)")
    r.add_argument("--out", required=True)
    c = sub.add_parser("compare", help="kiln against a reference")
    c.add_argument("--reference", required=True)
    c.add_argument("--kiln", required=True)
    c.add_argument("--backend", default="cuda:0")
    c.add_argument("--models", required=True)
    c.add_argument("--only", help="compare these models only (comma-separated names of the shapes' models)")
    c.add_argument("--out", required=True)
    args = p.parse_args()
    os.makedirs(args.models, exist_ok=True)
    reference(args) if args.step == "reference" else compare(args)


if __name__ == "__main__":
    main()
