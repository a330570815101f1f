//! Deadlines and write progress of `ConnIo` over real sockets.

use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// Real time (tokio's paused clock needs its test-util feature, which
// would rebuild every dependency for the tests): short timeouts, and
// assertions on what happens, plus "not before the deadline".
const T: Timeouts = Timeouts {
    header: Duration::from_millis(200),
    idle: Duration::from_millis(600),
    write: Duration::from_millis(300),
};

fn conn(watch: Watch) -> (ConnIo<tokio::io::DuplexStream>, tokio::io::DuplexStream) {
    let (server, client) = tokio::io::duplex(64);
    (ConnIo::new(server, T, watch, None), client)
}

async fn read_until_error(io: &mut ConnIo<tokio::io::DuplexStream>) -> io::Error {
    let mut b = [0; 8];
    loop {
        if let Err(e) = io.read(&mut b).await {
            return e;
        }
    }
}

#[tokio::test]
async fn a_silent_new_connection_times_out_on_its_head() {
    let (mut io, _client) = conn(Watch::Requests(Arc::default()));
    let started = Instant::now();
    assert_eq!(
        read_until_error(&mut io).await.kind(),
        io::ErrorKind::TimedOut
    );
    assert!(started.elapsed() >= T.header);
}

#[tokio::test]
async fn no_read_deadline_while_a_request_is_handled_then_the_idle_one() {
    let activity = Arc::<Activity>::default();
    let (mut io, mut client) = conn(Watch::Requests(Arc::clone(&activity)));
    client.write_all(b"GET").await.unwrap();
    assert_eq!(io.read(&mut [0; 8]).await.unwrap(), 3);
    // The head is in; the request is handled for longer than any timeout.
    let busy = activity.enter();
    let read = tokio::spawn(async move {
        let r = io.read(&mut [0; 8]).await;
        (io, r)
    });
    tokio::time::sleep(T.idle * 2).await;
    assert!(!read.is_finished());
    client.write_all(b"x").await.unwrap();
    let (mut io, r) = read.await.unwrap();
    assert_eq!(r.unwrap(), 1);
    drop(busy);
    // Between requests: the idle timeout, longer than the header one.
    let started = Instant::now();
    let err = read_until_error(&mut io).await;
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    assert!(err.to_string().contains("idle"), "{err}");
    assert!(started.elapsed() >= T.idle);
}

#[tokio::test]
async fn a_request_handled_between_two_reads_restarts_the_clock_and_wakes_the_reader() {
    let activity = Arc::<Activity>::default();
    let (mut io, _client) = conn(Watch::Requests(Arc::clone(&activity)));
    let busy = activity.enter();
    let read = tokio::spawn(async move {
        let started = Instant::now();
        let err = read_until_error(&mut io).await;
        (err, started.elapsed())
    });
    // Longer than the header timeout: the old head deadline must not
    // cut the connection once the request ends.
    tokio::time::sleep(T.header * 2).await;
    drop(busy);
    let (err, elapsed) = read.await.unwrap();
    assert!(err.to_string().contains("idle"), "{err}");
    assert!(elapsed >= T.header * 2 + T.idle);
}

#[tokio::test]
async fn a_trickled_head_is_cut_at_the_header_timeout() {
    let (mut io, mut client) = conn(Watch::Requests(Arc::default()));
    let trickle = tokio::spawn(async move {
        while client.write_all(b"G").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let err = read_until_error(&mut io).await;
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    assert!(err.to_string().contains("header"), "{err}");
    drop(io);
    trickle.await.unwrap();
}

#[tokio::test]
async fn after_the_preface_no_read_deadline_runs() {
    let (mut io, mut client) = conn(Watch::Preface(4));
    client.write_all(b"PRI ").await.unwrap();
    assert_eq!(io.read(&mut [0; 8]).await.unwrap(), 4);
    let read = tokio::spawn(async move { io.read(&mut [0; 8]).await.map(|_| ()) });
    tokio::time::sleep(T.idle * 2).await;
    assert!(!read.is_finished());
    read.abort();
}

#[tokio::test]
async fn a_response_nobody_reads_fails_after_the_write_timeout() {
    let (mut io, _client) = conn(Watch::Requests(Arc::default()));
    let started = Instant::now();
    let err = io.write_all(&[0; 1024]).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    assert!(started.elapsed() >= T.write);
}

#[tokio::test]
async fn a_slow_but_steady_reader_is_not_cut() {
    let (mut io, mut client) = conn(Watch::Requests(Arc::default()));
    let reader = tokio::spawn(async move {
        let mut b = [0; 64];
        let mut total = 0;
        while total < 1024 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            total += client.read(&mut b).await.unwrap();
        }
    });
    // 16 short stalls: far past the write timeout in all.
    io.write_all(&[0; 1024]).await.unwrap();
    reader.await.unwrap();
}
