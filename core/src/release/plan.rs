//! From `release.toml` and a scale to the runs to make: every run config read, shrunk by the
//! scale ([`super::config::ScaleProfile`]) and pointed into the release layout under the root
//! (docs/release-layout.md):
//!
//! | run | starts from | writes | its last checkpoint |
//! |---|---|---|---|
//! | pretrain | `[model] init` (the scale's model) | `<batch>/pretrain/` | `checkpoint-<steps>` |
//! | rl `<name>` | the batch's last pre-training checkpoint | `<batch>/rl/` | `<name>_step<steps>` |
//! | opd | the same | `<batch>/opd_refkl/sweep/` | `step<steps>`, moved to `opd_refkl/<teacher>_step<steps>` |
//!
//! Data come from `<root>/data` (`train/`, `heldout/`, `val/`, `test/`). Planning reads no
//! model and writes nothing; it checks every config.

use std::path::{Component, Path, PathBuf};

use super::ops::OpMap;
use super::config::{BatchSection, EvalModels, EvalSection, PgScale, PretrainScale, ReleaseConfig, ScaleModel, SplitSpec};
use crate::error::{Error, Result};
use crate::eval::{EvalSettings, ModelEntry, release_models};
use crate::generate::Sampler;
use crate::rl::PgConfig;
use crate::train::RunConfig;
use crate::train::checkpoint::checkpoint_name;
use crate::train::config::{DataSection, TokenCount};

/// The configs as written.
pub const FULL: &str = "full";

/// What a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunKind {
    Pretrain,
    Grpo,
    Opd,
}

impl RunKind {
    /// The stage that runs it.
    pub fn stage(self) -> Stage {
        match self {
            Self::Pretrain => Stage::Pretrain,
            Self::Grpo => Stage::Rl,
            Self::Opd => Stage::Opd,
        }
    }
}

/// The stages of a release, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// The splits of `[data]` (existing files are kept); always first.
    Data,
    Pretrain,
    Rl,
    Opd,
    Eval,
}

impl Stage {
    pub const ALL: [Stage; 5] = [Stage::Data, Stage::Pretrain, Stage::Rl, Stage::Opd, Stage::Eval];

    pub fn name(self) -> &'static str {
        match self {
            Self::Data => "data",
            Self::Pretrain => "pretrain",
            Self::Rl => "rl",
            Self::Opd => "opd",
            Self::Eval => "eval",
        }
    }

    /// Parses `pretrain,rl,opd,eval` (any order; run in stage order).
    pub fn parse_list(text: &str) -> std::result::Result<Vec<Stage>, String> {
        let mut stages = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let stage = Self::ALL
                .into_iter()
                .find(|s| s.name() == part)
                .ok_or_else(|| format!("unknown stage {part:?} (expected data, pretrain, rl, opd or eval)"))?;
            if !stages.contains(&stage) {
                stages.push(stage);
            }
        }
        if stages.is_empty() {
            return Err("no stage given".into());
        }
        stages.sort();
        Ok(stages)
    }
}

/// A run's config, ready to run.
#[derive(Debug, Clone, PartialEq)]
pub enum RunSpec {
    Pretrain(RunConfig),
    Pg(PgConfig),
}

/// One run of the release.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedRun {
    pub batch: String,
    pub kind: RunKind,
    /// `pretrain`, the RL run's name (`op11_14`), or `opd_refkl`.
    pub name: String,
    /// The config file it was read from.
    pub source: PathBuf,
    pub spec: RunSpec,
    pub steps: u64,
    /// Where the run writes its last checkpoint ...
    pub last: PathBuf,
    /// ... and where that ends up in the layout (OPD: moved there; otherwise `last`).
    pub published: PathBuf,
    /// The checkpoint it starts from (not for pre-training).
    pub from: Option<PathBuf>,
    /// The model trained (`qwen2_100M`, `tiny`).
    pub model: String,
}

impl PlannedRun {
    /// The run's name in the batch's run index and on the command line (`020305 rl op11_14`).
    pub fn label(&self) -> String {
        match self.kind {
            RunKind::Pretrain => format!("{} pretrain", self.batch),
            RunKind::Grpo => format!("{} rl {}", self.batch, self.name),
            RunKind::Opd => format!("{} opd", self.batch),
        }
    }

