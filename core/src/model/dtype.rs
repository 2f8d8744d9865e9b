//! The floating-point format of a model's weights and activations, and of saved tensors.
//!
//! burn 0.21 fixes a device's *default* float dtype at its first tensor, once per process, so
//! kiln never changes the default: half-precision tensors are created with an explicit dtype
//! ([`Dtype::burn`]) and everything computed from them keeps it. Which backend has which format
//! (checked by [`Dtype::check`]): Flex (CPU) stores bf16 and f16 and computes through f32, but
//! for the products of bf16 values on CPUs with AVX512-BF16 (`model::fused::gemm_bf16`);
//! NdArray has neither; wgpu has f16 only on adapters with `SHADER_F16` (Mesa's lavapipe has
//! it) and no bf16 (WGSL has none); CUDA has both.

use std::str::FromStr;

use burn::tensor::DType;
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// f32, bf16 or f16 (written `f32`, `bf16`, `f16`; `float32`, `bfloat16`, `float16` also read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    #[default]
    #[serde(alias = "float32")]
    F32,
    #[serde(alias = "bfloat16")]
    BF16,
    #[serde(alias = "float16")]
    F16,
}

impl Dtype {
    /// burn's dtype.
    pub fn burn(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::BF16 => DType::BF16,
            Self::F16 => DType::F16,
        }
    }

    /// The format of a burn dtype, if it is one of the three.
    pub fn from_burn(dtype: DType) -> Option<Self> {
        match dtype {
            DType::F32 => Some(Self::F32),
            DType::BF16 => Some(Self::BF16),
            DType::F16 => Some(Self::F16),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::BF16 | Self::F16 => 2,
        }
    }

    /// Whether this is bf16 or f16.
    pub fn is_half(self) -> bool {
        self != Self::F32
    }

    /// `torch_dtype` of a Hugging Face `config.json`.
    pub fn torch_name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::BF16 => "bfloat16",
            Self::F16 => "float16",
        }
    }

    /// The name kiln writes (`f32`, `bf16`, `f16`).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::BF16 => "bf16",
            Self::F16 => "f16",
        }
    }

    /// An error unless backend `B` computes in this format on `device`.
    pub fn check<B: Backend>(self, device: &B::Device) -> Result<()> {
        if B::supports_dtype(device, self.burn()) {
            return Ok(());
        }
        let backend = B::name(device);
        let wgpu = backend.contains("wgpu") || backend.contains("wgsl") || backend.contains("vulkan");
        let hint = match self {
            Self::BF16 if wgpu => "WGSL has no bf16; use f16 (on an adapter with SHADER_F16), f32, or cuda",
            Self::F16 if wgpu => "this adapter lacks SHADER_F16; use f32",
            _ => "use f32",
        };
        Err(Error::InvalidInput(format!("the {backend} backend cannot compute in {}: {hint}", self.name())))
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Dtype {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" | "float32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::BF16),
            "f16" | "float16" => Ok(Self::F16),
            other => Err(Error::InvalidInput(format!("unknown dtype {other:?} (f32, bf16, f16)"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Flex, NdArray};

    #[test]
    fn names_parse_and_print() {
        for d in [Dtype::F32, Dtype::BF16, Dtype::F16] {
            assert_eq!(d.name().parse::<Dtype>().unwrap(), d);
            assert_eq!(d.torch_name().parse::<Dtype>().unwrap(), d);
            assert_eq!(Dtype::from_burn(d.burn()), Some(d));
            let json = serde_json::to_string(&d).unwrap();
            assert_eq!(json, format!("\"{}\"", d.name()));
        }
        assert_eq!(serde_json::from_str::<Dtype>("\"bfloat16\"").unwrap(), Dtype::BF16);
        assert!("f64".parse::<Dtype>().unwrap_err().to_string().contains("f32, bf16, f16"));
    }

    #[test]
    fn backends_are_checked() {
        Dtype::BF16.check::<Flex>(&Default::default()).unwrap();
        Dtype::F16.check::<Flex>(&Default::default()).unwrap();
        let err = Dtype::BF16.check::<NdArray>(&Default::default()).unwrap_err().to_string();
        assert!(err.contains("cannot compute in bf16"), "{err}");
    }
}
