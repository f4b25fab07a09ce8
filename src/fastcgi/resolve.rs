//! Where a request path leads under a `fastcgi` handler's root (DESIGN §14), and, for
//! a second, where it led.
//!
//! Resolving is all system calls: `realpath` reads each component of the path as a
//! link (a `readlink` apiece), then a `stat`, and a folder's index takes a second
//! round — ten calls for `/` under a three-level root, more than the request's own
//! reads and writes. So each worker thread remembers, per handler and path, what the
//! path resolved to for [`KEPT_MS`]: a busy script is resolved once a second per
//! worker (what `open_file_cache valid=1s` does for nginx), and a script added,
//! removed or relinked is seen within that second. Per thread, so the request path
//! takes no lock; bounded in entries and in path length, so a scan of random or long
//! paths cannot grow it. Static files are resolved on every request, and opened
//! as the `files` handler opens its own: checked on the open descriptor.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::FastCgiConfig;

/// How long a resolution is used, in milliseconds.
const KEPT_MS: u64 = 1000;
/// Paths remembered per handler and thread; when full, the expired ones go, and all
/// go if none had.
const MAX_PATHS: usize = 1024;
/// The longest path remembered: a kept entry holds the path about three times over
/// (key, `SCRIPT_NAME`, `PATH_INFO`), so 1,024 of them stay near 1 MiB a handler.
const MAX_PATH_LEN: usize = 256;
/// Handlers remembered per thread (reloads make new ones); past this, all are forgotten.
const MAX_HANDLERS: usize = 16;

/// One handler's paths: where each led, and until when ([`crate::clock::now_ms`]).
type Paths = HashMap<Box<str>, (Arc<Target>, u64)>;

thread_local! {
    static SEEN: RefCell<HashMap<u64, Paths>> = RefCell::new(HashMap::new());
}

/// Where `path` (normalised, percent-encoded) leads under handler `id`'s root: what
/// this thread found within the last [`KEPT_MS`], else resolved now. A static file is
/// never kept (it is opened by name: a second's delay would widen the window in which
/// it could be swapped for a link), nor is a path over [`MAX_PATH_LEN`].
pub(super) fn resolve(id: u64, cfg: &FastCgiConfig, path: &str) -> Arc<Target> {
    if path.len() > MAX_PATH_LEN {
        return Arc::new(resolve_now(cfg, path));
    }
    let now = crate::clock::now_ms();
    let hit = SEEN.with_borrow(|seen| {
        seen.get(&id)
            .and_then(|paths| paths.get(path))
            .filter(|(_, until)| now < *until)
            .map(|(t, _)| t.clone())
    });
    if let Some(t) = hit {
        return t;
    }
    let t = Arc::new(resolve_now(cfg, path));
    if matches!(*t, Target::Static(_)) {
        return t;
    }
    SEEN.with_borrow_mut(|seen| {
        if seen.len() >= MAX_HANDLERS && !seen.contains_key(&id) {
            seen.clear();
        }
        let paths = seen.entry(id).or_default();
        if paths.len() >= MAX_PATHS {
            paths.retain(|_, (_, until)| now < *until);
            if paths.len() >= MAX_PATHS {
                paths.clear();
            }
        }
        paths.insert(path.into(), (t.clone(), now + KEPT_MS));
    });
    t
}

/// What the request path resolved to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Target {
    Script {
        script_name: String,
        path_info: String,
        filename: PathBuf,
    },
    Static(PathBuf),
    /// A folder asked for without its slash.
    Redirect,
    NotFound,
}

