//! The paths a client reaches without naming a route, as
//! text-embeddings-inference serves them: `POST /` (where Hugging Face's
//! `InferenceClient(base_url=…)` posts every task) and `POST /invocations`
//! (SageMaker) answer with the route the model calls for, and `GET /` and
//! `GET /ping` are health checks (`HEALTH_PATHS` in `mod.rs`).
//!
//! The route follows the model's outputs, as TEI's does its model type: a
//! classifier → `/predict`, a cross-encoder → `/rerank`, a sparse-only
//! model (SPLADE) → `/embed_sparse`, any other embedder → `/embed`, or
//! `/similarity` when `--task sentence-similarity` says the deployment
//! serves the Hub's sentence-similarity task (TEI reads `TASK` for this).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;

use super::body::Body;
use super::tei;
use crate::config::Task;
use crate::pipeline::Kind;
use crate::state::AppState;

/// The route `POST /` stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Embed,
    EmbedSparse,
    Predict,
    Rerank,
    Similarity,
}

impl Route {
    /// By `--task`, else by what the model produces. Before any replica has
    /// answered, `/embed` (which then answers 503 like every route).
    pub fn of(task: Task, kinds: &[Kind]) -> Self {
        let has = |k| kinds.contains(&k);
        if has(Kind::Classify) {
            Self::Predict
        } else if has(Kind::Score) && !has(Kind::Dense) {
            Self::Rerank
        } else if task == Task::SentenceSimilarity {
            Self::Similarity
        } else if has(Kind::Sparse) && !has(Kind::Dense) {
            Self::EmbedSparse
        } else {
            Self::Embed
        }
    }
}

/// `POST /` and `POST /invocations`: the model's own route, with its body,
/// answer, errors and metrics label.
pub async fn post(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    // The default model's: TEI's routes name none.
    let kinds = state
        .pool(None)
        .ok()
        .and_then(|(pool, _)| pool.info())
        .map(|m| crate::model::kinds(&m))
        .unwrap_or_default();
    let s = State(state.clone());
    let mut route = Route::of(state.config.task, &kinds);
    if route == Route::Embed && asks_similarity(&body) {
        route = Route::Similarity;
    }
    match route {
        Route::Embed => tei::embed(s, headers, body).await,
        Route::EmbedSparse => tei::embed_sparse(s, headers, body).await,
        Route::Predict => tei::predict(s, headers, body).await,
        Route::Rerank => tei::rerank(s, headers, body).await,
        Route::Similarity => tei::similarity(s, headers, body).await,
    }
}

/// An embedder's `POST /` whose `inputs` is `{source_sentence, sentences}`
/// (what `InferenceClient.sentence_similarity` sends) wants the similarity:
/// `/embed` could only refuse that body, so it is served without needing
/// `--task`. The byte search keeps other bodies from being parsed twice.
fn asks_similarity(body: &Body) -> bool {
    const KEY: &[u8] = b"\"source_sentence\"";
    let Ok(bytes) = body else { return false };
    if !bytes.windows(KEY.len()).any(|w| w == KEY) {
        return false;
    }
    matches!(
        serde_json::from_slice::<serde_json::Value>(bytes),
        Ok(serde_json::Value::Object(o)) if matches!(o.get("inputs"), Some(serde_json::Value::Object(_)))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_follows_the_model_as_tei_does() {
        let auto = Task::Auto;
        assert_eq!(Route::of(auto, &[Kind::Dense]), Route::Embed);
        // BGE-M3: dense first, as TEI's embedder.
        let m3 = [Kind::Dense, Kind::Sparse, Kind::MultiVector];
        assert_eq!(Route::of(auto, &m3), Route::Embed);
        assert_eq!(Route::of(auto, &[Kind::Sparse]), Route::EmbedSparse);
        assert_eq!(Route::of(auto, &[Kind::Score]), Route::Rerank);
        assert_eq!(Route::of(auto, &[Kind::Classify]), Route::Predict);
        assert_eq!(Route::of(auto, &[]), Route::Embed);
        let sim = Task::SentenceSimilarity;
        assert_eq!(Route::of(sim, &[Kind::Dense]), Route::Similarity);
        // A reranker stays a reranker whatever the task says.
        assert_eq!(Route::of(sim, &[Kind::Score]), Route::Rerank);
    }

    #[test]
    fn a_similarity_body_is_recognised() {
        let body = |s: &str| -> Body { Ok(bytes::Bytes::from(s.to_owned())) };
        assert!(asks_similarity(&body(
            r#"{"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": {}}"#
        )));
        assert!(!asks_similarity(&body(r#"{"inputs": "a"}"#)));
        // The words inside a text are not the field.
        assert!(!asks_similarity(&body(
            r#"{"inputs": "\"source_sentence\": x"}"#
        )));
        assert!(!asks_similarity(&body(
            r#"{"inputs": ["source_sentence"], "x": {"source_sentence": 1}}"#
        )));
    }
}
