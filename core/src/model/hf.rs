//! Hugging Face model directories: `config.json` + `model.safetensors` (or a sharded
//! `model.safetensors.index.json`) + tokenizer files.
//!
//! Loading checks every tensor name, shape and dtype against the config before building
//! anything, and reports all mismatches by tensor name. Natively the safetensors files are
//! memory-mapped; [`load_bytes`] builds the model from files already in memory (the browser
//! fetches them; on `wasm32` there are no memory maps). Saving writes into a temporary sibling
//! directory and renames it into place, so a crash never leaves a half-written model behind.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use burn::tensor::TensorData;
use burn::tensor::backend::Backend;
#[cfg(not(target_arch = "wasm32"))]
use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors, View};
use serde_json::Value;

use super::config::Qwen2Config;
use super::dtype::Dtype;
use super::qwen2::Qwen2;
use super::weights::{RandomInit, TensorSpec, WeightSource, expected_tensors};
use crate::error::{Error, Result};

/// The safetensors file of an unsharded model directory.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The index of a sharded model directory (its `weight_map` names the shards).
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Tokenizer and generation files copied next to a saved model when present in the source.
pub const COMPANION_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "generation_config.json",
    "chat_template.jinja",
];

/// Changes a run makes to the companion files it saves with a model: the chat template it
/// trained with and the EOS token that template ends turns with, as TRL's SFT saves them
/// (`chat_template_path`; `clone_chat_template` also takes the template's model's EOS).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CompanionEdits {
    /// Written as `chat_template.jinja` (and dropped from `tokenizer_config.json`, so that the
    /// file is the one template).
    pub chat_template: Option<String>,
    /// The EOS token and its id: `tokenizer_config.json`'s and `special_tokens_map.json`'s
    /// `eos_token`, `config.json`'s and `generation_config.json`'s `eos_token_id`.
    pub eos: Option<(String, u32)>,
    /// Keep `generation_config.json`'s other EOS ids after the new one (TRL's `eos_token`;
    /// `clone_chat_template` replaces them).
    pub keep_generation_eos: bool,
}

impl CompanionEdits {
    /// The files the edits change (besides writing `chat_template.jinja`).
    const EDITED: [&'static str; 4] = ["tokenizer_config.json", "special_tokens_map.json", "config.json", "generation_config.json"];

    /// Whether there is nothing to change.
    pub fn is_empty(&self) -> bool {
        self.chat_template.is_none() && self.eos.is_none()
    }

    /// Applies the edits to the model directory `dir` (its files written already). The JSON
    /// files are rewritten with sorted keys, as transformers writes them.
    pub fn apply(&self, dir: &Path) -> Result<()> {
        if let Some(template) = &self.chat_template {
            let path = dir.join("chat_template.jinja");
            std::fs::write(&path, template).map_err(|e| Error::io(&path, e))?;
        }
        for name in Self::EDITED {
            let path = dir.join(name);
            if let Some(text) = self.edited(&path)? {
                std::fs::write(&path, text).map_err(|e| Error::io(&path, e))?;
            }
        }
        Ok(())
    }

    /// Checks that the edits apply to the files of `dir` (a run's tokenizer directory, before
    /// it trains: not at its first checkpoint).
    pub fn check(&self, dir: &Path) -> Result<()> {
        Self::EDITED.iter().try_for_each(|name| self.edited(&dir.join(name)).map(drop))
    }

    /// The new text of the JSON file at `path`, if it exists and the edits change it.
    fn edited(&self, path: &Path) -> Result<Option<String>> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let changes = match name {
            "tokenizer_config.json" => self.chat_template.is_some() || self.eos.is_some(),
            _ => self.eos.is_some(),
        };
        if !changes || !path.is_file() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let mut json: Value = serde_json::from_str(&text).map_err(|e| Error::json(path, None, e))?;
        let fields = json.as_object_mut().ok_or_else(|| Error::data(path, None, "expected a JSON object"))?;
        if name == "tokenizer_config.json" && self.chat_template.is_some() {
            fields.remove("chat_template");
        }
        if let Some((token, id)) = &self.eos {
            match name {
                // A token written as an added-token object keeps its form, with the new content.
                "tokenizer_config.json" | "special_tokens_map.json" => match fields.get_mut("eos_token") {
                    Some(Value::Object(token_fields)) => {
                        token_fields.insert("content".into(), token.clone().into());
                    }
                    _ => {
                        fields.insert("eos_token".into(), token.clone().into());
                    }
                },
                "config.json" => {
                    fields.insert("eos_token_id".into(), (*id).into());
                }
                _ => {
                    let mut ids: Vec<Value> = match fields.get("eos_token_id") {
                        Some(Value::Array(ids)) if self.keep_generation_eos => ids.clone(),
                        Some(old @ Value::Number(_)) if self.keep_generation_eos => vec![old.clone()],
                        _ => Vec::new(),
                    };
                    let id = Value::from(*id);
                    if !ids.contains(&id) {
                        ids.insert(0, id.clone());
                    }
                    fields.insert("eos_token_id".into(), if ids.len() == 1 { id } else { Value::Array(ids) });
                }
            }
        }
        Ok(Some(serde_json::to_string_pretty(&json).map_err(|e| Error::json(path, None, e))? + "\n"))
    }
}