/// Where the request path leads (DESIGN §14, FastCGI), from the file system.
fn resolve_now(cfg: &FastCgiConfig, path: &str) -> Target {
    let Some(rel) = crate::files::decode(path) else {
        return Target::NotFound;
    };
    // On the name's bytes, ASCII case ignored: `INDEX.PHP` on a case-insensitive file
    // system, or a name that is not UTF-8, is still a script, never a static file.
    let is_script = |name: &std::ffi::OsStr| {
        use std::os::unix::ffi::OsStrExt;
        let b = name.as_bytes();
        cfg.suffix
            .iter()
            .any(|s| b.len() > s.len() && b[b.len() - s.len()..].eq_ignore_ascii_case(s.as_bytes()))
    };
    // The first segment that names a script splits SCRIPT_NAME from PATH_INFO.
    let segments: Vec<&std::ffi::OsStr> = rel.iter().collect();
    if let Some(i) = segments.iter().position(|s| is_script(s)) {
        return script_target(cfg, &segments, i, path);
    }
    let wanted = cfg.root.join(&rel);
    let real = match std::fs::canonicalize(&wanted) {
        Ok(r) if crate::files::lies_under(&r, &cfg.root) => r,
        _ => return fallback(cfg),
    };
    let Ok(meta) = std::fs::metadata(&real) else {
        return fallback(cfg);
    };
    if meta.is_dir() {
        if !path.ends_with('/') {
            return Target::Redirect;
        }
        return folder_index(cfg, &rel, &segments);
    }
    if meta.is_file() {
        // A script reached by another name (a symlink), or asked for under another
        // spelling: never its source.
        let asked = rel.file_name().unwrap_or_default();
        if real.file_name().is_some_and(is_script) || is_script(asked) {
            return Target::NotFound;
        }
        return Target::Static(real);
    }
    fallback(cfg)
}

/// A path whose segment `i` names a script: the script, with what follows as
/// PATH_INFO (its trailing slash kept), or the fallback when it is not a file.
fn script_target(
    cfg: &FastCgiConfig,
    segments: &[&std::ffi::OsStr],
    i: usize,
    path: &str,
) -> Target {
    let joined = |segs: &[&std::ffi::OsStr]| {
        segs.iter()
            .map(|s| s.to_string_lossy())
            .collect::<Vec<_>>()
            .join("/")
    };
    let script_rel: PathBuf = segments[..=i].iter().collect();
    let script_name = format!("/{}", joined(&segments[..=i]));
    let path_info = if i + 1 < segments.len() {
        let mut p = format!("/{}", joined(&segments[i + 1..]));
        let raw_segments = path.split('/').filter(|s| !s.is_empty()).count();
        if path.ends_with('/') && raw_segments > i + 1 {
            p.push('/');
        }
        p
    } else {
        String::new()
    };
    match script_file(&cfg.root, &script_rel) {
        Some(filename) => Target::Script {
            script_name,
            path_info,
            filename,
        },
        None => fallback(cfg),
    }
}

/// A folder asked for with its slash: its first `index` script, or the fallback.
fn folder_index(cfg: &FastCgiConfig, rel: &Path, segments: &[&std::ffi::OsStr]) -> Target {
    for name in &cfg.index {
        if let Some(filename) = script_file(&cfg.root, &rel.join(name)) {
            let mut script_name = String::from("/");
            for s in segments {
                script_name.push_str(&s.to_string_lossy());
                script_name.push('/');
            }
            script_name.push_str(name);
            return Target::Script {
                script_name,
                path_info: String::new(),
                filename,
            };
        }
    }
    fallback(cfg)
}

/// The front controller, or `404`.
fn fallback(cfg: &FastCgiConfig) -> Target {
    let Some(f) = &cfg.fallback else {
        return Target::NotFound;
    };
    let rel = PathBuf::from(f.trim_start_matches('/'));
    match script_file(&cfg.root, &rel) {
        Some(filename) => Target::Script {
            script_name: f.clone(),
            path_info: String::new(),
            filename,
        },
        None => Target::NotFound,
    }
}

/// The script's canonical path, when it is a regular file under root.
fn script_file(root: &Path, rel: &Path) -> Option<PathBuf> {
    let real = std::fs::canonicalize(root.join(rel)).ok()?;
    if !crate::files::lies_under(&real, root) {
        return None;
    }
    let meta = std::fs::metadata(&real).ok()?;
    meta.is_file().then_some(real)
}
