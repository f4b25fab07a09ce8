//! sluice: a reverse proxy and application gateway.
//!
//! The modules follow the life of a request: `server` accepts and speaks HTTP (with
//! the `http1` codec), `pipeline` finds the site and route (`route`), runs the route's
//! filters (`filter`) and hands the request to its handler: `proxy`, which reaches a
//! backend through `upstream`; the response flows back the same way. `config` turns
//! the file into a model; `runtime` compiles it into the live generation. Imports
//! point one way, down that list; `body`, `clock`, `net`, `reply`, `stats` and
//! `throttle` are leaves everyone uses.

// One measured exception, documented where it is: a field value httparse checked is
// not scanned a second time (`http1::head::parsed_value`).
#![deny(unsafe_code)]
#![warn(unreachable_pub)]

// The public face, what the `sluice` binary uses: loading and checking a config
// (`config`), serving it (`lifecycle`), the demo, the logger, and the resolver that
// `check --strict` asks. Everything else is the crate's own.
pub mod config;
pub mod demo;
pub use crate::admin::log::init as init_logging;
pub use crate::safety::{parse_ip, Dns, BUDGET as DNS_BUDGET};
pub use crate::server::{handover, lifecycle};

pub(crate) mod access;
pub(crate) mod acme;
pub(crate) mod admin;
pub(crate) mod body;
pub(crate) mod cache;
pub(crate) mod clock;
pub(crate) mod fastcgi;
pub(crate) mod files;
pub(crate) mod filter;
pub mod fleet;
pub(crate) mod grpc;
pub(crate) mod http1;
pub(crate) mod inplace;
pub(crate) mod interim;
pub mod jose;
pub(crate) mod l4;
pub(crate) mod net;
pub(crate) mod otel;
pub(crate) mod pipeline;
pub(crate) mod proxy;
pub(crate) mod reply;
pub(crate) mod route;
pub(crate) mod runtime;
pub(crate) mod safety;
pub(crate) mod server;
pub(crate) mod stats;
pub(crate) mod throttle;
pub(crate) mod tunnel;
pub(crate) mod upstream;

#[doc(hidden)]
pub mod fuzzing;
