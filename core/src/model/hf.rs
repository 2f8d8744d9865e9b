//! Hugging Face model directories: `config.json` + `model.safetensors` (or a sharded
//! `model.safetensors.index.json`) + tokenizer files.
//!
//! Loading checks every tensor name, shape and dtype against the config before building
//! anything, and reports all mismatches by tensor name. Saving writes into a temporary sibling
//! directory and renames it into place, so a crash never leaves a half-written model behind.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use burn::tensor::TensorData;
use burn::tensor::backend::Backend;
use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors, View};
use serde_json::Value;

use super::config::Qwen2Config;
use super::dtype::Dtype;
use super::qwen2::Qwen2;
use super::weights::{RandomInit, TensorSpec, WeightSource, expected_tensors};
use crate::error::{Error, Result};

const SINGLE_FILE: &str = "model.safetensors";
const INDEX_FILE: &str = "model.safetensors.index.json";
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

/// Floating-point format of saved tensors (the model's [`Dtype`]; the old name is kept).
pub type SaveDtype = Dtype;

/// The safetensors files of one model directory, memory-mapped.
pub struct SafetensorsDir {
    dir: PathBuf,
    files: Vec<(PathBuf, Mmap)>,
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
            let text = std::fs::read_to_string(&index_path).map_err(|e| Error::io(&index_path, e))?;
            let index: Value = serde_json::from_str(&text).map_err(|e| Error::json(&index_path, None, e))?;
            let map = index
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| Error::checkpoint(&index_path, "no `weight_map` object"))?;
            let mut shards: Vec<String> = map.values().filter_map(|v| v.as_str().map(String::from)).collect();
            shards.sort();
            shards.dedup();
            shards
        } else {
            return Err(Error::checkpoint(dir, format!("neither {SINGLE_FILE} nor {INDEX_FILE} found")));
        };

        let mut files = Vec::new();
        let mut index = HashMap::new();
        for name in file_names {
            let path = dir.join(&name);
            let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
            // SAFETY: the map is read-only and we do not modify checkpoint files while loading.
            let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
            let tensors = SafeTensors::deserialize(&mmap)
                .map_err(|e| Error::checkpoint(&path, format!("not a valid safetensors file: {e}")))?;
            for tensor_name in tensors.names() {
                if let Some(previous) = index.insert(tensor_name.to_string(), files.len()) {
                    let other = files.get(previous).map_or(&path, |(p, _): &(PathBuf, Mmap)| p);
                    let message = format!("tensor {tensor_name} is also stored in {}", other.display());
                    return Err(Error::checkpoint(&path, message));
                }
            }
            files.push((path, mmap));
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
        let (path, mmap) = &self.files[file];
        let corrupt = |e: safetensors::SafeTensorError| Error::checkpoint(path, format!("tensor {name}: {e}"));
        let view = SafeTensors::deserialize(mmap).and_then(|t| t.tensor(name)).map_err(corrupt)?;
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

/// Tells the kernel that the pages of `mmap` under `[start, start + len)` are not needed any
/// more, so they stop counting as resident (they are read from the file again if touched).
fn release(mmap: &Mmap, start: *const u8, len: usize) {
    #[cfg(unix)]
    {
        let offset = start as usize - mmap.as_ptr() as usize;
        // SAFETY: a read-only, file-backed mapping: dropped pages (memmap2 widens the range to
        // whole pages, which may hold neighbouring tensors) are re-read from the file, which is
        // not changed while the map lives.
        let _ = unsafe { mmap.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len) };
    }
    #[cfg(not(unix))]
    let _ = (mmap, start, len);
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
    let mut weights = SafetensorsDir::open(dir)?;
    weights.check(&expected_tensors(&config), config.tie_word_embeddings)?;
    Ok(Qwen2 { eos_token_ids, ..Qwen2::from_source_as(&config, &mut weights, device, dtype)? })
}

/// The end-of-sequence ids of the model directory `dir` with config `config`: the
/// `eos_token_id` (one id or a list) of `config.json` and of `generation_config.json` when that
/// file exists, sorted, without repeats. (`transformers` takes `generation_config.json`'s where it
/// has one; the union differs only for a directory whose two files disagree.)
pub fn eos_token_ids(dir: &Path, config: &Qwen2Config) -> Result<Vec<u32>> {
    let mut ids = config.eos_token_ids();
    let path = dir.join("generation_config.json");
    if path.is_file() {
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let json: Value = serde_json::from_str(&text).map_err(|e| Error::json(&path, None, e))?;
        match json.get("eos_token_id") {
            Some(Value::Number(n)) => ids.extend(n.as_u64().map(|v| v as u32)),
            Some(Value::Array(a)) => ids.extend(a.iter().filter_map(Value::as_u64).map(|v| v as u32)),
            _ => {}
        }
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids)
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
    let mut source = RandomInit::new(config.initializer_range, seed);
    let tensors = expected_tensors(config)
        .into_iter()
        .map(|spec| {
            let data = source.tensor(&spec)?.convert_dtype(dtype.burn());
            Ok((spec.name, spec.shape, data))
        })
        .collect::<Result<Vec<_>>>()?;
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
