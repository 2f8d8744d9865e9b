"""torch.distributed's all-reduce timed as `kiln bench --all-reduce` times kiln's: per buffer size
(f32), rank r sends r + 1, the sum is checked, then the mean of --repeats calls; algbw and
busbw as nccl-tests reports them. NCCL on CUDA, gloo on the CPU. With --all-gather,
`all_gather_into_tensor` as `kiln bench --all-gather` times kiln's (sizes are the gathered
buffer's; rank r's share holds r + 1, checked). Start it as torch starts any job
(scripts/multi-gpu-check.sh does):

    torchrun --nproc-per-node 2 benches/torch_all_reduce.py --sizes 1048576,16777216 --repeats 20
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1048576,4194304,16777216,67108864,268435456")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--all-gather", action="store_true")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    expected = world * (world + 1) / 2
    for size in (int(s) for s in args.sizes.split(",")):
        if args.all_gather:
            # Equal shares (all_gather_into_tensor takes one length): the buffer rounded down to
            # them (the row keeps the size asked for, as kiln's does, and times what was sent).
            share = size // 4 // world
            sent = share * world * 4
            x = torch.full((share,), float(rank + 1), device=device)
            y = torch.empty(share * world, device=device)
            call = lambda: dist.all_gather_into_tensor(y, x)
            want = torch.arange(1, world + 1, device=device, dtype=torch.float32).repeat_interleave(share)
        else:
            sent = size
            x = torch.full((size // 4,), float(rank + 1), device=device)
            y = x.clone()
            call = lambda: dist.all_reduce(y)  # in place (the values grow; the time does not depend on them)
            want = torch.full_like(x, expected)
        call()
        sync()
        if not bool((y == want).all()):
            raise SystemExit(f"{'all-gather' if args.all_gather else 'all-reduce'} of {size} bytes on rank {rank}: wrong values")
        dist.barrier()
        began = time.perf_counter()
        for _ in range(args.repeats):
            call()
        sync()
        seconds = (time.perf_counter() - began) / args.repeats
        algbw = sent / seconds / 1e9
        links = (1 if args.all_gather else 2) * (world - 1) / world
        if rank == 0:
            row = {"bytes": size, "world": world, "repeats": args.repeats, "seconds": seconds, "algbw_gb_s": algbw, "busbw_gb_s": algbw * links}
            mode = "all_gather" if args.all_gather else "all_reduce"
            print(json.dumps({"engine": "torch", "mode": mode, "backend": "nccl" if cuda else "gloo", "row": row}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
