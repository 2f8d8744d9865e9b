//! Finding the real Python interpreter: `python3` on `PATH` is often a wrapper (a pyenv shim is a
//! bash script that execs the selected version) or a symlink. Sandboxed programs run the ELF binary
//! itself, so that nothing but the interpreter is executed and only its files need to be readable.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::SandboxError;

/// A resolved interpreter.
#[derive(Debug, Clone)]
pub(crate) struct Interpreter {
    /// Canonical path of the ELF binary.
    pub path: PathBuf,
    /// `sys.version`'s first word, e.g. `3.11.2`.
    pub version: String,
    /// Directories the interpreter reads at run time (prefixes and standard library).
    pub dirs: Vec<PathBuf>,
    /// The ELF program interpreter (dynamic loader) the binary names, if any.
    pub loader: Option<PathBuf>,
}

const QUERY: &str = "import sys, sysconfig, json; print(json.dumps({'exe': sys.executable, \
    'version': sys.version.split()[0], 'ok': sys.version_info >= (3, 9), 'dirs': [sys.prefix, \
    sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, sysconfig.get_path('stdlib'), \
    sysconfig.get_path('platstdlib')]}))";

/// Finds the interpreter: `explicit` if given, else the first `python3` on `PATH`, then
/// `/usr/bin/python3` and `/usr/local/bin/python3`. With `world_readable` (programs run under an
/// unprivileged uid), candidates whose files other users cannot reach are skipped — e.g. a pyenv
/// build under `/root` — and the reasons are returned with the choice.
pub(crate) fn find(
    explicit: Option<&Path>,
    world_readable: bool,
) -> Result<(Interpreter, Vec<String>), SandboxError> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    match explicit {
        Some(p) => candidates.push(p.to_path_buf()),
        None => {
            if let Some(path) = std::env::var_os("PATH") {
                candidates.extend(std::env::split_paths(&path).map(|d| d.join("python3")));
            }
            candidates.push("/usr/bin/python3".into());
            candidates.push("/usr/local/bin/python3".into());
        }
    }
    let mut skipped = Vec::new();
    let mut seen = Vec::new();
    for cand in candidates {
        if !cand.is_file() {
            continue;
        }
        match resolve(&cand) {
            Ok(interp) => {
                if seen.contains(&interp.path) {
                    continue;
                }
                seen.push(interp.path.clone());
                if world_readable && let Some(why) = unreachable_for_others(&interp) {
                    skipped.push(format!(
                        "{} ({}): {why}",
                        cand.display(),
                        interp.path.display()
                    ));
                    continue;
                }
                return Ok((interp, skipped));
            }
            Err(why) => skipped.push(format!("{}: {why}", cand.display())),
        }
    }
    let tried = if skipped.is_empty() {
        "none found".to_string()
    } else {
        skipped.join("; ")
    };
    Err(SandboxError::NoPython(format!(
        "{tried}. Install Python 3.9+ (e.g. `apt-get install python3`) or name one with \
         SandboxOptions::python"
    )))
}

/// Resolves wrappers and symlinks to the ELF binary and asks it for its version and directories.
fn resolve(cand: &Path) -> Result<Interpreter, String> {
    let mut exe = cand.canonicalize().map_err(|e| e.to_string())?;
    if !is_elf(&exe) {
        // A wrapper script: ask the interpreter it starts where it lives.
        let out = query(&exe)?;
        exe = PathBuf::from(json_str(&out, "exe")?)
            .canonicalize()
            .map_err(|e| e.to_string())?;
        if !is_elf(&exe) {
            return Err(format!("{} is not an ELF binary", exe.display()));
        }
    }
    let out = query(&exe)?;
    if !out.contains("\"ok\": true") {
        return Err(format!(
            "Python {} is older than 3.9",
            json_str(&out, "version")?
        ));
    }
    let version = json_str(&out, "version")?;
    let list: serde_json::Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
    let mut dirs: Vec<PathBuf> = Vec::new();
    for d in list["dirs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d.as_str())
    {
        let Ok(d) = Path::new(d).canonicalize() else {
            continue;
        };
        if !dirs.iter().any(|known| d.starts_with(known)) {
            dirs.retain(|known| !known.starts_with(&d));
            dirs.push(d);
        }
    }
    let loader = elf_interp(&exe).and_then(|p| p.canonicalize().ok());
    Ok(Interpreter {
        path: exe,
        version,
        dirs,
        loader,
    })
}

fn query(exe: &Path) -> Result<String, String> {
    let out = Command::new(exe)
        .args(["-I", "-S", "-c", QUERY])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run it: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "it failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn json_str(json: &str, key: &str) -> Result<String, String> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    v[key]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("no {key} in {json}"))
}

fn is_elf(p: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(p)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && magic == *b"\x7fELF"
}

/// The PT_INTERP path of a 64-bit little-endian ELF file.
fn elf_interp(p: &Path) -> Option<PathBuf> {
    let data = std::fs::read(p).ok()?;
    let u16_at = |o: usize| Some(u16::from_le_bytes(data.get(o..o + 2)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(data.get(o..o + 8)?.try_into().ok()?));
    if data.get(4) != Some(&2) || data.get(5) != Some(&1) {
        return None; // not ELF64 little-endian
    }
    let phoff = u64_at(0x20)? as usize;
    let phentsize = u16_at(0x36)? as usize;
    for i in 0..u16_at(0x38)? as usize {
        let ph = phoff + i * phentsize;
        if u32::from_le_bytes(data.get(ph..ph + 4)?.try_into().ok()?) == 3 {
            let off = u64_at(ph + 8)? as usize;
            let size = u64_at(ph + 32)? as usize;
            let raw = data.get(off..off + size)?;
            let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
            return Some(PathBuf::from(std::str::from_utf8(&raw[..end]).ok()?));
        }
    }
    None
}

/// Why another user could not run this interpreter, if it cannot.
fn unreachable_for_others(interp: &Interpreter) -> Option<String> {
    let mut paths = vec![interp.path.clone()];
    paths.extend(interp.dirs.iter().cloned());
    for p in &paths {
        for anc in p.ancestors().skip(1) {
            let mode = std::fs::metadata(anc).ok()?.permissions().mode();
            if mode & 0o001 == 0 {
                return Some(format!(
                    "{} is not searchable by other users",
                    anc.display()
                ));
            }
        }
    }
    let mode = std::fs::metadata(&interp.path).ok()?.permissions().mode();
    (mode & 0o005 != 0o005)
        .then(|| format!("{} is not executable by others", interp.path.display()))
}
