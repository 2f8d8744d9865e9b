//! `kiln bench`: prefill and decode throughput of the generation engine, printed as figures
//! (compare with `benches/hf_generate_baseline.py`, which measures transformers the same way).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, bail};
use burn::module::AutodiffModule;
use burn::tensor::backend::Backend;
use clap::Args;
use burn::tensor::backend::AutodiffBackend;
use kiln::backends::{DeviceSpec, Job, TrainJob};
use kiln::data::Sample;
use kiln::train::{AdamWConfig, LoopConfig, NextTokenLoss, Precision, SavePolicy, Start, train};
use kiln::generate::{Engine, Sampler, SamplingParams, StepTimes};
use kiln::model::{Dtype, Qwen2, Qwen2Config, hf};
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
    #[arg(long, default_value_t = 8, value_parser = super::positive)]
    batch: usize,
    #[arg(long, default_value_t = 64, value_parser = super::positive)]
    prompt_len: usize,
    #[arg(long, default_value_t = 128, value_parser = super::positive)]
    new_tokens: usize,
    /// Timed repetitions (the best is reported); one untimed warm-up run precedes them.
    #[arg(long, default_value_t = 3, value_parser = super::positive)]
    repeats: usize,
    /// Measure training steps instead (AdamW, batch × prompt-len tokens; the median of
    /// `--repeats` steps after 2 warm-up steps is reported).
    #[arg(long)]
    train: bool,
    /// Measure RL rollouts instead: the model is built under autodiff and sampled through
    /// `.valid()` as `kiln rl` does (temperature 1, `--samples` per prompt); compare with the
    /// plain generation figures at the same batch and lengths.
    #[arg(long, conflicts_with = "train")]
    rollout: bool,
    /// Samples per prompt for `--rollout` (the GRPO group size); the batch holds
    /// `--batch` sequences in all.
    #[arg(long, default_value_t = 1)]
    samples: usize,
    /// Decode from the batch-shaped KV cache instead of the paged one (the CPU in f32, wgpu and
    /// CUDA), to compare the two.
    #[arg(long, conflicts_with = "train")]
    dense_kv: bool,
    /// The most tokens (padding included) one prefill pass takes; the prompts are prefilled in
    /// groups within it.
    #[arg(long, default_value_t = kiln::generate::MAX_PREFILL_TOKENS, value_parser = super::positive, conflicts_with = "train")]
    max_prefill_tokens: usize,
    /// Weights and activations in f32, bf16 or f16 (with --train: the mixed precision of that
    /// dtype unless --precision says otherwise).
    #[arg(long, default_value = "f32")]
    dtype: Dtype,
    /// With --train: f32, bf16-mixed, f16-mixed or bf16-pure.
    #[arg(long)]
    precision: Option<Precision>,
    /// With --train: recompute activations in the backward pass (`[train] recompute`).
    #[arg(long)]
    recompute: bool,
    /// Measure the gradients' all-reduce instead, per buffer size (nccl-tests' algbw and busbw),
    /// over the replicas that --devices, --nnodes or a launcher's environment place, through
    /// --collective; each result is checked.
    #[arg(long, conflicts_with_all = ["train", "rollout"])]
    all_reduce: bool,
    /// Measure the all-gather that hands out ZeRO-1's updated weights instead (`[train]
    /// shard_optimizer`; nccl-tests' `all_gather_perf` figures), as --all-reduce does.
    #[arg(long, conflicts_with_all = ["train", "rollout", "all_reduce"])]
    all_gather: bool,
    /// Measure the CPU's f32 matrix products instead, at the shapes of one training step of
    /// --config at --batch × --prompt-len tokens (forward and both backward products of every
    /// projection; compare `benches/torch_matmul.py`).
    #[arg(long, conflicts_with_all = ["train", "rollout", "all_reduce", "all_gather"])]
    matmul: bool,
    /// With --all-reduce or --all-gather: buffer sizes in bytes [default: 1 MiB to 256 MiB by 4].
    #[arg(long, value_delimiter = ',', value_parser = super::positive)]
    sizes: Vec<usize>,
    #[command(flatten)]
    dist: super::dist::DistArgs,
}

