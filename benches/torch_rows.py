#!/usr/bin/env python3
"""Several PyTorch/transformers benchmarks in one process (one import of torch, one CUDA context):
the torch columns of `scripts/gpu-check.sh`.

    python3 benches/torch_rows.py --device cuda --rows rows.json --out DIR

`rows.json` is a list of `{"name", "kind": "generate"|"train", "config", "batch", ...}`:
generation rows take `prompt_len`, `new_tokens`, `dtype` (f32|bf16|f16) and `repeats`
(hf_generate_baseline.measure), training rows `seq`, `steps`, `autocast` (none|bf16)
(torch_train_step.measure). Each row's figures go to DIR/<name>.torch.json; a row that fails
(out of memory, say) writes `{"error": ...}` there and the others still run. Rows are run until
`--seconds` have passed; the rest are skipped (written as errors).
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_generate_baseline  # noqa: E402
import torch  # noqa: E402
import torch_train_step  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--rows", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=float, default=float("inf"), help="start no row after this many seconds")
    a = p.parse_args()
    start = time.time()
    for row in json.load(open(a.rows)):
        path = os.path.join(a.out, f"{row['name']}.torch.json")
        if time.time() - start > a.seconds:
            figures = {"error": f"skipped: the {a.seconds:.0f} s for the torch rows were spent"}
        else:
            try:
                if row["kind"] == "generate":
                    figures = hf_generate_baseline.measure(row["config"], row["batch"], row["prompt_len"], row["new_tokens"],
                                                           row.get("repeats", 1), a.device, row.get("dtype", "f32"))
                else:
                    figures = torch_train_step.measure(row["config"], row["batch"], row["seq"], row.get("steps", 2), row.get("warmup", 1),
                                                       a.device, row.get("autocast", "none"))
            except Exception as err:  # noqa: BLE001 (a row's failure is its figure)
                figures = {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
            if a.device.startswith("cuda"):
                torch.cuda.empty_cache()
        print(row["name"], json.dumps(figures), flush=True)
        with open(path, "w") as f:
            json.dump(figures, f)


if __name__ == "__main__":
    main()
