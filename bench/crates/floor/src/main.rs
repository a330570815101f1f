//! `grpc-floor serve ADDR` answers `tulip.v1.Tulip/Embed` with a fixed
//! 384-float row and does nothing else; `grpc-floor client ADDR` times
//! sequential unary calls carrying a 128-token request against it and prints
//! JSON. ADDR is `http://host:port` or `unix:///path`. Both sides use tonic
//! and tokio as Ivy and Tulip do, so the pair is the floor of the Ivy → Tulip
//! hop: what no serving work is added to. ADDR `frames:///path` does the same
//! with Tulip frames (`proto::frames`) over a Unix socket, the floor of a
//! co-located Ivy's hop.

use std::time::Instant;

use bytes::Bytes;
use proto::frames;
use proto::tulip::v1::tulip_client::TulipClient;
use proto::tulip::v1::tulip_server::{Tulip, TulipServer};
use proto::tulip::v1::{EmbedRequest, EmbedResponse, InfoRequest, InfoResponse, Timing};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status};

struct Fixed {
    row: Bytes,
    dim: u32,
}

#[tonic::async_trait]
impl Tulip for Fixed {
    async fn embed(&self, r: Request<EmbedRequest>) -> Result<Response<EmbedResponse>, Status> {
        let tokens = r.into_inner().token_ids.len();
        Ok(Response::new(fixed_reply(&self.row, self.dim, tokens)))
    }

    async fn info(&self, _: Request<InfoRequest>) -> Result<Response<InfoResponse>, Status> {
        Ok(Response::new(InfoResponse::default()))
    }

    async fn load_adapter(
        &self,
        _: Request<proto::tulip::v1::LoadAdapterRequest>,
    ) -> Result<Response<proto::tulip::v1::Adapter>, Status> {
        Err(Status::unimplemented("no adapters here"))
    }

    async fn unload_adapter(
        &self,
        _: Request<proto::tulip::v1::UnloadAdapterRequest>,
    ) -> Result<Response<proto::tulip::v1::UnloadAdapterResponse>, Status> {
        Err(Status::unimplemented("no adapters here"))
    }
}

fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.windows(2)
        .find(|w| w[0] == name)
        .map_or(default, |w| w[1].parse().expect("a number"))
}

fn runtime(threads: usize) -> tokio::runtime::Runtime {
    if threads == 1 {
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
    }
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if threads > 0 {
        b.worker_threads(threads);
    }
    b.enable_all().build().expect("tokio runtime")
}

fn fixed_reply(row: &Bytes, dim: u32, tokens: usize) -> EmbedResponse {
    EmbedResponse {
        kind: 1,
        dtype: 1,
        rows: 1,
        dim,
        data: row.clone(),
        tokens: tokens as u64,
        timing: Some(Timing::default()),
        ..Default::default()
    }
}

/// Answers each frames call on its connection in turn.
async fn serve_frames(path: &str, dim: u32) -> Result<(), Box<dyn std::error::Error>> {
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    let row = Bytes::from(vec![0u8; dim as usize * 4]);
    loop {
        let (stream, _) = listener.accept().await?;
        let row = row.clone();
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut read = tokio::io::BufReader::new(read);
            let mut preface = [0u8; 8];
            if read.read_exact(&mut preface).await.is_err() || preface != frames::PREFACE {
                return;
            }
            let (mut buf, mut out) = (Vec::new(), Vec::new());
            while let Ok(frames::Frame::Body) =
                frames::read_frame(&mut read, &mut buf, 1 << 30).await
            {
                let Ok(frames::Call::Embed { tag, request, .. }) = frames::decode_call(&buf) else {
                    return;
                };
                out.clear();
                frames::encode_reply(
                    tag,
                    Ok(&fixed_reply(&row, dim, request.token_ids.len())),
                    &mut out,
                );
                if write.write_all(&out).await.is_err() {
                    return;
                }
            }
        });
    }
}

