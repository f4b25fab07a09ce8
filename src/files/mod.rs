//! Static files: `files DIR`. The file is DIR joined with the request's normalised path
//! (after `strip`/`rewrite`), percent-decoded.
//!
//! Nothing outside DIR is ever served: an encoded `/` or `\` in the path, a `..` that
//! survived normalisation (none can), and a symlink whose target lies outside DIR all
//! answer `404` — the file's canonical path must lie under DIR's; a file under DIR the
//! process may not read answers `403` (nginx's and Caddy's answer). `GET` and `HEAD` only
//! (`405` otherwise). Validators: a strong `ETag` from the modification time and size,
//! and `Last-Modified`; `If-None-Match` (weak comparison) and, without it,
//! `If-Modified-Since` answer `304`. One `Range` of bytes answers `206` (`416` when it
//! cannot be satisfied); several ranges, or an `If-Range` that no longer matches, get
//! the whole file. Bodies stream from disk in 64 KiB reads, one at a time as the client
//! takes them: memory stays bounded whatever the file's size. On a plain TCP
//! HTTP/1.1 connection, with no filter reading the body, the kernel sends the file
//! from the page cache instead (`sendfile`: no read into sluice, no copy).
//!
//! A path is opened first and checked after, on the descriptor: where the kernel says
//! the open file lies must be under DIR ([`Opened::under`]). A name with no link
//! anywhere on it is opened with `openat2` refusing links (`RESOLVE_NO_SYMLINKS`), and
//! is then itself where the file lies: an `open` and an `fstat`. A name with a link on
//! it (or a kernel without `openat2`) takes an `open`, an `fstat` and one `readlink` of
//! `/proc/self/fd/N`, where resolving the name first took a `readlink` per path
//! component and still left a window between check and open.
//! File system calls (`open`, `pread`) run on the worker itself, as nginx makes them
//! without `aio`: from the page cache they take microseconds, where handing
//! each to tokio's blocking pool cost more than the read (measured: 155 µs of CPU per
//! 64 KiB response that way). A cold, slow disk stalls the worker for the read's
//! duration; `docs/config.md` says so.

mod fields;

pub(crate) use fields::lies_under;

use std::borrow::Cow;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response, StatusCode};

use crate::body::{Body, FileBody};
use crate::config::FilesConfig;
use crate::http1::encode::{hex_u64, itoa_u64};
use crate::reply::{date, local_response};

/// Serves `path` (normalised, percent-encoded) from `cfg.root`. `received`: the path
/// as the client sent it (before `strip`), normalised, for the folder redirect (made
/// only for one).
pub(crate) async fn serve<'r>(
    cfg: &FilesConfig,
    method: &Method,
    path: &str,
    received: impl FnOnce() -> Cow<'r, str>,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Response<Body> {
    if method != Method::GET && method != Method::HEAD {
        let mut r = local_response(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed\n");
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let head = method == Method::HEAD;
    let Some(rel) = decode(path) else {
        return not_found();
    };
    if !cfg.dotfiles && hidden(&rel) {
        return not_found();
    }
    match find(cfg, &rel, path) {
        Found::File(f) => send(cfg, f, headers, head).await,
        Found::Folder => slash_redirect(&received(), query),
        Found::Listing(real) => listing(&real, path, head, cfg.dotfiles).await,
        Found::Forbidden => forbidden(),
        Found::Nothing => match cfg.fallback.as_deref().map(|f| fallback(cfg, f)) {
            Some(Ok(f)) => send(cfg, f, headers, head).await,
            Some(Err(Unserved::Forbidden)) => forbidden(),
            Some(Err(Unserved::Absent)) | None => not_found(),
        },
    }
}

/// What a path names under the root.
enum Found {
    /// A file (canonical, under the root, open), or a folder's index.
    File(Opened),
    /// A folder asked for without its trailing `/`.
    Folder,
    /// A folder without an index, under `browse on`.
    Listing(PathBuf),
    /// A file (or a folder's index) under the root that sluice may not read: `403`.
    Forbidden,
    Nothing,
}

/// Why [`Opened::lookup`] found nothing to serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unserved {
    /// No such file, or none under the root, or nothing a file handler serves.
    Absent,
    /// A file under the root that the process may not read (`403`, as nginx and
    /// Caddy answer; `404` would send an operator looking for a file that is there).
    Forbidden,
}

