//! The tensors of a Qwen2 checkpoint: one description ([`expected_tensors`]: Hugging Face names,
//! shapes and roles), a [`WeightSource`] that supplies them (a checkpoint or [`RandomInit`]), the
//! `Weights` reader the blocks are built from by name (candle's `VarBuilder` style:
//! `vb.pp("self_attn").pp("q_proj")`), and the way back to named HF tensors.
//!
//! Nothing depends on the order of the blocks' fields or reads: the builder asks by name, and the
//! export and the name map walk the model's module tree, whose field paths are the HF names
//! (`layers.0.self_attn.q_proj.weight` under `model.`; see [`hf_name`]).

use std::cell::RefCell;
use std::collections::HashMap;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

use super::config::Qwen2Config;
use super::dtype::Dtype;
use super::proj;
use super::qwen2::Qwen2;
use crate::error::{Error, Result};

/// How a tensor is initialised and laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorRole {
    /// `nn.Linear` weight, HF `[out, in]` (a [`proj::Proj`] holds it as `[in, out]`).
    LinearWeight,
    /// `nn.Linear` bias.
    Bias,
    /// Embedding matrix `[vocab, hidden]`.
    Embedding,
    /// RMSNorm scale.
    Norm,
}

/// One tensor the model expects, in HF naming and layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub role: TensorRole,
}

impl TensorSpec {
    /// The number of values (saturating).
    pub fn numel(&self) -> u64 {
        self.shape.iter().fold(1u64, |n, &d| n.saturating_mul(d as u64))
    }
}

/// One decoder layer's tensors: the name after `model.layers.{l}.`, the shape, the role.
fn layer_tensors(config: &Qwen2Config) -> [(&'static str, Vec<usize>, TensorRole); 12] {
    let (h, i) = (config.hidden_size, config.intermediate_size);
    let q = config.num_attention_heads * config.head_dim();
    let kv = config.num_kv_heads() * config.head_dim();
    use TensorRole::*;
    [
        ("input_layernorm.weight", vec![h], Norm),
        ("self_attn.q_proj.weight", vec![q, h], LinearWeight),
        ("self_attn.q_proj.bias", vec![q], Bias),
        ("self_attn.k_proj.weight", vec![kv, h], LinearWeight),
        ("self_attn.k_proj.bias", vec![kv], Bias),
        ("self_attn.v_proj.weight", vec![kv, h], LinearWeight),
        ("self_attn.v_proj.bias", vec![kv], Bias),
        ("self_attn.o_proj.weight", vec![h, q], LinearWeight),
        ("post_attention_layernorm.weight", vec![h], Norm),
        ("mlp.gate_proj.weight", vec![i, h], LinearWeight),
        ("mlp.up_proj.weight", vec![i, h], LinearWeight),
        ("mlp.down_proj.weight", vec![h, i], LinearWeight),
    ]
}

/// The tensors outside the layers: the embedding, the final norm, the LM head unless tied.
fn outer_tensors(config: &Qwen2Config) -> Vec<(&'static str, Vec<usize>, TensorRole)> {
    let (h, v) = (config.hidden_size, config.vocab_size);
    let mut out = vec![("model.embed_tokens.weight", vec![v, h], TensorRole::Embedding), ("model.norm.weight", vec![h], TensorRole::Norm)];
    if !config.tie_word_embeddings {
        out.push(("lm_head.weight", vec![v, h], TensorRole::LinearWeight));
    }
    out
}

/// Every tensor of a `Qwen2ForCausalLM` checkpoint for `config`, in a fixed order (the order
/// [`RandomInit`] draws them in). The one description of the architecture's tensors: the model
/// is built from it by name ([`WeightSource`]), and the parameter count and the FLOPs per token
/// ([`parameter_counts`]) are summed from it.
pub fn expected_tensors(config: &Qwen2Config) -> Vec<TensorSpec> {
    let spec = |name: String, shape: Vec<usize>, role| TensorSpec { name, shape, role };
    let mut outer = outer_tensors(config).into_iter().map(|(name, shape, role)| spec(name.into(), shape, role));
    let mut out: Vec<TensorSpec> = outer.next().into_iter().collect();
    for l in 0..config.num_hidden_layers {
        out.extend(layer_tensors(config).into_iter().map(|(name, shape, role)| spec(format!("model.layers.{l}.{name}"), shape, role)));
    }
    out.extend(outer);
    out
}

/// Parameter totals of the tensors [`expected_tensors`] lists, in u128 (a config too large for
/// memory counts rather than overflows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParameterCounts {
    /// Every parameter.
    pub total: u128,
    /// Weights that enter a matrix product per token: the projections and the LM head (the
    /// embedding when tied; an untied embedding is a lookup).
    pub matmul: u128,
    /// One decoder layer's parameters.
    pub layer: u128,
}

