//! Run configs as text: `kiln config show` (the effective TOML of a run config, every default
//! written out, in the current schema) and `kiln config import` (verl's and TRL's configs turned
//! into a kiln TOML, [`verl`], [`trl`]).
//!
//! `show` reads a config the way its run reads it ([`crate::train::config::read_config`]: legacy
//! keys moved, serde aliases taken), fills in what the run would take for every key left out
//! ([`crate::train::config::defaults`]), and prints it; [`legacy_notes`] names each legacy key of the input. The
//! printed text reads back to the same config, and printing that gives the same text.
//! `kiln config upgrade` ([`upgrade`]) rewrites a config of an earlier form in the current
//! schema, keeping only the values it gives.

mod tree;
pub mod trl;
pub mod upgrade;
pub mod verl;

use std::path::Path;

use crate::error::{Error, Result};
use crate::rl::PgConfig;
use crate::tasks::RewardConfig;
use crate::train::config::{Family, read_config};
use crate::train::run::{Command, RunConfig};

/// The run a config is for (`kiln pretrain`, `sft`, `rl`, `opd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunKind {
    Pretrain,
    Sft,
    Rl,
    Opd,
}

impl RunKind {
    pub const NAMES: &[&str] = &["pretrain", "sft", "rl", "opd"];

    pub fn name(self) -> &'static str {
        match self {
            Self::Pretrain => "pretrain",
            Self::Sft => "sft",
            Self::Rl => "rl",
            Self::Opd => "opd",
        }
    }

    pub fn from_name(name: &str) -> std::result::Result<Self, String> {
        match name {
            "pretrain" => Ok(Self::Pretrain),
            "sft" => Ok(Self::Sft),
            "rl" | "grpo" => Ok(Self::Rl),
            "opd" => Ok(Self::Opd),
            _ => Err(format!("unknown run kind \"{name}\"; valid kinds: {}", Self::NAMES.join(", "))),
        }
    }

    fn family(self) -> Family {
        match self {
            Self::Pretrain | Self::Sft => Family::NextToken,
            Self::Rl | Self::Opd => Family::PolicyGradient,
        }
    }
}

/// The run a config is for, by the sections its runs require: `[data] kind` (or the legacy
/// keys that imply it: `interplay`, `sft`, `dir`/`files`) and, for prompts, `[teacher]` (opd).
pub fn detect_kind(path: &Path, text: &str) -> Result<RunKind> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| Error::data(path, None, e.message().to_string()))?;
    if table.contains_key("release") {
        return Err(Error::config(path, "a release recipe (`kiln release`), not a run config"));
    }
    let data = table.get("data").and_then(toml::Value::as_table);
    let kind = data.and_then(|d| d.get("kind")).and_then(toml::Value::as_str).map(str::to_owned).or_else(|| {
        let d = data?;
        [("interplay", "mixture"), ("sft", "sft"), ("dir", "prompts"), ("files", "prompts")]
            .into_iter()
            .find(|(k, _)| d.contains_key(*k))
            .map(|(_, kind)| kind.to_owned())
    });
    match kind.as_deref() {
        Some("mixture") => Ok(RunKind::Pretrain),
        Some("sft") => Ok(RunKind::Sft),
        Some("prompts") if table.contains_key("teacher") => Ok(RunKind::Opd),
        Some("prompts") => Ok(RunKind::Rl),
        Some(other) => Err(Error::config(path, format!("[data] kind = \"{other}\" is not a run's (mixture, sft, prompts)"))),
        None => Err(Error::config(path, "cannot tell the run: [data] needs `kind` (mixture, sft, prompts); or give --kind")),
    }
}

/// A config read for one run, with every default filled in.
#[derive(Debug, Clone, PartialEq)]
pub enum Effective {
    /// pretrain, sft.
    NextToken(RunConfig),
    /// rl, opd.
    PolicyGradient(PgConfig),
}

