//! Rows of Parquet files (as Hugging Face datasets are downloaded) as JSON objects.
//!
//! Only the named top-level columns are read (a projection: other columns are never decoded),
//! with nested lists and structs as JSON arrays and objects. Built on the `parquet` crate's row
//! reader with the Snappy (what `datasets` writes), Zstandard, LZ4 (`LZ4_RAW`, as pyarrow
//! writes it; the deprecated Hadoop-framed `LZ4` goes through the same codec but has no
//! fixture) and gzip codecs, each checked against a file pyarrow wrote
//! (`tests/fixtures/code/make_codec_fixtures.py`); files compressed otherwise (Brotli, LZO) fail
//! with an error naming the codec.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::schema::types::Type;
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Every row of `path` with only `columns` (each must exist), in file order.
pub fn read_parquet_columns(path: &Path, columns: &[&str]) -> Result<Vec<Map<String, Value>>> {
    let error = |message: String| Error::data(path, None, message);
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let reader = SerializedFileReader::new(file).map_err(|e| error(format!("not a readable Parquet file: {e}")))?;
    let schema = reader.metadata().file_metadata().schema();
    let mut fields: Vec<Arc<Type>> = Vec::with_capacity(columns.len());
    for &name in columns {
        let field = schema.get_fields().iter().find(|f| f.name() == name).ok_or_else(|| {
            let names: Vec<&str> = schema.get_fields().iter().map(|f| f.name()).collect();
            error(format!("no column {name:?} (the file has {})", names.join(", ")))
        })?;
        fields.push(field.clone());
    }
    let projection = Type::group_type_builder(schema.name())
        .with_fields(fields)
        .build()
        .map_err(|e| error(e.to_string()))?;
    let rows = reader.get_row_iter(Some(projection)).map_err(|e| error(e.to_string()))?;
    // The footer's row count reserves room, up to a bound: a corrupt footer must not ask for more
    // memory than the rows it holds (the rows themselves then fail to read, naming the file).
    let mut out = Vec::with_capacity(reader.metadata().file_metadata().num_rows().clamp(0, 1 << 20) as usize);
    for (i, row) in rows.enumerate() {
        let row = row.map_err(|e| error(format!("row {}: {e}", i + 1)))?;
        match row.to_json_value() {
            Value::Object(map) => out.push(map),
            _ => unreachable!("a Parquet row converts to a JSON object"),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/code").join(name)
    }

    #[test]
    fn reads_pyarrow_rows_with_nested_types_like_the_jsonl_copy() {
        let columns = ["id", "messages", "examples", "aliases", "api_metadata", "time_limit", "contest_start", "note", "finish_reason"];
        let mut rows = Vec::new();
        for shard in ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"] {
            rows.extend(read_parquet_columns(&fixture("cots_mini").join(shard), &columns).unwrap());
        }
        let jsonl = std::fs::read_to_string(fixture("cots_mini.jsonl")).unwrap();
        let expected: Vec<Map<String, Value>> = jsonl.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(rows.len(), 5);
        for (row, want) in rows.iter().zip(&expected) {
            assert_eq!(row.keys().count(), columns.len());
            for column in columns {
                assert_eq!(row[column], want[column], "{} column {column}", want["id"]);
            }
        }
        assert_eq!(rows[0]["messages"][1]["role"], "assistant");
        assert_eq!(rows[2]["note"], Value::Null);
    }

    /// The codec every column chunk of `path` records.
    fn codecs(path: &Path) -> Vec<parquet::basic::Compression> {
        let reader = SerializedFileReader::new(File::open(path).unwrap()).unwrap();
        let mut codecs: Vec<_> = reader.metadata().row_groups().iter().flat_map(|g| g.columns().iter().map(|c| c.compression())).collect();
        codecs.dedup();
        codecs
    }

    /// Each codec's file (the cots_mini rows, written by pyarrow) reads to the JSONL copy.
    fn reads_the_codec(codec: &str, recorded: parquet::basic::Compression) {
        let path = fixture("cots_codecs").join(format!("cots_{codec}.parquet"));
        assert!(
            path.exists(),
            "{} is missing: run `python3 -m venv /tmp/pqenv && /tmp/pqenv/bin/pip install pyarrow && /tmp/pqenv/bin/python tests/fixtures/code/make_codec_fixtures.py` from the repository root",
            path.display()
        );
        assert_eq!(codecs(&path), [recorded], "{codec}: the fixture is not compressed with the codec under test");
        let columns = ["id", "messages", "examples", "aliases", "api_metadata", "time_limit", "contest_start", "note", "finish_reason", "generation"];
        let rows = read_parquet_columns(&path, &columns).unwrap_or_else(|e| panic!("{codec}: {e}"));
        let jsonl = std::fs::read_to_string(fixture("cots_mini.jsonl")).unwrap();
        let expected: Vec<Map<String, Value>> = jsonl.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(rows.len(), expected.len());
        for (row, want) in rows.iter().zip(&expected) {
            for column in columns {
                assert_eq!(row[column], want[column], "{codec}: {} column {column}", want["id"]);
            }
        }
    }

    #[test]
    fn reads_zstd_files() {
        reads_the_codec("zstd", parquet::basic::Compression::ZSTD(Default::default()));
    }

    #[test]
    fn reads_lz4_files() {
        reads_the_codec("lz4", parquet::basic::Compression::LZ4_RAW);
    }

    #[test]
    fn reads_gzip_files() {
        reads_the_codec("gzip", parquet::basic::Compression::GZIP(Default::default()));
    }

    #[test]
    fn a_missing_column_or_a_non_parquet_file_is_named() {
        let err = read_parquet_columns(&fixture("cots_bad.parquet"), &["id", "messages"]).unwrap_err().to_string();
        assert!(err.contains("cots_bad.parquet") && err.contains("no column \"messages\"") && err.contains("generation"), "{err}");
        let err = read_parquet_columns(&fixture("cots_mini.jsonl"), &["id"]).unwrap_err().to_string();
        assert!(err.contains("cots_mini.jsonl") && err.contains("Parquet"), "{err}");
    }
}
