//! The access log: one line a response — a JSON object (`time`, `client`, `host`,
//! `method`, `protocol`, `path`, `status`, `bytes`, `duration_ms`, `pool`, `peer`,
//! `attempts`, `role`, `transition`, `upstream_ms`, `user_agent`, `referer`,
//! `request_id`, `tls`), sluice's text line, Apache's Combined or Common Log Format, or
//! the operator's template — to stdout, stderr or a file.
//!
//! Never blocks the request path: a line goes into a bounded channel to a writer
//! thread; when the channel is full the line is counted as dropped, never waited for.
//! The writer flushes whenever it has caught up. SIGUSR1 reopens the file (log
//! rotation) before the next line. Lines are formatted by hand (no JSON tree per line).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use std::sync::mpsc;

use super::log::rfc3339;
use crate::config::template::{LogField, LogPart, LogTemplate};
use crate::config::{AccessFormat, AccessLogConfig, LogTarget};

/// Lines waiting for the writer, at most.
const QUEUE: usize = 8192;
/// How long the writer sleeps when it has caught up: the most a line waits.
const LAG: std::time::Duration = std::time::Duration::from_millis(10);

#[derive(Default)]
struct Flags {
    /// SIGUSR1: reopen the file before the next line.
    reopen: AtomicBool,
    /// Shutting down: write what is queued and stop.
    closing: AtomicBool,
}

/// Lines dropped because the writer fell behind, since start.
pub(crate) static DROPPED: AtomicU64 = AtomicU64::new(0);

/// One response, as the log records it.
pub(crate) struct Entry<'a> {
    pub time: SystemTime,
    pub client: &'a str,
    pub host: &'a str,
    pub method: &'a str,
    /// Path and query as received.
    pub path: &'a str,
    pub status: u16,
    pub bytes: u64,
    pub duration_ms: u64,
    pub protocol: &'static str,
    pub pool: Option<&'a str>,
    pub peer: Option<&'a str>,
    pub attempts: u32,
    pub role: Option<&'static str>,
    pub transition: Option<&'static str>,
    pub user_agent: Option<&'a str>,
    pub referer: Option<&'a str>,
    /// The user a Basic `Authorization` names (as Apache's `%u`: claimed, so shown
    /// on a `401` too).
    pub user: Option<&'a str>,
    /// The `request_id` filter's id.
    pub request_id: Option<&'a str>,
    /// The TLS version, over TLS.
    pub tls: Option<&'static str>,
    /// From the proxy's first dial to the response head (or its failure).
    pub upstream_ms: Option<u64>,
    pub scheme: &'static str,
    /// The request headers a template asks for, in its order.
    pub headers: &'a [Option<http::HeaderValue>],
}

/// A request the access log will record once its response is done: what it needs of
/// the request, taken before the request is dispatched.
pub(crate) struct Pending {
    log: Arc<AccessLog>,
    /// When the head was read: the line's time, and the start of its duration.
    time: SystemTime,
    method: http::Method,
    uri: http::Uri,
    host: Option<http::HeaderValue>,
    user_agent: Option<http::HeaderValue>,
    referer: Option<http::HeaderValue>,
    user: Option<String>,
    protocol: &'static str,
    tls: Option<&'static str>,
    scheme: &'static str,
    /// What a template's `{header.NAME}` parts show.
    headers: Vec<Option<http::HeaderValue>>,
}

/// Who served a response (or, for a 502/504, the last peer dialed), for its line.
#[derive(Clone, Copy)]
pub(crate) struct Upstream<'a> {
    pub pool: &'a str,
    pub peer: &'a str,
    pub attempts: u32,
    /// `primary` or `backup`, as `X-Sluice-Origin` says.
    pub role: &'static str,
    /// As `X-Sluice-Origin-Transition` says.
    pub transition: &'static str,
    pub upstream: Option<std::time::Duration>,
}

impl<'a> From<&'a crate::upstream::Served> for Upstream<'a> {
    fn from(s: &'a crate::upstream::Served) -> Upstream<'a> {
        Upstream {
            pool: s.pool_name(),
            peer: s.peer_address(),
            attempts: s.attempts,
            role: s.role,
            transition: s.transition,
            upstream: s.upstream,
        }
    }
}