    /// Whether its last checkpoint is in place.
    pub fn finished(&self) -> bool {
        self.published.join("config.json").is_file()
    }

    /// The effective config as TOML.
    pub fn config_toml(&self) -> Result<String> {
        let text = match &self.spec {
            RunSpec::Pretrain(c) => toml::to_string(c),
            RunSpec::Pg(c) => toml::to_string(c),
        };
        text.map_err(|e| Error::config(&self.source, format!("cannot write the effective config: {e}")))
    }
}

/// Everything a release run does, at one scale.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// `full`, `mini`, `tiny`, ...
    pub scale: String,
    /// The release file.
    pub config: PathBuf,
    /// The release root (absolute).
    pub root: PathBuf,
    pub seed: u64,
    pub splits: Vec<SplitSpec>,
    /// The scale's model and its directory (`<root>/model/tiny`), if it trains its own.
    pub model: Option<(ScaleModel, PathBuf)>,
    pub batches: Vec<String>,
    /// Pre-training runs first, then RL, then OPD (each in batch order).
    pub runs: Vec<PlannedRun>,
    pub eval: EvalSection,
    /// The scale's ops for the release's (`None`: the release's own).
    pub ops: Option<OpMap>,
}

impl Plan {
    /// `<root>/data`.
    pub fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    /// `<root>/<batch>`.
    pub fn batch_dir(&self, batch: &str) -> PathBuf {
        self.root.join(batch)
    }

    /// The runs of `stage`.
    pub fn runs_of(&self, stage: Stage) -> impl Iterator<Item = &PlannedRun> {
        self.runs.iter().filter(move |r| r.kind.stage() == stage)
    }

    /// The checkpoints the evaluation of `batch` covers, named as the release walker names them.
    pub fn eval_models(&self, batch: &str) -> Result<Vec<ModelEntry>> {
        let dir = self.batch_dir(batch);
        match self.eval.models {
            EvalModels::All => release_models(&dir),
            EvalModels::Final => Ok(self
                .runs
                .iter()
                .filter(|r| r.batch == batch)
                .map(|r| ModelEntry { name: model_name(&dir, &r.published), path: r.published.clone() })
                .collect()),
        }
    }

    /// `kiln eval interplay`'s settings for this scale.
    pub fn eval_settings(&self) -> EvalSettings {
        let e = &self.eval;
        EvalSettings {
            samples: e.samples,
            sampler: Sampler { temperature: e.temperature, top_k: e.top_k, top_p: e.top_p, min_p: e.min_p },
            max_new_tokens: e.max_new_tokens,
            seed: e.seed,
            id_op_threshold: (e.id_op_threshold >= 0).then_some(e.id_op_threshold),
            shard_prompts: e.shard_prompts,
            batch_size: e.batch_size,
            keep_generations: e.keep_generations,
            ..EvalSettings::default()
        }
    }
}

/// A checkpoint's name below a batch root: its path with `/` turned into `_` (the release
/// walker's names, [`release_models`]).
pub fn model_name(batch_dir: &Path, checkpoint: &Path) -> String {
    let relative = checkpoint.strip_prefix(batch_dir).unwrap_or(checkpoint);
    relative.iter().map(|c| c.to_string_lossy()).collect::<Vec<_>>().join("_")
}

/// The root of `config` at `scale`: `out` if given, else `[release] out` (full) or
/// `<out>-<scale>`.
pub fn default_root(config: &ReleaseConfig, scale: &str) -> PathBuf {
    let out = &config.release.out;
    if scale == FULL {
        return out.clone();
    }
    let mut name = out.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(format!("-{scale}"));
    out.with_file_name(name)
}