/// Sums [`expected_tensors`]' shapes without listing every layer.
pub fn parameter_counts(config: &Qwen2Config) -> ParameterCounts {
    let size = |shape: &[usize]| shape.iter().map(|&d| d as u128).product::<u128>();
    let mut counts = ParameterCounts { total: 0, matmul: 0, layer: 0 };
    let mut add = |shape: &[usize], role: TensorRole, times: u128| {
        counts.total += times * size(shape);
        if role == TensorRole::LinearWeight || (role == TensorRole::Embedding && config.tie_word_embeddings) {
            counts.matmul += times * size(shape);
        }
    };
    let mut layer = 0;
    for (_, shape, role) in layer_tensors(config) {
        add(&shape, role, config.num_hidden_layers as u128);
        layer += size(&shape);
    }
    counts.layer = layer;
    for (_, shape, role) in outer_tensors(config) {
        add(&shape, role, 1);
    }
    counts
}

/// The checkpoint name of the parameter at module path `path` of a [`Qwen2`]: the decoder
/// body's fields are named as under HF's `model.`, and `lm_head` sits at the top.
pub fn hf_name(path: &[String]) -> String {
    let path = path.join(".");
    if path.starts_with("lm_head") { path } else { format!("model.{path}") }
}

/// Supplies host tensors (HF layout, row-major) by name. Tensors are asked for in
/// [`expected_tensors`] order, each once.
pub trait WeightSource {
    /// The tensor `spec.name`, which must have `spec.shape`, in any float dtype (a checkpoint's
    /// own: the model converts it to its dtype, tensor by tensor).
    fn tensor(&mut self, spec: &TensorSpec) -> Result<TensorData>;
}

/// Hugging Face's `_init_weights` for Qwen2: linear and embedding weights ~ N(0, σ), biases 0,
/// norm scales 1. Seeded, and drawn in [`expected_tensors`] order on the host, so the same seed
/// gives the same model on every backend.
pub struct RandomInit {
    rng: ChaCha8Rng,
    normal: Normal<f32>,
}

impl RandomInit {
    pub fn new(std: f64, seed: u64) -> Self {
        Self { rng: ChaCha8Rng::seed_from_u64(seed), normal: Normal::new(0.0, std as f32).expect("finite std") }
    }
}

impl WeightSource for RandomInit {
    fn tensor(&mut self, spec: &TensorSpec) -> Result<TensorData> {
        let len = spec.shape.iter().product();
        let values = match spec.role {
            TensorRole::LinearWeight | TensorRole::Embedding => (0..len).map(|_| self.normal.sample(&mut self.rng)).collect(),
            TensorRole::Bias => vec![0.0f32; len],
            TensorRole::Norm => vec![1.0f32; len],
        };
        Ok(TensorData::new(values, spec.shape.clone()))
    }
}

/// The description and the source behind a tree of [`Weights`]. Whatever the order the blocks
/// ask in, the source is read in description order (tensors asked for later wait here).
struct Store<'s> {
    specs: Vec<TensorSpec>,
    /// The dtype of the model's parameters (`None`: the device's default float, f32 in kiln).
    dtype: Option<DType>,
    index: HashMap<String, usize>,
    source: RefCell<&'s mut dyn WeightSource>,
    /// Tensors `..next` have been read from the source; `waiting` holds those not taken yet.
    next: RefCell<usize>,
    waiting: RefCell<HashMap<usize, TensorData>>,
    taken: RefCell<Vec<bool>>,
    /// Parameters read so far, reported (a 1.5B checkpoint takes seconds to load, more from a
    /// network disk).
    read: std::cell::Cell<u64>,
    stage: crate::progress::Stage,
}

impl<'s> Store<'s> {
    fn new(specs: Vec<TensorSpec>, source: &'s mut dyn WeightSource, dtype: Option<DType>) -> Self {
        let index = specs.iter().enumerate().map(|(i, s)| (s.name.clone(), i)).collect();
        let taken = RefCell::new(vec![false; specs.len()]);
        let total = specs.iter().fold(0u64, |n, s| n.saturating_add(s.numel()));
        let stage = crate::progress::stage("model weights", total, "parameters");
        Self { specs, dtype, index, source: RefCell::new(source), next: RefCell::new(0), waiting: RefCell::default(), taken, read: Default::default(), stage }
    }

