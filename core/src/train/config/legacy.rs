//! Config files written before the one schema, moved into it before they are read. Each moved
//! key keeps its place in the file, so errors about it still name its line.
//!
//! | old                                                        | new                              |
//! |------------------------------------------------------------|----------------------------------|
//! | `[train] lr, weight_decay, max_grad_norm, beta1, beta2, eps` | `[optimizer]` (same names)     |
//! | `[train] schedule = "…"`                                     | `[schedule] kind = "…"`        |
//! | `[train] warmup_ratio, warmup_steps, min_lr, min_lr_rate, decay_steps, floor_lr` | `[schedule]` |
//! | rl/opd `[train] schedule = "cosine"`, `min_lr_ratio = r`     | `[schedule] kind = "cosine_with_min_lr"`, `min_lr_rate = r` (0 if absent) |
//! | `[validation]` (rl/opd; `dir`)                               | `[eval]` (`rows`; `dir` is accepted) |
//! | `[data] interplay = "…"`                                     | `[data] kind = "mixture"`, `root = "…"` |
//! | `[data] sft = "…"`                                           | `[data] kind = "sft"`, `path = "…"` |
//! | `[data] dir = …` or `files = […]` (rl/opd)                   | `[data] kind = "prompts"`, same keys |
//! | pretrain/sft `[eval] heldout, accuracy_ops, accuracy_rows`   | `[eval] rows, ops, rows_per_op` (old names accepted) |
//! | rl/opd `[output] save_freq`                                  | `[output] save_steps` (old name accepted) |
//!
//! A key given both in its old and its new place is an error naming the old one.

use std::borrow::Cow;
use std::ops::Range;

use toml::Spanned;
use toml::de::{DeFloat, DeTable, DeValue};

use super::Family;

/// An error at a place in the file.
type Failure = Spanned<String>;

/// `[train]` keys that moved to `[optimizer]`.
const OPTIMIZER_KEYS: [&str; 6] = ["lr", "weight_decay", "max_grad_norm", "beta1", "beta2", "eps"];
/// `[train]` keys that moved to `[schedule]`, with their new names.
const SCHEDULE_KEYS: [(&str, &str); 7] = [
    ("schedule", "kind"),
    ("warmup_ratio", "warmup_ratio"),
    ("warmup_steps", "warmup_steps"),
    ("min_lr", "min_lr"),
    ("min_lr_rate", "min_lr_rate"),
    ("decay_steps", "decay_steps"),
    ("floor_lr", "floor_lr"),
];

/// Moves the keys of an old config of `family` to their places (see the module docs).
pub fn migrate(doc: &mut DeTable<'_>, family: Family) -> Result<(), Failure> {
    rename_table(doc, "validation", "eval")?;
    if family == Family::PolicyGradient {
        rl_cosine(doc);
    }
    let optimizer: Vec<(&str, &str)> = OPTIMIZER_KEYS.iter().map(|k| (*k, *k)).collect();
    move_keys(doc, "train", "optimizer", &optimizer)?;
    move_keys(doc, "train", "schedule", &SCHEDULE_KEYS)?;
    data_kind(doc)
}

fn key(span: Range<usize>, name: &str) -> Spanned<Cow<'static, str>> {
    Spanned::new(span, Cow::Owned(name.to_owned()))
}

fn table_mut<'a, 'i>(doc: &'a mut DeTable<'i>, name: &str) -> Option<&'a mut DeTable<'i>> {
    match doc.get_mut(name).map(Spanned::get_mut) {
        Some(DeValue::Table(table)) => Some(table),
        _ => None,
    }
}

/// `[old]` becomes `[new]`; both present is an error at `[old]`.
fn rename_table(doc: &mut DeTable<'_>, old: &str, new: &str) -> Result<(), Failure> {
    let Some((name, value)) = doc.remove_entry(old) else { return Ok(()) };
    if doc.contains_key(new) {
        return Err(Spanned::new(name.span(), format!("[{old}] is the old name of [{new}]; give only [{new}]")));
    }
    doc.insert(key(name.span(), new), value);
    Ok(())
}

