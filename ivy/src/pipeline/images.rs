//! Requests holding images (`Inputs::Items`): each image decoded and
//! prepared as the model's preprocessor_config.json says (`ivy-imageprep`)
//! on a bounded pool, the pixels cut into chunks on the token budget (an
//! image counts the model's `image_tokens`), sent to the replicas like text
//! chunks, and the rows joined with the request's text rows in input order.
//! Texts go through the ordinary stages.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures_util::stream::{self, StreamExt, TryStreamExt};
use ivy_imageprep::{ImageProcessor, Limits, PrepError};
use proto::tulip::v1::{self as tulip, EmbedRequest};

use super::chunk::Chunk;
use super::output::Output;
use super::{dispatch, Inputs, Item, Job, Kind, Priority};
use crate::config::LongInputs;
use crate::error::ApiError;
use crate::metrics::Stage;
use crate::request::id::RequestId;
use crate::state::AppState;

type Boxed<'a, T> = Pin<Box<dyn Future<Output = Result<T, ApiError>> + Send + 'a>>;

/// The texts of a mixed request through the ordinary stages (boxed: those
/// stages are what called this module).
pub type TextStages = for<'a> fn(&'a AppState, Job) -> Boxed<'a, Output>;

pub async fn run(
    state: &AppState,
    mut job: Job,
    model: &tulip::InfoResponse,
    texts_through: TextStages,
) -> Result<Output, ApiError> {
    let Inputs::Items(items) = std::mem::replace(&mut job.inputs, Inputs::Texts(Vec::new())) else {
        return Err(ApiError::Internal("the image stage got no items".into()));
    };
    let processor = match job.pool.model.image_processor() {
        Ok(Some(p)) => p,
        Ok(None) => {
            return Err(ApiError::Unsupported(format!(
                "model {} takes text only; send images to an image model (CLIP, SigLIP)",
                model.model_id
            )))
        }
        Err(why) => return Err(ApiError::Unsupported(why)),
    };
    if job.kind != Kind::Dense {
        return Err(ApiError::Unsupported(
            "images have dense embeddings only".into(),
        ));
    }
    if job.options.late_chunking {
        return Err(ApiError::validation(
            "late_chunking",
            "`late_chunking` pools the chunks of one text; it takes no images",
        ));
    }
    let is_image: Vec<bool> = items.iter().map(|i| !matches!(i, Item::Text(_))).collect();
    let (mut texts, mut images) = (Vec::new(), Vec::new());
    for item in items {
        match item {
            Item::Text(t) => texts.push(t),
            image => images.push(image),
        }
    }
    let text_out = if texts.is_empty() {
        None
    } else {
        let mut options = job.options.clone();
        // One vector per input whatever it is: long texts are truncated.
        options.long_inputs = LongInputs::Truncate;
        let text_job = Job {
            pool: Arc::clone(&job.pool),
            kind: Kind::Dense,
            inputs: Inputs::Texts(texts),
            options,
            field: job.field,
        };
        Some(texts_through(state, text_job).await?)
    };
    let started = Instant::now();
    let limits = Limits {
        max_encoded_bytes: state.config.images.max_image_bytes,
        max_pixels: state.config.images.max_image_pixels,
    };
    let pixels = prepare_all(state, &processor, images, limits, &is_image, job.field).await?;
    let prepared = started.elapsed();
    state.metrics.stage(Stage::Tokenize, prepared);
    let mut image_out = embed(state, &job, model, pixels).await?;
    // Decoding and preparing images is their tokenization.
    image_out.timing.tokenize = prepared;
    Ok(match text_out {
        None => image_out,
        Some(text_out) => Output::interleave(text_out, image_out, &is_image),
    })
}

