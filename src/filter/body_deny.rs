//! `body_deny "TEXT"`: a request body that contains TEXT (as sent: bytes, case kept,
//! no `Content-Encoding` undone) gets `403`, counted in `sluice_body_denied_total`.
//!
//! The body is held ([`super::hold`]) up to [`HOLD_CAP`], so a body that size or
//! smaller never reaches the handler when it is refused; a longer one streams on
//! after the cap with the same check, and is cut off (the client still gets `403`)
//! if TEXT comes later. TEXT split across chunks is found: the last `len − 1` bytes of
//! each chunk are kept to look across the border. Results for branches: `allowed`,
//! `denied` (a refusal after the cap is always `403`).

use std::sync::Arc;

use http::{Response, StatusCode};
use memchr::memmem::Finder;

use super::hold::{Hold, Verdict, Watch};
use super::Filter;
use crate::body::Body;
use crate::reply::local_response;
use crate::stats::{bump, COUNTERS};

/// How much of a body is held before the rest streams.
pub(crate) const HOLD_CAP: u64 = 1 << 20;

pub(crate) struct BodyDeny {
    finder: Arc<Finder<'static>>,
}

impl BodyDeny {
    /// `text` is not empty (checked at load).
    pub(crate) fn new(text: &[u8]) -> BodyDeny {
        BodyDeny {
            finder: Arc::new(Finder::new(text).into_owned()),
        }
    }
}

impl Filter for BodyDeny {
    fn hold_body(&self) -> Option<Hold> {
        Some(Hold {
            cap: HOLD_CAP,
            watch: Box::new(Scan {
                finder: self.finder.clone(),
                tail: Vec::new(),
            }),
            refuse,
        })
    }
}

fn refuse() -> Response<Body> {
    bump(&COUNTERS.body_denied);
    local_response(
        StatusCode::FORBIDDEN,
        "Forbidden: the request body is not allowed\n",
    )
}

/// One body's search: the text, and the end of what came so far.
struct Scan {
    finder: Arc<Finder<'static>>,
    /// The last `len − 1` bytes seen (fewer at the start).
    tail: Vec<u8>,
}

impl Watch for Scan {
    fn chunk(&mut self, data: &[u8]) -> Verdict {
        let keep = self.finder.needle().len() - 1;
        if !self.tail.is_empty() {
            // A match that starts in the tail ends in the first `keep` bytes.
            let start = self.tail.len();
            self.tail.extend_from_slice(&data[..keep.min(data.len())]);
            if self.finder.find(&self.tail).is_some() {
                return Verdict::Refuse;
            }
            self.tail.truncate(start);
        }
        if self.finder.find(data).is_some() {
            return Verdict::Refuse;
        }
        if data.len() >= keep {
            self.tail.clear();
            self.tail.extend_from_slice(&data[data.len() - keep..]);
        } else {
            self.tail.extend_from_slice(data);
            let over = self.tail.len().saturating_sub(keep);
            self.tail.drain(..over);
        }
        Verdict::Hold
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn refused(text: &[u8], chunks: &[&[u8]]) -> bool {
        let f = BodyDeny::new(text);
        let mut w = f.hold_body().unwrap().watch;
        chunks.iter().any(|c| w.chunk(c) == Verdict::Refuse)
    }

    #[test]
    fn text_is_found_in_a_chunk_and_across_borders() {
        assert!(refused(b"evil", &[b"an evil body"]));
        assert!(refused(b"evil", &[b"an ev", b"il body"]));
        assert!(refused(b"evil", &[b"e", b"v", b"i", b"l"]));
        assert!(refused(b"evil", &[b"xxe", b"", b"vi", b"lxx"]));
        assert!(!refused(b"evil", &[b"an ev", b"xil body"]));
        assert!(!refused(b"evil", &[b"EVIL"]));
        assert!(refused(b"x", &[b"a", b"x"]));
    }

    proptest! {
        /// However a body is cut into chunks, the text is found exactly when the
        /// whole body holds it.
        #[test]
        fn any_split_finds_what_the_whole_holds(
            body in proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b')], 0..64),
            text in proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b')], 1..5),
            cuts in proptest::collection::vec(0usize..64, 0..8),
        ) {
            let whole = memchr::memmem::find(&body, &text).is_some();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(body.len())).collect();
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut at = 0;
            for c in cuts.into_iter().chain([body.len()]) {
                chunks.push(&body[at..c]);
                at = c;
            }
            prop_assert_eq!(refused(&text, &chunks), whole);
        }
    }
}
