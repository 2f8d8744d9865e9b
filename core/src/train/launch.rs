//! The run skeleton both run families share ([`crate::train::run`]: pre-training and SFT;
//! [`crate::rl::run`]: GRPO and OPD): replicas launched over devices and nodes, then per replica
//! the output directory's lock, the start (resumed, fresh, or rank 0's state), what the family
//! reports once started, and the training loop. A family supplies only what differs: its data,
//! objective, evaluation and the model to start from ([`Prepared`]).

use burn::tensor::backend::AutodiffBackend;
use serde::Serialize;
use serde_json::Value;

use super::objective::Objective;
use super::config::OutputSection;
use super::trainer::{LoopConfig, Record, RunSummary, Start, refuse_fresh_over_checkpoints, train_replica};
use crate::dist::{self, NodeSpec, Replica};
use crate::error::{Error, Result};
use crate::model::Qwen2;

/// What one replica of a run needs, built by its family from the config.
pub struct Prepared<'a, B: AutodiffBackend, O> {
    pub loop_config: LoopConfig,
    pub objective: O,
    /// The model a fresh run starts from (`[model] init` or `from`).
    pub fresh: Box<dyn FnOnce() -> Result<Qwen2<B>> + 'a>,
    /// The evaluation at the loop's evaluation steps (rank 0; an empty record elsewhere).
    pub evaluate: Evaluate<'a, B>,
    /// Rank 0, once the run has started (its lock held, its checkpoint loaded): the data report
    /// for `on_data`, and files the family writes into the output directory.
    pub started: Box<dyn FnOnce() -> Result<Value> + 'a>,
}

/// The evaluation of a run: the inference model to a metrics record.
pub type Evaluate<'a, B> = Box<dyn FnMut(&Qwen2<<B as AutodiffBackend>::InnerBackend>) -> Result<Record> + 'a>;

/// Runs `config` of `family` with one replica per device of `devices` (and one process per node
/// with `nodes`, see [`crate::dist`]): `replica` prepares each replica; rank 0 sees `on_data`
/// (the report [`Prepared::started`] returns) and `on_record` (every metrics record), and writes
/// the output directory.
#[allow(clippy::too_many_arguments)] // the two run families' `run_replicated` plus what differs
pub fn replicated<B, O, C>(
    family: &str,
    config: &C,
    output: &OutputSection,
    devices: &[B::Device],
    nodes: Option<&NodeSpec>,
    resume: bool,
    on_data: impl FnOnce(&Value),
    mut on_record: impl FnMut(&Record),
    replica: impl for<'a> Fn(&'a C, &Replica, &'a B::Device) -> Result<Prepared<'a, B, O>> + Sync,
) -> Result<RunSummary>
where
    B: AutodiffBackend,
    O: Objective<B>,
    C: Serialize + Sync,
{
    // A fresh run into a directory that holds checkpoints is refused before the replicas prepare
    // (tokenizing data, loading the reference and teacher can take minutes); `Start::new` checks
    // again once it holds the directory's lock. (Across nodes, node 0 refuses there, after the
    // rendezvous, so that the other nodes hear why.)
    if !resume && nodes.is_none() {
        refuse_fresh_over_checkpoints(&output.dir, output.save_policy().run_name.as_deref())?;
    }
    let text = serde_json::to_string(config).map_err(|e| Error::InvalidInput(e.to_string()))?;
    let fingerprint = dist::fingerprint(&[family, &text, &devices.len().to_string(), &resume.to_string()]);
    let mut on_data = Some(on_data);
    let replica = &replica;
    dist::launch(
        devices,
        nodes,
        &fingerprint,
        |r, device| {
            let prepared = replica(config, &r, device)?;
            run_replica(prepared, &r, device, resume, &mut |data| on_data.take().into_iter().for_each(|f| f(data)), &mut on_record)
        },
        |r, device| run_replica(replica(config, &r, device)?, &r, device, resume, &mut |_| {}, &mut |_| {}),
    )
}

/// One replica: rank 0 takes the output directory's lock (one writer per directory) and resumes
/// or refuses to overwrite; the others start from its state ([`dist::sync_start`]).
fn run_replica<B: AutodiffBackend, O: Objective<B>>(
    prepared: Prepared<'_, B, O>,
    replica: &Replica,
    device: &B::Device,
    resume: bool,
    on_data: &mut dyn FnMut(&Value),
    on_record: &mut dyn FnMut(&Record),
) -> Result<RunSummary> {
    let Prepared { loop_config, mut objective, fresh, evaluate, started } = prepared;
    let _lock = replica.is_main().then(|| crate::io::lock_dir(&loop_config.out_dir)).transpose()?;
    let start = match replica.is_main() {
        true => Start::<B>::new(&loop_config, resume, &mut objective, device, fresh)?,
        false => Start::<B>::fresh(&loop_config, device, fresh)?,
    };
    if replica.is_main() {
        on_data(&started()?);
    }
    let (_, summary) = train_replica(start, &mut objective, &loop_config, replica, evaluate, on_record)?;
    Ok(summary)
}
