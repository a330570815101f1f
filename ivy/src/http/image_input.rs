//! Images in JSON bodies: a data URI (`data:image/png;base64,...`) or bare
//! base64, decoded to the encoded image's bytes here, or an http(s) URL,
//! which the pipeline fetches only from listed hosts
//! (`pipeline/image_fetch.rs`); preparing them is the pipeline's
//! (`pipeline/images.rs`).

use base64::Engine as _;
use bytes::Bytes;
use serde_json::Value;

type Object = serde_json::Map<String, Value>;
use crate::error::ApiError;
use crate::pipeline::{Inputs, Item};

/// The image `value` at `at` (e.g. `input[2].image`): its encoded bytes,
/// or the URL to fetch it from.
pub fn image(value: &Value, field: &'static str, at: &str) -> Result<Item, ApiError> {
    let Value::String(s) = value else {
        return Err(ApiError::schema(
            field,
            format!("{at} must be a string: a data URI (data:image/png;base64,...) or base64"),
        ));
    };
    let s = s.trim();
    if s.starts_with("http://") || s.starts_with("https://") {
        return Ok(Item::ImageUrl(s.to_string()));
    }
    let payload = match s.strip_prefix("data:") {
        Some(rest) => {
            let (header, data) = rest.split_once(',').ok_or_else(|| {
                ApiError::schema(
                    field,
                    format!("{at} is a data URI without a comma before its data"),
                )
            })?;
            let media = header.split(';').next().unwrap_or_default();
            if !media.is_empty() && !media.starts_with("image/") {
                return Err(ApiError::UnsupportedMediaType(format!(
                    "{at} is a data URI of type {media:?}; images are image/jpeg, image/png, image/webp or image/gif"
                )));
            }
            if !header.ends_with(";base64") {
                return Err(ApiError::schema(
                    field,
                    format!("{at} is a data URI without ;base64: only base64 data URIs are read"),
                ));
            }
            data
        }
        None => s,
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(payload.as_bytes())
        .map_err(|e| ApiError::schema(field, format!("{at} is not valid base64 ({e})")))?;
    if bytes.is_empty() {
        return Err(ApiError::validation(
            field,
            format!("{at} is an empty image"),
        ));
    }
    Ok(Item::Image(Bytes::from(bytes)))
}

/// Jina's mixed inputs on `/v1/embeddings` (our extension there): an array
/// of strings, `{"text": ...}` and `{"image": ...}` objects. `Texts` when
/// no input is an image.
pub fn items(values: &[Value], field: &'static str) -> Result<Inputs, ApiError> {
    let mut items = Vec::with_capacity(values.len());
    for (i, v) in values.iter().enumerate() {
        items.push(match v {
            Value::String(s) => Item::Text(s.clone()),
            Value::Object(o) => item(o, field, i)?,
            _ => {
                return Err(ApiError::schema(
                    field,
                    format!(
                        "{field}[{i}] must be a string, {{\"text\": ...}} or {{\"image\": ...}}"
                    ),
                ))
            }
        });
    }
    if items.iter().any(|i| !matches!(i, Item::Text(_))) {
        return Ok(Inputs::Items(items));
    }
    Ok(Inputs::Texts(
        items
            .into_iter()
            .map(|i| match i {
                Item::Text(t) => t,
                _ => String::new(),
            })
            .collect(),
    ))
}

fn item(o: &Object, field: &'static str, i: usize) -> Result<Item, ApiError> {
    match (o.get("text"), o.get("image"), o.len()) {
        (Some(Value::String(t)), None, 1) => Ok(Item::Text(t.clone())),
        (None, Some(v), 1) => image(v, field, &format!("{field}[{i}].image")),
        _ => Err(ApiError::schema(
            field,
            format!("{field}[{i}] must be {{\"text\": \"...\"}} or {{\"image\": \"<data URI or base64>\"}}, one key"),
        )),
    }
}