/// A file or folder under the root: where it really is, open, and its metadata read
/// from the open descriptor (so the bytes sent are those of the file checked).
pub(crate) struct Opened {
    real: PathBuf,
    file: std::fs::File,
    meta: std::fs::Metadata,
}

impl Opened {
    /// `path` opened (links followed), when what was opened is a file or a folder that
    /// lies under `root`. The check is made on the open descriptor (where the kernel
    /// says it is), not on a resolution of the name made before or after the open: a
    /// folder on the way swapped for a link between two steps cannot slip a file from
    /// outside through. A folder that may be searched but not read (`0711`) is opened
    /// for its metadata only, so its index can still be served.
    pub(crate) fn under(root: &Path, path: &Path) -> Option<Opened> {
        Opened::lookup(root, path).ok()
    }

    /// As [`Opened::under`], saying why nothing is served: a file under the root that
    /// the process may not read is [`Unserved::Forbidden`]. Only a file the kernel
    /// places under the root is called forbidden; one a link leads out of it to (or
    /// one behind a folder sluice may not search) stays absent, so nothing is told of
    /// files elsewhere.
    pub(crate) fn lookup(root: &Path, path: &Path) -> Result<Opened, Unserved> {
        if let Some(found) = Opened::linkless(root, path) {
            return found;
        }
        let file = match open(path, false) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => match open(path, true) {
                Ok(f) if f.metadata().is_ok_and(|m| m.is_dir()) => f,
                located => return Err(refused(root, path, &e, located)),
            },
            Err(e) => {
                if !is_absent(&e) {
                    tracing::warn!("sluice: files: cannot open {}: {e}", path.display());
                }
                return Err(Unserved::Absent);
            }
        };
        Opened::checked(root, path, file).ok_or(Unserved::Absent)
    }

    /// `path` opened in one call when no link lies anywhere on it, which the kernel
    /// checks as it walks the name (`openat2` with `RESOLVE_NO_SYMLINKS`). A name made
    /// of the canonical root and plain names is then where the file lies, so the
    /// descriptor needs no `readlink` to be placed: one system call a file less.
    /// `None`: a link on the way (`ELOOP`), a refusal, or a kernel without `openat2`
    /// (before 5.6, or a sandbox that hides it: `ENOSYS`; then never tried again), all
    /// answered by the careful way. `EPERM` and `EINVAL` may be one file's (a security
    /// module, a file system's rule for names), so they fall back for that file only.
    fn linkless(root: &Path, path: &Path) -> Option<Result<Opened, Unserved>> {
        use rustix::fs::{Mode, OFlags, ResolveFlags, CWD};
        use rustix::io::Errno;
        use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
        static UNSUPPORTED: AtomicBool = AtomicBool::new(false);
        if UNSUPPORTED.load(Relaxed) || !fields::plain_under(root, path) {
            return None;
        }
        let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        match rustix::fs::openat2(CWD, path, flags, Mode::empty(), ResolveFlags::NO_SYMLINKS) {
            Ok(fd) => {
                let file = std::fs::File::from(fd);
                Some(match served(&file) {
                    Some(meta) => Ok(Opened {
                        real: path.to_path_buf(),
                        file,
                        meta,
                    }),
                    None => Err(Unserved::Absent),
                })
            }
            Err(e) if [Errno::NOENT, Errno::NOTDIR, Errno::NAMETOOLONG].contains(&e) => {
                Some(Err(Unserved::Absent))
            }
            Err(e) if [Errno::NOSYS, Errno::TOOBIG].contains(&e) => {
                if !UNSUPPORTED.swap(true, Relaxed) {
                    tracing::info!("sluice: files: openat2 unavailable ({e}); each file is placed through /proc/self/fd instead");
                }
                None
            }
            Err(_) => None,
        }
    }

    /// `file`, opened from `path`, if it is a file or folder that lies under `root`.
    fn checked(root: &Path, path: &Path, file: std::fs::File) -> Option<Opened> {
        let meta = served(&file)?;
        let real = located(&file, path, &meta)?;
        if !fields::lies_under(&real, root) {
            tracing::debug!(
                "sluice: files: {} resolves outside {}, refused",
                path.display(),
                root.display()
            );
            return None;
        }
        Some(Opened { real, file, meta })
    }

    fn is_file(&self) -> bool {
        self.meta.is_file()
    }
}

