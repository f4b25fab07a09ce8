//! The command line: `check` on good and bad files, exit codes, `--help`, `version`,
//! and every example config.

mod common;

use std::process::Command;

use common::{bin, get, minisign, Backend, Sluice, TempDir};

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn sluice(args: &[&str]) -> Out {
    let o = Command::new(bin())
        .args(args)
        .output()
        .expect("sluice runs");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).to_string(),
        stderr: String::from_utf8_lossy(&o.stderr).to_string(),
    }
}

/// Writes `text` as `sluice.conf` and runs `sluice check` on it.
fn check(text: &str) -> (Out, String) {
    let dir = TempDir::new();
    let path = dir.write("sluice.conf", text);
    let p = path.to_str().unwrap().to_string();
    (sluice(&["check", "-c", &p]), p)
}

fn assert_error_at(text: &str, line: u32, col: u32, message: &str) {
    let (out, path) = check(text);
    assert_eq!(
        out.code, 1,
        "check should fail for:\n{text}\nstderr:\n{}",
        out.stderr
    );
    let want = format!("{path}:{line}:{col}: ");
    let first = out.stderr.lines().next().unwrap_or("");
    assert!(
        first.starts_with(&want),
        "expected {want} in the first line, got:\n{}",
        out.stderr
    );
    assert!(
        first.contains(message),
        "expected {message:?} in:\n{}",
        out.stderr
    );
}

#[test]
fn check_accepts_a_good_file_and_summarises_it() {
    let (out, path) = check("listen 127.0.0.1:8080\nsite example.com {\n  route /api/* { proxy 127.0.0.1:3000 127.0.0.1:3001 }\n  respond ok\n}\n");
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout.trim(),
        format!("sluice check: {path}: ok: 1 listener, 1 site, 2 routes, 1 pool")
    );
}

#[test]
fn check_names_line_and_column_for_each_kind_of_mistake() {
    assert_error_at(
        "site a {\n    prxy 127.0.0.1:1\n}\n",
        2,
        5,
        "unknown directive `prxy`",
    );
    assert_error_at(
        "site a {\n  proxy 127.0.0.1:1 {\n    timeout 30\n  }\n}\n",
        3,
        13,
        "no unit",
    );
    assert_error_at(
        "site a {\n  proxy 127.0.0.1:1 {\n    max_body 1.5M\n  }\n}\n",
        3,
        14,
        "fraction",
    );
    assert_error_at("site a {\n  respond ok\n", 1, 8, "never closed");
    assert_error_at("site a {\n  respond ok\n}\n}\n", 4, 1, "without a block");
    assert_error_at(
        "listen {$SLUICE_TEST_SURELY_UNSET}\n",
        1,
        8,
        "SLUICE_TEST_SURELY_UNSET",
    );
    assert_error_at(
        "site a {\n  respond \"ok\n}\n",
        2,
        11,
        "unterminated string",
    );
    assert_error_at("site a {\n  timeout 5s\n}\n", 2, 3, "does not belong");
    let long = format!("{}.test", "a".repeat(250));
    for (host, at) in [(long.clone(), 28), (format!("{long}:8080"), 28)] {
        assert_error_at(
            &format!("site a {{\n  proxy 127.0.0.1:1 {{ host {host} }}\n}}\n"),
            2,
            at,
            "the host name is 255 characters long",
        );
    }
    assert_error_at("site a {\n  proxy 127.0.0.1:1/x\n}\n", 2, 9, "no path");
    assert_error_at(
        "site a {\n  proxy 127.0.0.1:1 { lb fastest }\n}\n",
        2,
        26,
        "unknown policy",
    );
    assert_error_at("listen nowhere\n", 1, 8, "expected an address");
    assert_error_at(
        "site a {\n  respond 1\n  respond 2\n}\n",
        3,
        3,
        "exactly one handler",
    );
    assert_error_at(
        "site a {\n  proxy https://127.0.0.1:1 { tls_ca ca.pem }\n}\n",
        2,
        38,
        "ca.pem: No such file",
    );
    assert_error_at(
        "site a {\n  proxy h2c://127.0.0.1:1 127.0.0.1:2\n}\n",
        2,
        27,
        "speaks http",
    );
}

