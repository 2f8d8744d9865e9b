//! Files in and out: JSONL rows with errors that name file and line ([`jsonl`]), output files
//! that appear whole or not at all ([`atomic`]), JSON written byte for byte like Python's `json`
//! module ([`pyjson`]), Python's conversions of JSON values ([`python`]) and the rows of Parquet
//! files ([`parquet`], feature `code`).

pub mod atomic;
pub mod jsonl;
pub mod lock;
#[cfg(feature = "code")]
pub mod parquet;
pub mod pyjson;
pub mod python;

pub use atomic::{AtomicFile, owned_by_this_user, pid_is_gone, refuse_non_empty_dir, remove_dir, remove_file, sweep_partials, write_atomic, write_dir_atomically};
pub use lock::{DirLock, lock_dir};
pub use jsonl::{Record, jsonl_files, jsonl_records, jsonl_records_reported, read_jsonl};
pub use pyjson::{Json, Style};