impl Effective {
    /// The config as TOML in the current schema.
    pub fn to_toml(&self) -> String {
        let text = match self {
            Self::NextToken(c) => toml::to_string(c),
            Self::PolicyGradient(c) => toml::to_string(c),
        };
        let mut text = text.expect("run configs serialise to TOML");
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text
    }
}

/// Reads `text` (the config at `path`) as a `kind` run reads it, checks it the same way
/// (paths resolved against the file's directory for the check only), with every default
/// filled in ([`crate::train::config::defaults`]); paths stay as written.
pub fn effective(path: &Path, text: &str, kind: RunKind) -> Result<Effective> {
    match kind.family() {
        Family::NextToken => {
            let command = if kind == RunKind::Pretrain { Command::Pretrain } else { Command::Sft };
            RunConfig::load(path, text, command)?;
            Ok(Effective::NextToken(read_config(path, text, Family::NextToken)?))
        }
        Family::PolicyGradient => {
            let method = if kind == RunKind::Opd { crate::rl::Method::Opd } else { crate::rl::Method::Grpo };
            PgConfig::load(path, text, method)?;
            let mut config: PgConfig = read_config(path, text, Family::PolicyGradient)?;
            if kind == RunKind::Rl && config.reward.is_none() {
                config.reward = Some(RewardConfig::default());
            }
            Ok(Effective::PolicyGradient(config))
        }
    }
}

/// `kiln config show`: the effective config of `kind` (detected when `None`) as TOML.
pub fn show(path: &Path, text: &str, kind: Option<RunKind>) -> Result<(RunKind, String)> {
    let kind = match kind {
        Some(kind) => kind,
        None => detect_kind(path, text)?,
    };
    Ok((kind, effective(path, text, kind)?.to_toml()))
}

/// One line per legacy key of `text` (read under its current name), e.g.
/// `[train] lr is read as [optimizer] lr`.
pub fn legacy_notes(text: &str, kind: RunKind) -> Vec<String> {
    let Ok(table) = text.parse::<toml::Table>() else { return Vec::new() };
    let section = |name: &str| table.get(name).and_then(toml::Value::as_table);
    let mut notes = Vec::new();
    let mut note = |old: String, new: String| notes.push(format!("{old} is read as {new}"));
    if let Some(train) = section("train") {
        for key in ["lr", "weight_decay", "max_grad_norm", "beta1", "beta2", "eps"] {
            if train.contains_key(key) {
                note(format!("[train] {key}"), format!("[optimizer] {key}"));
            }
        }
        if train.contains_key("schedule") {
            note("[train] schedule".into(), "[schedule] kind".into());
        }
        for key in ["warmup_ratio", "warmup_steps", "min_lr", "min_lr_rate", "decay_steps", "floor_lr"] {
            if train.contains_key(key) {
                note(format!("[train] {key}"), format!("[schedule] {key}"));
            }
        }
        if kind.family() == Family::PolicyGradient && train.contains_key("min_lr_ratio") {
            note("[train] min_lr_ratio".into(), "[schedule] min_lr_rate".into());
        }
    }
    if let Some(validation) = section("validation") {
        note("[validation]".into(), "[eval]".into());
        if validation.contains_key("dir") {
            note("[validation] dir".into(), "[eval] rows".into());
        }
    }
    if let Some(eval) = section("eval") {
        for (old, new) in [("heldout", "rows"), ("dir", "rows"), ("accuracy_ops", "ops"), ("accuracy_rows", "rows_per_op")] {
            if eval.contains_key(old) {
                note(format!("[eval] {old}"), format!("[eval] {new}"));
            }
        }
    }
    if let Some(data) = section("data") {
        if !data.contains_key("kind") {
            for (old, new) in [("interplay", "kind = \"mixture\", root"), ("sft", "kind = \"sft\", path"), ("dir", "kind = \"prompts\", dir"), ("files", "kind = \"prompts\", files")] {
                if data.contains_key(old) {
                    note(format!("[data] {old} (no kind)"), format!("[data] {new}"));
                }
            }
        }
        for (old, new) in [("sft_columns", "columns"), ("sft_heldout", "heldout"), ("sft_split_key", "split_key")] {
            if data.contains_key(old) {
                note(format!("[data] {old}"), format!("[data] {new}"));
            }
        }
    }
    if section("output").is_some_and(|o| o.contains_key("save_freq")) {
        note("[output] save_freq".into(), "[output] save_steps".into());
    }
    if let Some(loss) = section("loss") {
        if loss.contains_key("loss_agg_mode") {
            note("[loss] loss_agg_mode".into(), "[loss] agg".into());
        }
        if let Some(old) = loss.get("kl_estimator").and_then(toml::Value::as_str) {
            let new = match old {
                "low_var_kl" => Some("k3"),
                "kl" => Some("k1"),
                "mse" => Some("k2"),
                _ => None,
            };
            if let Some(new) = new {
                note(format!("[loss] kl_estimator = \"{old}\""), format!("kl_estimator = \"{new}\""));
            }
        }
    }
    notes
}

