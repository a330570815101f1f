//! `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`, as
//! vLLM has them (`lora_name`, `lora_path`; a plain-text "Success: …"
//! answer), behind the API key. `model` (ours) names the base model when
//! several are served (default: the default model). A loaded adapter is
//! then a model name of its own for every route (`upstream/adapters.rs`).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use super::body::{json_object, Body};
use super::fields;
use super::respond::{finish, Api};
use crate::error::ApiError;
use crate::state::AppState;
use crate::upstream::adapters;

/// The longest adapter name: it becomes a model name and a metric label.
const MAX_NAME: usize = 128;

pub async fn load(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let obj = json_object(&state, &headers, body, "lora_name")?;
        let name = name(fields::string(&obj, "lora_name")?)?;
        let path = fields::string(&obj, "lora_path")?;
        let (pool, _) = state.pool(fields::opt_string(&obj, "model")?.as_deref())?;
        if state.pools.find(&name).is_some() {
            return Err(ApiError::validation(
                "lora_name",
                format!("`{name}` is the name of a served model; choose another"),
            ));
        }
        if let Some(other) = state.pools.adapter_pool(&name) {
            if other.name != pool.name {
                return Err(ApiError::validation(
                    "lora_name",
                    format!(
                        "an adapter `{name}` is loaded over `{}` already",
                        other.name
                    ),
                ));
            }
        }
        let replicas: Vec<_> = pool
            .replicas()
            .into_iter()
            .filter(|r| r.is_routable())
            .collect();
        if replicas.is_empty() {
            return Err(pool.no_replica());
        }
        adapters::load(&pool.adapters, replicas, &name, &path).await?;
        Ok(format!("Success: LoRA adapter '{name}' added successfully.").into_response())
    }
    .await;
    finish(&state, Api::OpenAi, "load_lora_adapter", result)
}

pub async fn unload(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let obj = json_object(&state, &headers, body, "lora_name")?;
        let name = fields::string(&obj, "lora_name")?;
        let pool = state.pools.adapter_pool(&name).ok_or_else(|| {
            ApiError::ModelNotFound(format!("no LoRA adapter `{name}` is loaded here"))
        })?;
        adapters::unload(&pool.adapters, pool.replicas(), &name).await?;
        Ok(format!("Success: LoRA adapter '{name}' removed successfully.").into_response())
    }
    .await;
    finish(&state, Api::OpenAi, "unload_lora_adapter", result)
}

fn name(name: String) -> Result<String, ApiError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:".contains(c));
    if !ok {
        return Err(ApiError::validation(
            "lora_name",
            format!("`lora_name` must be 1 to {MAX_NAME} characters of letters, digits and -_./:"),
        ));
    }
    Ok(name)
}
