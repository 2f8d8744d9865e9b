//! Which checkpoints to evaluate and what to call them. A release (`docs/release-layout.md`)
//! holds Hugging Face model directories (those with a `config.json`) under `pretrain/`, `rl/`
//! and `opd_refkl/`, at any depth; each is named by its path below the release root with `/`
//! turned into `_` (`rl/op11_14_step200` → `rl_op11_14_step200`), so the names of one release
//! never collide.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The release subdirectories walked, in evaluation order.
pub const RELEASE_GROUPS: [&str; 3] = ["pretrain", "rl", "opd_refkl"];

/// A checkpoint to evaluate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelEntry {
    /// The name of its output files (`<name>_metrics.json`, `<name>/results.json`, …).
    pub name: String,
    /// Its Hugging Face directory.
    pub path: PathBuf,
}

/// The checkpoints of a release root: `pretrain/**`, `rl/**`, `opd_refkl/**` directories with a
/// `config.json`, in that group order and in natural order within a group (`step20` before
/// `step100`).
pub fn release_models(root: &Path) -> Result<Vec<ModelEntry>> {
    if !root.is_dir() {
        return Err(Error::data(root, None, "release directory not found"));
    }
    let mut models = Vec::new();
    for group in RELEASE_GROUPS {
        let dir = root.join(group);
        if !dir.is_dir() {
            continue;
        }
        let mut found = Vec::new();
        collect_models(&dir, &mut found)?;
        found.sort_by(|a, b| natural_cmp(&a.to_string_lossy(), &b.to_string_lossy()));
        for path in found {
            let relative = path.strip_prefix(root).unwrap_or(&path);
            let name = relative.iter().map(|c| c.to_string_lossy()).collect::<Vec<_>>().join("_");
            models.push(ModelEntry { name, path });
        }
    }
    if models.is_empty() {
        return Err(Error::data(
            root,
            None,
            format!("no checkpoints (directories with a config.json) under {}", RELEASE_GROUPS.join("/, ") + "/"),
        ));
    }
    Ok(models)
}

/// Directories under `dir` (itself included) holding a `config.json`, not looking inside them.
fn collect_models(dir: &Path, found: &mut Vec<PathBuf>) -> Result<()> {
    if dir.join("config.json").is_file() {
        found.push(dir.to_path_buf());
        return Ok(());
    }
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        let hidden = path.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if path.is_dir() && !hidden {
            collect_models(&path, found)?;
        }
    }
    Ok(())
}

/// Model directories given one by one, named like the reference names a checkpoint (its
/// directory name); where two names clash, parent directories are prepended (joined by `_`)
/// until they differ. Every directory must hold a `config.json`.
pub fn named_models(paths: &[PathBuf]) -> Result<Vec<ModelEntry>> {
    for path in paths {
        if !path.join("config.json").is_file() {
            return Err(Error::data(path, None, "not a model directory (no config.json)"));
        }
    }
    let components: Vec<Vec<String>> = paths
        .iter()
        .map(|p| {
            let absolute = std::path::absolute(p).unwrap_or_else(|_| p.clone());
            absolute
                .components()
                .filter_map(|c| match c {
                    std::path::Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
                    _ => None,
                })
                .collect()
        })
        .collect();
    let mut depth = vec![1usize; paths.len()];
    let name = |i: usize, depth: usize| {
        let parts = &components[i];
        parts[parts.len().saturating_sub(depth)..].join("_")
    };
    loop {
        let names: Vec<String> = (0..paths.len()).map(|i| name(i, depth[i])).collect();
        let mut changed = false;
        for i in 0..paths.len() {
            let clash = (0..paths.len()).any(|j| j != i && names[j] == names[i]);
            if clash && depth[i] < components[i].len() {
                depth[i] += 1;
                changed = true;
            }
        }
        if !changed {
            let mut seen = std::collections::HashSet::new();
            for (i, n) in names.iter().enumerate() {
                if !seen.insert(n) {
                    return Err(Error::data(&paths[i], None, format!("given twice (as {n:?})")));
                }
            }
            return Ok(paths.iter().zip(names).map(|(p, name)| ModelEntry { name, path: p.clone() }).collect());
        }
    }
}

/// Compares strings with digit runs by value: `step20` < `step100`, `checkpoint-3762` <
/// `checkpoint-18809`.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a, b);
    loop {
        match (a.chars().next(), b.chars().next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let da = a.len() - a.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                let db = b.len() - b.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                let (na, nb) = (a[..da].trim_start_matches('0'), b[..db].trim_start_matches('0'));
                let order = na.len().cmp(&nb.len()).then_with(|| na.cmp(nb)).then_with(|| da.cmp(&db));
                if order != Ordering::Equal {
                    return order;
                }
                (a, b) = (&a[da..], &b[db..]);
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(&y);
                }
                (a, b) = (&a[x.len_utf8()..], &b[y.len_utf8()..]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("config.json"), "{}").unwrap();
    }

    #[test]
    fn walks_a_release_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        for rel in [
            "pretrain/checkpoint-18809",
            "pretrain/checkpoint-3762",
            "rl/op11_14_step200",
            "rl/op11_14_step20",
            "rl/op13_20_step40",
            "opd_refkl/sweep/step20",
            "opd_refkl/op11_14_step200",
            "evals/ignored",
        ] {
            model(&root.join(rel));
        }
        std::fs::create_dir_all(root.join("rl/empty")).unwrap();
        let names: Vec<String> = release_models(root).unwrap().into_iter().map(|m| m.name).collect();
        assert_eq!(
            names,
            [
                "pretrain_checkpoint-3762",
                "pretrain_checkpoint-18809",
                "rl_op11_14_step20",
                "rl_op11_14_step200",
                "rl_op13_20_step40",
                "opd_refkl_op11_14_step200",
                "opd_refkl_sweep_step20",
            ]
        );
        let e = release_models(&root.join("evals")).unwrap_err().to_string();
        assert!(e.contains("no checkpoints"), "{e}");
    }

    #[test]
    fn names_of_single_models_are_unique() {
        let tmp = tempfile::tempdir().unwrap();
        let a = tmp.path().join("a/rl/step200");
        let b = tmp.path().join("a/opd/step200");
        let c = tmp.path().join("checkpoint-5");
        for d in [&a, &b, &c] {
            model(d);
        }
        let names: Vec<String> =
            named_models(&[a.clone(), b, c]).unwrap().into_iter().map(|m| m.name).collect();
        assert_eq!(names, ["rl_step200", "opd_step200", "checkpoint-5"]);
        assert!(named_models(&[a.clone(), a]).unwrap_err().to_string().contains("given twice"));
        let e = named_models(&[tmp.path().join("nope")]).unwrap_err().to_string();
        assert!(e.contains("no config.json"), "{e}");
    }

    #[test]
    fn natural_order() {
        assert_eq!(natural_cmp("step20", "step100"), Ordering::Less);
        assert_eq!(natural_cmp("a10b2", "a10b10"), Ordering::Less);
        assert_eq!(natural_cmp("x", "x1"), Ordering::Less);
        assert_eq!(natural_cmp("op2", "op2"), Ordering::Equal);
    }
}
