//! Training precision (`[train] precision`): which dtype the weights and AdamW state are kept in,
//! and which the forward and backward passes compute in.
//!
//! - `f32`: everything in f32.
//! - `bf16-mixed` / `f16-mixed`: f32 master weights and f32 AdamW state; the forward and backward
//!   run on half-precision copies of the weights ([`crate::model::proj`] casts each weight where
//!   it is used, and the gradient flows back through the cast to the f32 weight) with RMSNorm
//!   statistics, attention's softmax, the log-softmax and the loss in f32. This is what
//!   DeepSpeed's bf16 mode does under HF Trainer (OpenR1's runs: a bf16 model for compute, f32
//!   masters and optimizer state). f16 adds dynamic loss scaling ([`LossScale`], torch's
//!   `GradScaler`), as f16 gradients underflow without it. On a CPU with AVX512-BF16, bf16-mixed
//!   keeps the activations in f32 and rounds to bf16 only the operands of the projections'
//!   products, forward and backward (each product exact, sums in f32; what `torch.autocast`
//!   rounds, without rounding the products' outputs), so the fused f32 kernels serve the rest
//!   and no bf16 copy of the weights is kept ([`Qwen2::with_compute_dtype`]).
//! - `bf16-pure`: weights, gradients and AdamW state in bf16, as a plain HF Trainer run on a
//!   model loaded in bf16. Updates much smaller than a weight's bf16 spacing (2⁻⁸ of it) round
//!   away, so at the seed's 1e-6 learning rates most weights never move (spec code-sft §5.5);
//!   each step's metrics record the fraction an update changed (`weights_changed`).

use std::str::FromStr;

use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::{Dtype, Qwen2};

/// `[train] precision`; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Precision {
    #[default]
    #[serde(rename = "f32")]
    F32,
    #[serde(rename = "bf16-mixed")]
    Bf16Mixed,
    #[serde(rename = "f16-mixed")]
    F16Mixed,
    #[serde(rename = "bf16-pure")]
    Bf16Pure,
}

impl Precision {
    /// Every setting, by name.
    pub const ALL: [Precision; 4] = [Self::F32, Self::Bf16Mixed, Self::F16Mixed, Self::Bf16Pure];

    /// The name configs use.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16Mixed => "bf16-mixed",
            Self::F16Mixed => "f16-mixed",
            Self::Bf16Pure => "bf16-pure",
        }
    }

    /// The dtype of the weights the optimizer updates (and of its state).
    pub fn weights(self) -> Dtype {
        match self {
            Self::F32 | Self::Bf16Mixed | Self::F16Mixed => Dtype::F32,
            Self::Bf16Pure => Dtype::BF16,
        }
    }

    /// The dtype the forward and backward passes compute in.
    pub fn compute(self) -> Dtype {
        match self {
            Self::F32 => Dtype::F32,
            Self::Bf16Mixed | Self::Bf16Pure => Dtype::BF16,
            Self::F16Mixed => Dtype::F16,
        }
    }

    /// The setting that computes in `dtype` with f32 master weights (f32 for f32).
    pub fn mixed(dtype: Dtype) -> Self {
        match dtype {
            Dtype::F32 => Self::F32,
            Dtype::BF16 => Self::Bf16Mixed,
            Dtype::F16 => Self::F16Mixed,
        }
    }

    /// An error unless backend `B` computes in this precision's dtypes on `device`.
    pub fn check<B: Backend>(self, device: &B::Device) -> Result<()> {
        self.compute().check::<B>(device)
    }

    /// `model` with weights in [`Precision::weights`] computing in [`Precision::compute`].
    pub fn prepare<B: Backend>(self, model: Qwen2<B>) -> Qwen2<B> {
        let model = if model.dtype() == self.weights() { model } else { model.cast(self.weights()) };
        if self.compute() == self.weights() { model } else { model.with_compute_dtype(self.compute()) }
    }

    /// The loss scaling this precision needs (f16's).
    pub fn loss_scale(self) -> Option<LossScale> {
        (self == Self::F16Mixed).then(LossScale::default)
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            Error::InvalidInput(format!("unknown precision {s:?} (f32, bf16-mixed, f16-mixed, bf16-pure)"))
        })
    }
}

/// Dynamic loss scaling with `torch.amp.GradScaler`'s defaults: the loss is multiplied by
/// `scale` before the backward pass and the gradients divided by it before clipping; an update
/// whose gradients overflow is skipped and halves the scale, 2000 clean updates in a row double it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossScale {
    pub scale: f64,
    /// Clean updates since the scale last changed.
    pub clean_updates: u32,
}

impl Default for LossScale {
    fn default() -> Self {
        Self { scale: 65536.0, clean_updates: 0 }
    }
}

impl LossScale {
    const GROWTH_INTERVAL: u32 = 2000;

    /// Records an update attempt: `finite` gradients count toward growth, others halve the scale.
    pub fn update(&mut self, finite: bool) {
        if finite {
            self.clean_updates += 1;
            if self.clean_updates == Self::GROWTH_INTERVAL {
                self.scale *= 2.0;
                self.clean_updates = 0;
            }
        } else {
            self.scale *= 0.5;
            self.clean_updates = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn names_and_dtypes() {
        for p in Precision::ALL {
            assert_eq!(p.name().parse::<Precision>().unwrap(), p);
            assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{p}\""));
        }
        assert_eq!((Precision::Bf16Mixed.weights(), Precision::Bf16Mixed.compute()), (Dtype::F32, Dtype::BF16));
        assert_eq!((Precision::Bf16Pure.weights(), Precision::Bf16Pure.compute()), (Dtype::BF16, Dtype::BF16));
        assert!("bf16".parse::<Precision>().unwrap_err().to_string().contains("bf16-mixed"));
    }

    #[test]
    fn prepare_sets_weights_and_activations() {
        let config: crate::model::Qwen2Config = serde_json::from_str(
            r#"{"vocab_size": 11, "hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 1,
                "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 16}"#,
        )
        .unwrap();
        let model = || Qwen2::<Flex>::random(&config, 0, &Default::default()).unwrap();
        for p in Precision::ALL {
            let m = p.prepare(model());
            assert_eq!((m.dtype(), m.compute_dtype()), (p.weights(), p.compute()), "{p}");
        }
    }

    #[test]
    fn loss_scale_backs_off_and_grows() {
        let mut s = LossScale::default();
        s.update(false);
        assert_eq!(s.scale, 32768.0);
        for _ in 0..1999 {
            s.update(true);
        }
        assert_eq!(s.scale, 32768.0);
        s.update(true);
        assert_eq!((s.scale, s.clean_updates), (65536.0, 0));
    }
}
