//! Where a file path led, for a second, per worker thread.
//!
//! Finding a file under the root is mostly system calls: `realpath` reads every
//! component of the path as a link (a `readlink` apiece, four for a file three folders
//! down), then the file is opened and its metadata read. A busy file asked for many
//! times a second would pay the walk each time; so each worker thread remembers, per
//! path, the canonical path it led to and the identity (device and inode) of what was
//! found there, for [`KEPT_MS`] (what `open_file_cache valid=1s` does for nginx).
//!
//! A remembered answer is never trusted blindly: the canonical path is opened again and
//! the open descriptor's identity must be the remembered one. If a folder on the way was
//! swapped for a link, or the file replaced, the descriptor names another inode and the
//! path is resolved afresh (and checked against the root again). This is stricter than
//! resolving and then opening by name, where a swap between the two goes unseen.
//!
//! Per thread, so the request path takes no lock; bounded in entries and in path length,
//! so a scan of random or long paths cannot grow it. Paths that lead nowhere are not
//! remembered.

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

/// How long an answer is used, in milliseconds.
const KEPT_MS: u64 = 1000;
/// Paths remembered per thread; when full, the expired ones go, and all go if none had.
const MAX_PATHS: usize = 1024;
/// The longest path remembered (it is kept twice: asked for and canonical).
const MAX_PATH_LEN: usize = 256;

/// What a path led to: its canonical form, the identity of what was there, and until
/// when ([`crate::clock::now_ms`]) that is used.
struct Seen {
    real: Arc<Path>,
    dev: u64,
    ino: u64,
    until: u64,
}

thread_local! {
    static SEEN: RefCell<HashMap<Box<Path>, Seen>> = RefCell::new(HashMap::new());
}

/// The canonical path `path` led to within the last second on this thread, with the
/// identity of what was found there.
pub(super) fn recall(path: &Path) -> Option<(Arc<Path>, u64, u64)> {
    let now = crate::clock::now_ms();
    SEEN.with_borrow(|seen| {
        seen.get(path)
            .filter(|s| now < s.until)
            .map(|s| (s.real.clone(), s.dev, s.ino))
    })
}

/// Notes that `path` led to `real`, where `meta` was found (read from the open file).
pub(super) fn remember(path: &Path, real: &Arc<Path>, meta: &std::fs::Metadata) {
    if path.as_os_str().len() > MAX_PATH_LEN {
        return;
    }
    let now = crate::clock::now_ms();
    SEEN.with_borrow_mut(|seen| {
        if seen.len() >= MAX_PATHS {
            seen.retain(|_, s| now < s.until);
            if seen.len() >= MAX_PATHS {
                seen.clear();
            }
        }
        seen.insert(
            path.into(),
            Seen {
                real: real.clone(),
                dev: meta.dev(),
                ino: meta.ino(),
                until: now + KEPT_MS,
            },
        );
    });
}

/// Forgets `path`: what it led to is no longer there.
pub(super) fn forget(path: &Path) {
    SEEN.with_borrow_mut(|seen| seen.remove(path));
}

/// Whether `meta` (of a file just opened) is the one with identity `dev`/`ino`.
pub(super) fn same(meta: &std::fs::Metadata, dev: u64, ino: u64) -> bool {
    meta.dev() == dev && meta.ino() == ino
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_paths_are_not_kept_and_the_table_stays_bounded() {
        let dir = std::env::temp_dir();
        let meta = std::fs::metadata(&dir).unwrap();
        let real: Arc<Path> = Arc::from(dir.as_path());
        let long = Path::new("/x").join("y".repeat(MAX_PATH_LEN));
        remember(&long, &real, &meta);
        assert!(recall(&long).is_none());
        for i in 0..MAX_PATHS + 10 {
            remember(&Path::new("/p").join(i.to_string()), &real, &meta);
        }
        assert!(SEEN.with_borrow(|s| s.len()) <= MAX_PATHS);
        let last = Path::new("/p").join((MAX_PATHS + 9).to_string());
        let (r, dev, ino) = recall(&last).expect("the last one is kept");
        assert_eq!(&*r, dir.as_path());
        assert!(same(&meta, dev, ino));
        forget(&last);
        assert!(recall(&last).is_none());
    }
}
