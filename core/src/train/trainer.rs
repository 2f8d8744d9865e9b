//! The training loop: for each optimizer update, ask the objective for micro-batches, backward
//! each loss (gradients accumulate), clip, step AdamW at the scheduled rate, log, evaluate and
//! checkpoint. Resuming from a checkpoint continues bit-identically on the CPU backend.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use burn::module::AutodiffModule;
use burn::optim::GradientsAccumulator;
use burn::tensor::ElementConversion;
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::adamw::{AdamW, AdamWConfig};
use super::checkpoint::{self, TrainerState};
use super::metrics::{self, MetricsLog, rss_mib};
use super::objective::Objective;
use super::precision::{LossScale, Precision};
use super::schedule::Schedule;
use crate::dist::{self, Replica};
use crate::error::{Error, Result};
use crate::model::{Qwen2, hf};

/// When to write checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavePolicy {
    /// Every n steps (`>= 1`) or every fraction of the run (`< 1`, HF's `save_steps: 0.2`,
    /// i.e. every `ceil(0.2 · total)` steps).
    pub every: Option<f64>,
    /// Extra steps to save at.
    #[serde(default)]
    pub milestones: Vec<u64>,
    /// Also save after the last step (default).
    #[serde(default = "yes")]
    pub last: bool,
    /// Names of checkpoints and the metrics file: `None` gives HF Trainer's `checkpoint-<step>`
    /// and `metrics.jsonl`; `Some(run)` the release's `<run>_step<step>` and
    /// `<run>_metrics.jsonl` (`rl/op11_14_step20`); `Some("")` gives `step<step>`.
    #[serde(default)]
    pub run_name: Option<String>,
}

fn yes() -> bool {
    true
}

impl SavePolicy {
    /// No checkpoint at all (benchmarks, one-off steps).
    pub fn never() -> Self {
        Self { last: false, ..Self::default() }
    }
}

impl Default for SavePolicy {
    fn default() -> Self {
        Self { every: None, milestones: Vec::new(), last: true, run_name: None }
    }
}

impl SavePolicy {
    /// Whether step `step` (1-based count of updates done) of `total` is saved.
    pub fn saves(&self, step: u64, total: u64) -> bool {
        let interval = match self.every {
            Some(e) if e >= 1.0 => Some(e as u64),
            Some(e) if e > 0.0 => Some(((total as f64) * e).ceil() as u64),
            _ => None,
        };
        (self.last && step == total) || interval.is_some_and(|i| i > 0 && step.is_multiple_of(i)) || self.milestones.contains(&step)
    }
}

/// Settings of the loop itself (the objective owns its data).
#[derive(Debug, Clone)]
pub struct LoopConfig {
    pub total_steps: u64,
    /// The shape of the learning rate over the run ...
    pub schedule: Schedule,
    /// ... whose peak is `optimizer.lr`: the run config's `[optimizer]`, read straight into it.
    pub optimizer: AdamWConfig,
    /// Checkpoints and metrics go here (named by [`SavePolicy::run_name`]).
    pub out_dir: PathBuf,
    pub save: SavePolicy,
    /// Evaluate every n steps (and before the first and after the last).
    pub eval_every: Option<u64>,
    /// Also evaluate after these steps (0: before the first), and, when any are given, after
    /// the step a time budget stops the run at (the last checkpoint's signal). With either
    /// setting the run is evaluated after its last step.
    pub eval_steps: Vec<u64>,
    /// Stop cleanly (and save) once this much wall-clock time has passed.
    pub time_budget: Option<Duration>,
    /// Tokenizer files copied into every checkpoint.
    pub companions: Option<PathBuf>,
    /// Changes to those files: the chat template an SFT run trained with, and its EOS.
    pub companion_edits: crate::model::hf::CompanionEdits,
    /// The run's configuration, recorded in every checkpoint.
    pub run_config: Value,
    /// Whether `--resume` may continue under settings that differ from the checkpoint's run
    /// config (`--allow-config-change`); otherwise it refuses, listing them.
    pub allow_config_change: bool,
    /// Weights, optimizer state and compute dtypes ([`Precision`]).
    pub precision: Precision,
    /// ZeRO-1 over data-parallel replicas (`[train] shard_optimizer`): each replica keeps the
    /// AdamW moments of about `1 / world` of the parameters and updates only those; the new
    /// weights are gathered after every update and the moments before every checkpoint, so
    /// results and checkpoints are an unsharded run's. One replica: no effect.
    pub shard_optimizer: bool,
    /// The dtype gradients are all-reduced in over data-parallel replicas (`[train]
    /// grad_reduce_dtype`, [`dist::ReduceDtype`]); bf16 needs NCCL. One replica: no effect.
    pub grad_reduce_dtype: dist::ReduceDtype,
    /// All-reduce each decoder layer's gradients while the backward pass goes on to the layers
    /// below (`[train] overlap_grad_reduce`, [`dist::Overlap`]) where the sums go through kiln's
    /// ring (one replica per process); otherwise, and when off, after the backward pass.
    pub overlap_grad_reduce: bool,
}

