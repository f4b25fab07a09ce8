//! Filling a cache: a miss goes to the handler and what may be stored is kept as it
//! streams to the client; a request that may not be answered from it passes, and an
//! unsafe method invalidates what it names.

use super::*;

impl Cache {
    /// A method the cache does not answer: forwarded; an unsafe one that succeeds
    /// invalidates what is stored for its target and the targets its `Location` and
    /// `Content-Location` name on the same host (RFC 9111 §4.4), over either scheme.
    pub(super) async fn pass<F, Fut>(
        &self,
        req: Request<Body>,
        host: &str,
        fetch: F,
    ) -> Response<Body>
    where
        F: FnOnce(Request<Body>) -> Fut,
        Fut: Future<Output = Response<Body>>,
    {
        let unsafe_method = !matches!(
            *req.method(),
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
        );
        let is_method = req.method() != Method::GET && req.method() != Method::HEAD;
        let target = unsafe_method.then(|| self.target(req.uri()).to_string());
        let resp = fetch(req).await;
        Outcome::Bypass.count(self.meter());
        if let Some(target) = target {
            let s = resp.status();
            if s.is_success() || s.is_redirection() {
                self.invalidate(host, &target);
                for name in [header::LOCATION, header::CONTENT_LOCATION] {
                    let named = resp.headers().get(name);
                    if let Some(uri) = named.and_then(|v| same_host(v, host)) {
                        self.invalidate(host, self.target(&uri));
                    }
                }
            }
        }
        mark(
            resp,
            Status::fwd(if is_method { "method" } else { "bypass" }),
        )
    }

    /// Drops what is stored for `target` on `host` over either scheme: every header or
    /// cookie variant of it.
    pub(super) fn invalidate(&self, host: &str, target: &str) {
        for scheme in ["http", "https"] {
            let base = self.base_key(scheme, host, target);
            if self.keys_have_fields() {
                let under = format!("{base} ");
                self.store.purge(|k| k == base || k.starts_with(&under));
            } else {
                self.store.remove(&base);
            }
        }
    }

    /// Nothing usable stored: one fetch per key at a time (`lock`), the others waiting
    /// for it and answered from what it stored.
    pub(super) async fn miss<F, Fut>(
        &self,
        req: Request<Body>,
        key: String,
        why: &'static str,
        rdirs: &RequestDirectives,
        fetch: F,
    ) -> Response<Body>
    where
        F: FnOnce(Request<Body>) -> Fut,
        Fut: Future<Output = Response<Body>>,
    {
        let no_store = rdirs.no_store;
        let guard = match self
            .coalesce(
                req.method(),
                req.headers(),
                credentialed(&req),
                &key,
                rdirs,
                None,
            )
            .await
        {
            Ok(guard) => guard,
            Err(answered) => return answered,
        };
        let asked = Asked {
            method: req.method().clone(),
            headers: req.headers().clone(),
            credentialed: credentialed(&req),
            count: true,
        };
        let sent = SystemTime::now();
        let resp = fetch(req).await;
        let mut status = Status::fwd(why);
        if no_store {
            status.fwd = Some("bypass");
        }
        self.keep(key, &asked, resp, sent, guard, status, !no_store)
    }

    /// A stored object of a response's parts, with the times it was asked and came.
    pub(super) fn stored(
        &self,
        status: StatusCode,
        headers: HeaderMap,
        body: Held,
        arrival: Arrival<'_>,
        vary: Box<[(String, Option<String>)]>,
    ) -> Stored {
        let Arrival {
            fields,
            dirs,
            came,
            age,
        } = arrival;
        let rules = &self.settings.rules;
        // `s-maxage` means "revalidate when stale" for a shared cache (RFC 9111
        // §5.2.2.10): only the response's own stale windows apply then.
        let config = |d: Duration| {
            if dirs.s_maxage.is_some() {
                Duration::ZERO
            } else {
                d
            }
        };
        let window = |own: Option<control::Delta>, setting: Duration| {
            own.map_or(config(setting), |d| Duration::from_secs(d.secs()))
        };
        Stored {
            lifetime: control::lifetime(status, fields, &dirs, came, rules),
            initial_age: age,
            swr: window(dirs.stale_while_revalidate, self.settings.swr),
            sie: window(dirs.stale_if_error, self.settings.sie),
            status,
            headers,
            body,
            response_time: came,
            dirs,
            vary,
        }
    }

