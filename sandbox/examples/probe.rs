//! Prints the sandbox layers active on this machine: `cargo run -p kiln-sandbox --example probe`.
//! `--unsafe` sets up the sandbox even when nothing confines (to see why).

fn main() {
    let allow_unsafe = std::env::args().any(|a| a == "--unsafe");
    match kiln_sandbox::Sandbox::new(kiln_sandbox::SandboxOptions {
        allow_unsafe,
        ..Default::default()
    }) {
        Ok(s) => print!("{}", s.protections()),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
