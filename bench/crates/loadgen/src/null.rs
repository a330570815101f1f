//! Null servers for the floor: they answer at once with an empty message,
//! so a round trip to them is the client's own cost plus loopback.

use std::net::SocketAddr;

use proto::tulip::v1::tulip_server::{Tulip, TulipServer};
use proto::tulip::v1::{EmbedRequest, EmbedResponse, InfoRequest, InfoResponse};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

struct Null;

#[tonic::async_trait]
impl Tulip for Null {
    async fn embed(&self, _: Request<EmbedRequest>) -> Result<Response<EmbedResponse>, Status> {
        Ok(Response::new(EmbedResponse::default()))
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

/// A null tulip.v1 server on a free loopback port.
pub fn grpc() -> Result<SocketAddr, String> {
    let incoming = TcpIncoming::bind("127.0.0.1:0".parse().unwrap())
        .map_err(|e| e.to_string())?
        .with_nodelay(Some(true));
    let addr = incoming.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TulipServer::new(Null))
            .serve_with_incoming(incoming),
    );
    Ok(addr)
}

/// A null HTTP/1.1 server: reads one request head and its body, answers
/// `200 {}`, keeps the connection.
pub async fn http() -> Result<SocketAddr, String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let _ = sock.set_nodelay(true);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1 << 16];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buf.len() < end + 4 + length {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..end + 4 + length);
                    let reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
                    if sock.write_all(reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(addr)
}
