//! Built-in filters, one file each, behind one trait.
//!
//! The pipeline runs a route's filters' request phase in written order, then the
//! handler, then the response phase in reverse order for exactly the filters whose
//! request phase ran (an early answer — 403, 413, 429 — included). Filters decide on
//! the normalised path, never on the raw one. A filter never buffers a body; one that
//! limits it wraps it.

pub mod compress;
pub mod header_down;
pub mod max_body;
pub mod rewrite;
pub mod strip;

use http::{Method, Request, Response, Uri};

use crate::body::Body;
use crate::config::template::Values;

/// One filter of a route, compiled at load.
pub trait Filter: Send + Sync {
    /// Request phase. `Some(response)` answers at once: later filters and the handler
    /// do not run, and the response phase runs for this filter and those before it.
    fn on_request(&self, req: &mut Request<Body>, cx: &mut Cx<'_>) -> Option<Response<Body>> {
        let _ = (req, cx);
        None
    }

    /// Response phase, in reverse order.
    fn on_response(&self, resp: &mut Response<Body>, cx: &Cx<'_>) {
        let _ = (resp, cx);
    }

    /// Whether this filter renders placeholders from the request as received.
    fn uses_placeholders(&self) -> bool {
        false
    }
}

/// What a request carries through the pipeline besides its head: the normalised path
/// filters decide on (and may change), and the placeholder values of the request as
/// received.
pub struct Cx<'a> {
    /// The normalised path when it differs from the request target's path.
    path: Option<String>,
    /// A filter changed the path: the backend gets `path` instead of the target.
    changed: bool,
    /// Changed since the pipeline last normalised it.
    dirty: bool,
    /// Kept only for routes that render placeholders.
    vars: Option<&'a Vars>,
}

impl<'a> Cx<'a> {
    /// `normalized`: the normalised path when it differs from the target's.
    pub fn new(normalized: Option<String>, vars: Option<&'a Vars>) -> Cx<'a> {
        Cx {
            path: normalized,
            changed: false,
            dirty: false,
            vars,
        }
    }

    /// Placeholder values of the request as received (empty for a route that renders
    /// none).
    pub fn values(&self) -> Values<'_> {
        self.vars.map(Vars::values).unwrap_or_default()
    }

    /// The normalised path (as a filter left it).
    pub fn path<'r>(&'r self, req: &'r Request<Body>) -> &'r str {
        self.path.as_deref().unwrap_or_else(|| req.uri().path())
    }

    /// Sets the path the backend will receive; the pipeline normalises it before the
    /// next filter looks.
    pub fn set_path(&mut self, path: String) {
        self.path = Some(path);
        self.changed = true;
        self.dirty = true;
    }

    /// The path a filter set since the last call, to be normalised.
    pub fn take_dirty(&mut self) -> Option<&str> {
        if !std::mem::take(&mut self.dirty) {
            return None;
        }
        self.path.as_deref()
    }

    /// Replaces the path with its normalised form.
    pub fn normalized(&mut self, path: String) {
        self.path = Some(path);
    }

    /// The path a filter set, if any changed it.
    pub fn changed_path(&self) -> Option<&str> {
        self.path.as_deref().filter(|_| self.changed)
    }
}

/// Placeholder values of the request as received, kept only for routes that render
/// them (`Vars::default()` otherwise).
#[derive(Default)]
pub struct Vars {
    pub host: String,
    pub uri: Uri,
    pub method: Method,
    pub client_ip: String,
    pub scheme: &'static str,
}

impl Vars {
    pub fn values(&self) -> Values<'_> {
        Values {
            host: &self.host,
            path: self.uri.path(),
            query: self.uri.query(),
            method: self.method.as_str(),
            client_ip: &self.client_ip,
            scheme: self.scheme,
        }
    }
}
