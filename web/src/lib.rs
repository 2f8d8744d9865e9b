//! kiln in the browser: kiln-core's Qwen2 on burn-wgpu's WebGPU path, compiled to
//! `wasm32-unknown-unknown` and driven by the page in `web/static/` (`scripts/build-web.sh`).
//!
//! [`Kiln`] is what JavaScript sees: WebGPU set up asynchronously, a model directory fetched over
//! HTTP ([`fetch`]), streaming generation ([`kiln_core::generate::Stream`], every token's logits
//! read back with `into_data_async`), and training steps on a fixed sequence (next-token loss,
//! kiln's AdamW, the loss and gradient norm read back asynchronously). Nothing blocks: WebGPU
//! can only be read from the browser's event loop.
//!
//! Natively this crate is empty (everything here is `wasm32` only).
#![cfg(target_arch = "wasm32")]

pub mod fetch;
mod session;

pub use session::Kiln;

use wasm_bindgen::prelude::*;

/// Installs a panic hook that logs the panic on the console and keeps its message for
/// [`last_panic`] (a panic in wasm surfaces in JavaScript only as "unreachable").
#[wasm_bindgen(start)]
pub fn start() {
    std::panic::set_hook(Box::new(|info| {
        let message = info.to_string();
        web_sys::console::error_1(&format!("kiln panicked: {message}").into());
        LAST_PANIC.with(|p| *p.borrow_mut() = Some(message));
    }));
}

thread_local! {
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// The message of the last Rust panic, if any.
#[wasm_bindgen]
pub fn last_panic() -> Option<String> {
    LAST_PANIC.with(|p| p.borrow().clone())
}

/// Milliseconds from the page's time origin (`performance.now()`).
pub(crate) fn now_ms() -> f64 {
    web_sys::window().and_then(|w| w.performance()).map_or_else(js_sys::Date::now, |p| p.now())
}
