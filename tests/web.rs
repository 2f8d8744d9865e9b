//! kiln in the browser (feature `browser-test`): builds the page (`scripts/build-web.sh`: kiln-core
//! for wasm32 on burn's WebGPU backend), serves it and the quickstart's tiny model (`kiln init`,
//! random weights, the paper's tokenizer) on 127.0.0.1, opens it in headless Chromium with
//! WebGPU on SwiftShader, and checks the page against native kiln on the CPU backend. (The
//! weights are drawn with σ = 0.1 instead of 0.02, so that greedy decoding walks through varied
//! tokens, each depending on the cache, instead of repeating one.)
//!
//! - greedy tokens equal `kiln generate --temperature 0`'s for the same model and prompt;
//! - the log-probs of those tokens agree within [`LOGPROB_TOLERANCE`];
//! - training steps on a fixed sequence lower the loss, step by step as the same steps on the
//!   CPU (and, with `--features wgpu`, on native wgpu) within [`LOSS_TOLERANCE`].
//!
//! Needs Chromium, the wasm32 standard library and wasm-bindgen-cli; each one missing is a failure
//! saying how to install it. The page, the model, Chromium's log (`chromium.log`), the page's
//! result (`result.json`) and a screenshot (`screenshot.png`) stay in `<target>/web-test/`.

mod browser;
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use browser::chromium::{self, Browser};
use browser::{build_page, check_wasm32_std, server, sysroot};
use burn::backend::Autodiff;
use burn::optim::GradientsParams;
use burn::tensor::ElementConversion;
use burn::tensor::backend::AutodiffBackend;
use kiln::data::Sample;
use kiln::model::hf;
use kiln::tokenizer::Tokenizer;
use kiln::train::{AdamW, AdamWConfig, NextTokenLoss, Objective};
use serde_json::Value;

/// Largest difference of a chosen token's log-prob, browser (SwiftShader) vs the CPU backend.
/// (Logits agree to about 1e-5 here; the README's wgpu parity bound is 1e-3.)
const LOGPROB_TOLERANCE: f32 = 1e-3;
/// Largest difference of a step's loss, browser vs native (losses are about 7.7 at the start).
const LOSS_TOLERANCE: f32 = 2e-3;
const MAX_NEW_TOKENS: usize = 24;
const TRAIN_STEPS: usize = 4;
const LR: f64 = 1e-3;
const PROMPT: &str = "<question> How many adult owl does Pine Ridge have? </question> <solution>";
const TRAIN_TEXT: &str = "<question> How many adult owl does Pine Ridge have? </question> <solution> Define adult owl in Pine Ridge as x; so x = 4. </solution> <answer> 4 </answer>";

/// The directory cargo built this test in (`<target>/tmp` is `CARGO_TARGET_TMPDIR`).
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("CARGO_TARGET_TMPDIR is <target>/tmp").to_path_buf()
}

fn kiln(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().unwrap();
    assert!(out.status.success(), "kiln {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn ids_arg(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

fn floats(value: &Value) -> Vec<f32> {
    value.as_array().unwrap_or_else(|| panic!("not an array: {value}")).iter().map(|v| v.as_f64().unwrap() as f32).collect()
}

/// The losses of `TRAIN_STEPS` steps on `ids` on backend `B`, as the page runs them (next-token
/// loss, AdamW defaults, constant `LR`), with kiln's synchronous `AdamW::update`.
fn native_losses<B: AutodiffBackend>(model_dir: &Path, ids: &[u32], pad_id: u32, device: &B::Device) -> Vec<f32> {
    let mut model = hf::load::<B>(model_dir, device).unwrap();
    let mut objective = NextTokenLoss::new(vec![Sample::all_targets(ids.to_vec())], 1, 1, pad_id, 0).unwrap();
    let mut optimizer = AdamW::new(AdamWConfig::default());
    let mut losses = Vec::new();
    for step in 0..TRAIN_STEPS as u64 {
        let micro = objective.updates(&model, step).unwrap().remove(0).remove(0);
        let (loss, _) = objective.loss(&model, &micro).unwrap();
        losses.push(loss.clone().into_scalar().elem::<f32>());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let names = model.param_names();
        model = optimizer.update(model, &names, grads, LR).0;
    }
    losses
}

fn assert_close(name: &str, ours: &[f32], reference: &[f32], tolerance: f32) {
    assert_eq!(ours.len(), reference.len(), "{name}: {ours:?} vs {reference:?}");
    let worst = common::max_abs_diff(ours, reference);
    assert!(worst <= tolerance, "{name}: differ by up to {worst} (> {tolerance}):\n browser {ours:?}\n native  {reference:?}");
    eprintln!("{name}: browser within {worst:.2e} of native");
}

#[test]
fn missing_prerequisites_fail_with_the_install_instruction() {
    let err = chromium::find(Some(std::ffi::OsStr::new("/nonexistent")), None).unwrap_err();
    assert!(err.contains("apt-get install -y chromium"), "{err}");
    let err = chromium::find(None, Some("/nonexistent/chromium")).unwrap_err();
    assert!(err.contains("apt-get install -y chromium"), "{err}");

    let empty = tempfile::tempdir().unwrap();
    let err = check_wasm32_std(empty.path()).unwrap_err();
    assert!(err.contains("rustup target add wasm32-unknown-unknown") && err.contains("install-wasm32-std.sh"), "{err}");

    // The build script names the exact wasm-bindgen-cli version to install.
    let lock = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock")).unwrap();
    let version = lock.split("name = \"wasm-bindgen\"\nversion = \"").nth(1).and_then(|s| s.split('"').next()).unwrap();
    let out = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-web.sh"))
        .arg(empty.path().join("site"))
        .env("WASM_BINDGEN", "/nonexistent/wasm-bindgen")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("cargo install --locked wasm-bindgen-cli --version {version}")), "{stderr}");
}

