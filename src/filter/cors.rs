//! `cors { origins …; methods …; headers …; credentials on|off; max_age D }`: answers
//! a browser's preflight itself (`204` with what the origin may do, or `403` for an
//! origin not on the list) and marks the actual responses for an allowed origin.
//! Every response of a cors route carries `Vary: Origin`, so a cache never hands one
//! origin's answer to another.

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};

use super::{Cx, Filter, Step};
use crate::body::Body;
use crate::config::Cors as Config;
use crate::reply::local_response;

pub(crate) struct Cors {
    cfg: Config,
    /// `Access-Control-Allow-Methods` / `-Headers` / `-Max-Age`, rendered once.
    methods: HeaderValue,
    headers: Option<HeaderValue>,
    max_age: Option<HeaderValue>,
}

impl Cors {
    pub(crate) fn new(cfg: &Config) -> Cors {
        let join = |items: Vec<&str>| HeaderValue::from_str(&items.join(", ")).ok();
        Cors {
            methods: join(cfg.methods.iter().map(Method::as_str).collect())
                .unwrap_or(HeaderValue::from_static("GET, HEAD, POST")),
            headers: (!cfg.headers.is_empty())
                .then(|| join(cfg.headers.iter().map(|h| h.as_str()).collect()))
                .flatten(),
            max_age: cfg.max_age.map(|d| HeaderValue::from(d.as_secs())),
            cfg: cfg.clone(),
        }
    }

    /// Whether `origin` may read responses.
    fn allows(&self, origin: &str) -> bool {
        if self.cfg.any {
            return true;
        }
        let origin = origin.to_ascii_lowercase();
        if self.cfg.origins.contains(&origin) {
            return true;
        }
        // A wildcard admits HTTPS origins only: a plain-HTTP subdomain can be written
        // into by anyone on the path.
        let Some(rest) = origin.strip_prefix("https://") else {
            return false;
        };
        // The host, without a port.
        let host = match rest.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => rest,
        };
        self.cfg
            .suffixes
            .iter()
            .any(|s| host.len() > s.len() && host.ends_with(s.as_str()))
    }

    /// What goes in `Access-Control-Allow-Origin` for `origin`.
    fn allow_origin(&self, origin: &HeaderValue) -> HeaderValue {
        if self.cfg.any && !self.cfg.credentials {
            HeaderValue::from_static("*")
        } else {
            origin.clone()
        }
    }
}

impl Filter for Cors {
    fn on_request(&self, req: &mut Request<Body>, cx: &mut Cx<'_>) -> Step {
        let Some(origin) = req.headers().get(header::ORIGIN) else {
            return Step::Pass;
        };
        let allowed = origin.to_str().is_ok_and(|o| self.allows(o));
        let preflight = req.method() == Method::OPTIONS
            && req
                .headers()
                .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
        if !preflight {
            if allowed {
                cx.cors_origin = Some(self.allow_origin(origin));
            }
            return Step::Pass;
        }
        let method_ok = req
            .headers()
            .get(header::ACCESS_CONTROL_REQUEST_METHOD)
            .and_then(|m| Method::from_bytes(m.as_bytes()).ok())
            .is_some_and(|m| self.cfg.methods.contains(&m));
        if !allowed || !method_ok {
            tracing::debug!("sluice: cors: refused a preflight from {origin:?}");
            return Step::answer(local_response(
                StatusCode::FORBIDDEN,
                "CORS preflight refused\n",
            ));
        }
        // The response phase keeps what the preflight answer says.
        cx.cors_origin = Some(self.allow_origin(origin));
        let mut r = local_response(StatusCode::NO_CONTENT, "");
        *r.body_mut() = Body::Empty;
        let h = r.headers_mut();
        h.remove(header::CONTENT_TYPE);
        h.remove(header::CONTENT_LENGTH);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            self.allow_origin(origin),
        );
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, self.methods.clone());
        if let Some(v) = &self.headers {
            h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, v.clone());
        }
        if let Some(v) = &self.max_age {
            h.insert(header::ACCESS_CONTROL_MAX_AGE, v.clone());
        }
        if self.cfg.credentials {
            h.insert(
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
        Step::answer(r)
    }

    fn on_response(&self, resp: &mut Response<Body>, cx: &Cx<'_>) {
        let h = resp.headers_mut();
        let varies = h.get_all(header::VARY).iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|x| x.trim().eq_ignore_ascii_case("origin"))
            })
        });
        if !varies {
            h.append(header::VARY, HeaderValue::from_static("Origin"));
        }
        // The filter decides who may read, and with what: not the backend's own fields.
        if cx.cors_origin.is_none() {
            h.remove(header::ACCESS_CONTROL_ALLOW_ORIGIN);
        }
        if cx.cors_origin.is_none() || !self.cfg.credentials {
            h.remove(header::ACCESS_CONTROL_ALLOW_CREDENTIALS);
        }
        if let Some(origin) = &cx.cors_origin {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
            if self.cfg.credentials {
                h.insert(
                    header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                    HeaderValue::from_static("true"),
                );
            }
        }
    }
}
