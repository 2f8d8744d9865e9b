//! `kiln config show` (the effective TOML of a run config, every default filled in),
//! `kiln config import --from verl|trl` (another trainer's config as a kiln TOML) and
//! `kiln config upgrade` (a config of an earlier form in the current schema).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use kiln::config_import::{self, RunKind};

#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Print the effective TOML of a run config: every default filled in, legacy keys under
    /// their current names (each named in a note on stderr).
    Show {
        #[arg(long)]
        config: PathBuf,
        /// The run (default: from [data] kind and [teacher], as the run commands read it).
        #[arg(long, value_parser = parse_kind)]
        kind: Option<RunKind>,
    },
    /// Rewrite a config written in an earlier form (`[train] lr`, `[validation]`, `save_freq`,
    /// ...) in the current schema, keeping only the values it gives; comments are not kept.
    /// Prints it, or writes --out NEW (a new file), or replaces FILE with --in-place (keeping
    /// FILE.bak).
    Upgrade {
        file: PathBuf,
        /// Replace FILE, keeping the original as FILE.bak.
        #[arg(long, conflicts_with = "out")]
        in_place: bool,
        /// Write the upgraded config to this new file (never overwritten).
        #[arg(long)]
        out: Option<PathBuf>,
        /// The run (default: from [data] kind and [teacher]).
        #[arg(long, value_parser = parse_kind)]
        kind: Option<RunKind>,
    },
    /// Turn a verl (ppo_trainer.yaml keys, Hydra overrides) or TRL (GRPOConfig / SFTConfig)
    /// config into a kiln TOML; unknown and ignored keys are listed, values kiln cannot run
    /// refused.
    Import {
        #[arg(long, value_enum)]
        from: Source,
        /// The source config (YAML; TRL also JSON).
        file: PathBuf,
        /// `dotted.key=value` overrides (verl: Hydra's `+key=value`, `++key=value`, `~key` too).
        overrides: Vec<String>,
        /// TRL: rl (GRPOConfig) or sft (SFTConfig); default: from the keys.
        #[arg(long, value_parser = parse_kind)]
        kind: Option<RunKind>,
        /// Where to write the TOML (default: stdout); a file already there is never overwritten
        /// (the same import again leaves it as it is).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Source {
    Verl,
    Trl,
}

fn parse_kind(text: &str) -> Result<RunKind, String> {
    RunKind::from_name(text)
}

/// The note line for a run whose config uses earlier names (read as their current ones): which,
/// and the command that rewrites the file. Runs print it with their data line, once the run has
/// started, so that a refused run still ends in its one error line.
pub fn legacy_note(path: &std::path::Path, text: &str, kind: RunKind) -> Option<String> {
    let notes = config_import::legacy_notes(text, kind);
    (!notes.is_empty()).then(|| {
        format!(
            "note: {} uses earlier names, read as the current ones ({}); `kiln config upgrade --in-place {}` rewrites it",
            path.display(),
            notes.join("; "),
            path.display()
        )
    })
}

pub fn run(args: ConfigArgs) -> Result<()> {
    match args.command {
        ConfigCommand::Show { config, kind } => {
            let text = std::fs::read_to_string(&config).with_context(|| format!("{}", config.display()))?;
            let (kind, toml) = config_import::show(&config, &text, kind)?;
            for note in config_import::legacy_notes(&text, kind) {
                eprintln!("note: {}: {note}", config.display());
            }
            print!("{toml}");
            Ok(())
        }
        ConfigCommand::Upgrade { file, in_place, out, kind } => upgrade(&file, in_place, out.as_deref(), kind),
        ConfigCommand::Import { from, file, overrides, kind, out } => {
            let text = std::fs::read_to_string(&file).with_context(|| format!("{}", file.display()))?;
            let imported = match from {
                Source::Verl => {
                    if kind.is_some_and(|k| k != RunKind::Rl) {
                        bail!("{}: verl configs import as rl", file.display());
                    }
                    config_import::verl::import(&file, &text, &overrides)?
                }
                Source::Trl => config_import::trl::import(&file, &text, &overrides, kind)?,
            };
            let source = format!("{} ({})", file.display(), match from {
                Source::Verl => "verl 0.9.1",
                Source::Trl => "TRL 1.16",
            });
            let toml = imported.to_toml(&source);
            // Never over another file (a hand-edited config, or the source itself); the same
            // import again finds the same text and leaves it.
            let unchanged = match &out {
                Some(path) if path.exists() => match std::fs::read_to_string(path) {
                    Ok(existing) if existing == toml => true,
                    _ => bail!("{}: exists and differs; `kiln config import` never overwrites (give a new --out, or remove it first)", path.display()),
                },
                _ => false,
            };
            let r = &imported.report;
            for (key, why) in &r.ignored {
                eprintln!("ignored: {key} ({why})");
            }
            for key in &r.unknown {
                eprintln!("unknown: {key}");
            }
            for note in &r.notes {
                eprintln!("note: {note}");
            }
            eprintln!(
                "kiln {}: {} values carried, {} ignored, {} unknown, {} at the source's defaults",
                imported.kind.name(),
                r.carried.len(),
                r.ignored.len(),
                r.unknown.len(),
                r.at_defaults
            );
            match out {
                Some(path) if unchanged => eprintln!("{}: unchanged", path.display()),
                Some(path) => kiln::io::write_atomic(&path, &toml)?,
                None => print!("{toml}"),
            }
            Ok(())
        }
    }
}