#[test]
fn the_page_generates_and_trains_like_native_kiln() {
    let path = std::env::var_os("PATH");
    let explicit = std::env::var("KILN_CHROMIUM").ok();
    let chromium = chromium::find(path.as_deref(), explicit.as_deref()).unwrap_or_else(|e| panic!("{e}"));
    check_wasm32_std(&sysroot()).unwrap_or_else(|e| panic!("{e}"));

    let out = target_dir().join("web-test");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let site = out.join("site");
    build_page(&site, &target_dir());

    // The quickstart's tiny model (random weights) beside the page.
    let tiny = out.join("tiny");
    kiln::tasks::interplay::tiny_model::write_tiny_model(&tiny).unwrap();
    let config_path = tiny.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["initializer_range"] = 0.1.into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    let model = site.join("model");
    kiln(&["init", "--config", config_path.to_str().unwrap(), "--out", model.to_str().unwrap(), "--seed", "7"]);
    let tokenizer = Tokenizer::from_file(&model).unwrap();
    let (prompt, train_ids) = (tokenizer.encode(PROMPT).unwrap(), tokenizer.encode(TRAIN_TEXT).unwrap());

    // Native references: greedy generation through the CLI, training through the library.
    let max_new = MAX_NEW_TOKENS.to_string();
    let generated = kiln(&["generate", "--model", model.to_str().unwrap(), "--prompt-ids", &ids_arg(&prompt), "--max-new-tokens", &max_new, "--temperature", "0", "--json"]);
    let cpu: Value = serde_json::from_str(generated.lines().next().unwrap()).unwrap();
    let pad_id = tokenizer.pad_id().unwrap();
    let cpu_losses = native_losses::<Autodiff<kiln::backends::Cpu>>(&model, &train_ids, pad_id, &Default::default());

    // The page in headless Chromium.
    let base = server::serve(&site);
    let url = format!(
        "{base}index.html?model={base}model/&prompt_ids={}&max_new_tokens={MAX_NEW_TOKENS}&train_steps={TRAIN_STEPS}&train_ids={}&lr={LR}",
        ids_arg(&prompt),
        ids_arg(&train_ids)
    );
    let log = out.join("chromium.log");
    let mut browser = Browser::start(&chromium, &log);
    browser.open(&url);
    let outcome = browser.wait_for(
        "(() => { const r = document.getElementById('kiln-result');
                  if (r && r.textContent) return { result: r.textContent };
                  return window.kilnError ? { error: window.kilnError } : null; })()",
        Duration::from_secs(600),
    );
    browser.screenshot(&out.join("screenshot.png"));
    drop(browser);
    let console = std::fs::read_to_string(&log).unwrap_or_default();
    let outcome = outcome.unwrap_or_else(|| panic!("the page wrote no result within 600 s; Chromium's log {}:\n{}", log.display(), browser::tail(&console, 30)));
    if let Some(error) = outcome.get("error") {
        panic!("the page failed: {error}; Chromium's log {}:\n{}", log.display(), browser::tail(&console, 30));
    }
    let text = outcome["result"].as_str().unwrap();
    std::fs::write(out.join("result.json"), text).unwrap();
    let page: Value = serde_json::from_str(text).unwrap();
    eprintln!(
        "browser: adapter {}, load {:.0} ms, {:.1} tok/s decoding, losses {}; screenshot {}",
        page["adapter"],
        page["load_ms"].as_f64().unwrap(),
        page["tokens_per_s"].as_f64().unwrap(),
        page["losses"],
        out.join("screenshot.png").display()
    );
    assert!(console.contains("KILN_RESULT {"), "the page did not log its result on the console ({})", log.display());
    assert!(!page["adapter"].as_str().unwrap().is_empty());

    // Generation: the same greedy tokens, the same log-probs within the tolerance.
    assert_eq!(page["token_ids"], cpu["token_ids"], "greedy tokens differ from kiln generate on the CPU");
    assert!(!cpu["token_ids"].as_array().unwrap().is_empty());
    assert_close("chosen-token log-probs", &floats(&page["logprobs"]), &floats(&cpu["raw_logprobs"]), LOGPROB_TOLERANCE);

    // Training: every step lowers the loss, as natively.
    let losses = floats(&page["losses"]);
    assert_eq!(losses.len(), TRAIN_STEPS);
    assert!(losses.windows(2).all(|w| w[1] < w[0]), "the loss does not fall step by step: {losses:?}");
    assert_close("training losses (CPU)", &losses, &cpu_losses, LOSS_TOLERANCE);
    #[cfg(feature = "wgpu")]
    {
        let wgpu = native_losses::<Autodiff<kiln::backends::Wgpu>>(&model, &train_ids, pad_id, &common::wgpu_device());
        assert_close("training losses (native wgpu)", &losses, &wgpu, LOSS_TOLERANCE);
    }
}