/// Moves `keys` (old name, new name) of table `from` into table `to`, creating it if needed.
fn move_keys(doc: &mut DeTable<'_>, from: &str, to: &str, keys: &[(&str, &str)]) -> Result<(), Failure> {
    let Some(source) = table_mut(doc, from) else { return Ok(()) };
    let moved: Vec<_> = keys.iter().filter_map(|(old, new)| source.remove_entry(*old).map(|(k, v)| (k, *new, v))).collect();
    let Some(first) = moved.first() else { return Ok(()) };
    if !doc.contains_key(to) {
        let span = first.0.span();
        doc.insert(key(span.clone(), to), Spanned::new(span, DeValue::Table(DeTable::new())));
    }
    let Some(target) = table_mut(doc, to) else {
        return Err(Spanned::new(first.0.span(), format!("`{to}` must be a table ([{to}])")));
    };
    for (old_key, new, value) in moved {
        if target.contains_key(new) {
            return Err(Spanned::new(
                old_key.span(),
                format!("[{from}] {old} is the old place of [{to}] {new}; give only [{to}] {new}", old = old_key.get_ref()),
            ));
        }
        target.insert(key(old_key.span(), new), value);
    }
    Ok(())
}

/// rl/opd's `[train] schedule = "cosine"` decayed to `min_lr_ratio` × lr (verl's cosine).
fn rl_cosine(doc: &mut DeTable<'_>) {
    let Some(train) = table_mut(doc, "train") else { return };
    if let Some((k, v)) = train.remove_entry("min_lr_ratio") {
        train.insert(key(k.span(), "min_lr_rate"), v);
    }
    let cosine = matches!(train.get("schedule").map(Spanned::get_ref), Some(DeValue::String(s)) if s == "cosine");
    if cosine {
        let span = train.get("schedule").map(Spanned::span).unwrap_or_default();
        train.insert(key(span.clone(), "schedule"), Spanned::new(span.clone(), DeValue::String(Cow::Borrowed("cosine_with_min_lr"))));
        if !train.contains_key("min_lr_rate") {
            train.insert(key(span.clone(), "min_lr_rate"), Spanned::new(span, DeValue::Float(DeFloat::default())));
        }
    }
}

/// A `[data]` without `kind` gets the one its keys imply.
fn data_kind(doc: &mut DeTable<'_>) -> Result<(), Failure> {
    let Some(data) = table_mut(doc, "data") else { return Ok(()) };
    if data.contains_key("kind") {
        return Ok(());
    }
    let has = |k: &str| data.contains_key(k);
    let implied: Vec<(&str, &str)> = [("interplay", "mixture"), ("sft", "sft"), ("dir", "prompts"), ("files", "prompts")]
        .into_iter()
        .filter(|(k, _)| has(k))
        .collect();
    let Some(&(old, kind)) = implied.first() else { return Ok(()) };
    if let Some(&(other, _)) = implied.iter().find(|(_, k)| *k != kind) {
        let span = data.get(other).map(Spanned::span).unwrap_or_default();
        return Err(Spanned::new(span, "[data] needs exactly one of `interplay` (pre-training), `sft`, or `dir`/`files` (rl, opd)".into()));
    }
    let span = data.get(old).map(Spanned::span).unwrap_or_default();
    let new = match old {
        "interplay" => Some("root"),
        "sft" => Some("path"),
        _ => None,
    };
    if let Some(new) = new {
        if data.contains_key(new) {
            return Err(Spanned::new(span, format!("[data] {old} is the old form of kind = \"{kind}\" with {new} = …; give one")));
        }
        if let Some((k, v)) = data.remove_entry(old) {
            data.insert(key(k.span(), new), v);
        }
    }
    data.insert(key(span.clone(), "kind"), Spanned::new(span, DeValue::String(Cow::Owned(kind.to_owned()))));
    Ok(())
}
