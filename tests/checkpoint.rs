//! Hugging Face checkpoint loading and saving: round trips keep every tensor and config key,
//! bf16 saves are bit-exact, and bad checkpoints fail with errors that name the tensor or file.

mod common;

use std::path::Path;

use common::{HF_MODELS, Reference, fixture};
use kiln::backends::Cpu;
use kiln::model::hf::{self, SaveDtype};
use kiln::model::{HostBatch, Qwen2};
use safetensors::SafeTensors;

fn logits(model: &Qwen2<Cpu>, seqs: &[Vec<u32>]) -> Vec<f32> {
    let batch = HostBatch::left_padded(seqs, 0).unwrap();
    model.forward(&batch.to_device::<Cpu>(&Default::default())).into_data().convert::<f32>().into_vec().unwrap()
}

/// (name, shape, dtype, bytes) of every tensor in a model directory, sorted by name.
fn tensors(dir: &Path) -> Vec<(String, Vec<usize>, String, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("model") && name.ends_with(".safetensors") {
            let bytes = std::fs::read(&path).unwrap();
            let st = SafeTensors::deserialize(&bytes).unwrap();
            for (n, v) in st.tensors() {
                out.push((n, v.shape().to_vec(), format!("{:?}", v.dtype()), v.data().to_vec()));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn save_then_load_reproduces_logits_names_and_config() {
    for name in HF_MODELS {
        let reference = Reference::load(name);
        let device = Default::default();
        let model = hf::load::<Cpu>(&reference.dir, &device).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("saved");
        hf::save(&model, &out, SaveDtype::F32, Some(&reference.dir)).unwrap();

        let reloaded = hf::load::<Cpu>(&out, &device).unwrap();
        let seqs = &reference.expected.sequences;
        assert_eq!(logits(&model, seqs), logits(&reloaded, seqs), "{name}: logits after save/load");

        let original: Vec<_> = tensors(&reference.dir).into_iter().map(|t| (t.0, t.1)).collect();
        let saved: Vec<_> = tensors(&out).into_iter().map(|t| (t.0, t.1)).collect();
        assert_eq!(saved, original, "{name}: tensor names and shapes");

        let config: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
        let source: serde_json::Value =
            serde_json::from_slice(&std::fs::read(reference.dir.join("config.json")).unwrap()).unwrap();
        for (key, value) in source.as_object().unwrap() {
            if key != "dtype" {
                assert_eq!(&config[key], value, "{name}: config key {key}");
            }
        }
        assert_eq!(config["dtype"], "float32");
        assert!(out.join("generation_config.json").is_file(), "companion files are copied");
    }
}

#[test]
fn bf16_sharded_checkpoint_saves_back_bit_exact() {
    let reference = Reference::load("gqa3_headdim_bf16_sharded");
    let model = hf::load::<Cpu>(&reference.dir, &Default::default()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bf16");
    hf::save(&model, &out, SaveDtype::BF16, None).unwrap();
    let original = tensors(&reference.dir);
    assert_eq!(original.len(), 27);
    assert_eq!(tensors(&out), original);
}

/// Copies a reference model to a temp dir and lets the test damage it.
fn damaged(name: &str, damage: impl FnOnce(&Path)) -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(name);
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(fixture(&format!("hf/{name}"))).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    damage(&dir);
    (tmp, dir)
}

fn load_error(dir: &Path) -> String {
    hf::load::<Cpu>(dir, &Default::default()).unwrap_err().to_string()
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, serde_json::to_string(&config).unwrap()).unwrap();
}

#[test]
fn mismatched_checkpoints_are_reported_by_tensor_name() {
    let (_tmp, dir) = damaged("untied_mha", |d| edit_config(d, |c| c["num_hidden_layers"] = 4.into()));
    let err = load_error(&dir);
    assert!(err.contains("missing tensor model.layers.3.input_layernorm.weight"), "{err}");

    let (_tmp, dir) = damaged("untied_mha", |d| edit_config(d, |c| c["num_hidden_layers"] = 2.into()));
    assert!(load_error(&dir).contains("unexpected tensor model.layers.2."), "{}", load_error(&dir));

    let (_tmp, dir) = damaged("untied_mha", |d| edit_config(d, |c| c["intermediate_size"] = 100.into()));
    let err = load_error(&dir);
    assert!(err.contains("model.layers.0.mlp.gate_proj.weight has shape [96, 64], the config expects [100, 64]"), "{err}");

    let (_tmp, dir) = damaged("untied_mha", |d| edit_config(d, |c| c["tie_word_embeddings"] = true.into()));
    hf::load::<Cpu>(&dir, &Default::default()).expect("an untied file may feed a tied config (head ignored)");
}

#[test]
fn corrupt_files_name_the_file() {
    let (_tmp, dir) = damaged("tied_gqa2", |d| {
        let path = d.join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    });
    let err = load_error(&dir);
    assert!(err.contains("model.safetensors") && err.contains("not a valid safetensors file"), "{err}");

    let (_tmp, dir) = damaged("tied_gqa2", |d| std::fs::write(d.join("config.json"), "{\"vocab_size\": 97,\n oops").unwrap());
    let err = load_error(&dir);
    assert!(err.contains("config.json") && err.contains("line 2"), "{err}");

    let (_tmp, dir) = damaged("tied_gqa2", |d| std::fs::remove_file(d.join("model.safetensors")).unwrap());
    assert!(load_error(&dir).contains("neither model.safetensors nor model.safetensors.index.json"));

    let (_tmp, dir) = damaged("gqa3_headdim_bf16_sharded", |d| {
        std::fs::remove_file(d.join("model-00002-of-00005.safetensors")).unwrap()
    });
    assert!(load_error(&dir).contains("model-00002-of-00005.safetensors"), "{}", load_error(&dir));
}

#[test]
fn saving_never_overwrites_an_existing_directory() {
    let reference = Reference::load("tied_gqa2");
    let model = hf::load::<Cpu>(&reference.dir, &Default::default()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("existing");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "precious").unwrap();
    let err = hf::save(&model, &out, SaveDtype::F32, None).unwrap_err().to_string();
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(std::fs::read_to_string(out.join("keep.txt")).unwrap(), "precious");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1, "no temporary directory left behind");
}

#[test]
fn a_failed_write_leaves_nothing_behind_and_keeps_earlier_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let earlier = tmp.path().join("checkpoint-10");
    std::fs::create_dir(&earlier).unwrap();
    std::fs::write(earlier.join("model.safetensors"), "weights").unwrap();

    let target = tmp.path().join("checkpoint-20");
    let result = hf::write_atomically(&target, |dir| {
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        Err(kiln::Error::InvalidInput("disk full (simulated)".into()))
    });
    assert!(result.is_err());
    assert!(!target.exists(), "no half-written checkpoint");
    let names: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("checkpoint-10")], "temporary directory removed");
    assert_eq!(std::fs::read_to_string(earlier.join("model.safetensors")).unwrap(), "weights");
}

