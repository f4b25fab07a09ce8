//! The binary upgrade (`sluice upgrade`, `SIGUSR2`): the running process starts the
//! binary at its own path, with its own arguments, hands it every listening socket,
//! and steps aside once the new process says it is ready.
//!
//! Sockets go by inheritance, the way systemd's socket activation passes them: placed
//! at descriptors 3, 4, … in the new process and counted in `LISTEN_FDS`. Placing a
//! descriptor at a given number in a child, and adopting a raw descriptor as a socket,
//! both need `unsafe`, which this crate forbids, so two small crates do it: `command-fds`
//! on the old side and `listenfd` on the new. `SLUICE_LISTEN_KEYS` names each socket by
//! the listener it serves (kind, address as written, TLS, PROXY protocol), so the new
//! process adopts a socket only for the same listener of its own config and binds the
//! rest; sockets its config no longer has are closed. The new process says it is ready
//! — or why it failed — in one datagram to a Unix socket the old process names in
//! `SLUICE_UPGRADE_NOTIFY`; the old one gives it [`READY_TIMEOUT`].

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// How long a new process has to become ready before it is stopped.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(30);

const KEYS: &str = "SLUICE_LISTEN_KEYS";
const NOTIFY: &str = "SLUICE_UPGRADE_NOTIFY";

/// A socket handed over by the process this one replaces.
enum Socket {
    Tcp(std::net::TcpListener),
    Udp(std::net::UdpSocket),
}

/// What [`capture`] read at start.
struct Captured {
    /// The binary this process was started from, and its arguments.
    exe: std::io::Result<PathBuf>,
    args: Vec<OsString>,
    /// Where to tell the old process this one is ready (this process is an upgrade's).
    notify: Option<PathBuf>,
}

static CAPTURED: OnceLock<Captured> = OnceLock::new();
static INHERITED: Mutex<Option<HashMap<String, Socket>>> = Mutex::new(None);

/// Reads (and removes from the environment) what an upgrade handed this process, and
/// notes the binary's path and arguments for a later upgrade of its own. Called first
/// thing in `main`, before any thread starts.
pub fn capture() {
    let exe = started_from();
    let args = std::env::args_os().skip(1).collect();
    let notify = std::env::var_os(NOTIFY).map(PathBuf::from);
    if let Some(keys) = std::env::var_os(KEYS) {
        let mut fds = listenfd::ListenFd::from_env();
        let mut by_key = HashMap::new();
        for (i, key) in keys.to_string_lossy().split('\n').enumerate() {
            let socket = match key.starts_with("quic|") {
                true => fds.take_udp_socket(i).map(|s| s.map(Socket::Udp)),
                false => fds.take_tcp_listener(i).map(|s| s.map(Socket::Tcp)),
            };
            match socket {
                Ok(Some(s)) => {
                    by_key.insert(key.to_string(), s);
                }
                Ok(None) => {}
                Err(e) => {
                    eprintln!("sluice: upgrade: the socket handed over for {key} is unusable: {e}")
                }
            }
        }
        *INHERITED.lock().unwrap_or_else(|e| e.into_inner()) = Some(by_key);
    }
    for var in [
        "LISTEN_FDS",
        "LISTEN_PID",
        "LISTEN_FDNAMES",
        "LISTEN_FDS_FIRST_FD",
        KEYS,
        NOTIFY,
    ] {
        std::env::remove_var(var);
    }
    let _ = CAPTURED.set(Captured { exe, args, notify });
}

/// The path this binary was started by, as an upgrade runs it again: `argv[0]` made
/// absolute — a symlink a deploy switches stays a symlink, so the new build is what
/// starts — or, when it names no path, the running binary's own.
fn started_from() -> std::io::Result<PathBuf> {
    let arg0 = std::env::args_os().next().map(PathBuf::from);
    match arg0 {
        Some(p) if p.is_absolute() => Ok(p),
        Some(p) if p.components().count() > 1 => Ok(std::env::current_dir()?.join(p)),
        _ => std::env::current_exe(),
    }
}

/// The listening socket handed over for `key`, if any.
pub(crate) fn take_tcp(key: &str) -> Option<std::net::TcpListener> {
    match INHERITED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()?
        .remove(key)?
    {
        Socket::Tcp(l) => Some(l),
        Socket::Udp(_) => None,
    }
}

/// The UDP socket handed over for `key`, if any.
pub(crate) fn take_udp(key: &str) -> Option<std::net::UdpSocket> {
    match INHERITED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()?
        .remove(key)?
    {
        Socket::Udp(s) => Some(s),
        Socket::Tcp(_) => None,
    }
}

/// Closes the handed-over sockets this process's config has no listener for.
pub(crate) fn close_unclaimed() {
    let left = INHERITED.lock().unwrap_or_else(|e| e.into_inner()).take();
    for key in left.into_iter().flat_map(|m| m.into_keys()) {
        tracing::info!("sluice: upgrade: {key} is not in this config; its socket is closed");
    }
}

