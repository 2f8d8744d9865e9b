//! LiveCodeBench private tests: a JSON string, or the compressed form of the release files,
//! decoded exactly as LiveCodeBench's loader does:
//!
//! ```python
//! try:
//!     tests = json.loads(s)
//! except:
//!     tests = json.loads(pickle.loads(zlib.decompress(base64.b64decode(s.encode("utf-8")))))
//! ```
//!
//! The pickle is a pickled Python `str` (the JSON text). It is read by `serde-pickle`, which only
//! builds data values: a pickle that names a global (the route to running code) is rejected.

use std::io::Read;

use base64::Engine;

use super::problem::TestCase;

/// Decodes a `private_test_cases` field into its tests.
pub fn decode_private_tests(field: &str) -> Result<Vec<TestCase>, String> {
    let json = match serde_json::from_str::<serde_json::Value>(field) {
        Ok(value) => value,
        Err(_) => {
            let text = unpickle_str(&inflate(&base64_decode(field)?)?)?;
            serde_json::from_str(&text).map_err(|e| format!("the decoded tests are not JSON: {e}"))?
        }
    };
    serde_json::from_value(json).map_err(|e| format!("not a list of {{input, output, testtype}}: {e}"))
}

/// `base64.b64decode(s)`: the standard alphabet with padding; like Python's default
/// (`validate=False`) it skips characters outside the alphabet, such as line breaks.
fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    let clean: Vec<u8> = text
        .bytes()
        .filter(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(&clean)
        .map_err(|e| format!("neither JSON nor base64 ({e})"))
}

/// `zlib.decompress(data)`.
fn inflate(data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    flate2::read::ZlibDecoder::new(data)
        .read_to_end(&mut out)
        .map_err(|e| format!("base64 but not zlib data ({e})"))?;
    Ok(out)
}

/// `pickle.loads(data)` for a pickled `str` (any protocol, 0 to 5).
pub fn unpickle_str(data: &[u8]) -> Result<String, String> {
    serde_pickle::from_slice(data, serde_pickle::DeOptions::new()).map_err(|e| format!("not a pickled str ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_protocol_python_writes() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/code/pickle_cases.jsonl");
        let text = std::fs::read_to_string(path).unwrap();
        let mut protocols = std::collections::BTreeSet::new();
        for line in text.lines() {
            let case: serde_json::Value = serde_json::from_str(line).unwrap();
            let blob = base64_decode(case["pickle_b64"].as_str().unwrap()).unwrap();
            let protocol = case["protocol"].as_u64().unwrap();
            assert_eq!(unpickle_str(&blob).unwrap(), case["text"].as_str().unwrap(), "protocol {protocol}");
            protocols.insert(protocol);
        }
        assert_eq!(protocols.into_iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn plain_json_and_garbage() {
        let tests = decode_private_tests(r#"[{"input": "1\n", "output": "2\n", "testtype": "stdin"}]"#).unwrap();
        assert_eq!(tests[0].output, "2\n");
        assert!(decode_private_tests("[]").unwrap().is_empty());
        assert!(decode_private_tests("!!!").unwrap_err().contains("base64"));
        assert!(decode_private_tests("aGVsbG8=").unwrap_err().contains("zlib"), "base64 of 'hello'");
        let err = decode_private_tests(r#"{"input": "1"}"#).unwrap_err();
        assert!(err.contains("not a list"), "{err}");
    }

    #[test]
    fn a_pickle_that_names_a_global_is_refused() {
        // pickle.dumps(os.system) at protocol 2: GLOBAL 'posix system'.
        let blob = b"\x80\x02cposix\nsystem\nq\x00.";
        assert!(unpickle_str(blob).is_err());
    }
}