/// Where an imported config came from, and what of it kiln did not take.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImportReport {
    /// `source key → kiln key` for each value carried.
    pub carried: Vec<(String, String)>,
    /// Keys whose values do not matter to kiln (infrastructure, logging, …), with why.
    pub ignored: Vec<(String, String)>,
    /// Keys kiln does not know (not in the source's schema, or not read by kiln).
    pub unknown: Vec<String>,
    /// Other remarks (approximations, values kiln treats differently).
    pub notes: Vec<String>,
    /// Source keys left at the source's defaults and not carried (a count).
    pub at_defaults: usize,
}

/// An imported config: the kiln TOML (every default filled in) and the report.
#[derive(Debug, Clone)]
pub struct Imported {
    pub kind: RunKind,
    pub config: Effective,
    pub report: ImportReport,
}

impl Imported {
    /// The TOML to write: a header naming the source and what was not carried, then the config.
    pub fn to_toml(&self, source: &str) -> String {
        let r = &self.report;
        let mut head = format!("# Imported by `kiln config import` from {source}: {} values carried", r.carried.len());
        head += &format!(", {} ignored (irrelevant to kiln), {} unknown, {} left at the source's defaults.\n", r.ignored.len(), r.unknown.len(), r.at_defaults);
        for (from, to) in &r.carried {
            head += &format!("#   {from} -> {to}\n");
        }
        for (key, why) in &r.ignored {
            head += &format!("# ignored: {key} ({why})\n");
        }
        for key in &r.unknown {
            head += &format!("# unknown: {key}\n");
        }
        for n in &r.notes {
            head += &format!("# note: {n}\n");
        }
        head + "\n" + &self.config.to_toml()
    }
}

