//! The one HTTP/1.1 codec sluice speaks, in both roles: the server side reads requests
//! from clients and writes responses; the client side writes requests to backends and
//! reads their responses. One head scanner, one parser with one set of framing rules
//! (DESIGN.md §14), one header writer, one set of limits.
//!
//! Knows nothing of sockets, routes or pools: it turns bytes into heads and body pieces
//! and back. Never buffers a body; never re-scans bytes it has already looked at.

pub(crate) mod decode;
pub(crate) mod encode;
pub(crate) mod fields;
pub(crate) mod head;
pub(crate) mod names;
pub(crate) use names::keep_trailers;
pub(crate) mod scan;

/// The largest request head accepted from a client: more is 431.
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// The most header fields accepted from a client, Host included: more is 431.
pub(crate) const MAX_HEADERS: usize = 100;
/// The largest response head accepted from a backend: more is a 502.
pub(crate) const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// The most header fields accepted in a backend's response head.
pub(crate) const MAX_RESPONSE_HEADERS: usize = 128;
/// How much a socket read asks for at once.
pub(crate) const READ_CHUNK: usize = 16 * 1024;
/// Bodies up to this size leave in the same write as their head.
pub(crate) const COALESCE: usize = 16 * 1024;
