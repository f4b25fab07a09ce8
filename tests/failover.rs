//! Active-passive failover over real sockets (DESIGN.md §8.5, §14): a full cycle
//! primary → backup → primary with both origin headers, a failed trial restarting the
//! hold, the backup failing back early, and an unreachable primary switching at once.

mod common;

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

async fn switchable(name: &'static str) -> (Backend, Arc<AtomicU16>) {
    let status = Arc::new(AtomicU16::new(200));
    let st = status.clone();
    let b = Backend::start(move |_req: Request<Incoming>| {
        let st = st.clone();
        async move {
            let mut r = Response::new(full(name));
            *r.status_mut() = StatusCode::from_u16(st.load(Ordering::SeqCst)).unwrap();
            r
        }
    })
    .await;
    (b, status)
}

/// (status, body, X-Sluice-Origin, X-Sluice-Origin-Transition)
async fn hit(s: &Sluice) -> (u16, String, String, String) {
    let r = get(s.addr, "/").await;
    let h = |k: &str| r.header(k).unwrap_or("-").to_string();
    (
        r.status,
        r.text(),
        h("x-sluice-origin"),
        h("x-sluice-origin-transition"),
    )
}

fn t(status: u16, body: &str, origin: &str, transition: &str) -> (u16, String, String, String) {
    (status, body.into(), origin.into(), transition.into())
}

const POLICY: &str =
    "failover { failure_threshold 2; recovery_threshold 2; hold_down 5s; failback_delay 5s }
        origin_headers on";

#[tokio::test]
async fn a_full_cycle_with_a_failed_trial() {
    let (p, p_status) = switchable("primary").await;
    let (b, _) = switchable("backup").await;
    let s = Sluice::start(&format!(
        "site * {{ proxy {} {{ backup {}\n {POLICY} }} }}",
        p.addr, b.addr
    ));
    assert_eq!(hit(&s).await, t(200, "primary", "primary", "none"));
    p_status.store(500, Ordering::SeqCst);
    assert_eq!(
        hit(&s).await,
        t(500, "primary", "primary", "none"),
        "one failure of two"
    );
    assert_eq!(
        hit(&s).await,
        t(500, "primary", "primary", "primary_failure_threshold"),
        "the response whose outcome caused the switch names it"
    );
    s.wait_log(
        "switched to backup (primary_failure_threshold: 2 failures of its primaries in a row)",
    );
    let switched = Instant::now();
    for _ in 0..12 {
        assert_eq!(
            hit(&s).await,
            t(200, "backup", "backup", "none"),
            "held on backup"
        );
    }
    tokio::time::sleep(
        Duration::from_secs(5).saturating_sub(switched.elapsed()) + Duration::from_millis(100),
    )
    .await;
    // The hold is over: every 10th request is a trial of the primary, which fails.
    let mut seen = Vec::new();
    for _ in 0..10 {
        seen.push(hit(&s).await);
    }
    assert_eq!(
        seen[9],
        t(500, "primary", "primary", "none"),
        "the 10th is a trial: {seen:?}"
    );
    assert!(seen[..9].iter().all(|r| r.2 == "backup"));
    let restarted = Instant::now();
    p_status.store(200, Ordering::SeqCst);
    for _ in 0..20 {
        assert_eq!(
            hit(&s).await.2,
            "backup",
            "a failed trial restarted the hold: no trials"
        );
    }
    tokio::time::sleep(
        Duration::from_secs(5).saturating_sub(restarted.elapsed()) + Duration::from_millis(100),
    )
    .await;
    let mut seen = Vec::new();
    for _ in 0..20 {
        seen.push(hit(&s).await);
    }
    assert_eq!(
        seen[9],
        t(200, "primary", "primary", "none"),
        "one good trial of two"
    );
    assert_eq!(
        seen[19],
        t(200, "primary", "primary", "primary_recovery_threshold"),
        "the second good trial switches back: {seen:?}"
    );
    assert_eq!(hit(&s).await, t(200, "primary", "primary", "none"));
    s.wait_log(
        "switched to primary (primary_recovery_threshold: 2 successes of its primaries in a row)",
    );
}

#[tokio::test]
async fn a_failing_backup_returns_the_role_early() {
    let (p, p_status) = switchable("primary").await;
    let (b, b_status) = switchable("backup").await;
    let s = Sluice::start(&format!(
        "site * {{ proxy {} {{ backup {}\n {POLICY} }} }}",
        p.addr, b.addr
    ));
    p_status.store(503, Ordering::SeqCst);
    hit(&s).await;
    assert_eq!(hit(&s).await.3, "primary_failure_threshold");
    b_status.store(502, Ordering::SeqCst);
    assert_eq!(hit(&s).await, t(502, "backup", "backup", "none"));
    assert_eq!(
        hit(&s).await,
        t(502, "backup", "backup", "backup_failure"),
        "the backup failed twice while the primary is eligible"
    );
    assert_eq!(hit(&s).await.2, "primary");
}