#[test]
fn errors_carry_the_line_a_caret_and_a_hint() {
    let (out, _) = check("site a {\n    prxy 127.0.0.1:1\n}\n");
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines[1], "        prxy 127.0.0.1:1");
    assert_eq!(lines[2], "        ^");
    assert_eq!(lines[3], "hint: did you mean `proxy`?");
}

#[test]
fn imports_resolve_relative_and_report_their_own_file() {
    let dir = TempDir::new();
    dir.write("sites/a.conf", "site a.example {\n  respond a\n}\n");
    dir.write("sites/b.conf", "site b.example {\n  respnd b\n}\n");
    let main = dir.write("main.conf", "import sites/*.conf\n");
    let out = sluice(&["check", "-c", main.to_str().unwrap()]);
    assert_eq!(out.code, 1);
    let want = format!(
        "{}:2:3: unknown directive `respnd`",
        dir.0.join("sites/b.conf").display()
    );
    assert!(
        out.stderr.starts_with(&want),
        "expected {want}, got:\n{}",
        out.stderr
    );

    let dir = TempDir::new();
    dir.write("a.conf", "import b.conf\n");
    dir.write("b.conf", "import a.conf\n");
    let out = sluice(&["check", "-c", dir.0.join("a.conf").to_str().unwrap()]);
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("import cycle"), "{}", out.stderr);
}

#[test]
fn warnings_pass_unless_strict() {
    let text = "site a {\n  proxy 127.0.0.1:1 { limit off }\n}\n";
    let (out, path) = check(text);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("{path}:2:29: warning: `limit off`")),
        "{}",
        out.stderr
    );
    let out = sluice(&["check", "-c", &path, "--strict"]);
    assert_eq!(out.code, 1, "--strict turns warnings into errors");
}

#[test]
fn exit_codes() {
    let out = sluice(&["check", "-c", "/nonexistent/sluice.conf"]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("/nonexistent/sluice.conf"),
        "the missing file is named: {}",
        out.stderr
    );
    assert_eq!(sluice(&["check", "--bogus"]).code, 2, "usage errors exit 2");
    let out = sluice(&["version"]);
    assert_eq!(out.code, 0);
    assert!(out.stdout.starts_with("sluice "), "{}", out.stdout);
    let out = sluice(&["run", "-c", "/nonexistent/sluice.conf"]);
    assert_eq!(out.code, 1, "run refuses a missing config");
}

#[test]
fn every_subcommand_has_help() {
    for sub in ["run", "check", "demo", "proxy", "version"] {
        let out = sluice(&[sub, "--help"]);
        assert_eq!(out.code, 0, "{sub} --help");
        assert!(
            out.stdout.contains("Usage: sluice"),
            "{sub} --help prints usage: {}",
            out.stdout
        );
    }
}

#[test]
fn every_example_checks_clean() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("examples/ exists") {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "conf") {
            let out = sluice(&["check", "--strict", "-c", p.to_str().unwrap()]);
            assert_eq!(
                out.code,
                0,
                "{} should pass check --strict:\n{}",
                p.display(),
                out.stderr
            );
            n += 1;
        }
    }
    assert!(n > 0, "at least one example config");
}

#[test]
fn foundation_ii_config_rules() {
    assert_error_at(
        "site a {\n  proxy 127.0.0.1:1 {\n    header_up X-Real-IP {remote}\n  }\n}\n",
        3,
        25,
        "unknown placeholder `{remote}`",
    );
    assert_error_at("# nothing here\n", 1, 1, "nothing to serve");
    assert_error_at("global { grace 5s }\n", 1, 1, "nothing to serve");
    let (out, _) = check("listen 127.0.0.1:8080\n");
    assert_eq!(
        out.code, 0,
        "a listener alone serves (421 to all): {}",
        out.stderr
    );

    let text = "site a {\n  route /x {\n    header_down X-A 1\n  }\n  respond ok\n}\n";
    let (out, path) = check(text);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "{path}:2:3: warning: route `a /x` has filters but no handler"
        )),
        "{}",
        out.stderr
    );
    let out = sluice(&["check", "-c", &path, "--strict"]);
    assert_eq!(out.code, 1, "an error under --strict");

    let (out, _) = check("site a {\n  route /a {respond \"x\"}\n}\n");
    assert_eq!(out.code, 0, "braces glued to words parse: {}", out.stderr);
}