/// How the access log names a request's protocol.
pub(crate) fn protocol(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_09 => "HTTP/0.9",
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_2 => "HTTP/2",
        http::Version::HTTP_3 => "HTTP/3",
        _ => "HTTP/1.1",
    }
}

impl Pending {
    pub(crate) fn new(
        log: Arc<AccessLog>,
        method: &http::Method,
        uri: &http::Uri,
        headers: &http::HeaderMap,
        version: http::Version,
        client: &crate::pipeline::ClientInfo,
    ) -> Pending {
        use http::header;
        let apache = matches!(
            log.config.format,
            AccessFormat::Combined | AccessFormat::Common
        );
        let asked = match &log.config.format {
            AccessFormat::Template(t) => {
                t.headers.iter().map(|h| headers.get(h).cloned()).collect()
            }
            _ => Vec::new(),
        };
        Pending {
            tls: client.tls,
            scheme: client.scheme.as_str(),
            headers: asked,
            time: SystemTime::now(),
            method: method.clone(),
            uri: uri.clone(),
            host: headers.get(header::HOST).cloned(),
            user_agent: headers.get(header::USER_AGENT).cloned(),
            referer: headers.get(header::REFERER).cloned(),
            user: apache
                .then(|| basic_user(headers.get(header::AUTHORIZATION)?))
                .flatten(),
            protocol: protocol(version),
            log,
        }
    }

    /// Writes the line.
    pub(crate) fn finish(
        &self,
        client: &str,
        status: u16,
        bytes: u64,
        upstream: Option<Upstream<'_>>,
        request_id: Option<&http::HeaderValue>,
    ) {
        self.log.record(&Entry {
            time: self.time,
            client,
            host: self
                .host
                .as_ref()
                .and_then(|h| h.to_str().ok())
                .unwrap_or(""),
            method: self.method.as_str(),
            path: self.uri.path_and_query().map_or("/", |pq| pq.as_str()),
            status,
            bytes,
            duration_ms: self.time.elapsed().map_or(0, |d| d.as_millis() as u64),
            protocol: self.protocol,
            pool: upstream.map(|u| u.pool),
            peer: upstream.map(|u| u.peer),
            attempts: upstream.map_or(0, |u| u.attempts),
            role: upstream.map(|u| u.role),
            transition: upstream.map(|u| u.transition),
            user_agent: self.user_agent.as_ref().and_then(|v| v.to_str().ok()),
            referer: self.referer.as_ref().and_then(|v| v.to_str().ok()),
            user: self.user.as_deref(),
            request_id: request_id.and_then(|v| v.to_str().ok()),
            tls: self.tls,
            upstream_ms: upstream
                .and_then(|u| u.upstream)
                .map(|d| d.as_millis() as u64),
            scheme: self.scheme,
            headers: &self.headers,
        });
    }
}

/// The user name of a Basic `Authorization` value, if it is one (the filter's own
/// reading of the header).
fn basic_user(v: &http::HeaderValue) -> Option<String> {
    crate::filter::basic_auth::credentials(v)
        .map(|(user, _)| user)
        .filter(|u| !u.is_empty())
}

