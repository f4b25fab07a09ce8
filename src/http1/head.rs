//! Heads, both roles: parsed and checked so that no message can be smuggled.
//!
//! httparse does the tokenising; the rules it leaves open are enforced here. Requests
//! from clients, on the raw bytes before anything is dispatched: bare LF line endings
//! (refused by the scanner), obs-fold, white space in or before a field name's colon,
//! both Content-Length and Transfer-Encoding, differing Content-Length values (400), and
//! any transfer coding other than one final `chunked` (501). A request head that fails
//! here never reaches a route, let alone a backend. Responses from backends: the same
//! strict Content-Length parser (a bad or differing value is an invalid response), and a
//! Content-Length beside Transfer-Encoding is dropped and the connection not reused
//! (RFC 9112 §6.3), so a client never sees a length that disagrees with the body.

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, StatusCode, Uri, Version};

use super::decode::Decoder;
use super::fields::Fields;
use super::names::{self, Fact, Kind};
use super::{MAX_HEAD, MAX_HEADERS, MAX_RESPONSE_HEADERS};

/// How a request body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    None,
    Length(u64),
    Chunked,
}

#[derive(Debug)]
pub(crate) struct RequestHead {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    /// Empty when the fields are kept as they came (`fields`).
    pub headers: HeaderMap,
    pub fields: Option<Fields>,
    pub framing: Framing,
    pub keep_alive: bool,
    pub expect_continue: bool,
    /// The client takes trailer fields (`TE: trailers`).
    pub trailers: bool,
    /// `Upgrade` with `upgrade` among the `Connection` tokens: the client asks to
    /// switch protocols.
    pub upgrade: bool,
}

/// Why a head was refused, and so which status it gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeadError {
    /// 400, with the reason for the log and the short body.
    Bad(&'static str),
    /// 431.
    TooLarge,
    /// 501.
    Coding,
}

pub(crate) fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Parses a complete request head (as found by [`super::scan::RequestScan`], leading
/// empty lines included).
/// `defer`: a head whose fields pass on as they came keeps them as [`Fields`], with
/// an empty map, for the pipeline to build the map only when a reader needs it.
pub(crate) fn parse_request(head: Bytes, defer: bool) -> Result<RequestHead, HeadError> {
    if head.len() > MAX_HEAD {
        return Err(HeadError::TooLarge);
    }
    // Uninitialised slots: zero-filling 100 of them cost more than parsing a head.
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    match req.parse_with_uninit_headers(&head, &mut slots) {
        Ok(httparse::Status::Complete(_)) => {}
        // httparse refuses every head `check_fields` refuses (a property test holds it
        // to that): the field check runs only to name the reason, not on every head.
        refused => {
            check_fields(&head)?;
            return Err(match refused {
                Err(httparse::Error::TooManyHeaders) => HeadError::TooLarge,
                Err(httparse::Error::Version) => HeadError::Bad("unsupported HTTP version"),
                Ok(_) => HeadError::Bad("incomplete head"),
                Err(_) => HeadError::Bad("malformed request head"),
            });
        }
    }
    let (method, version, uri) = request_line(&req, &head)?;
    // Kept as they came, or (when the connection knows a map will be read) the map at
    // once, without the fields' box.
    let mut fields = defer.then(|| Fields::new(head.clone()));
    let mut headers = match defer {
        true => HeaderMap::new(),
        // Room for the forwarding fields a proxy adds, so they do not regrow the map.
        false => HeaderMap::with_capacity(req.headers.len() + 4),
    };
    let mut facts = RequestFacts::default();
    for h in req.headers.iter() {
        let (name, fact) = (h.name.as_bytes(), names::fact(h.name.as_bytes()));
        if facts.note(fact, h.value)? {
            match fields.as_mut() {
                Some(f) => f.push(name, h.value, fact),
                None => append(&mut headers, &head, name, h.value),
            }
        }
    }
    match facts.hosts {
        1 => {}
        0 if version != Version::HTTP_11 => {}
        0 => return Err(HeadError::Bad("missing Host")),
        _ => return Err(HeadError::Bad("more than one Host")),
    }
    let framing = facts.framing()?;
    if facts.length_rewritten || uri.authority().is_some() {
        if let Some(f) = fields.take() {
            headers = f.to_map();
        }
        amend(&mut headers, &facts, &uri)?;
    }
    let keep_alive = match version {
        Version::HTTP_11 => !facts.conn_close,
        _ => facts.conn_keep_alive && !facts.conn_close,
    };
    let is_11 = version == Version::HTTP_11;
    Ok(RequestHead {
        method,
        uri,
        version,
        headers,
        fields,
        framing,
        keep_alive,
        expect_continue: facts.expect_continue && is_11,
        trailers: facts.te_trailers,
        upgrade: facts.conn_upgrade && facts.upgrade_field && is_11,
    })
}

/// What a request's map holds but its fields as they came do not: one plain
/// `Content-Length` for a repeated or listed one, and an absolute-form target's
/// authority as `Host`.
fn amend(headers: &mut HeaderMap, facts: &RequestFacts<'_>, uri: &Uri) -> Result<(), HeadError> {
    if let (true, Some(n)) = (facts.length_rewritten, facts.content_length) {
        headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(n));
    }
    if let Some(authority) = uri.authority() {
        // Absolute form: the target's authority is the host, for routing and for the
        // backend alike (RFC 9112 §3.2.2), so the two can never disagree.
        if authority.as_str().contains('@') {
            return Err(HeadError::Bad("user information in the request target"));
        }
        let v = HeaderValue::from_str(authority.as_str())
            .map_err(|_| HeadError::Bad("invalid request target"))?;
        headers.insert(header::HOST, v);
    }
    Ok(())
}