    fn take(&self, name: &str) -> Result<TensorData> {
        let &i = self.index.get(name).ok_or_else(|| Error::InvalidInput(format!("the model reads {name}, which Qwen2 checkpoints do not have")))?;
        if std::mem::replace(&mut self.taken.borrow_mut()[i], true) {
            return Err(Error::InvalidInput(format!("the model reads {name} twice")));
        }
        let mut next = self.next.borrow_mut();
        while *next <= i {
            let data = self.source.borrow_mut().tensor(&self.specs[*next])?;
            self.waiting.borrow_mut().insert(*next, data);
            self.read.set(self.read.get() + self.specs[*next].numel());
            self.stage.set_position(self.read.get());
            *next += 1;
        }
        Ok(self.waiting.borrow_mut().remove(&i).expect("read above"))
    }

    /// Checks that the model read every described tensor.
    fn finish(&self) -> Result<()> {
        let unread: Vec<&str> =
            self.specs.iter().zip(self.taken.borrow().iter()).filter(|(_, t)| !**t).map(|(s, _)| s.name.as_str()).collect();
        match unread.is_empty() {
            true => Ok(()),
            false => Err(Error::InvalidInput(format!("the model does not read {}", unread.join(", ")))),
        }
    }
}

/// Reads the tensors of one subtree of the checkpoint by name, relative to a prefix:
/// `vb.pp("mlp").host("up_proj.weight")` reads `<prefix>.mlp.up_proj.weight`.
pub(crate) struct Weights<'a, B: Backend> {
    store: &'a Store<'a>,
    prefix: String,
    device: &'a B::Device,
}

impl<'a, B: Backend> Weights<'a, B> {
    /// The reader of the subtree `name` (a field name or a layer index).
    pub fn pp(&self, name: impl std::fmt::Display) -> Self {
        Self { store: self.store, prefix: self.path(&name.to_string()), device: self.device }
    }

    /// Whether the checkpoint has tensor `name` (e.g. an optional bias).
    pub fn contains(&self, name: &str) -> bool {
        self.store.index.contains_key(&self.path(name))
    }

    /// Tensor `name` in HF layout, host memory, in the model's dtype (f32 for the default).
    pub fn host(&self, name: &str) -> Result<TensorData> {
        Ok(self.store.take(&self.path(name))?.convert_dtype(self.store.dtype.unwrap_or(DType::F32)))
    }

    /// Tensor `name` as a parameter on the device, in HF layout and the model's dtype.
    pub fn get<const N: usize>(&self, name: &str) -> Result<Param<Tensor<B, N>>> {
        let data = self.host(name)?;
        Ok(Param::from_tensor(match self.store.dtype {
            Some(dtype) => Tensor::from_data(data, (self.device, dtype)),
            None => Tensor::from_data(data, self.device),
        }))
    }

    /// The device the model is built on.
    pub fn device(&self) -> &B::Device {
        self.device
    }

    fn path(&self, name: &str) -> String {
        match self.prefix.is_empty() {
            true => name.to_string(),
            false => format!("{}.{name}", self.prefix),
        }
    }
}

impl<B: Backend> Qwen2<B> {
    /// Builds the model from `source` (a checkpoint or [`RandomInit`]), in f32.
    pub fn from_source(config: &Qwen2Config, source: &mut dyn WeightSource, device: &B::Device) -> Result<Self> {
        Self::from_source_as(config, source, device, Dtype::F32)
    }

