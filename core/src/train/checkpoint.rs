//! Training checkpoints: a Hugging Face model directory (loadable by `transformers`) plus what a
//! resumed run needs: `optimizer.safetensors` (AdamW moments, f32, exact) and
//! `trainer_state.json` (step, optimizer step count, data cursor, run config).
//!
//! A checkpoint is written into a temporary sibling directory and renamed into place, so a
//! crash mid-write leaves the previous checkpoints intact and never a half-written one.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::{Tensor, TensorData, backend::Backend};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::adamw::{AdamW, AdamWConfig, Moments};
use super::config::{Family, defaults};
use super::precision::LossScale;
use crate::error::{Error, Result};
use crate::model::Qwen2;
use crate::model::hf;

const OPTIMIZER_FILE: &str = "optimizer.safetensors";
const STATE_FILE: &str = "trainer_state.json";

/// Everything of a run's progress besides weights and moments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Optimizer updates completed.
    pub step: u64,
    /// Total updates the run was planned for.
    pub total_steps: u64,
    pub optimizer: AdamWConfig,
    /// Updates the optimizer has taken (bias correction).
    pub optimizer_step: u64,
    /// The objective's data cursor and random state (opaque to the loop).
    pub data: Value,
    /// The run's configuration, for the record.
    pub config: Value,
    /// f16 loss scaling's state (f16-mixed runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<LossScale>,
}

/// A checkpoint's directory name: `checkpoint-<step>` without a run name, `<run>_step<step>`
/// with one (the release's `op11_14_step20`), `step<step>` for an empty one.
pub fn checkpoint_name(run: Option<&str>, step: u64) -> String {
    format!("{}{step}", name_prefix(run))
}

fn name_prefix(run: Option<&str>) -> String {
    match run {
        None => "checkpoint-".into(),
        Some("") => "step".into(),
        Some(run) => format!("{run}_step"),
    }
}

/// The metrics file of a run: `metrics.jsonl`, or `<run>_metrics.jsonl` for a non-empty run name.
pub fn metrics_name(run: Option<&str>) -> String {
    match run {
        None | Some("") => "metrics.jsonl".into(),
        Some(run) => format!("{run}_metrics.jsonl"),
    }
}

/// Writes a checkpoint of `model` and `optimizer` at `path` (atomically; `path` must not exist),
/// with the `companions` directory's tokenizer files, changed by `edits`.
pub fn save<B: Backend, OB: Backend>(
    path: &Path,
    model: &Qwen2<B>,
    optimizer: &AdamW<OB>,
    state: &TrainerState,
    companions: Option<&Path>,
    edits: &hf::CompanionEdits,
) -> Result<()> {
    // Weights computed after a device failure are not written.
    kiln_backends::device::check::<B>(&model.device())?;
    // (a 1.5B model's weights and AdamW moments are ~18 GB: seconds to minutes)
    let stage = crate::progress::file_stage("saving weights and optimizer state of", path, 2, "files");
    hf::write_atomically(path, |tmp| {
        // In the weights' own dtype (f32 masters, or bf16-pure's bf16): exact either way.
        hf::write_model_files(model, tmp, model.dtype(), companions)?;
        edits.apply(tmp)?;
        stage.set_position(1);
        let mut moments: Vec<(&String, &Moments<OB>)> = optimizer.moments.iter().collect();
        moments.sort_by_key(|(name, _)| name.as_str());
        let tensors = moments.into_iter().flat_map(|(name, m)| {
            [("exp_avg", &m.exp_avg), ("exp_avg_sq", &m.exp_avg_sq)].map(|(kind, t)| {
                let values = t.clone().into_data().convert::<f32>().into_vec::<f32>().expect("f32");
                (format!("{name}.{kind}"), vec![values.len()], values)
            })
        });
        hf::write_f32_safetensors(&tmp.join(OPTIMIZER_FILE), tensors)?;
        let path = tmp.join(STATE_FILE);
        let text = serde_json::to_string_pretty(state).map_err(|e| Error::json(&path, None, e))?;
        std::fs::write(&path, text + "\n").map_err(|e| Error::io(&path, e))
    })
}

