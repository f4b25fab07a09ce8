//! Stale responses: revalidated with the origin (a conditional request, `304` merged
//! into the stored object), refreshed in the background within
//! `stale-while-revalidate`, and concurrent misses coalesced onto one fetch.

use super::*;

impl Cache {
    /// A stale (or client-refused) stored response: asked again with its validators.
    /// `304` refreshes it; a failure within its `stale-if-error` window serves it;
    /// anything else replaces it.
    pub(super) async fn revalidate<F, Fut>(
        &self,
        mut req: Request<Body>,
        key: String,
        obj: Arc<Stored>,
        by_client: bool,
        rdirs: &RequestDirectives,
        fetch: F,
    ) -> Response<Body>
    where
        F: FnOnce(Request<Body>) -> Fut,
        Fut: Future<Output = Response<Body>>,
    {
        let asked = (req.method(), req.headers(), credentialed(&req));
        let guard = match self
            .coalesce(asked.0, asked.1, asked.2, &key, rdirs, Some(&obj))
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
        conditional(req.headers_mut(), &obj);
        let sent = SystemTime::now();
        let resp = fetch(req).await;
        let fwd = if by_client { "request" } else { "stale" };
        let code = resp.status();
        let status = Status {
            fwd: Some(fwd),
            fwd_status: Some(code.as_u16()),
            ..Status::default()
        };
        if code == StatusCode::NOT_MODIFIED {
            // A HEAD's 304 refreshes the stored GET response as a GET's does.
            let fresh = Arc::new(self.refreshed(&obj, resp.headers(), sent));
            self.store.replace(&key, &obj, fresh.clone());
            return answer(
                self.meter(),
                &asked.method,
                &asked.headers,
                &fresh,
                status,
                Outcome::Revalidated,
            );
        }
        // Only a stale response stands in, and not when the client asked the origin.
        let now = SystemTime::now();
        let stale_for = obj.staleness(now);
        let in_window = !stale_for.is_zero() && stale_for <= obj.sie;
        if code.is_server_error() && in_window && !obj.dirs.never_stale() && !by_client {
            let stale = Status {
                fwd: Some("stale"),
                detail: Some("stale-if-error"),
                ..status
            };
            tracing::debug!(
                "sluice: cache: {key}: the origin answered {}; serving the stored response ({}s stale)",
                code.as_u16(),
                obj.staleness(now).as_secs()
            );
            return answer(
                self.meter(),
                &asked.method,
                &asked.headers,
                &obj,
                stale,
                Outcome::Stale,
            );
        }
        self.keep(key, &asked, resp, sent, guard, status, true)
    }

    /// One origin fetch per key at a time (`lock`), for misses and revalidations alike
    /// (a client's `no-cache` included, DESIGN §18.1): the first request leads and holds
    /// the guard until what it fetched is stored or found not storable; the others wait
    /// for it and are answered from what it stored (`Err`), or go themselves when it
    /// stored nothing newer than `had` in time.
    pub(super) async fn coalesce(
        &self,
        method: &Method,
        headers: &HeaderMap,
        credentialed: bool,
        key: &str,
        rdirs: &RequestDirectives,
        had: Option<&Arc<Stored>>,
    ) -> Result<Option<FlightGuard>, Response<Body>> {
        if method != Method::GET || rdirs.no_store || self.settings.lock.is_zero() {
            return Ok(None);
        }
        let rx = match self.store.join(key) {
            Flight::Leader(g) => return Ok(Some(g)),
            Flight::Follower(rx) => rx,
        };
        store::wait(rx, self.settings.lock).await;
        let (Some(obj), _) = self.find(key, headers, credentialed) else {
            return Ok(None);
        };
        // Stored since this request began waiting (a disk store's write swaps the
        // object in place without making it newer).
        let newer = had.is_none_or(|h| obj.response_time > h.response_time);
        let now = SystemTime::now();
        let usable = match verdict(&obj, rdirs, now) {
            Verdict::Fresh => true,
            // Asked again for this client: what the leader just brought is the
            // origin's word.
            Verdict::Revalidate(true) => newer && obj.is_fresh(now),
            _ => false,
        };
        if usable {
            // It went forward with the leader's request: a miss collapsed into that
            // one, not a hit (RFC 9211).
            let status = Status {
                fwd: Some(if had.is_some() { "stale" } else { "uri-miss" }),
                collapsed: true,
                ..Status::default()
            };
            return Err(answer(
                self.meter(),
                method,
                headers,
                &obj,
                status,
                Outcome::Collapsed,
            ));
        }
        Ok(None)
    }

