//! A real authoritative DNS server for tests: BIND's `named` (Debian `bind9`), primary
//! for one zone on a loopback port, taking RFC 2136 updates signed with one TSIG key.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::pebble::free_port;
use super::{require_interop, Group, TempDir};

pub struct Bind {
    pub addr: SocketAddr,
    pub zone: String,
    pub key_name: String,
    /// The key as `tsig-keygen` writes it.
    pub key_file: PathBuf,
    /// The base64 secret.
    pub secret: String,
    log: PathBuf,
    _named: Group,
    _dir: TempDir,
}

/// `named`, wherever Debian put it (/usr/sbin is not on every PATH).
fn named() -> Option<PathBuf> {
    ["/usr/sbin/named", "/usr/bin/named"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

impl Bind {
    /// Starts `named` as primary for `zone`, whose `records` (zone-file lines, e.g.
    /// `app IN A 127.0.0.1`) come after its SOA and NS. `None` (skipped) when BIND is
    /// not installed and interop is not required.
    pub fn start(zone: &str, records: &str) -> Option<Bind> {
        let Some(named) = named() else {
            if require_interop() {
                panic!("BIND is required (SLUICE_INTEROP=require): apt-get install bind9");
            }
            eprintln!("skipped: BIND (named) is not installed");
            return None;
        };
        let dir = TempDir::new();
        let d = dir.0.display().to_string();
        let key_name = "sluice-acme".to_string();
        let mut raw = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw).unwrap();
        use base64::Engine as _;
        let secret = base64::engine::general_purpose::STANDARD.encode(raw);
        let key = format!(
            "key \"{key_name}\" {{\n\talgorithm hmac-sha256;\n\tsecret \"{secret}\";\n}};\n"
        );
        let key_file = dir.write("tsig.key", &key);
        dir.write(
            &format!("{zone}.zone"),
            &format!(
                "$TTL 60\n@ IN SOA ns.{zone}. hostmaster.{zone}. (1 60 60 600 60)\n@ IN NS ns.{zone}.\nns IN A 127.0.0.1\n{records}\n"
            ),
        );
        let port = free_port();
        let conf = dir.write(
            "named.conf",
            &format!(
                "include \"{d}/tsig.key\";
controls {{ }};
options {{
    directory \"{d}\"; pid-file \"{d}/named.pid\"; session-keyfile \"{d}/session.key\";
    listen-on port {port} {{ 127.0.0.1; }}; listen-on-v6 {{ none; }};
    recursion no; dnssec-validation no; notify no; allow-transfer {{ none; }};
}};
zone \"{zone}\" {{
    type primary; file \"{d}/{zone}.zone\";
    update-policy {{ grant {key_name} zonesub TXT; }};
}};
"
            ),
        );
        let log = dir.0.join("named.log");
        let mut cmd = Command::new(named);
        cmd.args(["-g", "-4", "-n", "1", "-c", conf.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let group = Group::spawn(cmd).expect("named starts");
        let end = Instant::now() + Duration::from_secs(15);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("running") {
                break;
            }
            assert!(
                Instant::now() < end && !text.contains("exiting"),
                "named did not start:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Bind {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            zone: zone.to_string(),
            key_name,
            key_file,
            secret,
            log,
            _named: group,
            _dir: dir,
        })
    }

    /// What `named` logged (its updates among it).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The TXT values at `name` now, asked with `dig` (a program of its own).
    pub fn txt(&self, name: &str) -> Vec<String> {
        let out = Command::new("dig")
            .args([
                "+short",
                "+time=2",
                "+tries=2",
                "-p",
                &self.addr.port().to_string(),
                "@127.0.0.1",
                "TXT",
                name,
            ])
            .output()
            .expect("dig runs (apt-get install bind9-dnsutils)");
        assert!(out.status.success(), "dig failed: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.trim_matches('"').to_string())
            .filter(|l| !l.is_empty())
            .collect()
    }
}