/// Floating-point format of saved tensors (the model's [`Dtype`]; the old name is kept).
pub type SaveDtype = Dtype;

/// The bytes of one safetensors file: memory-mapped, or owned (see [`load_bytes`]).
enum FileBytes {
    #[cfg(not(target_arch = "wasm32"))]
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            FileBytes::Mapped(map) => map,
            FileBytes::Owned(bytes) => bytes,
        }
    }
}

/// The safetensors files of one model directory, memory-mapped (or in memory: [`Self::from_bytes`]).
pub struct SafetensorsDir {
    dir: PathBuf,
    files: Vec<(PathBuf, FileBytes)>,
    /// Tensor name → index into `files`.
    index: HashMap<String, usize>,
}

impl SafetensorsDir {
    /// Opens `dir/model.safetensors` or every shard listed in `dir/model.safetensors.index.json`.
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join(INDEX_FILE);
        let file_names: Vec<String> = if dir.join(SINGLE_FILE).is_file() {
            vec![SINGLE_FILE.to_string()]
        } else if index_path.is_file() {
            let text = std::fs::read(&index_path).map_err(|e| Error::io(&index_path, e))?;
            shard_names(&index_path, &text)?
        } else {
            return Err(Error::checkpoint(dir, format!("neither {SINGLE_FILE} nor {INDEX_FILE} found")));
        };
        let mut files = Vec::new();
        for name in file_names {
            let path = dir.join(&name);
            files.push((path.clone(), read_file(&path)?));
        }
        Self::from_files(dir, files)
    }

    /// The safetensors files `(name, bytes)` of the model directory `dir` (a path or a URL,
    /// used in error messages), already in memory.
    pub fn from_bytes(dir: &Path, files: Vec<(String, Vec<u8>)>) -> Result<Self> {
        Self::from_files(dir, files.into_iter().map(|(name, bytes)| (dir.join(name), FileBytes::Owned(bytes))).collect())
    }

    fn from_files(dir: &Path, files: Vec<(PathBuf, FileBytes)>) -> Result<Self> {
        let mut index = HashMap::new();
        for (i, (path, bytes)) in files.iter().enumerate() {
            let tensors = SafeTensors::deserialize(bytes)
                .map_err(|e| Error::checkpoint(path, format!("not a valid safetensors file: {e}")))?;
            for tensor_name in tensors.names() {
                if let Some(previous) = index.insert(tensor_name.to_string(), i) {
                    let message = format!("tensor {tensor_name} is also stored in {}", files[previous].0.display());
                    return Err(Error::checkpoint(path, message));
                }
            }
        }
        Ok(Self { dir: dir.to_path_buf(), files, index })
    }

    /// Checks names, shapes and dtypes against `expected`; lists every problem at once.
    pub fn check(&self, expected: &[TensorSpec], tied: bool) -> Result<()> {
        let mut problems = Vec::new();
        for spec in expected {
            match self.view(&spec.name) {
                Err(_) => problems.push(format!("missing tensor {}", spec.name)),
                Ok((_, view)) => {
                    if view.shape() != spec.shape.as_slice() {
                        problems.push(format!(
                            "tensor {} has shape {:?}, the config expects {:?}",
                            spec.name,
                            view.shape(),
                            spec.shape
                        ));
                    }
                    if !matches!(view.dtype(), StDtype::F32 | StDtype::BF16 | StDtype::F16) {
                        problems.push(format!("tensor {} has unsupported dtype {:?}", spec.name, view.dtype()));
                    }
                }
            }
        }
        let known: std::collections::HashSet<&str> = expected.iter().map(|s| s.name.as_str()).collect();
        let mut unexpected: Vec<&String> = self
            .index
            .keys()
            .filter(|n| !known.contains(n.as_str()))
            // Tied checkpoints may still carry the (ignored) head; old ones carry RoPE buffers.
            .filter(|n| !(tied && n.as_str() == "lm_head.weight") && !n.ends_with("rotary_emb.inv_freq"))
            .collect();
        unexpected.sort();
        problems.extend(unexpected.into_iter().map(|n| format!("unexpected tensor {n}")));
        if problems.is_empty() {
            return Ok(());
        }
        let shown = problems.len().min(12);
        let more = if problems.len() > shown { format!("; and {} more", problems.len() - shown) } else { String::new() };
        let listed = problems[..shown].join("; ");
        Err(Error::checkpoint(&self.dir, format!("checkpoint does not match config.json: {listed}{more}")))
    }

    fn view(&self, name: &str) -> Result<(&Path, safetensors::tensor::TensorView<'_>)> {
        let &file = self.index.get(name).ok_or_else(|| Error::checkpoint(&self.dir, format!("missing tensor {name}")))?;
        let (path, bytes) = &self.files[file];
        let corrupt = |e: safetensors::SafeTensorError| Error::checkpoint(path, format!("tensor {name}: {e}"));
        let view = SafeTensors::deserialize(bytes).and_then(|t| t.tensor(name)).map_err(corrupt)?;
        Ok((path.as_path(), view))
    }
}