/// `file`'s metadata, if it is something a file handler serves: a file or a folder (a
/// named pipe, a device or a socket never is), not unlinked since it was opened.
fn served(file: &std::fs::File) -> Option<std::fs::Metadata> {
    let meta = file.metadata().ok()?;
    ((meta.is_file() || meta.is_dir()) && meta.nlink() != 0).then_some(meta)
}

/// Opens `path` for reading without blocking (a named pipe would wait for a writer)
/// and without taking a terminal; `meta_only`: for its metadata alone (`O_PATH`).
/// Regular files ignore `O_NONBLOCK` for reads and `sendfile`, as nginx relies on.
fn open(path: &Path, meta_only: bool) -> std::io::Result<std::fs::File> {
    use rustix::fs::OFlags;
    use std::os::unix::fs::OpenOptionsExt;
    let flags = match meta_only {
        true => OFlags::PATH,
        false => OFlags::NONBLOCK | OFlags::NOCTTY,
    };
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(path)
}

/// An open error that only means there is nothing there.
fn is_absent(e: &std::io::Error) -> bool {
    use rustix::io::Errno;
    [Errno::NOENT, Errno::NOTDIR, Errno::NAMETOOLONG, Errno::LOOP]
        .iter()
        .any(|n| e.raw_os_error() == Some(n.raw_os_error()))
}

/// What an open refused for want of permission says: forbidden when the file lies
/// under `root`, else absent. `located_fd` is the name opened again for its location
/// only (`O_PATH`): it must be a regular file (a pipe, a device or a socket stays
/// absent) lying under the root; then that very file is opened for reading through
/// its descriptor, so the refusal answered is the checked file's, whatever a link on
/// the way became meanwhile (one that turns out readable then is absent too). Without
/// `/proc` the first refusal stands. Logged: a file the worker cannot read is an
/// operator's to fix.
fn refused(
    root: &Path,
    path: &Path,
    e: &std::io::Error,
    located_fd: std::io::Result<std::fs::File>,
) -> Unserved {
    tracing::warn!("sluice: files: cannot open {}: {e}", path.display());
    let Ok(f) = located_fd else {
        return Unserved::Absent;
    };
    let Ok(meta) = f.metadata() else {
        return Unserved::Absent;
    };
    if !meta.is_file() || meta.nlink() == 0 {
        return Unserved::Absent;
    }
    if !located(&f, path, &meta).is_some_and(|real| fields::lies_under(&real, root)) {
        return Unserved::Absent;
    }
    match open(Path::new(&fd_name(&f)), false) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Unserved::Forbidden,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Unserved::Forbidden,
        _ => Unserved::Absent,
    }
}

/// Where the open `file` lies: the kernel's name for the descriptor
/// (`/proc/self/fd/N`); without `/proc`, the canonical form of `path`, only if it
/// names the very file that was opened (device and inode).
fn located(file: &std::fs::File, path: &Path, meta: &std::fs::Metadata) -> Option<PathBuf> {
    match std::fs::read_link(fd_name(file)) {
        Ok(real) if real.is_absolute() => Some(real),
        _ => located_by_name(path, meta),
    }
}

/// The kernel's name for `file`'s descriptor, `/proc/self/fd/N`.
fn fd_name(file: &std::fs::File) -> String {
    use std::os::fd::AsRawFd;
    let mut name = String::with_capacity(32);
    name.push_str("/proc/self/fd/");
    let fd = u64::try_from(file.as_raw_fd()).unwrap_or(0);
    name.push_str(std::str::from_utf8(itoa_u64(&mut [0u8; 20], fd)).unwrap_or_default());
    name
}