    /// The handler's response, stored as it streams to the client when it may be;
    /// `status` is what `Cache-Status` says so far.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn keep(
        &self,
        key: String,
        asked: &Asked,
        mut resp: Response<Body>,
        sent: SystemTime,
        guard: Option<FlightGuard>,
        mut status: Status,
        may_store: bool,
    ) -> Response<Body> {
        let came = SystemTime::now();
        let why_not = self.why_not_store(asked, &resp, may_store);
        if let Some(why) = why_not {
            tracing::trace!("sluice: cache: {key}: not stored: {why}");
            let bypass = asked.credentialed || status.fwd == Some("bypass");
            match (asked.count, bypass) {
                (false, _) => {}
                (true, true) => Outcome::Bypass.count(self.meter()),
                (true, false) => Outcome::Miss.count(self.meter()),
            }
            drop(guard);
            return mark(resp, status);
        }
        if asked.count {
            Outcome::Miss.count(self.meter());
        }
        let head = self.head_of(asked, resp.headers(), resp.status(), (sent, came));
        status.stored = true;
        status.ttl = Some(head.ttl(came));
        let pending = Pending {
            store: self.store.clone(),
            key,
            head,
            _guard: guard,
        };
        let bodiless = matches!(resp.status().as_u16(), 204 | 304) || asked.method == Method::HEAD;
        let expected = resp
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let body = std::mem::replace(resp.body_mut(), Body::Empty);
        *resp.body_mut() = match body {
            _ if bodiless => {
                pending.commit(Bytes::new());
                Body::Empty
            }
            body if http_body::Body::is_end_stream(&body) => {
                pending.commit(Bytes::new());
                body
            }
            Body::Full(Some(b)) => {
                pending.commit(b.clone());
                Body::Full(Some(b))
            }
            body => fill(Tee {
                inner: body,
                parts: Vec::new(),
                len: 0,
                limit: self.settings.max_object,
                expected,
                pending: Some(pending),
            }),
        };
        mark(resp, status)
    }

    /// What is stored of a response's head: its fields without those that are the
    /// hop's, this cache's, or that `no-cache="…"`/`private="…"` keep out; the
    /// request's values of the fields it varies on.
    pub(super) fn head_of(
        &self,
        asked: &Asked,
        fields: &HeaderMap,
        code: StatusCode,
        (sent, came): (SystemTime, SystemTime),
    ) -> Stored {
        let dirs = ResponseDirectives::of(fields);
        let mut headers = fields.clone();
        unstored(&mut headers, &dirs);
        let vary: Box<[_]> = control::vary_fields(fields)
            .map(|f| {
                let v = joined(&asked.headers, &f);
                (f, v)
            })
            .collect();
        let arrival = Arrival {
            fields,
            dirs,
            came,
            age: control::initial_age(fields, sent, came),
        };
        self.stored(code, headers, Held::Memory(Bytes::new()), arrival, vary)
    }

    /// Why a response is not stored, or `None` when it is.
    pub(super) fn why_not_store(
        &self,
        asked: &Asked,
        resp: &Response<Body>,
        may_store: bool,
    ) -> Option<&'static str> {
        if !may_store {
            return Some("the request said no-store");
        }
        if asked.method != Method::GET {
            return Some("only GET responses are stored");
        }
        if crate::reply::is_own(resp) {
            return Some("sluice's own answer");
        }
        let rdirs = RequestDirectives::of(&asked.headers);
        let dirs = ResponseDirectives::of(resp.headers());
        if let Err(why) = control::storable(
            asked.credentialed,
            &rdirs,
            resp.status(),
            resp.headers(),
            &dirs,
            &self.settings.rules,
        ) {
            return Some(why);
        }
        let len = resp
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if len.is_some_and(|n| n > self.settings.max_object) {
            return Some("larger than max_object");
        }
        // Kept only if it can serve again: fresh for a while, revalidated cheaply,
        // served stale in a window, or by a mode that serves what is stored.
        let st = &self.settings;
        let useful = control::lifetime(
            resp.status(),
            resp.headers(),
            &dirs,
            SystemTime::now(),
            &st.rules,
        ) > Duration::ZERO
            || control::validators(resp.headers()) != (None, None)
            || !st.swr.is_zero()
            || !st.sie.is_zero()
            || dirs.stale_while_revalidate.is_some()
            || dirs.stale_if_error.is_some()
            || st.mode != CacheMode::Normal;
        if !useful {
            return Some("it could never be served again (no freshness, no validator)");
        }
        None
    }
}

/// Removes from fields about to be stored what must not be: the hop's, this cache's,
/// `Set-Cookie` (one visitor's cookie must never reach the next; the response that
/// set it passed to its own client), and what `no-cache="…"` / `private="…"` name
/// (`dirs`: the directives of the response the fields came with).
pub(super) fn unstored(headers: &mut HeaderMap, dirs: &ResponseDirectives) {
    for name in [
        header::AGE,
        header::TRANSFER_ENCODING,
        header::CONNECTION,
        header::SET_COOKIE,
    ] {
        headers.remove(name);
    }
    headers.remove(&CACHE_STATUS);
    headers.remove(&control::SURROGATE_CONTROL);
    for f in &dirs.unstored_fields {
        headers.remove(f.as_str());
    }
}

/// A response on its way into the store once its body has passed whole.
pub(super) struct Pending {
    pub(super) store: Arc<Store>,
    pub(super) key: String,
    pub(super) head: Stored,
    /// Followers of the key's fetch wake when this goes (stored or not).
    pub(super) _guard: Option<FlightGuard>,
}

impl Pending {
    pub(super) fn commit(self, body: Bytes) {
        let Pending {
            store,
            key,
            mut head,
            _guard,
        } = self;
        let declared = head
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n != body.len() as u64) {
            return;
        }
        head.headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        head.body = Held::Memory(body);
        store.put(&key, Arc::new(head));
    }
}