/// Plans `config` (read from `path`) at `scale` into `out` (default: [`default_root`]).
pub fn plan(config: &ReleaseConfig, path: &Path, scale: &str, out: Option<&Path>) -> Result<Plan> {
    let profile = match scale {
        FULL => None,
        name => Some(config.scale.get(name).ok_or_else(|| {
            let known: Vec<&str> = std::iter::once(FULL).chain(config.scale.keys().map(String::as_str)).collect();
            Error::config(path, format!("no scale {name:?} (this release has {})", known.join(", ")))
        })?),
    };
    let root = clean(&out.map(Path::to_path_buf).unwrap_or_else(|| default_root(config, scale)))?;
    let data = root.join("data");
    let model = profile.and_then(|p| p.model.clone()).map(|m| {
        let dir = root.join("model").join(&m.name);
        (m, dir)
    });
    let model_dir = model.as_ref().map(|(_, dir)| dir.clone());
    let ops = match profile.and_then(|p| p.ops.as_ref()) {
        Some(table) => Some(OpMap::parse(table).map_err(|e| Error::config(path, format!("[scale.{scale}] {e}")))?),
        None => None,
    };
    let default = PretrainScale::default();
    let no_pg = PgScale::default();
    let (pt_scale, rl_scale, opd_scale) = match profile {
        Some(p) => (&p.pretrain, &p.rl, &p.opd),
        None => (&default, &no_pg, &no_pg),
    };

    let chosen = profile.and_then(|p| p.batches.as_ref());
    let batches: Vec<_> = config.batches.iter().filter(|b| chosen.is_none_or(|names| names.contains(&b.name))).collect();
    let mut runs = Vec::new();
    for batch in &batches {
        let dir = root.join(&batch.name);
        let pretrain = plan_pretrain(&batch.name, &batch.pretrain, &dir, &data, model_dir.as_deref(), pt_scale, ops.as_ref())?;
        let base = pretrain.published.clone();
        let model = pretrain.model.clone();
        runs.push(pretrain);
        for source in &batch.rl {
            let run = plan_pg(&batch.name, source, RunKind::Grpo, &dir, &data, &base, &model, rl_scale, ops.as_ref(), None)?;
            let batch_runs = || runs.iter().filter(|r| r.batch == batch.name && r.kind == RunKind::Grpo);
            if let Some(other) = batch_runs().find(|r| r.name == run.name) {
                let message = format!("[output] name {:?} is also {}'s in [[batch]] {}: the two runs would share checkpoints", run.name, other.source.display(), batch.name);
                return Err(Error::config(source, message));
            }
            // Each run's effective config is `<batch>/configs/<file name>`.
            if let Some(other) = batch_runs().find(|r| r.source.file_name() == run.source.file_name()) {
                let message = format!("{} has the same file name in [[batch]] {}: their effective configs would share one file", other.source.display(), batch.name);
                return Err(Error::config(source, message));
            }
            runs.push(run);
        }
        if let (Some(source), Some(teacher)) = (&batch.opd, &batch.teacher) {
            let teacher_run = runs
                .iter()
                .find(|r| r.batch == batch.name && r.kind == RunKind::Grpo && &r.name == teacher)
                .ok_or_else(|| Error::config(path, format!("[[batch]] {}: teacher {teacher:?} is none of its rl runs", batch.name)))?;
            let teacher = (teacher.as_str(), teacher_run.published.clone());
            runs.push(plan_pg(&batch.name, source, RunKind::Opd, &dir, &data, &base, &model, opd_scale, ops.as_ref(), Some(teacher))?);
        }
    }
    if let Some(names) = profile.and_then(|p| p.runs.as_ref()) {
        select_runs(&mut runs, names, &batches).map_err(|m| Error::config(path, format!("[scale.{scale}] runs: {m}")))?;
    }
    runs.sort_by_key(|r| r.kind.stage());
    Ok(Plan {
        scale: scale.to_owned(),
        config: path.to_path_buf(),
        root,
        seed: config.data.seed,
        splits: profile.and_then(|p| p.splits.clone()).unwrap_or_else(|| config.data.splits.clone()),
        model,
        batches: batches.iter().map(|b| b.name.clone()).collect(),
        runs,
        eval: {
            let mut eval = profile.and_then(|p| p.eval.clone()).unwrap_or_else(|| config.eval.clone());
            if let Some(ops) = &ops {
                eval.id_op_threshold = ops.threshold(eval.id_op_threshold);
            }
            eval
        },
        ops,
    })
}