#[tokio::test]
async fn an_unreachable_primary_switches_at_once() {
    let dead = dead_addr().await;
    let (b, _) = switchable("backup").await;
    let s = Sluice::start(&format!(
        "site * {{ proxy {dead} {{ backup {}\n {POLICY} }} }}",
        b.addr
    ));
    assert_eq!(
        hit(&s).await,
        t(200, "backup", "backup", "primary_failure_threshold"),
        "the primary out of rotation: the backup serves this very request"
    );
    assert_eq!(hit(&s).await, t(200, "backup", "backup", "none"));
}

#[tokio::test]
async fn with_health_checks_probes_decide_recovery() {
    let (p, p_status) = switchable("primary").await;
    let (b, _) = switchable("backup").await;
    let s = Sluice::start(&format!(
        "site * {{ proxy {} {{
            backup {}
            {POLICY}
            health / {{ interval 1s; timeout 500ms; rise 1; fall 1 }}
        }} }}",
        p.addr, b.addr
    ));
    p_status.store(500, Ordering::SeqCst);
    let end = Instant::now() + WAIT;
    while !s
        .logs()
        .contains(&format!("{} failed its health check", p.addr))
    {
        assert!(Instant::now() < end, "the probe never failed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        hit(&s).await,
        t(200, "backup", "backup", "primary_failure_threshold"),
        "no eligible primary: switched at once"
    );
    p_status.store(200, Ordering::SeqCst);
    // No trials with probes: requests stay on the backup until the probes say so.
    let end = Instant::now() + Duration::from_secs(15);
    let mut seen = Vec::new();
    loop {
        let r = hit(&s).await;
        if r.2 == "primary" {
            assert_eq!(
                r.3, "primary_recovery_threshold",
                "the response after a switch made by probes names it"
            );
            break;
        }
        assert!(Instant::now() < end, "never switched back: {seen:?}");
        seen.push(r);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen.iter().all(|r| r.2 == "backup" && r.3 == "none"));
    assert_eq!(hit(&s).await, t(200, "primary", "primary", "none"));
}

/// Every balancing policy (with and without `slow_start`) × a dead primary set × the
/// backups: the request that finds the primaries down is served by a backup, and so
/// is every request after it — never a panic, never a 502 (a balancer sized from the
/// primaries only panicked on the backups; `hash` answered 502 there).
#[tokio::test]
async fn every_policy_serves_from_the_backups_when_the_primaries_die() {
    let (d1, d2) = (dead_addr().await, dead_addr().await);
    let (b1, _) = switchable("backup").await;
    let (b2, _) = switchable("backup").await;
    let policies = [
        "first",
        "round_robin",
        "weighted_round_robin\n weights 3 1",
        "least_conn",
        "weighted_least_conn\n weights 3 1",
        "p2c",
        "hash client_ip",
        "hash uri",
        "hash header x-user",
        "hash cookie session",
    ];
    let mut sites = String::new();
    let mut hosts = Vec::new();
    for (k, lb) in policies.iter().enumerate() {
        for slow in ["", "slow_start 10s"] {
            let host = format!("p{k}{}.test", if slow.is_empty() { "" } else { "s" });
            sites += &format!(
                "site {host} {{ proxy {d1} {d2} {{ lb {lb}\n {slow}\n backup {} {}\n origin_headers on }} }}\n",
                b1.addr, b2.addr
            );
            hosts.push((host, *lb, slow));
        }
    }
    let s = Sluice::start(&sites);
    for (host, lb, slow) in &hosts {
        for n in 0..6 {
            let r = request(
                s.addr,
                "GET",
                &format!("/item/{n}"),
                &[
                    ("host", host.as_str()),
                    ("x-user", &format!("u{n}")),
                    ("cookie", &format!("session=s{n}")),
                ],
                b"",
            )
            .await;
            assert_eq!(
                (r.status, r.text(), r.header("x-sluice-origin")),
                (200, "backup".to_string(), Some("backup")),
                "lb {lb} {slow}: request {n} with every primary dead"
            );
            if n == 0 {
                assert_eq!(
                    r.header("x-sluice-origin-transition"),
                    Some("primary_failure_threshold"),
                    "lb {lb} {slow}: the request that caused the switch names it"
                );
            }
        }
    }
    s.wait_log("switched to backup (primary_failure_threshold: every primary is ineligible)");
    assert!(
        !s.logs().contains("no peer of the other role"),
        "the switch names the reason that happened"
    );
}

