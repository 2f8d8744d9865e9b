//! How many GPU kernels RMSNorm, RoPE and SwiGLU (forward, and forward + backward of the output's
//! sum), the AdamW update of a model and one whole training step of the tiny model launch on
//! wgpu: burn's ops without fusion, burn's ops with fusion, and with fusion and kiln's own CubeCL
//! kernels (`model::cube`: what kiln runs). Issue 20, item 5. Counted from cubecl's profiling
//! log (level `minimal`: one `Executing <kernel>` line per launch), after warm-up runs so that
//! autotune's trials are not counted. The figures are launches, not time: they do not depend on
//! the device's speed.
//!
//! `cargo bench --profile test --bench fusion_kernels --features wgpu` (the test build's
//! artifacts; kernel counts do not depend on the optimisation level). Prints one table; add
//! `-- --names` for the kernels of each row.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use burn::backend::Autodiff;
use burn::backend::wgpu::{CubeBackend, WgpuDevice, WgpuRuntime};
use burn::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig, profiling::ProfilingLogLevel};
use burn::module::AutodiffModule;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor};
use kiln::data::Sample;
use kiln::model::cube;
use kiln::model::kernels::{self, kernels, reference};
use burn::optim::GradientsParams;
use kiln::model::{HostBatch, Qwen2, Qwen2Config};
use kiln::train::adamw::AdamW;
use kiln::train::{AdamWConfig, LoopConfig, NextTokenLoss, Precision, SavePolicy, Start, train};

/// burn's wgpu backend without fusion (each op its own kernel).
type Plain = CubeBackend<WgpuRuntime, f32, i32, u32>;
/// With fusion: what kiln runs (`kiln_backends::Wgpu`), with kiln's CubeCL table or the
/// reference one ([`tables`]).
type Fused = kiln::backends::Wgpu;

/// `Fused`'s kernel tables, plain and under autodiff: kiln's CubeCL kernels, or burn's ops.
fn tables(ours: bool) {
    fn one<B: Backend>(ours: bool) {
        kernels::set::<B>(if ours { cube::table::<B>().expect("wgpu has kiln's CubeCL table") } else { reference::<B>() });
    }
    one::<Fused>(ours);
    one::<Autodiff<Fused>>(ours);
}

const BATCH: usize = 4;
const SEQ: usize = 128;
const HIDDEN: usize = 768;
const FF: usize = 3072;
const HEADS: usize = 12;
const HEAD: usize = 64;

/// Kernels launched, by name, read from cubecl's log.
struct Log {
    path: PathBuf,
}

impl Log {
    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.path).unwrap_or_default().lines().filter_map(|l| l.strip_prefix("Executing ").map(String::from)).collect()
    }

    /// The log once its writer thread has caught up (no new line for 300 ms).
    fn settled(&self) -> Vec<String> {
        let (mut last, mut since) = (self.lines(), Instant::now());
        while since.elapsed() < Duration::from_millis(300) {
            std::thread::sleep(Duration::from_millis(50));
            let now = self.lines();
            if now.len() != last.len() {
                (last, since) = (now, Instant::now());
            }
        }
        last
    }

    /// The kernels `run` launches on `device`'s backend `B` (its work synced before and after,
    /// what it returns kept until then).
    fn count<B: Backend, T>(&self, device: &B::Device, run: impl FnOnce() -> T) -> Vec<String> {
        B::sync(device).unwrap();
        let before = self.settled().len();
        let kept = run();
        B::sync(device).unwrap();
        drop(kept);
        self.settled().split_off(before)
    }
}

fn normal<B: Backend, const N: usize>(shape: [usize; N], device: &B::Device) -> Tensor<B, N> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
}

