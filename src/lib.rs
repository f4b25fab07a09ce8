//! sluice: a reverse proxy and application gateway.
//!
//! The modules follow the life of a request: `server` accepts and speaks HTTP (with
//! the `http1` codec), `pipeline` finds the site and route (`route`), runs the route's
//! filters (`filter`) and hands the request to its handler: `proxy`, which reaches a
//! backend through `upstream`; the response flows back the same way. `config` turns
//! the file into a model; `runtime` compiles it into the live generation. Imports
//! point one way, down that list; `body`, `reply`, `stats` and `throttle` are leaves everyone uses.

#![forbid(unsafe_code)]

pub mod admin;
pub(crate) mod body;
pub mod config;
pub mod demo;
pub(crate) mod fastcgi;
pub(crate) mod files;
pub(crate) mod filter;
pub(crate) mod http1;
pub(crate) mod pipeline;
pub(crate) mod proxy;
pub(crate) mod reply;
pub(crate) mod route;
pub(crate) mod runtime;
pub mod safety;
pub mod server;
pub(crate) mod stats;
pub(crate) mod throttle;
pub(crate) mod tunnel;
pub(crate) mod upstream;

/// Entry points for `cargo fuzz` (`fuzz/`, see docs/fuzzing.md): the parsers that read
/// what a peer sends. Not an API.
#[doc(hidden)]
pub mod fuzzing {
    use bytes::BytesMut;

    use crate::fastcgi::codec::{Decoder, Record};
    use crate::fastcgi::head;

    /// The FastCGI record decoder over `data` (its first byte picks the read size), then
    /// the head parser over the STDOUT it produced.
    pub fn fastcgi_response(data: &[u8]) {
        let Some((&step, rest)) = data.split_first() else {
            return;
        };
        let step = usize::from(step % 64) + 1;
        let mut decoder = Decoder::default();
        let mut buf = BytesMut::new();
        let mut stdout = Vec::new();
        'feed: for piece in rest.chunks(step) {
            buf.extend_from_slice(piece);
            loop {
                match decoder.decode(&mut buf) {
                    Ok(Some(Record::Stdout(b))) => {
                        assert!(b.len() <= crate::fastcgi::codec::MAX_CONTENT);
                        stdout.extend_from_slice(&b);
                    }
                    Ok(Some(Record::Stderr(b))) => {
                        assert!(b.len() <= crate::fastcgi::codec::MAX_CONTENT)
                    }
                    Ok(Some(Record::End { .. })) => {}
                    Ok(None) => break,
                    Err(_) => break 'feed,
                }
            }
            // Never more than a record header's worth, plus what one read added.
            assert!(buf.len() < 8 + step);
        }
        if let Ok(Some((h, used))) = head::parse(&stdout) {
            assert!(used <= stdout.len());
            assert!(h.headers.get(http::header::CONNECTION).is_none());
        }
        let _ = head::parse(rest);
    }
}
