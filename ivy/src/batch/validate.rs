//! Checks a batch's input file as OpenAI does before it runs: at least one
//! request and at most `--batch-max-lines`, unique `custom_id`s, one
//! endpoint (the batch's) and one model per file; and cuts it into shards.
//! A line that is not a JSON request at all is not the file's fault: it
//! fails alone when it runs (`lines.rs`).

use std::collections::HashSet;

use serde_json::{json, Value};

use super::store::ShardSpan;

/// Most errors listed on a refused batch.
const MAX_ERRORS: usize = 10;

/// What validation found: the shards and model, or the errors that fail
/// the batch (OpenAI's `errors` object).
pub enum Verdict {
    Run {
        model: Option<String>,
        shards: Vec<ShardSpan>,
    },
    Refuse(Value),
}

/// The request lines of `bytes`, with their byte ranges: split on `\n`,
/// blank lines skipped (here and when a shard runs, so both count alike).
pub fn lines(bytes: &[u8], base: u64) -> impl Iterator<Item = (u64, u64, &[u8])> {
    let mut start = 0usize;
    std::iter::from_fn(move || loop {
        if start >= bytes.len() {
            return None;
        }
        let end = bytes[start..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(bytes.len(), |i| start + i + 1);
        let line = &bytes[start..end];
        let at = start;
        start = end;
        if !line.trim_ascii().is_empty() {
            return Some((base + at as u64, base + end as u64, line));
        }
    })
}

pub fn check(bytes: &[u8], endpoint: &str, max_lines: u64, shard_lines: u64) -> Verdict {
    let mut errors = Vec::new();
    let mut seen = HashSet::new();
    let mut model: Option<Option<String>> = None;
    let mut shards = Vec::new();
    let mut count = 0u64;
    let refuse = |errors: &mut Vec<Value>, code: &str, param: &str, message: String, line: u64| {
        if errors.len() < MAX_ERRORS {
            errors.push(json!({"code": code, "message": message, "param": param, "line": line}));
        }
    };
    for (start, end, line) in lines(bytes, 0) {
        count += 1;
        if count > max_lines {
            refuse(
                &mut errors,
                "too_many_requests",
                "input_file_id",
                format!("the file holds more than {max_lines} requests (Ivy's --batch-max-lines); split it into several batches"),
                count,
            );
            break;
        }
        match shards.last_mut() {
            Some(ShardSpan {
                byte_end, lines, ..
            }) if (*lines as u64) < shard_lines => {
                *byte_end = end as i64;
                *lines += 1;
            }
            _ => shards.push(ShardSpan {
                byte_start: start as i64,
                byte_end: end as i64,
                lines: 1,
            }),
        }
        let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        if let Some(Value::String(id)) = obj.get("custom_id") {
            if !seen.insert(id.clone()) {
                refuse(
                    &mut errors,
                    "duplicate_custom_id",
                    "custom_id",
                    format!(
                        "the custom_id {id:?} appears more than once; each request needs its own"
                    ),
                    count,
                );
            }
        }
        if let Some(Value::String(url)) = obj.get("url") {
            if url != endpoint {
                refuse(
                    &mut errors,
                    "mismatched_endpoint",
                    "url",
                    format!("the request's url {url:?} is not the batch's endpoint {endpoint:?}; one batch serves one endpoint"),
                    count,
                );
            }
        }
        let this = obj
            .get("body")
            .and_then(|b| b.get("model"))
            .and_then(Value::as_str)
            .map(str::to_string);
        match &model {
            None => model = Some(this),
            Some(m) if *m != this => refuse(
                &mut errors,
                "mismatched_model",
                "body.model",
                format!(
                    "the request's model {:?} differs from the file's first, {:?}; one batch serves one model",
                    this.as_deref().unwrap_or("(default)"),
                    m.as_deref().unwrap_or("(default)")
                ),
                count,
            ),
            Some(_) => {}
        }
    }
    if count == 0 {
        refuse(
            &mut errors,
            "empty_file",
            "input_file_id",
            "the file holds no request: one JSON object per line".into(),
            0,
        );
    }
    if errors.is_empty() {
        Verdict::Run {
            model: model.flatten(),
            shards,
        }
    } else {
        Verdict::Refuse(json!({"object": "list", "data": errors}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(id: &str, url: &str, model: &str) -> String {
        format!(
            "{{\"custom_id\": \"{id}\", \"method\": \"POST\", \"url\": \"{url}\", \"body\": {{\"model\": \"{model}\", \"input\": \"x\"}}}}\n"
        )
    }

    fn refusal(text: &str) -> Vec<String> {
        match check(text.as_bytes(), "/v1/embeddings", 100, 2) {
            Verdict::Refuse(v) => v["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["code"].as_str().unwrap().to_string())
                .collect(),
            Verdict::Run { .. } => vec![],
        }
    }

    #[test]
    fn cuts_shards_on_request_lines_skipping_blanks() {
        let text = [
            line("a", "/v1/embeddings", "m"),
            "\n".into(),
            line("b", "/v1/embeddings", "m"),
            "not json\n".into(),
            line("c", "/v1/embeddings", "m"),
        ]
        .concat();
        let Verdict::Run { model, shards } = check(text.as_bytes(), "/v1/embeddings", 100, 2)
        else {
            panic!("refused");
        };
        assert_eq!(model.as_deref(), Some("m"));
        assert_eq!(shards.len(), 2);
        assert_eq!(shards[0].lines, 2);
        assert_eq!(shards[1].lines, 2);
        assert_eq!(shards[0].byte_start, 0);
        assert_eq!(shards[1].byte_end as usize, text.len());
        let first: Vec<_> = lines(&text.as_bytes()[..shards[0].byte_end as usize], 0).collect();
        assert_eq!(first.len(), 2);
    }

    #[test]
    fn refuses_what_openai_refuses() {
        let dup = [
            line("a", "/v1/embeddings", "m"),
            line("a", "/v1/embeddings", "m"),
        ]
        .concat();
        assert_eq!(refusal(&dup), ["duplicate_custom_id"]);
        let url = [
            line("a", "/v1/embeddings", "m"),
            line("b", "/v1/chat/completions", "m"),
        ]
        .concat();
        assert_eq!(refusal(&url), ["mismatched_endpoint"]);
        let model = [
            line("a", "/v1/embeddings", "m"),
            line("b", "/v1/embeddings", "n"),
        ]
        .concat();
        assert_eq!(refusal(&model), ["mismatched_model"]);
        assert_eq!(refusal("\n \n"), ["empty_file"]);
        let many: String = (0..101)
            .map(|i| line(&i.to_string(), "/v1/embeddings", "m"))
            .collect();
        assert_eq!(refusal(&many), ["too_many_requests"]);
    }
}