impl LoopConfig {
    /// A plain loop of `total_steps` updates into `out_dir`: `lr` constant, AdamW's defaults,
    /// one checkpoint after the last step, no evaluation, no time budget, nothing copied or
    /// recorded with the checkpoint, f32. Change fields with struct update syntax:
    /// `LoopConfig { save: SavePolicy::never(), ..LoopConfig::new(dir, 10, 1e-3) }`; other AdamW
    /// settings keep the rate in `optimizer`: `optimizer: AdamWConfig { weight_decay: 0.1,
    /// ..AdamWConfig::with_lr(1e-3) }`.
    pub fn new(out_dir: impl Into<PathBuf>, total_steps: u64, lr: f64) -> Self {
        Self {
            total_steps,
            schedule: Schedule::constant(total_steps),
            optimizer: AdamWConfig { lr, ..AdamWConfig::default() },
            out_dir: out_dir.into(),
            save: SavePolicy::default(),
            eval_every: None,
            eval_steps: Vec::new(),
            time_budget: None,
            companions: None,
            companion_edits: Default::default(),
            run_config: Value::Null,
            allow_config_change: false,
            precision: Precision::default(),
            shard_optimizer: false,
            grad_reduce_dtype: dist::ReduceDtype::F32,
            overlap_grad_reduce: true,
        }
    }
}

/// One line of the metrics log.
pub type Record = Map<String, Value>;

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    pub steps: u64,
    /// The time budget ran out before `total_steps`.
    pub stopped_early: bool,
    pub checkpoints: Vec<PathBuf>,
    pub elapsed: Duration,
}

impl std::fmt::Display for RunSummary {
    /// `N steps in T s[ (stopped by the time budget)]; checkpoints: a, b`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let budget = if self.stopped_early { " (stopped by the time budget)" } else { "" };
        let checkpoints: Vec<String> = self.checkpoints.iter().map(|p| p.display().to_string()).collect();
        write!(f, "{} steps in {:.1}s{budget}; checkpoints: {}", self.steps, self.elapsed.as_secs_f64(), checkpoints.join(", "))
    }
}

/// Where a run starts: fresh, or from its latest checkpoint.
pub struct Start<B: AutodiffBackend> {
    pub model: Qwen2<B>,
    pub optimizer: AdamW<B::InnerBackend>,
    pub step: u64,
    /// f16 loss scaling, when the precision has it.
    pub loss_scale: Option<LossScale>,
}

impl<B: AutodiffBackend> Start<B> {
    /// The latest checkpoint of `out_dir` if `resume` and there is one (restoring `objective`'s
    /// data cursor), else `fresh()`; either way in the run's [`Precision`]. A fresh start refuses
    /// an `out_dir` that already holds checkpoints, so nothing is overwritten by accident.
    pub fn new<O: Objective<B>>(
        config: &LoopConfig,
        resume: bool,
        objective: &mut O,
        device: &B::Device,
        fresh: impl FnOnce() -> Result<Qwen2<B>>,
    ) -> Result<Self> {
        // Checkpoints a killed run was writing never became checkpoints: their directories go.
        crate::io::sweep_partials(&config.out_dir)?;
        let precision = config.precision;
        precision.check::<B>(device)?;
        let checkpoints = checkpoint::all_named(&config.out_dir, config.save.run_name.as_deref())?;
        match checkpoints.first().cloned() {
            Some(_) if resume => {
                // The newest checkpoint that loads; newer ones that do not are set aside (kept,
                // renamed) with a warning, so the run can save their steps again.
                let mut broken: Vec<(PathBuf, Error)> = Vec::new();
                for (step, path) in &checkpoints {
                    match load_checkpoint::<B>(path, *step, config, device) {
                        Ok((model, state, mut optimizer)) => {
                            let changes = changed_settings(path, &state, config)?;
                            // (the data cursor before any warning: a run that cannot continue its
                            // data ends in one error line)
                            objective.restore(&state.data).map_err(|e| Error::checkpoint(path, e.to_string()))?;
                            warn_of_changes(path, &state, config, &changes);
                            if !changes.is_empty() {
                                optimizer.config = config.optimizer;
                            }
                            for (bad, err) in broken {
                                let aside = checkpoint::set_aside(&bad)?;
                                eprintln!("warning: {err}; resuming from {} instead (the damaged checkpoint is kept as {})", path.display(), aside.display());
                            }
                            let loss_scale = precision.loss_scale().map(|s| state.loss_scale.unwrap_or(s));
                            return Ok(Self { model, optimizer, step: state.step, loss_scale });
                        }
                        Err(err) => broken.push((path.clone(), err)),
                    }
                }
                // None loads: the newest one's error.
                Err(broken.swap_remove(0).1)
            }
            Some(_) => Err(fresh_over_checkpoints(&config.out_dir, &checkpoints)),
            None => {
                if resume {
                    // (HF's Trainer refuses here; kiln's release reruns every stage with --resume.)
                    let named = config.save.run_name.as_deref().map(|n| format!(" of run {n:?}")).unwrap_or_default();
                    eprintln!("note: --resume: no checkpoint{named} in {}; starting from step 0", config.out_dir.display());
                }
                Self::fresh(config, device, fresh)
            }
        }
    }

