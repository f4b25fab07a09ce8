//! `global { proxy_defaults { … } }` and `global { retries off }` (DESIGN §17): options
//! copied into every pool that does not set them, an imported file of defaults alike,
//! and one switch that stops every retry. Over real sockets, with the real binary.

mod common;

use common::*;

/// A pool without its own value takes the default; a pool's own value wins; default
/// `header_up` lines go before a pool's own; `global` may come after the sites; the
/// defaults may come from an imported file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_take_the_defaults_they_do_not_set() {
    let echo = Backend::echo_head().await;
    let dir = TempDir::new();
    dir.write("defaults.conf", "header_up X-Imported yes\n");
    let conf = dir.write(
        "sluice.conf",
        &without_admin(&format!(
            "listen 127.0.0.1:0\n\
             site * {{\n\
               route /own {{ proxy {0} {{ header_up X-Team own }} }}\n\
               route /plain {{ proxy {0} }}\n\
             }}\n\
             global {{ proxy_defaults {{ header_up X-Team default; header_up X-Default yes; import defaults.conf }} }}\n",
            echo.addr
        )),
    );
    let s = Sluice::spawn(&["run", "-c", conf.to_str().unwrap()], dir);
    let plain = get(s.addr, "/plain").await.text();
    assert!(plain.contains("x-team: default\n"), "{plain}");
    assert!(plain.contains("x-default: yes\n"), "{plain}");
    assert!(
        plain.contains("x-imported: yes\n"),
        "an imported file of defaults: {plain}"
    );
    let own = get(s.addr, "/own").await.text();
    assert!(
        own.contains("x-team: own\n") && !own.contains("x-team: default"),
        "the pool's own wins: {own}"
    );
    assert!(own.contains("x-default: yes\n"), "{own}");
}

/// `retries` as a default moves a request that never reached a backend; `global {
/// retries off }` stops every retry at once, a pool's own `retries` included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_off_stops_every_retry() {
    let dead = dead_addr().await;
    let b = Backend::text("alive").await;
    let pool = format!(
        "site * {{ proxy {dead} {} {{ lb first; retries 2 }} }}",
        b.addr
    );
    let on = Sluice::start(&pool);
    assert_eq!(
        get(on.addr, "/").await.text(),
        "alive",
        "retried on the live peer"
    );
    let off = Sluice::start(&format!("global {{ retries off }}\n{pool}"));
    assert_eq!(get(off.addr, "/").await.status, 502, "no retry at all");
}

/// A default is checked once, where it is written; one that describes a pool's own
/// addresses cannot be a default.
#[test]
fn defaults_are_checked_where_written() {
    let dir = TempDir::new();
    for (text, want) in [
        (
            "global { proxy_defaults { timeout soon } }\nsite * { respond ok }\n",
            "sluice.conf:1:35",
        ),
        (
            "global { proxy_defaults { weights 1 2 } }\nsite * { respond ok }\n",
            "cannot be a default",
        ),
        (
            "global { retries 2 }\nsite * { respond ok }\n",
            "expected `off`",
        ),
    ] {
        let conf = dir.write("sluice.conf", text);
        let out = std::process::Command::new(bin())
            .args(["check", "-c", conf.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{text}: {err}");
    }
}
