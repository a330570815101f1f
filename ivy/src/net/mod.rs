//! Sockets only: the accept loop with its cap on connections, each
//! connection's header, idle and write deadlines, TLS, the request body's
//! deadline, and Ivy's HTTP/1 serving loop. Nothing here knows a route.

pub mod body_deadline;
pub mod conn_io;
pub mod http_server;
pub mod listener;
pub mod tls;
