//! `kiln config upgrade`: a run config written in an earlier form ([`crate::train::config::legacy`],
//! serde's old key names, verl's `kl_estimator` names) rewritten in the current schema. It reuses
//! `show`'s machinery — the config is read and checked as its run reads it and printed from the
//! typed config, so every key and value is in its current spelling — but keeps only the values
//! the file gives (each key the file sets, in its current place), not the defaults `show` adds.
//! Comments are not carried over (the header says so).

use std::path::Path;

use toml::de::{DeTable, DeValue};

use super::{RunKind, detect_kind, effective, legacy_notes};
use crate::error::{Error, Result};
use crate::rl::PgConfig;
use crate::train::config::{Family, migrated_table, read_config};
use crate::train::run::RunConfig;

/// Keys serde reads under an old name too: (section, current name, old names).
const RENAMED: &[(&str, &str, &[&str])] = &[
    ("eval", "rows", &["heldout", "dir"]),
    ("eval", "ops", &["accuracy_ops"]),
    ("eval", "rows_per_op", &["accuracy_rows"]),
    ("data", "columns", &["sft_columns"]),
    ("data", "heldout", &["sft_heldout"]),
    ("data", "split_key", &["sft_split_key"]),
    ("output", "save_steps", &["save_freq"]),
    ("loss", "agg", &["loss_agg_mode"]),
];

/// Sections every run has (a default when absent): left out when none of their keys is given.
const OPTIONAL_EMPTY: &[&str] = &["task", "train", "optimizer", "schedule", "rollout", "loss"];

/// A config rewritten in the current schema.
#[derive(Debug, Clone, PartialEq)]
pub struct Upgraded {
    pub kind: RunKind,
    /// The new text: a header, then the file's values under their current names.
    pub text: String,
    /// One line per old form of the input (as `kiln config show` names them); empty when the
    /// input was already in the current schema.
    pub notes: Vec<String>,
}

/// Rewrites `text` (the config at `path`, read as `kind`, detected when `None`) in the current
/// schema, keeping only the values it gives. The config must be one its run accepts.
pub fn upgrade(path: &Path, text: &str, kind: Option<RunKind>) -> Result<Upgraded> {
    let kind = match kind {
        Some(kind) => kind,
        None => detect_kind(path, text)?,
    };
    // Read and checked as its run reads it.
    effective(path, text, kind)?;
    let family = kind.family();
    let written = match family {
        Family::NextToken => toml::to_string(&read_config::<RunConfig>(path, text, family)?),
        Family::PolicyGradient => toml::to_string(&read_config::<PgConfig>(path, text, family)?),
    }
    .map_err(|e| Error::config(path, format!("cannot write the upgraded config: {e}")))?;
    let given = migrated_table(path, text, family)?;
    let values: toml::Table = written.parse().map_err(|e: toml::de::Error| Error::config(path, format!("cannot read the upgraded config back: {e}")))?;
    let order = DeTable::parse(&written).map_err(|e| Error::config(path, format!("cannot read the upgraded config back: {e}")))?;
    let kept = keep_given(&values, order.get_ref(), &given, None);
    let body = toml::to_string(&Ordered(&kept)).map_err(|e| Error::config(path, format!("cannot write the upgraded config: {e}")))?;
    let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let header = format!(
        "# {name}, upgraded to the current run-config schema by `kiln config upgrade` (kiln {}):\n\
         # the values the file gives, under their current names; defaults it left out stay out\n\
         # (`kiln config show` lists them). The original's comments are not carried over.\n\n",
        kind.name()
    );
    let mut upgraded = header + &body;
    if !upgraded.ends_with('\n') {
        upgraded.push('\n');
    }
    Ok(Upgraded { kind, text: upgraded, notes: legacy_notes(text, kind) })
}

/// A value of the upgraded config: a leaf, or a table with its entries in the schema's order.
enum Node {
    Leaf(toml::Value),
    Table(Vec<(String, Node)>),
}

/// The entries of `values` (the typed config written out, every default included) that the
/// file gives (`given`, its migrated document), in the order of `order` (the same text, parsed
/// with places). `section` is the top-level section `values` is in.
fn keep_given(values: &toml::Table, order: &DeTable<'_>, given: &toml::Table, section: Option<&str>) -> Vec<(String, Node)> {
    let mut keys: Vec<(usize, &str)> = order.iter().map(|(k, _)| (k.span().start, k.get_ref().as_ref())).collect();
    keys.sort();
    let mut kept = Vec::new();
    for (_, key) in keys {
        let Some(value) = values.get(key) else { continue };
        let old_names = match section {
            Some(section) => RENAMED.iter().filter(|(s, new, _)| *s == section && *new == key).flat_map(|(_, _, old)| old.iter().copied()).collect(),
            None => Vec::new(),
        };
        let Some(given_value) = std::iter::once(key).chain(old_names).find_map(|k| given.get(k)) else { continue };
        let node = match (value, given_value, order.get(key).map(|v| v.get_ref())) {
            (toml::Value::Table(table), toml::Value::Table(given_table), Some(DeValue::Table(order))) => {
                let entries = keep_given(table, order, given_table, Some(section.unwrap_or(key)));
                if entries.is_empty() && section.is_none() && OPTIONAL_EMPTY.contains(&key) {
                    continue;
                }
                Node::Table(entries)
            }
            _ => Node::Leaf(value.clone()),
        };
        kept.push((key.to_owned(), node));
    }
    // Plain values before tables, as TOML needs them.
    kept.sort_by_key(|(_, node)| matches!(node, Node::Table(_)));
    kept
}

/// Serialises entries in their order.
struct Ordered<'a>(&'a [(String, Node)]);

impl serde::Serialize for Ordered<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, node) in self.0 {
            match node {
                Node::Leaf(value) => map.serialize_entry(key, value)?,
                Node::Table(entries) => map.serialize_entry(key, &Ordered(entries))?,
            }
        }
        map.end()
    }
}
