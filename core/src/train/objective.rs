//! What the training loop optimises. The loop asks an [`Objective`] for the optimizer updates of
//! each step (each a list of micro-batches) and for each micro-batch's loss; it never knows
//! whether it runs pre-training, SFT, GRPO or distillation.

use burn::tensor::{Tensor, backend::AutodiffBackend};
use burn::tensor::ElementConversion;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde_json::{Map, Value, json};

use crate::data::{Sample, TrainBatch, collate, collate_packed, collate_rows};
use crate::dist::Reduce;
use crate::error::{Error, Result};
use crate::model::Qwen2;
use crate::model::logprobs::{target_logprobs, target_scores};

/// A loss for the training loop.
pub trait Objective<B: AutodiffBackend> {
    /// A micro-batch, ready for [`Objective::loss`].
    type Micro;

    /// The optimizer updates of step `step`, each a list of micro-batches. Pre-training and SFT
    /// take one update per step; an RL objective rolls out here with the current `model` and may
    /// split the rollouts into several updates (verl's `ppo_mini_batch_size`), all prepared
    /// before the first of them runs.
    fn updates(&mut self, model: &Qwen2<B>, step: u64) -> Result<Vec<Vec<Self::Micro>>>;

    /// The loss of one micro-batch, scaled so that the gradients of an update's micro-batches
    /// simply add up to the update's gradient, with metrics that add up over the step.
    fn loss(&mut self, model: &Qwen2<B>, micro: &Self::Micro) -> Result<(Tensor<B, 1>, Map<String, Value>)>;

    /// Metrics of the whole step (rollout statistics, say), logged after its updates.
    fn step_metrics(&mut self) -> Map<String, Value> {
        Map::new()
    }

    /// The data cursor and random state to put in a checkpoint.
    fn state(&self) -> Value;

    /// Continues from a checkpoint's [`Objective::state`].
    fn restore(&mut self, state: &Value) -> Result<()>;

    /// How data-parallel replicas combine their gradients (and losses): the mean (default)
    /// when each replica's loss is a mean over its own share, the sum when it is already
    /// scaled for the global batch.
    fn gradient_reduction(&self) -> Reduce {
        Reduce::Mean
    }
}

/// Next-token cross-entropy on the targets of [`Sample`]s (pre-training and SFT).
///
/// Samples are visited in an order shuffled per epoch (seeded). A step takes `micro_batch ×
/// accumulation` samples; its loss is the sum of target-token losses over the whole step divided
/// by the step's number of target tokens (HF Trainer's `num_items_in_batch` weighting).
///
/// As replica `rank` of `world` ([`NextTokenLoss::shard`]), a step takes `world` times as many
/// samples in the same order, this replica computes the loss of its consecutive share, and
/// every share is divided by the target tokens of the whole step: the replicas' gradients add
/// up to those of one device taking the whole step.
pub struct NextTokenLoss {
    /// Training rows: one sample each, or the documents of a packed bin (laid end to end,
    /// attention within each).
    samples: Vec<Vec<Sample>>,
    micro_batch: usize,
    accumulation: usize,
    pad_id: u32,
    seed: u64,
    /// Samples consumed since the start (by all replicas).
    cursor: u64,
    order: Vec<usize>,
    epoch: u64,
    rank: usize,
    world: usize,
    /// Micro-batches packed into one row each ([`collate_packed`]) instead of padded.
    padding_free: bool,
}

impl NextTokenLoss {
    pub fn new(samples: Vec<Sample>, micro_batch: usize, accumulation: usize, pad_id: u32, seed: u64) -> Result<Self> {
        Self::packed(samples.into_iter().map(|s| vec![s]).collect(), micro_batch, accumulation, pad_id, seed)
    }

    /// [`NextTokenLoss::new`] over rows of several documents each (packed bins, as
    /// `data::packing::pack_ffd_documents` or `first_fit_decreasing` make them): each row is one
    /// sample of a micro-batch, its documents laid end to end without attention between them
    /// (LLaMA-Factory's `neat_packing`). Rows of one document are [`NextTokenLoss::new`]'s.
    pub fn packed(samples: Vec<Vec<Sample>>, micro_batch: usize, accumulation: usize, pad_id: u32, seed: u64) -> Result<Self> {
        if samples.is_empty() || samples.iter().any(Vec::is_empty) || micro_batch == 0 || accumulation == 0 {
            return Err(Error::InvalidInput("training needs samples and a positive batch size".into()));
        }
        let mut objective = Self { samples, micro_batch, accumulation, pad_id, seed, cursor: 0, order: Vec::new(), epoch: 0, rank: 0, world: 1, padding_free: false };
        objective.shuffle(0);
        Ok(objective)
    }

    /// This objective as data-parallel replica `rank` of `world`.
    pub fn shard(mut self, rank: usize, world: usize) -> Self {
        (self.rank, self.world) = (rank, world.max(1));
        self
    }