/// Keeps each batch's pre-training and the runs named in `names`; a name no batch has, or an
/// OPD run kept without its teacher, is an error.
fn select_runs(runs: &mut Vec<PlannedRun>, names: &[String], batches: &[&BatchSection]) -> std::result::Result<(), String> {
    if let Some(unknown) = names.iter().find(|n| !runs.iter().any(|r| r.kind != RunKind::Pretrain && &r.name == *n)) {
        let mut known: Vec<&str> = Vec::new();
        for run in runs.iter().filter(|r| r.kind != RunKind::Pretrain) {
            if !known.contains(&run.name.as_str()) {
                known.push(&run.name);
            }
        }
        return Err(format!("no run {unknown:?} in the scale's batches (they have {})", known.join(", ")));
    }
    runs.retain(|r| r.kind == RunKind::Pretrain || names.contains(&r.name));
    for batch in batches {
        let opd = runs.iter().find(|r| r.batch == batch.name && r.kind == RunKind::Opd);
        if let (Some(opd), Some(teacher)) = (opd, &batch.teacher)
            && !names.contains(teacher)
        {
            return Err(format!("{}'s {} distils its RL run {teacher:?}: name it too", batch.name, opd.name));
        }
    }
    Ok(())
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io(path, e))
}

/// The run needs `[train] steps` (its checkpoints' names follow from it).
fn steps_of(source: &Path, steps: Option<u64>, epochs: Option<f64>) -> Result<u64> {
    match (steps, epochs) {
        (Some(steps), None) if steps > 0 => Ok(steps),
        _ => Err(Error::config(source, "a release run gives [train] steps (its checkpoints are named by them), not epochs")),
    }
}

fn plan_pretrain(batch: &str, source: &Path, dir: &Path, data: &Path, model_dir: Option<&Path>, s: &PretrainScale, ops: Option<&OpMap>) -> Result<PlannedRun> {
    let mut c = RunConfig::from_toml(source, &read(source)?)?;
    if let Some(model_dir) = model_dir {
        c.model.init = Some(model_dir.join("config.json"));
        c.model.from = None;
        c.model.tokenizer = None;
    }
    let model = match (&c.model.init, &c.model.from) {
        (Some(init), _) => init.parent().and_then(|p| p.file_name()),
        (None, Some(from)) => from.file_name(),
        (None, None) => None,
    }
    .map(|n| n.to_string_lossy().into_owned())
    .unwrap_or_default();
    let DataSection::Mixture(mixture) = &mut c.data else {
        return Err(Error::config(source, "a release's pre-training takes [data] kind = \"mixture\""));
    };
    mixture.root = data.to_path_buf();
    if let Some(preset) = &mut mixture.preset {
        *preset = clean(preset)?;
    }
    if let Some(map) = ops {
        // The mixture over the scale's ops, inline (the preset's name stays in the source config).
        let (preset, _) = crate::train::run::mixture_of(mixture).map_err(|e| Error::config(source, e.to_string()))?;
        let (ops, probs) = map.mixture(&preset.ops, &preset.probs);
        (mixture.ops, mixture.probs, mixture.preset, mixture.setting) = (Some(ops), Some(probs), None, None);
    }
    set(&mut mixture.tokens, s.tokens.map(|t| Some(TokenCount::Number(t))));
    if let Some(cutoff) = s.cutoff_len {
        mixture.cutoff_len = cutoff;
    }
    if let Some(steps) = s.steps {
        (c.train.steps, c.train.epochs) = (Some(steps), None);
    }
    set(&mut c.train.micro_batch, s.micro_batch);
    set(&mut c.train.grad_accum, s.grad_accum);
    set(&mut c.optimizer.lr, s.lr);
    set(&mut c.schedule.min_lr, s.min_lr.map(Some));
    if let Some(ratio) = s.warmup_ratio {
        c.schedule.warmup_ratio = ratio;
    }
    c.output.dir = dir.join("pretrain");
    absolute_paths(&mut c.model.init, &mut c.model.tokenizer)?;
    c.check().map_err(|m| Error::config(source, m))?;
    let steps = steps_of(source, c.train.steps, c.train.epochs)?;
    let last = c.output.dir.join(checkpoint_name(c.output.name.as_deref(), steps));
    Ok(PlannedRun {
        batch: batch.to_owned(),
        kind: RunKind::Pretrain,
        name: "pretrain".into(),
        source: source.to_path_buf(),
        spec: RunSpec::Pretrain(c),
        steps,
        published: last.clone(),
        last,
        from: None,
        model,
    })
}

