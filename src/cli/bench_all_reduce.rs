//! `kiln bench --all-reduce`: the all-reduce that carries the gradients, timed per buffer size as
//! nccl-tests' `all_reduce_perf` reports it (algorithm and bus bandwidth), on the replicas of a
//! run placed as training places them (`--devices`, `--nnodes`, or a launcher's environment) and
//! through the same collective (`--collective`: NCCL on CUDA, kiln's TCP ring elsewhere). Every
//! result is checked: rank r sends r + 1 everywhere, so every value must come back as
//! world·(world + 1)/2.

use std::time::Instant;

use anyhow::{Result, bail};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use kiln::backends::ReplicaJob;
use kiln::dist::{self, NodeSpec, Reduce, Replica};
use serde_json::json;

/// The sizes (bytes of f32) when `--sizes` is not given: 1 MiB to 256 MiB by 4.
pub const DEFAULT_SIZES: [usize; 5] = [1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28];

pub struct AllReduceJob {
    pub sizes: Vec<usize>,
    pub repeats: usize,
    pub nodes: Option<NodeSpec>,
    pub backend: String,
}

impl ReplicaJob for AllReduceJob {
    type Output = Result<()>;

    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Result<()> {
        if let Some(size) = self.sizes.iter().find(|s| **s < 4 || **s % 4 != 0) {
            bail!("--sizes: {size} is not a whole number of f32 values (a multiple of 4 bytes)");
        }
        let parts: Vec<String> = self.sizes.iter().map(usize::to_string).chain([self.repeats.to_string()]).collect();
        let fingerprint = dist::fingerprint(&parts.iter().map(String::as_str).collect::<Vec<_>>());
        let job = |replica: Replica, device: &B::Device| Ok((replica.rank(), measure::<B::InnerBackend>(&replica, device, &self.sizes, self.repeats)?));
        let (rank, rows) = dist::launch(&devices, self.nodes.as_ref(), &fingerprint, job, job)?;
        // Rank 0 reports (another node's process ends quietly).
        if rank != 0 {
            return Ok(());
        }
        for row in &rows {
            println!("{}", json!({"engine": "kiln", "mode": "all_reduce", "backend": self.backend, "collective": format!("{:?}", dist::collective()).to_lowercase(), "row": row}));
        }
        eprintln!("{:>12} {:>8} {:>10} {:>10} {:>10}  (world {})", "bytes", "repeats", "time us", "algbw GB/s", "busbw GB/s", rows.first().map_or(0, |r| r.world));
        for r in &rows {
            eprintln!("{:>12} {:>8} {:>10.1} {:>10.2} {:>10.2}", r.bytes, r.repeats, r.seconds * 1e6, r.algbw_gb_s, r.busbw_gb_s);
        }
        Ok(())
    }
}

/// One size's figures (rank 0's timing; every rank's result checked).
#[derive(Debug, serde::Serialize)]
pub struct Row {
    bytes: usize,
    world: usize,
    repeats: usize,
    /// Mean seconds per all-reduce.
    seconds: f64,
    /// Bytes / seconds, in GB/s.
    algbw_gb_s: f64,
    /// algbw · 2(world − 1)/world: what each link carries in a ring (nccl-tests' busbw).
    busbw_gb_s: f64,
}

fn measure<B: Backend>(replica: &Replica, device: &B::Device, sizes: &[usize], repeats: usize) -> kiln::Result<Vec<Row>> {
    let world = replica.world();
    let expected = (world * (world + 1) / 2) as f32;
    let mut rows = Vec::with_capacity(sizes.len());
    for &bytes in sizes {
        let n = bytes / 4;
        let mine = Tensor::<B, 1>::full([n], (replica.rank() + 1) as f32, device);
        // One untimed call (a communicator is made on the first), then the timed ones.
        let check = replica.all_reduce(mine.clone(), Reduce::Sum)?;
        let (low, high) = (check.clone().min().into_scalar(), check.max().into_scalar());
        let (low, high): (f32, f32) = (num(low), num(high));
        if low != expected || high != expected {
            return Err(kiln::Error::Distributed(format!("all-reduce of {bytes} bytes on rank {}: values {low}..{high}, expected {expected}", replica.rank())));
        }
        replica.barrier()?;
        let began = Instant::now();
        for _ in 0..repeats {
            let out = replica.all_reduce(mine.clone(), Reduce::Sum)?;
            // Waits for the device (the ring and NCCL return finished sums; this is for others).
            let _ = B::sync(device);
            drop(out);
        }
        let seconds = began.elapsed().as_secs_f64() / repeats as f64;
        let algbw = bytes as f64 / seconds / 1e9;
        rows.push(Row { bytes, world, repeats, seconds, algbw_gb_s: algbw, busbw_gb_s: algbw * 2.0 * (world as f64 - 1.0) / world as f64 });
    }
    Ok(rows)
}

fn num<E: burn::tensor::ElementConversion>(value: E) -> f32 {
    value.elem::<f32>()
}
