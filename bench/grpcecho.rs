//! A gRPC unary echo backend for `bench/bench.py`'s `grpc-unary` scenario: HTTP/2 in
//! the clear (hyper), every request's body sent back as the answer's message with
//! `grpc-status: 0` in its trailers, as a gRPC server answers a unary call. What a
//! proxy costs between a client and a fast gRPC server is what is measured; this
//! server is the same for every proxy.
//!
//!     grpcecho 127.0.0.1:PORT

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};

type Frames = std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>;

async fn echo(
    req: Request<Incoming>,
) -> Result<Response<StreamBody<futures_util::stream::Iter<Frames>>>, Infallible> {
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let frames = vec![Ok(Frame::data(body)), Ok(Frame::trailers(trailers))];
    let mut resp = Response::new(StreamBody::new(futures_util::stream::iter(frames)));
    resp.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/grpc"),
    );
    Ok(resp)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let addr = std::env::args().nth(1).expect("usage: grpcecho ADDR");
    let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        tokio::spawn(async move {
            let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .max_concurrent_streams(256)
                .serve_connection(
                    hyper_util::rt::TokioIo::new(tcp),
                    hyper::service::service_fn(echo),
                )
                .await;
        });
    }
}
