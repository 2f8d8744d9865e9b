//! What data parallelism costs per optimizer step: the all-reduce of a model's gradients
//! between two replicas, inside one process (burn-collective) and between two processes over
//! 127.0.0.1 (kiln's TCP ring), bucketed as training does.
//!
//! ```sh
//! cargo run --release --example allreduce -- tests/fixtures/interplay/qwen2_100M/config.json 5
//! ```
//!
//! Prints the gradient size, the bytes each replica sends and the median time of an
//! all-reduce. (The second process is this example started again as node 1.)
//!
//! The step time of one device against two replicas with the same global batch (the README's
//! figures), from `step_s` in `out-*/metrics.jsonl`:
//!
//! ```sh
//! kiln data interplay --ops 2-4 --per-op 1000 --seed 1 --split train --out data
//! cat > one.toml <<EOF
//! [model]
//! init = "tests/fixtures/interplay/qwen2_100M/config.json"   # absolute path
//! [data]
//! kind = "mixture"
//! root = "data"
//! ops = [2, 3, 4]
//! probs = [0.3, 0.3, 0.4]
//! tokens = 2e5
//! cutoff_len = 256
//! [train]
//! steps = 4
//! micro_batch = 8
//! [optimizer]
//! lr = 3e-4
//! [output]
//! dir = "out-one"
//! EOF
//! sed 's/micro_batch = 8/micro_batch = 4\ndevices = ["cpu", "cpu"]/; s/out-one/out-two/' one.toml > two.toml
//! kiln pretrain --config one.toml && kiln pretrain --config two.toml
//! ```

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use burn::tensor::{Tensor, TensorData};
use kiln::backends::Cpu;
use kiln::dist::{self, NodeSpec, Reduce, Replica};
use kiln::model::{Qwen2, Qwen2Config};

type Device = burn::tensor::Device<Cpu>;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let config = args.get(1).map_or("tests/fixtures/interplay/qwen2_100M/config.json", String::as_str);
    let iters: usize = args.get(2).map_or(Ok(5), |s| s.parse()).context("iterations")?;
    let model = Qwen2::<Cpu>::random(&Qwen2Config::from_file(config)?, 0, &Default::default())?;
    let gradients: Vec<Vec<f32>> = model.to_hf_tensors().into_iter().map(|(_, values)| values).collect();
    let values: usize = gradients.iter().map(Vec::len).sum();
    if let Ok(node) = std::env::var("KILN_ALLREDUCE_NODE") {
        let (node, port) = node.split_once(':').context("node:port")?;
        return across_processes(&gradients, iters, node.parse()?, port.parse()?).map(|_| ());
    }
    let bytes = values as f64 * 4.0;
    println!("{config}: {values} parameters, {:.0} MB of f32 gradients per replica and step", bytes / 1e6);
    println!("each of 2 replicas sends and receives 2·(2−1)/2 · {:.0} MB = {:.0} MB per step (ring)", bytes / 1e6, bytes / 1e6);

    let devices: Vec<Device> = vec![Default::default(); 2];
    let body = |replica: Replica, device: &Device| timed(&replica, &gradients, device, iters);
    let local = dist::launch(&devices, None, "allreduce", body, body)?;
    println!("2 replicas in one process (burn-collective, tree): median {:.3} s per all-reduce", local.as_secs_f64());

    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut peer = std::process::Command::new(std::env::current_exe()?)
        .args(&args[1..])
        .env("KILN_ALLREDUCE_NODE", format!("1:{port}"))
        .spawn()?;
    let remote = across_processes(&gradients, iters, 0, port)?;
    peer.wait()?;
    let rate = bytes / remote.as_secs_f64() / 1e9;
    println!("2 processes over 127.0.0.1 (kiln's TCP ring): median {:.3} s per all-reduce ({rate:.2} GB/s sent per node)", remote.as_secs_f64());
    Ok(())
}

fn across_processes(gradients: &[Vec<f32>], iters: usize, node: usize, port: u16) -> Result<Duration> {
    let spec = NodeSpec { nnodes: 2, node_rank: node, master: format!("127.0.0.1:{port}"), timeout: Duration::from_secs(60) };
    let devices: Vec<Device> = vec![Default::default()];
    let body = |replica: Replica, device: &Device| timed(&replica, gradients, device, iters);
    Ok(dist::launch(&devices, Some(&spec), "allreduce", body, body)?)
}

/// The median time of `iters` all-reduces of `gradients` (after one warm-up).
fn timed(replica: &Replica, gradients: &[Vec<f32>], device: &Device, iters: usize) -> kiln::Result<Duration> {
    let mut times = Vec::new();
    for i in 0..=iters {
        let tensors: Vec<Tensor<Cpu, 1>> = gradients.iter().map(|g| Tensor::from_data(TensorData::new(g.clone(), [g.len()]), device)).collect();
        replica.barrier()?;
        let began = Instant::now();
        let reduced = replica.all_reduce_many(tensors, Reduce::Mean)?;
        let _ = reduced.last().map(|t| t.clone().slice(0..1).into_data());
        if i > 0 {
            times.push(began.elapsed());
        }
    }
    times.sort();
    Ok(times[times.len() / 2])
}
