//! `kiln bench`: prefill and decode throughput of the generation engine, printed as figures
//! (compare with `benches/hf_generate_baseline.py`, which measures transformers the same way).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, bail};
use burn::tensor::backend::Backend;
use clap::Args;
use kiln::backends::{DeviceSpec, Job};
use kiln::generate::{Engine, Sampler, SamplingParams};
use kiln::model::{Qwen2, Qwen2Config, hf};
use rand::{Rng, SeedableRng};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A config.json (random weights) ...
    #[arg(long, group = "source")]
    config: Option<PathBuf>,
    /// ... or a model directory.
    #[arg(long, group = "source")]
    model: Option<PathBuf>,
    #[arg(long, default_value = "cpu", value_parser = super::parse_backend)]
    backend: DeviceSpec,
    #[arg(long, default_value_t = 8)]
    batch: usize,
    #[arg(long, default_value_t = 64)]
    prompt_len: usize,
    #[arg(long, default_value_t = 128)]
    new_tokens: usize,
    /// Timed repetitions (the best is reported); one untimed warm-up run precedes them.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
}

pub fn run(args: BenchArgs) -> Result<()> {
    let backend = args.backend;
    kiln::backends::run(backend, BenchJob(args))?
}

struct BenchJob(BenchArgs);

impl Job for BenchJob {
    type Output = Result<()>;

    fn run<B: Backend>(self, device: B::Device) -> Result<()> {
        let args = self.0;
        let model: Qwen2<B> = match (&args.config, &args.model) {
            (Some(config), None) => Qwen2::random(&Qwen2Config::from_file(config)?, 0, &device)?,
            (None, Some(dir)) => hf::load(dir, &device)?,
            _ => bail!("give one of --config or --model"),
        };
        let vocab = model.config().vocab_size as u32;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let prompts: Vec<Vec<u32>> =
            (0..args.batch).map(|_| (0..args.prompt_len).map(|_| rng.random_range(0..vocab)).collect()).collect();
        let mut engine = Engine::new(&model, None);
        engine.max_batch_size = args.batch;
        let time = |new_tokens: usize| -> Result<f64> {
            let params = SamplingParams { sampler: Sampler::greedy(), max_new_tokens: new_tokens, ..Default::default() };
            let start = Instant::now();
            let out = engine.generate(&prompts, &params, |_| {})?;
            assert!(out.iter().flatten().all(|c| c.token_ids.len() == new_tokens));
            Ok(start.elapsed().as_secs_f64())
        };
        time(args.new_tokens)?; // warm-up
        let (mut prefill, mut total) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..args.repeats.max(1) {
            prefill = prefill.min(time(1)?);
            total = total.min(time(args.new_tokens)?);
        }
        let decoded = (args.batch * (args.new_tokens - 1)) as f64;
        let figures = serde_json::json!({
            "engine": "kiln",
            "backend": args.backend.to_string(),
            "parameters": model.config().num_parameters(),
            "batch": args.batch,
            "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens,
            "prefill_s": prefill,
            "total_s": total,
            "prefill_tokens_per_s": (args.batch * args.prompt_len) as f64 / prefill,
            "decode_tokens_per_s": decoded / (total - prefill),
            "end_to_end_tokens_per_s": (args.batch * args.new_tokens) as f64 / total,
        });
        println!("{figures}");
        Ok(())
    }
}