/// The checkpoint of `dir` with the highest step that has a trainer state, if any.
pub fn latest(dir: &Path) -> Result<Option<(u64, PathBuf)>> {
    latest_named(dir, None)
}

/// [`latest`] among the checkpoints named for `run` (see [`checkpoint_name`]).
pub fn latest_named(dir: &Path, run: Option<&str>) -> Result<Option<(u64, PathBuf)>> {
    Ok(all_named(dir, run)?.into_iter().find(|(_, path)| path.join(STATE_FILE).is_file()))
}

/// The checkpoint directories of `dir` named for `run`, newest first. One without a trainer
/// state is a damaged checkpoint (kiln writes them whole): a resume sets it aside, a fresh run
/// is refused, as for any other checkpoint that does not load.
pub fn all_named(dir: &Path, run: Option<&str>) -> Result<Vec<(u64, PathBuf)>> {
    let prefix = name_prefix(run);
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        let step = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(prefix.as_str()))
            .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse::<u64>().ok());
        if let Some(step) = step.filter(|_| path.is_dir()) {
            found.push((step, path));
        }
    }
    found.sort_by_key(|(step, _)| std::cmp::Reverse(*step));
    Ok(found)
}

/// Moves a checkpoint that cannot be loaded out of the run's way, to `<name>.corrupt` (or
/// `<name>.corrupt-2`, …), keeping it for inspection; returns where it went.
pub fn set_aside(path: &Path) -> Result<PathBuf> {
    set_aside_as(path, "corrupt")
}

/// Moves `path` to `<name>.<tag>` (or `<name>.<tag>-2`, …, the first that is free); returns
/// where it went.
pub fn set_aside_as(path: &Path, tag: &str) -> Result<PathBuf> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let aside = (1..)
        .map(|i| path.with_file_name(if i == 1 { format!("{name}.{tag}") } else { format!("{name}.{tag}-{i}") }))
        .find(|p| !p.exists())
        .expect("an unused name");
    std::fs::rename(path, &aside).map_err(|e| Error::io(path, e))?;
    Ok(aside)
}