    /// Packs each micro-batch's samples into one row without padding ([`collate_packed`]: TRL's
    /// `padding_free`), with the same loss as padded micro-batches.
    pub fn padding_free(mut self, on: bool) -> Self {
        self.padding_free = on;
        self
    }

    /// Samples per optimizer update (of this replica).
    pub fn samples_per_step(&self) -> usize {
        self.micro_batch * self.accumulation
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether there are no samples (never true for a constructed objective).
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    fn shuffle(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.order = (0..self.samples.len()).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(epoch);
        self.order.shuffle(&mut rng);
    }

    fn next_sample(&mut self) -> &[Sample] {
        let n = self.samples.len() as u64;
        let epoch = self.cursor / n;
        if epoch != self.epoch {
            self.shuffle(epoch);
        }
        let index = self.order[(self.cursor % n) as usize];
        self.cursor += 1;
        &self.samples[index]
    }
}

/// One micro-batch of [`NextTokenLoss`], with the step's total target count.
pub struct NextTokenMicro<B: AutodiffBackend> {
    pub batch: TrainBatch<B>,
    pub step_targets: usize,
}

impl<B: AutodiffBackend> Objective<B> for NextTokenLoss {
    type Micro = NextTokenMicro<B>;

    fn updates(&mut self, model: &Qwen2<B>, _step: u64) -> Result<Vec<Vec<Self::Micro>>> {
        let device = model.device();
        // The whole step's target count (every replica's share), and this replica's share.
        let mut step_targets = 0;
        let mut groups = Vec::with_capacity(self.accumulation);
        for rank in 0..self.world {
            for _ in 0..self.accumulation {
                let group: Vec<Vec<Sample>> = (0..self.micro_batch).map(|_| self.next_sample().to_vec()).collect();
                step_targets += group.iter().flatten().map(Sample::num_targets).sum::<usize>();
                if rank == self.rank {
                    groups.push(group);
                }
            }
        }
        let micros = groups
            .iter()
            .map(|g| {
                let batch = match self.padding_free {
                    true => collate_packed(&g.concat(), self.pad_id, &device)?,
                    false => collate_rows(g, self.pad_id, &device)?,
                };
                Ok(NextTokenMicro { batch, step_targets: step_targets.max(1) })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(vec![micros])
    }

    fn loss(&mut self, model: &Qwen2<B>, micro: &Self::Micro) -> Result<(Tensor<B, 1>, Map<String, Value>)> {
        let batch = &micro.batch;
        let logprobs = target_logprobs(model, model.forward_hidden(&batch.inputs, None), batch.labels.clone());
        let nll = -(logprobs * batch.label_mask.clone().float()).sum();
        let loss = nll / micro.step_targets as f64;
        let mut metrics = Map::new();
        super::metrics::TOKENS.set(&mut metrics, batch.num_tokens);
        super::metrics::TARGETS.set(&mut metrics, batch.num_targets);
        Ok((loss, metrics))
    }

    fn gradient_reduction(&self) -> Reduce {
        Reduce::Sum
    }

    fn state(&self) -> Value {
        json!({ "cursor": self.cursor, "seed": self.seed, "samples": self.samples.len() })
    }

    fn restore(&mut self, state: &Value) -> Result<()> {
        let cursor = state["cursor"].as_u64().ok_or_else(|| Error::InvalidInput("checkpoint has no data cursor".into()))?;
        if state["samples"].as_u64() != Some(self.samples.len() as u64) || state["seed"].as_u64() != Some(self.seed) {
            return Err(Error::InvalidInput(format!(
                "the checkpoint was trained on other data ({} samples in the order of seed {}; now {} samples, seed {}): the data's order follows its rows and seed, so not even --allow-config-change continues it; resume with the same data and seed, or start a new run",
                state["samples"], state["seed"], self.samples.len(), self.seed
            )));
        }
        self.cursor = cursor;
        self.shuffle(cursor / self.samples.len() as u64);
        Ok(())
    }
}

/// Mean next-token loss of `samples` under `model` (no gradients), in batches of `batch`.
pub fn evaluate_loss<B: burn::tensor::backend::Backend>(model: &Qwen2<B>, samples: &[Sample], batch: usize, pad_id: u32) -> Result<f64> {
    let device = model.device();
    let (mut nll, mut count) = (0.0f64, 0usize);
    for chunk in samples.chunks(batch.max(1)) {
        let batch = collate::<B>(chunk, pad_id, &device)?;
        let (logprobs, _) = target_scores(model, model.forward_hidden(&batch.inputs, None), batch.labels.clone(), false);
        let sum: f64 = (logprobs * batch.label_mask.clone().float()).sum().into_scalar().elem::<f64>();
        nll -= sum;
        count += batch.num_targets;
    }
    Ok(nll / count.max(1) as f64)
}