/// `op`'s kernels on `B` after two warm-up runs: forward, then forward and backward of
/// `sum(op(x))` with gradients for the first `grads` inputs.
fn op_counts<B: AutodiffBackend, const N: usize>(
    log: &Log,
    device: &B::Device,
    grads: usize,
    inputs: impl Fn() -> Vec<Tensor<B, N>>,
    op: impl Fn(Vec<Tensor<B, N>>) -> Tensor<B, N>,
) -> (Vec<String>, Vec<String>) {
    let forward = |x: Vec<Tensor<B, N>>| op(x);
    let backward = |x: Vec<Tensor<B, N>>| {
        let x = x.into_iter().enumerate().map(|(i, x)| if i < grads { x.require_grad() } else { x }).collect();
        op(x).sum().backward()
    };
    for _ in 0..2 {
        log.count::<B, _>(device, || forward(inputs()));
        log.count::<B, _>(device, || backward(inputs()));
    }
    let (a, b) = (inputs(), inputs());
    (log.count::<B, _>(device, || forward(a)), log.count::<B, _>(device, || backward(b)))
}

/// Kernels of one training step (forward, backward, clipping, AdamW) of `config`'s model, and
/// of its AdamW update alone, after two warm-up steps.
fn step_counts<B: AutodiffBackend>(log: &Log, device: &B::Device, config: &Qwen2Config) -> (Vec<String>, Vec<String>) {
    let samples: Vec<Sample> = (0..BATCH).map(|i| Sample::all_targets((0..SEQ).map(|t| ((i * 31 + t * 7) % config.vocab_size) as u32).collect())).collect();
    let steps = 3;
    let out = std::env::temp_dir().join(format!("kiln-fusion-kernels-{}", std::process::id()));
    let loop_config = LoopConfig {
        optimizer: AdamWConfig { weight_decay: 0.1, ..AdamWConfig::with_lr(1e-4) },
        save: SavePolicy::never(),
        ..LoopConfig::new(&out, steps, 1e-4)
    };
    let mut objective = NextTokenLoss::new(samples, BATCH, 1, 0, 0).unwrap();
    let weights = loop_config.precision.weights();
    let start = Start::<B>::new(&loop_config, false, &mut objective, device, || Qwen2::random_as(config, 0, device, weights)).unwrap();
    let mut marks = Vec::new();
    train(start, &mut objective, &loop_config, |_| Ok(Default::default()), |_| {
        B::sync(device).unwrap();
        marks.push(log.settled().len());
    })
    .unwrap();
    std::fs::remove_dir_all(&out).ok();
    let step: Vec<String> = log.settled()[marks[1]..marks[2]].to_vec();

    // The update alone: the optimizer over the model's parameters and the gradients of a loss.
    let mut model: Qwen2<B> = Qwen2::random_as(config, 0, device, weights).unwrap();
    let names = model.param_names();
    let mut adamw = AdamW::<B::InnerBackend>::new(loop_config.optimizer);
    let mut update = Vec::new();
    for round in 0..3 {
        let inputs = HostBatch::right_padded(&[vec![1; 8]], 0).unwrap().to_device::<B>(device);
        let loss = model.forward(&inputs).sum();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        B::sync(device).unwrap();
        let mut next = None;
        let kernels = log.count::<B, _>(device, || next = Some(adamw.update(model.clone(), &names, grads, 1e-4).0));
        model = next.unwrap();
        if round == 2 {
            update = kernels;
        }
    }
    std::hint::black_box(model.valid());
    (step, update)
}

fn histogram(kernels: &[String]) -> String {
    let mut by_name = BTreeMap::<&str, usize>::new();
    for k in kernels {
        *by_name.entry(k.split(" | ").next().unwrap_or(k)).or_default() += 1;
    }
    let mut rows: Vec<(&str, usize)> = by_name.into_iter().collect();
    rows.sort_by(|a, b| b.1.cmp(&a.1));
    rows.iter().map(|(n, c)| format!("{c}× {n}")).collect::<Vec<_>>().join(", ")
}

