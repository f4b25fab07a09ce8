//! The request body on its way to the application. FastCGI wants `CONTENT_LENGTH` before
//! STDIN, so a body is read whole (under `max_body`) before anything is sent: in memory
//! up to [`SPOOL_AT`], past that in an unlinked temporary file, so memory per upload is
//! bounded whatever `max_body` allows (six 60 MiB uploads once held 577 MB).
//!
//! Every byte held counts against one process-wide budget, `global { spool_max }`
//! (DESIGN §18.4): without it, N uploads at once held N × `max_body` in the temporary
//! folder (RAM, on tmpfs). A body that would pass it is refused `503`.
//!
//! Also the write of the whole request, counting what the socket took: a request is
//! sent again on a fresh connection only when not one byte of it left (DESIGN §1).

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{AtomicU64, Ordering};

use http_body_util::BodyExt;

use super::codec;
use super::pool::Conn;
use crate::body::{Body, BodyError};

/// Bodies larger than this go to a temporary file instead of memory.
pub(crate) const SPOOL_AT: usize = 1 << 20;

/// Bytes of request bodies held now by every FastCGI request.
static HELD: AtomicU64 = AtomicU64::new(0);
/// The most they may hold (`spool_max`; each generation sets it).
static MAX: AtomicU64 = AtomicU64::new(1 << 30);

/// Sets `spool_max`: requests reading a body from now on count against it.
pub(crate) fn set_budget(max: u64) {
    MAX.store(max, Ordering::Relaxed);
}

/// The bytes of the budget one request holds, given back when it is dropped (once the
/// application has answered, or the request failed).
#[derive(Default)]
pub(crate) struct Held(u64);

impl Held {
    /// Takes `n` more bytes of the budget; `false` (nothing taken) when they would pass
    /// it.
    fn take(&mut self, n: u64) -> bool {
        let max = MAX.load(Ordering::Relaxed);
        let mut now = HELD.load(Ordering::Relaxed);
        loop {
            if now.saturating_add(n) > max {
                return false;
            }
            match HELD.compare_exchange_weak(now, now + n, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    self.0 += n;
                    return true;
                }
                Err(was) => now = was,
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        HELD.fetch_sub(self.0, Ordering::Relaxed);
    }
}

/// A request body, read whole.
pub(crate) enum Spooled {
    Mem(Vec<u8>),
    /// An unlinked file (nothing is left behind, even after a crash) and its length.
    File(File, u64),
}

/// Why a body could not be read.
pub(crate) enum SpoolError {
    Body(BodyError),
    /// The temporary file could not be made or written.
    File(io::Error),
    /// The body would pass `spool_max`.
    Budget,
}

impl Spooled {
    pub(crate) fn len(&self) -> u64 {
        match self {
            Spooled::Mem(b) => b.len() as u64,
            Spooled::File(_, n) => *n,
        }
    }
}

/// Reads `body` whole, up to `max` bytes (else `BodyError::TooLarge`), each byte
/// counted in `held` against `spool_max` (else `SpoolError::Budget`).
pub(crate) async fn collect(
    mut body: Body,
    max: u64,
    held: &mut Held,
) -> Result<Spooled, SpoolError> {
    let mut mem = Vec::new();
    let mut file: Option<(File, u64)> = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(SpoolError::Body)?.into_data() else {
            continue;
        };
        let so_far = file.as_ref().map_or(mem.len() as u64, |f| f.1);
        if so_far + data.len() as u64 > max {
            return Err(SpoolError::Body(BodyError::TooLarge(max)));
        }
        if !held.take(data.len() as u64) {
            return Err(SpoolError::Budget);
        }
        match &mut file {
            Some((f, n)) => {
                f.write_all(&data).map_err(SpoolError::File)?;
                *n += data.len() as u64;
            }
            None if mem.len() + data.len() > SPOOL_AT => {
                let mut f = temporary().map_err(SpoolError::File)?;
                f.write_all(&mem).map_err(SpoolError::File)?;
                f.write_all(&data).map_err(SpoolError::File)?;
                file = Some((f, (mem.len() + data.len()) as u64));
                mem = Vec::new();
            }
            None => mem.extend_from_slice(&data),
        }
    }
    Ok(match file {
        Some((f, n)) => Spooled::File(f, n),
        None => Spooled::Mem(mem),
    })
}

/// A fresh file in the system's temporary folder (`TMPDIR`, else `/tmp`), readable by
/// this user only, under a name nobody can guess ahead (a file another user made first
/// is never opened: `create_new`), unlinked at once.
fn temporary() -> io::Result<File> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut last = None;
    for _ in 0..4 {
        let path = std::env::temp_dir().join(format!(
            "sluice-fastcgi-body-{}-{}-{:016x}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            crate::upstream::balancer::random()
        ));
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(f) => {
                std::fs::remove_file(&path)?;
                return Ok(f);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::ErrorKind::AlreadyExists.into()))
}

/// Writes `wire` (BEGIN_REQUEST, PARAMS and, for a body in memory, STDIN) and then a
/// spooled file's body as STDIN records. `sent` counts the bytes the socket took.
pub(crate) async fn write_request(
    conn: &mut Conn,
    wire: &[u8],
    file: Option<(&File, u64)>,
    sent: &mut u64,
) -> io::Result<()> {
    conn.write_counted(wire, sent).await?;
    let Some((f, len)) = file else {
        return Ok(());
    };
    let mut piece = vec![0u8; codec::MAX_CONTENT];
    let mut record = Vec::with_capacity(codec::MAX_CONTENT + 16);
    let mut at = 0u64;
    while at < len {
        let n = ((len - at) as usize).min(codec::MAX_CONTENT);
        f.read_exact_at(&mut piece[..n], at)?;
        record.clear();
        codec::stdin_piece(&mut record, &piece[..n]);
        conn.write_counted(&record, sent).await?;
        at += n as u64;
    }
    record.clear();
    codec::stdin_end(&mut record);
    conn.write_counted(&record, sent).await
}
