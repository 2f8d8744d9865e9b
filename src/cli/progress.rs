//! Progress on stderr: a bar on a terminal; without one (a log file, `nohup`, a cluster job) a
//! plain line every 30 s (`KILN_PROGRESS_EVERY`) with the position, the time so far and an ETA, and every
//! `println` line as it comes (a hidden indicatif bar would drop both).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use kiln::progress::{Reporter, StageSink};

/// How often a bar without a terminal prints its plain line: 30 s, or `KILN_PROGRESS_EVERY`
/// seconds.
fn plain_every() -> Duration {
    static EVERY: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *EVERY.get_or_init(|| {
        // (Any number a duration holds: a huge one means never; others mean the default.)
        let every = std::env::var("KILN_PROGRESS_EVERY").ok().and_then(|s| s.parse::<f64>().ok()).and_then(|s| Duration::try_from_secs_f64(s).ok());
        every.unwrap_or(Duration::from_secs(30))
    })
}

/// A progress bar that keeps reporting without a terminal (clones share it).
#[derive(Clone)]
pub struct Bar {
    bar: ProgressBar,
    unit: String,
    plain: Arc<Mutex<Plain>>,
}

/// When the work started and its position then, when the first unit finished and the position
/// then (the ETA's rate is measured from there, so setup before it does not count), and when the
/// last plain line was printed.
struct Plain {
    started: (Instant, u64),
    first: Option<(Instant, u64)>,
    last_line: Instant,
}

/// Every bar is drawn through one `MultiProgress`: a library stage's bar (validation during
/// training) then sits below the bar of the command that runs it rather than over it.
fn multi() -> &'static MultiProgress {
    static MULTI: std::sync::OnceLock<MultiProgress> = std::sync::OnceLock::new();
    MULTI.get_or_init(MultiProgress::new)
}

/// Shows the library's stages ([`kiln::progress`]: validation and held-out generation during
/// training, data preparation) as bars with an ETA.
pub fn report_library_stages() {
    kiln::progress::set_reporter(Some(Arc::new(Stages)));
}

struct Stages;

impl Reporter for Stages {
    fn start(&self, what: &str, total: u64, unit: &str) -> Box<dyn StageSink> {
        let bar = with_eta(total, unit);
        bar.set_message(what.to_owned());
        Box::new(bar)
    }
}

impl StageSink for Bar {
    fn set_position(&self, position: u64) {
        Bar::set_position(self, position);
    }

    fn finish(&self) {
        self.finish_and_clear();
        multi().remove(&self.bar);
    }
}

fn styled(total: u64, template: &str) -> Bar {
    let bar = multi().add(ProgressBar::new(total));
    bar.set_style(ProgressStyle::with_template(template).expect("valid template").progress_chars("=> "));
    let unit = template.split("{len} ").nth(1).and_then(|t| t.split([' ', ',']).next()).unwrap_or("").to_owned();
    let now = Instant::now();
    Bar { bar, unit, plain: Arc::new(Mutex::new(Plain { started: (now, 0), first: None, last_line: now })) }
}

/// A bar counting `total` items of `unit` whose message carries the rates (for work that resumes,
/// where indicatif's own rate would count the resumed part).
pub fn counter(total: u64, unit: &str) -> Bar {
    styled(total, &format!("{{elapsed_precise}} [{{bar:30}}] {{pos}}/{{len}} {unit} {{msg}}"))
}

/// A bar counting `total` items of `unit`, with the rate and the time left.
pub fn with_eta(total: u64, unit: &str) -> Bar {
    styled(total, &format!("{{elapsed_precise}} [{{bar:30}}] {{pos}}/{{len}} {unit} ({{per_sec}}, ETA {{eta}}) {{msg}}"))
}

/// A bar counting `total` training steps, with the time left (the message carries the loss).
pub fn steps(total: u64) -> Bar {
    styled(total, "{elapsed_precise} [{bar:30}] {pos}/{len} steps, {msg}, ETA {eta}")
}

/// `1h02m03s`, `4m05s`, `12s`.
pub fn clock(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, s) => format!("{h}h{m:02}m{s:02}s"),
    }
}

impl Bar {
    pub fn set_length(&self, total: u64) {
        self.bar.set_length(total);
    }

    /// Starts counting again at `position` (the ETA measured afresh: a resumed run's jump, or
    /// the setup before the first unit, does not count).
    pub fn restart_at(&self, position: u64) {
        self.bar.set_position(position);
        self.bar.reset_eta();
        let now = Instant::now();
        *self.plain.lock().unwrap_or_else(|e| e.into_inner()) = Plain { started: (now, position), first: None, last_line: now };
    }

    /// Whether the bar is drawn on a terminal (without one, its plain lines carry an ETA).
    pub fn on_terminal(&self) -> bool {
        !self.bar.is_hidden()
    }

    pub fn set_position(&self, position: u64) {
        self.bar.set_position(position);
        self.plain_line();
    }

    pub fn inc(&self, delta: u64) {
        self.bar.inc(delta);
        self.plain_line();
    }

    pub fn set_message(&self, message: impl Into<std::borrow::Cow<'static, str>>) {
        self.bar.set_message(message);
    }

    pub fn message(&self) -> String {
        self.bar.message()
    }

    /// A line above the bar (printed as it comes without a terminal).
    pub fn println(&self, line: impl AsRef<str>) {
        self.bar.suspend(|| eprintln!("{}", line.as_ref()));
    }

    /// Runs `f` with the bar cleared (its output lands above the bar).
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }

    pub fn finish_and_clear(&self) {
        self.bar.finish_and_clear();
    }

    /// Without a terminal: every 30 s (`KILN_PROGRESS_EVERY`), `  12/300 steps after 4m05s, ETA 1h02m03s <message>`.
    fn plain_line(&self) {
        if !self.bar.is_hidden() {
            return;
        }
        let position = self.bar.position();
        let mut plain = self.plain.lock().unwrap_or_else(|e| e.into_inner());
        if plain.first.is_none() && position > plain.started.1 {
            plain.first = Some((Instant::now(), position));
        }
        if plain.last_line.elapsed() < plain_every() {
            return;
        }
        let total = self.bar.length().unwrap_or(0);
        let eta = plain.first.and_then(|(t1, p1)| {
            let done = position.saturating_sub(p1);
            (done > 0).then(|| t1.elapsed().mul_f64(total.saturating_sub(position) as f64 / done as f64))
        });
        eprintln!(
            "  {position}/{total} {} after {}, ETA {} {}",
            self.unit,
            clock(plain.started.0.elapsed()),
            eta.map_or("?".into(), clock),
            self.bar.message()
        );
        plain.last_line = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_reads_like_a_duration() {
        assert_eq!(clock(Duration::from_secs(12)), "12s");
        assert_eq!(clock(Duration::from_secs(245)), "4m05s");
        assert_eq!(clock(Duration::from_secs(3723)), "1h02m03s");
    }

    #[test]
    fn the_unit_comes_from_the_template() {
        assert_eq!(counter(3, "rows").unit, "rows");
        assert_eq!(steps(3).unit, "steps");
        assert_eq!(with_eta(3, "completions").unit, "completions");
    }
}
