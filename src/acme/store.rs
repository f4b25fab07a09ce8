//! Where accounts and certificates are kept: a folder, or Redis shared by every
//! instance that names it.
//!
//! Certificates are kept per ACME directory: another server's certificate is never
//! taken for this one's.
//!
//! Folder: `accounts/<directory>.json` and `certificates/<directory>/<name>/{cert,key}.pem`
//! (`<directory>` the URL flattened to one file name, `<name>` the first of the names
//! in sorted order), each file written to a temporary name and renamed over the old
//! one (a crash leaves the old file or the new one, never half of one; a crash
//! between the two renames leaves a pair that does not match, which is refused when
//! read and ordered again); key files and accounts are mode 0600.
//!
//! Redis: `sluice:acme:account:<directory URL>`, `sluice:acme:cert:<directory URL>:<name>`
//! (JSON `{cert, key}`: one value, never torn), the order lock
//! `sluice:acme:lock:<directory URL>:<name>` (`SET NX PX` with a random token, kept
//! alive while ordering, released only by its holder), the failures in a row and the
//! wait after a failed order (`sluice:acme:failures:…`, `sluice:acme:retry:…`, so
//! instances do not take turns at a server that refuses),
//! and the challenge answers (`sluice:acme:http-01:<token>`,
//! `sluice:acme:tls-alpn-01:<name>`) so that whichever instance the ACME server reaches
//! can answer. One connection is kept and made again after an error.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::AcmeStorage;

/// How long a Redis command may take.
const REDIS_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the order lock lives unless its holder renews it.
pub(super) const LOCK_TTL: Duration = Duration::from_secs(60);
/// How long a published challenge answer is kept.
const CHALLENGE_TTL: Duration = Duration::from_secs(600);

/// The folder certificates some task of this process is ordering.
static FOLDER_LOCKS: std::sync::Mutex<std::collections::BTreeSet<PathBuf>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A certificate chain and its private key, PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub chain: String,
    pub key: String,
}

// One per manager: the size of the larger variant does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Storage {
    Folder {
        dir: PathBuf,
        /// The directory URL, flattened to a file name.
        scope: String,
    },
    Redis {
        url: String,
        client: Option<redis::Client>,
        /// The directory URL.
        scope: String,
        conn: std::sync::Mutex<Option<redis::aio::MultiplexedConnection>>,
        /// A read at load failed: until then, loads do not wait on Redis again.
        skip_until: std::sync::Mutex<Option<std::time::Instant>>,
    },
}

type Res<T> = Result<T, String>;

impl Storage {
    /// `s` for the certificates of the ACME server at `directory`.
    pub(crate) fn new(s: &AcmeStorage, directory: &str) -> Storage {
        match s {
            AcmeStorage::Folder(dir) => Storage::Folder {
                dir: dir.clone(),
                scope: flatten(directory.trim_end_matches('/')),
            },
            // What messages and `/status` say of it: never its password.
            AcmeStorage::Redis(url) => Storage::Redis {
                url: crate::net::redis::shown(url),
                client: crate::net::redis::client(url.as_str()).ok(),
                scope: directory.trim_end_matches('/').to_string(),
                conn: std::sync::Mutex::new(None),
                skip_until: std::sync::Mutex::new(None),
            },
        }
    }

    /// The Redis key of `what` (`cert`, `lock`, `retry`) for certificate `id`.
    fn key(&self, what: &str, id: &str) -> String {
        let scope = match self {
            Storage::Folder { scope, .. } | Storage::Redis { scope, .. } => scope,
        };
        format!("sluice:acme:{what}:{scope}:{id}")
    }

    /// `folder DIR` or `redis://…`, for log lines and `/status`.
    pub(crate) fn describe(&self) -> String {
        match self {
            Storage::Folder { dir, .. } => format!("folder {}", dir.display()),
            Storage::Redis { url, .. } => url.clone(),
        }
    }

    pub(crate) fn shared(&self) -> bool {
        matches!(self, Storage::Redis { .. })
    }

    /// The stored account's credentials (JSON) for `directory`.
    pub(crate) async fn account(&self, directory: &str) -> Res<Option<String>> {
        match self {
            Storage::Folder { dir, .. } => read_file(&account_path(dir, directory)).await,
            Storage::Redis { .. } => self.get(&format!("sluice:acme:account:{directory}")).await,
        }
    }

    pub(crate) async fn save_account(&self, directory: &str, json: &str) -> Res<()> {
        match self {
            Storage::Folder { dir, .. } => {
                write_file(account_path(dir, directory), json, true).await
            }
            Storage::Redis { .. } => {
                let key = format!("sluice:acme:account:{directory}");
                self.query(redis::cmd("SET").arg(key).arg(json)).await
            }
        }
    }