fn main() {
    let names = std::env::args().any(|a| a == "--names");
    let path = std::env::temp_dir().join(format!("kiln-fusion-kernels-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut config = CubeClRuntimeConfig::default();
    config.profiling.logger.level = ProfilingLogLevel::Minimal;
    config.profiling.logger.file = Some(path.clone());
    if let Some(dir) = std::env::var_os("KILN_KERNEL_CACHE").filter(|d| !d.is_empty()) {
        config.autotune.cache = burn::cubecl::config::cache::CacheConfig::File(dir.into());
    }
    CubeClRuntimeConfig::set(config);
    let log = Log { path: path.clone() };
    let device = WgpuDevice::DefaultDevice;
    let tiny: Qwen2Config = serde_json::from_str(kiln::tasks::interplay::tiny_model::TINY_CONFIG).unwrap();

    let mut rows: Vec<(String, [Vec<String>; 3])> = Vec::new();
    macro_rules! ops {
        ($name:expr, $n:literal, $grads:literal, $inputs:ident, $op:expr) => {{
            let (plain_f, plain_b) = op_counts::<Autodiff<Plain>, $n>(&log, &device, $grads, || $inputs(&device), $op);
            tables(false);
            let (fused_f, fused_b) = op_counts::<Autodiff<Fused>, $n>(&log, &device, $grads, || $inputs(&device), $op);
            tables(true);
            let (ours_f, ours_b) = op_counts::<Autodiff<Fused>, $n>(&log, &device, $grads, || $inputs(&device), $op);
            rows.push((format!("{} forward", $name), [plain_f, fused_f, ours_f]));
            rows.push((format!("{} forward + backward", $name), [plain_b, fused_b, ours_b]));
        }};
    }
    fn rms<B: Backend>(d: &B::Device) -> Vec<Tensor<B, 3>> {
        vec![normal([BATCH, SEQ, HIDDEN], d)]
    }
    fn gate_up<B: Backend>(d: &B::Device) -> Vec<Tensor<B, 3>> {
        vec![normal([BATCH, SEQ, FF], d), normal([BATCH, SEQ, FF], d)]
    }
    fn rope_in<B: Backend>(d: &B::Device) -> Vec<Tensor<B, 4>> {
        vec![normal([BATCH, SEQ, HEADS, HEAD], d), normal([BATCH, 1, SEQ, HEAD], d), normal([BATCH, 1, SEQ, HEAD], d)]
    }
    ops!("RMSNorm [4, 128, 768]", 3, 1, rms, |xs: Vec<Tensor<_, 3>>| {
        let x = xs.into_iter().next().unwrap();
        let w = Tensor::ones([HIDDEN], &x.device());
        (kernels().rms_norm)(x, w, 1e-6)
    });
    ops!("SwiGLU [4, 128, 3072]", 3, 2, gate_up, |xs: Vec<Tensor<_, 3>>| {
        let mut xs = xs.into_iter();
        (kernels().swiglu)(xs.next().unwrap(), xs.next().unwrap())
    });
    ops!("RoPE q [4, 128, 12, 64]", 4, 1, rope_in, |xs: Vec<Tensor<_, 4>>| {
        let mut xs = xs.into_iter();
        let (x, cos, sin) = (xs.next().unwrap(), xs.next().unwrap(), xs.next().unwrap());
        (kernels().rope)(x, &cos, &sin)
    });
    let (plain_step, plain_update) = step_counts::<Autodiff<Plain>>(&log, &device, &tiny);
    tables(false);
    let (fused_step, fused_update) = step_counts::<Autodiff<Fused>>(&log, &device, &tiny);
    tables(true);
    let (ours_step, ours_update) = step_counts::<Autodiff<Fused>>(&log, &device, &tiny);
    let params = Qwen2::<Fused>::random_as(&tiny, 0, &device, Precision::F32.weights()).unwrap().param_names().len();
    rows.push((format!("AdamW update, tiny model ({params} tensors)"), [plain_update, fused_update, ours_update]));
    rows.push((format!("training step, tiny model, {BATCH} × {SEQ} tokens"), [plain_step, fused_step, ours_step]));

    println!("kernels launched on wgpu's default adapter (cubecl's profiling log, level minimal)");
    println!("| operation | burn's ops | burn's ops, fusion | kiln's kernels, fusion |");
    println!("|---|---:|---:|---:|");
    for (name, [plain, fused, ours]) in &rows {
        println!("| {name} | {} | {} | {} |", plain.len(), fused.len(), ours.len());
    }
    if names {
        for (name, [plain, fused, ours]) in &rows {
            println!("\n{name}\n  burn's ops: {}\n  with fusion: {}\n  kiln's kernels: {}", histogram(plain), histogram(fused), histogram(ours));
        }
    }
    let _ = std::fs::remove_file(&path);
}
