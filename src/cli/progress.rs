//! Progress bars on stderr (hidden automatically when stderr is not a terminal).

use indicatif::{ProgressBar, ProgressStyle};

/// A bar counting `total` items of `unit`, showing throughput.
pub fn bar(total: u64, unit: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    let template = format!("{{elapsed_precise}} [{{bar:30}}] {{pos}}/{{len}} {unit} ({{per_sec}}) {{msg}}");
    bar.set_style(ProgressStyle::with_template(&template).expect("valid template").progress_chars("=> "));
    bar
}

/// A bar counting `total` items of `unit` whose message carries the rates (for work that resumes,
/// where indicatif's own rate would count the resumed part).
pub fn counter(total: u64, unit: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    let template = format!("{{elapsed_precise}} [{{bar:30}}] {{pos}}/{{len}} {unit} {{msg}}");
    bar.set_style(ProgressStyle::with_template(&template).expect("valid template").progress_chars("=> "));
    bar
}

/// A bar counting `total` items of `unit`, with the rate and the time left.
#[cfg_attr(not(feature = "code"), allow(dead_code))]
pub fn with_eta(total: u64, unit: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    let template = format!("{{elapsed_precise}} [{{bar:30}}] {{pos}}/{{len}} {unit} ({{per_sec}}, ETA {{eta}}) {{msg}}");
    bar.set_style(ProgressStyle::with_template(&template).expect("valid template").progress_chars("=> "));
    bar
}

/// A bar counting `total` training steps, with the time left (the message carries the loss).
pub fn steps(total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    let template = "{elapsed_precise} [{bar:30}] {pos}/{len} steps, {msg}, ETA {eta}";
    bar.set_style(ProgressStyle::with_template(template).expect("valid template").progress_chars("=> "));
    bar
}