pub(crate) struct AccessLog {
    pub config: AccessLogConfig,
    tx: mpsc::SyncSender<String>,
    flags: Arc<Flags>,
    writer: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl AccessLog {
    /// Starts the writer task. Must run inside the tokio runtime.
    pub(crate) fn start(config: AccessLogConfig) -> std::io::Result<Arc<AccessLog>> {
        // A preallocated ring: sending allocates nothing and wakes no one.
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let flags = Arc::new(Flags::default());
        if let LogTarget::File(path) = &config.target {
            // Fail at load, not at the first line, when the file cannot be opened.
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?;
        }
        let (target, f) = (config.target.clone(), flags.clone());
        let writer = std::thread::Builder::new()
            .name("sluice-access-log".into())
            .spawn(move || write(target, rx, f))?;
        Ok(Arc::new(AccessLog {
            config,
            tx,
            flags,
            writer: std::sync::Mutex::new(Some(writer)),
        }))
    }

    /// Queues a line; drops it (counted) if the writer is behind.
    pub(crate) fn record(&self, e: &Entry<'_>) {
        let line = match &self.config.format {
            AccessFormat::Json => json(e),
            AccessFormat::Text => text(e),
            AccessFormat::Combined => apache(e, true),
            AccessFormat::Common => apache(e, false),
            AccessFormat::Template(t) => template(t, e),
        };
        if self.tx.try_send(line).is_err() {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reopens the file (after rotation) before the next line; nothing for stdout and
    /// stderr.
    pub(crate) fn reopen(&self) {
        self.flags.reopen.store(true, Ordering::Relaxed);
    }

    /// Writes what is queued and stops the writer (at shutdown), waiting for it.
    pub(crate) fn close(&self) {
        self.flags.closing.store(true, Ordering::Relaxed);
        let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = writer {
            let _ = w.join();
        }
    }
}

fn json(e: &Entry<'_>) -> String {
    // Room for the fixed keys and the usual values: one allocation, no regrowth.
    let variable = [Some(e.path), Some(e.host), e.user_agent, e.referer, e.pool]
        .iter()
        .map(|v| v.map_or(0, str::len))
        .sum::<usize>();
    let mut s = String::with_capacity(384 + variable);
    s.push_str("{\"time\":\"");
    timestamp(&mut s, e.time);
    s.push_str("\",\"client\":");
    string(&mut s, e.client);
    s.push_str(",\"host\":");
    string(&mut s, e.host);
    s.push_str(",\"method\":");
    string(&mut s, e.method);
    s.push_str(",\"protocol\":\"");
    s.push_str(e.protocol);
    s.push('"');
    s.push_str(",\"path\":");
    string(&mut s, e.path);
    s.push_str(",\"status\":");
    number(&mut s, u64::from(e.status));
    s.push_str(",\"bytes\":");
    number(&mut s, e.bytes);
    s.push_str(",\"duration_ms\":");
    number(&mut s, e.duration_ms);
    s.push_str(",\"pool\":");
    match e.pool {
        Some(p) => string(&mut s, p),
        None => s.push_str("null"),
    }
    s.push_str(",\"peer\":");
    match e.peer {
        Some(p) => string(&mut s, p),
        None => s.push_str("null"),
    }
    s.push_str(",\"attempts\":");
    number(&mut s, u64::from(e.attempts));
    s.push_str(",\"upstream_ms\":");
    match e.upstream_ms {
        Some(n) => number(&mut s, n),
        None => s.push_str("null"),
    }
    for (key, v) in [
        (",\"user_agent\":", e.user_agent),
        (",\"referer\":", e.referer),
        (",\"request_id\":", e.request_id),
        (",\"tls\":", e.tls),
    ] {
        s.push_str(key);
        match v {
            Some(v) => string(&mut s, v),
            None => s.push_str("null"),
        }
    }
    for (key, v) in [(",\"role\":", e.role), (",\"transition\":", e.transition)] {
        s.push_str(key);
        match v {
            Some(v) => {
                s.push('"');
                s.push_str(v);
                s.push('"');
            }
            None => s.push_str("null"),
        }
    }
    s.push_str("}\n");
    s
}

fn text(e: &Entry<'_>) -> String {
    let quote = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    let quoted = |v: Option<&str>| {
        let mut out = String::new();
        match v {
            Some(v) => escaped(&mut out, v),
            None => out.push('-'),
        }
        out
    };
    format!(
        "{} - - [{}] \"{} {} {}\" {} {} \"{}\" {} {} {} {}ms {} \"{}\" \"{}\" {} {}\n",
        e.client,
        rfc3339(e.time),
        e.method,
        quote(e.path),
        e.protocol,
        e.status,
        e.bytes,
        quote(e.host),
        e.pool
            .map(quote)
            .unwrap_or_else(|| "-".into())
            .replace(' ', "_"),
        e.peer.unwrap_or("-"),
        e.attempts,
        e.duration_ms,
        e.upstream_ms
            .map_or_else(|| "-".to_string(), |n| format!("{n}ms")),
        quoted(e.referer),
        quoted(e.user_agent),
        quoted(e.request_id),
        e.tls.unwrap_or("-"),
    )
}

/// The operator's template: each value escaped as in Apache's formats, `-` for one
/// that is absent.
fn template(t: &LogTemplate, e: &Entry<'_>) -> String {
    let mut s = String::with_capacity(128 + e.path.len());
    let (path, query) = match e.path.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (e.path, None),
    };
    let text = |s: &mut String, v: Option<&str>| match v {
        Some(v) if !v.is_empty() => escaped(s, v),
        _ => s.push('-'),
    };
    for part in &t.parts {
        match part {
            LogPart::Text(t) => s.push_str(t),
            LogPart::Header(i) => {
                let v = e.headers.get(*i).and_then(|v| v.as_ref());
                text(&mut s, v.and_then(|v| v.to_str().ok()));
            }
            LogPart::Field(f) => match f {
                LogField::Host => text(&mut s, Some(e.host)),
                LogField::Path => text(&mut s, Some(path)),
                LogField::Query => text(&mut s, query),
                LogField::Uri => text(&mut s, Some(e.path)),
                LogField::ClientIp => text(&mut s, Some(e.client)),
                LogField::Scheme => s.push_str(e.scheme),
                LogField::Method => text(&mut s, Some(e.method)),
                LogField::Status => number(&mut s, u64::from(e.status)),
                LogField::Bytes => number(&mut s, e.bytes),
                LogField::DurationMs => number(&mut s, e.duration_ms),
                LogField::Pool => text(&mut s, e.pool),
                LogField::Peer => text(&mut s, e.peer),
                LogField::Attempts => number(&mut s, u64::from(e.attempts)),
                LogField::Protocol => s.push_str(e.protocol),
                LogField::RequestId => text(&mut s, e.request_id),
                LogField::Tls => text(&mut s, e.tls),
                LogField::UpstreamMs => match e.upstream_ms {
                    Some(n) => number(&mut s, n),
                    None => s.push('-'),
                },
                LogField::Time => timestamp(&mut s, e.time),
            },
        }
    }
    s.push('\n');
    s
}

/// Apache's Common Log Format (`%h %l %u %t "%r" %>s %b`), and with `combined` its
/// Combined (`… "%{Referer}i" "%{User-agent}i"`): `-` for what is absent and for an
/// empty body, the time in UTC, quoted values escaped (`"` as `\"`, control bytes as
/// `\xNN`).
fn apache(e: &Entry<'_>, combined: bool) -> String {
    let mut s = String::with_capacity(160 + e.path.len());
    s.push_str(e.client);
    s.push_str(" - ");
    match e.user {
        Some(u) => escaped(&mut s, u),
        None => s.push('-'),
    }
    s.push_str(" [");
    s.push_str(&httpdate_clf(e.time));
    s.push_str("] \"");
    escaped(&mut s, e.method);
    s.push(' ');
    escaped(&mut s, e.path);
    s.push(' ');
    s.push_str(e.protocol);
    s.push_str("\" ");
    number(&mut s, u64::from(e.status));
    s.push(' ');
    match e.bytes {
        0 => s.push('-'),
        n => number(&mut s, n),
    }
    if combined {
        for v in [e.referer, e.user_agent] {
            s.push_str(" \"");
            match v {
                Some(v) => escaped(&mut s, v),
                None => s.push('-'),
            }
            s.push('"');
        }
    }
    s.push('\n');
    s
}

/// `v` with `"` and `\` backslash-escaped and bytes outside printable ASCII as `\xNN`.
fn escaped(out: &mut String, v: &str) {
    for b in v.bytes() {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(char::from(b)),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
}

/// `10/Oct/2000:13:55:36 +0000`: the Common Log Format's time, in UTC.
fn httpdate_clf(t: SystemTime) -> String {
    // RFC 3339 `2000-10-10T13:55:36.000Z` re-ordered.
    let r = rfc3339(t);
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = r[5..7]
        .parse::<usize>()
        .map_or("Jan", |m| MONTHS[(m + 11) % 12]);
    format!("{}/{month}/{}:{} +0000", &r[8..10], &r[0..4], &r[11..19])
}

/// `e.time` in RFC 3339 with milliseconds; the date and time of day are formatted
/// once a second per thread.
fn timestamp(out: &mut String, t: SystemTime) {
    use std::cell::RefCell;
    thread_local! {
        static CACHE: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != d.as_secs() {
            let full = rfc3339(t);
            *c = (d.as_secs(), full[..19].to_string());
        }
        out.push_str(&c.1);
    });
    let ms = d.subsec_millis();
    out.push('.');
    for digit in [ms / 100, ms / 10 % 10, ms % 10] {
        out.push(char::from(b'0' + digit as u8));
    }
    out.push('Z');
}

/// A JSON string: quotes, backslashes and control characters escaped (whole runs of
/// plain characters copied at once).
fn string(out: &mut String, v: &str) {
    out.reserve(v.len() + 2);
    out.push('"');
    let mut rest = v;
    loop {
        let k = plain_run(rest.as_bytes());
        out.push_str(&rest[..k]);
        let Some(&b) = rest.as_bytes().get(k) else {
            break;
        };
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            _ => {
                let _ = std::fmt::Write::write_fmt(out, format_args!("\\u{b:04x}"));
            }
        }
        // The byte escaped is ASCII: the rest starts on a character boundary.
        rest = &rest[k + 1..];
    }
    out.push('"');
}

/// How many leading bytes of `v` a JSON string takes as they are (no `"`, `\\` or
/// control byte): eight at a time, with the zero-byte test on each of the three.
fn plain_run(v: &[u8]) -> usize {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    // A byte of `x` below `n` (for n <= 0x80) sets its high bit in the result.
    let below = |x: u64, n: u8| x.wrapping_sub(LO * u64::from(n)) & !x & HI;
    let mut i = 0;
    for chunk in v.chunks_exact(8) {
        let x = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let hit = below(x, 0x20) | below(x ^ (LO * 0x22), 1) | below(x ^ (LO * 0x5c), 1);
        if hit != 0 {
            break;
        }
        i += 8;
    }
    i + v[i..]
        .iter()
        .position(|&b| b < 0x20 || b == b'"' || b == b'\\')
        .unwrap_or(v.len() - i)
}

/// A decimal number, without the formatting machinery.
fn number(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.push_str(std::str::from_utf8(&digits[i..]).unwrap_or("0"));
}

fn open(target: &LogTarget) -> Box<dyn std::io::Write + Send> {
    match target {
        LogTarget::Stdout => Box::new(std::io::stdout()),
        LogTarget::Stderr => Box::new(std::io::stderr()),
        LogTarget::File(path) => match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            Ok(f) => Box::new(f),
            Err(e) => {
                tracing::error!(
                    "sluice: access log: cannot open {}: {e}; lines go to stderr",
                    path.display()
                );
                Box::new(std::io::stderr())
            }
        },
    }
}

