//! Training metrics: one JSON object per line (`metrics.jsonl`), flushed as written.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// A metric that more than one layer names (the loop, an objective, the replicas' reduction,
/// the CLI's progress lines, `kiln plot train`): its key in `metrics.jsonl`, written once here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Metric(pub &'static str);

impl Metric {
    /// Its key in a record.
    pub const fn key(self) -> &'static str {
        self.0
    }

    /// Sets it in `record`.
    pub fn set(self, record: &mut Map<String, Value>, value: impl Into<Value>) {
        record.insert(self.0.into(), value.into());
    }

    /// Its value in `record`, if a number.
    pub fn get(self, record: &Map<String, Value>) -> Option<f64> {
        record.get(self.0).and_then(Value::as_f64)
    }
}

/// Values of AdamW state (both moments) a data-parallel replica holds, the mean over the
/// replicas: the whole model's twice over, or `1 / world` of that with `[train] shard_optimizer`.
pub const OPTIMIZER_STATE_VALUES: Metric = Metric("optimizer_state_values");
/// Data parallel: seconds a step waited for its gradients' all-reduce after the backward passes
/// (what overlapping did not hide).
pub const GRAD_REDUCE_WAIT_S: Metric = Metric("grad_reduce_wait_s");
/// Data parallel: gradient values handed to the all-reduce while the backward pass ran (`[train]
/// overlap_grad_reduce`; 0 where the sums wait for it).
pub const GRAD_VALUES_OVERLAPPED: Metric = Metric("grad_values_overlapped");
/// The optimizer step a record belongs to (0: the evaluation before training).
pub const STEP: Metric = Metric("step");
/// The training loss of the step (mean over its updates).
pub const LOSS: Metric = Metric("loss");
pub const LR: Metric = Metric("lr");
/// The gradient norm before clipping.
pub const GRAD_NORM: Metric = Metric("grad_norm");
/// Tokens the step trained on (summed over replicas), and its rate.
pub const TOKENS: Metric = Metric("tokens");
pub const TOKENS_PER_S: Metric = Metric("tokens_per_s");
/// Target tokens of the next-token loss (summed over replicas).
pub const TARGETS: Metric = Metric("targets");
/// Prompts and responses of an RL step, and the tokens rolled out (summed over replicas).
pub const PROMPTS: Metric = Metric("prompts");
pub const RESPONSES: Metric = Metric("responses");
pub const ROLLOUT_TOKENS: Metric = Metric("rollout_tokens");
/// Held-out loss and greedy accuracy (pre-training and SFT).
pub const EVAL_LOSS: Metric = Metric("eval_loss");
pub const EVAL_ACCURACY: Metric = Metric("eval_accuracy");
/// The mean reward of an RL step's responses.
pub const REWARD_MEAN: Metric = Metric("reward_mean");
/// The KL to the reference model and (OPD) to the teacher, per token.
pub const KL_REF: Metric = Metric("kl_ref");
pub const TEACHER_KL: Metric = Metric("teacher_kl");
/// Validation accuracy in distribution and out of it (RL and OPD).
pub const VAL_ACCURACY_ID: Metric = Metric("val_accuracy_id");
pub const VAL_ACCURACY_OOD: Metric = Metric("val_accuracy_ood");
/// Seconds of the step, and the process's resident memory after it.
pub const STEP_S: Metric = Metric("step_s");
pub const RSS_MIB: Metric = Metric("rss_mib");
/// bf16-pure training: the share of weights the update changed; f16-mixed: the loss scale.
pub const WEIGHTS_CHANGED: Metric = Metric("weights_changed");
pub const LOSS_SCALE: Metric = Metric("loss_scale");
/// RL: the rollout's tokens per second, the share of groups whose rewards all agree, the mean
/// response length, and the largest |learner − rollout| log-prob difference of a token.
pub const ROLLOUT_TOKENS_PER_S: Metric = Metric("rollout_tokens_per_s");
pub const FRAC_ZERO_STD_GROUPS: Metric = Metric("frac_zero_std_groups");
pub const RESPONSE_LENGTH_MEAN: Metric = Metric("response_length_mean");
pub const LOGPROB_DIFF_MAX: Metric = Metric("logprob_diff_max");

/// Counts that replicas add up (every other number is averaged, or taken at its extreme:
/// [`crate::dist::reduce_records`]).
pub const SUMMED: [Metric; 5] = [TOKENS, TARGETS, PROMPTS, RESPONSES, ROLLOUT_TOKENS];

/// Appends metric records to a JSONL file.
pub struct MetricsLog {
    path: PathBuf,
    file: File,
}

impl MetricsLog {
    /// Opens `path` for appending. Records of steps after `resume_step` (left by a run that died
    /// after its last checkpoint) are dropped first, so a resumed run's log reads as one run. A
    /// fresh start (`None`) keeps an earlier run's records beside it, at `<name>.prev` (or
    /// `.prev-2`, …): a run that died before its first checkpoint leaves nothing else.
    pub fn open(path: &Path, resume_step: Option<u64>) -> Result<Self> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        match resume_step {
            Some(step) if path.is_file() => {
                let file = File::open(path).map_err(|e| Error::io(path, e))?;
                let mut kept = String::new();
                for line in BufReader::new(file).lines() {
                    let line = line.map_err(|e| Error::io(path, e))?;
                    let record_step = serde_json::from_str::<Value>(&line).ok().and_then(|v| v[STEP.key()].as_u64());
                    if record_step.is_some_and(|s| s <= step) {
                        kept.push_str(&line);
                        kept.push('\n');
                    }
                }
                crate::io::write_atomic(path, &kept)?;
            }
            None if path.metadata().is_ok_and(|m| m.is_file() && m.len() > 0) => {
                super::checkpoint::set_aside_as(path, "prev")?;
            }
            None if path.is_file() => std::fs::remove_file(path).map_err(|e| Error::io(path, e))?,
            _ => {}
        }
        let file = OpenOptions::new().create(true).append(true).open(path).map_err(|e| Error::io(path, e))?;
        Ok(Self { path: path.to_path_buf(), file })
    }

    /// Flushes the records written so far to the disk (with each checkpoint).
    pub fn sync(&self) -> Result<()> {
        self.file.sync_data().map_err(|e| Error::io(&self.path, e))
    }

    /// Writes one record.
    pub fn write(&mut self, record: &Map<String, Value>) -> Result<()> {
        let line = serde_json::to_string(record).map_err(|e| Error::json(&self.path, None, e))?;
        writeln!(self.file, "{line}").map_err(|e| Error::io(&self.path, e))
    }
}

/// Resident set size of this process in MiB (Linux; `None` elsewhere).
pub fn rss_mib() -> Option<f64> {
    status_mib("VmRSS:")
}

/// The largest resident set size this process has had, in MiB (Linux; `None` elsewhere).
pub fn peak_rss_mib() -> Option<f64> {
    status_mib("VmHWM:")
}

/// The part of this process's resident set that maps files (its binary and libraries) rather
/// than memory it allocated, in MiB (Linux; `None` elsewhere). How much of a large binary is
/// resident depends on the page cache, so peaks compare better without it.
pub fn file_rss_mib() -> Option<f64> {
    status_mib("RssFile:")
}

fn status_mib(key: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}