/// Appends a field httparse parsed from `head` to `map`, its value shared with the
/// head. Every token is a name (`names::tests::every_token_is_a_header_name`), and
/// httparse passes only tokens.
#[inline]
pub(super) fn append(map: &mut HeaderMap, head: &Bytes, name: &[u8], value: &[u8]) {
    if let Ok(name) = names::from_token(name) {
        map.append(name, parsed_value(head, value));
    }
}

/// A field value of `head` that httparse parsed, shared with the head without a copy
/// and without a second scan.
///
/// The one `unsafe` of the library, for a measured need: `HeaderValue`'s checked
/// constructor scans every byte again for the rule httparse has just applied (a tab,
/// or any byte from a space up except DEL: `http`'s `is_valid` and httparse's value
/// table allow the same bytes, and `parsed_values_pass_the_checked_constructor` holds
/// the two together). Skipping that second scan saved 619 instructions of a keep-alive
/// request's 24,891 (callgrind, docs/performance.md, tenth part); hyper's HTTP/1 parser
/// does the same. Only for values of a head httparse returned complete, with its
/// default configuration (no obsolete line folding, so no CR or LF inside a value).
#[allow(unsafe_code)]
#[inline]
pub(super) fn parsed_value(head: &Bytes, value: &[u8]) -> HeaderValue {
    let shared = head.slice_ref(value);
    // SAFETY: `value` is a field value httparse accepted, which holds only bytes a
    // `HeaderValue` may hold (see above); `http` checks it again in debug builds.
    unsafe { HeaderValue::from_maybe_shared_unchecked(shared) }
}

/// The method, version and target of a parsed request line.
fn request_line(
    req: &httparse::Request<'_, '_>,
    head: &Bytes,
) -> Result<(Method, Version, Uri), HeadError> {
    let method = Method::from_bytes(req.method.unwrap_or("").as_bytes())
        .map_err(|_| HeadError::Bad("invalid method"))?;
    let version = match req.version {
        Some(1) => Version::HTTP_11,
        _ => Version::HTTP_10,
    };
    let path = req.path.unwrap_or("");
    let uri = Uri::from_maybe_shared(head.slice_ref(path.as_bytes()))
        .map_err(|_| HeadError::Bad("invalid request target"))?;
    if method == Method::CONNECT {
        return Err(HeadError::Bad("CONNECT is not served"));
    }
    if uri.path_and_query().is_none() && path != "*" {
        return Err(HeadError::Bad("invalid request target"));
    }
    Ok((method, version, uri))
}

/// What a request's fields say about its framing and its connection, gathered as
/// they are read.
#[derive(Default)]
struct RequestFacts<'h> {
    content_length: Option<u64>,
    te_seen: bool,
    codings: Vec<&'h [u8]>,
    hosts: u32,
    conn_close: bool,
    conn_keep_alive: bool,
    conn_upgrade: bool,
    upgrade_field: bool,
    expect_continue: bool,
    te_trailers: bool,
    /// Content-Length was repeated or listed: one plain field replaces it.
    length_rewritten: bool,
}

impl<'h> RequestFacts<'h> {
    /// Notes one field; `Ok(false)`: it is not passed on as it came (a Content-Length
    /// rewritten once at the end).
    #[inline]
    fn note(&mut self, name: Fact, value: &'h [u8]) -> Result<bool, HeadError> {
        if name == Fact::ContentLength {
            let first = self.content_length.is_none();
            self.content_length =
                Some(length_field(value, self.content_length).map_err(HeadError::Bad)?);
            if !first || !value.iter().all(u8::is_ascii_digit) {
                // Equal repeats (`5`, `5, 5`): the backend gets one plain field.
                self.length_rewritten = true;
                return Ok(false);
            }
        } else if name == Fact::TransferEncoding {
            self.te_seen = true;
            if value.iter().any(|&b| b.is_ascii_control() && b != b'\t') {
                return Err(HeadError::Bad("control character in Transfer-Encoding"));
            }
            self.codings.extend(
                value
                    .split(|&b| b == b',')
                    .map(trim)
                    .filter(|c| !c.is_empty()),
            );
        } else if name == Fact::Host {
            self.hosts += 1;
        } else if name == Fact::Connection {
            for token in value.split(|&b| b == b',').map(trim) {
                self.conn_close |= token.eq_ignore_ascii_case(b"close");
                self.conn_keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
                self.conn_upgrade |= token.eq_ignore_ascii_case(b"upgrade");
            }
        } else if name == Fact::Upgrade {
            self.upgrade_field = true;
        } else if name == Fact::Te {
            self.te_trailers |= asks_trailers(value);
        } else if name == Fact::Expect {
            self.expect_continue = trim(value).eq_ignore_ascii_case(b"100-continue");
        }
        Ok(true)
    }

