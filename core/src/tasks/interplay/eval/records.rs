//! One line of `<model>_{id,ood}_generations.jsonl`, field for field as `eval_generation_vllm`
//! writes it (`docs/interplay.md` §8.1): `op` (a string), `__idx`, `prompt`, the gold and generated
//! answers (each twice, "raw" and not), `gen_solution_answer` (the completion stripped),
//! `resp_tokens` (every generated id, a stop string's tokens included, as vLLM counts them),
//! `exact_match` and `template`; written with `json.dumps(record, ensure_ascii=False)`.

use super::data::EvalRow;
use crate::io::pyjson::{Json, Style};
use crate::tasks::interplay::answer::{exact_match, extract_tagged_answer};
use crate::tasks::interplay::pystr::strip;

/// The generations-file line of one sample of `row`: `text` is the completion (stop string
/// excluded) and `tokens` the number of generated ids.
pub fn generation_line(row: &EvalRow, text: &str, tokens: usize) -> String {
    let answer = extract_tagged_answer(text);
    let em = exact_match(&answer, &row.gold_answer);
    Json::object([
        ("op", Json::Str(row.op.to_string())),
        ("__idx", Json::from(row.idx)),
        ("prompt", Json::from(row.prompt.as_str())),
        ("gold_answer", Json::from(row.gold_answer.as_str())),
        ("gen_answer", Json::from(answer.as_str())),
        ("gold_answer_raw", Json::from(row.gold_answer.as_str())),
        ("gen_answer_raw", Json::from(answer.as_str())),
        ("gen_solution_answer", Json::from(strip(text))),
        ("resp_tokens", Json::from(tokens)),
        ("exact_match", Json::Int(i64::from(em))),
        ("template", Json::from(row.template.clone())),
    ])
    .dumps(Style::COMPACT_UTF8)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::io::read_jsonl;

    /// Rebuilds every line of the reference's generations file from its row and sample text.
    #[test]
    fn lines_match_eval_checkpoints() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/interplay");
        let data = super::super::data::EvalData::load(&dir.join("rows"), Some(10)).unwrap();
        let generations = dir.join("scoring/generations.jsonl");
        let lines = std::fs::read_to_string(&generations).unwrap();
        let records = read_jsonl(&generations).unwrap();
        for (line, record) in lines.lines().zip(&records) {
            let op: i64 = record.fields["op"].as_str().unwrap().parse().unwrap();
            let idx = record.fields["__idx"].as_u64().unwrap() as usize;
            let row = if op > 10 { &data.ood[idx] } else { &data.id[idx] };
            // The stub's text is the gold completion or a variant; `gen_solution_answer` is it
            // stripped, so rebuilding from that loses only surrounding whitespace.
            let text = record.fields["gen_solution_answer"].as_str().unwrap();
            let tokens = record.fields["resp_tokens"].as_u64().unwrap() as usize;
            assert_eq!(generation_line(row, text, tokens), line, "line {}", record.line);
        }
        assert_eq!(records.len(), 2242);
    }
}