/// `/status` names the last switch (its reason and time) and, on the backups, when
/// failback may come; the access log's `role` and `transition` say the same per request.
#[tokio::test]
async fn the_switch_shows_in_status() {
    let dead = dead_addr().await;
    let (b, _) = switchable("backup").await;
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0 }}\nsite * {{ proxy {dead} {{ backup {}\n {POLICY} }} }}",
        b.addr
    ));
    let admin = s.admin();
    let before: serde_json::Value =
        serde_json::from_str(&get(admin, "/status").await.text()).unwrap();
    let pool = &before["pools"][0];
    assert_eq!(
        (&pool["role"], &pool["last_switch"], &pool["failback_at"]),
        (
            &"primary".into(),
            &serde_json::Value::Null,
            &serde_json::Value::Null
        )
    );
    assert_eq!(hit(&s).await.2, "backup");
    let after: serde_json::Value =
        serde_json::from_str(&get(admin, "/status").await.text()).unwrap();
    let pool = &after["pools"][0];
    assert_eq!(pool["role"], "backup");
    assert_eq!(pool["last_switch"]["reason"], "primary_failure_threshold");
    let at = pool["last_switch"]["at"].as_str().unwrap().to_string();
    let failback = pool["failback_at"].as_str().unwrap().to_string();
    assert!(at.len() == 24 && at.ends_with('Z'), "RFC 3339: {at}");
    // hold_down 5s: failback no sooner than five seconds after the switch (fixed-width
    // RFC 3339 strings compare as times).
    assert!(failback > at, "{at} then {failback}");
}

/// Failover counts a request's final outcome once: a retry that succeeds records no
/// failure (with `failure_threshold 1`, the request the retry saved does not switch the
/// pool), and a request whose every attempt failed records one failure, not one per
/// attempt.
#[tokio::test]
async fn failover_evidence_is_per_request() {
    let (p1, p1_status) = switchable("p1").await;
    let (p2, p2_status) = switchable("p2").await;
    let (b, _) = switchable("backup").await;
    let s = Sluice::start(&format!(
        "site * {{ proxy {} {} {{ backup {}\n lb first\n retries 1\n retry_on 503\n failover {{ failure_threshold 2; hold_down 5s; failback_delay 5s }}\n origin_headers on }} }}",
        p1.addr, p2.addr, b.addr
    ));
    p1_status.store(503, Ordering::SeqCst);
    // p1 answers 503, the retry on p2 succeeds: three such requests, no switch.
    for _ in 0..3 {
        assert_eq!(hit(&s).await, t(200, "p2", "primary", "none"));
    }
    // Both primaries fail: each request is one failure, so the first stays on the
    // primaries (its answer is p2's 503) and the second switches.
    p2_status.store(503, Ordering::SeqCst);
    assert_eq!(hit(&s).await, t(503, "p2", "primary", "none"));
    assert_eq!(
        hit(&s).await,
        t(503, "p2", "primary", "primary_failure_threshold"),
        "the second failed request reaches failure_threshold 2"
    );
    assert_eq!(hit(&s).await, t(200, "backup", "backup", "none"));
}

/// The request that reaches `failure_threshold` is served by the new role, whatever the
/// peer's own breaker says (DESIGN §18.4): with `breaker 3` or `fail_duration 0s` the
/// dead primary stays eligible, so no pick ever finds every primary down; the switch is
/// decided when the attempt fails, the request goes to the backup once, and its
/// response names the transition.
#[tokio::test]
async fn the_request_that_trips_the_switch_is_served_by_the_backup() {
    for passive in ["breaker 3", "fail_duration 0s"] {
        let dead = dead_addr().await;
        let (b, _) = switchable("backup").await;
        let s = Sluice::start(&format!(
            "site * {{ proxy {dead} {{ backup {}\n {passive}\n failover {{ failure_threshold 1; hold_down 5s }}\n origin_headers on }} }}",
            b.addr
        ));
        assert_eq!(
            hit(&s).await,
            t(200, "backup", "backup", "primary_failure_threshold"),
            "{passive}: the request that switched the pool"
        );
        assert_eq!(
            hit(&s).await,
            t(200, "backup", "backup", "none"),
            "{passive}"
        );
    }
}

/// A failed trial of a recovering primary restarts the hold even when the request is
/// then served by a backup (`retry_on 503`): 30 quick requests after the hold make one
/// trial, not one in ten (DESIGN §18.4).
#[tokio::test]
async fn a_failed_trial_restarts_the_hold_even_when_a_retry_saves_the_request() {
    let (p, p_status) = switchable("primary").await;
    let (b, _) = switchable("backup").await;
    let s = Sluice::start(&format!(
        "site * {{ proxy {} {{ backup {}\n retries 1\n retry_on 503\n failover {{ failure_threshold 1; hold_down 5s; failback_delay 5s }}\n origin_headers on }} }}",
        p.addr, b.addr
    ));
    p_status.store(503, Ordering::SeqCst);
    let first = hit(&s).await;
    assert_eq!(first.3, "primary_failure_threshold", "{first:?}");
    tokio::time::sleep(Duration::from_millis(5100)).await;
    let before = p.requests.load(Ordering::SeqCst);
    for _ in 0..30 {
        assert_eq!(hit(&s).await.0, 200, "a backup serves, or saves a trial");
    }
    assert_eq!(
        p.requests.load(Ordering::SeqCst) - before,
        1,
        "one trial, then the hold again"
    );
}
