//! OCSP stapling (DESIGN §18.8), judged by real programs: certificates made by
//! `openssl` with a responder in their Authority Information Access, a real `openssl
//! ocsp` responder, and `openssl s_client -status` reading the staple.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::pebble::free_port;
use common::*;

fn openssl(dir: &Path, args: &[&str]) -> Output {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Whether `openssl` is here (else skipped, or a failure under `SLUICE_INTEROP=require`).
fn have_openssl() -> bool {
    if Command::new("openssl").arg("version").output().is_ok() {
        return true;
    }
    assert!(
        !require_interop(),
        "openssl is required (SLUICE_INTEROP=require)"
    );
    eprintln!("skipped: openssl is not installed");
    false
}

/// A CA, and a leaf for `localhost` whose OCSP responder is `http://127.0.0.1:PORT`:
/// writes `ca.pem`, `ca.key`, `NAME.pem` (leaf then CA), `NAME.key`, and an `openssl
/// ocsp` index saying the leaf is good.
fn pki(dir: &Path, name: &str, port: u16) {
    if !dir.join("ca.pem").exists() {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-subj",
                "/CN=sluice OCSP test CA",
                "-days",
                "30",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
            ],
        );
    }
    let csr = format!("{name}.csr");
    let key = format!("{name}.key");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            "/CN=localhost",
        ],
    );
    let ext = format!("{name}.ext");
    std::fs::write(
        dir.join(&ext),
        format!(
            "subjectAltName=DNS:localhost\nauthorityInfoAccess=OCSP;URI:http://127.0.0.1:{port}\n"
        ),
    )
    .unwrap();
    let leaf = format!("{name}.leaf.pem");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &leaf,
            "-days",
            "30",
            "-extfile",
            &ext,
        ],
    );
    let serial =
        String::from_utf8(openssl(dir, &["x509", "-in", &leaf, "-noout", "-serial"]).stdout)
            .unwrap();
    let serial = serial.trim().trim_start_matches("serial=");
    let line = format!("V\t301231235959Z\t\t{serial}\tunknown\t/CN=localhost\n");
    let index = dir.join("index.txt");
    let before = std::fs::read_to_string(&index).unwrap_or_default();
    std::fs::write(&index, before + &line).unwrap();
    let chain = std::fs::read_to_string(dir.join(&leaf)).unwrap()
        + &std::fs::read_to_string(dir.join("ca.pem")).unwrap();
    std::fs::write(dir.join(format!("{name}.pem")), chain).unwrap();
}

/// `openssl s_client -status` against `addr`: its output.
fn s_client(addr: std::net::SocketAddr) -> String {
    let out = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &addr.to_string(),
            "-servername",
            "localhost",
            "-status",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A certificate naming a responder gets its response stapled, checked by `s_client`;
/// the staple stays when the responder goes away, and across a reload; its expiry is
/// a metric and on `/status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_response_is_stapled_and_kept_through_an_outage() {
    if !have_openssl() {
        return;
    }
    let dir = TempDir::new();
    let port = free_port();
    pki(&dir.0, "site", port);
    let mut responder = Command::new("openssl");
    responder
        .current_dir(&dir.0)
        .args([
            "ocsp",
            "-index",
            "index.txt",
            "-port",
            &port.to_string(),
            "-rsigner",
            "ca.pem",
            "-rkey",
            "ca.key",
            "-CA",
            "ca.pem",
            "-ndays",
            "1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.0.join("responder.log")).unwrap());
    let responder = Group::spawn(responder).unwrap();
    // Waited for by its word, not by a connection: it answers one client at a time.
    let end = Instant::now() + WAIT;
    let log = dir.0.join("responder.log");
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("waiting for OCSP client")
    {
        assert!(Instant::now() < end, "the responder did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let d = dir.0.display();
    let s = Sluice::start(&format!(
        "global {{ admin 127.0.0.1:0 }}\nlisten 127.0.0.1:0 tls\nsite localhost {{ tls {d}/site.pem {d}/site.key; respond ok }}"
    ));
    s.wait_log(&format!(
        "site localhost: OCSP staple from http://127.0.0.1:{port}"
    ));
    let out = s_client(s.addr);
    assert!(out.contains("OCSP Response Status: successful"), "{out}");
    assert!(out.contains("Cert Status: good"), "{out}");
    let m = get(s.admin(), "/metrics").await.text();
    assert!(
        m.contains("sluice_tls_ocsp_staple_expiry_seconds{site=\"localhost\"}"),
        "{m}"
    );
    let st = get(s.admin(), "/status").await.text();
    assert!(st.contains("\"ocsp_next_update\":\"20"), "{st}");

    drop(responder);
    std::thread::sleep(Duration::from_millis(300));
    let out = s_client(s.addr);
    assert!(out.contains("Cert Status: good"), "the staple stays: {out}");
    // A reload reads the certificate again; its staple is carried, not fetched.
    s.signal("HUP");
    s.wait_log("reloaded: revision 2");
    let out = s_client(s.addr);
    assert!(
        out.contains("Cert Status: good"),
        "the staple survives a reload: {out}"
    );
}

/// A responder answering garbage: no staple, said once however often it is asked
/// again; handshakes go on without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_answer_staples_nothing_and_is_said_once() {
    if !have_openssl() {
        return;
    }
    let dir = TempDir::new();
    let (port, _junk) = answer_once_forever(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nContent-Type: application/ocsp-response\r\n\r\ngarbage").await;
    pki(&dir.0, "site", port);
    let d = dir.0.display();
    let s = Sluice::start(&format!(
        "listen 127.0.0.1:0 tls\nsite localhost {{ tls {d}/site.pem {d}/site.key; respond ok }}"
    ));
    let said = "site localhost: OCSP from http://127.0.0.1";
    s.wait_log(said);
    // Retries at 1 s, 2 s, …: at least two more have run by now.
    std::thread::sleep(Duration::from_millis(3500));
    s.wait_count("not an OCSP response; no staple meanwhile", 1);
    let out = s_client(s.addr);
    assert!(out.contains("OCSP response: no response sent"), "{out}");
    assert!(out.contains("CONNECTED"), "{out}");
}

/// A loopback server answering every connection with `reply`; its port.
async fn answer_once_forever(reply: &'static [u8]) -> (u16, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf).await;
                let _ = c.write_all(reply).await;
            });
        }
    });
    (port, task)
}
