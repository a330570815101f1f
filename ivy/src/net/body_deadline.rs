//! A whole-body deadline on HTTP request bodies (`--body-timeout`): a client
//! that has sent its headers must send the whole body within the timeout,
//! else reading the body fails with `BodyTimedOut` (answered 408).

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

type BoxError = Box<dyn Error + Send + Sync>;

/// The body did not arrive within its deadline.
#[derive(Debug)]
pub struct BodyTimedOut(Duration);

impl fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the request body was not received within {} s",
            self.0.as_secs_f64()
        )
    }
}

impl Error for BodyTimedOut {}

/// The `BodyTimedOut` behind an error from reading a body, if that is
/// what it was (body errors come wrapped by axum's extractors).
pub fn find<'a>(error: &'a (dyn Error + 'static)) -> Option<&'a BodyTimedOut> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(found) = e.downcast_ref() {
            return Some(found);
        }
        next = e.source();
    }
    None
}

/// A body that fails once its deadline passes. The timer is created only
/// if the body is not all there at once, so the common case costs nothing.
pub struct TimedBody<B> {
    inner: B,
    deadline: Instant,
    timeout: Duration,
    timer: Option<Pin<Box<Sleep>>>,
}

impl<B> TimedBody<B> {
    /// `timeout` counts from now (the request's headers have just arrived).
    pub fn new(inner: B, timeout: Duration) -> Self {
        Self {
            inner,
            deadline: Instant::now() + timeout,
            timeout,
            timer: None,
        }
    }
}

impl<B> Body for TimedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|r| r.map_err(Into::into))),
            Poll::Pending => {
                let deadline = this.deadline;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut(this.timeout))))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::FromRequest;

    /// A body that sends one chunk, then nothing ever again.
    struct Stalled(bool);

    impl Body for Stalled {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            if std::mem::replace(&mut self.0, true) {
                Poll::Pending
            } else {
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"{\"in")))))
            }
        }
    }

    fn request<B>(body: B) -> axum::extract::Request
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        axum::http::Request::new(axum::body::Body::new(body))
    }

    #[tokio::test]
    async fn a_stalled_body_fails_with_a_recognisable_error() {
        let body = TimedBody::new(Stalled(false), Duration::from_millis(50));
        let err = Bytes::from_request(request(body), &()).await.unwrap_err();
        let found = find(&err).expect("the timeout behind axum's rejection");
        assert!(found.to_string().contains("0.05 s"), "{found}");
    }

    #[tokio::test]
    async fn a_complete_body_passes_untouched() {
        let body = TimedBody::new(
            http_body_util_full(b"{\"input\":\"x\"}"),
            Duration::from_millis(50),
        );
        let bytes = Bytes::from_request(request(body), &()).await.unwrap();
        assert_eq!(&bytes[..], b"{\"input\":\"x\"}");
    }

    #[test]
    fn other_errors_are_not_timeouts() {
        let e = std::io::Error::other("reset");
        assert!(find(&e).is_none());
    }

    fn http_body_util_full(bytes: &'static [u8]) -> axum::body::Body {
        axum::body::Body::from(bytes)
    }
}