async fn serve(addr: String, dim: u32) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(path) = addr.strip_prefix("frames://") {
        return serve_frames(path, dim).await;
    }
    let svc = TulipServer::new(Fixed {
        row: Bytes::from(vec![0u8; dim as usize * 4]),
        dim,
    });
    let server = Server::builder().tcp_nodelay(true).add_service(svc);
    if let Some(path) = addr.strip_prefix("unix://") {
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path)?;
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        server.serve_with_incoming(incoming).await?;
    } else {
        let addr = addr.trim_start_matches("http://").parse()?;
        server.serve(addr).await?;
    }
    Ok(())
}

async fn client(
    addr: String,
    rounds: usize,
    warmup: usize,
    tokens: usize,
    gap_us: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    // Token ids of WordPiece size (two to three varint bytes each).
    let request = EmbedRequest {
        token_ids: (0..tokens as u32).map(|i| 2000 + i * 97 % 28000).collect(),
        lengths: vec![tokens as u32],
        kind: 1,
        request_id: "0123456789abcdef0123456789abcdef".into(),
        ..Default::default()
    };
    let mut call = Caller::connect(addr).await?;
    for _ in 0..warmup {
        call.embed(&request).await?;
    }
    let mut micros = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        if gap_us > 0 {
            // Idle between calls, as a served request's hop is: both sides
            // sleep and run other work in between, so caches are cold.
            std::thread::sleep(std::time::Duration::from_micros(gap_us));
        }
        let start = Instant::now();
        call.embed(&request).await?;
        micros.push(start.elapsed().as_secs_f64() * 1e6);
    }
    println!(
        "{}",
        serde_json::json!({ "rounds": rounds, "tokens": tokens, "latency_us": micros })
    );
    Ok(())
}

/// One transport's client side: a tonic channel, or a frames connection.
enum Caller {
    Grpc(TulipClient<tonic::transport::Channel>),
    Frames {
        read: tokio::io::BufReader<tokio::net::unix::OwnedReadHalf>,
        write: tokio::net::unix::OwnedWriteHalf,
        buf: Vec<u8>,
        tag: u64,
    },
}

impl Caller {
    async fn connect(addr: String) -> Result<Self, Box<dyn std::error::Error>> {
        if let Some(path) = addr.strip_prefix("frames://") {
            let mut stream = tokio::net::UnixStream::connect(path).await?;
            stream.write_all(&frames::PREFACE).await?;
            let (read, write) = stream.into_split();
            return Ok(Self::Frames {
                read: tokio::io::BufReader::new(read),
                write,
                buf: Vec::new(),
                tag: 0,
            });
        }
        let channel = Endpoint::from_shared(addr)?
            .tcp_nodelay(true)
            .connect()
            .await?;
        Ok(Self::Grpc(TulipClient::new(channel)))
    }

    async fn embed(&mut self, request: &EmbedRequest) -> Result<(), Box<dyn std::error::Error>> {
        match self {
            Self::Grpc(client) => {
                client.embed(request.clone()).await?;
            }
            Self::Frames {
                read,
                write,
                buf,
                tag,
            } => {
                *tag += 1;
                buf.clear();
                frames::encode_embed(*tag, "", request, buf);
                write.write_all(buf).await?;
                if frames::read_frame(read, buf, 1 << 30).await? != frames::Frame::Body {
                    return Err("the frames server closed".into());
                }
                frames::decode_reply(buf)?.1?;
            }
        }
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: grpc-floor serve ADDR [--dim 384] [--threads N] | client ADDR [--rounds N] [--warmup N] [--tokens 128] [--gap-us 0] [--threads N]";
    let (mode, addr) = match (args.get(1), args.get(2)) {
        (Some(m), Some(a)) => (m.as_str(), a.clone()),
        _ => return Err(usage.into()),
    };
    let rt = runtime(arg(&args, "--threads", 0));
    match mode {
        "serve" => rt.block_on(serve(addr, arg(&args, "--dim", 384) as u32)),
        "client" => rt.block_on(client(
            addr,
            arg(&args, "--rounds", 2000),
            arg(&args, "--warmup", 200),
            arg(&args, "--tokens", 128),
            arg(&args, "--gap-us", 0) as u64,
        )),
        _ => Err(usage.into()),
    }
}