/// `path`'s canonical form, if it names the file `meta` describes.
fn located_by_name(path: &Path, meta: &std::fs::Metadata) -> Option<PathBuf> {
    let real = std::fs::canonicalize(path).ok()?;
    let m = std::fs::metadata(&real).ok()?;
    (m.dev() == meta.dev() && m.ino() == meta.ino()).then_some(real)
}

/// The file `rel` names under the root: itself, or for a folder its first index.
fn find(cfg: &FilesConfig, rel: &Path, path: &str) -> Found {
    let wanted = under(&cfg.root, rel);
    let found = match Opened::lookup(&cfg.root, &wanted) {
        Ok(found) => found,
        Err(Unserved::Forbidden) => return Found::Forbidden,
        Err(Unserved::Absent) => return Found::Nothing,
    };
    if found.meta.is_file() {
        return Found::File(found);
    }
    if !path.ends_with('/') {
        // The folder's own links resolve against the slashed path.
        return Found::Folder;
    }
    for name in &cfg.index {
        // The index must lie under the root too (it may be a symlink).
        match Opened::lookup(&cfg.root, &found.real.join(name)) {
            Ok(f) if f.is_file() => return Found::File(f),
            // nginx's answer too: the index is there, sluice may not read it.
            Err(Unserved::Forbidden) => return Found::Forbidden,
            _ => {}
        }
    }
    if cfg.browse {
        return Found::Listing(found.real);
    }
    Found::Nothing
}

/// Whether a segment of `rel` starts with `.` (`.well-known` first is not hidden).
fn hidden(rel: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    rel.iter()
        .enumerate()
        .any(|(k, seg)| seg.as_bytes().first() == Some(&b'.') && !(k == 0 && seg == ".well-known"))
}

/// `fallback FILE`: the file, when it exists under the root (forbidden when sluice
/// may not read it: every missing path would otherwise answer 404 for an operator's
/// mistake).
fn fallback(cfg: &FilesConfig, file: &str) -> Result<Opened, Unserved> {
    let rel = decode(file).ok_or(Unserved::Absent)?;
    match Opened::lookup(&cfg.root, &under(&cfg.root, &rel))? {
        f if f.is_file() => Ok(f),
        _ => Err(Unserved::Absent),
    }
}

/// Sends the file, or under `precompressed` the sibling the client accepts best (its
/// own `ETag`, the original's type, `Content-Encoding`), with `Vary: Accept-Encoding`
/// whenever the file has a sibling at all.
async fn send(cfg: &FilesConfig, f: Opened, headers: &HeaderMap, head: bool) -> Response<Body> {
    if cfg.precompressed.is_empty() {
        return file(f, headers, head).await;
    }
    let mut present = Vec::new();
    for c in &cfg.precompressed {
        let mut sibling = f.real.as_os_str().to_owned();
        sibling.push(c.suffix());
        if let Some(found) = Opened::under(&cfg.root, Path::new(&sibling)).filter(Opened::is_file) {
            present.push((coding(*c), found));
        }
    }
    if present.is_empty() {
        return file(f, headers, head).await;
    }
    let accept = headers
        .get(header::ACCEPT_ENCODING)
        .map_or(&b""[..], |v| v.as_bytes());
    let chosen =
        crate::filter::compress::negotiate_among(accept, |c| present.iter().any(|(p, _)| *p == c))
            .and_then(|c| present.iter().position(|(p, _)| *p == c));
    let mut r = match chosen {
        Some(i) => {
            let (c, sibling) = present.swap_remove(i);
            let mut r = file_as(sibling, headers, head, Some((&f.real, c.token()))).await;
            if matches!(r.status(), StatusCode::OK | StatusCode::PARTIAL_CONTENT) {
                r.headers_mut().insert(
                    header::CONTENT_ENCODING,
                    HeaderValue::from_static(c.token()),
                );
            }
            r
        }
        None => file(f, headers, head).await,
    };
    r.headers_mut()
        .append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    r
}

fn coding(c: crate::config::Precompressed) -> crate::filter::compress::Coding {
    use crate::config::Precompressed as P;
    use crate::filter::compress::Coding;
    match c {
        P::Zstd => Coding::Zstd,
        P::Br => Coding::Br,
        P::Gzip => Coding::Gzip,
    }
}

