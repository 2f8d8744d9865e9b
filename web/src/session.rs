//! [`Kiln`]: the model on WebGPU, as JavaScript drives it. Every long call returns a promise
//! that resolves to a JSON string; progress goes to a callback after every token or step.

use std::cell::RefCell;
use std::rc::Rc;

use burn::backend::wgpu::{RuntimeOptions, WgpuDevice, graphics::WebGpu, init_setup_async};
use burn::backend::{Autodiff, Wgpu};
use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::{Tensor, backend::Backend};
use kiln_core::data::Sample;
use kiln_core::generate::{Sampler, SamplingParams, Stream};
use kiln_core::model::{Qwen2, hf};
use kiln_core::tokenizer::Tokenizer;
use kiln_core::train::adamw::squared_grad_norm;
use kiln_core::train::{AdamW, AdamWConfig, NextTokenLoss, Objective};
use serde_json::json;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::fetch::{ModelFiles, js_message};
use crate::now_ms;

type Gpu = Wgpu;
type Train = Autodiff<Gpu>;
type Fallible<T> = Result<T, String>;

/// A loaded model with its tokenizer and optimizer state (kept across training calls).
#[derive(Clone)]
struct Loaded {
    model: Qwen2<Train>,
    tokenizer: Tokenizer,
    optimizer: AdamW<Gpu>,
}

/// kiln on WebGPU; see the crate docs.
#[wasm_bindgen]
pub struct Kiln {
    device: WgpuDevice,
    adapter: String,
    loaded: Rc<RefCell<Option<Loaded>>>,
}

#[wasm_bindgen]
impl Kiln {
    /// Sets up burn's WebGPU device (asynchronously, as the browser requires).
    pub async fn create() -> Kiln {
        let device = WgpuDevice::default();
        let setup = init_setup_async::<WebGpu>(&device, RuntimeOptions::default()).await;
        let info = setup.adapter.get_info();
        let adapter = match info.name.is_empty() {
            true => format!("{:?}", info.backend),
            false => format!("{} ({:?})", info.name, info.backend),
        };
        Kiln { device, adapter, loaded: Rc::default() }
    }

    /// The WebGPU adapter as wgpu describes it.
    #[wasm_bindgen(getter)]
    pub fn adapter(&self) -> String {
        self.adapter.clone()
    }

    /// Fetches and loads the model directory at `url`. Resolves to
    /// `{"load_ms", "fetch_ms", "bytes", "parameters", "vocab_size", "layers"}`.
    pub fn load(&self, url: String) -> js_sys::Promise {
        let (device, slot) = (self.device.clone(), self.loaded.clone());
        promise(async move {
            let began = now_ms();
            let files = ModelFiles::fetch(&url).await?;
            let fetched = now_ms();
            let (tokenizer, bytes) = (files.tokenizer()?, files.bytes);
            let model = hf::load_bytes::<Train>(&files.url, files.model, &device).map_err(|e| e.to_string())?;
            settle(&model).await?; // the upload is part of the load time
            let config = model.config().clone();
            slot.replace(Some(Loaded { model, tokenizer, optimizer: AdamW::new(AdamWConfig::default()) }));
            Ok(json!({
                "load_ms": now_ms() - began,
                "fetch_ms": fetched - began,
                "bytes": bytes,
                "parameters": config.num_parameters(),
                "vocab_size": config.vocab_size,
                "layers": config.num_hidden_layers,
            }))
        })
    }