pub fn run(args: BenchArgs) -> Result<()> {
    let backend = args.backend;
    // Counts the benchmarks multiply (a training run's 64 batches of --prompt-len tokens, the
    // repeats' warm-ups) kept within what arithmetic holds: one line, not an overflow.
    if args.batch.checked_mul(64).and_then(|b| b.checked_mul(args.prompt_len)).is_none() || args.repeats > u32::MAX as usize {
        bail!("--batch {} × --prompt-len {} (or --repeats {}) is too large", args.batch, args.prompt_len, args.repeats);
    }
    if args.all_reduce || args.all_gather {
        use super::bench_all_reduce::{AllReduceJob, DEFAULT_SIZES, Mode};
        let devices = args.dist.devices(Some(backend), None)?;
        let nodes = args.dist.nodes()?;
        let sizes = if args.sizes.is_empty() { DEFAULT_SIZES.to_vec() } else { args.sizes };
        let mode = if args.all_gather { Mode::AllGather } else { Mode::AllReduce };
        let job = AllReduceJob { mode, sizes, repeats: args.repeats, nodes, backend: backend.to_string() };
        return kiln::backends::run_replicas(&devices, job)?;
    }
    if args.matmul {
        let Some(config) = &args.config else { bail!("--matmul needs --config") };
        if backend != DeviceSpec::Cpu {
            bail!("--matmul times the CPU's products: leave out --backend {backend} (or give --backend cpu)");
        }
        return super::bench_matmul::run(&Qwen2Config::from_file(config)?, args.batch * args.prompt_len, args.repeats, &cpu_model());
    }
    if args.train {
        let recompute = args.recompute;
        return super::on_cpu_pool(&[backend], || kiln::backends::run_training_with(backend, recompute, TrainBenchJob(args)))?;
    }
    if args.rollout {
        return super::on_cpu_pool(&[backend], || kiln::backends::run_training(backend, RolloutBenchJob(args)))?;
    }
    kiln::backends::run(backend, BenchJob(args))?
}

/// Training-step throughput with random token blocks (compare `benches/torch_train_step.py`).
struct TrainBenchJob(BenchArgs);

impl TrainJob for TrainBenchJob {
    type Output = Result<()>;

    fn run<B: AutodiffBackend>(self, device: B::Device) -> Result<()> {
        let args = self.0;
        let config = match &args.config {
            Some(path) => Qwen2Config::from_file(path)?,
            None => bail!("--train needs --config"),
        };
        if args.prompt_len > config.max_position_embeddings {
            bail!("--prompt-len {} is longer than the model's {} positions (max_position_embeddings)", args.prompt_len, config.max_position_embeddings);
        }
        let vocab = config.vocab_size as u32;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let samples: Vec<Sample> = (0..args.batch * 64)
            .map(|_| Sample::all_targets((0..args.prompt_len).map(|_| rng.random_range(0..vocab)).collect()))
            .collect();
        let steps = (args.repeats + 2) as u64;
        let out = std::env::temp_dir().join(format!("kiln-bench-{}", std::process::id()));
        let loop_config = LoopConfig {
            optimizer: AdamWConfig { weight_decay: 0.1, ..AdamWConfig::with_lr(1e-4) },
            save: SavePolicy::never(),
            precision: args.precision.unwrap_or(Precision::mixed(args.dtype)),
            ..LoopConfig::new(&out, steps, 1e-4)
        };
        let mut objective = NextTokenLoss::new(samples, args.batch, 1, 0, 0)?;
        let weights = loop_config.precision.weights();
        let start = Start::<B>::new(&loop_config, false, &mut objective, &device, || Qwen2::random_as(&config, 0, &device, weights))?;
        let mut step_times = Vec::new();
        let mut rss = Vec::new();
        let mut memory = DeviceMemory::default();
        let bar = super::progress::with_eta(steps, "steps");
        train(start, &mut objective, &loop_config, |_| Ok(Default::default()), |record| {
            bar.inc(1);
            step_times.push(kiln::train::metrics::STEP_S.get(record).unwrap_or(f64::NAN));
            rss.extend(kiln::train::metrics::RSS_MIB.get(record));
            memory.sample::<B>(&device);
        })?;
        bar.finish_and_clear();
        std::fs::remove_dir_all(&out).ok();
        let mut timed = step_times[2..].to_vec();
        timed.sort_by(f64::total_cmp);
        let median = timed[timed.len() / 2];
        let figures = serde_json::json!({
            "engine": "kiln",
            "mode": "train",
            "backend": args.backend.to_string(),
            "cpu": cpu_model(),
            "threads": rayon_threads(),
            "precision": loop_config.precision.name(),
            "parameters": config.num_parameters(),
            "batch": args.batch,
            "seq": args.prompt_len,
            "step_s": median,
            "tokens_per_s": (args.batch * args.prompt_len) as f64 / median,
            "rss_mib_first_last": [rss.first(), rss.last()],
            "recompute": args.recompute,
            "peak_rss_mib": kiln::train::metrics::peak_rss_mib(),
            "file_rss_mib": kiln::train::metrics::file_rss_mib(),
            "device_memory": memory.figures(),
            "autotune": autotune(args.backend),
        });
        // No figure from a run the device failed in.
        kiln::backends::device::check::<B>(&device)?;
        println!("{figures}");
        Ok(())
    }
}

