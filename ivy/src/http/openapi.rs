//! The OpenAPI 3.1 document served at `/openapi.json`. It is written next to
//! the handlers' field parsers and kept true by the end-to-end tests, which
//! validate real responses (successes and errors) against these schemas.

use serde_json::{json, Value};

use crate::config::Config;

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

/// The TEI requests: each takes `model` too, an extension (TEI serves one
/// model).
const TEI_REQUESTS: [&str; 8] = [
    "EmbedRequest",
    "EmbedSparseRequest",
    "EmbedAllRequest",
    "RerankRequest",
    "PredictRequest",
    "SimilarityRequest",
    "TokenizeRequest",
    "DecodeRequest",
];

/// Every schema the document names, one family at a time.
fn schemas(config: &Config) -> Value {
    let f = Fragments::new(config);
    let mut all = serde_json::Map::new();
    for family in [
        openai, cohere, cohere_v2, tei_embed, tei_scores, tei_tokens, ops,
    ] {
        if let Value::Object(schemas) = family(&f) {
            all.extend(schemas);
        }
    }
    for name in TEI_REQUESTS {
        if let Some(props) = all.get_mut(name).and_then(|s| s.get_mut("properties")) {
            props["model"] = json!({ "type": ["string", "null"],
                "description": "Extension: a model this gateway serves (GET /v1/models); unset: --default-model, else the first model to come up" });
        }
    }
    Value::Object(all)
}

/// Field schemas several requests share.
struct Fragments {
    ids: Value,
    input: Value,
    direction: Value,
    prompt: Value,
    /// The TEI routes' default of `truncate`: the server's --auto-truncate.
    auto: bool,
    vector: Value,
    priority: Value,
    long_inputs: Value,
}

impl Fragments {
    fn new(config: &Config) -> Self {
        let ids = json!({ "type": "array", "items": { "type": "integer", "minimum": 0 } });
        let input = json!({ "oneOf": [
            { "type": "string" },
            { "type": "array", "items": { "type": "string" }, "minItems": 1 },
            ids,
            { "type": "array", "items": ids, "minItems": 1 },
        ]});
        let direction = json!({ "type": "string", "enum": ["right", "left", "Right", "Left"], "default": "right" });
        let prompt = json!({ "type": ["string", "null"], "description": "A prompt template from the --config file; unset uses its default_prompt_name" });
        let auto = config.auto_truncate;
        let vector = json!({ "type": "array", "items": { "type": "number" } });
        let priority = json!({ "type": ["string", "null"], "enum": ["interactive", "batch", null],
            "description": "Queue on the replicas: interactive work runs first, batch work (indexing) is never starved; unset decides by size (--interactive-max-tokens)" });
        let long_inputs = json!({ "type": ["string", "null"], "enum": ["truncate", "pool", "windows", null],
            "description": "Inputs longer than the model's window: truncate (as `truncate` says), pool (overlapping windows, their token-weighted mean, then normalization) or windows (one vector per window); unset: --long-inputs" });
        Self {
            ids,
            input,
            direction,
            prompt,
            auto,
            vector,
            priority,
            long_inputs,
        }
    }
}

fn truncate(default: bool) -> Value {
    json!({ "type": "boolean", "default": default,
    "description": "Cut inputs longer than the model's maximum instead of refusing them" })
}

/// The fields of `/embed`, `/embed_sparse` and `/embed_all`.
fn embed_fields(f: &Fragments, dense: bool) -> Value {
    let mut props = json!({
        "inputs": f.input, "truncate": truncate(f.auto), "truncation_direction": f.direction, "prompt_name": f.prompt,
        "priority": f.priority,
    });
    if dense {
        props["normalize"] = json!({ "type": "boolean", "default": true });
        props["dimensions"] =
            json!({ "type": "integer", "minimum": 1, "description": "Matryoshka truncation" });
        props["long_inputs"] = f.long_inputs.clone();
    }
    json!({ "type": "object", "required": ["inputs"], "properties": props })
}