#[test]
fn f16_checkpoints_load_exactly() {
    // The bf16 fixture's values (|w| well inside f16's range, 8 significant bits) are exact in f16.
    let reference = Reference::load("gqa3_headdim_bf16_sharded");
    let model = hf::load::<Cpu>(&reference.dir, &Default::default()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("f16");
    hf::save(&model, &out, SaveDtype::F16, None).unwrap();
    assert!(tensors(&out).iter().all(|t| t.2 == "F16"));
    let reloaded = hf::load::<Cpu>(&out, &Default::default()).unwrap();
    let seqs = &reference.expected.sequences;
    assert_eq!(logits(&model, seqs), logits(&reloaded, seqs));
}

/// `hf::save_random` (what `kiln init` writes, tensor by tensor) is the directory of
/// `Qwen2::random` saved in that dtype, byte for byte; a bf16 directory loads as bf16 weights.
#[test]
fn streamed_random_init_equals_the_saved_random_model() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = Reference::load("tied_gqa2");
    let config = kiln::model::Qwen2Config::from_file(reference.dir.join("config.json")).unwrap();
    let model = Qwen2::<Cpu>::random(&config, 3, &Default::default()).unwrap();
    for dtype in [SaveDtype::F32, SaveDtype::BF16, SaveDtype::F16] {
        let (saved, streamed) = (tmp.path().join(format!("saved-{dtype}")), tmp.path().join(format!("streamed-{dtype}")));
        hf::save(&model, &saved, dtype, None).unwrap();
        hf::save_random(&config, 3, &streamed, dtype, None).unwrap();
        assert_eq!(tensors(&saved), tensors(&streamed), "{dtype}");
        assert_eq!(std::fs::read_to_string(saved.join("config.json")).unwrap(), std::fs::read_to_string(streamed.join("config.json")).unwrap());
        let loaded = hf::load_as::<Cpu>(&streamed, &Default::default(), dtype).unwrap();
        assert_eq!(loaded.dtype(), dtype);
        let same = Qwen2::<Cpu>::random_as(&config, 3, &Default::default(), dtype).unwrap();
        assert!(loaded.to_hf_data().iter().zip(same.to_hf_data()).all(|((_, a), (_, b))| a.as_bytes() == b.as_bytes()), "{dtype}");
    }
    let err = hf::save_random(&config, 3, tmp.path().join("saved-f32"), SaveDtype::F32, None).unwrap_err().to_string();
    assert!(err.contains("not overwriting"), "{err}");
}