#[test]
fn an_unknown_sluice_log_fails_at_start() {
    let dir = TempDir::new();
    let path = dir.write("sluice.conf", "listen 127.0.0.1:0\nsite * { respond ok }\n");
    let o = Command::new(bin())
        .args(["run", "-c", path.to_str().unwrap()])
        .env("SLUICE_LOG", "loud")
        .output()
        .expect("sluice runs");
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("SLUICE_LOG") && err.contains("loud"), "{err}");
}

#[test]
fn weights_are_checked() {
    assert_error_at(
        "site a {\n  proxy 127.0.0.1:1 127.0.0.1:2 {\n    lb weighted_round_robin\n    weights 1 2 3\n  }\n}\n",
        4,
        5,
        "3 weights for 2 addresses",
    );
    assert_error_at(
        "site a {\n  proxy 127.0.0.1:1 {\n    weights 0\n  }\n}\n",
        3,
        13,
        "out of range",
    );
    assert_error_at(
        "site a {\n  proxy 127.0.0.1:1 {\n    lb hash cookies sid\n  }\n}\n",
        3,
        13,
        "expected client_ip",
    );
    let text = "site a {\n  proxy 127.0.0.1:1 127.0.0.1:2 {\n    weights 1 2\n  }\n}\n";
    let (out, path) = check(text);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "{path}:3:5: warning: `weights` has no effect under `lb round_robin`"
        )),
        "{}",
        out.stderr
    );
}

#[test]
fn health_values_are_checked_at_their_column() {
    assert_error_at(
        "site a {\n  proxy 127.0.0.1:1 {\n    health /h { interval 500ms }\n  }\n}\n",
        3,
        26,
        "interval is out of range",
    );
    assert_error_at(
        "site a {\n  proxy 127.0.0.1:1 {\n    health /h { interval 5s; timeout 10s }\n  }\n}\n",
        3,
        38,
        "longer than its interval",
    );
    assert_error_at(
        "site a {\n  proxy 127.0.0.1:1 {\n    health /h { rise 0 }\n  }\n}\n",
        3,
        22,
        "out of range",
    );
    assert_error_at(
        "site a {\n  proxy 127.0.0.1:1 {\n    health /h { expect 2xy }\n  }\n}\n",
        3,
        24,
        "expected a status code",
    );
    assert_error_at(
        "site a {\n  proxy 127.0.0.1:1 {\n    health connect { expect 200 }\n  }\n}\n",
        3,
        22,
        "is for HTTP probes",
    );
    let (out, _) = check("global { probe_concurrency 4 }\nsite a {\n  proxy 127.0.0.1:1 {\n    health /h { method HEAD; expect 200..399; host h.internal; initial unhealthy }\n  }\n}\n");
    assert_eq!(out.code, 0, "{}", out.stderr);
}

#[test]
fn framing_fields_and_abnormal_patterns_are_refused() {
    assert_error_at(
        "site a {\n  proxy 127.0.0.1:1 {\n    header_up -Content-Length\n  }\n}\n",
        3,
        15,
        "cannot change `content-length`",
    );
    assert_error_at(
        "site a {\n  route /a//b/* { respond 1 }\n}\n",
        2,
        9,
        "not in normal form",
    );
    assert_error_at(
        "site a {\n  route /%61dmin { respond 1 }\n}\n",
        2,
        9,
        "not in normal form",
    );
    assert_error_at(
        "site a {\n  strip /api/../x\n  respond 1\n}\n",
        2,
        9,
        "not in normal form",
    );
    assert_error_at("listen {$SLUICE_TEST_SURELY_UNSET\n", 1, 8, "");
}

