//! A request's fields as they came: the head's bytes and where each field line's name
//! and value lie in them, in the client's order. No `HeaderName` or `HeaderValue` is
//! made and nothing is hashed until a reader needs the map ([`Fields::to_map`]).
//!
//! The head-as-bytes step for requests (docs/performance.md, thirteenth part): on a
//! route where nothing but routing, compression and the proxy reads a field, a request
//! from an HTTP/1 client reaches its backend without a map ever being built; the
//! readers ask [`Fields::get`] and the proxy writes the lines from [`Fields::iter`].

use bytes::Bytes;
use http::HeaderMap;

use super::names;

/// Where one field line's name and value lie in the head.
#[derive(Debug, Clone, Copy)]
struct Line {
    name: u32,
    name_end: u32,
    value: u32,
    value_end: u32,
}

/// A request's fields as received (see the module's documentation). Only a head whose
/// fields pass on as they came has them: one that repeats or lists its
/// `Content-Length`, or whose target carries its own host, gets its map at once.
#[derive(Debug)]
pub(crate) struct Fields {
    head: Bytes,
    lines: Vec<Line>,
    /// The first `Host` line's place in `lines` (a head has at most one).
    host: Option<u16>,
    /// A `Content-Length` is among them.
    pub has_length: bool,
}

impl Fields {
    pub(super) fn new(head: Bytes, room: usize) -> Fields {
        Fields {
            head,
            lines: Vec::with_capacity(room),
            host: None,
            has_length: false,
        }
    }

    /// Notes a field line; `name` and `value` are slices of the head.
    #[inline]
    pub(super) fn push(&mut self, name: &[u8], value: &[u8], fact: names::Fact) {
        let base = self.head.as_ptr() as usize;
        let at = |s: &[u8]| (s.as_ptr() as usize - base) as u32;
        let (name_at, value_at) = (at(name), at(value));
        match fact {
            names::Fact::Host if self.host.is_none() => self.host = Some(self.lines.len() as u16),
            names::Fact::ContentLength => self.has_length = true,
            _ => {}
        }
        self.lines.push(Line {
            name: name_at,
            name_end: name_at + name.len() as u32,
            value: value_at,
            value_end: value_at + value.len() as u32,
        });
    }

    fn line(&self, l: &Line) -> (&[u8], &[u8]) {
        (
            &self.head[l.name as usize..l.name_end as usize],
            &self.head[l.value as usize..l.value_end as usize],
        )
    }

    /// Every field as `(name, value)`, names as the client spelled them, in its order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + Clone + '_ {
        self.lines.iter().map(|l| self.line(l))
    }

    /// The first value of the field named `lower` (lower case).
    pub(crate) fn get(&self, lower: &[u8]) -> Option<&[u8]> {
        self.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(lower))
            .map(|(_, v)| v)
    }

    /// The first value of the field named `lower`, shared with the head.
    pub(crate) fn value(&self, lower: &[u8]) -> Option<http::HeaderValue> {
        self.get(lower)
            .map(|v| super::head::parsed_value(&self.head, v))
    }

    /// `Host`'s value, found as the head was parsed.
    #[inline]
    pub(crate) fn host(&self) -> Option<&[u8]> {
        self.host.map(|i| self.line(&self.lines[usize::from(i)]).1)
    }

    /// The map the parser would have built: every field, in order, its value shared
    /// with the head.
    pub(crate) fn to_map(&self) -> HeaderMap {
        // Room for the forwarding fields a proxy adds, so they do not regrow the map.
        let mut map = HeaderMap::with_capacity(self.lines.len() + 4);
        for (name, value) in self.iter() {
            // Every token is a name (`names::tests::every_token_is_a_header_name`), and
            // httparse passed only tokens.
            if let Ok(name) = names::from_token(name) {
                map.append(name, super::head::parsed_value(&self.head, value));
            }
        }
        map
    }
}