/// Tells the process that started this one, in an upgrade, that it is ready
/// (`READY=1`) or why it failed (`ERROR=…`). Nothing outside an upgrade.
pub fn tell_parent(message: &str) {
    let Some(path) = CAPTURED.get().and_then(|c| c.notify.as_ref()) else {
        return;
    };
    let sent = std::os::unix::net::UnixDatagram::unbound()
        .and_then(|s| s.send_to(message.as_bytes(), path).map(|_| ()));
    if let Err(e) = sent {
        eprintln!(
            "sluice: upgrade: cannot tell the old process ({}): {e}",
            path.display()
        );
    }
}

/// A socket to hand over: the key its listener is known by, and a duplicate of it.
pub(crate) struct Handover {
    pub key: String,
    pub fd: OwnedFd,
}

/// A new process that has not said it is ready: stopped if dropped before then.
struct Starting(Option<std::process::Child>);

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The socket the new process reports on, in a folder of its own only this user may
/// enter (an unpredictable name: no other local user can stand in for the new
/// process); removed with the folder when done.
struct NotifyPath {
    dir: PathBuf,
    socket: PathBuf,
}

impl NotifyPath {
    fn new() -> std::io::Result<NotifyPath> {
        use std::hash::{BuildHasher, Hasher};
        use std::os::unix::fs::DirBuilderExt;
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let dir = std::env::temp_dir().join(format!("sluice-upgrade-{:016x}", h.finish()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let socket = dir.join("ready");
        Ok(NotifyPath { dir, socket })
    }
}

impl Drop for NotifyPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Starts the binary at this process's path with its arguments and `sockets`, and
/// waits for it to be ready: its PID, or why it is not (it was stopped, and nothing of
/// it is left).
pub(crate) async fn start_successor(sockets: Vec<Handover>) -> Result<u32, String> {
    use command_fds::{CommandFdExt, FdMapping};
    let captured = CAPTURED
        .get()
        .ok_or("the binary's path was not noted at start")?;
    let exe = captured
        .exe
        .as_ref()
        .map_err(|e| format!("the binary's path is unknown: {e}"))?;
    let path = NotifyPath::new().map_err(|e| {
        format!(
            "cannot make a folder in {}: {e}",
            std::env::temp_dir().display()
        )
    })?;
    let reports = tokio::net::UnixDatagram::bind(&path.socket)
        .map_err(|e| format!("cannot make {}: {e}", path.socket.display()))?;
    let keys: Vec<&str> = sockets.iter().map(|h| h.key.as_str()).collect();
    let mut cmd = std::process::Command::new(exe);
    cmd.args(&captured.args)
        .stdin(std::process::Stdio::null())
        .env("LISTEN_FDS", sockets.len().to_string())
        .env_remove("LISTEN_PID")
        .env_remove("LISTEN_FDNAMES")
        .env_remove("LISTEN_FDS_FIRST_FD")
        .env(KEYS, keys.join("\n"))
        .env(NOTIFY, &path.socket);
    let mappings = sockets
        .into_iter()
        .enumerate()
        .map(|(i, h)| FdMapping {
            parent_fd: h.fd,
            child_fd: 3 + i as i32,
        })
        .collect();
    cmd.fd_mappings(mappings)
        .map_err(|e| format!("cannot place the sockets for the new process: {e}"))?;
    // A fork copies the page tables of a large process: not on a runtime worker.
    let child = tokio::task::spawn_blocking(move || cmd.spawn())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let pid = child.id();
    let mut starting = Starting(Some(child));
    wait_ready(&reports, &mut starting, pid).await?;
    Ok(pid)
}

/// Waits for the new process's report (`READY=1` or `ERROR=why`), its exit, or the
/// deadline; `Err`: why it is not serving.
async fn wait_ready(
    reports: &tokio::net::UnixDatagram,
    starting: &mut Starting,
    pid: u32,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            biased;
            r = reports.recv(&mut buf) => {
                let Ok(n) = r else { continue };
                let text = String::from_utf8_lossy(&buf[..n]);
                if text == "READY=1" {
                    // Ready: it serves on; reaped by a thread if it ever ends first.
                    if let Some(mut c) = starting.0.take() {
                        std::thread::spawn(move || c.wait());
                    }
                    return Ok(());
                }
                if let Some(why) = text.strip_prefix("ERROR=") {
                    return Err(format!("the new process (PID {pid}) failed: {why}"));
                }
            }
            _ = tokio::time::sleep(Duration::from_millis(50)) => {
                let exited = starting.0.as_mut().and_then(|c| c.try_wait().ok().flatten());
                if let Some(status) = exited {
                    starting.0 = None;
                    // Its report, sent just before it exited, says more than the exit.
                    let late = tokio::time::timeout(Duration::from_millis(100), reports.recv(&mut buf));
                    if let Ok(Ok(n)) = late.await {
                        if let Some(why) = String::from_utf8_lossy(&buf[..n]).strip_prefix("ERROR=") {
                            return Err(format!("the new process (PID {pid}) failed: {why}"));
                        }
                    }
                    return Err(format!(
                        "the new process (PID {pid}) exited ({status}) before it was ready; its log says why"
                    ));
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                return Err(format!(
                    "the new process (PID {pid}) was not ready within {}s; it was stopped",
                    READY_TIMEOUT.as_secs()
                ));
            }
        }
    }
}
