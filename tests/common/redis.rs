//! A real `redis-server` for tests that share state through Redis.

use std::time::{Duration, Instant};

use super::require_interop;

/// A `redis-server` on a free loopback port, stopped when dropped; `None` when Redis is
/// not installed (and interop is not required).
pub struct RedisServer {
    child: std::process::Child,
    pub port: u16,
}

impl RedisServer {
    pub fn start() -> Option<RedisServer> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = match Self::spawn(port) {
            Ok(c) => c,
            Err(_) => {
                if require_interop() {
                    panic!("redis-server is required (SLUICE_INTEROP=require)");
                }
                eprintln!("skipped: redis-server is not installed");
                return None;
            }
        };
        let server = RedisServer { child, port };
        server.wait_up();
        Some(server)
    }

    fn spawn(port: u16) -> std::io::Result<std::process::Child> {
        let port = port.to_string();
        std::process::Command::new("redis-server")
            .args([
                "--port",
                &port,
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
        self.child = Self::spawn(self.port).unwrap();
        self.wait_up();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
