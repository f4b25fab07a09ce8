//! A fleet on Redis (DESIGN §18.6), black-box: real `redis-server`s (with a password,
//! and over TLS), several `sluice run` members, and `sluice publish` / `sluice fleet
//! status` as an operator runs them.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::pebble::free_port;
use common::redis::{Deployed, RedisServer};
use common::*;

const PASSWORD: &str = "fl33t-s3cret";

/// A member named `name`: its own file supplies `global` (the fleet, its admin API)
/// and serves `local` until a revision arrives; `env` is its environment (the
/// bundle's `{$FLEET_PORT}` is its own port).
fn member(dir: &TempDir, name: &str, fleet: &str, env: &[(&str, &str)], args: &[&str]) -> Sluice {
    let port = free_port().to_string();
    let text = format!(
        "global {{\n  admin 127.0.0.1:0\n  {fleet} {{ name {name}; channel t }}\n}}\nlisten 127.0.0.1:{{$FLEET_PORT}}\nsite * {{ respond local }}\n"
    );
    let path = dir.write(&format!("{name}/sluice.conf"), &text);
    let mut cmd = Command::new(bin());
    cmd.arg("run")
        .args(args)
        .args(["-c", path.to_str().unwrap()])
        .env("FLEET_PORT", &port)
        .env_remove("COLOR");
    for (k, v) in env {
        cmd.env(k, v);
    }
    Sluice::spawn_cmd(cmd, TempDir::new())
}

/// Runs `sluice ARGS` (publish, fleet status) with `env`.
fn sluice(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin());
    cmd.args(args).env_remove("COLOR");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Waits (bounded by `limit`) until `m` answers `want`.