/// The writer: its own thread with plain blocking I/O, so a slow disk never stalls a
/// runtime worker. It drains what is queued, writes it through a 64 KiB buffer,
/// flushes, and sleeps a few milliseconds: a request never wakes it (a wakeup a line
/// cost more than the line), and a line reaches the file within [`LAG`].
fn write(target: LogTarget, rx: mpsc::Receiver<String>, flags: Arc<Flags>) {
    use std::io::Write;
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, open(&target));
    loop {
        if flags.reopen.swap(false, Ordering::Relaxed) {
            let _ = out.flush();
            out = std::io::BufWriter::with_capacity(64 * 1024, open(&target));
        }
        let mut wrote = false;
        let closed = loop {
            match rx.try_recv() {
                Ok(line) => {
                    wrote = true;
                    if out.write_all(line.as_bytes()).is_err() {
                        DROPPED.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(mpsc::TryRecvError::Empty) => break false,
                Err(mpsc::TryRecvError::Disconnected) => break true,
            }
        };
        if wrote {
            let _ = out.flush();
        }
        if closed || flags.closing.load(Ordering::Relaxed) {
            let _ = out.flush();
            return;
        }
        std::thread::sleep(LAG);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_escape_what_a_client_sent() {
        let e = Entry {
            time: SystemTime::UNIX_EPOCH,
            client: "10.0.0.1",
            host: "a\"b\\c",
            method: "GET",
            path: "/x\ny\u{1}",
            status: 200,
            bytes: 5,
            duration_ms: 3,
            protocol: "HTTP/2",
            pool: Some("a /x/*"),
            peer: None,
            attempts: 1,
            role: Some("backup"),
            transition: None,
            user_agent: Some("curl/8 \"x\""),
            referer: None,
            user: None,
            request_id: Some("r-1"),
            tls: None,
            upstream_ms: Some(2),
            scheme: "http",
            headers: &[],
        };
        let line = json(&e);
        assert!(line.ends_with("}\n"));
        let v: serde_json::Value = serde_json::from_str(&line).expect("valid JSON");
        assert_eq!(v["host"], "a\"b\\c");
        assert_eq!(v["path"], "/x\ny\u{1}");
        assert_eq!(v["time"], "1970-01-01T00:00:00.000Z");
        assert_eq!(v["pool"], "a /x/*");
        assert_eq!(v["peer"], serde_json::Value::Null);
        assert_eq!(v["protocol"], "HTTP/2");
        assert_eq!(v["role"], "backup");
        assert_eq!(v["transition"], serde_json::Value::Null);
        assert_eq!(
            (v["status"].as_u64(), v["bytes"].as_u64()),
            (Some(200), Some(5))
        );
        assert_eq!(v["user_agent"], "curl/8 \"x\"");
        assert_eq!(v["referer"], serde_json::Value::Null);
        assert_eq!(v["request_id"], "r-1");
        assert_eq!(v["tls"], serde_json::Value::Null);
        assert_eq!(v["upstream_ms"], 2);
    }

    proptest::proptest! {
        /// The run found eight bytes at a time is the byte-wise one, and a string
        /// written with it reads back as itself.
        #[test]
        fn json_strings_round_trip(v in ".{0,64}", bytes in proptest::collection::vec(0u8..=255, 0..40)) {
            let naive = bytes.iter().position(|&b| b < 0x20 || b == b'"' || b == b'\\');
            proptest::prop_assert_eq!(plain_run(&bytes), naive.unwrap_or(bytes.len()));
            let mut out = String::new();
            string(&mut out, &v);
            let back: String = serde_json::from_str(&out).expect("valid JSON");
            proptest::prop_assert_eq!(back, v);
        }
    }

    /// Apache's formats: `-` for what is absent and an empty body, UTC time, quoted
    /// values escaped so a client cannot end a field or a line.
    #[test]
    fn combined_and_common_lines_as_apache_writes_them() {
        let mut e = Entry {
            time: SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(971_186_136),
            client: "127.0.0.1",
            host: "a.test",
            method: "GET",
            path: "/apache_pb.gif?a=\"b\"\n",
            status: 200,
            bytes: 2326,
            duration_ms: 3,
            protocol: "HTTP/1.0",
            pool: None,
            peer: None,
            attempts: 0,
            role: None,
            transition: None,
            user_agent: Some("Mozilla/4.08 [en] (Win98; I ;Nav)"),
            referer: Some("http://www.example.com/start.html"),
            user: Some("frank"),
            request_id: None,
            tls: Some("TLSv1.3"),
            upstream_ms: None,
            scheme: "https",
            headers: &[],
        };
        assert_eq!(
            apache(&e, true),
            "127.0.0.1 - frank [10/Oct/2000:13:55:36 +0000] \"GET /apache_pb.gif?a=\\\"b\\\"\\x0a HTTP/1.0\" 200 2326 \"http://www.example.com/start.html\" \"Mozilla/4.08 [en] (Win98; I ;Nav)\"\n"
        );
        e.bytes = 0;
        e.user = None;
        e.referer = None;
        assert_eq!(
            apache(&e, false),
            "127.0.0.1 - - [10/Oct/2000:13:55:36 +0000] \"GET /apache_pb.gif?a=\\\"b\\\"\\x0a HTTP/1.0\" 200 -\n"
        );
        assert!(apache(&e, true).ends_with(" - \"-\" \"Mozilla/4.08 [en] (Win98; I ;Nav)\"\n"));
        // A template: values escaped, `-` for the absent, headers by name.
        let t = LogTemplate::parse(
            "{client_ip} {method} {path} q={query} {status} {bytes} {scheme} {tls} {request_id} <{header.x-trace}> {1,2}",
        )
        .unwrap();
        let headers = [Some(http::HeaderValue::from_static("t\"1"))];
        e.headers = &headers;
        assert_eq!(
            template(&t, &e),
            "127.0.0.1 GET /apache_pb.gif q=a=\\\"b\\\"\\x0a 200 0 https TLSv1.3 - <t\\\"1> {1,2}\n"
        );
        assert!(LogTemplate::parse("{stauts}").is_err());
        assert!(LogTemplate::parse("{header.}").is_err());
        let v = http::HeaderValue::from_static("Basic ZnJhbms6c2VjcmV0");
        assert_eq!(basic_user(&v).as_deref(), Some("frank"));
        assert_eq!(
            basic_user(&http::HeaderValue::from_static("Bearer x")),
            None
        );
    }
}