#[test]
fn failover_is_checked() {
    assert_error_at(
        "site a {\n  proxy 127.0.0.1:1 {\n    failover { hold_down 1s }\n    backup 127.0.0.1:2\n  }\n}\n",
        3,
        26,
        "out of range",
    );
    assert_error_at(
        "site a {\n  proxy 127.0.0.1:1 {\n    failover { failure_threshold 3 }\n  }\n}\n",
        3,
        5,
        "without `backup`",
    );
    assert_error_at(
        "site a {\n  proxy 127.0.0.1:1 {\n    backup 127.0.0.1:2\n    origin_headers maybe\n  }\n}\n",
        4,
        20,
        "expected `on` or `off`",
    );
}

#[test]
fn the_admin_api_never_shares_a_site_listener() {
    assert_error_at(
        "global { admin 127.0.0.1:9901 }\nlisten 127.0.0.1:9901\nsite * { respond ok }\n",
        2,
        1,
        "is the admin API's address",
    );
    assert_error_at(
        "global { admin nowhere }\nsite * { respond ok }\n",
        1,
        16,
        "expected an address",
    );
    let (out, _) = check("global { admin off }\nlisten 127.0.0.1:2019\nsite * { respond ok }\n");
    assert_eq!(out.code, 0, "{}", out.stderr);
}

#[test]
fn tcp_blocks_take_only_l4_options() {
    assert_error_at(
        "tcp :5432 {\n  proxy 127.0.0.1:5432 {\n    header_up X-A 1\n  }\n}\n",
        3,
        5,
        "is for HTTP",
    );
    assert_error_at("tcp :5432 {\n  respond ok\n}\n", 2, 3, "does not belong");
    assert_error_at(
        "tcp :5432 {\n  proxy 127.0.0.1:5432 { health /h }\n}\n",
        2,
        3,
        "health connect",
    );
    let (out, _) = check("tcp :5432 {\n  proxy 127.0.0.1:5432 127.0.0.1:5433 { lb least_conn; idle_timeout 10m; health connect }\n}\n");
    assert_eq!(out.code, 0, "{}", out.stderr);
}

/// Messages as a new user meets them: a scheme in a site's name is called a scheme; a
/// duplicate across imported files names the other file; one error is "1 error"; the
/// help lines end their sentences.
#[test]
fn messages_say_what_is_wrong() {
    let (out, _) = check("site http://a.test {\n  respond ok\n}\n");
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("has a scheme (`http://`)")
            && out.stderr.contains("write `site a.test`"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("has a port"), "{}", out.stderr);
    assert!(
        out.stderr.trim_end().ends_with(": 1 error"),
        "{}",
        out.stderr
    );

    let dir = TempDir::new();
    let a = dir.write("a.conf", "site dup.example {\n  respond a\n}\n");
    dir.write("b.conf", "\nsite dup.example {\n  respond b\n}\n");
    let main = dir.write("main.conf", "import a.conf\nimport b.conf\n");
    let out = sluice(&["check", "-c", main.to_str().unwrap()]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .contains(&format!("the other site is on {}:1", a.display())),
        "names the other file: {}",
        out.stderr
    );

    let out = sluice(&["--help"]);
    let demo = out
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("demo"))
        .unwrap();
    assert!(!demo.trim_end().ends_with(" on"), "{demo}");
    let out = sluice(&["demo", "--help"]);
    assert!(
        out.stdout.contains("2019"),
        "demo --help says where the dashboard is"
    );
}