    /// [`Qwen2::from_source`] with parameters in `dtype` (converted tensor by tensor, so a bf16
    /// model never exists in f32).
    pub fn from_source_as(config: &Qwen2Config, source: &mut dyn WeightSource, device: &B::Device, dtype: Dtype) -> Result<Self> {
        config.validate().map_err(|m| Error::InvalidInput(format!("invalid config: {m}")))?;
        let specs = expected_tensors(config);
        match kiln_backends::device::max_buffer::<B>(device) {
            // Host memory (the CPU backends): all the weights.
            None => fits_in_memory(config, &specs, dtype)?,
            // A device's largest buffer: the largest weight (saturating: a huge config is refused,
            // not overflowed).
            Some(_) => {
                let bytes = |s: &TensorSpec| s.shape.iter().fold(dtype.size() as u64, |n, &d| n.saturating_mul(d as u64));
                if let Some(big) = specs.iter().max_by_key(|s| bytes(s))
                    && let Some(err) = kiln_backends::device::too_large::<B>(device, bytes(big), || format!("weight {} {:?} {}", big.name, big.shape, dtype.name()), "")
                {
                    return Err(err.into());
                }
            }
        }
        // f32 is the device's default float (so a test backend's f64 stays f64).
        let store = Store::new(specs, source, dtype.is_half().then(|| dtype.burn()));
        let model = Qwen2::load(config, &Weights { store: &store, prefix: String::new(), device })?;
        store.finish()?;
        Ok(model)
    }

    /// A randomly initialised model (see [`RandomInit`]).
    pub fn random(config: &Qwen2Config, seed: u64, device: &B::Device) -> Result<Self> {
        Self::from_source(config, &mut RandomInit::new(config.initializer_range, seed), device)
    }

    /// [`Qwen2::random`] in `dtype` (the f32 draws rounded tensor by tensor).
    pub fn random_as(config: &Qwen2Config, seed: u64, device: &B::Device, dtype: Dtype) -> Result<Self> {
        Self::from_source_as(config, &mut RandomInit::new(config.initializer_range, seed), device, dtype)
    }

    /// Every parameter as `(spec, f32 data in HF layout)`, in [`expected_tensors`] order.
    pub fn to_hf_tensors(&self) -> Vec<(TensorSpec, Vec<f32>)> {
        let f32 = |(spec, data): (TensorSpec, TensorData)| (spec, data.convert::<f32>().into_vec().expect("f32 data"));
        self.to_hf_data().into_iter().map(f32).collect()
    }

    /// Every parameter as `(spec, host data in HF layout)`, in the parameter's dtype and
    /// [`expected_tensors`] order.
    pub fn to_hf_data(&self) -> Vec<(TensorSpec, TensorData)> {
        let specs = expected_tensors(&self.config);
        let roles = specs.iter().map(|s| (s.name.clone(), s.role)).collect();
        let mut export = Export { path: Vec::new(), roles, tensors: HashMap::new() };
        self.visit(&mut export);
        let mut tensors = export.tensors;
        specs
            .into_iter()
            .map(|spec| {
                let data = tensors.remove(&spec.name).unwrap_or_else(|| panic!("{} is not a parameter of the model", spec.name));
                (spec, data)
            })
            .collect()
    }

    /// The HF name of every parameter, by burn parameter id.
    pub fn param_names(&self) -> HashMap<ParamId, String> {
        let mut names = Names { path: Vec::new(), names: HashMap::new() };
        self.visit(&mut names);
        names.names
    }
}

/// Collects every parameter's HF name.
struct Names {
    path: Vec<String>,
    names: HashMap<ParamId, String>,
}

impl<B: Backend> ModuleVisitor<B> for Names {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.names.insert(param.id, hf_name(&self.path));
    }
}

/// Collects every parameter as HF host data, by HF name.
struct Export {
    path: Vec<String>,
    roles: HashMap<String, TensorRole>,
    tensors: HashMap<String, TensorData>,
}

impl<B: Backend> ModuleVisitor<B> for Export {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let name = hf_name(&self.path);
        let role = *self.roles.get(&name).unwrap_or_else(|| panic!("parameter {name} is not a Qwen2 checkpoint tensor"));
        let value = match role {
            TensorRole::LinearWeight => proj::to_hf(param.val()),
            _ => param.val(),
        };
        self.tensors.insert(name, value.into_data());
    }
}

/// Refuses weights `specs` that cannot fit in the memory available, in `dtype`, before any is
/// built, with the size `kiln plan` counts for them (a config with `hidden_size` 2^40 is an
/// error line, not an abort on a petabyte allocation).
pub(crate) fn fits_in_memory(config: &Qwen2Config, specs: &[TensorSpec], dtype: Dtype) -> Result<()> {
    let weights: f64 = specs.iter().map(|s| s.shape.iter().map(|&d| d as f64).product::<f64>()).sum::<f64>() * dtype.size() as f64;
    // RoPE's cos and sin tables, f32 (`model::rope`).
    let rope = 2.0 * 4.0 * config.max_position_embeddings as f64 * config.head_dim() as f64;
    let text = kiln_backends::device::bytes_text;
    match available_memory() {
        Some(available) if weights + rope > available as f64 => Err(Error::InvalidInput(format!(
            "the model's weights need {} in {} (as `kiln plan` counts them) and its RoPE tables {}, more than the {} of memory available",
            text(weights),
            dtype.name(),
            text(rope),
            text(available as f64)
        ))),
        _ => Ok(()),
    }
}

