//! Pre-training mixtures from the Interplay `PRESET.json`, with the reference loader's
//! file-count semantics (LLaMA-Factory `load_compose_data`, `docs/interplay.md` §2.6):
//!
//! ```text
//! for op, p in preset:  size = label of the op's first shard ("…_1B" → 1e9)
//!     want = p · T;  n_full = want // size;  frac = (want % size) / size
//!     chosen = shards[: n_full + 1]          (silently fewer when the op has fewer shards)
//!     last = chosen.pop()                    (only ever sampled)
//!     take chosen fully; if frac > 0, take ceil(frac · rows(last)) shuffled rows of last
//! ```
//!
//! So requested shares act through file counts, and real token counts can differ from the
//! labels. `020305`'s preset has a typo (op 3 = 0.86, the row sums to 1.8); [`TypoPolicy`]
//! reproduces it (the released checkpoints) or fixes it (the intended 20/30/50 mixture).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};

/// Op probabilities of one preset setting.
#[derive(Debug, Clone, PartialEq)]
pub struct Preset {
    pub name: String,
    pub ops: Vec<u32>,
    pub probs: Vec<f64>,
}

/// What to do with the 020305 typo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TypoPolicy {
    /// Use the preset as written (what produced the released checkpoints).
    #[default]
    Reproduce,
    /// Replace `020305`'s op 3 = 0.86 by the intended 0.06 (shares 20/30/50).
    Fix,
}

/// The 020305 setting with the typo.
pub const TYPO_SETTING: &str = "id2-10_0.2easy_0.3medium_0.5hard";

impl Preset {
    /// Reads `setting` of group `task` (e.g. `composition-10B/op_level`) from a PRESET.json.
    pub fn load(path: &Path, task: &str, setting: &str, typo: TypoPolicy) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let json: Value = serde_json::from_str(&text).map_err(|e| Error::json(path, None, e))?;
        let mut node = &json;
        for key in task.split('/').chain([setting]) {
            node = node.get(key).ok_or_else(|| Error::config(path, format!("no preset `{task}/{setting}` (missing `{key}`)")))?;
        }
        let list = |key: &str| -> Result<Vec<f64>> {
            node.get(key)
                .and_then(Value::as_array)
                .and_then(|a| a.iter().map(Value::as_f64).collect::<Option<Vec<f64>>>())
                .ok_or_else(|| Error::config(path, format!("preset `{setting}`: `{key}` is not a list of numbers")))
        };
        let ops: Vec<u32> = list("id_op")?.into_iter().map(|o| o as u32).collect();
        let mut probs = list("op_prob")?;
        if ops.len() != probs.len() {
            return Err(Error::config(path, format!("preset `{setting}`: {} ops but {} probabilities", ops.len(), probs.len())));
        }
        if typo == TypoPolicy::Fix
            && setting == TYPO_SETTING
            && let Some(i) = ops.iter().position(|&o| o == 3)
            && (probs[i] - 0.86).abs() < 1e-9
        {
            probs[i] = 0.06;
        }
        Ok(Self { name: setting.to_string(), ops, probs })
    }
}

/// A shard of one op: its path, the size its file name claims, and its real size.
#[derive(Debug, Clone, PartialEq)]
pub struct Shard {
    pub path: PathBuf,
    /// Token budget from the name (`…_1B.jsonl` → 1e9); the loader sizes every shard of an op by
    /// its first shard's label.
    pub label_tokens: Option<f64>,
    /// Tokens actually in the shard (0 if not counted).
    pub tokens: f64,
    /// Rows in the shard (0 if not counted).
    pub rows: usize,
}

/// `readable2int`: `"1B"` → 1e9, `"500M"` → 5e8, `"10b"` → 1e10, `"2k"` → 2e3, `"42"` → 42.
pub fn readable_to_number(s: &str) -> Option<f64> {
    let s = s.trim();
    let (digits, scale) = match s.chars().last()?.to_ascii_uppercase() {
        'K' => (&s[..s.len() - 1], 1e3),
        'M' => (&s[..s.len() - 1], 1e6),
        'B' | 'G' => (&s[..s.len() - 1], 1e9),
        'T' => (&s[..s.len() - 1], 1e12),
        _ => (s, 1.0),
    };
    digits.parse::<f64>().ok().map(|v| v * scale)
}

