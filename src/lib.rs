//! sluice: a reverse proxy and application gateway.
//!
//! The modules follow the life of a request: `server` accepts and speaks HTTP (with
//! the `http1` codec), `pipeline` finds the site and route (`route`), runs the route's
//! filters (`filter`) and hands the request to its handler: `proxy`, which reaches a
//! backend through `upstream`; the response flows back the same way. `config` turns
//! the file into a model; `runtime` compiles it into the live generation. Imports
//! point one way, down that list; `body`, `reply` and `stats` are leaves everyone uses.

#![forbid(unsafe_code)]

pub mod admin;
pub mod body;
pub mod config;
pub mod demo;
pub mod filter;
pub mod http1;
pub mod pipeline;
pub mod proxy;
pub mod reply;
pub mod route;
pub mod runtime;
pub mod server;
pub mod stats;
pub mod upstream;