/// `sluice proxy`: `--from PORT` is every interface, `--to :PORT` and `--to PORT` are
/// this machine; its errors speak of its flags and quote no config the user never wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_one_line_proxy_takes_ports_and_speaks_of_its_flags() {
    let b = Backend::text("behind").await;
    let port = b.addr.port().to_string();
    let free = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    for to in [format!(":{port}"), port.clone()] {
        let s = Sluice::spawn(
            &["proxy", "--from", &format!("127.0.0.1:{free}"), "--to", &to],
            TempDir::new(),
        );
        assert_eq!(get(s.addr, "/").await.text(), "behind", "--to {to}");
        drop(s);
    }
    for (args, flag) in [
        (vec!["--from", "8089", "--to", "nope:x"], "--to nope:x"),
        (vec!["--from", "a b", "--to", ":1"], "--from"),
        (
            vec!["--from", "127.0.0.1:0", "--to", "http://x/path"],
            "--to http://x/path",
        ),
        (vec!["--from", "127.0.0.1:0", "--to", "x;y"], "--to"),
        (
            vec!["--from", "18089", "--to", "ééééé:80", "x:99999"],
            "--to x:99999",
        ),
    ] {
        let mut a = vec!["proxy"];
        a.extend(args.iter().copied());
        let out = sluice(&a);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains(flag),
            "{args:?} names {flag}: {}",
            out.stderr
        );
        for config_word in [
            "site *",
            "global",
            "listen ",
            "sluice proxy:2",
            "sluice proxy:4",
        ] {
            assert!(
                !out.stderr.contains(config_word),
                "{args:?}: quotes a config the user never wrote: {}",
                out.stderr
            );
        }
    }
}

/// A folder with a minisign key pair made in it (`k.pub`, `k.sec`, no password), and
/// its path; `None` (after saying why) when minisign is not installed and may be
/// missing.
fn signing_folder() -> Option<(TempDir, std::path::PathBuf)> {
    if Command::new("minisign").arg("-v").output().is_err() {
        assert!(
            !common::require_interop(),
            "minisign is required (SLUICE_INTEROP=require) but not installed"
        );
        eprintln!("skipping: minisign is not installed");
        return None;
    }
    let dir = TempDir::new();
    let d = dir.0.clone();
    assert!(minisign(&d, &["-G", "-W", "-p", "k.pub", "-s", "k.sec"]));
    Some((dir, d))
}

