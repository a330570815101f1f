//! TEI's `/tokenize` and `/decode`: what the model would see for each
//! input, and token ids back to text (`pipeline/tokens.rs`).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Serialize;

use crate::error::ApiError;
use crate::http::body::{json_object, Body};
use crate::http::fields;
use crate::http::respond::{finish, json, to_json, Api};
use crate::pipeline::tokens::{self, DecodeJob, Token, TokenizeJob};
use crate::pipeline::Inputs;
use crate::state::AppState;

pub async fn tokenize(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let obj = json_object(&state, &headers, body, "inputs")?;
        let (pool, _) = fields::pool(&state, &obj)?;
        let job = TokenizeJob {
            inputs: fields::strings(&obj, "inputs")?,
            add_special_tokens: fields::opt_bool(&obj, "add_special_tokens")?.unwrap_or(true),
            prompt_name: fields::opt_string(&obj, "prompt_name")?,
        };
        let all = tokens::run(&state, &pool, job, state.deadline()).await?;
        let body: Vec<Vec<SimpleToken>> = all
            .iter()
            .map(|t| t.iter().map(SimpleToken::from).collect())
            .collect();
        Ok(json(to_json(&body)?))
    }
    .await;
    finish(&state, Api::Tei, "tokenize", result)
}

/// `POST /decode`: token ids back to text, one string per sequence. `ids`
/// is one sequence or a list of them (`[]` is one empty sequence, as TEI
/// reads it); ids outside the vocabulary are dropped, as `tokenizers` does.
pub async fn decode(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let obj = json_object(&state, &headers, body, "ids")?;
        let (pool, _) = fields::pool(&state, &obj)?;
        let ids = match obj.get("ids") {
            Some(serde_json::Value::Array(a)) if a.is_empty() => vec![vec![]],
            _ => match fields::inputs(&obj, "ids")? {
                Inputs::Ids(ids) => ids,
                _ => {
                    return Err(ApiError::schema(
                        "ids",
                        "`ids` must be an array of token ids or an array of such arrays",
                    ))
                }
            },
        };
        let job = DecodeJob {
            ids,
            skip_special_tokens: fields::opt_bool(&obj, "skip_special_tokens")?.unwrap_or(true),
        };
        let texts = tokens::decode(&state, &pool, job, state.deadline()).await?;
        Ok(json(to_json(&texts)?))
    }
    .await;
    finish(&state, Api::Tei, "decode", result)
}

#[derive(Serialize)]
struct SimpleToken<'a> {
    id: u32,
    text: &'a str,
    special: bool,
    start: Option<u32>,
    stop: Option<u32>,
}

impl<'a> From<&'a Token> for SimpleToken<'a> {
    fn from(t: &'a Token) -> Self {
        Self {
            id: t.id,
            text: &t.text,
            special: t.special,
            start: t.start,
            stop: t.stop,
        }
    }
}