impl WeightSource for SafetensorsDir {
    /// The tensor in the file's dtype (no f32 copy of a bf16 checkpoint). Its pages of the
    /// memory map are released once read, so loading never holds the file and the model at once.
    fn tensor(&mut self, spec: &TensorSpec) -> Result<TensorData> {
        let (path, view) = self.view(&spec.name)?;
        let data = decode(&view, spec.shape.clone())
            .ok_or_else(|| Error::checkpoint(path, format!("tensor {} has unsupported dtype {:?}", spec.name, view.dtype())))?;
        if data.num_elements() != spec.shape.iter().product::<usize>() {
            return Err(Error::checkpoint(path, format!("tensor {} has the wrong number of elements", spec.name)));
        }
        let bytes = view.data();
        release(&self.files[self.index[&spec.name]].1, bytes.as_ptr(), bytes.len());
        Ok(data)
    }
}

/// Tells the kernel that the pages of a memory-mapped `file` under `[start, start + len)` are
/// not needed any more, so they stop counting as resident (they are read from the file again if
/// touched). Files already in memory ([`load_bytes`]) are left as they are.
fn release(file: &FileBytes, start: *const u8, len: usize) {
    #[cfg(unix)]
    if let FileBytes::Mapped(mmap) = file {
        let offset = start as usize - mmap.as_ptr() as usize;
        // SAFETY: a read-only, file-backed mapping: dropped pages (memmap2 widens the range to
        // whole pages, which may hold neighbouring tensors) are re-read from the file, which is
        // not changed while the map lives.
        let _ = unsafe { mmap.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len) };
    }
    #[cfg(not(unix))]
    let _ = (file, start, len);
}

/// An F32, BF16 or F16 tensor as host data of the same dtype, `shape` `[..]`.
fn decode(view: &safetensors::tensor::TensorView<'_>, shape: Vec<usize>) -> Option<TensorData> {
    let bytes = view.data();
    Some(match view.dtype() {
        StDtype::F32 => TensorData::new(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(), shape),
        StDtype::BF16 => TensorData::new(bytes.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]])).collect(), shape),
        StDtype::F16 => TensorData::new(bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]])).collect(), shape),
        _ => return None,
    })
}

/// A safetensors file's bytes: memory-mapped natively, read into memory on `wasm32`.
fn read_file(path: &Path) -> Result<FileBytes> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the map is read-only and we do not modify checkpoint files while loading.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        Ok(FileBytes::Mapped(map))
    }
    #[cfg(target_arch = "wasm32")]
    {
        std::fs::read(path).map(FileBytes::Owned).map_err(|e| Error::io(path, e))
    }
}