struct BenchJob(BenchArgs);

impl Job for BenchJob {
    type Output = Result<()>;

    fn run<B: Backend>(self, device: B::Device) -> Result<()> {
        let args = self.0;
        let model: Qwen2<B> = bench_model(&args, &device)?;
        let figures = generation_figures(&model, &args, Sampler::greedy(), 1, "generate")?;
        kiln::backends::device::check::<B>(&device)?;
        println!("{figures}");
        Ok(())
    }
}

/// The benchmarked model: random weights from `--config` or a checkpoint `--model`, in `--dtype`.
fn bench_model<B: Backend>(args: &BenchArgs, device: &B::Device) -> Result<Qwen2<B>> {
    Ok(match (&args.config, &args.model) {
        (Some(config), None) => {
            args.dtype.check::<B>(device)?;
            Qwen2::random_as(&Qwen2Config::from_file(config)?, 0, device, args.dtype)?
        }
        (None, Some(dir)) => hf::load_as(dir, device, args.dtype)?,
        _ => bail!("give one of --config or --model"),
    })
}

/// Rollout throughput: the model lives under autodiff, as in `kiln rl`, and samples through
/// `.valid()` (the path RL rollouts, reference and teacher log-probs take).
struct RolloutBenchJob(BenchArgs);

impl TrainJob for RolloutBenchJob {
    type Output = Result<()>;

    fn run<B: AutodiffBackend>(self, device: B::Device) -> Result<()> {
        let args = self.0;
        let model: Qwen2<B> = bench_model(&args, &device)?;
        let sampler = Sampler { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0 };
        let samples = args.samples.max(1);
        let figures = generation_figures(&model.valid(), &args, sampler, samples, "rollout")?;
        kiln::backends::device::check::<B>(&device)?;
        println!("{figures}");
        Ok(())
    }
}