    /// The certificate stored for `id`.
    pub(crate) async fn cert(&self, id: &str) -> Res<Option<Stored>> {
        match self {
            Storage::Folder { dir, scope } => {
                let at = cert_dir(dir, scope, id);
                tokio::task::spawn_blocking(move || cert_in_folder(&at))
                    .await
                    .map_err(|e| e.to_string())?
            }
            Storage::Redis { .. } => match self.get(&self.key("cert", id)).await? {
                Some(text) => parse_stored(&text).map(Some),
                None => Ok(None),
            },
        }
    }

    /// What storage holds for `id`, read now, blocking (Redis: at most a second each
    /// to connect and to answer), when a certificate is made at load: the first
    /// handshake after a start or a reload gets it. After a Redis read fails, loads
    /// for the next 30 s do not wait on it (the task reads it instead).
    pub(crate) fn cert_now(&self, id: &str) -> Res<Option<Stored>> {
        match self {
            Storage::Folder { dir, scope } => cert_in_folder(&cert_dir(dir, scope, id)),
            Storage::Redis {
                url, skip_until, ..
            } => {
                let mut skip = skip_until.lock().unwrap_or_else(|e| e.into_inner());
                if skip.is_some_and(|t| std::time::Instant::now() < t) {
                    return Err(format!("{url}: unreachable a moment ago"));
                }
                let r = self.read_now(id);
                if r.is_err() {
                    *skip = Some(std::time::Instant::now() + Duration::from_secs(30));
                }
                r
            }
        }
    }

    /// The blocking Redis read of [`Storage::cert_now`].
    fn read_now(&self, id: &str) -> Res<Option<Stored>> {
        match self {
            Storage::Folder { .. } => Ok(None),
            Storage::Redis { url, client, .. } => {
                let client = client
                    .as_ref()
                    .ok_or_else(|| format!("{url}: not usable"))?;
                let second = Duration::from_secs(1);
                let mut c = client
                    .get_connection_with_timeout(second)
                    .map_err(|e| format!("{url}: {e}"))?;
                c.set_read_timeout(Some(second))
                    .and_then(|()| c.set_write_timeout(Some(second)))
                    .map_err(|e| format!("{url}: {e}"))?;
                let text: Option<String> = redis::cmd("GET")
                    .arg(self.key("cert", id))
                    .query(&mut c)
                    .map_err(|e| format!("{url}: {e}"))?;
                text.map(|t| parse_stored(&t)).transpose()
            }
        }
    }

    pub(crate) async fn save_cert(&self, id: &str, s: &Stored) -> Res<()> {
        match self {
            Storage::Folder { dir, scope } => {
                let at = cert_dir(dir, scope, id);
                write_file(at.join("key.pem"), &s.key, true).await?;
                write_file(at.join("cert.pem"), &s.chain, false).await
            }
            Storage::Redis { .. } => {
                let v = serde_json::json!({"cert": s.chain, "key": s.key}).to_string();
                self.query(redis::cmd("SET").arg(self.key("cert", id)).arg(v))
                    .await
            }
        }
    }

    /// Counts a failed order for `id` among all instances: the failures in a row so
    /// far (kept a day), `None` for a folder (the task counts its own).
    pub(crate) async fn count_failure(&self, id: &str) -> Res<Option<u32>> {
        if !self.shared() {
            return Ok(None);
        }
        let key = self.key("failures", id);
        let n: i64 = self.ask(redis::cmd("INCR").arg(&key)).await?;
        self.query(redis::cmd("PEXPIRE").arg(&key).arg(86_400_000u64))
            .await?;
        Ok(Some(n.clamp(1, i64::from(u32::MAX)) as u32))
    }

    /// Forgets the failures in a row once a certificate is issued.
    pub(crate) async fn clear_failures(&self, id: &str) -> Res<()> {
        if !self.shared() {
            return Ok(());
        }
        self.query(redis::cmd("DEL").arg(self.key("failures", id)))
            .await
    }

    /// Publishes that orders for `id` wait `wait` after a failure (Redis only).
    pub(crate) async fn hold_off(&self, id: &str, wait: Duration) -> Res<()> {
        if !self.shared() {
            return Ok(());
        }
        let px = wait.as_millis().max(1) as u64;
        self.query(
            redis::cmd("SET")
                .arg(self.key("retry", id))
                .arg(1)
                .arg("PX")
                .arg(px),
        )
        .await
    }

