//! `kiln bench --all-reduce`: the all-reduce that carries the gradients, timed per buffer size as
//! nccl-tests' `all_reduce_perf` reports it (algorithm and bus bandwidth), on the replicas of a
//! run placed as training places them (`--devices`, `--nnodes`, or a launcher's environment) and
//! through the same collective (`--collective`: NCCL on CUDA, kiln's TCP ring elsewhere). Every
//! result is checked: rank r sends r + 1 everywhere, so every value must come back as
//! world·(world + 1)/2. `kiln bench --all-gather` times the all-gather that hands out ZeRO-1's
//! updated weights instead, as `all_gather_perf` reports it (sizes are the gathered buffer's;
//! rank r fills its share with r + 1, and every share is checked on every rank).

use std::time::Instant;

use anyhow::{Result, bail};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use kiln::backends::ReplicaJob;
use kiln::dist::{self, NodeSpec, Reduce, Replica};
use serde_json::json;

/// The largest `--sizes` value: 16 GiB.
const MAX_SIZE: usize = 16 << 30;

/// The sizes (bytes of f32) when `--sizes` is not given: 1 MiB to 256 MiB by 4.
pub const DEFAULT_SIZES: [usize; 5] = [1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28];

/// Which collective `kiln bench` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    AllReduce,
    AllGather,
}

pub struct AllReduceJob {
    pub mode: Mode,
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
        // (nccl-tests' largest default size is 128 MiB; a buffer past memory aborted the process.)
        if let Some(size) = self.sizes.iter().find(|s| **s > MAX_SIZE) {
            bail!("--sizes: {size} bytes is more than {MAX_SIZE} (16 GiB) a buffer");
        }
        let parts: Vec<String> = self.sizes.iter().map(usize::to_string).chain([self.repeats.to_string()]).collect();
        let fingerprint = dist::fingerprint(&parts.iter().map(String::as_str).collect::<Vec<_>>());
        let mode = self.mode;
        let job = |replica: Replica, device: &B::Device| Ok((replica.rank(), measure::<B::InnerBackend>(&replica, device, mode, &self.sizes, self.repeats)?));
        let (rank, rows) = dist::launch(&devices, self.nodes.as_ref(), &fingerprint, job, job)?;
        // Rank 0 reports (another node's process ends quietly).
        if rank != 0 {
            return Ok(());
        }
        for row in &rows {
            let mode = if self.mode == Mode::AllGather { "all_gather" } else { "all_reduce" };
            println!("{}", json!({"engine": "kiln", "mode": mode, "backend": self.backend, "collective": format!("{:?}", dist::collective()).to_lowercase(), "row": row}));
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
    /// Mean seconds per call.
    seconds: f64,
    /// Bytes / seconds, in GB/s.
    algbw_gb_s: f64,
    /// What each link carries in a ring (nccl-tests' busbw): algbw · 2(world − 1)/world for the
    /// all-reduce, algbw · (world − 1)/world for the all-gather.
    busbw_gb_s: f64,
}

fn measure<B: Backend>(replica: &Replica, device: &B::Device, mode: Mode, sizes: &[usize], repeats: usize) -> kiln::Result<Vec<Row>> {
    let (world, rank) = (replica.world(), replica.rank());
    let mut rows = Vec::with_capacity(sizes.len());
    for &bytes in sizes {
        let n = bytes / 4;
        // All-gather: each rank's share of the buffer (as `Replica::shard` cuts rows).
        let parts: Vec<usize> = (0..world).map(|r| (n / world) + usize::from(r < n % world)).collect();
        let ends: Vec<usize> = parts.iter().scan(0, |end, part| Some(std::mem::replace(end, *end + part) + part)).collect();
        let mine = match mode {
            Mode::AllReduce => Tensor::<B, 1>::full([n], (rank + 1) as f32, device),
            Mode::AllGather => {
                let start: usize = parts[..rank].iter().sum();
                // The others' shares hold -1 until gathered (a share left out shows).
                let values: Vec<f32> = (0..n).map(|i| if (start..start + parts[rank]).contains(&i) { (rank + 1) as f32 } else { -1.0 }).collect();
                Tensor::from_data(burn::tensor::TensorData::new(values, [n]), device)
            }
        };
        let call = |t: Tensor<B, 1>| match mode {
            Mode::AllReduce => replica.all_reduce(t, Reduce::Sum),
            Mode::AllGather => replica.all_gather(t, &parts),
        };
        // One untimed call (a communicator is made on the first), checked, then the timed ones.
        let check = call(mine.clone())?.into_data().convert::<f32>().into_vec::<f32>().expect("f32 values");
        let expected = |i: usize| match mode {
            Mode::AllReduce => (world * (world + 1) / 2) as f32,
            Mode::AllGather => (ends.partition_point(|&end| end <= i) + 1) as f32,
        };
        if let Some(i) = (0..n).find(|&i| check[i] != expected(i)) {
            let what = if mode == Mode::AllGather { "all-gather" } else { "all-reduce" };
            return Err(kiln::Error::Distributed(format!("{what} of {bytes} bytes on rank {rank}: value {i} is {}, expected {}", check[i], expected(i))));
        }
        replica.barrier()?;
        let began = Instant::now();
        for _ in 0..repeats {
            let out = call(mine.clone())?;
            // Waits for the device (the ring and NCCL return finished results; this is for others).
            let _ = B::sync(device);
            drop(out);
        }
        let seconds = began.elapsed().as_secs_f64() / repeats as f64;
        let algbw = bytes as f64 / seconds / 1e9;
        let links = match mode {
            Mode::AllReduce => 2.0,
            Mode::AllGather => 1.0,
        } * (world as f64 - 1.0)
            / world as f64;
        rows.push(Row { bytes, world, repeats, seconds, algbw_gb_s: algbw, busbw_gb_s: algbw * links });
    }
    Ok(rows)
}