/// The OpenAI routes: `/v1/embeddings`, `/v1/models`, and errors in OpenAI's shape.
fn openai(f: &Fragments) -> Value {
    let Fragments {
        input,
        direction,
        prompt,
        vector,
        priority,
        ..
    } = f;
    json!({
        "OpenAiEmbeddingRequest": { "type": "object", "required": ["input"], "properties": {
            "input": input, "model": { "type": "string" },
            "encoding_format": { "type": "string", "enum": ["float", "base64", "int8", "uint8", "binary", "ubinary"], "default": "float",
                "description": "int8/uint8/binary/ubinary (an Ivy extension): arrays of integers, as sentence-transformers' quantize_embeddings makes them" },
            "long_inputs": f.long_inputs,
            "dimensions": { "type": "integer", "minimum": 1 }, "user": { "type": "string" },
            "truncate": truncate(true), "truncation_direction": direction, "prompt_name": prompt,
            "priority": priority,
        }},
        "OpenAiEmbeddingResponse": { "type": "object", "required": ["object", "data", "model", "usage"], "properties": {
            "object": { "type": "string", "enum": ["list"] },
            "data": { "type": "array", "items": { "type": "object", "required": ["object", "index", "embedding"], "properties": {
                "object": { "type": "string", "enum": ["embedding"] }, "index": { "type": "integer" },
                "embedding": { "oneOf": [vector, { "type": "string", "description": "base64 of little-endian float32" },
                    { "type": "array", "items": vector, "description": "long_inputs windows: one vector per window" }] },
            }}},
            "model": { "type": "string" },
            "usage": { "type": "object", "required": ["prompt_tokens", "total_tokens"], "properties": {
                "prompt_tokens": { "type": "integer" }, "total_tokens": { "type": "integer" } } },
        }},
        "OpenAiModelList": { "type": "object", "required": ["object", "data"], "properties": {
            "object": { "const": "list" },
            "data": { "type": "array", "items": { "type": "object", "required": ["id", "object", "created", "owned_by"],
                "properties": { "id": { "type": "string" }, "object": { "const": "model" },
                    "created": { "type": "integer" }, "owned_by": { "type": "string" } } } } } },
        "OpenAiError": { "type": "object", "required": ["error"], "properties": { "error": {
            "type": "object", "required": ["message", "type", "param", "code"], "properties": {
                "message": { "type": "string" }, "type": { "type": "string" },
                "param": { "type": ["string", "null"] },
                // Always a string: OpenAI's own where it defines one (`model_not_found`), else Ivy's label.
                "code": { "type": "string" } } } } },
    })
}

/// Cohere's `priority`: Ivy's names, or Cohere's number.
fn cohere_priority(f: &Fragments) -> Value {
    json!({ "oneOf": [f.priority, { "type": "integer", "minimum": 0,
        "description": "Cohere's form: 0 (served first) is interactive, 1 and above batch" }] })
}

/// `/v1/rerank` in the Cohere/Jina shape.
fn cohere(f: &Fragments) -> Value {
    let priority = cohere_priority(f);
    json!({
        "CohereRerankRequest": { "type": "object", "required": ["query", "documents"], "properties": {
            "model": { "type": "string" }, "query": { "type": "string" },
            "documents": { "type": "array", "minItems": 1, "items": { "oneOf": [
                { "type": "string" },
                { "type": "object", "required": ["text"], "properties": { "text": { "type": "string" } } } ] } },
            "top_n": { "type": "integer", "minimum": 1 }, "return_documents": { "type": "boolean" },
            "priority": priority, "truncate": { "type": "boolean" }, "truncation_direction": { "type": "string", "enum": ["right", "left", "Right", "Left"] } } },
        "CohereRerankResponse": { "type": "object", "required": ["id", "model", "results", "usage"], "properties": {
            "id": { "type": "string" }, "model": { "type": "string" },
            "results": { "type": "array", "items": { "type": "object", "required": ["index", "relevance_score"], "properties": {
                "index": { "type": "integer" }, "relevance_score": { "type": "number" },
                "document": { "type": "object", "required": ["text"], "properties": { "text": { "type": "string" } } } } } },
            "usage": { "type": "object", "required": ["total_tokens"], "properties": { "total_tokens": { "type": "integer" } } } } },
    })
}

