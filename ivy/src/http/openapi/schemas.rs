//! The schemas `/openapi.json` names, one API family at a time, and the
//! field fragments several of them share.

use serde_json::{json, Value};

use super::schema;
use crate::config::Config;

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
pub(super) fn schemas(config: &Config) -> Value {
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
    late_chunking: Value,
}

impl Fragments {
    fn new(config: &Config) -> Self {
        let ids = json!({ "type": "array", "items": { "type": "integer", "minimum": 0 } });
        let image = json!({ "type": "string",
            "description": "A data URI or base64 (JPEG, PNG, WebP, GIF), or an http(s) URL from a host in --image-url-hosts" });
        let item = json!({ "oneOf": [
            { "type": "string" },
            { "type": "object", "required": ["text"], "properties": { "text": { "type": "string" } }, "additionalProperties": false },
            { "type": "object", "required": ["image"], "properties": { "image": image }, "additionalProperties": false },
        ]});
        // anyOf: an array of strings is also an array of items.
        let input = json!({ "anyOf": [
            { "type": "string" },
            { "type": "array", "items": { "type": "string" }, "minItems": 1 },
            ids,
            { "type": "array", "items": ids, "minItems": 1 },
            { "type": "array", "items": item, "minItems": 1,
              "description": "Image models (CLIP, SigLIP): texts and images mixed, one vector each in input order (Jina's shape)" },
        ]});
        let direction = json!({ "type": "string", "enum": ["right", "left", "Right", "Left"], "default": "right" });
        let prompt = json!({ "type": ["string", "null"], "description": "A prompt template from the --config file; unset uses its default_prompt_name" });
        let auto = config.auto_truncate;
        let vector = json!({ "type": "array", "items": { "type": "number" } });
        let priority = json!({ "type": ["string", "null"], "enum": ["interactive", "batch", null],
            "description": "Queue on the replicas: interactive work runs first, batch work (indexing) is never starved; unset decides by size (--interactive-max-tokens)" });
        let long_inputs = json!({ "type": ["string", "null"], "enum": ["truncate", "pool", "windows", null],
            "description": "Inputs longer than the model's window: truncate (as `truncate` says), pool (overlapping windows, their token-weighted mean, then normalization) or windows (one vector per window); unset: --long-inputs" });
        let late_chunking = json!({ "type": "boolean", "default": false,
            "description": "The inputs are the chunks of one document, in order: one vector per chunk, each pooled over its tokens from one pass over the whole document (late chunking, as Jina's API has it; long documents go in overlapping windows). Not with long_inputs" });
        Self {
            late_chunking,
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
        props["late_chunking"] = f.late_chunking.clone();
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
        "LoadLoraAdapterRequest": { "type": "object", "required": ["lora_name", "lora_path"], "properties": {
            "lora_name": { "type": "string", "description": "The model name it is served under" },
            "lora_path": { "type": "string", "description": "A PEFT adapter directory every replica of the model can read" },
            "model": { "type": "string", "description": "The base model (default: the default model)" } } },
        "UnloadLoraAdapterRequest": { "type": "object", "required": ["lora_name"], "properties": {
            "lora_name": { "type": "string" } } },
        "OpenAiEmbeddingRequest": { "type": "object", "required": ["input"], "properties": {
            "input": input, "model": { "type": "string" },
            "encoding_format": { "type": "string", "enum": ["float", "base64", "int8", "uint8", "binary", "ubinary"], "default": "float",
                "description": "int8/uint8/binary/ubinary (an Ivy extension): arrays of integers, as sentence-transformers' quantize_embeddings makes them" },
            "long_inputs": f.long_inputs, "late_chunking": f.late_chunking,
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
        "CohereEmbedRequest": { "type": "object", "description": "One of texts, images and inputs", "properties": {
            "model": { "type": "string" },
            "texts": { "type": "array", "minItems": 1, "items": { "type": "string" } },
            "images": { "type": "array", "minItems": 1, "items": { "type": "string" },
                "description": "Image models: data URIs (or URLs from --image-url-hosts), one vector each" },
            "inputs": { "type": "array", "minItems": 1, "items": { "type": "object", "required": ["content"], "properties": {
                "content": { "type": "array", "minItems": 1, "maxItems": 1, "items": { "type": "object", "required": ["type"], "properties": {
                    "type": { "type": "string", "enum": ["text", "image_url"] }, "text": { "type": "string" },
                    "image_url": { "type": "object", "required": ["url"], "properties": { "url": { "type": "string" } } } } } } } },
                "description": "One content item per input (an image model embeds text and images apart)" },
            "input_type": { "type": "string", "enum": ["search_document", "search_query", "classification", "clustering", "image"],
                "description": "Picks the prompt of that name, or query / document (passage) for the search types, when the model or templates file has one" },
            "embedding_types": { "type": "array", "items": types, "default": ["float"] },
            "output_dimension": { "type": "integer", "minimum": 1, "description": "Matryoshka truncation, before normalization and quantization" },
            "truncate": { "type": "string", "enum": ["NONE", "START", "END"], "default": "END" },
            "prompt_name": f.prompt, "long_inputs": f.long_inputs, "late_chunking": f.late_chunking, "priority": cohere_priority(f) } },
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
            "models": { "type": "array", "items": { "type": "string" }, "description": "Every name a model is served under here" },
            "images": { "type": ["object", "null"], "description": "An image model's input size and the tokens one image counts; null for a text-only model",
                "properties": { "height": { "type": "integer" }, "width": { "type": "integer" }, "tokens": { "type": "integer" } } },
            "cpu_runtimes": { "type": "object", "description": "The replicas' CPU runtimes (fast path `onnx`, `onnx_int8`, `bf16`): token buckets by state, summed over the routable replicas asked when /info is",
                "additionalProperties": { "type": "object", "required": ["cold", "pending", "ready", "failed"], "properties": {
                    "cold": { "type": "integer" }, "pending": { "type": "integer" }, "ready": { "type": "integer" },
                    "failed": { "type": "integer" } } } } } },
    })
}