/// Times prefill and generation of `--batch` sequences (`batch / samples` random prompts of
/// `--prompt-len` tokens, `samples` each, `--new-tokens` each, EOS ignored) and returns the
/// figures as JSON.
fn generation_figures<B: Backend>(model: &Qwen2<B>, args: &BenchArgs, sampler: Sampler, samples: usize, mode: &str) -> Result<serde_json::Value> {
    let positions = model.context_len();
    if args.prompt_len.saturating_add(args.new_tokens) > positions {
        bail!(
            "--prompt-len {} + --new-tokens {} is longer than the model's {positions} positions (max_position_embeddings)",
            args.prompt_len,
            args.new_tokens
        );
    }
    let vocab = model.config().vocab_size as u32;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let prompts: Vec<Vec<u32>> = (0..(args.batch / samples).max(1))
        .map(|_| (0..args.prompt_len).map(|_| rng.random_range(0..vocab)).collect())
        .collect();
    let sequences = prompts.len() * samples;
    let mut engine = Engine::new(model, None);
    engine.max_batch_size = sequences;
    engine.paged = !args.dense_kv;
    engine.max_prefill_tokens = args.max_prefill_tokens;
    // A warm-up, then a prefill-only and a whole generation per repeat.
    let bar = super::progress::with_eta(1 + 2 * args.repeats.max(1) as u64, "runs");
    let time = |new_tokens: usize| -> Result<(f64, StepTimes)> {
        let params = SamplingParams { n: samples, sampler, max_new_tokens: new_tokens, ignore_eos: true, ..Default::default() };
        let start = Instant::now();
        let out = engine.generate(&prompts, &params, |_| {})?;
        bar.inc(1);
        assert!(out.iter().flatten().all(|c| c.token_ids.len() == new_tokens));
        Ok((start.elapsed().as_secs_f64(), engine.step_times()))
    };
    time(args.new_tokens)?; // warm-up
    let (mut prefill, mut total, mut steps) = (f64::INFINITY, f64::INFINITY, StepTimes::default());
    for _ in 0..args.repeats.max(1) {
        prefill = prefill.min(time(1)?.0);
        let (t, s) = time(args.new_tokens)?;
        if t < total {
            (total, steps) = (t, s);
        }
    }
    bar.finish_and_clear();
    // On the CPU backend the host does everything; elsewhere, the share of a decoding step the
    // host was busy (not waiting for the device's sampled tokens): the goal is under 10%.
    let host_share = (args.backend != DeviceSpec::Cpu).then(|| steps.host_share());
    let mut memory = DeviceMemory::default();
    memory.sample::<B>(&model.device());
    let decoded = (sequences * (args.new_tokens - 1)) as f64;
    Ok(serde_json::json!({
        "engine": "kiln",
        "mode": mode,
        "backend": args.backend.to_string(),
        "dtype": args.dtype.name(),
        "cpu": cpu_model(),
        "parameters": model.config().num_parameters(),
        "batch": sequences,
        "samples_per_prompt": samples,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "prefill_s": prefill,
        "total_s": total,
        "prefill_tokens_per_s": (prompts.len() * args.prompt_len) as f64 / prefill,
        "decode_tokens_per_s": decoded / (total - prefill),
        "end_to_end_tokens_per_s": (sequences * args.new_tokens) as f64 / total,
        "decode_step_ms": 1e3 * steps.total_s / steps.steps.max(1) as f64,
        "kv_cache": if engine.pages_kv() { "paged" } else { "dense" },
        "kv_cache_peak_bytes": engine.pages_kv().then_some(steps.kv_bytes_peak),
        "prefills": steps.prefills,
        "prefill_tokens_max": steps.prefill_tokens_max,
        "host_share_of_step": host_share,
        "device_memory": memory.figures(),
        "peak_rss_mib": kiln::train::metrics::peak_rss_mib(),
        "file_rss_mib": kiln::train::metrics::file_rss_mib(),
        "autotune": autotune(args.backend),
    }))
}

/// The device allocator's largest figures over the samples taken (GPU backends; the CPU's
/// memory is `peak_rss_mib`).
#[derive(Default)]
struct DeviceMemory {
    in_use: u64,
    reserved: u64,
    sampled: bool,
}

impl DeviceMemory {
    fn sample<B: Backend>(&mut self, device: &B::Device) {
        if let Some(usage) = kiln::backends::device::memory_usage::<B>(device) {
            (self.in_use, self.reserved, self.sampled) = (self.in_use.max(usage.in_use), self.reserved.max(usage.reserved), true);
        }
    }

    /// `{"in_use_max_bytes", "reserved_max_bytes"}` (sampled after each step or run; pools keep
    /// pages, so the reserved figure bounds the peak from above), or null on the CPU.
    fn figures(&self) -> serde_json::Value {
        match self.sampled {
            true => serde_json::json!({ "in_use_max_bytes": self.in_use, "reserved_max_bytes": self.reserved }),
            false => serde_json::Value::Null,
        }
    }
}

/// On a GPU backend, the kernels burn's autotune chose for each tuned operation (matmul,
/// attention, reductions…) and how many shapes each won, from cubecl's autotune cache; null on
/// the CPU, which has no autotune.
fn autotune(backend: DeviceSpec) -> serde_json::Value {
    match backend {
        DeviceSpec::Cpu => serde_json::Value::Null,
        _ => serde_json::json!(kiln::backends::device::autotune_choices()),
    }
}

/// The CPU's model name (`/proc/cpuinfo`), for tables that compare machines.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| info.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).map(|m| m.trim().to_string()))
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Threads of the pool burn's CPU backend and the fused kernels run on.
fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
