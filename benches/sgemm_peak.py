#!/usr/bin/env python3
"""This machine's f32 matrix-product rate through PyTorch (MKL/oneDNN), the ceiling that training
throughput is compared with in `benches/compare.sh`.

    python benches/sgemm_peak.py [--n 2048] [--threads N]

Best of `--repeats` products of two n x n f32 matrices; prints one JSON line.
"""

import argparse
import json
import os
import time

import torch


def best_seconds(f, repeats):
    """The fastest of `repeats` timed calls of `f()`, after one untimed."""
    f()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - start)
    return best


def best_mm_seconds(x, y, repeats):
    """The fastest of `repeats` timed `torch.mm(x, y)`, after one untimed."""
    return best_seconds(lambda: torch.mm(x, y), repeats)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    best = best_mm_seconds(torch.randn(a.n, a.n), torch.randn(a.n, a.n), a.repeats)
    print(json.dumps({"n": a.n, "threads": torch.get_num_threads(), "seconds": best, "gflops": 2 * a.n**3 / best / 1e9}))


if __name__ == "__main__":
    main()
