//! sluice: a reverse proxy and application gateway.
//!
//! The modules follow the life of a request: `server` accepts and speaks HTTP,
//! `route` finds the site and route, `filter` runs the route's filters, `proxy` and
//! `upstream` hand the request to a backend, and the response flows back the same way.
//! `config` turns the file into a model; `runtime` compiles it into the live generation.

#![forbid(unsafe_code)]

pub mod body;
pub mod config;
pub mod demo;
pub mod filter;
pub mod proxy;
pub mod route;
pub mod runtime;
pub mod server;
pub mod stats;
pub mod upstream;