    /// How the body is framed (RFC 9112 §6.3): chunked as the only coding, else the
    /// one length; both at once, or any other coding, is refused.
    fn framing(&self) -> Result<Framing, HeadError> {
        if !self.te_seen {
            return Ok(match self.content_length {
                Some(0) | None => Framing::None,
                Some(n) => Framing::Length(n),
            });
        }
        if self.content_length.is_some() {
            return Err(HeadError::Bad("both Content-Length and Transfer-Encoding"));
        }
        match self.codings.as_slice() {
            [only] if only.eq_ignore_ascii_case(b"chunked") => Ok(Framing::Chunked),
            _ => Err(HeadError::Coding),
        }
    }
}

/// Field lines must not fold and their names must be tokens right up to the colon.
fn check_fields(head: &[u8]) -> Result<(), HeadError> {
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    // Skip tolerated empty lines, then the request line.
    for l in lines.by_ref() {
        if !l.is_empty() {
            break;
        }
    }
    for line in lines {
        if line.is_empty() {
            break;
        }
        if line[0] == b' ' || line[0] == b'\t' {
            return Err(HeadError::Bad("obsolete line folding"));
        }
        let colon = line
            .iter()
            .position(|&b| b == b':')
            .ok_or(HeadError::Bad("header line without a colon"))?;
        if colon == 0 || !line[..colon].iter().all(|&b| is_tchar(b)) {
            return Err(HeadError::Bad("invalid character in a header name"));
        }
    }
    Ok(())
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !matches!(c, b' ' | b'\t'))
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !matches!(c, b' ' | b'\t'))
        .map_or(start, |e| e + 1);
    &b[start..end]
}

fn parse_length(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 19 || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // At most 19 digits: below `u64::MAX`, so no step overflows.
    Some(b.iter().fold(0, |n, &d| n * 10 + u64::from(d - b'0')))
}

/// A Content-Length field value: digits only, a list of equal values allowed
/// (`5, 5`), anything else (`+5`, `5, 6`) refused. `prev` is the value of an earlier
/// field, which must agree too.
pub(crate) fn length_field(value: &[u8], prev: Option<u64>) -> Result<u64, &'static str> {
    let mut n = prev;
    for part in value.split(|&b| b == b',') {
        let v = parse_length(trim(part)).ok_or("invalid Content-Length")?;
        if n.is_some_and(|prev| prev != v) {
            return Err("differing Content-Length values");
        }
        n = Some(v);
    }
    n.ok_or("invalid Content-Length")
}

/// A backend's response head and how its body is framed on the connection.
pub(crate) struct ResponseHead {
    pub parts: http::response::Parts,
    pub decoder: Decoder,
    /// The connection may carry another request once this body ends.
    pub reusable: bool,
    /// The fields as the client's HTTP/1 connection writes them, when they were asked
    /// for ([`AsSent`]) and nothing but framing needed reading: `parts.headers` is
    /// then empty (the `Content-Length` framing passes on is among the lines).
    pub fields: Option<Box<SentFields>>,
}

/// A request whose answer may pass with its fields as the backend sent them: nothing
/// between the backend and an HTTP/1 client reads or changes them, save the framing
/// and the hop-by-hop fields every answer loses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AsSent {
    /// The route may compress: a type [`compressible`] says yes to is compressible.
    pub compress: bool,
    /// The client takes no coding: a compressible answer only gains `Vary:
    /// Accept-Encoding`, which the lines then carry (a backend's own `Vary` needs the
    /// map to be extended). Else a compressible answer needs the map.
    pub identity_only: bool,
}

/// A response's fields, already written as `name: value` lines (lower-case names,
/// values as parsed): the bytes [`super::encode::head`] would write for them from a
/// map, without building one. The head-as-bytes step of docs/performance.md's
/// eleventh part.
#[derive(Debug)]
pub(crate) struct SentFields {
    pub lines: Vec<u8>,
    /// A `Date` is among them.
    pub has_date: bool,
    /// A `Content-Length` is among them (the last line but `Vary`).
    pub has_length: bool,
    /// The answer varies by `Accept-Encoding`: its last line says so.
    varies: bool,
}

impl SentFields {
    /// Adds the `Content-Length` framing passes on, as the client's connection would
    /// (not on an answer that has no body, unless to a HEAD, which says what a GET
    /// would get), before `Vary` as compression would.
    fn length(&mut self, n: &HeaderValue, status: StatusCode, is_head: bool) {
        let no_body = status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
        if no_body && !is_head {
            return;
        }
        if self.varies {
            self.lines.truncate(self.lines.len() - VARY.len());
        }
        self.lines.extend_from_slice(b"content-length: ");
        self.lines.extend_from_slice(n.as_bytes());
        self.lines.extend_from_slice(b"\r\n");
        if self.varies {
            self.lines.extend_from_slice(VARY);
        }
        self.has_length = true;
    }
}