/// The shard file names of a sharded checkpoint's index (`model.safetensors.index.json`, read
/// from `path`), sorted, each once.
pub fn shard_names(path: &Path, index_json: &[u8]) -> Result<Vec<String>> {
    let index: Value = serde_json::from_slice(index_json).map_err(|e| Error::json(path, None, e))?;
    let map = index
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| Error::checkpoint(path, "no `weight_map` object"))?;
    let mut shards: Vec<String> = map.values().filter_map(|v| v.as_str().map(String::from)).collect();
    shards.sort();
    shards.dedup();
    Ok(shards)
}

/// Loads a Qwen2 model from a Hugging Face directory onto `device`, in f32, with the
/// directory's end-of-sequence ids ([`eos_token_ids`]).
pub fn load<B: Backend>(dir: impl AsRef<Path>, device: &B::Device) -> Result<Qwen2<B>> {
    load_as(dir, device, Dtype::F32)
}

/// [`load`] with weights (and so activations) in `dtype`, whatever the checkpoint stores: a bf16
/// checkpoint loads as bf16 without an f32 copy.
pub fn load_as<B: Backend>(dir: impl AsRef<Path>, device: &B::Device, dtype: Dtype) -> Result<Qwen2<B>> {
    let dir = dir.as_ref();
    dtype.check::<B>(device)?;
    let config = Qwen2Config::from_file(dir.join("config.json"))?;
    let eos_token_ids = eos_token_ids(dir, &config)?;
    let weights = SafetensorsDir::open(dir)?;
    build(&config, eos_token_ids, weights, device, dtype)
}

/// The files of a model directory, already in memory (the browser fetches them).
#[derive(Debug, Clone, Default)]
pub struct ModelBytes {
    /// `config.json`.
    pub config: Vec<u8>,
    /// `generation_config.json`, if the directory has one.
    pub generation_config: Option<Vec<u8>>,
    /// `model.safetensors`, or every shard named by [`shard_names`], as `(file name, bytes)`.
    pub safetensors: Vec<(String, Vec<u8>)>,
}

/// Loads a Qwen2 model as [`load`] does, from the files of the model directory `dir` already in
/// memory; `dir` (a path or a URL) only names the files in error messages.
pub fn load_bytes<B: Backend>(dir: &Path, files: ModelBytes, device: &B::Device) -> Result<Qwen2<B>> {
    let config_path = dir.join("config.json");
    let config: Qwen2Config = serde_json::from_slice(&files.config).map_err(|e| Error::json(&config_path, None, e))?;
    config.validate().map_err(|message| Error::config(&config_path, message))?;
    let generation_path = dir.join("generation_config.json");
    let generation = match &files.generation_config {
        Some(bytes) => Some(serde_json::from_slice(bytes).map_err(|e| Error::json(&generation_path, None, e))?),
        None => None,
    };
    let eos_token_ids = merge_eos_ids(&config, generation.as_ref());
    let weights = SafetensorsDir::from_bytes(dir, files.safetensors)?;
    build(&config, eos_token_ids, weights, device, Dtype::F32)
}

fn build<B: Backend>(config: &Qwen2Config, eos_token_ids: Vec<u32>, mut weights: SafetensorsDir, device: &B::Device, dtype: Dtype) -> Result<Qwen2<B>> {
    weights.check(&expected_tensors(config), config.tie_word_embeddings)?;
    Ok(Qwen2 { eos_token_ids, ..Qwen2::from_source_as(config, &mut weights, device, dtype)? })
}

/// The end-of-sequence ids of the model directory `dir` with config `config`: the
/// `eos_token_id` (one id or a list) of `config.json` and of `generation_config.json` when that
/// file exists, sorted, without repeats. (`transformers` takes `generation_config.json`'s where it
/// has one; the union differs only for a directory whose two files disagree.)
pub fn eos_token_ids(dir: &Path, config: &Qwen2Config) -> Result<Vec<u32>> {
    let path = dir.join("generation_config.json");
    let generation: Option<Value> = match path.is_file() {
        true => {
            let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
            Some(serde_json::from_str(&text).map_err(|e| Error::json(&path, None, e))?)
        }
        false => None,
    };
    Ok(merge_eos_ids(config, generation.as_ref()))
}

