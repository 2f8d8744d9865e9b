//! The `kiln` command-line interface.

mod cli;

/// mimalloc instead of glibc malloc: training allocates and frees many large tensors per step;
/// glibc returns each to the OS (mmap/munmap) and faults its pages in again on the next
/// allocation, which cost ~25% of a tiny model's step in kernel time (see `benches/README.md`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (its index in `mi_option_e` of `mimalloc.h`, v2 and v3 alike).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Freed memory stays with the process for reuse (no purging back to the OS), unless
/// `MIMALLOC_PURGE_DELAY` says otherwise: the same tensor sizes come back every step, and each
/// purge made the kernel zero the pages again (~3× the system time of a tiny model's training;
/// peak RSS grows by the allocator's spare memory, ~25% there).
fn keep_freed_memory() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets a plain integer option; mimalloc reads it on its next purge decision.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    }
}

use clap::Parser;
use clap::error::ErrorKind;

fn main() {
    keep_freed_memory();
    // A failing device thread is reported once, as the command's error (kiln::backends::device).
    kiln::backends::device::watch();
    cli::progress::report_library_stages();
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) if matches!(err.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => err.exit(),
        Err(err) if err.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => err.exit(),
        Err(err) => {
            // Usage errors too are one line: clap's message (which may continue on the next
            // lines, e.g. the missing arguments), without the usage block.
            let rendered = err.render().to_string();
            let message: Vec<&str> = rendered
                .lines()
                .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            eprintln!("{}", message.join(" "));
            std::process::exit(2);
        }
    };
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