/// The checkpoint directory of `dir` saved after `step`, under any of [`checkpoint_name`]'s
/// forms (`checkpoint-60`, `step60`, `<run>_step60`); an error naming `dir` and the step when
/// there is none or more than one.
pub fn at_step(dir: &Path, step: u64) -> Result<PathBuf> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut found = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        let digits = name.strip_prefix("checkpoint-").or_else(|| name.rsplit_once("step").map(|(_, d)| d));
        let at = digits.filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())).and_then(|d| d.parse::<u64>().ok());
        if at == Some(step) && path.is_dir() {
            found.push(path);
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(Error::data(dir, None, format!("no checkpoint of step {step} (checkpoint-{step}, step{step} or <run>_step{step})"))),
        _ => Err(Error::data(dir, None, format!("several checkpoints of step {step}: {}", found.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")))),
    }
}

/// Reads the trainer state and optimizer of a checkpoint (the model loads with
/// [`hf::load`]).
pub fn load_state<B: Backend>(path: &Path, device: &B::Device) -> Result<(TrainerState, AdamW<B>)> {
    let state_path = path.join(STATE_FILE);
    let text = std::fs::read_to_string(&state_path).map_err(|e| Error::io(&state_path, e))?;
    let state: TrainerState = serde_json::from_str(&text).map_err(|e| Error::json(&state_path, None, e))?;
    let tensors = hf::read_f32_safetensors(&path.join(OPTIMIZER_FILE))?;
    let mut halves: HashMap<String, (Option<Tensor<B, 1>>, Option<Tensor<B, 1>>)> = HashMap::new();
    let file = path.join(OPTIMIZER_FILE);
    for (key, (shape, values)) in tensors {
        if shape.len() != 1 {
            return Err(Error::checkpoint(&file, format!("optimizer tensor {key} has shape {shape:?}; moments are stored flat")));
        }
        let tensor = Tensor::from_data(TensorData::new(values, shape), device);
        let (name, kind) = key.rsplit_once('.').ok_or_else(|| Error::checkpoint(path, format!("bad optimizer tensor name {key}")))?;
        let entry = halves.entry(name.to_string()).or_default();
        match kind {
            "exp_avg" => entry.0 = Some(tensor),
            "exp_avg_sq" => entry.1 = Some(tensor),
            _ => return Err(Error::checkpoint(path, format!("bad optimizer tensor name {key}"))),
        }
    }
    let mut optimizer = AdamW::new(state.optimizer);
    optimizer.step = state.optimizer_step;
    for (name, pair) in halves {
        match pair {
            (Some(exp_avg), Some(exp_avg_sq)) => {
                optimizer.moments.insert(name, Moments { exp_avg, exp_avg_sq });
            }
            _ => return Err(Error::checkpoint(path, format!("optimizer state of {name} is incomplete"))),
        }
    }
    Ok((state, optimizer))
}

/// Checks that the optimizer state of the checkpoint at `path` belongs to `model`: moments for
/// exactly the model's parameters, each of the parameter's size. (A mismatch — another model's
/// checkpoint, or an edited one — would otherwise fail inside the first update, or silently
/// restart some moments from zero.)
pub fn check_moments<B: Backend, OB: Backend>(path: &Path, model: &Qwen2<B>, optimizer: &AdamW<OB>) -> Result<()> {
    let file = path.join(OPTIMIZER_FILE);
    let mut sizes = Sizes { names: model.param_names(), sizes: BTreeMap::new() };
    model.visit(&mut sizes);
    let sizes = sizes.sizes;
    let mut unknown: Vec<&String> = optimizer.moments.keys().filter(|name| !sizes.contains_key(*name)).collect();
    unknown.sort();
    if let Some(name) = unknown.first() {
        return Err(Error::checkpoint(&file, format!(
            "has moments for {} parameter(s) the model does not have (first: {name}); it belongs to another model",
            unknown.len()
        )));
    }
    for (name, moments) in &optimizer.moments {
        let (size, found) = (sizes[name], [moments.exp_avg.dims()[0], moments.exp_avg_sq.dims()[0]]);
        if found != [size, size] {
            return Err(Error::checkpoint(&file, format!("moments of {name} have {found:?} values; the parameter has {size}")));
        }
    }
    let missing: Vec<&String> = sizes.keys().filter(|name| !optimizer.moments.contains_key(*name)).collect();
    if let Some(name) = missing.first() {
        return Err(Error::checkpoint(&file, format!(
            "has moments for {} of the model's {} parameters (missing: {name}{})",
            optimizer.moments.len(),
            sizes.len(),
            if missing.len() > 1 { ", …" } else { "" }
        )));
    }
    Ok(())
}

/// Each parameter's number of values, by HF name.
struct Sizes {
    names: HashMap<ParamId, String>,
    sizes: BTreeMap<String, usize>,
}

impl<B: Backend> ModuleVisitor<B> for Sizes {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(name) = self.names.get(&param.id) {
            self.sizes.insert(name.clone(), param.val().shape().num_elements());
        }
    }
}

/// Settings a resumed run may change without `--allow-config-change`: where and how often it
/// saves and evaluates, how long it runs (`steps`/`epochs`: the new total is warned about),
/// recomputation, optimizer sharding (memory only), the all-reduce's overlap (speed only), the
/// devices (the number of replicas, which sets a pre-training or SFT step's samples, is compared
/// on its own: [`RunRecord::replicas`]), the rollout engine's memory and batching (a sample
/// depends on neither) and the sandbox layers code rewards run under (how the machine contains
/// programs, not what they score; recorded in `environment.json`).
const RESUMABLE: &[&str] = &[
    "output",
    "eval",
    "train.steps",
    "train.epochs",
    "train.recompute",
    "train.shard_optimizer",
    "train.overlap_grad_reduce",
    "train.devices",
    "rollout.batch_size",
    "rollout.max_prefill_tokens",
    "rollout.kv_memory",
    "task.sandbox_without",
    "task.sandbox_landlock_abi",
];

/// What a checkpoint records of its run besides the config, compared on resume where both the
/// checkpoint and the run have it (checkpoints from before a key was recorded lack it).
pub struct RunRecord;

impl RunRecord {
    /// The number of data-parallel replicas (a pre-training or SFT step takes `micro_batch ×
    /// grad_accum` samples on each).
    pub const REPLICAS: &'static str = "replicas";
    /// [`data_fingerprint`] of the data the run trains on.
    pub const DATA: &'static str = "data_fingerprint";
}

/// A short hash of the data a run trains on (each part's length and words: the samples' token
/// ids and targets, the prompts' ids and gold), recorded in its checkpoints so that a resume on
/// data changed in place (the same number of rows) is a changed setting. FNV-1a over 64-bit
/// words: stable across builds and machines.
pub fn data_fingerprint<I: IntoIterator<Item = u64>>(parts: impl IntoIterator<Item = I>) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut mix = |word: u64| hash = (hash ^ word).wrapping_mul(0x0000_0100_0000_01b3);
    for part in parts {
        let mut len = 0u64;
        for word in part {
            mix(word);
            len += 1;
        }
        mix(len);
    }
    format!("{hash:016x}")
}

