//! The browser test's helpers: what it needs installed (each missing piece is a failure that
//! says how to install it), building the page with `scripts/build-web.sh`, a static file server
//! and headless Chromium driven over the DevTools protocol.
#![allow(dead_code)]

pub mod chromium;
pub mod server;

use std::path::{Path, PathBuf};
use std::process::Command;

/// How to install the wasm32 standard library.
pub const INSTALL_WASM32: &str = "install the wasm32 standard library: rustup target add wasm32-unknown-unknown \
     (offline, for rustc 1.95.0: ../shared/toolchains/install-wasm32-std.sh)";

/// Checks that the toolchain at `sysroot` has the wasm32-unknown-unknown standard library.
pub fn check_wasm32_std(sysroot: &Path) -> Result<(), String> {
    let lib = sysroot.join("lib/rustlib/wasm32-unknown-unknown/lib");
    let has_std = std::fs::read_dir(&lib)
        .map(|entries| entries.flatten().any(|e| e.file_name().to_string_lossy().starts_with("libstd-")))
        .unwrap_or(false);
    match has_std {
        true => Ok(()),
        false => Err(format!("no wasm32-unknown-unknown standard library in {}: {INSTALL_WASM32}", lib.display())),
    }
}

/// The sysroot of the `rustc` cargo uses.
pub fn sysroot() -> PathBuf {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(&rustc).args(["--print", "sysroot"]).output().expect("rustc --print sysroot");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// Builds the page into `out` with `scripts/build-web.sh` (wasm build in `target_dir`); panics
/// with the script's message (which says what to install) when it fails.
pub fn build_page(out: &Path, target_dir: &Path) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = Command::new("bash")
        .arg(repo.join("scripts/build-web.sh"))
        .arg(out)
        .env("CARGO_TARGET_DIR", target_dir)
        .env_remove("RUSTFLAGS")
        .output()
        .expect("bash scripts/build-web.sh");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "scripts/build-web.sh {} failed:\n{}", out.display(), tail(&stderr, 40));
    eprintln!("{}", tail(&stderr, 1));
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