/// Whether an answer of `Content-Type` `t` is compressible: compressed for a client
/// that takes a coding, and varying by `Accept-Encoding` either way (the `compress`
/// filter's rule, here so that the parser can tell too).
#[inline(always)]
pub(crate) fn compressible(t: &[u8]) -> bool {
    if t.len() >= 5 && t[..5].eq_ignore_ascii_case(b"text/") {
        return true;
    }
    // One pass: only a byte that can begin a word is compared (a byte-by-byte search
    // for each word cost ~600 instructions on `application/octet-stream`).
    let at = |i: usize, word: &[u8]| {
        t.get(i..i + word.len())
            .is_some_and(|w| w.eq_ignore_ascii_case(word))
    };
    (0..t.len()).any(|i| match t[i] | 0x20 {
        b'j' => at(i, b"javascript") || at(i, b"json"),
        b'x' => at(i, b"xml"),
        b's' => at(i, b"svg"),
        _ => false,
    })
}

/// The line compression adds to a compressible answer.
const VARY: &[u8] = b"vary: accept-encoding\r\n";

/// Why a backend's response head was refused (the client gets a 502).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct InvalidResponse(pub &'static str);

/// Parses the complete response head of `len` bytes at the front of `buf`, taking it
/// off. `Ok(None)`: it was an interim (1xx) answer, skipped; look for the next head.
pub(crate) fn parse_response(
    buf: &mut BytesMut,
    len: usize,
    is_head: bool,
    as_sent: Option<AsSent>,
) -> Result<Option<ResponseHead>, InvalidResponse> {
    let bad = InvalidResponse;
    let head = buf.split_to(len).freeze();
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_RESPONSE_HEADERS];
    let mut resp = httparse::Response::new(&mut []);
    match httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut resp, &head, &mut slots)
    {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(bad("malformed response head")),
        Err(httparse::Error::TooManyHeaders) => return Err(bad("too many header fields")),
        Err(_) => return Err(bad("malformed response head")),
    }
    let status =
        StatusCode::from_u16(resp.code.unwrap_or(0)).map_err(|_| bad("invalid status code"))?;
    if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
        // Relayed to the client when it can take it (`103 Early Hints`), else dropped.
        if status != StatusCode::CONTINUE {
            let mut headers = HeaderMap::with_capacity(resp.headers.len());
            for h in resp.headers.iter() {
                if let Ok(name) = names::from_token(h.name.as_bytes()) {
                    headers.append(name, parsed_value(&head, h.value));
                }
            }
            crate::interim::relay(status, headers);
        }
        return Ok(None);
    }
    let version = if resp.version == Some(1) {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    let fresh = || ResponseFacts {
        close: version == Version::HTTP_10,
        ..ResponseFacts::default()
    };
    let mut facts = fresh();
    let as_sent = as_sent.filter(|_| status != StatusCode::SWITCHING_PROTOCOLS);
    let (mut headers, mut fields) = match as_sent {
        None => (field_map(resp.headers, &mut facts, &head)?, None),
        Some(rule) => match sent_fields(resp.headers, rule, &mut facts, &head)? {
            Some(f) => (HeaderMap::new(), Some(f)),
            None => {
                // What the lines began to note is noted again, from the start.
                facts = fresh();
                (field_map(resp.headers, &mut facts, &head)?, None)
            }
        },
    };
    let (decoder, reusable, length) = facts.framing(version, status, is_head);
    match (length, fields.as_mut()) {
        (Some(n), Some(f)) => f.length(&n, status, is_head),
        (Some(n), None) => {
            headers.insert(header::CONTENT_LENGTH, n);
        }
        (None, _) => {}
    }
    let mut builder = http::Response::builder().status(status).version(version);
    if let Some(h) = builder.headers_mut() {
        *h = headers;
    }
    let (parts, ()) = builder
        .body(())
        .map_err(|_| bad("invalid response"))?
        .into_parts();
    Ok(Some(ResponseHead {
        parts,
        decoder,
        reusable,
        fields,
    }))
}