    /// How long a failed order (of any instance) still asks to wait (Redis only).
    pub(crate) async fn held_off(&self, id: &str) -> Res<Option<Duration>> {
        if !self.shared() {
            return Ok(None);
        }
        let ms: i64 = self
            .ask(redis::cmd("PTTL").arg(self.key("retry", id)))
            .await?;
        Ok((ms > 0).then(|| Duration::from_millis(ms as u64)))
    }

    /// Takes the order lock for `id`: `Some(token)` when this instance holds it now.
    /// A folder is this process's own: always granted.
    pub(crate) async fn lock(&self, id: &str) -> Res<Option<String>> {
        if let Storage::Folder { .. } = self {
            return Ok(self.folder_lock(id).then(String::new));
        }
        let token = random_token();
        let set: Option<String> = self
            .ask(
                redis::cmd("SET")
                    .arg(self.key("lock", id))
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(LOCK_TTL.as_millis() as u64),
            )
            .await?;
        Ok(set.map(|_| token))
    }

    /// A folder's order lock, process-wide: after the `acme` settings change, the
    /// replaced manager's tasks live on while an old generation does, and must not
    /// order beside the new ones (under the lock they find the new certificate).
    fn folder_lock(&self, id: &str) -> bool {
        FOLDER_LOCKS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(self.folder_key(id))
    }

    fn folder_unlock(&self, id: &str) {
        FOLDER_LOCKS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.folder_key(id));
    }

    fn folder_key(&self, id: &str) -> PathBuf {
        match self {
            Storage::Folder { dir, scope } => cert_dir(dir, scope, id),
            Storage::Redis { .. } => PathBuf::new(),
        }
    }

    /// Extends the lock `token` holds; `false` when it is no longer this instance's.
    pub(crate) async fn keep_lock(&self, id: &str, token: &str) -> Res<bool> {
        if !self.shared() {
            return Ok(true);
        }
        let script = redis::Script::new(
            "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end",
        );
        let mut inv = script.key(self.key("lock", id));
        inv.arg(token).arg(LOCK_TTL.as_millis() as u64);
        let n: i64 = self.script(&inv).await?;
        Ok(n == 1)
    }

    /// Releases the lock if `token` still holds it.
    pub(crate) async fn unlock(&self, id: &str, token: &str) -> Res<()> {
        if let Storage::Folder { .. } = self {
            self.folder_unlock(id);
            return Ok(());
        }
        let script = redis::Script::new(
            "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
        );
        let mut inv = script.key(self.key("lock", id));
        inv.arg(token);
        self.script::<i64>(&inv).await.map(|_| ())
    }

    /// Publishes a challenge answer for the other instances (Redis only).
    pub(crate) async fn publish(&self, kind: &str, key: &str, value: &str) -> Res<()> {
        if !self.shared() {
            return Ok(());
        }
        let k = format!("sluice:acme:{kind}:{key}");
        let px = CHALLENGE_TTL.as_millis() as u64;
        self.query(redis::cmd("SET").arg(k).arg(value).arg("PX").arg(px))
            .await
    }

    /// A challenge answer another instance published (Redis only).
    pub(crate) async fn published(&self, kind: &str, key: &str) -> Option<String> {
        if !self.shared() {
            return None;
        }
        self.get(&format!("sluice:acme:{kind}:{key}"))
            .await
            .ok()
            .flatten()
    }

    pub(crate) async fn withdraw(&self, kind: &str, key: &str) {
        if self.shared() {
            let k = format!("sluice:acme:{kind}:{key}");
            let _ = self.query(redis::cmd("DEL").arg(k)).await;
        }
    }

    async fn get(&self, key: &str) -> Res<Option<String>> {
        self.ask(redis::cmd("GET").arg(key)).await
    }

    async fn query(&self, cmd: &redis::Cmd) -> Res<()> {
        self.ask::<redis::Value>(cmd).await.map(|_| ())
    }

    /// The kept connection, or a new one.
    async fn connection(&self) -> Res<redis::aio::MultiplexedConnection> {
        let Storage::Redis {
            url, client, conn, ..
        } = self
        else {
            unreachable!("only Redis storage asks Redis");
        };
        if let Some(c) = conn.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(c);
        }
        let client = client
            .as_ref()
            .ok_or_else(|| format!("{url} is not a usable Redis address"))?;
        let c = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        *conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(c.clone());
        Ok(c)
    }

    /// Forgets the kept connection after an error: the next command makes a new one.
    fn broken(&self) {
        if let Storage::Redis { conn, .. } = self {
            *conn.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }

    async fn ask<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Res<T> {
        self.bounded(async {
            let mut conn = self.connection().await?;
            cmd.query_async::<T>(&mut conn)
                .await
                .map_err(|e| e.to_string())
        })
        .await
    }

    async fn script<T: redis::FromRedisValue>(&self, inv: &redis::ScriptInvocation<'_>) -> Res<T> {
        self.bounded(async {
            let mut conn = self.connection().await?;
            inv.invoke_async::<T>(&mut conn)
                .await
                .map_err(|e| e.to_string())
        })
        .await
    }

    /// `run` within [`REDIS_TIMEOUT`]; after any failure the next command connects
    /// anew.
    async fn bounded<T>(&self, run: impl std::future::Future<Output = Res<T>>) -> Res<T> {
        let r = tokio::time::timeout(REDIS_TIMEOUT, run)
            .await
            .map_err(|_| format!("{}: no answer within 5s", self.describe()))
            .and_then(|r| r);
        if r.is_err() {
            self.broken();
        }
        r
    }
}