    /// A start from `fresh()` in the run's [`Precision`], without looking at `out_dir` (the
    /// data-parallel replicas other than rank 0, which then take rank 0's state).
    pub fn fresh(config: &LoopConfig, device: &B::Device, fresh: impl FnOnce() -> Result<Qwen2<B>>) -> Result<Self> {
        let precision = config.precision;
        precision.check::<B>(device)?;
        Ok(Self { model: precision.prepare(fresh()?), optimizer: AdamW::new(config.optimizer), step: 0, loss_scale: precision.loss_scale() })
    }
}

/// The refusal of a fresh run (no `--resume`) into `out_dir`, which holds `checkpoints` (newest
/// first, as [`checkpoint::all_named`] lists them).
fn fresh_over_checkpoints(out_dir: &Path, checkpoints: &[(u64, PathBuf)]) -> Error {
    Error::InvalidInput(format!(
        "{} already holds checkpoints (latest {}); pass --resume to continue it or choose another output directory",
        out_dir.display(),
        checkpoints.first().map(|c| c.1.display().to_string()).unwrap_or_default()
    ))
}

/// Refuses a fresh run (no `--resume`) into `out_dir` when it holds checkpoints of run
/// `run_name`, as [`Start::new`] does; for a check before the run's data and models load.
pub fn refuse_fresh_over_checkpoints(out_dir: &Path, run_name: Option<&str>) -> Result<()> {
    let checkpoints = checkpoint::all_named(out_dir, run_name)?;
    match checkpoints.is_empty() {
        true => Ok(()),
        false => Err(fresh_over_checkpoints(out_dir, &checkpoints)),
    }
}

/// The model (in the run's precision), trainer state and optimizer of checkpoint `path` of
/// `step`, checked against each other.
fn load_checkpoint<B: AutodiffBackend>(
    path: &Path,
    step: u64,
    config: &LoopConfig,
    device: &B::Device,
) -> Result<(Qwen2<B>, TrainerState, AdamW<B::InnerBackend>)> {
    let precision = config.precision;
    let model = precision.prepare(hf::load_as::<B>(path, device, precision.weights())?);
    let (state, optimizer) = checkpoint::load_state(path, device)?;
    checkpoint::check_moments(path, &model, &optimizer)?;
    if state.step != step {
        return Err(Error::checkpoint(path, format!("trainer_state.json says step {}, the directory's name step {step}", state.step)));
    }
    Ok((model, state, optimizer))
}

/// The settings the run resuming from checkpoint `path` (its `state`) changes from those the
/// checkpoint was trained with: refused with one line listing them, unless the run allows it
/// (then the new ones apply).
fn changed_settings(path: &Path, state: &TrainerState, config: &LoopConfig) -> Result<Vec<String>> {
    let changes = checkpoint::config_changes(&state.config, &config.run_config);
    if !changes.is_empty() && !config.allow_config_change {
        return Err(Error::checkpoint(
            path,
            format!(
                "the run's config differs from the one this checkpoint was trained with: {}; pass --allow-config-change to resume with the new settings",
                changes.join(", ")
            ),
        ));
    }
    Ok(changes)
}