/// `301` to `folder` (the received path, normalised) plus `/`, the query kept. Never
/// a `Location` that starts `//` or `/\\`: browsers read both as another host.
pub(crate) fn slash_redirect(folder: &str, query: Option<&str>) -> Response<Body> {
    if !folder.starts_with('/') || folder.starts_with("//") || folder.starts_with("/\\") {
        return not_found();
    }
    let target = match query {
        Some(q) => format!("{folder}/?{q}"),
        None => format!("{folder}/"),
    };
    let mut r = Response::new(Body::Empty);
    *r.status_mut() = StatusCode::MOVED_PERMANENTLY;
    if let Ok(v) = HeaderValue::from_str(&target) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r.headers_mut().insert(header::DATE, date());
    crate::reply::server(r.headers_mut());
    r
}

pub(crate) fn not_found() -> Response<Body> {
    local_response(StatusCode::NOT_FOUND, "Not found\n")
}

/// A file under the root that sluice may not read.
pub(crate) fn forbidden() -> Response<Body> {
    local_response(StatusCode::FORBIDDEN, "Forbidden\n")
}

/// The path's segments, percent-decoded, as a relative filesystem path. `None` when a
/// segment holds an encoded `/` or `\`, decodes to `.`/`..`, or is not a path at all.
pub(crate) fn decode(path: &str) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    // One buffer for the whole path, the segments joined by `/` as `PathBuf::push`
    // joins them: an allocation a path, not one a segment and the path's regrowing.
    let mut out = Vec::with_capacity(path.len());
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        if !out.is_empty() {
            out.push(b'/');
        }
        let start = out.len();
        let b = seg.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                let v = u8::from_str_radix(hex, 16).ok()?;
                if v == b'/' || v == b'\\' || v == 0 {
                    return None;
                }
                out.push(v);
                i += 3;
            } else {
                if b[i] == b'\\' {
                    return None;
                }
                out.push(b[i]);
                i += 1;
            }
        }
        if &out[start..] == b"." || &out[start..] == b".." {
            return None;
        }
    }
    Some(PathBuf::from(std::ffi::OsString::from_vec(out)))
}

/// `rel` under the root, made at its size (`Path::join` copies the root and then
/// grows it for `rel`).
fn under(root: &Path, rel: &Path) -> PathBuf {
    let mut path = PathBuf::with_capacity(root.as_os_str().len() + 1 + rel.as_os_str().len());
    path.push(root);
    path.push(rel);
    path
}

/// `"<mtime seconds hex>-<size hex>"`, the way nginx spells it; a precompressed
/// sibling's has its coding after (`"…-br"`), so it never equals the file's.
fn etag(meta: &std::fs::Metadata, coding: Option<&str>) -> (String, Option<SystemTime>) {
    let mtime = meta.modified().ok();
    let secs = mtime
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let mut tag = String::with_capacity(40);
    tag.push('"');
    let mut buf = [0u8; 16];
    tag.push_str(std::str::from_utf8(hex_u64(&mut buf, secs)).unwrap_or_default());
    tag.push('-');
    tag.push_str(std::str::from_utf8(hex_u64(&mut buf, meta.len())).unwrap_or_default());
    if let Some(c) = coding {
        tag.push('-');
        tag.push_str(c);
    }
    tag.push('"');
    (tag, mtime)
}

/// Whether an `If-None-Match` list names `tag` (weak comparison: `W/` ignored).
fn none_match(list: &str, tag: &str) -> bool {
    list.split(',').map(str::trim).any(|t| {
        t == "*" || t.strip_prefix("W/").unwrap_or(t) == tag.strip_prefix("W/").unwrap_or(tag)
    })
}

