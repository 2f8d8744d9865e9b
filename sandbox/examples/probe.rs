//! Prints the sandbox layers active on this machine: `cargo run -p kiln-sandbox --example probe`.
//! `--unsafe` sets up the sandbox even when something is not contained (to see why);
//! `--without LAYER[,LAYER…]` leaves layers off as if the kernel lacked them.

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let allow_unsafe = args.iter().any(|a| a == "--unsafe");
    let skip_layers = args
        .iter()
        .position(|a| a == "--without")
        .and_then(|i| args.get(i + 1))
        .map(|l| l.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    match kiln_sandbox::Sandbox::new(kiln_sandbox::SandboxOptions {
        allow_unsafe,
        skip_layers,
        ..Default::default()
    }) {
        Ok(s) => print!("{}", s.protections()),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