/// Signed configs with the real `minisign` tool: every file read needs its signature
/// by the `--verify-key` key (prehashed or legacy), for check, run and reload; a
/// missing, damaged or foreign signature refuses the load and the running revision
/// stays; `/revisions` shows the key id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_configs_are_verified_on_every_load() {
    let Some((dir, d)) = signing_folder() else {
        return;
    };
    assert!(minisign(
        &d,
        &["-G", "-W", "-p", "other.pub", "-s", "other.sec"]
    ));
    let main = dir.write(
        "main.conf",
        "listen 127.0.0.1:0\nglobal { admin 127.0.0.1:0 }\nimport sites/*\n",
    );
    dir.write("sites/a.conf", "site * { respond one }\n");
    assert!(minisign(&d, &["-S", "-s", "k.sec", "-m", "main.conf"]));
    assert!(
        minisign(&d, &["-S", "-l", "-s", "k.sec", "-m", "sites/a.conf"]),
        "a legacy signature"
    );
    let pubkey = d.join("k.pub").display().to_string();
    let m = main.display().to_string();
    let ok = sluice(&["check", "--verify-key", &pubkey, "-c", &m]);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    // An import that is not signed; one changed since it was signed; another key.
    let check_fails = |want: &str| {
        let out = sluice(&["check", "--verify-key", &pubkey, "-c", &m]);
        assert_eq!(out.code, 1, "{want}: {}", out.stderr);
        assert!(out.stderr.contains(want), "{want}:\n{}", out.stderr);
    };
    dir.write("sites/b.conf", "site b.test { respond two }\n");
    check_fails(&format!(
        "{}: signature: {}.minisig is missing",
        d.join("sites/b.conf").display(),
        d.join("sites/b.conf").display()
    ));
    assert!(minisign(
        &d,
        &["-S", "-s", "other.sec", "-m", "sites/b.conf"]
    ));
    check_fails("was made with another key than");
    assert!(minisign(&d, &["-S", "-s", "k.sec", "-m", "sites/b.conf"]));
    let ok = sluice(&["check", "--verify-key", &pubkey, "-c", &m]);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    // One signed file cannot stand in for another: the signature names its file.
    let b_conf = std::fs::read(d.join("sites/b.conf")).unwrap();
    let b_sig = std::fs::read(d.join("sites/b.conf.minisig")).unwrap();
    std::fs::write(d.join("sites/c.conf"), &b_conf).unwrap();
    std::fs::write(d.join("sites/c.conf.minisig"), &b_sig).unwrap();
    check_fails("is the signature of b.conf, not of c.conf");
    std::fs::remove_file(d.join("sites/c.conf")).unwrap();
    std::fs::remove_file(d.join("sites/c.conf.minisig")).unwrap();
    std::fs::write(d.join("sites/b.conf"), "site b.test { respond TWO }\n").unwrap();
    check_fails("does not match the file");
    assert!(minisign(&d, &["-S", "-s", "k.sec", "-m", "sites/b.conf"]));
    // A refused start exits 1.
    std::fs::write(
        &main,
        "listen 127.0.0.1:0\nglobal { admin 127.0.0.1:0 }\nimport sites/*\n# changed\n",
    )
    .unwrap();
    let out = sluice(&["run", "--verify-key", &pubkey, "-c", &m]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("main.conf: signature:"),
        "{}",
        out.stderr
    );
    assert!(minisign(&d, &["-S", "-s", "k.sec", "-m", "main.conf"]));
    // Running: a signed change reloads, an unsigned one is refused and the revision stays.
    let s = Sluice::spawn(&["run", "--verify-key", &pubkey, "-c", &m], TempDir::new());
    assert_eq!(get(s.addr, "/").await.text(), "one");
    let admin = s.admin();
    std::fs::write(d.join("sites/a.conf"), "site * { respond changed }\n").unwrap();
    let out = sluice(&["reload", "--admin", &admin.to_string()]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains("a.conf: signature:"), "{}", out.stderr);
    assert_eq!(
        get(s.addr, "/").await.text(),
        "one",
        "the running revision stays"
    );
    let a = admin.to_string();
    let checked_reload = || sluice(&["reload", "--admin", &a, "--verify-key", &pubkey, "-c", &m]);
    let out = checked_reload();
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("nothing was asked of the server"),
        "{}",
        out.stderr
    );
    assert!(minisign(&d, &["-S", "-s", "k.sec", "-m", "sites/a.conf"]));
    let out = checked_reload();
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(get(s.addr, "/").await.text(), "changed");
    let revs: serde_json::Value =
        serde_json::from_str(&get(admin, "/revisions").await.text()).unwrap();
    let pub_line = std::fs::read_to_string(d.join("k.pub")).unwrap();
    let printed = pub_line
        .lines()
        .next()
        .unwrap()
        .rsplit(' ')
        .next()
        .unwrap()
        .to_string();
    let id = revs["revisions"][1]["signed_by"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(id.len(), 16, "{id}");
    assert_eq!(
        id.trim_start_matches('0'),
        printed.trim_start_matches('0'),
        "the id minisign printed"
    );
    assert_eq!(
        revs["revisions"][0]["signed_by"],
        revs["revisions"][1]["signed_by"]
    );
    // The key cannot come from the file it verifies.
    let (out, _) = check("global { verify_key k.pub }\nsite * { respond x }");
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("cannot be in the config it verifies"),
        "{}",
        out.stderr
    );
}