/// A single `bytes=` range of a file of `len` bytes: `Ok(Some((start, end)))`
/// (inclusive), `Ok(None)` to send the whole file (no range, several, or a malformed
/// header, which is ignored), `Err(())` when unsatisfiable.
pub(crate) fn range(value: &str, len: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(spec) = value.trim().strip_prefix("bytes=") else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return Ok(None);
    };
    let (a, b) = (a.trim(), b.trim());
    let parse = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    match (a.is_empty(), b.is_empty()) {
        // `-N`: the last N bytes.
        (true, false) => {
            let Some(n) = parse(b) else { return Ok(None) };
            if n == 0 || len == 0 {
                return Err(());
            }
            Ok(Some((len.saturating_sub(n), len - 1)))
        }
        (false, _) => {
            let Some(start) = parse(a) else {
                return Ok(None);
            };
            let end = if b.is_empty() {
                u64::MAX
            } else {
                match parse(b) {
                    Some(e) if e >= start => e,
                    _ => return Ok(None),
                }
            };
            if start >= len {
                return Err(());
            }
            Ok(Some((start, end.min(len - 1))))
        }
        (true, true) => Ok(None),
    }
}

pub(crate) async fn file(f: Opened, headers: &HeaderMap, head: bool) -> Response<Body> {
    file_as(f, headers, head, None).await
}

/// `path`'s bytes; a precompressed `variant` names the original (whose type it
/// takes) and its coding (in its `ETag`).
async fn file_as(
    f: Opened,
    headers: &HeaderMap,
    head: bool,
    variant: Option<(&Path, &str)>,
) -> Response<Body> {
    let len = f.meta.len();
    let (tag, mtime) = etag(&f.meta, variant.map(|v| v.1));
    let last_modified = mtime.map(httpdate::fmt_http_date);
    let header_str = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    // Room for the fields set here and those the route adds after, without regrowing.
    let mut out = HeaderMap::with_capacity(12);
    if let Ok(v) = HeaderValue::from_str(&tag) {
        out.insert(header::ETAG, v);
    }
    if let Some(lm) = last_modified
        .as_deref()
        .and_then(|s| HeaderValue::from_str(s).ok())
    {
        out.insert(header::LAST_MODIFIED, lm);
    }
    out.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    out.insert(header::DATE, date());
    crate::reply::server(&mut out);
    let not_modified = not_modified(headers, &tag, mtime);
    if not_modified {
        let mut r = Response::new(Body::Empty);
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        *r.headers_mut() = out;
        return r;
    }
    if let Some(v) = fields::content_type(variant.map_or(&*f.real, |v| v.0)) {
        out.insert(header::CONTENT_TYPE, v);
    }
    // `If-Range`: the range holds only while the validator still matches exactly.
    let range_ok = match header_str(header::IF_RANGE) {
        Some(v) => v == tag || last_modified.as_deref() == Some(v),
        None => true,
    };
    let wanted = match header_str(header::RANGE).filter(|_| range_ok) {
        Some(v) => range(v, len),
        None => Ok(None),
    };
    let (status, start, count) = match wanted {
        Ok(None) => (StatusCode::OK, 0, len),
        Ok(Some((a, b))) => {
            if let Ok(v) = HeaderValue::from_str(&format!("bytes {a}-{b}/{len}")) {
                out.insert(header::CONTENT_RANGE, v);
            }
            (StatusCode::PARTIAL_CONTENT, a, b - a + 1)
        }
        Err(()) => {
            let mut r =
                local_response(StatusCode::RANGE_NOT_SATISFIABLE, "Range not satisfiable\n");
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{len}")) {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return r;
        }
    };
    out.insert(header::CONTENT_LENGTH, HeaderValue::from(count));
    let body = if head || count == 0 {
        Body::Empty
    } else {
        Body::File(Box::new(FileBody {
            file: f.file,
            at: start,
            left: count,
        }))
    };
    let mut r = Response::new(body);
    *r.status_mut() = status;
    *r.headers_mut() = out;
    r
}

/// Whether the client's copy is current (RFC 9110 §13.1): `If-None-Match` against
/// the tag when sent, else `If-Modified-Since` against the file's time, to the second.
pub(crate) fn not_modified(
    headers: &HeaderMap,
    tag: &str,
    mtime: Option<std::time::SystemTime>,
) -> bool {
    let header_str = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    match header_str(header::IF_NONE_MATCH) {
        Some(list) => none_match(list, tag),
        None => match (header_str(header::IF_MODIFIED_SINCE), mtime) {
            (Some(since), Some(m)) => httpdate::parse_http_date(since).is_ok_and(|since| {
                m.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
                    <= since.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
            }),
            _ => false,
        },
    }
}

