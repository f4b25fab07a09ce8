//! `allow CIDR...` and `deny CIDR...`: the client's address (after `trust`) decides;
//! a refusal is `403` (counted in `sluice_access_denied_total`).
//! Results for branches: `allowed`, `denied`.

use http::{Request, StatusCode};
use ipnet::IpNet;

use super::cond::in_nets;
use super::{Cx, Filter, Step};
use crate::body::Body;
use crate::reply::local_response;
use crate::stats::{bump, COUNTERS};

pub(crate) struct Access {
    pub nets: Vec<IpNet>,
    /// `allow`: only these; `deny`: all but these.
    pub allow: bool,
}

impl Filter for Access {
    fn on_request(&self, _: &mut Request<Body>, cx: &mut Cx<'_>) -> Step {
        if in_nets(&self.nets, cx.client_ip) == self.allow {
            return Step::Pass;
        }
        bump(&COUNTERS.access_denied);
        Step::answer(local_response(StatusCode::FORBIDDEN, "Forbidden\n"))
    }

    fn uses_client_ip(&self) -> bool {
        true
    }
}
