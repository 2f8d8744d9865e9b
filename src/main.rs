//! The `kiln` command-line interface.

mod cli;

use clap::Parser;

fn main() {
    let cli = cli::Cli::parse();
    if let Err(err) = cli.run() {
        // One clear line: the error and its causes, joined.
        let causes: Vec<String> = err.chain().map(ToString::to_string).collect();
        let mut line = causes[0].clone();
        for cause in &causes[1..] {
            if !line.contains(cause.as_str()) {
                line.push_str(": ");
                line.push_str(cause);
            }
        }
        eprintln!("error: {line}");
        std::process::exit(1);
    }
}
