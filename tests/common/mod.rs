//! Shared helpers of the integration tests: fixture paths and reference data written by
//! `tests/fixtures/make_hf_fixtures.py` (Python `transformers`).
#![allow(dead_code)]

use std::path::PathBuf;

use serde::Deserialize;

/// `tests/fixtures/<rel>` of this checkout, or of the checkout at `$KILN_REPO_DIR` (test binaries
/// built on one machine and run on another, as `scripts/gpu-check.sh` does).
pub fn fixture(rel: &str) -> PathBuf {
    let repo = std::env::var_os("KILN_REPO_DIR").map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    repo.join("tests/fixtures").join(rel)
}

/// The reference models written by transformers.
pub const HF_MODELS: [&str; 3] = ["tied_gqa2", "untied_mha", "gqa3_headdim_bf16_sharded"];

/// `expected.json` of one reference model.
#[derive(Debug, Deserialize)]
pub struct Expected {
    pub sequences: Vec<Vec<u32>>,
    pub pad_id: u32,
    pub greedy: Vec<Vec<u32>>,
}

/// A reference model: its directory, expected.json and expected.safetensors tensors.
pub struct Reference {
    pub dir: PathBuf,
    pub expected: Expected,
    tensors: Vec<u8>,
}

impl Reference {
    pub fn load(name: &str) -> Self {
        let dir = fixture(&format!("hf/{name}"));
        let expected = serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
        let tensors = std::fs::read(dir.join("expected.safetensors")).unwrap();
        Self { dir, expected, tensors }
    }

    /// An f32 tensor of expected.safetensors as (shape, values).
    pub fn tensor(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        f32_tensor(&self.tensors, name)
    }

    /// The f32 tensors of another safetensors file of the model's directory, by name.
    pub fn file_tensors(&self, file: &str) -> impl Fn(&str) -> (Vec<usize>, Vec<f32>) + use<> {
        let bytes = std::fs::read(self.dir.join(file)).unwrap_or_else(|e| panic!("{}: {e}", self.dir.join(file).display()));
        move |name| f32_tensor(&bytes, name)
    }
}

/// An f32 tensor of the safetensors file `bytes` as (shape, values).
fn f32_tensor(bytes: &[u8], name: &str) -> (Vec<usize>, Vec<f32>) {
    let st = safetensors::SafeTensors::deserialize(bytes).unwrap();
    let view = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let values = view.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    (view.shape().to_vec(), values)
}


/// Largest absolute difference of two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// The default wgpu device, after checking that an adapter exists: without one, the wgpu tests
/// fail with instructions rather than passing silently.
#[cfg(feature = "wgpu")]
pub fn wgpu_device() -> burn::backend::wgpu::WgpuDevice {
    use burn::tensor::Tensor;
    let device = burn::backend::wgpu::WgpuDevice::DefaultDevice;
    let probe = std::panic::catch_unwind(|| Tensor::<kiln::backends::Wgpu, 1>::zeros([1], &device).into_data());
    assert!(
        probe.is_ok(),
        "no wgpu adapter: install Mesa's lavapipe (apt-get install mesa-vulkan-drivers) \
         or run the tests without `--features wgpu`"
    );
    device
}