/// A response's fields as a map, framing noted on the way. Inlined: a call of its own
/// cost the HTTP/2 front (which always takes the map) 140 instructions a request.
#[inline(always)]
fn field_map(
    fields: &[httparse::Header<'_>],
    facts: &mut ResponseFacts,
    head: &Bytes,
) -> Result<HeaderMap, InvalidResponse> {
    let mut headers = HeaderMap::with_capacity(fields.len() + 2);
    for h in fields {
        let name = names::from_token(h.name.as_bytes())
            .map_err(|_| InvalidResponse("invalid header name"))?;
        if facts.note(&name, h.value, head)? {
            headers.append(name, parsed_value(head, h.value));
        }
    }
    Ok(headers)
}

/// What becomes of a response field on its way to an HTTP/1 client that takes the
/// fields as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fate {
    Pass,
    /// Framing, hop-by-hop, or never passed on (`X-Sluice-*`, `X-Powered-By`).
    Drop,
    /// Needs the map after all: a compressible type (unless
    /// [`AsSent::identity_only`]).
    Map,
    /// Passes, and the answer varies by `Accept-Encoding` (a compressible type).
    Varies,
    /// Read for the framing ([`ResponseFacts::note`]), then dropped (a `Connection`
    /// that names other fields needs the map).
    Framing(HeaderName),
}

/// The response's fields as sent ([`SentFields`]), framing noted on the way; `None`
/// when one of them needs the map ([`Fate::Map`]): the caller builds it instead, from
/// fresh facts. The same fields pass, with the same names and values, as pass
/// through [`field_map`], `proxy::headers::response` (scrub, no `header_down`),
/// compression's `Vary` and [`super::encode::head`] (a property test holds the two ways
/// together).
fn sent_fields(
    fields: &[httparse::Header<'_>],
    rule: AsSent,
    facts: &mut ResponseFacts,
    head: &Bytes,
) -> Result<Option<Box<SentFields>>, InvalidResponse> {
    if rule.compress && !rule.identity_only {
        // A client that takes a coding: a compressible answer is compression's to
        // decide on, through the map. Told before anything is copied.
        let typed = fields.iter().find(|h| {
            h.name.len() == 12
                && names::folded_eq(h.name.as_bytes(), &const { names::pad(b"content-type") })
        });
        if typed.is_some_and(|h| compressible(h.value)) {
            return Ok(None);
        }
    }
    // Room for every line as it came, and `Vary`: one allocation.
    let mut lines = Vec::with_capacity(head.len() + VARY.len());
    let (mut has_date, mut has_vary, mut varies, mut typed) = (false, false, false, false);
    for h in fields {
        let name = h.name.as_bytes();
        match fate(name, h.value, &mut typed, rule) {
            Fate::Map => return Ok(None),
            Fate::Drop => {}
            Fate::Framing(n) => {
                // A `Connection` naming fields to drop with it: the map's work.
                if facts.note(&n, h.value, head)? && n == header::CONNECTION {
                    return Ok(None);
                }
            }
            f @ (Fate::Pass | Fate::Varies) => {
                varies |= f == Fate::Varies;
                if name.len() == 4 {
                    has_date |= names::folded_eq(name, &const { names::pad(b"date") });
                    has_vary |= names::folded_eq(name, &const { names::pad(b"vary") });
                }
                let at = lines.len();
                match as_written(head, name, h.value) {
                    // The line as it came, in one copy.
                    Some(line) => lines.extend_from_slice(line),
                    None => super::encode::field(&mut lines, name, h.value),
                }
                names::lower_in_place(&mut lines[at..at + name.len()]);
            }
        }
    }
    if varies {
        if has_vary {
            // Compression extends the backend's `Vary`: that is the map's work.
            return Ok(None);
        }
        lines.extend_from_slice(VARY);
    }
    // Boxed: it rides in every answer's structures on its way to the client, and a
    // pointer costs the answers that do not have it nothing to move.
    Ok(Some(Box::new(SentFields {
        lines,
        has_date,
        has_length: false,
        varies,
    })))
}

/// Where field `name` goes on the way to a client that takes the fields as sent.
/// `typed`: a `Content-Type` was seen (the first is the one compression reads).
/// Told apart by length and first letter, then one comparison.
#[inline]
fn fate(name: &[u8], value: &[u8], typed: &mut bool, rule: AsSent) -> Fate {
    let Some(&first) = name.first() else {
        return Fate::Pass;
    };
    let is = |lower: &[u8; 32]| names::folded_eq(name, lower);
    match (name.len(), first | 0x20) {
        (12, b'c')
            if is(&const { names::pad(b"content-type") }) && !std::mem::replace(typed, true) =>
        {
            match rule.compress && compressible(value) {
                true if rule.identity_only => Fate::Varies,
                true => Fate::Map,
                false => Fate::Pass,
            }
        }
        (14, b'c') if is(&const { names::pad(b"content-length") }) => {
            Fate::Framing(header::CONTENT_LENGTH)
        }
        _ => match names::kind(name) {
            Kind::HopByHop(names::CONNECTION_AT) => Fate::Framing(header::CONNECTION),
            Kind::HopByHop(names::TRANSFER_ENCODING_AT) => Fate::Framing(header::TRANSFER_ENCODING),
            Kind::HopByHop(_) | Kind::Te | Kind::Sluice | Kind::PoweredBy => Fate::Drop,
            Kind::Forwarding { .. } | Kind::Other => Fate::Pass,
        },
    }
}

/// The line of field `name` in `head` when it is already written as the map would
/// write it (`name: value` and the line's end), save the name's case.
fn as_written<'h>(head: &'h [u8], name: &[u8], value: &[u8]) -> Option<&'h [u8]> {
    let start = (name.as_ptr() as usize).checked_sub(head.as_ptr() as usize)?;
    let end = start + name.len() + 2 + value.len() + 2;
    let line = head.get(start..end)?;
    let (sep, rest) = line[name.len()..].split_at(2);
    let (v, crlf) = rest.split_at(value.len());
    (sep == b": " && v.as_ptr() == value.as_ptr() && crlf == b"\r\n").then_some(line)
}