/// The union of `config`'s EOS ids and those of a parsed `generation_config.json`, sorted.
fn merge_eos_ids(config: &Qwen2Config, generation: Option<&Value>) -> Vec<u32> {
    let mut ids = config.eos_token_ids();
    match generation.and_then(|json| json.get("eos_token_id")) {
        Some(Value::Number(n)) => ids.extend(n.as_u64().map(|v| v as u32)),
        Some(Value::Array(a)) => ids.extend(a.iter().filter_map(Value::as_u64).map(|v| v as u32)),
        _ => {}
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// A tensor ready for serialisation.
struct OwnedView {
    dtype: StDtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &OwnedView {
    fn dtype(&self) -> StDtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// `data` as little-endian bytes of `dtype`.
fn encode(data: TensorData, dtype: Dtype) -> (StDtype, Vec<u8>) {
    let data = data.convert_dtype(dtype.burn());
    match dtype {
        Dtype::F32 => (StDtype::F32, data.as_slice::<f32>().expect("f32").iter().flat_map(|v| v.to_le_bytes()).collect()),
        Dtype::BF16 => (StDtype::BF16, data.as_slice::<half::bf16>().expect("bf16").iter().flat_map(|v| v.to_le_bytes()).collect()),
        Dtype::F16 => (StDtype::F16, data.as_slice::<half::f16>().expect("f16").iter().flat_map(|v| v.to_le_bytes()).collect()),
    }
}

/// Saves `model` as a Hugging Face directory at `dir`, which must not exist yet (or be empty).
/// Tokenizer files ([`COMPANION_FILES`]) are copied from `companions` when given.
pub fn save<B: Backend>(model: &Qwen2<B>, dir: impl AsRef<Path>, dtype: SaveDtype, companions: Option<&Path>) -> Result<()> {
    write_atomically(dir.as_ref(), |tmp| write_model_files(model, tmp, dtype, companions))
}

/// Writes `config.json`, `model.safetensors` and the companion files of `model` into the
/// existing directory `dir` (no atomicity: see [`save`]).
pub fn write_model_files<B: Backend>(model: &Qwen2<B>, dir: &Path, dtype: SaveDtype, companions: Option<&Path>) -> Result<()> {
    let tensors = model.to_hf_data().into_iter().map(|(spec, data)| (spec.name, spec.shape, data));
    write_directory(model.config(), tensors, dir, dtype, companions)
}

/// Writes a randomly initialised model (the tensors of [`Qwen2::random`] for `config` and
/// `seed`) as a Hugging Face directory at `dir` (atomically, as [`save`]), one tensor at a time:
/// memory holds the saved bytes, never an f32 model.
pub fn save_random(config: &Qwen2Config, seed: u64, dir: impl AsRef<Path>, dtype: Dtype, companions: Option<&Path>) -> Result<()> {
    config.validate().map_err(|m| Error::InvalidInput(format!("invalid config: {m}")))?;
    let specs = expected_tensors(config);
    super::weights::fits_in_memory(config, &specs, dtype)?;
    // (Drawing a 1.5B model's weights takes a while, shown with an ETA: not for a directory it
    // could not then be written to.)
    crate::io::refuse_non_empty_dir(dir.as_ref())?;
    let mut source = RandomInit::new(config.initializer_range, seed);
    let total: u64 = specs.iter().map(|s| s.shape.iter().product::<usize>() as u64).sum();
    let stage = crate::progress::stage("initialising weights", total, "parameters");
    let mut drawn = 0;
    let tensors = specs
        .into_iter()
        .map(|spec| {
            let data = source.tensor(&spec)?.convert_dtype(dtype.burn());
            drawn += spec.shape.iter().product::<usize>() as u64;
            stage.set_position(drawn);
            Ok((spec.name, spec.shape, data))
        })
        .collect::<Result<Vec<_>>>()?;
    drop(stage);
    let _writing = crate::progress::stage("writing model.safetensors", 1, "files");
    write_atomically(dir.as_ref(), |tmp| write_directory(config, tensors, tmp, dtype, companions))
}

/// `config.json` (recording `dtype`), `model.safetensors` of `tensors` (name, shape, data in HF
/// layout) and the companion files, into the existing directory `dir`.
fn write_directory(
    config: &Qwen2Config,
    tensors: impl IntoIterator<Item = (String, Vec<usize>, TensorData)>,
    dir: &Path,
    dtype: Dtype,
    companions: Option<&Path>,
) -> Result<()> {
    let mut config = config.clone();
    let key = if config.extra.contains_key("dtype") { "dtype" } else { "torch_dtype" };
    config.extra.insert(key.into(), Value::String(dtype.torch_name().into()));
    config.save(dir)?;

    let tensors: BTreeMap<String, OwnedView> = tensors
        .into_iter()
        .map(|(name, shape, data)| {
            let (dtype, bytes) = encode(data, dtype);
            (name, OwnedView { dtype, shape, bytes })
        })
        .collect();
    write_safetensors(&dir.join(SINGLE_FILE), &tensors)?;

    if let Some(source) = companions {
        for name in COMPANION_FILES {
            let from = source.join(name);
            if from.is_file() {
                std::fs::copy(&from, dir.join(name)).map_err(|e| Error::io(&from, e))?;
            }
        }
    }
    Ok(())
}

/// Writes named f32 tensors (row-major, with shapes) as a safetensors file.
pub fn write_f32_safetensors(path: &Path, tensors: impl IntoIterator<Item = (String, Vec<usize>, Vec<f32>)>) -> Result<()> {
    let tensors: BTreeMap<String, OwnedView> = tensors
        .into_iter()
        .map(|(name, shape, values)| {
            let (dtype, bytes) = encode(TensorData::new(values, shape.clone()), Dtype::F32);
            (name, OwnedView { dtype, shape, bytes })
        })
        .collect();
    write_safetensors(path, &tensors)
}

/// Reads every tensor of a safetensors file as f32 `(shape, values)`.
pub fn read_f32_safetensors(path: &Path) -> Result<BTreeMap<String, (Vec<usize>, Vec<f32>)>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let tensors = SafeTensors::deserialize(&bytes).map_err(|e| Error::checkpoint(path, format!("not a valid safetensors file: {e}")))?;
    tensors
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let data = decode(&view, view.shape().to_vec())
                .ok_or_else(|| Error::checkpoint(path, format!("tensor {name} has unsupported dtype {:?}", view.dtype())))?;
            Ok((name, (view.shape().to_vec(), data.convert::<f32>().into_vec().expect("f32"))))
        })
        .collect()
}

fn write_safetensors(path: &Path, tensors: &BTreeMap<String, OwnedView>) -> Result<()> {
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(tensors.iter().map(|(k, v)| (k.as_str(), v)), Some(metadata), path)
        .map_err(|e| Error::checkpoint(path, format!("could not write safetensors: {e}")))
}

/// Runs `write` on a fresh temporary sibling of `dir`, then renames it to `dir` (see
/// [`crate::io::write_dir_atomically`]: files and directories are flushed to disk first).
pub fn write_atomically(dir: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    crate::io::write_dir_atomically(dir, write)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    /// A model built from the files in memory is the model loaded from the directory.
    #[test]
    fn load_bytes_is_load() {
        let config: Qwen2Config = serde_json::from_str(
            r#"{"vocab_size": 11, "hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 16,
                "eos_token_id": 3, "tie_word_embeddings": false}"#,
        )
        .unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("model");
        let device = Default::default();
        save(&Qwen2::<Flex>::random(&config, 1, &device).unwrap(), &dir, SaveDtype::BF16, None).unwrap();
        std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": [3, 5]}"#).unwrap();
        let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
        let files = ModelBytes {
            config: read("config.json"),
            generation_config: Some(read("generation_config.json")),
            safetensors: vec![(SINGLE_FILE.into(), read(SINGLE_FILE))],
        };
        let url = Path::new("http://127.0.0.1:1/model");
        let from_bytes = load_bytes::<Flex>(url, files.clone(), &device).unwrap();
        let from_dir = load::<Flex>(&dir, &device).unwrap();
        assert_eq!(from_bytes.to_hf_tensors(), from_dir.to_hf_tensors());
        assert_eq!(from_bytes.eos_token_ids(), &[3, 5]);
        assert_eq!(from_bytes.eos_token_ids(), from_dir.eos_token_ids());

        // Errors name the file by its URL.
        let broken = ModelBytes { config: b"{".to_vec(), ..files.clone() };
        let err = load_bytes::<Flex>(url, broken, &device).err().unwrap().to_string();
        assert!(err.contains("http://127.0.0.1:1/model/config.json"), "{err}");
        let truncated = ModelBytes { safetensors: vec![(SINGLE_FILE.into(), read(SINGLE_FILE)[..40].to_vec())], ..files };
        let err = load_bytes::<Flex>(url, truncated, &device).err().unwrap().to_string();
        assert!(err.contains("http://127.0.0.1:1/model/model.safetensors"), "{err}");
    }
}