fn upgrade(file: &Path, in_place: bool, out: Option<&Path>, kind: Option<RunKind>) -> Result<()> {
    let text = std::fs::read_to_string(file).with_context(|| format!("{}", file.display()))?;
    let upgraded = config_import::upgrade::upgrade(file, &text, kind)?;
    for note in &upgraded.notes {
        eprintln!("note: {}: {note}", file.display());
    }
    let dir = |p: &Path| std::fs::canonicalize(kiln::train::config::base_dir(p)).ok();
    match (in_place, out) {
        (true, _) if upgraded.notes.is_empty() => eprintln!("{}: already in the current schema; left as it is", file.display()),
        (true, _) => {
            let backup = PathBuf::from(format!("{}.bak", file.display()));
            if backup.exists() {
                bail!("{}: {} exists; move it away first (an upgrade in place keeps the original there)", file.display(), backup.display());
            }
            std::fs::copy(file, &backup).with_context(|| format!("{}", backup.display()))?;
            // (through a link: the file it names is upgraded, the link kept)
            let target = std::fs::canonicalize(file).with_context(|| format!("{}", file.display()))?;
            kiln::io::write_atomic(&target, &upgraded.text)?;
            eprintln!("{}: upgraded (kiln {}); the original is {}", file.display(), upgraded.kind.name(), backup.display());
        }
        (false, Some(out)) => {
            if out.exists() {
                bail!("{}: exists; `kiln config upgrade` never overwrites (give a new --out, or --in-place for the config itself)", out.display());
            }
            if dir(out).is_some_and(|d| Some(d) != dir(file)) {
                eprintln!("note: {}: relative paths are written as in {} (relative to its directory)", out.display(), file.display());
            }
            kiln::io::write_atomic(out, &upgraded.text)?;
            eprintln!("{}: written (kiln {})", out.display(), upgraded.kind.name());
        }
        (false, None) => print!("{}", upgraded.text),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_legacy_note_is_one_line_naming_each_earlier_name_and_the_upgrade() {
        let path = std::path::Path::new("runs/pretrain.toml");
        let legacy = "[model]\ninit = \"c.json\"\n[data]\ninterplay = \"d\"\n[train]\nsteps = 1\nmicro_batch = 1\nlr = 1e-3\n[output]\ndir = \"o\"\n";
        let note = legacy_note(path, legacy, RunKind::Pretrain).expect("earlier names");
        assert!(!note.contains('\n'), "{note}");
        assert!(note.starts_with("note: runs/pretrain.toml uses earlier names"), "{note}");
        assert!(note.contains("[train] lr is read as [optimizer] lr") && note.contains("[data] interplay"), "{note}");
        assert!(note.ends_with("`kiln config upgrade --in-place runs/pretrain.toml` rewrites it"), "{note}");
        let current = legacy.replace("interplay = \"d\"", "kind = \"mixture\"\nroot = \"d\"").replace("lr = 1e-3\n", "").replace("[output]", "[optimizer]\nlr = 1e-3\n[output]");
        assert_eq!(legacy_note(path, &current, RunKind::Pretrain), None, "{current}");
    }
}