/// What a response's fields say about its framing and its connection.
#[derive(Default)]
struct ResponseFacts {
    length: Option<u64>,
    /// The one Content-Length field as the backend sent it, when plain (passed on
    /// without a copy).
    length_as_sent: Option<HeaderValue>,
    chunked: bool,
    te: bool,
    close: bool,
    keep_alive: bool,
}

impl ResponseFacts {
    /// Notes one field; `Ok(false)`: it is not passed on as it came (Content-Length,
    /// set once by [`ResponseFacts::framing`]; a `Connection` of only `close` and
    /// `keep-alive`, which says nothing past this hop and would only be removed again).
    #[inline(always)]
    fn note(
        &mut self,
        name: &HeaderName,
        value: &[u8],
        head: &Bytes,
    ) -> Result<bool, InvalidResponse> {
        let bad = InvalidResponse;
        if name == header::CONTENT_LENGTH {
            // Set once, as a single value, however the backend spelled it; a plain
            // single field is passed on as it came, without a copy.
            self.length_as_sent = match self.length {
                None if !value.contains(&b',') => Some(parsed_value(head, value)),
                _ => None,
            };
            self.length = Some(length_field(value, self.length).map_err(bad)?);
            return Ok(false);
        } else if name == header::TRANSFER_ENCODING {
            self.te = true;
            self.chunked = value
                .split(|&b| b == b',')
                .next_back()
                .is_some_and(|c| trim(c).eq_ignore_ascii_case(b"chunked"));
        } else if name == header::CONNECTION {
            let mut options_only = true;
            for t in value.split(|&b| b == b',').map(trim) {
                let (close, keep_alive) = (
                    t.eq_ignore_ascii_case(b"close"),
                    t.eq_ignore_ascii_case(b"keep-alive"),
                );
                self.close |= close;
                self.keep_alive |= keep_alive;
                options_only &= close || keep_alive || t.is_empty();
            }
            return Ok(!options_only);
        }
        Ok(true)
    }

    /// The body's decoder, whether the connection may carry another request once it
    /// ends, and the one Content-Length passed on.
    fn framing(
        self,
        version: Version,
        status: StatusCode,
        is_head: bool,
    ) -> (Decoder, bool, Option<HeaderValue>) {
        let mut close = self.close;
        if version == Version::HTTP_10 && self.keep_alive {
            close = false;
        }
        let length = match self.length {
            // Transfer-Encoding wins and the length is a lie or a smuggling attempt: it
            // must not reach the client, and this connection's framing is not to be
            // trusted again.
            Some(_) if self.te => {
                close = true;
                None
            }
            Some(n) => Some(self.length_as_sent.unwrap_or_else(|| HeaderValue::from(n))),
            None => None,
        };
        let no_body = is_head
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
            || status.is_informational();
        let (decoder, delimited) = if no_body {
            (Decoder::length(0), true)
        } else if self.te {
            if self.chunked {
                (Decoder::chunked(), true)
            } else {
                (Decoder::until_close(), false)
            }
        } else if let Some(n) = self.length {
            (Decoder::length(n), true)
        } else {
            (Decoder::until_close(), false)
        };
        (decoder, delimited && !close, length)
    }
}

/// Whether a `TE` value lists `trailers` (in any case, parameters aside).
pub(crate) fn asks_trailers(v: &[u8]) -> bool {
    v.split(|&b| b == b',').any(|t| {
        t.split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii()
            .eq_ignore_ascii_case(b"trailers")
    })
}

