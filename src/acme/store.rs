//! Where accounts and certificates are kept: a folder, or Redis shared by every
//! instance that names it.
//!
//! Folder: `accounts/<directory>.json` and `certificates/<first name>/{cert,key}.pem`,
//! each written to a temporary name and renamed over the old one (a crash leaves the
//! old file or the new one, never half of one); key files and accounts are mode 0600.
//!
//! Redis: `sluice:acme:account:<directory URL>`, `sluice:acme:cert:<first name>` (JSON
//! `{cert, key}`), the order lock `sluice:acme:lock:<first name>` (`SET NX PX` with a
//! random token, kept alive while ordering, released only by its holder), and the
//! challenge answers (`sluice:acme:http-01:<token>`, `sluice:acme:tls-alpn-01:<name>`)
//! so that whichever instance the ACME server reaches can answer.

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

/// A certificate chain and its private key, PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub chain: String,
    pub key: String,
}

pub(crate) enum Storage {
    Folder(PathBuf),
    Redis {
        url: String,
        client: Option<redis::Client>,
    },
}

type Res<T> = Result<T, String>;

impl Storage {
    pub(crate) fn new(s: &AcmeStorage) -> Storage {
        match s {
            AcmeStorage::Folder(dir) => Storage::Folder(dir.clone()),
            AcmeStorage::Redis(url) => Storage::Redis {
                url: url.clone(),
                client: redis::Client::open(url.as_str()).ok(),
            },
        }
    }

    /// `folder DIR` or `redis://…`, for log lines and `/status`.
    pub(crate) fn describe(&self) -> String {
        match self {
            Storage::Folder(d) => format!("folder {}", d.display()),
            Storage::Redis { url, .. } => url.clone(),
        }
    }

    pub(crate) fn shared(&self) -> bool {
        matches!(self, Storage::Redis { .. })
    }

    /// The stored account's credentials (JSON) for `directory`.
    pub(crate) async fn account(&self, directory: &str) -> Res<Option<String>> {
        match self {
            Storage::Folder(dir) => read_file(&account_path(dir, directory)).await,
            Storage::Redis { .. } => self.get(&format!("sluice:acme:account:{directory}")).await,
        }
    }

    pub(crate) async fn save_account(&self, directory: &str, json: &str) -> Res<()> {
        match self {
            Storage::Folder(dir) => write_file(account_path(dir, directory), json, true).await,
            Storage::Redis { .. } => {
                let key = format!("sluice:acme:account:{directory}");
                self.query(redis::cmd("SET").arg(key).arg(json)).await
            }
        }
    }

    /// The certificate stored for `id` (the first of its names).
    pub(crate) async fn cert(&self, id: &str) -> Res<Option<Stored>> {
        match self {
            Storage::Folder(dir) => {
                let dir = dir.clone();
                let id = id.to_string();
                tokio::task::spawn_blocking(move || cert_in_folder(&dir, &id))
                    .await
                    .map_err(|e| e.to_string())?
            }
            Storage::Redis { .. } => {
                let Some(text) = self.get(&format!("sluice:acme:cert:{id}")).await? else {
                    return Ok(None);
                };
                let v: serde_json::Value =
                    serde_json::from_str(&text).map_err(|e| format!("stored certificate: {e}"))?;
                match (v["cert"].as_str(), v["key"].as_str()) {
                    (Some(c), Some(k)) => Ok(Some(Stored {
                        chain: c.to_string(),
                        key: k.to_string(),
                    })),
                    _ => Err("stored certificate: no cert or key".into()),
                }
            }
        }
    }

    /// What the folder holds for `id`, read now (at load, so the first handshake
    /// already gets it). Redis storage is read by the certificate's task instead.
    pub(crate) fn cert_now(&self, id: &str) -> Option<Stored> {
        match self {
            Storage::Folder(dir) => cert_in_folder(dir, id).ok().flatten(),
            Storage::Redis { .. } => None,
        }
    }

    pub(crate) async fn save_cert(&self, id: &str, s: &Stored) -> Res<()> {
        match self {
            Storage::Folder(dir) => {
                let at = dir.join("certificates").join(id);
                write_file(at.join("key.pem"), &s.key, true).await?;
                write_file(at.join("cert.pem"), &s.chain, false).await
            }
            Storage::Redis { .. } => {
                let v = serde_json::json!({"cert": s.chain, "key": s.key}).to_string();
                let key = format!("sluice:acme:cert:{id}");
                self.query(redis::cmd("SET").arg(key).arg(v)).await
            }
        }
    }

    /// Takes the order lock for `id`: `Some(token)` when this instance holds it now.
    /// A folder is this process's own: always granted.
    pub(crate) async fn lock(&self, id: &str) -> Res<Option<String>> {
        if !self.shared() {
            return Ok(Some(String::new()));
        }
        let token = random_token();
        let set: Option<String> = self
            .ask(
                redis::cmd("SET")
                    .arg(format!("sluice:acme:lock:{id}"))
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(LOCK_TTL.as_millis() as u64),
            )
            .await?;
        Ok(set.map(|_| token))
    }

    /// Extends the lock `token` holds; `false` when it is no longer this instance's.
    pub(crate) async fn keep_lock(&self, id: &str, token: &str) -> Res<bool> {
        if !self.shared() {
            return Ok(true);
        }
        let script = redis::Script::new(
            "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end",
        );
        let mut inv = script.key(format!("sluice:acme:lock:{id}"));
        inv.arg(token).arg(LOCK_TTL.as_millis() as u64);
        let n: i64 = self.script(&inv).await?;
        Ok(n == 1)
    }

    /// Releases the lock if `token` still holds it.
    pub(crate) async fn unlock(&self, id: &str, token: &str) -> Res<()> {
        if !self.shared() {
            return Ok(());
        }
        let script = redis::Script::new(
            "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end",
        );
        let mut inv = script.key(format!("sluice:acme:lock:{id}"));
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

    async fn connection(&self) -> Res<redis::aio::MultiplexedConnection> {
        let Storage::Redis { url, client } = self else {
            unreachable!("only Redis storage asks Redis");
        };
        let client = client
            .as_ref()
            .ok_or_else(|| format!("{url} is not a usable Redis address"))?;
        client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("{url}: {e}"))
    }

    async fn ask<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Res<T> {
        let run = async {
            let mut conn = self.connection().await?;
            cmd.query_async::<T>(&mut conn)
                .await
                .map_err(|e| e.to_string())
        };
        tokio::time::timeout(REDIS_TIMEOUT, run)
            .await
            .map_err(|_| format!("{}: no answer within 5s", self.describe()))?
    }

    async fn script<T: redis::FromRedisValue>(&self, inv: &redis::ScriptInvocation<'_>) -> Res<T> {
        let run = async {
            let mut conn = self.connection().await?;
            inv.invoke_async::<T>(&mut conn)
                .await
                .map_err(|e| e.to_string())
        };
        tokio::time::timeout(REDIS_TIMEOUT, run)
            .await
            .map_err(|_| format!("{}: no answer within 5s", self.describe()))?
    }
}

/// `accounts/<directory URL with every character but [A-Za-z0-9.-] as _>.json`.
fn account_path(dir: &Path, directory: &str) -> PathBuf {
    let name: String = directory
        .trim_start_matches("https://")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join("accounts").join(format!("{name}.json"))
}

fn cert_in_folder(dir: &Path, id: &str) -> Res<Option<Stored>> {
    let at = dir.join("certificates").join(id);
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
            std::process::id()
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