/// `/v2/embed` in Cohere's v2 shape, its error shape, and the ranges of
/// quantized vectors.
fn cohere_v2(f: &Fragments) -> Value {
    let Fragments { vector, .. } = f;
    let types =
        json!({ "type": "string", "enum": ["float", "int8", "uint8", "binary", "ubinary"] });
    let ints =
        json!({ "type": "array", "items": { "type": "array", "items": { "type": "integer" } } });
    json!({
        "CohereEmbedRequest": { "type": "object", "required": ["texts"], "properties": {
            "model": { "type": "string" },
            "texts": { "type": "array", "minItems": 1, "items": { "type": "string" } },
            "input_type": { "type": "string", "enum": ["search_document", "search_query", "classification", "clustering"],
                "description": "Picks the prompt of that name, or query / document (passage) for the search types, when the model or templates file has one" },
            "embedding_types": { "type": "array", "items": types, "default": ["float"] },
            "output_dimension": { "type": "integer", "minimum": 1, "description": "Matryoshka truncation, before normalization and quantization" },
            "truncate": { "type": "string", "enum": ["NONE", "START", "END"], "default": "END" },
            "prompt_name": f.prompt, "long_inputs": f.long_inputs, "priority": cohere_priority(f) } },
        "CohereEmbedResponse": { "type": "object", "required": ["id", "embeddings", "texts", "meta"], "properties": {
            "id": { "type": "string" },
            "embeddings": { "type": "object", "properties": {
                "float": { "type": "array", "items": vector }, "int8": ints, "uint8": ints, "binary": ints, "ubinary": ints } },
            "texts": { "type": "array", "items": { "type": "string" } },
            "meta": { "type": "object", "properties": {
                "api_version": { "type": "object", "properties": { "version": { "type": "string" } } },
                "billed_units": { "type": "object", "properties": { "input_tokens": { "type": "integer" } } } } },
            "response_type": { "type": "string", "enum": ["embeddings_by_type"] } } },
        "CohereError": { "type": "object", "required": ["id", "message"], "properties": {
            "id": { "type": "string" }, "message": { "type": "string" } } },
        "QuantizationRanges": { "type": "object", "required": ["model", "dimensions", "normalize", "source", "texts", "ranges"], "properties": {
            "model": { "type": "string" }, "dimensions": { "type": "integer" }, "normalize": { "type": "boolean" },
            "source": { "type": "string" }, "texts": { "type": "integer" },
            "ranges": { "type": "array", "minItems": 2, "maxItems": 2, "items": vector,
                "description": "[minimums, maximums] per dimension" } } },
    })
}

/// TEI's embedding routes and its error shape.
fn tei_embed(f: &Fragments) -> Value {
    let Fragments { vector, .. } = f;
    json!({
        "EmbedRequest": embed_fields(f, true),
        "EmbedSparseRequest": embed_fields(f, false),
        "EmbedAllRequest": embed_fields(f, false),
        "EmbedResponse": { "oneOf": [
            { "type": "array", "items": vector },
            { "type": "array", "items": { "type": "array", "items": vector }, "description": "long_inputs windows: vectors per input" } ] },
        "RootRequest": { "oneOf": [schema("EmbedRequest"), schema("EmbedSparseRequest"), schema("PredictRequest"),
            schema("RerankRequest"), schema("SimilarityRequest")] },
        "RootResponse": { "oneOf": [schema("EmbedResponse"), schema("EmbedSparseResponse"), schema("PredictResponse"),
            schema("RerankResponse"), schema("SimilarityResponse")] },
        "EmbedSparseResponse": { "type": "array", "items": { "type": "array", "items": {
            "type": "object", "required": ["index", "value"],
            "properties": { "index": { "type": "integer" }, "value": { "type": "number" } } } } },
        "EmbedAllResponse": { "type": "array", "items": { "type": "array", "items": vector } },
        "TeiError": { "type": "object", "required": ["error", "error_type"], "properties": {
            "error": { "type": "string" },
            "error_type": { "type": "string", "enum": ["Validation", "Empty", "Unauthorized", "Overloaded", "Unhealthy", "Backend", "Tokenizer"] } } },
    })
}

/// TEI's scoring routes: `/rerank`, `/predict`, `/similarity`.
fn tei_scores(f: &Fragments) -> Value {
    let Fragments {
        direction,
        auto,
        priority,
        ..
    } = f;
    json!({
        "RerankRequest": { "type": "object", "required": ["query", "texts"], "properties": {
            "query": { "type": "string" }, "texts": { "type": "array", "items": { "type": "string" }, "minItems": 1 },
            "truncate": truncate(*auto), "truncation_direction": direction,
            "raw_scores": { "type": "boolean", "default": false }, "return_text": { "type": "boolean", "default": false },
            "priority": priority } },
        "RerankResponse": { "type": "array", "items": { "type": "object", "required": ["index", "score"], "properties": {
            "index": { "type": "integer" }, "score": { "type": "number" }, "text": { "type": "string" } } } },
        "PredictRequest": { "type": "object", "required": ["inputs"], "properties": {
            "inputs": { "oneOf": [
                { "type": "string" },
                { "type": "array", "minItems": 2, "maxItems": 2, "items": { "type": "string" } },
                { "type": "array", "minItems": 1, "items": { "oneOf": [
                    { "type": "string" },
                    { "type": "array", "minItems": 2, "maxItems": 2, "items": { "type": "string" } } ] } } ] },
            "raw_scores": { "type": "boolean", "default": false }, "truncate": truncate(*auto),
            "truncation_direction": direction, "priority": priority,
            "parameters": { "type": "object", "description": "The Hub's text-classification parameters (an Ivy extension); given, the answer is one list per input",
                "properties": { "top_k": { "type": "integer", "minimum": 1 },
                    "function_to_apply": { "type": "string", "enum": ["softmax", "sigmoid", "none"] } } } } },
        "PredictResponse": { "oneOf": [
            { "type": "array", "items": schema("Prediction") },
            { "type": "array", "items": { "type": "array", "items": schema("Prediction") } } ] },
        "Prediction": { "type": "object", "required": ["score", "label"], "properties": {
            "score": { "type": "number" }, "label": { "type": "string" } } },
        "SimilarityRequest": { "type": "object", "required": ["inputs"], "properties": {
            "inputs": { "type": "object", "required": ["source_sentence", "sentences"], "properties": {
                "source_sentence": { "type": "string" },
                "sentences": { "type": "array", "minItems": 1, "items": { "type": "string" } } } },
            "truncate": truncate(*auto), "truncation_direction": { "type": "string", "enum": ["right", "left", "Right", "Left"] },
            "prompt_name": { "type": "string" }, "parameters": { "type": "object" }, "priority": priority,
            "long_inputs": f.long_inputs } },
        "SimilarityResponse": { "type": "array", "items": { "type": "number" } },
    })
}