    /// Token ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, JsError> {
        let loaded = self.loaded()?;
        loaded.tokenizer.encode(text).map_err(|e| JsError::new(&e.to_string()))
    }

    /// Text of `ids` (special tokens kept).
    pub fn decode(&self, ids: Vec<u32>) -> Result<String, JsError> {
        let loaded = self.loaded()?;
        loaded.tokenizer.decode(&ids, false).map_err(|e| JsError::new(&e.to_string()))
    }

    /// Generates after `prompt_ids` (greedy at `temperature` 0), stopping at EOS or after
    /// `max_new_tokens`; calls `on_token(id, text_so_far, tokens_per_s)` after every token.
    /// Resolves to `{"token_ids", "logprobs" (the model's own, per token), "text",
    /// "finish_reason", "tokens_per_s" (decoding: tokens after the first over the time after the
    /// first), "end_to_end_tokens_per_s", "prefill_ms", "generate_ms"}`.
    pub fn generate(&self, prompt_ids: Vec<u32>, max_new_tokens: usize, temperature: f32, seed: u64, on_token: js_sys::Function) -> js_sys::Promise {
        let loaded = self.loaded.borrow().clone();
        promise(async move {
            let Loaded { model, tokenizer, .. } = loaded.ok_or("no model loaded")?;
            let model = model.valid();
            let sampler = match temperature > 0.0 {
                true => Sampler { temperature, ..Sampler::default() },
                false => Sampler::greedy(),
            };
            let params = SamplingParams { sampler, max_new_tokens, seed, ..SamplingParams::default() };
            let began = now_ms();
            let mut stream = Stream::new(&model, Some(&tokenizer), &prompt_ids, &params).map_err(|e| e.to_string())?;
            let mut first = None;
            while let Some(logits) = stream.logits() {
                let host = read(logits).await?;
                let token = stream.accept(&host).map_err(|e| e.to_string())?;
                let now = now_ms();
                let first = *first.get_or_insert(now);
                let rate = decode_rate(stream.tokens().len(), first, now);
                let text = tokenizer.decode(stream.tokens(), false).map_err(|e| e.to_string())?;
                on_token.call3(&JsValue::NULL, &token.into(), &text.into(), &rate.into()).map_err(|e| js_message(&e))?;
            }
            let ended = now_ms();
            let completion = stream.finish().map_err(|e| e.to_string())?;
            let first = first.unwrap_or(ended);
            let n = completion.token_ids.len();
            Ok(json!({
                "token_ids": completion.token_ids,
                "logprobs": completion.raw_logprobs,
                "text": completion.text,
                "finish_reason": completion.finish_reason,
                "tokens_per_s": decode_rate(n, first, ended),
                "end_to_end_tokens_per_s": n as f64 * 1e3 / (ended - began).max(1e-9),
                "prefill_ms": first - began,
                "generate_ms": ended - began,
            }))
        })
    }

    /// Runs `steps` training steps on the sequence `ids` (next-token loss on every token after
    /// the first, AdamW with Hugging Face Trainer's defaults and clipping at 1, constant learning
    /// rate `lr`), continuing the optimizer state of earlier calls; calls `on_step(step, loss)`
    /// after each. Resolves to `{"losses", "grad_norms", "step_ms", "train_ms"}` (the loss
    /// before each step's update, as the training loop logs it).
    pub fn train(&self, ids: Vec<u32>, steps: u32, lr: f64, on_step: js_sys::Function) -> js_sys::Promise {
        let slot = self.loaded.clone();
        promise(async move {
            let Loaded { mut model, tokenizer, mut optimizer } = slot.borrow().clone().ok_or("no model loaded")?;
            let pad_id = tokenizer.pad_id().unwrap_or(0);
            let mut objective = NextTokenLoss::new(vec![Sample::all_targets(ids)], 1, 1, pad_id, 0).map_err(|e| e.to_string())?;
            let began = now_ms();
            let (mut losses, mut norms, mut times) = (Vec::new(), Vec::new(), Vec::new());
            for step in 0..steps as u64 {
                let step_began = now_ms();
                let mut updates = objective.updates(&model, step).map_err(|e| e.to_string())?;
                let micro = updates.remove(0).remove(0);
                let (loss, _) = objective.loss(&model, &micro).map_err(|e| e.to_string())?;
                let loss_value = read(loss.clone()).await?[0];
                let grads = GradientsParams::from_grads(loss.backward(), &model);
                let norm = match squared_grad_norm(&model, &grads) {
                    Some(squared) => (read(squared).await?[0] as f64).sqrt(),
                    None => 0.0,
                };
                let names = model.param_names();
                model = optimizer.apply(model, &names, grads, lr, norm);
                settle(&model).await?; // the update is part of the step's time
                losses.push(loss_value);
                norms.push(norm);
                times.push(now_ms() - step_began);
                on_step.call2(&JsValue::NULL, &(step + 1).into(), &loss_value.into()).map_err(|e| js_message(&e))?;
            }
            slot.replace(Some(Loaded { model, tokenizer, optimizer }));
            Ok(json!({ "losses": losses, "grad_norms": norms, "step_ms": times, "train_ms": now_ms() - began }))
        })
    }
}

impl Kiln {
    fn loaded(&self) -> Result<Loaded, JsError> {
        self.loaded.borrow().clone().ok_or_else(|| JsError::new("no model loaded"))
    }
}

/// The f32 values of `tensor`, read back without blocking.
async fn read<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Fallible<Vec<f32>> {
    let data = tensor.into_data_async().await.map_err(|e| format!("reading from the GPU: {e:?}"))?;
    data.convert::<f32>().into_vec::<f32>().map_err(|e| format!("{e:?}"))
}

/// Waits until the GPU has done the work queued for `model` (by reading one weight back).
async fn settle<B: Backend>(model: &Qwen2<B>) -> Fallible<()> {
    read(model.embed_tokens.weight.val().slice([0..1, 0..1])).await.map(drop)
}

/// Tokens per second after the first token (at `first` ms) up to `now` ms.
fn decode_rate(tokens: usize, first: f64, now: f64) -> f64 {
    match tokens > 1 && now > first {
        true => (tokens - 1) as f64 * 1e3 / (now - first),
        false => 0.0,
    }
}

/// A promise of the JSON text of `work`'s value; an error rejects it with the message.
fn promise(work: impl std::future::Future<Output = Fallible<serde_json::Value>> + 'static) -> js_sys::Promise {
    future_to_promise(async move {
        match work.await {
            Ok(value) => Ok(JsValue::from_str(&value.to_string())),
            Err(message) => Err(js_sys::Error::new(&message).into()),
        }
    })
}
