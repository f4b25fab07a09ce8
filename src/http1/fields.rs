//! A request's fields as they came: the head's bytes and where each field line's name
//! and value lie in them, in the client's order. No `HeaderName` or `HeaderValue` is
//! made and nothing is hashed until a reader needs the map ([`Fields::to_map`]).
//!
//! The head-as-bytes step for requests (docs/performance.md, thirteenth part): on a
//! route where nothing but routing, compression and the proxy reads a field, a request
//! from an HTTP/1 client reaches its backend without a map ever being built; the
//! readers ask [`Fields::get`] (or what the parser noted: `Host`, `Accept-Encoding`)
//! and the proxy writes the lines from [`Fields::iter`].
//!
//! One allocation, as the map's two were: the places of a usual request's fields lie
//! in the same box as the head's handle, and the box is what moves between the
//! request's layers (eight bytes, where a head's handle and a `Vec` were 56).

use bytes::Bytes;
use http::HeaderMap;

use super::names::Fact;

/// Where one field line's name and value lie in the head. A head is at most
/// `MAX_HEAD` (64 KiB) long and ends with an empty line, so every place fits 16 bits.
#[derive(Debug, Clone, Copy, Default)]
struct Line {
    name: u16,
    name_end: u16,
    value: u16,
    value_end: u16,
}

// Every place in a head fits a `Line`'s 16 bits.
const _: () = assert!(super::MAX_HEAD <= 1 << 16);

/// Fields whose places lie in the box; more spill into a `Vec` (a browser sends about
/// a dozen).
const INLINE: usize = 16;

/// A request's fields as received (see the module's documentation). Only a head whose
/// fields pass on as they came has them: one that repeats or lists its
/// `Content-Length`, or whose target carries its own host, gets its map at once.
#[derive(Debug)]
pub(crate) struct Fields(Box<Inner>);

#[derive(Debug)]
struct Inner {
    head: Bytes,
    len: usize,
    inline: [Line; INLINE],
    spill: Vec<Line>,
    /// The first `Host`'s and `Accept-Encoding`'s places among the lines.
    host: Option<u16>,
    accept_encoding: Option<u16>,
    authorization: bool,
    has_length: bool,
}

impl Fields {
    pub(super) fn new(head: Bytes) -> Fields {
        debug_assert!(head.len() <= super::MAX_HEAD);
        Fields(Box::new(Inner {
            head,
            len: 0,
            inline: [Line::default(); INLINE],
            spill: Vec::new(),
            host: None,
            accept_encoding: None,
            authorization: false,
            has_length: false,
        }))
    }

    /// Notes a field line; `name` and `value` are slices of the head.
    #[inline]
    pub(super) fn push(&mut self, name: &[u8], value: &[u8], fact: Fact) {
        let f = &mut *self.0;
        let base = f.head.as_ptr() as usize;
        let at = |s: &[u8]| (s.as_ptr() as usize - base) as u16;
        let (name_at, value_at) = (at(name), at(value));
        let line = Line {
            name: name_at,
            name_end: name_at + name.len() as u16,
            value: value_at,
            value_end: value_at + value.len() as u16,
        };
        let i = f.len as u16;
        match fact {
            Fact::Host if f.host.is_none() => f.host = Some(i),
            Fact::AcceptEncoding if f.accept_encoding.is_none() => f.accept_encoding = Some(i),
            Fact::Authorization => f.authorization = true,
            Fact::ContentLength => f.has_length = true,
            _ => {}
        }
        match f.inline.get_mut(f.len) {
            Some(slot) => *slot = line,
            None => f.spill.push(line),
        }
        f.len += 1;
    }

    fn lines(&self) -> impl Iterator<Item = &Line> {
        let f = &*self.0;
        f.inline[..f.len.min(INLINE)].iter().chain(&f.spill)
    }

    fn line(&self, l: &Line) -> (&[u8], &[u8]) {
        let head = &self.0.head;
        (
            &head[usize::from(l.name)..usize::from(l.name_end)],
            &head[usize::from(l.value)..usize::from(l.value_end)],
        )
    }

    fn nth(&self, i: u16) -> (&[u8], &[u8]) {
        let i = usize::from(i);
        let f = &*self.0;
        self.line(match f.inline.get(i) {
            Some(l) => l,
            None => &f.spill[i - INLINE],
        })
    }

    /// Every field as `(name, value)`, names as the client spelled them, in its order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.lines().map(|l| self.line(l))
    }

    /// The first value of the field named `lower` (lower case).
    pub(crate) fn get(&self, lower: &[u8]) -> Option<&[u8]> {
        self.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(lower))
            .map(|(_, v)| v)
    }

    /// The first value of the field named `lower` (lower case), shared with the head.
    pub(crate) fn value(&self, lower: &[u8]) -> Option<http::HeaderValue> {
        let v = self.get(lower)?;
        Some(super::head::parsed_value(&self.0.head, v))
    }

    /// The first value of each field named in `lower` (lower case), in one pass.
    pub(crate) fn firsts<const N: usize>(
        &self,
        lower: [&[u8]; N],
    ) -> [Option<http::HeaderValue>; N] {
        let mut out = [const { None }; N];
        for (name, value) in self.iter() {
            let Some(i) = lower.iter().position(|l| name.eq_ignore_ascii_case(l)) else {
                continue;
            };
            if out[i].is_none() {
                out[i] = Some(super::head::parsed_value(&self.0.head, value));
            }
        }
        out
    }

    /// `Host`'s value, found as the head was parsed.
    #[inline]
    pub(crate) fn host(&self) -> Option<&[u8]> {
        self.0.host.map(|i| self.nth(i).1)
    }

    /// The first `Accept-Encoding`, shared with the head, and whether an
    /// `Authorization` came: what compression asks of a request.
    pub(crate) fn accept_encoding(&self) -> (Option<http::HeaderValue>, bool) {
        let f = &*self.0;
        let accept = f.accept_encoding.map(|i| self.nth(i).1);
        let accept = accept.map(|v| super::head::parsed_value(&f.head, v));
        (accept, f.authorization)
    }

    /// A `Content-Length` is among them.
    pub(crate) fn has_length(&self) -> bool {
        self.0.has_length
    }

    /// Makes `headers` the request's map, when its fields were kept as they came
    /// (taking them): a reader of the map comes next.
    pub(crate) fn into_map(fields: &mut Option<Fields>, headers: &mut HeaderMap) {
        if let Some(f) = fields.take() {
            debug_assert!(headers.is_empty(), "a kept request's map is empty");
            *headers = f.to_map();
        }
    }

    /// The map the parser would have built: every field, in order, its value shared
    /// with the head.
    pub(crate) fn to_map(&self) -> HeaderMap {
        // Room for the forwarding fields a proxy adds, so they do not regrow the map.
        let mut map = HeaderMap::with_capacity(self.0.len + 4);
        for (name, value) in self.iter() {
            super::head::append(&mut map, &self.0.head, name, value);
        }
        map
    }
}

impl super::encode::Source for Fields {
    const LOWER: bool = false;
    fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.iter()
    }
}
