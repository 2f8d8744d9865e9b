//! A smaller scale's ops: which op of the scale stands for each op of the release.
//!
//! The release pre-trains on op 2–10 and trains with RL on 11–14, 13–20 and 15–20. A model small
//! enough for two CPU cores reaches the edge of its competence at much lower ops, so a scale can
//! map the release's ops onto its own (`[scale.cpu] ops = { "2-4" = 2, "5-7" = 3, … }`): every
//! op list and threshold of the release's configs is read in release ops and mapped — the
//! pre-training mixture (the probabilities of the ops that map to one op are added), the RL and
//! OPD prompt ops, the ID threshold of validation and evaluation — and the summary's claims name
//! both ranges. The scale's `splits` are files, written in the scale's own ops.

use std::collections::BTreeMap;

/// The release's ops.
pub const RELEASE_OPS: std::ops::RangeInclusive<u32> = 2..=20;

/// Release op → the scale's op, for every op of [`RELEASE_OPS`], non-decreasing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpMap {
    to: BTreeMap<u32, u32>,
}

impl OpMap {
    /// From `{ "2-4" = 2, "5-7" = 3, … }`: each key a release op or range, each value the scale's op.
    pub fn parse(table: &BTreeMap<String, u32>) -> Result<Self, String> {
        let mut to = BTreeMap::new();
        for (key, &op) in table {
            let ops = super::config::parse_ops(key).map_err(|e| format!("ops: key {key:?}: {e}"))?;
            if !RELEASE_OPS.contains(&op) {
                return Err(format!("ops: {key:?} = {op} is outside 2-20"));
            }
            for release in ops {
                if to.insert(release, op).is_some() {
                    return Err(format!("ops: release op {release} is mapped twice"));
                }
            }
        }
        if let Some(missing) = RELEASE_OPS.clone().find(|op| !to.contains_key(op)) {
            return Err(format!("ops: release op {missing} is not mapped (give every op of 2-20 a scaled op)"));
        }
        let values: Vec<u32> = to.values().copied().collect();
        if let Some(w) = values.windows(2).find(|w| w[1] < w[0]) {
            return Err(format!("ops: the scaled ops must not decrease as the release's rise ({} after {})", w[1], w[0]));
        }
        Ok(Self { to })
    }

    /// The scale's op for release op `op` (ops outside 2–20 are kept).
    pub fn op(&self, op: u32) -> u32 {
        self.to.get(&op).copied().unwrap_or(op)
    }

    /// The scale's ops for release ops `ops`, in order, each once.
    pub fn ops(&self, ops: &[u32]) -> Vec<u32> {
        let mut out: Vec<u32> = ops.iter().map(|&o| self.op(o)).collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// A signed threshold (`id_op_threshold`; negative: none) in the scale's ops.
    pub fn threshold(&self, op: i64) -> i64 {
        u32::try_from(op).map_or(op, |o| self.op(o) as i64)
    }

    /// A mixture over release ops as a mixture over the scale's ops: the probabilities of ops
    /// that map to one op are added.
    pub fn mixture(&self, ops: &[u32], probs: &[f64]) -> (Vec<u32>, Vec<f64>) {
        let mut sums: BTreeMap<u32, f64> = BTreeMap::new();
        for (&op, &p) in ops.iter().zip(probs) {
            *sums.entry(self.op(op)).or_default() += p;
        }
        sums.into_iter().unzip()
    }

    /// `lo-hi` of the release as the scale names it: `5-6 (release 11-14)`, or `11-14` unmapped.
    pub fn range(map: Option<&Self>, lo: u32, hi: u32) -> String {
        let text = |a: u32, b: u32| if a == b { a.to_string() } else { format!("{a}-{b}") };
        match map {
            Some(m) => format!("{} (release {})", text(m.op(lo), m.op(hi)), text(lo, hi)),
            None => text(lo, hi),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    const CPU: [(&str, u32); 7] = [("2-4", 2), ("5-7", 3), ("8-10", 4), ("11-12", 5), ("13-14", 6), ("15-17", 7), ("18-20", 8)];

    #[test]
    fn maps_lists_thresholds_and_mixtures() {
        let m = OpMap::parse(&table(&CPU)).unwrap();
        assert_eq!(m.ops(&[11, 12, 13, 14]), [5, 6]);
        assert_eq!(m.ops(&(13..=20).collect::<Vec<_>>()), [6, 7, 8]);
        assert_eq!(m.threshold(10), 4);
        assert_eq!(m.threshold(-1), -1);
        // 020305 as written (op 3 = .86): easy 1.0, medium .3, hard .5.
        let (ops, probs) = m.mixture(&(2..=10).collect::<Vec<_>>(), &[0.06, 0.86, 0.08, 0.10, 0.10, 0.10, 0.16, 0.16, 0.18]);
        assert_eq!(ops, [2, 3, 4]);
        assert!(probs.iter().zip([1.0, 0.3, 0.5]).all(|(a, b)| (a - b).abs() < 1e-12), "{probs:?}");
        assert_eq!(OpMap::range(Some(&m), 11, 14), "5-6 (release 11-14)");
        assert_eq!(OpMap::range(Some(&m), 2, 4), "2 (release 2-4)");
        assert_eq!(OpMap::range(None, 11, 14), "11-14");
    }

    #[test]
    fn refuses_gaps_doubles_and_reversals() {
        assert!(OpMap::parse(&table(&CPU[..6])).unwrap_err().contains("release op 18 is not mapped"));
        let mut double = table(&CPU);
        double.insert("4".into(), 2);
        assert!(OpMap::parse(&double).unwrap_err().contains("mapped twice"));
        let mut reversed = table(&CPU);
        reversed.insert("11-12".into(), 3);
        assert!(OpMap::parse(&reversed).unwrap_err().contains("must not decrease"));
        let mut outside = table(&CPU);
        outside.insert("18-20".into(), 21);
        assert!(OpMap::parse(&outside).unwrap_err().contains("outside 2-20"));
    }
}