/// A plain HTML list of a folder's entries, names escaped and links percent-encoded;
/// dot-named ones only under `dotfiles allow` (their names are not told either).
async fn listing(dir: &Path, path: &str, head: bool, dotfiles: bool) -> Response<Body> {
    let mut names = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            let name = e.file_name().to_string_lossy().into_owned();
            if !dotfiles && name.starts_with('.') {
                continue;
            }
            names.push((name, is_dir));
        }
    }
    names.sort();
    // The folder's path as the file system has it (decoded as `serve` decoded it).
    let shown = match decode(path) {
        Some(p) if p.as_os_str().is_empty() => "/".to_string(),
        Some(p) => format!("/{}/", p.display()),
        None => path.to_string(),
    };
    let title = html_escape(&shown);
    let mut html = format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Index of {title}</title></head>\n<body><h1>Index of {title}</h1>\n<ul>\n"
    );
    if path != "/" {
        html.push_str("<li><a href=\"../\">../</a></li>\n");
    }
    for (name, is_dir) in names {
        let slash = if is_dir { "/" } else { "" };
        html.push_str(&format!(
            "<li><a href=\"{}{slash}\">{}{slash}</a></li>\n",
            html_escape(&percent_encode(&name)),
            html_escape(&name)
        ));
    }
    html.push_str("</ul></body></html>\n");
    let mut r = Response::new(if head {
        Body::Empty
    } else {
        Body::full(html.clone())
    });
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    r.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(html.len()));
    r.headers_mut().insert(header::DATE, date());
    crate::reply::server(r.headers_mut());
    r
}

fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Everything but unreserved characters escaped, for a link to one entry.
fn percent_encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without `/proc`, where a file lies is its name's canonical form, and only while
    /// that name still leads to the file that was opened.
    #[test]
    fn a_name_locates_the_open_file_only_while_it_leads_to_it() {
        let dir = std::env::temp_dir().join(format!("sluice-located-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.txt");
        std::fs::write(&path, "one").unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let meta = file.metadata().unwrap();
        let canonical = std::fs::canonicalize(&path).unwrap();
        assert_eq!(located_by_name(&path, &meta), Some(canonical.clone()));
        assert_eq!(located(&file, &path, &meta), Some(canonical));
        std::fs::write(dir.join("b.txt"), "two").unwrap();
        std::fs::rename(dir.join("b.txt"), &path).unwrap();
        assert_eq!(located_by_name(&path, &meta), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A name with no link on it is opened in one call and placed by its name; a link
    /// anywhere on the way (inside the root or out of it), a `.` or a doubled `/` is
    /// left to the careful way, which still places and confines it.
    #[test]
    fn only_a_name_without_links_is_opened_in_one_call() {
        let base = std::env::temp_dir().join(format!("sluice-linkless-{}", std::process::id()));
        let root = base.join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a.txt"), "a").unwrap();
        std::fs::write(base.join("outside.txt"), "o").unwrap();
        std::os::unix::fs::symlink(root.join("sub"), root.join("via")).unwrap();
        std::os::unix::fs::symlink(base.join("outside.txt"), root.join("out.txt")).unwrap();
        let root = std::fs::canonicalize(&root).unwrap();
        let plain = root.join("sub/a.txt");
        // Whether this kernel (or sandbox) has openat2 at all, asked of it directly.
        let flags = rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC;
        let any = rustix::fs::ResolveFlags::empty();
        match rustix::fs::openat2(
            rustix::fs::CWD,
            &root,
            flags,
            rustix::fs::Mode::empty(),
            any,
        ) {
            Ok(_) => {
                match Opened::linkless(&root, &plain) {
                    Some(Ok(found)) => assert_eq!(found.real, plain),
                    other => panic!("not opened in one call: {:?}", other.map(|o| o.err())),
                }
                assert!(matches!(
                    Opened::linkless(&root, &root.join("sub/none.txt")),
                    Some(Err(Unserved::Absent))
                ));
            }
            Err(e) => eprintln!("skipped the one-call checks: openat2 here answers {e}"),
        }
        assert_eq!(Opened::lookup(&root, &plain).ok().unwrap().real, plain);
        for name in [
            "via/a.txt",
            "out.txt",
            "sub/./a.txt",
            "sub//a.txt",
            "sub/../sub/a.txt",
        ] {
            let path = PathBuf::from(format!("{}/{name}", root.display()));
            assert!(Opened::linkless(&root, &path).is_none(), "{name}");
        }
        let through = Opened::lookup(&root, &root.join("via/a.txt")).ok().unwrap();
        assert_eq!(through.real, plain);
        assert!(Opened::lookup(&root, &root.join("out.txt")).is_err());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn ranges() {
        assert_eq!(range("bytes=0-9", 100), Ok(Some((0, 9))));
        assert_eq!(range("bytes=90-", 100), Ok(Some((90, 99))));
        assert_eq!(range("bytes=-10", 100), Ok(Some((90, 99))));
        assert_eq!(range("bytes=-1000", 100), Ok(Some((0, 99))));
        assert_eq!(range("bytes=50-1000", 100), Ok(Some((50, 99))));
        assert_eq!(range("bytes=100-", 100), Err(()));
        assert_eq!(range("bytes=-0", 100), Err(()));
        assert_eq!(range("bytes=0-1,5-6", 100), Ok(None));
        assert_eq!(range("bytes=9-1", 100), Ok(None));
        assert_eq!(range("items=0-1", 100), Ok(None));
        assert_eq!(range("bytes=a-b", 100), Ok(None));
        assert_eq!(range("bytes=+1-2", 100), Ok(None));
    }

    #[test]
    fn decoding_refuses_escapes_out_of_a_segment() {
        assert_eq!(decode("/a/b%20c.txt"), Some(PathBuf::from("a/b c.txt")));
        assert_eq!(decode("/a%2Fb"), None);
        assert_eq!(decode("/a%5Cb"), None);
        assert_eq!(decode("/a\\b"), None);
        assert_eq!(decode("/%2E%2E/x"), None);
        assert_eq!(decode("/a/%00"), None);
        assert_eq!(decode("/"), Some(PathBuf::new()));
    }

    proptest::proptest! {
        /// Names written with any mix of raw and percent-encoded bytes, behind single
        /// or doubled slashes, decode to the names joined as a path; a name that is
        /// `.` or `..` once decoded, or holds a `/`, a `\` or a NUL, refuses the path.
        #[test]
        fn decode_gives_the_names_back_as_a_path(
            names in proptest::collection::vec(
                proptest::collection::vec(
                    (proptest::sample::select(b"a.%/\\\0\xc3 ".to_vec()), proptest::bool::ANY),
                    1..4,
                ),
                0..4,
            ),
            doubled in proptest::bool::ANY,
        ) {
            use std::os::unix::ffi::OsStrExt;
            let mut path = String::new();
            for name in &names {
                path.push_str(if doubled { "//" } else { "/" });
                for &(b, encode) in name {
                    // Only what a URL may carry raw is written raw.
                    if encode || !b.is_ascii() || b == b'%' || b == b'/' || b == 0 {
                        path.push_str(&format!("%{b:02X}"));
                    } else {
                        path.push(b as char);
                    }
                }
            }
            let bytes: Vec<Vec<u8>> = names.iter().map(|n| n.iter().map(|p| p.0).collect()).collect();
            let refused = bytes.iter().any(|n| {
                n == b"." || n == b".." || n.iter().any(|&b| b == b'/' || b == b'\\' || b == 0)
            });
            let want = (!refused).then(|| {
                bytes.iter().map(|n| std::ffi::OsStr::from_bytes(n)).collect::<PathBuf>()
            });
            proptest::prop_assert_eq!(decode(&path), want, "{}", path);
        }
    }

    #[test]
    fn if_none_match_is_weak() {
        assert!(none_match("\"a\", W/\"b\"", "\"b\""));
        assert!(none_match("*", "\"b\""));
        assert!(!none_match("\"c\"", "\"b\""));
    }
}
