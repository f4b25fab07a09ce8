//! The live generation: the compiled config every request reads, swapped atomically.
//!
//! A request loads the current generation once (an `Arc` clone, no lock) and keeps it
//! to the end, so a swap never changes the rules under a request in flight.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use ipnet::IpNet;

use crate::body::Body;
use crate::config::Config;
use crate::route::Sites;

pub struct Generation {
    pub sites: Sites,
    pub trust: Vec<IpNet>,
}

impl Generation {
    /// Compiles a loaded config. Must run inside the tokio runtime (pools start tasks).
    pub fn compile(config: &Config) -> Generation {
        Generation {
            sites: Sites::compile(&config.sites),
            trust: config.global.trust.clone(),
        }
    }

    pub fn is_trusted(&self, client: SocketAddr) -> bool {
        if self.trust.is_empty() {
            return false;
        }
        let ip = client.ip().to_canonical();
        self.trust.iter().any(|n| n.contains(&ip))
    }
}

pub struct Live {
    current: ArcSwap<Generation>,
}

pub type ResponseFuture = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;

impl Live {
    pub fn new(g: Generation) -> Arc<Live> {
        Arc::new(Live {
            current: ArcSwap::from_pointee(g),
        })
    }

    /// Serves one request on the current generation. Boxed so a connection's task
    /// stays small while it waits idle.
    pub fn handle(&self, req: Request<Body>, client: crate::server::ClientAddr) -> ResponseFuture {
        let gen = self.current.load_full();
        Box::pin(async move { crate::filter::run(&gen, req, &client).await })
    }
}

/// A short plain-text answer sluice makes itself.
pub fn local_response(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(Body::full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