async fn serves(m: &Sluice, want: &str, limit: Duration) {
    let end = Instant::now() + limit;
    loop {
        let got = get(m.addr, "/").await.text();
        if got == want {
            return;
        }
        assert!(
            Instant::now() < end,
            "answered {got:?}, not {want:?}, after {limit:?}; logs:\n{}",
            m.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes a config to publish in `dir/NAME/`: a main file that imports its site.
fn bundle(dir: &TempDir, name: &str, site: &str) -> PathBuf {
    dir.write(&format!("{name}/sites/app.conf"), site);
    dir.write(
        &format!("{name}/main.conf"),
        "global { admin off }\nlisten 127.0.0.1:{$FLEET_PORT:1}\nimport sites/*.conf\n",
    )
}

/// `sluice publish` of `main` to `to`, which must succeed.
fn publish(main: &Path, to: &[&str], env: &[(&str, &str)]) -> String {
    let mut args = vec!["publish", "-c", main.to_str().unwrap()];
    args.extend(to);
    let out = sluice(&args, env);
    assert!(
        out.status.success(),
        "publish failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// `sluice fleet status`'s lines, once every one of `names` shows `want`.
fn status_until(to: &[&str], names: &[&str], want: impl Fn(&str, &str) -> bool) -> String {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let mut args = vec!["fleet", "status"];
        args.extend(to);
        let out = sluice(&args, &[]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let lines = text(&out.stdout);
        let line = |n: &str| {
            lines
                .lines()
                .find(|l| l.starts_with(&format!("{n} revision ")))
                .map(str::to_string)
        };
        if names.iter().all(|n| line(n).is_some_and(|l| want(n, &l))) {
            return lines;
        }
        assert!(
            Instant::now() < end,
            "fleet status never showed it:\n{lines}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

async fn admin_status(m: &Sluice) -> serde_json::Value {
    let r = get(m.admin(), "/status").await;
    serde_json::from_str(&r.text()).unwrap()
}

/// Three members over TLS Redis with a password: a publish reaches all three within
/// 2 s, imports included; each expands `{$ENV}` from its own environment; a member
/// that cannot load a revision keeps its own and says why in its heartbeat; a
/// rollback brings every member back; a config that does not load never reaches
/// Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_config_reaches_every_member() {
    let dir = TempDir::new();
    let ca = common::pki::Ca::new();
    let leaf = ca.leaf(&["127.0.0.1"]);
    let ca_pem = dir.write("ca.pem", &ca.pem());
    let how = Deployed {
        password: Some(PASSWORD.into()),
        tls: Some((
            dir.write("redis.pem", &leaf.cert_pem),
            dir.write("redis.key", &leaf.key_pem),
            ca_pem.clone(),
        )),
    };
    let Some(redis) = RedisServer::start_as(&how) else {
        return;
    };
    let url = format!("rediss://:{PASSWORD}@127.0.0.1:{}/0", redis.port);
    let fleet = format!("redis_ca {}\n  fleet {url}", ca_pem.display());
    let ca_arg = ca_pem.to_str().unwrap();
    let to = ["--to", &url, "--redis-ca", ca_arg, "--channel", "t"];
    let a = member(&dir, "a", &fleet, &[("COLOR", "green")], &[]);
    let b = member(&dir, "b", &fleet, &[("COLOR", "teal")], &[]);
    let c = member(&dir, "c", &fleet, &[], &[]);
    let all = [&a, &b, &c];
    for m in all {
        serves(m, "local", WAIT).await;
    }

    let one = bundle(&dir, "one", "site * { respond v1 }\n");
    let said = publish(&one, &to, &[]);
    assert!(said.contains("revision 1 published"), "{said}");
    assert!(!said.contains(PASSWORD), "{said}");
    for m in all {
        serves(m, "v1", Duration::from_secs(2)).await;
    }
    status_until(&to, &["a", "b", "c"], |_, l| l.contains("revision 1 ok"));

    // Each member expands the bundle's {$COLOR} itself; `c` has none and refuses.
    let two = bundle(&dir, "two", "site * { respond {$COLOR} }\n");
    publish(&two, &to, &[("COLOR", "publisher")]);
    serves(&a, "green", Duration::from_secs(2)).await;
    serves(&b, "teal", Duration::from_secs(2)).await;
    let lines = status_until(&to, &["a", "c"], |n, l| match n {
        "a" => l.contains("revision 2 ok"),
        _ => l.contains("revision 1 refused: ") && l.contains("COLOR"),
    });
    assert!(
        lines.contains(&format!("{} up ", env!("CARGO_PKG_VERSION"))),
        "{lines}"
    );
    assert_eq!(get(c.addr, "/").await.text(), "v1", "c keeps its revision");
    let s = admin_status(&c).await;
    assert_eq!(s["fleet"]["revision"], 1, "{s}");
    assert!(
        s["fleet"]["result"]
            .as_str()
            .unwrap()
            .starts_with("refused: "),
        "{s}"
    );
    assert_eq!(s["fleet"]["members"], 3, "{s}");
    c.wait_log("fleet: revision 2 refused, still serving revision 1");

    // Rollback: every member runs revision 1 again.
    let out = sluice(&[&["publish", "--rollback", "1"][..], &to].concat(), &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for m in all {
        serves(m, "v1", Duration::from_secs(2)).await;
    }
    status_until(&to, &["a", "b", "c"], |_, l| l.contains("revision 1 ok"));
    let out = sluice(&[&["publish", "--rollback", "99"][..], &to].concat(), &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("revision 99 is not kept"),
        "{}",
        text(&out.stderr)
    );

    // A config that does not load is refused where it is published.
    let bad = bundle(&dir, "bad", "site * {\n  respond v3\n  tiemout 5s\n}\n");
    let out = sluice(
        &[&["publish", "-c", bad.to_str().unwrap()][..], &to].concat(),
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("sites/app.conf:3:3"), "{err}");
    assert!(err.contains("nothing was published"), "{err}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    for m in all {
        assert_eq!(get(m.addr, "/").await.text(), "v1");
        assert!(!m.logs().contains(PASSWORD), "{}", m.logs());
    }
    drop(redis);
}

/// A member applies the newest revision when it starts; Redis down: members serve
/// their revision, say so once, and catch up when it is back (even when it came back
/// empty and numbers revisions from 1 again); a member started while Redis is down
/// serves its own file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_ride_out_a_redis_outage() {
    let dir = TempDir::new();
    let how = Deployed {
        password: Some(PASSWORD.into()),
        tls: None,
    };
    let Some(mut redis) = RedisServer::start_as(&how) else {
        return;
    };
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}", redis.port);
    let fleet = format!("fleet {url}");
    let to = ["--to", &url, "--channel", "t"];
    publish(&bundle(&dir, "one", "site * { respond v1 }\n"), &to, &[]);

    let a = member(&dir, "a", &fleet, &[], &[]);
    assert_eq!(
        get(a.addr, "/").await.text(),
        "v1",
        "the newest revision at start"
    );
    a.wait_log("fleet: starting with revision 1");

    redis.kill();
    let b = member(&dir, "b", &fleet, &[], &[]);
    assert_eq!(
        get(b.addr, "/").await.text(),
        "local",
        "its own file while Redis is down"
    );
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        assert_eq!(get(a.addr, "/").await.text(), "v1");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.wait_count("serving revision 1 meanwhile", 1);

    redis.restart();
    publish(&bundle(&dir, "two", "site * { respond v2 }\n"), &to, &[]);
    for m in [&a, &b] {
        serves(m, "v2", Duration::from_secs(5)).await;
        assert!(!m.logs().contains(PASSWORD), "{}", m.logs());
    }
    a.wait_log("Redis at redis://***@127.0.0.1");
    a.wait_log("is reachable again");
}

/// `publish` refuses before it touches Redis: a bundle over 8 MiB; an unreachable
/// Redis is exit 1 with its address, never its password.
#[test]
fn publish_says_why_it_did_not() {
    let dir = TempDir::new();
    let port = free_port();
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{port}");
    let main = bundle(&dir, "one", "site * { respond v1 }\n");
    let out = sluice(
        &["publish", "-c", main.to_str().unwrap(), "--to", &url],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "cannot reach Redis at redis://***@127.0.0.1:{port}"
        )),
        "{err}"
    );
    assert!(!err.contains(PASSWORD), "{err}");

    let big = format!("site * {{ respond v1 }}\n# {}\n", "x".repeat(9 << 20));
    let main = bundle(&dir, "big", &big);
    let out = sluice(
        &["publish", "-c", main.to_str().unwrap(), "--to", &url],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("over the 8 MiB a revision may hold"), "{err}");
}

/// A member run with `--verify-key` applies only signed bundles (DESIGN §15.4), and
/// refuses files signed before the ones it runs, whatever folder they come in, unless
/// the fleet rolls back to a revision the member ran (§18.3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verifying_member_applies_signed_bundles_only() {
    if Command::new("minisign").arg("-v").output().is_err() {
        assert!(
            !require_interop(),
            "minisign is required (SLUICE_INTEROP=require)"
        );
        eprintln!("skipping: minisign is not installed");
        return;
    }
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let dir = TempDir::new();
    let d = dir.0.clone();
    assert!(minisign(&d, &["-G", "-W", "-p", "k.pub", "-s", "k.sec"]));
    let key = d.join("k.pub").display().to_string();
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let to = ["--to", &url, "--channel", "t"];
    // The member's own file is signed too: it is verified as a reload verifies it.
    let m = {
        let port = free_port().to_string();
        let own = format!(
            "global {{\n  admin 127.0.0.1:0\n  fleet {url} {{ name s; channel t }}\n}}\nlisten 127.0.0.1:{port}\nsite * {{ respond local }}\n"
        );
        dir.write("s/sluice.conf", &own);
        assert!(minisign(&d, &["-S", "-s", "k.sec", "-m", "s/sluice.conf"]));
        let mut cmd = Command::new(bin());
        cmd.args(["run", "--verify-key", &key, "-c"])
            .arg(d.join("s/sluice.conf"))
            .env("FLEET_PORT", &port);
        Sluice::spawn_cmd(cmd, TempDir::new())
    };
    let sign = |name: &str| {
        for f in ["main.conf", "sites/app.conf"] {
            assert!(minisign(
                &d,
                &["-S", "-s", "k.sec", "-m", &format!("{name}/{f}")]
            ));
        }
    };

    let unsigned = bundle(&dir, "unsigned", "site * { respond v1 }\n");
    // `publish --verify-key` checks the signatures before anything reaches Redis.
    let args = [
        &[
            "publish",
            "--verify-key",
            &key,
            "-c",
            unsigned.to_str().unwrap(),
        ][..],
        &to,
    ]
    .concat();
    let out = sluice(&args, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("main.conf.minisig is missing"),
        "{}",
        text(&out.stderr)
    );
    publish(&unsigned, &to, &[]);
    m.wait_log("fleet: revision 1 refused");
    assert!(
        m.logs().contains("minisig is missing from the bundle"),
        "{}",
        m.logs()
    );
    assert_eq!(get(m.addr, "/").await.text(), "local");

    let old = bundle(&dir, "old", "site * { respond old }\n");
    sign("old");
    publish(&old, &to, &[]);
    serves(&m, "old", Duration::from_secs(2)).await;
    // minisign's timestamps are seconds: the next signature is a later one.
    std::thread::sleep(Duration::from_millis(1100));
    let new = bundle(&dir, "new", "site * { respond new }\n");
    sign("new");
    let said = publish(&new, &to, &[]);
    assert!(said.contains("2 signed"), "{said}");
    serves(&m, "new", Duration::from_secs(2)).await;
    // The old files and their valid signatures, under another folder: refused.
    std::fs::rename(d.join("old"), d.join("moved")).unwrap();
    publish(&d.join("moved/main.conf"), &to, &[]);
    m.wait_log("fleet: revision 4 refused");
    assert!(
        m.logs().contains("older than the running revision"),
        "{}",
        m.logs()
    );
    // A rollback mark does not pass a bundle this member never ran...
    let out = sluice(&[&["publish", "--rollback", "4"][..], &to].concat(), &[]);
    assert!(out.status.success());
    m.wait_count("fleet: revision 4 refused", 2);
    assert_eq!(get(m.addr, "/").await.text(), "new");
    // ...and takes it back to one it ran.
    let out = sluice(&[&["publish", "--rollback", "2"][..], &to].concat(), &[]);
    assert!(out.status.success());
    serves(&m, "old", Duration::from_secs(2)).await;
}

/// A reload joins the fleet (the newest revision at once) and leaves it (the file is
/// the whole config again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_joins_and_leaves_the_fleet() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let dir = TempDir::new();
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let to = ["--to", &url, "--channel", "t"];
    publish(&bundle(&dir, "one", "site * { respond v1 }\n"), &to, &[]);
    let port = free_port().to_string();
    let own = |fleet: &str| {
        format!("global {{ admin off\n{fleet} }}\nlisten 127.0.0.1:{port}\nsite * {{ respond local }}\n")
    };
    let path = dir.write("m/sluice.conf", &own(""));
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-c"]).arg(&path).env("FLEET_PORT", &port);
    let m = Sluice::spawn_cmd(cmd, TempDir::new());
    assert_eq!(get(m.addr, "/").await.text(), "local");
    std::fs::write(&path, own(&format!("fleet {url} {{ name m; channel t }}"))).unwrap();
    m.signal("HUP");
    serves(&m, "v1", Duration::from_secs(3)).await;
    m.wait_log("fleet: following redis://127.0.0.1");
    std::fs::write(&path, own("")).unwrap();
    m.signal("HUP");
    serves(&m, "local", Duration::from_secs(3)).await;
    m.wait_log("fleet: this instance left the fleet");
}