/// A signed config cannot be rolled back by putting an older file and its valid
/// signature back on disk (DESIGN §18.3): a reload refuses a file signed before the
/// running one, naming both times, and the running revision stays; an explicit
/// rollback still goes back, and a newer signature reloads again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_signed_file_is_refused_on_reload() {
    let Some((dir, d)) = signing_folder() else {
        return;
    };
    let main = dir.write(
        "main.conf",
        "listen 127.0.0.1:0\nglobal { admin 127.0.0.1:0 }\nsite * { respond old }\n",
    );
    assert!(minisign(&d, &["-S", "-s", "k.sec", "-m", "main.conf"]));
    let old_text = std::fs::read(&main).unwrap();
    let old_sig = std::fs::read(d.join("main.conf.minisig")).unwrap();
    // minisign's timestamp counts seconds.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    std::fs::write(
        &main,
        "listen 127.0.0.1:0\nglobal { admin 127.0.0.1:0 }\nsite * { respond new }\n",
    )
    .unwrap();
    assert!(minisign(&d, &["-S", "-s", "k.sec", "-m", "main.conf"]));
    let pubkey = d.join("k.pub").display().to_string();
    let m = main.display().to_string();
    let s = Sluice::spawn(&["run", "--verify-key", &pubkey, "-c", &m], TempDir::new());
    assert_eq!(get(s.addr, "/").await.text(), "new");
    let admin = s.admin().to_string();
    std::fs::write(&main, &old_text).unwrap();
    std::fs::write(d.join("main.conf.minisig"), &old_sig).unwrap();
    let out = sluice(&["reload", "--admin", &admin]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("main.conf: signature: older than the running revision (signed "),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains(", running "), "{}", out.stderr);
    assert_eq!(
        get(s.addr, "/").await.text(),
        "new",
        "the running revision stays"
    );
    // A signature without its time cannot be judged: refused.
    assert!(minisign(
        &d,
        &[
            "-S",
            "-s",
            "k.sec",
            "-m",
            "main.conf",
            "-t",
            "file:main.conf"
        ]
    ));
    let out = sluice(&["reload", "--admin", &admin]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains("has no signing time"), "{}", out.stderr);
    // Signed again now: the old text is the newest signature, and reloads.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert!(minisign(&d, &["-S", "-s", "k.sec", "-m", "main.conf"]));
    let out = sluice(&["reload", "--admin", &admin]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(get(s.addr, "/").await.text(), "old");
    // The explicit way back: revision 1 ("new"), whatever its signing time.
    let r = common::post_json(s.admin(), "/rollback/1", "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(get(s.addr, "/").await.text(), "new");
}

/// `global { pid_file FILE }` (DESIGN §16): written once the listeners are bound,
/// relative to the config file, and removed at a clean exit.
#[test]
fn the_pid_file_lives_as_long_as_the_server() {
    let dir = TempDir::new();
    let pid_path = dir.0.join("run/sluice.pid");
    std::fs::create_dir_all(pid_path.parent().unwrap()).unwrap();
    let conf = dir.write(
        "sluice.conf",
        "global { admin off; pid_file run/sluice.pid }\nlisten 127.0.0.1:0\nsite * { respond ok }\n",
    );
    let mut s = Sluice::spawn(&["run", "-c", conf.to_str().unwrap()], dir);
    let written = std::fs::read_to_string(&pid_path).expect("the pid file is written");
    assert_eq!(written, format!("{}\n", s.pid()));
    s.signal("TERM");
    assert_eq!(s.wait_exit(std::time::Duration::from_secs(10)), Some(0));
    assert!(!pid_path.exists(), "removed at a clean exit");
}

/// `sluice completions bash|zsh|fish` and `sluice man` print what packagers install.
#[test]
fn completions_and_the_manual_page_are_printed() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef sluice"),
        ("fish", "complete -c sluice"),
    ] {
        let out = sluice(&["completions", shell]);
        assert_eq!(out.code, 0, "{shell}: {}", out.stderr);
        assert!(
            out.stdout.contains(marker),
            "{shell}: {}",
            &out.stdout[..out.stdout.len().min(400)]
        );
        assert!(
            out.stdout.contains("reload") && out.stdout.contains("check"),
            "{shell}"
        );
    }
    assert_eq!(sluice(&["completions", "tcsh"]).code, 2);
    let man = sluice(&["man"]);
    assert_eq!(man.code, 0);
    assert!(
        man.stdout.contains(".TH sluice 1"),
        "{}",
        &man.stdout[..200.min(man.stdout.len())]
    );
    assert!(man.stdout.contains("reload"));
}

/// `sluice reload -c FILE` with the admin API off in FILE: nothing to ask, exit 1.
#[test]
fn reload_with_the_admin_api_off_says_so() {
    let dir = TempDir::new();
    let conf = dir.write(
        "sluice.conf",
        "global { admin off }\nsite * { respond ok }\n",
    );
    let out = sluice(&["reload", "-c", conf.to_str().unwrap()]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    // Said from the file, not from a failed dial of the default address.
    assert!(out.stderr.contains("admin API off"), "{}", out.stderr);
    assert!(out.stderr.contains("SIGHUP"), "{}", out.stderr);
}
