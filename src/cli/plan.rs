//! `kiln plan`: memory by part and FLOPs of a training step and of generation, from a model's
//! config.json alone (see `kiln_core::plan` for what is counted).

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use kiln::model::Qwen2Config;
use kiln::plan::{PlanRequest, plan};
use kiln::train::Precision;

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The model's config.json.
    #[arg(long)]
    config: PathBuf,
    /// Sequences per micro-batch (training) or decoded together (generation), over all devices.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Tokens per sequence (generation: prompt plus new tokens).
    #[arg(long)]
    seq: usize,
    /// f32, bf16-mixed, f16-mixed or bf16-pure (generation runs in its compute dtype).
    #[arg(long, default_value = "f32")]
    precision: Precision,
    /// Data-parallel devices, each holding the whole model.
    #[arg(long, default_value_t = 1)]
    devices: usize,
    /// Plan with `[train] recompute = true`.
    #[arg(long)]
    recompute: bool,
    /// The backend the job runs on: `cpu` counts the activations of its fused f32 kernels;
    /// `cuda` those of kiln's CubeCL kernels (flash attention, RoPE) and plain operations;
    /// `wgpu` attention in chunks (its flash attention declines long rows, see README).
    #[arg(long, default_value = "cuda")]
    backend: String,
    /// Print the plan as one JSON object (bytes).
    #[arg(long)]
    json: bool,
}

pub fn run(args: PlanArgs) -> Result<()> {
    let config = Qwen2Config::from_file(&args.config)?;
    if args.batch == 0 || args.seq == 0 || args.devices == 0 {
        anyhow::bail!("--batch, --seq and --devices must be positive");
    }
    let Ok(backend) = args.backend.parse::<kiln::backends::DeviceSpec>() else {
        anyhow::bail!("--backend {:?}: expected cpu, cuda or wgpu", args.backend);
    };
    if args.seq > config.max_position_embeddings {
        anyhow::bail!("--seq {} is more than the model's context (max_position_embeddings {})", args.seq, config.max_position_embeddings);
    }
    if args.batch.checked_mul(args.seq).is_none_or(|tokens| tokens > 1 << 32) {
        anyhow::bail!("--batch {} × --seq {} is more than 2^32 tokens a step", args.batch, args.seq);
    }
    let request = PlanRequest { batch: args.batch, seq: args.seq, precision: args.precision, devices: args.devices, recompute: args.recompute, cpu_kernels: backend == kiln::backends::DeviceSpec::Cpu, gpu_kernels: matches!(backend, kiln::backends::DeviceSpec::Cuda(_)) };
    let plan = plan(&config, request);
    match args.json {
        true => println!("{}", serde_json::to_string(&plan)?),
        false => print!("{}", plan.render()),
    }
    Ok(())
}
