//! kiln as a dependency of a crate outside this workspace: a fresh crate in a temporary
//! directory depends on `kiln` by path with only `features = ["cpu"]` (no tasks, evaluation or
//! charts), its `main.rs` is `examples/library.rs`, and it must build offline and run to the end
//! (its answer loss falls, its checkpoint reloads). Its dependency tree must not contain what
//! only the optional parts need.
//!
//! The build shares this test's target directory (the one cargo built the test in, whatever
//! `CARGO_TARGET_DIR` says), so dependencies already compiled for the workspace are reused; what
//! is built anew is kiln itself without its default features, and what that changes downstream.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory cargo built this test in (`<target>/tmp` is `CARGO_TARGET_TMPDIR`).
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("CARGO_TARGET_TMPDIR is <target>/tmp").to_path_buf()
}

fn cargo(dir: &Path, args: &[&str]) -> std::process::Output {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    Command::new(&cargo)
        .args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target_dir())
        .env_remove("RUSTFLAGS")
        .output()
        .unwrap_or_else(|e| panic!("could not run {cargo} (needed to build the embedding crate): {e}"))
}

#[test]
fn a_model_only_crate_outside_the_workspace_builds_and_runs() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let krate = tmp.path().join("embedder");
    std::fs::create_dir_all(krate.join("src")).unwrap();
    let manifest = format!(
        r#"[package]
name = "kiln-embed-check"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
kiln = {{ path = {repo:?}, default-features = false, features = ["cpu"] }}
burn = {{ version = "=0.21.0", default-features = false, features = ["std"] }}
rand = {{ version = "0.9", default-features = false, features = ["std", "std_rng"] }}
rand_chacha = "0.9"
serde_json = "1"

[profile.dev]
debug = 0

[workspace]
"#
    );
    std::fs::write(krate.join("Cargo.toml"), manifest).unwrap();
    std::fs::write(krate.join("src/main.rs"), include_str!("../examples/library.rs")).unwrap();
    // The workspace's lock file pins every version, so the build is offline and reproducible.
    std::fs::copy(repo.join("Cargo.lock"), krate.join("Cargo.lock")).unwrap();

    let tree = cargo(&krate, &["tree", "--offline", "--prefix", "none", "-e", "normal"]);
    let tree_text = String::from_utf8_lossy(&tree.stdout);
    assert!(tree.status.success(), "cargo tree failed:\n{}", String::from_utf8_lossy(&tree.stderr));
    assert!(tree_text.contains("kiln-core v"), "{tree_text}");
    for optional in ["plotters v", "sha2 v", "kiln-sandbox v"] {
        assert!(!tree_text.lines().any(|l| l.starts_with(optional)), "a model-only build pulls in {optional}:\n{tree_text}");
    }

    let build = cargo(&krate, &["build", "--offline"]);
    let stderr = String::from_utf8_lossy(&build.stderr);
    assert!(
        build.status.success(),
        "the embedding crate did not build (cargo build --offline in {}; dependencies missing from the local \
         registry cache can be fetched with `cargo fetch` in the repository):\n{}",
        krate.display(),
        stderr.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    );

    let exe = target_dir().join("debug").join(format!("kiln-embed-check{}", std::env::consts::EXE_SUFFIX));
    let run = Command::new(&exe).arg(tmp.path().join("out")).output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.lines().last() == Some("ok"), "{stdout}");
    assert!(tmp.path().join("out/run/checkpoint-60/model.safetensors").is_file(), "{stdout}");
}