    /// A stale response inside its `stale-while-revalidate` window: one refresh per key
    /// runs in the background while the stale one is served.
    pub(super) fn background<R>(
        &self,
        key: &str,
        obj: &Arc<Stored>,
        req: &Request<Body>,
        refresh: R,
    ) where
        R: FnOnce(Request<Body>) -> Refresh,
    {
        let Flight::Leader(guard) = self.store.join(key) else {
            return;
        };
        let mut again = Request::new(Body::Empty);
        *again.uri_mut() = req.uri().clone();
        *again.headers_mut() = req.headers().clone();
        again.headers_mut().remove(header::RANGE);
        conditional(again.headers_mut(), obj);
        let asked = Asked {
            method: Method::GET,
            headers: req.headers().clone(),
            credentialed: credentialed(req),
            count: false,
        };
        let fut = refresh(again);
        let (this, key, obj) = (self.clone(), key.to_string(), obj.clone());
        tokio::spawn(async move {
            let sent = SystemTime::now();
            let resp = fut.await;
            if resp.status() == StatusCode::NOT_MODIFIED {
                let fresh = Arc::new(this.refreshed(&obj, resp.headers(), sent));
                this.store.replace(&key, &obj, fresh);
                return;
            }
            if resp.status().is_server_error() {
                return;
            }
            let resp = this.keep(
                key,
                &asked,
                resp,
                sent,
                Some(guard),
                Status::default(),
                true,
            );
            // Read to the end: the body is stored as it passes.
            let mut body = resp.into_body();
            while let Some(Ok(_)) = http_body_util::BodyExt::frame(&mut body).await {}
        });
    }

    /// `obj` after a `304`: its fields updated from the answer's (RFC 9111 §4.3.4),
    /// its age and lifetime counted anew.
    pub(super) fn refreshed(&self, obj: &Stored, fields: &HeaderMap, sent: SystemTime) -> Stored {
        let mut headers = obj.headers.clone();
        for name in fields.keys() {
            if KEPT_ON_304.contains(name) || *name == CACHE_STATUS || name == "content-md5" {
                continue;
            }
            headers.remove(name);
            for v in fields.get_all(name) {
                headers.append(name.clone(), v.clone());
            }
        }
        let came = SystemTime::now();
        let merged = headers.clone();
        let arrival = Arrival {
            dirs: ResponseDirectives::of(&merged),
            fields: &merged,
            came,
            age: control::initial_age(fields, sent, came),
        };
        unstored(&mut headers, &ResponseDirectives::of(fields));
        self.stored(
            obj.status,
            headers,
            obj.body.clone(),
            arrival,
            obj.vary.clone(),
        )
    }
}

/// The request's validators become the stored response's: its `ETag` and
/// `Last-Modified` are asked about, and the client's own conditions and ranges are
/// answered by the cache afterwards.
pub(super) fn conditional(h: &mut HeaderMap, obj: &Stored) {
    for name in [
        header::IF_NONE_MATCH,
        header::IF_MODIFIED_SINCE,
        header::IF_RANGE,
        header::RANGE,
    ] {
        h.remove(name);
    }
    let (etag, modified) = control::validators(&obj.headers);
    if let Some(t) = etag {
        h.insert(header::IF_NONE_MATCH, t.clone());
    }
    if let Some(m) = modified {
        h.insert(header::IF_MODIFIED_SINCE, m.clone());
    }
}