/// TEI's `/tokenize` and `/decode`.
fn tei_tokens(f: &Fragments) -> Value {
    let Fragments { ids, prompt, .. } = f;
    json!({
        "TokenizeRequest": { "type": "object", "required": ["inputs"], "properties": {
            "inputs": { "oneOf": [{ "type": "string" }, { "type": "array", "items": { "type": "string" }, "minItems": 1 }] },
            "add_special_tokens": { "type": "boolean", "default": true }, "prompt_name": prompt } },
        "TokenizeResponse": { "type": "array", "items": { "type": "array", "items": {
            "type": "object", "required": ["id", "text", "special", "start", "stop"], "properties": {
                "id": { "type": "integer" }, "text": { "type": "string" }, "special": { "type": "boolean" },
                "start": { "type": ["integer", "null"] }, "stop": { "type": ["integer", "null"] } } } } },
        "DecodeRequest": { "type": "object", "required": ["ids"], "properties": {
            "ids": { "oneOf": [ids, { "type": "array", "items": ids, "minItems": 1 }] },
            "skip_special_tokens": { "type": "boolean", "default": true } } },
        "DecodeResponse": { "type": "array", "items": { "type": "string" } },
    })
}

/// `/ready` and `/info`.
fn ops(_: &Fragments) -> Value {
    json!({
        "Ready": { "type": "object", "required": ["ready", "draining", "healthy_replicas", "replicas"], "properties": {
            "ready": { "type": "boolean" }, "draining": { "type": "boolean" },
            "healthy_replicas": { "type": "integer" }, "replicas": { "type": "integer" } } },
        "Info": { "type": "object", "required": ["model_id", "model_sha", "model_dtype", "served_model_name", "model_type",
                                                  "max_concurrent_requests", "max_input_length", "max_batch_tokens",
                                                  "max_batch_requests", "max_client_batch_size", "auto_truncate",
                                                  "tokenization_workers", "version", "sha", "docker_label",
                                                  "dimension", "kinds"], "properties": {
            "model_id": { "type": "string" }, "model_sha": { "type": ["string", "null"] },
            "model_dtype": { "type": "string" }, "served_model_name": { "type": "string" },
            "model_type": { "type": "object" }, "dimension": { "type": "integer" },
            "max_input_length": { "type": "integer" }, "max_client_batch_size": { "type": "integer" },
            "max_batch_tokens": { "type": "integer" }, "max_batch_requests": { "type": ["integer", "null"] },
            "auto_truncate": { "type": "boolean", "description": "The default of `truncate` on the TEI routes (--auto-truncate)" },
            "tokenization_workers": { "type": "integer" },
            "sha": { "type": ["string", "null"] }, "docker_label": { "type": ["string", "null"] },
            "max_tokens_per_request": { "type": "integer" }, "max_concurrent_requests": { "type": "integer" },
            "kinds": { "type": "array", "items": { "type": "string", "enum": ["dense", "sparse", "multi_vector", "score"] } },
            "prompts": { "type": "array", "items": { "type": "string" } },
            "default_prompt_name": { "type": ["string", "null"] }, "version": { "type": "string" },
            "models": { "type": "array", "items": { "type": "string" }, "description": "Every name a model is served under here" } } },
    })
}