/// The settings of the run config `current` that differ from `saved` (both a run's
/// `{"config": …}` record, as stored in `trainer_state.json`), as `name old → new`, in name
/// order; the ones in [`RESUMABLE`] are not compared. Paths that name the same file on disk are
/// equal. Empty when either has no `config` (a checkpoint written without one).
pub fn config_changes(saved: &Value, current: &Value) -> Vec<String> {
    let (Some(old), Some(new)) = (saved.get("config"), current.get("config")) else { return Vec::new() };
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    flatten(String::new(), old, &mut a);
    flatten(String::new(), new, &mut b);
    // SFT runs from before `[data] chat_template` rendered their rows in ChatML.
    if a.get("data.kind").and_then(Value::as_str) == Some("sft") {
        a.entry("data.chat_template".into()).or_insert_with(|| Value::from("chatml"));
    }
    // (a policy-gradient run's config has a [rollout])
    let family = if new.get("rollout").is_some() { Family::PolicyGradient } else { Family::NextToken };
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let shown = |v: Option<&Value>| v.map_or_else(|| "(unset)".to_string(), Value::to_string);
    let mut changes: Vec<String> = keys
        .into_iter()
        .filter(|k| !RESUMABLE.iter().any(|p| k.as_str() == *p || k.starts_with(&format!("{p}."))))
        .filter(|k| !same_setting(a.get(*k), b.get(*k)))
        .filter(|k| !(a.get(*k).is_none() && b.get(*k).is_some_and(|v| is_the_default(family, k, v))))
        .map(|k| format!("{k} {} → {}", shown(a.get(k)), shown(b.get(k))))
        .collect();
    let recorded = |key: &str| saved.get(key).zip(current.get(key)).filter(|(old, new)| old != new);
    // (a checkpoint from before the replicas were recorded ran on its config's devices, if it names them)
    let saved_replicas = saved.get(RunRecord::REPLICAS).cloned().or_else(|| a.get("train.devices").and(old.pointer("/train/devices")).and_then(Value::as_array).map(|d| Value::from(d.len())));
    if let Some((old, new)) = saved_replicas.zip(current.get(RunRecord::REPLICAS)).filter(|(old, new)| old != *new) {
        changes.push(format!("replicas {old} → {new} (a step's samples are micro_batch × grad_accum × replicas)"));
    }
    if let Some((old, new)) = recorded(RunRecord::DATA) {
        changes.push(format!("the data's contents (fingerprint {} → {})", old.as_str().unwrap_or_default(), new.as_str().unwrap_or_default()));
    }
    changes
}

/// Whether `value` is what a config of `family` takes for the setting `name` when the file
/// leaves it out ([`crate::train::config::defaults`]): a checkpoint written before defaults were
/// recorded has the setting unset, and resuming it under the same file changes nothing.
fn is_the_default(family: Family, name: &str, value: &Value) -> bool {
    let table: toml::Table = defaults::text(family).parse().expect("the defaults are TOML");
    let mut node = Some(toml::Value::Table(table));
    for part in name.split('.') {
        node = node.and_then(|n| n.get(part).cloned());
    }
    node.and_then(|d| serde_json::to_value(d).ok()).is_some_and(|d| same_setting(Some(&d), Some(value)))
}