/// Values kiln cannot run, by source key: the values allowed (as JSON text; numbers compare by
/// value) and why others are refused.
type Refusals = [(&'static str, &'static [&'static str], &'static str)];

/// What the importers share: reading keys of the source config (each importer says how a key
/// is looked up and where the file is) and refusing a value by file and key.
trait Source {
    /// The source file, for errors.
    fn path(&self) -> &Path;

    /// The value of `key` (null if absent); marks it read.
    fn get(&mut self, key: &str) -> serde_json::Value;

    fn refuse(&self, key: &str, value: &serde_json::Value, why: &str) -> Error {
        Error::config(self.path(), format!("{key} = {}: {why}", tree::show(value)))
    }

    fn f64(&mut self, key: &str) -> Result<f64> {
        let v = self.get(key);
        v.as_f64().or_else(|| v.as_str().and_then(|s| s.parse().ok())).ok_or_else(|| self.refuse(key, &v, "expected a number"))
    }

    /// The whole number at `key`, `None` if absent or null; a number with a fraction, or anything
    /// else, refused (YAML writes `1000.0` where Python reads an int as often as `1000`).
    fn int(&mut self, key: &str) -> Result<Option<i64>> {
        let v = self.get(key);
        if v.is_null() {
            return Ok(None);
        }
        whole(&v).map(Some).ok_or_else(|| self.refuse(key, &v, "expected an integer"))
    }

    fn usize(&mut self, key: &str) -> Result<usize> {
        let v = self.get(key);
        v.as_u64().and_then(|u| usize::try_from(u).ok()).or_else(|| whole(&v).and_then(|i| usize::try_from(i).ok())).ok_or_else(|| self.refuse(key, &v, "expected a non-negative integer"))
    }

    fn text(&mut self, key: &str) -> Option<String> {
        match self.get(key) {
            serde_json::Value::String(s) => Some(s),
            serde_json::Value::Null => None,
            other => Some(other.to_string()),
        }
    }

    /// The first of `refused` whose value is not one it allows, as an error.
    fn check_refused(&mut self, refused: &Refusals) -> Result<()> {
        for (key, allowed, why) in refused {
            let v = self.get(key);
            if !allowed.contains(&v.to_string().as_str()) && !(v.is_number() && allowed.iter().any(|a| a.parse::<f64>().ok() == v.as_f64())) {
                return Err(self.refuse(key, &v, why));
            }
        }
        Ok(())
    }
}

/// `v` as a whole number: an integer, a float without a fraction, or a string of either.
fn whole(v: &serde_json::Value) -> Option<i64> {
    if let Some(i) = v.as_i64() {
        return Some(i);
    }
    let f = v.as_f64().or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))?;
    (f.fract() == 0.0 && f.abs() < 2f64.powi(53)).then_some(f as i64)
}

/// Reads a TOML text built by an importer as a `kind` config, checks it and fills defaults.
fn finish(path: &Path, table: toml::Table, kind: RunKind, report: ImportReport) -> Result<Imported> {
    let text = toml::to_string(&table).map_err(|e| Error::config(path, format!("cannot write the imported config: {e}")))?;
    let config = effective(path, &text, kind).map_err(|e| at_source_key(path, &text, &report, e))?;
    Ok(Imported { kind, config, report })
}

/// A refusal of the TOML an importer wrote (`text`) at one of its lines, which are not the source
/// file's: named instead by the source key carried there and the kiln key it became.
fn at_source_key(path: &Path, text: &str, report: &ImportReport, e: Error) -> Error {
    let Error::Data { path: at, line: Some(line), message } = &e else { return e };
    let Some(key) = key_at(text, *line).filter(|_| at == path) else { return e };
    // The last value written to the key (a carried entry's source may say "(TRL's default)").
    match report.carried.iter().rfind(|(_, to)| to.split(" = ").next() == Some(key.as_str())) {
        Some((from, _)) => {
            let (from, origin) = from.split_once(" (").map_or((from.as_str(), String::new()), |(f, o)| (f, format!("{}, ", o.trim_end_matches(')'))));
            Error::config(path, format!("{from} ({origin}imported as {key}): {message}"))
        }
        None => Error::config(path, format!("imported {key}: {message}")),
    }
}

/// The dotted key written on 1-based `line` of the TOML `text` (or the table its header names).
fn key_at(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let header = |l: &str| l.trim().strip_prefix('[').and_then(|l| l.strip_suffix(']')).map(|t| t.trim_matches(['[', ']']).to_owned());
    let here = lines.get(line.checked_sub(1)?)?;
    if let Some(table) = header(here) {
        return Some(table);
    }
    let name = here.split_once('=')?.0.trim().trim_matches(['"', '\'']);
    Some(match lines[..line - 1].iter().rev().find_map(|l| header(l)) {
        Some(table) => format!("{table}.{name}"),
        None => name.to_owned(),
    })
}
