//! Learning-rate schedules, as `transformers.get_scheduler` defines them.
//!
//! `lr(base, k)` is the rate the k-th optimizer update uses (0-based) for the peak rate `base`
//! (the optimizer's own `lr`), i.e. what HF Trainer logs for that step. With `warmup > 0` the
//! first update has rate 0, exactly as in `transformers`.

use std::f64::consts::PI;

use serde::{Deserialize, Serialize};

/// The decay after warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Decay {
    /// `constant` / `constant_with_warmup`.
    Constant,
    /// `linear`: to 0 at the last step.
    Linear,
    /// `cosine` (half a cycle, to 0).
    Cosine,
    /// `cosine_with_min_lr`: cosine from the base rate to `min_lr_rate · base`.
    CosineWithMinLr { min_lr_rate: f64 },
    /// Cosine (to 0) over `steps` updates, never below `floor` (an absolute rate), then `floor`
    /// for the rest: the seed's "120-step cosine clamped at 1e-6", read as
    /// `lr = max(floor, base · cosine(k))`.
    CosineThenFloor { steps: u64, floor: f64 },
}

/// A schedule over `total_steps` optimizer updates: the shape of the rate, whose peak is the
/// optimizer's `lr`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    pub warmup_steps: u64,
    pub total_steps: u64,
    pub decay: Decay,
}

impl Schedule {
    /// The peak rate for every one of `total_steps` updates.
    pub fn constant(total_steps: u64) -> Self {
        Self { warmup_steps: 0, total_steps, decay: Decay::Constant }
    }

    /// HF's `get_warmup_steps`: `ceil(total · ratio)`.
    pub fn warmup_from_ratio(total_steps: u64, ratio: f64) -> u64 {
        (total_steps as f64 * ratio).ceil() as u64
    }

    /// The rate of update `k` for the peak rate `base_lr`.
    pub fn lr(&self, base_lr: f64, k: u64) -> f64 {
        let (w, n) = (self.warmup_steps, self.total_steps);
        if k < w {
            return base_lr * k as f64 / w.max(1) as f64;
        }
        let progress = |end: u64| (k - w) as f64 / end.saturating_sub(w).max(1) as f64;
        let cosine = |p: f64| 0.5 * (1.0 + (PI * p).cos());
        let factor = match self.decay {
            Decay::Constant => 1.0,
            Decay::Linear => ((n - k.min(n)) as f64 / n.saturating_sub(w).max(1) as f64).max(0.0),
            Decay::Cosine => cosine(progress(n)).max(0.0),
            Decay::CosineWithMinLr { min_lr_rate } => cosine(progress(n)) * (1.0 - min_lr_rate) + min_lr_rate,
            Decay::CosineThenFloor { steps, floor } => {
                let p = progress(steps).min(1.0);
                return (base_lr * cosine(p)).max(floor);
            }
        };
        base_lr * factor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every case of `tests/fixtures/optim/schedules.json` (transformers.get_scheduler).
    #[test]
    fn matches_transformers_get_scheduler() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/optim/schedules.json");
        let cases: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        for case in cases.as_array().unwrap() {
            let base_lr = case["base_lr"].as_f64().unwrap();
            let decay = match case["name"].as_str().unwrap() {
                "constant" | "constant_with_warmup" => Decay::Constant,
                "linear" => Decay::Linear,
                "cosine" => Decay::Cosine,
                "cosine_with_min_lr" => Decay::CosineWithMinLr {
                    min_lr_rate: case["kwargs"]["min_lr_rate"]
                        .as_f64()
                        .unwrap_or_else(|| case["kwargs"]["min_lr"].as_f64().unwrap() / base_lr),
                },
                other => panic!("unknown schedule {other}"),
            };
            let schedule = Schedule {
                warmup_steps: case["warmup"].as_u64().unwrap(),
                total_steps: case["steps"].as_u64().unwrap(),
                decay,
            };
            for (k, expected) in case["lrs"].as_array().unwrap().iter().enumerate() {
                let (ours, expected) = (schedule.lr(base_lr, k as u64), expected.as_f64().unwrap());
                assert!((ours - expected).abs() <= 1e-6 * expected.abs().max(1e-12), "{case}: step {k}: {ours} vs {expected}");
            }
        }
    }

    #[test]
    fn seed_cosine_multipliers_from_the_spec() {
        let s = Schedule { warmup_steps: 0, total_steps: 60, decay: Decay::Cosine };
        for (k, expected) in [(0, 1.0), (15, 0.8536), (30, 0.5), (45, 0.1464), (59, 0.000685)] {
            assert!((s.lr(1.0, k) - expected).abs() < 5e-5, "k={k}: {}", s.lr(1.0, k));
        }
        let floor = Schedule { warmup_steps: 0, total_steps: 200, decay: Decay::CosineThenFloor { steps: 120, floor: 1e-6 } };
        let lr = |k| floor.lr(1e-5, k);
        assert_eq!(lr(0), 1e-5);
        assert!((lr(60) - 5e-6).abs() < 1e-18);
        assert_eq!(lr(119), 1e-6, "the clamp holds near the end of the cosine");
        assert_eq!(lr(150), 1e-6);
    }
}