/// The size label of a shard file name: the last `_`-separated part of its stem.
pub fn shard_label(path: &Path) -> Option<f64> {
    let name = path.file_name()?.to_str()?;
    let stem = name.split('.').next()?;
    readable_to_number(stem.rsplit('_').next()?)
}

/// What the loader takes from one shard.
#[derive(Debug, Clone, PartialEq)]
pub struct Take {
    pub op: u32,
    pub path: PathBuf,
    /// 1 for a full shard, else the fraction of its rows sampled.
    pub fraction: f64,
    /// Real tokens taken (from [`Shard::tokens`]).
    pub tokens: f64,
}

/// The reference's shard selection for `preset` at `token_budget` tokens. `shards[op]` must be
/// sorted as the reference sorts (case-insensitive by name; see [`sort_shards`]).
pub fn select(preset: &Preset, token_budget: f64, shards: &BTreeMap<u32, Vec<Shard>>) -> Result<Vec<Take>> {
    if !(token_budget.is_finite() && token_budget >= 0.0) {
        return Err(Error::InvalidInput(format!("[data] tokens must be a finite number of tokens >= 0, not {token_budget}")));
    }
    let mut takes = Vec::new();
    for (&op, &p) in preset.ops.iter().zip(&preset.probs) {
        if !(p.is_finite() && p >= 0.0) {
            return Err(Error::InvalidInput(format!("preset `{}`: op {op}'s probability must be a finite number >= 0, not {p}", preset.name)));
        }
        let files = shards.get(&op).filter(|f| !f.is_empty()).ok_or_else(|| {
            Error::InvalidInput(format!("preset `{}` needs op {op}, but there are no shards for it", preset.name))
        })?;
        let size = files[0].label_tokens.unwrap_or(files[0].tokens);
        if size <= 0.0 {
            return Err(Error::InvalidInput(format!("{}: shard size unknown", files[0].path.display())));
        }
        let want = p * token_budget;
        let n_full = (want / size).floor() as usize;
        let frac = (want % size) / size;
        // (A budget past every shard takes them all, as the reference's slice does.)
        let mut chosen: Vec<&Shard> = files.iter().take(n_full.saturating_add(1)).collect();
        let last = chosen.pop().expect("at least one shard");
        takes.extend(chosen.into_iter().map(|s| Take { op, path: s.path.clone(), fraction: 1.0, tokens: s.tokens }));
        if frac > 0.0 {
            let rows = (frac * last.rows as f64).ceil();
            let fraction = if last.rows > 0 { rows / last.rows as f64 } else { frac };
            takes.push(Take { op, path: last.path.clone(), fraction, tokens: last.tokens * fraction });
        }
    }
    Ok(takes)
}

/// Sorts shard paths as the reference does (`sorted(listdir, key=str.lower)`).
pub fn sort_shards(shards: &mut [Shard]) {
    shards.sort_by_key(|s| s.path.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default());
}

