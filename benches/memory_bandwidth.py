#!/usr/bin/env python3
"""This machine's memory read bandwidth through PyTorch, the ceiling that decoding's weight
throughput is compared with in `benches/compare.sh` (decoding reads every weight once a step).

    python benches/memory_bandwidth.py [--mib 1024] [--threads N]

Best of `--repeats` `torch.sum` over an f32 tensor of `--mib` MiB (far larger than the caches by
default); prints one JSON line.
"""

import argparse
import json
import os

import torch

from sgemm_peak import best_seconds


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    x = torch.ones(a.mib * 2**20 // 4)
    best = best_seconds(x.sum, a.repeats)
    print(json.dumps({"mib": a.mib, "threads": torch.get_num_threads(), "seconds": best, "read_gb_per_s": a.mib * 2**20 / best / 1e9}))


if __name__ == "__main__":
    main()