/// `TE` as a backend may receive it: exactly `trailers` when the client asked for
/// trailers (in any case, among other codings) and they may pass, else nothing. HTTP/2
/// refuses any other spelling, and a refusal must never look like the peer's fault.
pub(crate) fn normalise_te(h: &mut http::HeaderMap, keep_trailers: bool) {
    let trailers = keep_trailers
        && h.get_all(http::header::TE)
            .iter()
            .any(|v| asks_trailers(v.as_bytes()));
    if trailers {
        h.insert(http::header::TE, http::HeaderValue::from_static("trailers"));
    } else {
        h.remove(http::header::TE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(s: &str) -> Result<RequestHead, HeadError> {
        let b = Bytes::from(s.to_string());
        let end = super::super::scan::RequestScan::default()
            .find_end(&b)?
            .expect("complete head");
        let at_once = parse_request(b.slice(..end), false);
        // Kept as they came, the fields make the same map later.
        let kept = parse_request(b.slice(..end), true).map(|mut h| {
            if let Some(f) = h.fields.take() {
                h.headers = f.to_map();
            }
            h
        });
        match (&at_once, kept) {
            (Ok(a), Ok(k)) => assert_eq!(a.headers, k.headers),
            (Err(a), Err(k)) => assert_eq!(*a, k),
            (a, k) => panic!("{a:?} / {k:?}"),
        }
        at_once
    }

    fn response(s: &str) -> Result<ResponseHead, InvalidResponse> {
        let mut b = BytesMut::from(s);
        let len = super::super::scan::ResponseScan::default()
            .find_end(&b)
            .expect("complete head");
        Ok(parse_response(&mut b, len, false, None)?.expect("a final response"))
    }

    #[test]
    fn absolute_form_replaces_host() {
        let h = head("GET http://a.test/x HTTP/1.1\r\nHost: b.test\r\n\r\n").unwrap();
        assert_eq!(h.headers["host"], "a.test", "the target's authority wins");
        assert_eq!(h.headers.get_all("host").iter().count(), 1);
        assert!(head("GET http://u@a.test/x HTTP/1.1\r\nHost: a.test\r\n\r\n").is_err());
    }

    #[test]
    fn response_lengths_are_strict() {
        let r = response("HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\nContent-Length: 5\r\n\r\n")
            .unwrap();
        assert!(r.reusable);
        assert_eq!(
            r.parts
                .headers
                .get_all("content-length")
                .iter()
                .collect::<Vec<_>>(),
            ["5"],
            "one value on"
        );
        assert_eq!(r.decoder.remaining(), Some(5));
        for bad in ["+5", "5, 6", "-1", "5 5", ""] {
            let s = format!("HTTP/1.1 200 OK\r\nContent-Length: {bad}\r\n\r\n");
            assert!(
                response(&s).is_err(),
                "Content-Length {bad:?} must be refused"
            );
        }
        let r = response(
            "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        .unwrap();
        assert!(
            !r.parts.headers.contains_key("content-length"),
            "a length beside Transfer-Encoding is dropped"
        );
        assert!(!r.reusable, "and the connection is not reused");
        assert_eq!(r.decoder.remaining(), None, "the body is read as chunked");
    }

    #[test]
    fn a_response_connection_of_options_stays_behind() {
        for (field, close) in [
            ("keep-alive", false),
            ("Keep-Alive", false),
            ("close", true),
            ("keep-alive, close", true),
            (" , keep-alive", false),
        ] {
            let r = response(&format!(
                "HTTP/1.1 200 OK\r\nConnection: {field}\r\nContent-Length: 0\r\n\r\n"
            ))
            .unwrap();
            assert!(!r.parts.headers.contains_key("connection"), "{field:?}");
            assert_eq!(r.reusable, !close, "{field:?}");
        }
        // A field it names still has to be found and removed (`headers::scrub`).
        let r = response(
            "HTTP/1.1 200 OK\r\nConnection: keep-alive, x-hop\r\nX-Hop: 1\r\nContent-Length: 0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.parts.headers["connection"], "keep-alive, x-hop");
        assert!(r.reusable);
        let r = response("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n")
            .unwrap();
        assert!(
            r.reusable,
            "an HTTP/1.0 backend's keep-alive is still heard"
        );
    }

    #[test]
    fn plain_get() {
        let h = head("GET /a?b=1 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!(h.uri.path(), "/a");
        assert_eq!(h.framing, Framing::None);
        assert!(h.keep_alive);
    }

    #[test]
    fn smuggling_shapes_are_refused() {
        let bad = |s: &str| head(s).unwrap_err();
        assert_eq!(
            bad("GET / HTTP/1.1\nHost: x\r\n\r\n"),
            HeadError::Bad("bare LF line ending")
        );
        assert_eq!(
            bad("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"),
            HeadError::Bad("both Content-Length and Transfer-Encoding")
        );
        assert_eq!(
            bad("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n"),
            HeadError::Bad("differing Content-Length values")
        );
        assert_eq!(
            bad("GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n  folded\r\n\r\n"),
            HeadError::Bad("obsolete line folding")
        );
        assert_eq!(
            bad("GET / HTTP/1.1\r\nHost: x\r\nX-A : 1\r\n\r\n"),
            HeadError::Bad("invalid character in a header name")
        );
        assert_eq!(
            bad("GET / HTTP/1.1\r\nHost: x\r\n X-A: 1\r\n\r\n"),
            HeadError::Bad("obsolete line folding")
        );
        assert_eq!(
            bad("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            HeadError::Coding
        );
        assert_eq!(bad("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"), HeadError::Coding);
        // httparse or our own check refuses it first; either way a 400.
        assert!(matches!(
            bad("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\x0b\r\n\r\n"),
            HeadError::Bad(_)
        ));
        assert_eq!(
            bad("GET / HTTP/1.1\r\n\r\n"),
            HeadError::Bad("missing Host")
        );
    }

    #[test]
    fn same_content_length_twice_is_one() {
        let h =
            head("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n")
                .unwrap();
        assert_eq!(h.framing, Framing::Length(5));
        let fields: Vec<_> = h.headers.get_all("content-length").iter().collect();
        assert_eq!(fields, ["5"], "forwarded as one field");
        let h = head("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\n").unwrap();
        let fields: Vec<_> = h.headers.get_all("content-length").iter().collect();
        assert_eq!(
            fields,
            ["5"],
            "a list of equal values forwarded as one plain value"
        );
        let h = head("POST / HTTP/1.1\r\nHost: x\r\ntransfer-encoding: Chunked\r\n\r\n").unwrap();
        assert_eq!(h.framing, Framing::Chunked);
    }

    #[test]
    fn limits() {
        let mut s = String::from("GET / HTTP/1.1\r\nHost: x\r\n");
        for i in 0..100 {
            s.push_str(&format!("X-{i}: v\r\n"));
        }
        s.push_str("\r\n");
        assert_eq!(
            head(&s).unwrap_err(),
            HeadError::TooLarge,
            "101 fields is over the limit"
        );
        let big = "a".repeat(MAX_HEAD + 1);
        assert_eq!(
            super::super::scan::RequestScan::default()
                .find_end(big.as_bytes())
                .unwrap_err(),
            HeadError::TooLarge
        );
    }

    #[test]
    fn http10_keep_alive_is_opt_in() {
        assert!(!head("GET / HTTP/1.0\r\n\r\n").unwrap().keep_alive);
        assert!(
            head("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
                .unwrap()
                .keep_alive
        );
    }

    proptest::proptest! {
        /// A length is read as the standard library reads digits, up to 19 of them.
        #[test]
        fn compressible_finds_each_word_anywhere_in_any_case(
            t in "[a-zA-Z+/;=. -]{0,12}(text/|[jJ][sS][oO][nN]|[xX][mM][lL]|[sS][vV][gG]|javascript|JavaScript|[jx]s)?[a-zA-Z+/;=. -]{0,12}",
        ) {
            let lower = t.to_ascii_lowercase();
            let want = lower.starts_with("text/")
                || ["javascript", "json", "xml", "svg"].iter().any(|w| lower.contains(w));
            proptest::prop_assert_eq!(compressible(t.as_bytes()), want);
        }

        #[test]
        fn lengths_read_as_the_standard_parser_reads_them(digits in "[0-9]{1,20}") {
            let ours = length_field(digits.as_bytes(), None).ok();
            let std = (digits.len() <= 19).then(|| digits.parse::<u64>().ok()).flatten();
            proptest::prop_assert_eq!(ours, std);
        }

        /// Every value httparse takes, in a request or a response, is one the checked
        /// constructor takes too: what `parsed_value` relies on.
        #[test]
        fn parsed_values_pass_the_checked_constructor(
            values in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..12), 1..4)
        ) {
            for start in ["GET / HTTP/1.1\r\n", "HTTP/1.1 200 OK\r\n"] {
                let mut h = start.as_bytes().to_vec();
                for v in &values {
                    h.extend_from_slice(b"X-V: ");
                    h.extend_from_slice(v);
                    h.extend_from_slice(b"\r\n");
                }
                h.extend_from_slice(b"\r\n");
                let mut slots = [httparse::EMPTY_HEADER; 8];
                let parsed = if start.starts_with("GET") {
                    httparse::Request::new(&mut slots).parse(&h).map(|s| s.is_complete())
                } else {
                    httparse::Response::new(&mut slots).parse(&h).map(|s| s.is_complete())
                };
                if parsed == Ok(true) {
                    for f in slots.iter().filter(|f| f.name == "X-V") {
                        proptest::prop_assert!(
                            HeaderValue::from_bytes(f.value).is_ok(),
                            "{:?}: taken by httparse, refused by HeaderValue", f.value
                        );
                    }
                }
            }
        }

        /// What the field check refuses, httparse refuses too: the check may run only
        /// on a head httparse refused, to name why.
        #[test]
        fn httparse_refuses_what_the_field_check_refuses(
            lines in proptest::collection::vec(
                ("[ \t]?", "[a-zA-Z0-9!#|~(),;@\"/{é \t\\x01\x7f-]{0,5}", ":?", "[ a-z:]{0,3}"),
                0..4,
            )
        ) {
            // The lines come first, so the first field line may be the odd one.
            let mut h = String::from("GET / HTTP/1.1\r\n");
            for (fold, name, colon, value) in &lines {
                h.extend([fold, name, colon, value, "\r\n"]);
            }
            h.push_str("Host: x\r\n\r\n");
            if check_fields(h.as_bytes()).is_err() {
                let mut slots = [httparse::EMPTY_HEADER; 8];
                let parsed = httparse::Request::new(&mut slots).parse(h.as_bytes());
                proptest::prop_assert!(
                    !matches!(parsed, Ok(httparse::Status::Complete(_))),
                    "{h:?}: refused by the check, taken by httparse"
                );
                proptest::prop_assert!(head(&h).is_err());
            }
        }
    }
}
