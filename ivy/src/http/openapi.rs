//! The OpenAPI 3.1 document served at `/openapi.json`. It is written next to
//! the handlers' field parsers and kept true by the end-to-end tests, which
//! validate real responses (successes and errors) against these schemas.

use serde_json::{json, Value};

use crate::config::Config;

mod batch;
mod schemas;
use schemas::schemas;

fn schema(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn body(name: &str) -> Value {
    json!({ "content": { "application/json": { "schema": schema(name) } } })
}

/// `{status: description}` error responses of one family.
fn errors(error_schema: &str, codes: &[(&str, &str)]) -> serde_json::Map<String, Value> {
    codes
        .iter()
        .map(|(code, what)| (code.to_string(), json!({ "description": what, "content": { "application/json": { "schema": schema(error_schema) } } })))
        .collect()
}

fn operation(
    summary: &str,
    request: Option<&str>,
    ok: Value,
    errs: serde_json::Map<String, Value>,
) -> Value {
    let mut responses = serde_json::Map::new();
    responses.insert("200".into(), ok);
    responses.extend(errs);
    let mut op = json!({ "summary": summary, "responses": responses });
    if let Some(r) = request {
        op["requestBody"] =
            json!({ "required": true, "content": { "application/json": { "schema": schema(r) } } });
        op["security"] = json!([{ "bearer": [] }, {}]);
    }
    op
}

const TEI_EMBED_ERRORS: [(&str, &str); 12] = [
    ("400", "Body is not JSON, or no inputs (`Empty`)"),
    ("401", "Missing or wrong API key"),
    ("408", "The body was not received within the body timeout (`Validation`)"),
    ("413", "Body larger than --max-body-bytes (`Validation`)"),
    ("415", "Content-Type is not application/json"),
    ("422", "JSON of the wrong shape (a missing field, a wrong type, a bad option value), or a rule broken: too many inputs or tokens, an input too long without truncation, unknown prompt (`Validation`, as TEI 1.9)"),
    ("424", "The model cannot produce this output, or a replica failed (`Backend`)"),
    ("429", "Over the concurrency limit (`Overloaded`)"),
    ("500", "Internal error (the message carries the request id)"),
    ("503", "No healthy replica, or Ivy is draining (`Unhealthy`)"),
    ("504", "The request did not finish within its timeout"),
    ("404", "The request's `model` is not served here (`Validation`)"),
];

const OPENAI_ERRORS: [(&str, &str); 12] = [
    ("400", "Body is not JSON"),
    ("401", "Missing or wrong API key"),
    ("404", "The request names a model this gateway does not serve (code model_not_found)"),
    ("408", "The body was not received within the body timeout"),
    ("413", "Body too large"),
    ("415", "Content-Type is not application/json"),
    ("422", "Invalid request: a missing field, a wrong type, too many inputs or tokens, an input too long without truncation"),
    ("429", "Over the concurrency limit"),
    ("500", "Internal error (the message carries the request id)"),
    ("502", "A replica failed on every attempt"),
    ("503", "No healthy replica, or Ivy is draining"),
    ("504", "The request did not finish within its timeout"),
];

pub fn document(config: &Config) -> Value {
    let mut doc = routes(config);
    doc["paths"]
        .as_object_mut()
        .expect("paths is an object")
        .extend(batch::paths());
    if let (Some(all), Value::Object(more)) = (
        doc["components"]["schemas"].as_object_mut(),
        batch::schemas(),
    ) {
        all.extend(more);
    }
    doc
}

fn routes(config: &Config) -> Value {
    let tei = |codes: &[(&str, &str)]| errors("TeiError", codes);
    let tei_embed = || tei(&TEI_EMBED_ERRORS);
    let ok = |name: &str, what: &str| {
        let mut v = body(name);
        v["description"] = json!(what);
        v
    };
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Ivy",
            "version": env!("CARGO_PKG_VERSION"),
            "description": format!(
                "Embedding gateway: OpenAI- and text-embeddings-inference-compatible APIs over Tulip replicas. \
                 Limits: {} bytes per body, {} inputs and {} tokens per request, {} concurrent requests, {}s per request.",
                config.max_body_bytes, config.max_inputs, config.max_tokens_per_request,
                config.max_concurrent_requests, config.request_timeout.as_secs_f64()),
        },
        "paths": {
            "/v1/embeddings": { "post": operation("Embeddings (OpenAI)", Some("OpenAiEmbeddingRequest"),
                ok("OpenAiEmbeddingResponse", "Embeddings in input order"), errors("OpenAiError", &OPENAI_ERRORS)) },
            "/v1/models": { "get": operation("Served model names (OpenAI)", None,
                ok("OpenAiModelList", "The names this gateway serves the model under"),
                errors("OpenAiError", &[OPENAI_ERRORS[1], OPENAI_ERRORS[10]])) },
            "/v1/rerank": { "post": operation("Rerank documents against a query (Cohere/Jina shape)", Some("CohereRerankRequest"),
                ok("CohereRerankResponse", "Documents best first"), errors("OpenAiError", &OPENAI_ERRORS)) },
            "/v1/load_lora_adapter": { "post": operation("Load a LoRA adapter (PEFT directory) on every replica of a model, served as model `lora_name` (vLLM's route)", Some("LoadLoraAdapterRequest"),
                json!({ "description": "Success: LoRA adapter '…' added successfully.", "content": { "text/plain": { "schema": { "type": "string" } } } }),
                errors("OpenAiError", &OPENAI_ERRORS)) },
            "/v1/unload_lora_adapter": { "post": operation("Unload a LoRA adapter (vLLM's route); requests already holding it finish", Some("UnloadLoraAdapterRequest"),
                json!({ "description": "Success: LoRA adapter '…' removed successfully.", "content": { "text/plain": { "schema": { "type": "string" } } } }),
                errors("OpenAiError", &OPENAI_ERRORS)) },
            "/embed": { "post": operation("Dense embeddings (TEI)", Some("EmbedRequest"),
                ok("EmbedResponse", "One vector per input"), tei_embed()) },
            "/embed_sparse": { "post": operation("Sparse lexical weights (TEI)", Some("EmbedSparseRequest"),
                ok("EmbedSparseResponse", "(token id, weight) pairs per input"), tei_embed()) },
            "/embed_all": { "post": operation("Per-token vectors (TEI): the last hidden state of every token, or the multi-vector head's vectors when the model has one", Some("EmbedAllRequest"),
                ok("EmbedAllResponse", "Vectors per input"), tei_embed()) },
            "/rerank": { "post": operation("Rerank texts against a query (TEI)", Some("RerankRequest"),
                ok("RerankResponse", "Texts best first"), tei_embed()) },
            "/predict": { "post": operation("Classify texts or text pairs (TEI)", Some("PredictRequest"),
                ok("PredictResponse", "Labels with scores, best first; one list per input for a list"), tei_embed()) },
            "/similarity": { "post": operation("Cosine similarity of a sentence to others (TEI)", Some("SimilarityRequest"),
                ok("SimilarityResponse", "One similarity per sentence, in order"), tei_embed()) },
            "/tokenize": { "post": operation("Tokenize (TEI)", Some("TokenizeRequest"),
                ok("TokenizeResponse", "Tokens per input"),
                tei(&[TEI_EMBED_ERRORS[0], TEI_EMBED_ERRORS[1], TEI_EMBED_ERRORS[2], TEI_EMBED_ERRORS[3],
                      TEI_EMBED_ERRORS[4], TEI_EMBED_ERRORS[5], TEI_EMBED_ERRORS[7], TEI_EMBED_ERRORS[11]])) },
            "/decode": { "post": operation("Token ids back to text (TEI)", Some("DecodeRequest"),
                ok("DecodeResponse", "One text per sequence"),
                tei(&[TEI_EMBED_ERRORS[0], TEI_EMBED_ERRORS[1], TEI_EMBED_ERRORS[2], TEI_EMBED_ERRORS[3],
                      TEI_EMBED_ERRORS[4], TEI_EMBED_ERRORS[5], TEI_EMBED_ERRORS[7], TEI_EMBED_ERRORS[9],
                      TEI_EMBED_ERRORS[11]])) },
            "/info": { "get": info_operation(ok("Info", "Model info"),
                tei(&[("401", "Missing or wrong API key"), ("404", "`model` is not served here"),
                      ("503", "No replica has answered yet")])) },
            "/openapi.json": { "get": operation("This document", None,
                json!({ "description": "OpenAPI document", "content": { "application/json": { "schema": { "type": "object" } } } }),
                tei(&[("401", "Missing or wrong API key")])) },
            "/v2/embed": { "post": operation("Embeddings in Cohere's v2 shape, float and quantized (int8, uint8, binary, ubinary)", Some("CohereEmbedRequest"),
                ok("CohereEmbedResponse", "Vectors per requested type, in input order"), errors("CohereError", &OPENAI_ERRORS)) },
            "/quantization/ranges": { "get": {
                "summary": "The per-dimension ranges int8/uint8 vectors are cut from (calibrated once per model on first use); `ranges` is sentence-transformers' quantize_embeddings argument",
                "parameters": [
                    { "name": "dimensions", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 1 } },
                    { "name": "normalize", "in": "query", "required": false, "schema": { "type": "boolean" } } ],
                "responses": { "200": ok("QuantizationRanges", "Ranges of that setting"),
                    "401": { "description": "Missing or wrong API key", "content": { "application/json": { "schema": schema("TeiError") } } },
                    "422": { "description": "A bad query parameter, or a setting the ranges file lacks", "content": { "application/json": { "schema": schema("TeiError") } } },
                    "503": { "description": "No replica has answered yet, or the calibration failed", "content": { "application/json": { "schema": schema("TeiError") } } } } } },
            "/": {
                "post": operation("The model's own route, as TEI serves `/` (Hugging Face InferenceClient's base URL): /embed for an embedder, /embed_sparse for a sparse-only model, /predict for a classifier, /rerank for a cross-encoder, /similarity with --task sentence-similarity or a {source_sentence, sentences} body",
                    Some("RootRequest"), ok("RootResponse", "The answer of that route"), tei_embed()),
                "get": { "summary": "Liveness, as /health (no API key)",
                    "responses": { "200": { "description": "ok", "content": { "text/plain": { "schema": { "type": "string" } } } } } } },
            "/invocations": { "post": operation("SageMaker's path: the same as POST /", Some("RootRequest"),
                ok("RootResponse", "The answer of the model's route"), tei_embed()) },
            "/ping": { "get": { "summary": "Liveness for SageMaker, as /health (no API key)",
                "responses": { "200": { "description": "ok", "content": { "text/plain": { "schema": { "type": "string" } } } } } } },
            "/health": { "get": { "summary": "Liveness (never depends on replicas; no API key)",
                "responses": { "200": { "description": "ok", "content": { "text/plain": { "schema": { "type": "string" } } } } } } },
            "/ready": { "get": { "summary": "Readiness: not draining and at least one healthy replica (no API key)",
                "responses": { "200": ok("Ready", "Ready"), "503": ok("Ready", "Not ready") } } },
            "/metrics": { "get": { "summary": "Prometheus metrics (no API key)",
                "responses": { "200": { "description": "Text exposition 0.0.4", "content": { "text/plain": { "schema": { "type": "string" } } } } } } },
        },
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer",
                "description": "Required on every route but /health, /ready and /metrics when Ivy runs with --api-key" } },
            "schemas": schemas(config),
        },
    })
}

/// `GET /info`, with its `?model=` query.
fn info_operation(ok: Value, errs: serde_json::Map<String, Value>) -> Value {
    let mut op = operation(
        "Served model (the one named, else the default) and limits",
        None,
        ok,
        errs,
    );
    op["parameters"] = json!([{ "name": "model", "in": "query", "required": false,
        "schema": { "type": "string" }, "description": "A model this gateway serves (GET /v1/models); unset: the default model" }]);
    op
}