/// Every image fetched (a URL) and prepared, at most the pool's size
/// prepared at once, in order; the first failure names its input
/// (`input[3]`) and fails the request.
async fn prepare_all(
    state: &AppState,
    processor: &Arc<ImageProcessor>,
    images: Vec<Item>,
    limits: Limits,
    is_image: &[bool],
    field: &'static str,
) -> Result<Vec<Vec<f32>>, ApiError> {
    let positions: Vec<usize> = (0..is_image.len()).filter(|&i| is_image[i]).collect();
    let work = images.into_iter().zip(positions).map(|(image, at)| {
        let (pool, processor) = (Arc::clone(&state.image_prep), Arc::clone(processor));
        async move {
            let bytes = match image {
                Item::ImageUrl(url) => {
                    let name = format!("{field}[{at}]");
                    super::image_fetch::fetch(&state.config.images, &url, field, &name).await?
                }
                Item::Image(bytes) => bytes,
                Item::Text(_) => return Err(ApiError::Internal("a text among the images".into())),
            };
            let permit = pool
                .acquire_owned()
                .await
                .map_err(|_| ApiError::Unavailable("Ivy is shutting down".into()))?;
            let prepared = tokio::task::spawn_blocking(move || {
                let _permit = permit;
                processor.prepare(&bytes, &limits)
            })
            .await
            .map_err(|e| ApiError::Internal(format!("image preparation failed: {e}")))?;
            prepared
                .map(|p| p.data)
                .map_err(|e| prep_error(e, field, at))
        }
    });
    // All started at once; the semaphore bounds how many run.
    futures_util::future::try_join_all(work).await
}

/// One classification of a bad image, by what the caller did wrong.
fn prep_error(e: PrepError, field: &'static str, at: usize) -> ApiError {
    let message = format!("{field}[{at}]: {e}");
    match e {
        PrepError::EncodedTooLarge { .. } | PrepError::TooManyPixels { .. } => {
            ApiError::ImageTooLarge(message)
        }
        PrepError::Unsupported(_) => ApiError::UnsupportedMediaType(format!(
            "{message}; images may be JPEG, PNG, WebP or GIF"
        )),
        PrepError::Empty(_) | PrepError::Corrupt(_) => ApiError::validation(field, message),
        PrepError::Config(_) => ApiError::Internal(message),
    }
}

/// Prepared images through the replicas: chunks of at most the chunk
/// token budget (never less than one image) and the replica's sequence cap.
async fn embed(
    state: &AppState,
    job: &Job,
    model: &tulip::InfoResponse,
    pixels: Vec<Vec<f32>>,
) -> Result<Output, ApiError> {
    let per_image = model.image_tokens as usize;
    let tokens = pixels.len() * per_image;
    super::validate::tokens(tokens, state.config.max_tokens_per_request, job.field)?;
    let per_chunk = match state.config.chunk_tokens {
        0 => usize::MAX,
        n => n / per_image.max(1),
    }
    .min(model.max_request_sequences.max(1) as usize)
    .max(1);
    let priority = Priority::of(
        job.options.priority,
        tokens,
        state.config.interactive_max_tokens,
    );
    let request_id = RequestId::current()
        .map(|r| r.to_string())
        .unwrap_or_default();
    let mut chunks = Vec::new();
    let mut sends = Vec::new();
    for (i, group) in pixels.chunks(per_chunk).enumerate() {
        let start = i * per_chunk;
        chunks.push(Chunk {
            sequences: start..start + group.len(),
            tokens: start * per_image..(start + group.len()) * per_image,
        });
        let mut data = Vec::with_capacity(group.iter().map(|p| p.len() * 4).sum());
        for image in group {
            for v in image {
                data.extend_from_slice(&v.to_le_bytes());
            }
        }
        let request = EmbedRequest {
            kind: Kind::Dense as i32,
            normalize: job.options.normalize,
            dimensions: job.options.dimensions.unwrap_or(0),
            request_id: request_id.clone(),
            priority: priority.proto() as i32,
            pixels: Bytes::from(data),
            images: group.len() as u32,
            ..EmbedRequest::default()
        };
        sends.push(dispatch::send(state, &job.pool, request, priority));
    }
    let window = match state.config.chunks_per_replica {
        0 => sends.len(),
        n => n * job.pool.routable_count().max(1),
    };
    let sent = Instant::now();
    let replies = stream::iter(sends)
        .buffered(window.max(1))
        .try_collect()
        .await?;
    state.metrics.stage(Stage::Dispatch, sent.elapsed());
    let out = Output::merge(Kind::Dense, &chunks, replies)?;
    state.metrics.stage(Stage::Queue, out.timing.queue);
    state.metrics.stage(Stage::Inference, out.timing.inference);
    state.metrics.class(priority.name(), sent.elapsed());
    state.metrics.tokens(out.tokens);
    Ok(out)
}
