//! `header_down NAME VALUE | -NAME` on a route: sets or removes a response field after
//! the handler answered (a proxy's own `header_down` lines ran before, inside it).

use http::Response;

use super::{Cx, Filter};
use crate::body::Body;
use crate::config::HeaderOp;

pub(crate) struct HeaderDown {
    pub op: HeaderOp,
}

impl Filter for HeaderDown {
    fn on_response(&self, resp: &mut Response<Body>, cx: &Cx<'_>) {
        self.op.apply(resp.headers_mut(), &cx.values());
    }

    fn uses_placeholders(&self) -> bool {
        self.op.has_placeholders()
    }
}