#[allow(clippy::too_many_arguments)]
fn plan_pg(
    batch: &str,
    source: &Path,
    kind: RunKind,
    dir: &Path,
    data: &Path,
    base: &Path,
    model: &str,
    s: &PgScale,
    ops: Option<&OpMap>,
    teacher: Option<(&str, PathBuf)>,
) -> Result<PlannedRun> {
    let mut c = PgConfig::from_toml(source, &read(source)?)?;
    c.model.from = Some(base.to_path_buf());
    c.model.tokenizer = None;
    let DataSection::Prompts(prompts) = &mut c.data else {
        return Err(Error::config(source, "a release's RL and OPD runs take [data] kind = \"prompts\""));
    };
    if prompts.dir.is_none() {
        return Err(Error::config(source, "a release's RL and OPD runs read [data] dir (per-op files of <root>/data/heldout)"));
    }
    prompts.dir = Some(data.join("heldout"));
    if let Some(map) = ops {
        prompts.ops = map.ops(&prompts.ops);
    }
    set(&mut prompts.max_prompt_length, s.max_prompt_length);
    if let Some(steps) = s.steps {
        (c.train.steps, c.train.epochs) = (Some(steps), None);
    }
    set(&mut c.output.save_steps, s.save_every.map(Some));
    set(&mut c.train.prompts_per_step, s.prompts_per_step);
    set(&mut c.train.mini_batch, s.mini_batch);
    set(&mut c.train.micro_batch, s.micro_batch);
    set(&mut c.rollout.n, s.n);
    set(&mut c.rollout.max_response_length, s.max_response_length);
    set(&mut c.rollout.batch_size, s.rollout_batch);
    set(&mut c.optimizer.lr, s.lr);
    if s.validation_every == Some(0) {
        c.eval = None;
    }
    if let Some(eval) = &mut c.eval {
        eval.rows = data.join("val");
        set(&mut eval.every, s.validation_every);
        set(&mut eval.rows_per_op, s.validation_rows_per_op.map(Some));
        set(&mut eval.max_new_tokens, s.validation_max_new_tokens.map(Some));
        if let Some(map) = ops {
            eval.ops = map.ops(&eval.ops);
            eval.id_max_op = Some(map.op(eval.id_max_op.unwrap_or(crate::tasks::interplay::task::ID_MAX_OP)));
        }
    }
    let (name, out) = match kind {
        RunKind::Opd => ("opd_refkl".to_owned(), dir.join("opd_refkl").join("sweep")),
        _ => match c.output.name.clone().filter(|n| !n.is_empty()) {
            Some(name) => (name, dir.join("rl")),
            None => return Err(Error::config(source, "a release's RL run needs [output] name (e.g. \"op11_14\")")),
        },
    };
    c.output.dir = out;
    if let Some((_, path)) = &teacher {
        let section = c.teacher.as_mut().ok_or_else(|| Error::config(source, "an OPD run needs a [teacher] section"))?;
        section.path = path.clone();
    }
    c.check().map_err(|m| Error::config(source, m))?;
    let steps = steps_of(source, c.train.steps, c.train.epochs)?;
    let last = c.output.dir.join(checkpoint_name(c.output.name.as_deref(), steps));
    let published = match &teacher {
        Some((teacher, _)) => dir.join("opd_refkl").join(checkpoint_name(Some(teacher), steps)),
        None => last.clone(),
    };
    Ok(PlannedRun {
        batch: batch.to_owned(),
        kind,
        name,
        source: source.to_path_buf(),
        spec: RunSpec::Pg(c),
        steps,
        last,
        published,
        from: Some(base.to_path_buf()),
        model: model.to_owned(),
    })
}

/// `*slot = value` where a value is given.
fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(value) = value {
        *slot = value;
    }
}

/// Paths kept from a config, made absolute (the effective config is written elsewhere).
fn absolute_paths(init: &mut Option<PathBuf>, tokenizer: &mut Option<PathBuf>) -> Result<()> {
    for path in init.iter_mut().chain(tokenizer.iter_mut()) {
        *path = clean(path)?;
    }
    Ok(())
}

/// `path` made absolute with `.` and `..` removed (lexically).
pub fn clean(path: &Path) -> Result<PathBuf> {
    let absolute = std::path::absolute(path).map_err(|e| Error::io(path, e))?;
    let mut out = PathBuf::new();
    for component in absolute.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    Ok(out)
}