/// Memory available to a new allocation without swapping (`MemAvailable` of `/proc/meminfo`;
/// `None` where there is none).
pub(crate) fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
}


#[cfg(test)]
mod tests {
    use super::*;
    // Flex, not NdArray: NdArray is kept for the f64 gradient check (a device fixes its float
    // dtype at first use in a process).
    use burn::backend::Flex;

    fn config(tied: bool) -> Qwen2Config {
        let mut config: Qwen2Config = serde_json::from_str(
            r#"{"vocab_size": 11, "hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 16}"#,
        )
        .unwrap();
        config.tie_word_embeddings = tied;
        config
    }

    #[test]
    fn names_and_export_follow_the_description() {
        for tied in [true, false] {
            let config = config(tied);
            let model = Qwen2::<Flex>::random(&config, 0, &Default::default()).unwrap();
            let specs = expected_tensors(&config);
            let exported: Vec<(String, Vec<usize>, usize)> =
                model.to_hf_tensors().into_iter().map(|(s, v)| (s.name, s.shape, v.len())).collect();
            let described: Vec<(String, Vec<usize>, usize)> =
                specs.iter().map(|s| (s.name.clone(), s.shape.clone(), s.shape.iter().product())).collect();
            assert_eq!(exported, described);
            let mut names: Vec<String> = model.param_names().into_values().collect();
            let mut expected: Vec<String> = specs.into_iter().map(|s| s.name).collect();
            names.sort();
            expected.sort();
            assert_eq!(names, expected, "tied = {tied}");
        }
    }

    #[test]
    fn random_init_draws_every_tensor_in_description_order() {
        let config = config(false);
        let model = Qwen2::<Flex>::random(&config, 5, &Default::default()).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let normal = Normal::new(0.0f32, config.initializer_range as f32).unwrap();
        for (spec, values) in model.to_hf_tensors() {
            let len = spec.shape.iter().product();
            let expected: Vec<f32> = match spec.role {
                TensorRole::LinearWeight | TensorRole::Embedding => (0..len).map(|_| normal.sample(&mut rng)).collect(),
                TensorRole::Bias => vec![0.0; len],
                TensorRole::Norm => vec![1.0; len],
            };
            assert_eq!(values, expected, "{}", spec.name);
        }
    }

    /// Records the order tensors are read in.
    struct Recorder(Vec<String>);

    impl WeightSource for Recorder {
        fn tensor(&mut self, spec: &TensorSpec) -> Result<TensorData> {
            self.0.push(spec.name.clone());
            Ok(TensorData::new(vec![0.0f32; spec.shape.iter().product()], spec.shape.clone()))
        }
    }

    #[test]
    fn sources_are_read_in_description_order_whatever_the_blocks_ask() {
        let specs = expected_tensors(&config(true));
        let mut recorder = Recorder(Vec::new());
        {
            let store = Store::new(specs.clone(), &mut recorder, None);
            let vb = Weights::<Flex> { store: &store, prefix: String::new(), device: &Default::default() };
            let norm = vb.pp("model").pp("norm");
            assert_eq!(norm.host("weight").unwrap().shape.to_vec(), vec![8]);
            for spec in specs.iter().rev().skip(1) {
                vb.host(&spec.name).unwrap();
            }
            store.finish().unwrap();
            let err = vb.host("model.norm.weight").unwrap_err().to_string();
            assert!(err.contains("twice"), "{err}");
            assert!(vb.host("model.norm.bias").unwrap_err().to_string().contains("do not have"));
        }
        assert_eq!(recorder.0, specs.iter().map(|s| s.name.clone()).collect::<Vec<_>>());

        let mut recorder = Recorder(Vec::new());
        let store = Store::new(specs, &mut recorder, None);
        let vb = Weights::<Flex> { store: &store, prefix: String::new(), device: &Default::default() };
        vb.host("model.embed_tokens.weight").unwrap();
        assert!(store.finish().unwrap_err().to_string().contains("does not read model.layers.0.input_layernorm.weight"));
    }
}
