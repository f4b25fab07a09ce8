//! The access log: one line a response — a JSON object (`time`, `client`, `host`,
//! `method`, `path`, `status`, `bytes`, `duration_ms`, `pool`, `peer`, `attempts`) or
//! a combined-log-like text line — to stdout, stderr or a file.
//!
//! Never blocks the request path: a line goes into a bounded channel to a writer task;
//! when the channel is full the line is counted as dropped, never waited for. The
//! writer flushes whenever it has caught up. SIGUSR1 reopens the file (log rotation).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, Notify};

use super::log::rfc3339;
use crate::config::{AccessLogConfig, LogTarget};

/// Lines waiting for the writer, at most.
const QUEUE: usize = 8192;

/// Lines dropped because the writer fell behind, since start.
pub static DROPPED: AtomicU64 = AtomicU64::new(0);

/// One response, as the log records it.
pub struct Entry<'a> {
    pub time: SystemTime,
    pub client: &'a str,
    pub host: &'a str,
    pub method: &'a str,
    /// Path and query as received.
    pub path: &'a str,
    pub status: u16,
    pub bytes: u64,
    pub duration_ms: u64,
    pub pool: Option<&'a str>,
    pub peer: Option<&'a str>,
    pub attempts: u32,
}

pub struct AccessLog {
    pub config: AccessLogConfig,
    tx: mpsc::Sender<String>,
    reopen: Arc<Notify>,
}

impl AccessLog {
    /// Starts the writer task. Must run inside the tokio runtime.
    pub fn start(config: AccessLogConfig) -> std::io::Result<Arc<AccessLog>> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let reopen = Arc::new(Notify::new());
        if let LogTarget::File(path) = &config.target {
            // Fail at load, not at the first line, when the file cannot be opened.
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?;
        }
        tokio::spawn(write(config.target.clone(), rx, reopen.clone()));
        Ok(Arc::new(AccessLog { config, tx, reopen }))
    }

    /// Queues a line; drops it (counted) if the writer is behind.
    pub fn record(&self, e: &Entry<'_>) {
        let line = if self.config.json { json(e) } else { text(e) };
        if self.tx.try_send(line).is_err() {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reopens the file (after rotation); nothing for stdout and stderr.
    pub fn reopen(&self) {
        self.reopen.notify_one();
    }
}

fn json(e: &Entry<'_>) -> String {
    let mut line = serde_json::json!({
        "time": rfc3339(e.time),
        "client": e.client,
        "host": e.host,
        "method": e.method,
        "path": e.path,
        "status": e.status,
        "bytes": e.bytes,
        "duration_ms": e.duration_ms,
        "pool": e.pool,
        "peer": e.peer,
        "attempts": e.attempts,
    })
    .to_string();
    line.push('\n');
    line
}

fn text(e: &Entry<'_>) -> String {
    let quote = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    format!(
        "{} - - [{}] \"{} {} HTTP/1.1\" {} {} \"{}\" {} {} {} {}ms\n",
        e.client,
        rfc3339(e.time),
        e.method,
        quote(e.path),
        e.status,
        e.bytes,
        quote(e.host),
        e.pool
            .map(quote)
            .unwrap_or_else(|| "-".into())
            .replace(' ', "_"),
        e.peer.unwrap_or("-"),
        e.attempts,
        e.duration_ms
    )
}

async fn open(target: &LogTarget) -> Box<dyn AsyncWrite + Send + Unpin> {
    match target {
        LogTarget::Stdout => Box::new(tokio::io::stdout()),
        LogTarget::Stderr => Box::new(tokio::io::stderr()),
        LogTarget::File(path) => match tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .await
        {
            Ok(f) => Box::new(f),
            Err(e) => {
                tracing::error!(
                    "sluice: access log: cannot open {}: {e}; lines go to stderr",
                    path.display()
                );
                Box::new(tokio::io::stderr())
            }
        },
    }
}

async fn write(target: LogTarget, mut rx: mpsc::Receiver<String>, reopen: Arc<Notify>) {
    let mut out = BufWriter::new(open(&target).await);
    loop {
        tokio::select! {
            line = rx.recv() => {
                let Some(line) = line else { break };
                if out.write_all(line.as_bytes()).await.is_err() {
                    DROPPED.fetch_add(1, Ordering::Relaxed);
                }
                if rx.is_empty() {
                    let _ = out.flush().await;
                }
            }
            _ = reopen.notified() => {
                let _ = out.flush().await;
                out = BufWriter::new(open(&target).await);
            }
        }
    }
    let _ = out.flush().await;
}
