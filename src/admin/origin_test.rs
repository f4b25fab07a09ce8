//! Origin tests on demand (DESIGN §15.3, §15.8): `POST /origin-test {"pool": NAME,
//! "role": "primary|backup"}` starts one in the background and answers `202 {"id"}`;
//! `GET /origin-test/ID` shows it, pending or done. Per pool, one runs at a time and at
//! most six start in any 60 s (`429` past that; a refused call does not count). The
//! last 100 results are kept.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::upstream::origin::Report;
use crate::upstream::{Pool, Role};

/// How many results are kept.
const KEEP: usize = 100;
/// Starts allowed per pool in [`WINDOW`].
const PER_WINDOW: usize = 6;
const WINDOW: Duration = Duration::from_secs(60);

#[derive(Default)]
pub(crate) struct OriginTests {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    /// (id, result once done), oldest first.
    results: VecDeque<(String, Arc<Mutex<Option<Report>>>)>,
    /// Per pool name: whether one runs now, and when the recent ones started.
    pools: HashMap<String, (bool, VecDeque<Instant>)>,
}

/// Lets the pool's next test start when a test ends — also one that panicked or was
/// dropped, which would otherwise hold the pool at `429` until restart.
struct Done {
    tests: Arc<OriginTests>,
    pool: String,
}

impl Drop for Done {
    fn drop(&mut self) {
        let mut inner = self.tests.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((running, _)) = inner.pools.get_mut(&self.pool) {
            *running = false;
        }
    }
}

/// Why a test was not started.
pub(crate) enum Refused {
    /// One runs for this pool now, or six started in the last minute: seconds to wait.
    Busy(u64),
}

impl OriginTests {
    /// Starts a test of `pool`'s `role`; its id.
    pub(crate) fn start(self: &Arc<Self>, pool: Arc<Pool>, role: Role) -> Result<String, Refused> {
        let now = Instant::now();
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (running, starts) = inner.pools.entry(pool.name().to_string()).or_default();
        while starts
            .front()
            .is_some_and(|t| now.duration_since(*t) >= WINDOW)
        {
            starts.pop_front();
        }
        if *running {
            return Err(Refused::Busy(1));
        }
        if starts.len() >= PER_WINDOW {
            let wait = WINDOW.saturating_sub(now.duration_since(starts[0]));
            return Err(Refused::Busy(wait.as_secs().max(1)));
        }
        *running = true;
        starts.push_back(now);
        inner.next += 1;
        let id = format!("{:x}-{}", inner.next, role.as_str());
        let slot = Arc::new(Mutex::new(None));
        if inner.results.len() == KEEP {
            inner.results.pop_front();
        }
        inner.results.push_back((id.clone(), slot.clone()));
        drop(inner);
        let done = Done {
            tests: self.clone(),
            pool: pool.name().to_string(),
        };
        tokio::spawn(async move {
            let _done = done;
            let report = pool.test_origin(role).await;
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = report;
        });
        Ok(id)
    }

    /// The test `id` as JSON, pending or done; `None` when no kept test has that id.
    pub(crate) fn get(&self, id: &str) -> Option<Value> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (_, slot) = inner.results.iter().find(|(i, _)| i == id)?;
        let done = slot.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Some(match done {
            None => json!({"state": "pending"}),
            Some(r) => json!({
                "state": "done",
                "address": r.address,
                "latency_ms": r.latency_ms,
                "status": r.status,
                "tls_result": r.tls_result,
                "failure": r.failure,
            }),
        })
    }
}
