//! `grpc_web`: a gRPC-Web call (`application/grpc-web…`, from any client protocol)
//! goes on as gRPC, and its answer is marked for the pipeline, which translates it
//! back once the call's status is watched (`crate::grpc::web`). Other requests pass
//! untouched.

use http::{Request, Response};

use super::{Cx, Filter, Step};
use crate::body::Body;
use crate::grpc::web;

pub(crate) struct GrpcWeb;

impl Filter for GrpcWeb {
    fn on_request(&self, req: &mut Request<Body>, cx: &mut Cx<'_>) -> Step {
        if let Some(mode) = web::mode_of(req) {
            web::to_grpc(req, mode);
            cx.grpc_web = Some(mode);
        }
        Step::Pass
    }

    fn on_response(&self, resp: &mut Response<Body>, cx: &Cx<'_>) {
        if let Some(mode) = cx.grpc_web {
            resp.extensions_mut().insert(mode);
        }
    }
}