/// Each op's share of the selected real tokens, in preset order.
pub fn effective_shares(takes: &[Take]) -> Vec<(u32, f64)> {
    let total: f64 = takes.iter().map(|t| t.tokens).sum();
    let mut shares: Vec<(u32, f64)> = Vec::new();
    for take in takes {
        match shares.last_mut() {
            Some((op, share)) if *op == take.op => *share += take.tokens / total,
            _ => shares.push((take.op, take.tokens / total)),
        }
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per-op real tokens of the released "1B" shards (`docs/interplay.md` §2.6: count, total
    /// billions).
    const RELEASE: [(u32, usize, f64); 9] = [
        (2, 8, 8.7),
        (3, 3, 2.7),
        (4, 6, 5.4),
        (5, 7, 6.6),
        (6, 7, 7.5),
        (7, 6, 5.9),
        (8, 7, 6.9),
        (9, 8, 7.5),
        (10, 8, 6.5),
    ];

    fn release_shards() -> BTreeMap<u32, Vec<Shard>> {
        RELEASE
            .iter()
            .map(|&(op, count, billions)| {
                let shards = (0..count)
                    .map(|i| Shard {
                        path: PathBuf::from(format!("train/{op}/shard{i}_1B.jsonl")),
                        label_tokens: shard_label(Path::new(&format!("shard{i}_1B.jsonl"))),
                        tokens: billions * 1e9 / count as f64,
                        rows: 1_000_000,
                    })
                    .collect();
                (op, shards)
            })
            .collect()
    }

    fn preset(setting: &str, typo: TypoPolicy) -> Preset {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/interplay/PRESET.json");
        Preset::load(Path::new(path), "composition-10B/op_level", setting, typo).unwrap()
    }

    fn band(shares: &[(u32, f64)], ops: std::ops::RangeInclusive<u32>) -> f64 {
        shares.iter().filter(|(op, _)| ops.contains(op)).map(|(_, s)| s).sum()
    }

    #[test]
    fn effective_020305_mixture_matches_the_spec_estimate() {
        let takes = select(&preset(TYPO_SETTING, TypoPolicy::Reproduce), 1e10, &release_shards()).unwrap();
        let total: f64 = takes.iter().map(|t| t.tokens).sum();
        assert!((total / 1e9 - 11.25).abs() < 0.01, "total {total:e}");
        let shares = effective_shares(&takes);
        let op3 = shares.iter().find(|(op, _)| *op == 3).unwrap().1;
        assert!((op3 - 0.208).abs() < 0.001, "op3 {op3}");
        // easy ≈ 33 %, medium ≈ 27 %, hard ≈ 40 % (not the nominal 20/30/50).
        assert!((band(&shares, 2..=4) - 0.33).abs() < 0.01);
        assert!((band(&shares, 5..=7) - 0.27).abs() < 0.01);
        assert!((band(&shares, 8..=10) - 0.40).abs() < 0.01);

        let fixed = select(&preset(TYPO_SETTING, TypoPolicy::Fix), 1e10, &release_shards()).unwrap();
        let fixed_total: f64 = fixed.iter().map(|t| t.tokens).sum();
        assert!((fixed_total / 1e9 - 9.5).abs() < 0.1, "the spec estimates about 9.5B without the typo, got {fixed_total:e}");
    }

    #[test]
    fn effective_050302_total_matches_the_spec_estimate() {
        let setting = "id2-10_0.5easy_0.3medium_0.2hard";
        let takes = select(&preset(setting, TypoPolicy::Reproduce), 1e10, &release_shards()).unwrap();
        let total: f64 = takes.iter().map(|t| t.tokens).sum();
        assert!((total / 1e9 - 9.67).abs() < 0.02, "total {total:e}");
        assert_eq!(preset(setting, TypoPolicy::Fix), preset(setting, TypoPolicy::Reproduce));
    }

    /// A budget past every shard takes them all but each op's last, which the reference's
    /// selection keeps for the remainder (`files[:n_full + 1]`, the last popped); budgets and
    /// probabilities that are not finite numbers >= 0 are errors (an infinite or huge budget
    /// overflowed the shard count and panicked).
    #[test]
    fn huge_and_bad_budgets() {
        let shards = release_shards();
        let all = select(&preset(TYPO_SETTING, TypoPolicy::Reproduce), 1e30, &shards).unwrap();
        let every: usize = shards.values().map(Vec::len).sum();
        assert!(all.len() + shards.len() >= every, "{} takes of {every} shards", all.len());
        for budget in [f64::INFINITY, f64::NAN, -1.0] {
            let err = select(&preset(TYPO_SETTING, TypoPolicy::Reproduce), budget, &shards).unwrap_err().to_string();
            assert!(err.contains("[data] tokens must be a finite number"), "{budget}: {err}");
        }
        let inline = Preset { name: "inline".into(), ops: vec![2, 3], probs: vec![0.5, f64::INFINITY] };
        let err = select(&inline, 1e9, &shards).unwrap_err().to_string();
        assert!(err.contains("op 3's probability"), "{err}");
    }

    #[test]
    fn labels_parse_like_readable2int() {
        assert_eq!(readable_to_number("1B"), Some(1e9));
        assert_eq!(readable_to_number("500M"), Some(5e8));
        assert_eq!(shard_label(Path::new("x/op2_text_1B.jsonl")), Some(1e9));
        assert_eq!(shard_label(Path::new("x/op2-1k.jsonl")), None);
    }
}