/// Leaves of `value` by dotted name (`optimizer.lr`); nulls are unset settings and left out.
fn flatten(prefix: String, value: &Value, out: &mut BTreeMap<String, Value>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                let name = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                flatten(name, value, out);
            }
        }
        Value::Null => {}
        leaf => {
            out.insert(prefix, leaf.clone());
        }
    }
}

fn same_setting(a: Option<&Value>, b: Option<&Value>) -> bool {
    match (a, b) {
        (Some(Value::String(x)), Some(Value::String(y))) if x != y => {
            let canonical = |p: &str| std::fs::canonicalize(p).ok();
            canonical(x).is_some_and(|c| Some(c) == canonical(y))
        }
        (Some(Value::Number(x)), Some(Value::Number(y))) => x.as_f64() == y.as_f64(),
        (a, b) => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_step_finds_every_naming_and_names_what_is_missing() {
        let tmp = tempfile::tempdir().unwrap();
        for name in ["checkpoint-60", "checkpoint-600", "op11_14_step120", "step841", "step9.txt"] {
            std::fs::create_dir(tmp.path().join(name)).unwrap();
        }
        assert_eq!(at_step(tmp.path(), 60).unwrap(), tmp.path().join("checkpoint-60"));
        assert_eq!(at_step(tmp.path(), 120).unwrap(), tmp.path().join("op11_14_step120"));
        assert_eq!(at_step(tmp.path(), 841).unwrap(), tmp.path().join("step841"));
        let err = at_step(tmp.path(), 9).unwrap_err().to_string();
        assert!(err.contains("no checkpoint of step 9") && err.contains(&tmp.path().display().to_string()), "{err}");
        std::fs::create_dir(tmp.path().join("step60")).unwrap();
        assert!(at_step(tmp.path(), 60).unwrap_err().to_string().contains("several checkpoints of step 60"));
    }
}

#[cfg(test)]
mod config_change_tests {
    use super::config_changes;
    use serde_json::json;

    #[test]
    fn sft_checkpoints_from_before_the_chat_template_key_rendered_chatml() {
        let saved = json!({"config": {"data": {"kind": "sft", "path": "rows.jsonl"}}});
        let mut current = saved.clone();
        current["config"]["data"]["chat_template"] = json!("chatml");
        assert!(config_changes(&saved, &current).is_empty());
        current["config"]["data"]["chat_template"] = json!("/m/chat_template.jinja");
        assert_eq!(config_changes(&saved, &current), ["data.chat_template \"chatml\" → \"/m/chat_template.jinja\""]);
    }

    #[test]
    fn changed_settings_are_listed_and_resumable_ones_are_not() {
        let saved = json!({"config": {
            "model": {"init": "a.json", "seed": 1},
            "optimizer": {"lr": 5e-4, "betas": [0.9, 0.95]},
            "schedule": {"kind": "cosine", "warmup_steps": 10},
            "train": {"steps": 100, "precision": "f32", "seed": 3},
            "output": {"dir": "out", "save_steps": 10.0},
        }, "samples": 10});
        let mut current = saved.clone();
        assert!(config_changes(&saved, &current).is_empty());
        current["config"]["train"]["steps"] = json!(200);
        current["config"]["output"]["save_steps"] = json!(20.0);
        current["samples"] = json!(11);
        assert!(config_changes(&saved, &current).is_empty(), "steps, output and reports are not settings to refuse");
        current["config"]["optimizer"]["lr"] = json!(1.67e-2);
        current["config"]["model"]["init"] = json!("b.json");
        current["config"]["train"]["precision"] = json!("bf16-mixed");
        current["config"]["schedule"]["warmup_steps"] = serde_json::Value::Null;
        assert_eq!(
            config_changes(&saved, &current),
            [
                "model.init \"a.json\" → \"b.json\"",
                "optimizer.lr 0.0005 → 0.0167",
                "schedule.warmup_steps 10 → (unset)",
                "train.precision \"f32\" → \"bf16-mixed\"",
            ]
        );
        assert!(config_changes(&json!(null), &current).is_empty(), "a checkpoint without a recorded config");
    }

    /// The devices and the rollout engine's memory may change; the number of replicas (a
    /// step's samples) and the data's contents are compared where both sides record them.
    #[test]
    fn replicas_and_data_contents_are_compared_devices_and_engine_memory_are_not() {
        let saved = json!({"config": {"train": {"devices": ["cpu", "cpu"]}, "rollout": {"batch_size": 64, "max_prefill_tokens": 8192}},
            "replicas": 2, "data_fingerprint": "aa"});
        let mut current = json!({"config": {"train": {"devices": ["cpu"]}, "rollout": {"batch_size": 1, "max_prefill_tokens": 64, "kv_memory": 0.5}},
            "replicas": 2, "data_fingerprint": "aa"});
        assert!(config_changes(&saved, &current).is_empty(), "{:?}", config_changes(&saved, &current));
        current["replicas"] = json!(1);
        current["data_fingerprint"] = json!("bb");
        assert_eq!(
            config_changes(&saved, &current),
            ["replicas 2 → 1 (a step's samples are micro_batch × grad_accum × replicas)", "the data's contents (fingerprint aa → bb)"]
        );
        assert!(config_changes(&json!({"config": {}}), &current).is_empty(), "a checkpoint from before they were recorded");
        // One from before, with its devices named: their number is its replicas.
        let older = json!({"config": {"train": {"devices": ["cpu", "cpu"]}}});
        assert_eq!(config_changes(&older, &current), ["replicas 2 → 1 (a step's samples are micro_batch × grad_accum × replicas)"]);
        current["replicas"] = json!(2);
        assert!(config_changes(&older, &current).is_empty());
        assert_ne!(super::data_fingerprint([vec![1u64, 2], vec![3]]), super::data_fingerprint([vec![1u64], vec![2, 3]]), "parts are separated");
    }

    /// A checkpoint written before the defaults were recorded in its config: the defaults the
    /// file left out are the same settings; anything else that was unset is a change.
    #[test]
    fn settings_unset_in_an_older_checkpoint_are_their_defaults() {
        let saved = json!({"config": {"optimizer": {"lr": 5e-4, "weight_decay": null}, "schedule": {"kind": null}, "train": {"micro_batch": 2}}});
        let current = json!({"config": {
            "optimizer": {"lr": 5e-4, "weight_decay": 0.0, "beta2": 0.999},
            "schedule": {"kind": "linear", "warmup_ratio": 0.0},
            "train": {"micro_batch": 2, "grad_accum": 1, "seed": 42},
        }});
        assert!(config_changes(&saved, &current).is_empty(), "{:?}", config_changes(&saved, &current));
        let mut changed = current.clone();
        changed["config"]["train"]["grad_accum"] = json!(4);
        changed["config"]["schedule"]["kind"] = json!("cosine");
        assert_eq!(config_changes(&saved, &changed), ["schedule.kind (unset) → \"cosine\"", "train.grad_accum (unset) → 4"]);
    }

    /// A setting read back from `trainer_state.json` is the number that was written: a mixture
    /// share summed to 0.9999999999999999 is not 1.0 (serde_json's `float_roundtrip`; without it
    /// a resumed `--scale cpu` pre-training was refused for a share that had not changed).
    #[test]
    fn numbers_read_back_from_a_checkpoint_are_the_ones_written() {
        let share: f64 = 0.9999999999999999;
        assert_ne!(share, 1.0);
        let current = json!({"config": {"data": {"probs": [share, 0.5]}}});
        let saved: serde_json::Value = serde_json::from_str(&current.to_string()).unwrap();
        assert!(config_changes(&saved, &current).is_empty(), "{:?}", config_changes(&saved, &current));
    }

    #[test]
    fn two_spellings_of_one_path_are_the_same_setting() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.json");
        std::fs::write(&file, "{}").unwrap();
        let spelled = format!("{}/./config.json", dir.path().display());
        let saved = json!({"config": {"model": {"init": file.to_str().unwrap()}}});
        let current = json!({"config": {"model": {"init": spelled}}});
        assert!(config_changes(&saved, &current).is_empty());
    }
}
