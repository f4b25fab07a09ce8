//! A real `redis-server` for tests that share state through Redis.

use std::time::{Duration, Instant};

use super::require_interop;

/// A `redis-server` on a free loopback port, stopped when dropped; `None` when Redis is
/// not installed (and interop is not required).
pub struct RedisServer {
    child: std::process::Child,
    pub port: u16,
    /// What `redis-server` was started with besides the port (a password, TLS).
    extra: Vec<String>,
}

/// How a Redis is deployed: a password (`requirepass`), TLS (its certificate, key and
/// the CA clients are told of).
#[derive(Default, Clone)]
pub struct Deployed {
    pub password: Option<String>,
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf, std::path::PathBuf)>,
}

impl RedisServer {
    pub fn start() -> Option<RedisServer> {
        Self::start_as(&Deployed::default())
    }

    /// As deployed: with a password, over TLS only (plain port off).
    pub fn start_as(how: &Deployed) -> Option<RedisServer> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut extra = Vec::new();
        if let Some(p) = &how.password {
            extra.extend(["--requirepass".to_string(), p.clone()]);
        }
        if let Some((cert, key, ca)) = &how.tls {
            for (flag, path) in [
                ("--tls-cert-file", cert),
                ("--tls-key-file", key),
                ("--tls-ca-cert-file", ca),
            ] {
                extra.extend([flag.to_string(), path.display().to_string()]);
            }
            extra.extend(["--tls-auth-clients".to_string(), "no".to_string()]);
        }
        let child = match Self::spawn(port, &extra) {
            Ok(c) => c,
            Err(_) => {
                if require_interop() {
                    panic!("redis-server is required (SLUICE_INTEROP=require)");
                }
                eprintln!("skipped: redis-server is not installed");
                return None;
            }
        };
        let server = RedisServer { child, port, extra };
        server.wait_up();
        Some(server)
    }

    fn spawn(port: u16, extra: &[String]) -> std::io::Result<std::process::Child> {
        let port = port.to_string();
        // Over TLS, the plain port is off and the TLS one takes its number.
        let tls = extra.iter().any(|a| a == "--tls-cert-file");
        let mut cmd = std::process::Command::new("redis-server");
        let plain = if tls {
            cmd.args(["--tls-port", &port]);
            "0"
        } else {
            port.as_str()
        };
        cmd.args(extra)
            .args([
                "--port",
                plain,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
    }

    fn wait_up(&self) {
        let end = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < end, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same port.
    pub fn restart(&mut self) {
        self.kill();
        self.child = Self::spawn(self.port, &self.extra).unwrap();
        self.wait_up();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