/// The warnings of a resume under allowed `changes`, and of a new number of steps.
fn warn_of_changes(path: &Path, state: &TrainerState, config: &LoopConfig, changes: &[String]) {
    if !changes.is_empty() {
        eprintln!("warning: resuming {} with changed settings: {}", path.display(), changes.join(", "));
    }
    if state.total_steps != config.total_steps {
        eprintln!(
            "warning: resuming {} for {} steps in all (its run planned {}); the schedule follows the new total",
            path.display(),
            config.total_steps,
            state.total_steps
        );
    }
}

/// Runs the loop from `start` to `config.total_steps` (or the time budget). `evaluate` is given
/// the inference copy of the model and returns metrics to log; `on_record` sees every record.
pub fn train<B, O>(
    start: Start<B>,
    objective: &mut O,
    config: &LoopConfig,
    evaluate: impl FnMut(&Qwen2<B::InnerBackend>) -> Result<Record>,
    on_record: impl FnMut(&Record),
) -> Result<(Qwen2<B>, RunSummary)>
where
    B: AutodiffBackend,
    O: Objective<B>,
{
    train_replica(start, objective, config, &Replica::single(), evaluate, on_record)
}

/// [`train`] as one of several data-parallel replicas: every replica starts from rank 0's
/// `start`, the gradients of each update are reduced over the replicas (by the objective's
/// [`Objective::gradient_reduction`]) and the step's metrics too; only rank 0 logs, evaluates
/// and writes checkpoints.
pub fn train_replica<B, O>(
    start: Start<B>,
    objective: &mut O,
    config: &LoopConfig,
    replica: &Replica,
    mut evaluate: impl FnMut(&Qwen2<B::InnerBackend>) -> Result<Record>,
    mut on_record: impl FnMut(&Record),
) -> Result<(Qwen2<B>, RunSummary)>
where
    B: AutodiffBackend,
    O: Objective<B>,
{
    // Attention with its own chunked backward pass (memory linear in the sequence length).
    crate::model::custom_op::install::<B>();
    crate::model::checkpoint::clear();
    if config.grad_reduce_dtype == dist::ReduceDtype::Bf16 && !replica.is_single() && !replica.sums_with_nccl::<B::InnerBackend>(&start.model.device()) {
        return Err(Error::InvalidInput(dist::BF16_NEEDS_NCCL.into()));
    }
    let Start { mut model, mut optimizer, mut step, mut loss_scale } = dist::sync_start(replica, start, objective)?;
    optimizer.shard = (config.shard_optimizer && replica.world() > 1).then(|| dist::OptimizerShard::of_model(&model, &model.param_names(), replica));
    optimizer.keep_own_moments();
    let main = replica.is_main();
    let began = Instant::now();
    let resumed = step > 0;
    let metrics_path = config.out_dir.join(checkpoint::metrics_name(config.save.run_name.as_deref()));
    let mut log = if main { Some(MetricsLog::open(&metrics_path, resumed.then_some(step))?) } else { None };
    let mut summary = RunSummary { steps: step, stopped_early: false, checkpoints: Vec::new(), elapsed: Duration::ZERO };
    let mut emit = |log: &mut Option<MetricsLog>, record: Record| -> Result<()> {
        // No metrics (nor checkpoints) from a step the device failed in.
        if let Some(err) = kiln_backends::device::fault() {
            return Err(err.into());
        }
        if let Some(log) = log {
            log.write(&record)?;
            on_record(&record);
        }
        Ok(())
    };
    let evaluating = config.eval_every.is_some() || !config.eval_steps.is_empty();
    let eval_due = |s: u64| config.eval_every.is_some_and(|e| e > 0 && s.is_multiple_of(e)) || config.eval_steps.contains(&s);
    // Updates skipped for a non-finite gradient norm (AdamW leaves the weights alone), warned once.
    let mut skipped_total = 0u64;
    // Evaluation samples from a copy in the compute dtype (mixed precision: not casting every
    // weight at every decoding step).
    let inference = |model: &Qwen2<B>| model.valid().in_dtype(model.compute_dtype());
    if !resumed && (config.eval_every.is_some() || config.eval_steps.contains(&0)) && main {
        let mut record = evaluate(&inference(&model))?;
        metrics::STEP.set(&mut record, 0);
        emit(&mut log, record)?;
    }

    while step < config.total_steps {
        let step_began = Instant::now();
        let updates = objective.updates(&model, step)?;
        if updates.is_empty() {
            return Err(Error::InvalidInput(format!("the objective has no optimizer update for step {step}")));
        }
        let update_began = Instant::now();
        let names = model.param_names();
        let lr = config.schedule.lr(config.optimizer.lr, step);
        // Several updates per step (RL mini-batches) log their mean loss and gradient norm.
        let (mut loss_sum, mut norm_sum, mut skipped) = (0.0, 0.0, 0u64);
        // Seconds waiting for the gradients' sums after the backward passes; values summed while
        // they ran.
        let (mut reduce_wait, mut overlapped_sum) = (0.0, 0usize);
        let mut changed: Option<(u64, u64)> = None;
        let mut extras = Record::new();
        for micros in &updates {
            let mut accumulator = GradientsAccumulator::new();
            // The last micro-batch's backward pass hands each layer's gradients to the
            // all-reduce as it goes (`[train] overlap_grad_reduce`, kiln's ring).
            let mut overlap = match config.overlap_grad_reduce {
                true => replica.overlap::<B>(model.layers.len(), &model.device())?,
                false => None,
            };
            for (i, micro) in micros.iter().enumerate() {
                let last = i + 1 == micros.len();
                let split = crate::model::checkpoint::Split::on(last && overlap.is_some());
                let (loss, metrics) = objective.loss(&model, micro)?;
                loss_sum += loss.clone().into_scalar().elem::<f64>();
                let loss = match &loss_scale {
                    Some(s) => loss.mul_scalar(s.scale),
                    None => loss,
                };
                match overlap.as_mut().filter(|_| last) {
                    Some(overlap) => {
                        let earlier = accumulator.grads();
                        let grads = crate::model::checkpoint::gradients_with(loss, &model, |l, grads| overlap.launch(l, &model.layers[l], &names, grads, &earlier));
                        accumulator.accumulate(&model, earlier);
                        accumulator.accumulate(&model, grads);
                    }
                    None => accumulator.accumulate(&model, crate::model::checkpoint::gradients(loss, &model)),
                }
                drop(split);
                add_metrics(&mut extras, metrics);
            }
            let reduce_began = Instant::now();
            let mut grads = accumulator.grads();
            let done = match overlap {
                Some(overlap) => {
                    let (done, overlapped) = overlap.finish(&model.layers, &names, &mut grads, objective.gradient_reduction())?;
                    overlapped_sum += overlapped;
                    done
                }
                None => Default::default(),
            };
            let grads = dist::reduce_gradients(replica, &model, &names, grads, objective.gradient_reduction(), config.grad_reduce_dtype, &done)?;
            reduce_wait += reduce_began.elapsed().as_secs_f64();
            let (next, grad_norm) = match &mut loss_scale {
                // f16 loss scaling: an overflow halves the scale and skips the update (expected,
                // not warned; the scale is in the metrics).
                Some(s) => {
                    let out = optimizer.update_scaled(model, &names, grads, lr, s.scale);
                    s.update(out.1.is_finite());
                    out
                }
                None => optimizer.update(model, &names, grads, lr),
            };
            model = next;
            if let Some(shard) = &optimizer.shard {
                model = dist::gather_owned_weights(replica, model, &names, shard)?;
            }
            norm_sum += grad_norm;
            if let Some((n, total)) = optimizer.changed {
                let (n0, total0) = changed.unwrap_or_default();
                changed = Some((n0 + n, total0 + total));
            }
            if !grad_norm.is_finite() && loss_scale.is_none() {
                if skipped_total == 0 {
                    eprintln!("warning: step {}: gradient norm {grad_norm}; the update is skipped (counted as skipped_updates in the metrics; warned once)", step + 1);
                }
                skipped += 1;
                skipped_total += 1;
            }
        }
        if replica.world() > 1 {
            let held: usize = optimizer.moments.values().map(|m| 2 * m.exp_avg.dims()[0]).sum();
            metrics::OPTIMIZER_STATE_VALUES.set(&mut extras, held as u64);
            metrics::GRAD_REDUCE_WAIT_S.set(&mut extras, reduce_wait);
            metrics::GRAD_VALUES_OVERLAPPED.set(&mut extras, overlapped_sum as u64);
        }
        if optimizer.shard.is_some() {
            // Each replica counted the weights it updated.
            let all = replica.gather(json!(changed))?;
            let counts: Vec<(u64, u64)> = all.into_iter().filter_map(|c| serde_json::from_value(c).ok()).collect();
            changed = (!counts.is_empty()).then(|| counts.iter().fold((0, 0), |(n, t), (a, b)| (n + a, t + b)));
        }
        let (loss_sum, grad_norm) = (loss_sum / updates.len() as f64, norm_sum / updates.len() as f64);
        let update_seconds = update_began.elapsed().as_secs_f64();
        step += 1;
        // The step's loss and metrics over all replicas.
        metrics::LOSS.set(&mut extras, loss_sum);
        extras.extend(objective.step_metrics());
        if replica.world() > 1 {
            let all = replica.gather(Value::Object(extras))?;
            extras = dist::reduce_records(all, objective.gradient_reduction());
        }
        let loss_sum = extras.remove(metrics::LOSS.key()).and_then(|l| l.as_f64()).unwrap_or(loss_sum);

        let seconds = step_began.elapsed().as_secs_f64();
        let mut record = Record::new();
        metrics::STEP.set(&mut record, step);
        metrics::LOSS.set(&mut record, loss_sum);
        metrics::LR.set(&mut record, lr);
        metrics::GRAD_NORM.set(&mut record, grad_norm);
        if skipped_total > 0 {
            record.insert("skipped_updates".into(), json!(skipped));
        }
        if let Some((n, total)) = changed {
            metrics::WEIGHTS_CHANGED.set(&mut record, n as f64 / total.max(1) as f64);
        }
        if let Some(s) = &loss_scale {
            metrics::LOSS_SCALE.set(&mut record, s.scale);
        }
        if let Some(tokens) = metrics::TOKENS.get(&extras) {
            metrics::TOKENS_PER_S.set(&mut record, tokens / seconds);
            record.insert("update_tokens_per_s".into(), json!(tokens / update_seconds));
        }
        metrics::STEP_S.set(&mut record, seconds);
        record.insert("update_s".into(), json!(update_seconds));
        record.insert("elapsed_s".into(), json!(began.elapsed().as_secs_f64()));
        if let Some(rss) = rss_mib() {
            metrics::RSS_MIB.set(&mut record, rss);
        }
        record.extend(extras);
        let out_of_time = config.time_budget.is_some_and(|budget| began.elapsed() >= budget) && step < config.total_steps;
        // Rank 0's clock decides for every replica.
        let out_of_time = if replica.world() > 1 { replica.broadcast(json!(out_of_time))?.as_bool() == Some(true) } else { out_of_time };
        // The last step is evaluated; the one a time budget stops at when steps were chosen (a
        // run that only evaluates `every` n steps resumes to the metrics of an uninterrupted one).
        let stop_due = out_of_time && !config.eval_steps.is_empty();
        if (eval_due(step) || step == config.total_steps || stop_due) && evaluating && main {
            record.extend(evaluate(&inference(&model))?);
        }
        emit(&mut log, record)?;

        let saving = config.save.saves(step, config.total_steps) || out_of_time;
        if saving {
            dist::gather_owned_moments(replica, &model, &names, &mut optimizer)?;
        }
        if saving && main {
            let state = TrainerState {
                step,
                total_steps: config.total_steps,
                optimizer: optimizer.config,
                optimizer_step: optimizer.step,
                data: objective.state(),
                config: config.run_config.clone(),
                loss_scale,
            };
            // The metrics up to a checkpoint reach the disk before it does, so no crash leaves a
            // checkpoint whose steps' records are lost.
            if let Some(log) = &log {
                log.sync()?;
            }
            let path = config.out_dir.join(checkpoint::checkpoint_name(config.save.run_name.as_deref(), step));
            checkpoint::save(&path, &model, &optimizer, &state, config.companions.as_deref(), &config.companion_edits)?;
            summary.checkpoints.push(path);
        }
        if saving {
            // Rank 0 gathered the whole moments to write them.
            optimizer.keep_own_moments();
        }
        if out_of_time {
            summary.stopped_early = true;
            break;
        }
    }
    // Every replica ends here, after rank 0 wrote the last checkpoint.
    replica.barrier()?;
    summary.steps = step;
    summary.elapsed = began.elapsed();
    Ok((model, summary))
}

/// Adds the numbers of `metrics` into `into` (micro-batch metrics add up over a step).
fn add_metrics(into: &mut Record, metrics: Record) {
    for (key, value) in metrics {
        let sum = match (into.get(&key).and_then(Value::as_f64), value.as_f64()) {
            (Some(a), Some(b)) => json!(a + b),
            _ => value,
        };
        into.insert(key, sum);
    }
}

/// Reads a `metrics.jsonl` written by [`train`].
pub fn read_metrics(path: &Path) -> Result<Vec<Record>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| Error::json(path, Some(i + 1), e)))
        .collect()
}
