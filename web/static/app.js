// The page: sets up kiln on WebGPU, loads the model directory named by `?model=` (default
// `model/` beside the page), then waits for the buttons, or runs the automation contract:
//
//   ?model=URL&prompt_ids=1,2,3&max_new_tokens=N   greedy generation of N tokens at most
//   &train_steps=K [&train_ids=4,5,6] [&lr=0.001]   K training steps on train_ids (default: the prompt)
//   &warmup=1                                       one untimed generation first (compiles the shaders)
//   &verbose=1                                      every token and step on the console too
//
// and writes {"token_ids", "logprobs", "losses", "adapter", "tokens_per_s", "load_ms", ...} into
// #kiln-result, logging the same JSON as one console line `KILN_RESULT <json>`; an error is
// logged as `KILN_ERROR <message>` (and kept in `window.kilnError`).
import init, { Kiln, last_panic } from "./kiln_web.js";

const $ = (id) => document.getElementById(id);
const query = new URLSearchParams(location.search);
const modelUrl = new URL(query.get("model") ?? "model/", location.href).href;
const TRAIN_STEPS = 5;
const DEFAULT_LR = 1e-3;
const verbose = query.has("verbose");
const started = performance.now();
const log = (message) => { if (verbose) console.log(`kiln ${(performance.now() - started).toFixed(0)} ms: ${message}`); };

function ids(name) {
  const text = query.get(name);
  if (text === null) return null;
  const values = text.split(",").map((s) => s.trim());
  if (values.some((v) => !/^\d+$/.test(v))) throw new Error(`${name}: expected comma-separated token ids, got "${text}"`);
  return values.map(Number);
}

function number(name, fallback) {
  const text = query.get(name);
  if (text === null) return fallback;
  const value = Number(text);
  if (!Number.isFinite(value) || value < 0) throw new Error(`${name}: expected a number >= 0, got "${text}"`);
  return value;
}

function fail(error) {
  let panic = null;
  try { panic = last_panic(); } catch (_) { /* the module did not load */ }
  const message = panic ?? (error && error.message ? error.message : String(error));
  window.kilnError = message;
  $("error").textContent = "Error: " + message;
  console.log("KILN_ERROR " + message.replace(/\s+/g, " "));
}

async function adapterName() {
  if (!navigator.gpu) throw new Error("WebGPU is not available in this browser (navigator.gpu is missing)");
  const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
  if (!adapter) throw new Error("WebGPU has no adapter here");
  const info = adapter.info ?? {};
  return [info.vendor, info.architecture, info.description].filter((s) => s).join(" / ") || "unnamed adapter";
}

function showToken(id, text, rate) {
  log(`token ${id} (${rate.toFixed(2)} tok/s)`);
  $("output").textContent = text;
  $("rate").textContent = rate > 0 ? `${rate.toFixed(1)} tok/s` : "";
}

function showStep(step, loss) {
  log(`step ${step}: loss ${loss}`);
  const row = document.createElement("tr");
  row.innerHTML = `<td>${step}</td><td>${loss.toFixed(4)}</td>`;
  $("losses").appendChild(row);
}

async function generate(kiln, promptIds, maxNewTokens) {
  $("output").textContent = "";
  const result = JSON.parse(await kiln.generate(Uint32Array.from(promptIds), maxNewTokens, 0, 0n, showToken));
  $("rate").textContent = `${result.token_ids.length} tokens, ${result.tokens_per_s.toFixed(1)} tok/s decoding ` +
    `(prefill ${result.prefill_ms.toFixed(0)} ms, ${result.finish_reason})`;
  return result;
}

async function train(kiln, trainIds, steps, lr) {
  $("losses").replaceChildren();
  const result = JSON.parse(await kiln.train(Uint32Array.from(trainIds), steps, lr, showStep));
  $("train-info").textContent = `${steps} steps on ${trainIds.length} tokens, lr ${lr}, ${(result.train_ms / 1e3).toFixed(2)} s`;
  return result;
}

async function main() {
  $("model-url").textContent = modelUrl;
  const adapter = await adapterName();
  $("adapter").textContent = adapter;
  await init();
  const kiln = await Kiln.create();
  const loaded = JSON.parse(await kiln.load(modelUrl));
  $("load").textContent = `${(loaded.parameters / 1e6).toFixed(2)}M parameters, ${(loaded.bytes / 1e6).toFixed(1)} MB ` +
    `in ${loaded.load_ms.toFixed(0)} ms (fetch ${loaded.fetch_ms.toFixed(0)} ms)`;

  const promptIds = ids("prompt_ids");
  const trainSteps = number("train_steps", 0);
  if (promptIds !== null || trainSteps > 0) {
    const result = { adapter, wgpu_adapter: kiln.adapter, load_ms: loaded.load_ms, token_ids: [], logprobs: [], losses: [], tokens_per_s: null };
    if (promptIds !== null) {
      $("prompt").value = kiln.decode(Uint32Array.from(promptIds));
      const maxNewTokens = number("max_new_tokens", 16);
      if (query.has("warmup")) await generate(kiln, promptIds, maxNewTokens);
      const generated = await generate(kiln, promptIds, maxNewTokens);
      Object.assign(result, {
        token_ids: generated.token_ids, logprobs: generated.logprobs, text: generated.text,
        tokens_per_s: generated.tokens_per_s, end_to_end_tokens_per_s: generated.end_to_end_tokens_per_s,
        prefill_ms: generated.prefill_ms, finish_reason: generated.finish_reason,
      });
    }
    if (trainSteps > 0) {
      const trainIds = ids("train_ids") ?? promptIds;
      if (trainIds === null) throw new Error("train_steps needs prompt_ids or train_ids");
      const trained = await train(kiln, trainIds, trainSteps, number("lr", DEFAULT_LR));
      Object.assign(result, { losses: trained.losses, grad_norms: trained.grad_norms, step_ms: trained.step_ms, train_ms: trained.train_ms });
    }
    const json = JSON.stringify(result);
    $("kiln-result").textContent = json;
    console.log("KILN_RESULT " + json);
    return;
  }

  const busy = (on) => { $("generate").disabled = on; $("train").disabled = on; };
  const run = (work) => async () => {
    busy(true);
    $("error").textContent = "";
    try { await work(); } catch (error) { fail(error); } finally { busy(false); }
  };
  $("generate").onclick = run(() => generate(kiln, kiln.encode($("prompt").value), Number($("max-new-tokens").value)));
  $("train").onclick = run(() => train(kiln, kiln.encode($("prompt").value), TRAIN_STEPS, DEFAULT_LR));
  busy(false);
}

main().catch(fail);