/// `accounts/<directory URL flattened>.json`.
fn account_path(dir: &Path, directory: &str) -> PathBuf {
    dir.join("accounts")
        .join(format!("{}.json", flatten(directory)))
}

/// A certificate's folder: `certificates/SCOPE/NAME`, a wildcard's `*` spelled
/// `wildcard_` so that no shell globs it.
fn cert_dir(dir: &Path, scope: &str, id: &str) -> PathBuf {
    dir.join("certificates")
        .join(scope)
        .join(id.replacen('*', "wildcard_", 1))
}

/// The directory URL as one file name: every character but [A-Za-z0-9.-] as `_`.
fn flatten(directory: &str) -> String {
    directory
        .trim_start_matches("https://")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn parse_stored(text: &str) -> Res<Stored> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("stored certificate: {e}"))?;
    match (v["cert"].as_str(), v["key"].as_str()) {
        (Some(c), Some(k)) => Ok(Stored {
            chain: c.to_string(),
            key: k.to_string(),
        }),
        _ => Err("stored certificate: no cert or key".into()),
    }
}

fn cert_in_folder(at: &Path) -> Res<Option<Stored>> {
    let read = |p: PathBuf| match std::fs::read_to_string(&p) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", p.display())),
    };
    match (read(at.join("cert.pem"))?, read(at.join("key.pem"))?) {
        (Some(chain), Some(key)) => Ok(Some(Stored { chain, key })),
        _ => Ok(None),
    }
}

async fn read_file(p: &Path) -> Res<Option<String>> {
    match tokio::fs::read_to_string(p).await {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", p.display())),
    }
}

/// Writes `text` to a temporary file beside `path` (mode 0600 when `private`), then
/// renames it over `path`.
async fn write_file(path: PathBuf, text: &str, private: bool) -> Res<()> {
    let text = text.to_string();
    tokio::task::spawn_blocking(move || {
        let fail = |e: std::io::Error| format!("{}: {e}", path.display());
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(fail)?;
        let tmp = dir.join(format!(
            ".{}.tmp-{}",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
            random_token()
        ));
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        if private {
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        }
        let mut f = opts.open(&tmp).map_err(fail)?;
        f.write_all(text.as_bytes()).map_err(fail)?;
        f.sync_all().map_err(fail)?;
        drop(f);
        std::fs::rename(&tmp, &path).map_err(fail)
    })
    .await
    .map_err(|e| e.to_string())?
}

/// 16 random bytes, hex: the lock's token.
fn random_token() -> String {
    let mut b = [0u8; 16];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_folder_lock_is_one_holder_across_managers_of_one_process() {
        let dir = std::env::temp_dir().join("sluice-acme-lock-test");
        let a = Storage::new(&AcmeStorage::Folder(dir.clone()), "https://ca.test/dir");
        let b = Storage::new(&AcmeStorage::Folder(dir.clone()), "https://ca.test/dir/");
        let other = Storage::new(&AcmeStorage::Folder(dir), "https://other.test/dir");
        assert!(a.lock("x.test").await.unwrap().is_some());
        assert!(
            b.lock("x.test").await.unwrap().is_none(),
            "same folder, same server"
        );
        assert!(
            other.lock("x.test").await.unwrap().is_some(),
            "another server's"
        );
        assert!(
            a.lock("y.test").await.unwrap().is_some(),
            "another certificate"
        );
        a.unlock("x.test", "").await.unwrap();
        assert!(b.lock("x.test").await.unwrap().is_some());
        for (s, id) in [(&b, "x.test"), (&other, "x.test"), (&a, "y.test")] {
            s.unlock(id, "").await.unwrap();
        }
    }
}
