//! What every file served needs, made cheaply: its type (`Content-Type`) without a
//! search through every known type for the types most sites serve, and the check that
//! it lies under the root without taking paths apart into components. (Its `ETag`'s
//! digits come from `http1::encode`'s writers, without the formatting machinery.
//! docs/performance.md, tenth part: these took about a fifth of a 64 KiB file's
//! user-space instructions.)

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::OnceLock;

use http::header::HeaderValue;

/// The extensions most sites serve. Their types are asked of `mime_guess` once, so a
/// type is the same whichever way it was found.
const COMMON: [&str; 26] = [
    "html", "css", "js", "json", "png", "jpg", "svg", "webp", "woff2", "ico", "gif", "jpeg", "txt",
    "xml", "mjs", "avif", "woff", "pdf", "wasm", "map", "mp4", "webm", "bin", "htm", "gz", "zip",
];

/// The type of the file at `path`, as `mime_guess` names it by its extension (any
/// case); `application/octet-stream` when nothing does.
pub(super) fn content_type(path: &Path) -> Option<HeaderValue> {
    let name = path.as_os_str().as_bytes();
    let name = &name[name.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1)..];
    // `.profile` has no extension; anything unusual is `mime_guess`'s to judge.
    if let Some(dot) = name.iter().rposition(|&b| b == b'.').filter(|&i| i > 0) {
        let ext = &name[dot + 1..];
        if let Some(i) = COMMON
            .iter()
            .position(|c| c.as_bytes().eq_ignore_ascii_case(ext))
        {
            return common()[i].clone();
        }
    }
    HeaderValue::from_str(&guess(path)).ok()
}

/// [`COMMON`]'s types, each made once for the process; a copy of one shares its bytes
/// (a static `HeaderValue`: no count to change).
fn common() -> &'static [Option<HeaderValue>] {
    static TYPES: OnceLock<Vec<Option<HeaderValue>>> = OnceLock::new();
    TYPES.get_or_init(|| {
        COMMON
            .iter()
            .map(|ext| {
                let t = guess(Path::new(&format!("x.{ext}")));
                HeaderValue::from_str(&t).ok()?;
                Some(HeaderValue::from_static(Box::leak(t.into_boxed_str())))
            })
            .collect()
    })
}

fn guess(path: &Path) -> String {
    mime_guess::from_path(path)
        .first_or_octet_stream()
        .to_string()
}

/// Whether `real` lies in `root` or is `root`. Both are canonical (from the kernel or
/// `canonicalize`: no `.`, `..`, doubled or trailing `/`), so comparing bytes up to a
/// `/` says what comparing components would.
pub(crate) fn lies_under(real: &Path, root: &Path) -> bool {
    let (r, base) = (real.as_os_str().as_bytes(), root.as_os_str().as_bytes());
    r.starts_with(base) && (r.len() == base.len() || base.ends_with(b"/") || r[base.len()] == b'/')
}

/// Whether `path` is the canonical `root` followed by plain names only (none empty, `.`
/// or `..`: no doubled or trailing `/`). With no link on the way, such a name is the
/// canonical path of what it names, and lies under `root`.
pub(crate) fn plain_under(root: &Path, path: &Path) -> bool {
    let (p, base) = (path.as_os_str().as_bytes(), root.as_os_str().as_bytes());
    match p
        .strip_prefix(base)
        .and_then(|rest| rest.strip_prefix(b"/"))
    {
        Some(rest) => rest
            .split(|&b| b == b'/')
            .all(|name| !name.is_empty() && name != b"." && name != b".."),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_types_are_mime_guess_s_in_any_case() {
        for ext in COMMON {
            for name in [
                format!("/a/b.{ext}"),
                format!("/a/b.{}", ext.to_uppercase()),
            ] {
                let want = mime_guess::from_path(&name).first_or_octet_stream();
                let got = content_type(Path::new(&name)).unwrap();
                assert_eq!(got.to_str().unwrap(), want.as_ref(), "{name}");
            }
        }
        // Names off the table, or without an extension, are mime_guess's own answer.
        for name in [
            "/a/.profile",
            "/a/b",
            "/a.html/b",
            "/a/b.tar.GZ",
            "/a/b.rtf",
            "/a/b.",
        ] {
            let want = mime_guess::from_path(name).first_or_octet_stream();
            let got = content_type(Path::new(name)).unwrap();
            assert_eq!(got.to_str().unwrap(), want.as_ref(), "{name}");
        }
        assert_eq!(
            content_type(Path::new("/a/.profile")).unwrap(),
            "application/octet-stream"
        );
    }

    proptest::proptest! {
        /// On canonical paths, the byte comparison is `Path::starts_with`.
        #[test]
        fn lies_under_is_starts_with_on_canonical_paths(
            real in proptest::collection::vec("[ab]{1,2}|c\\.|\\.d", 0..4),
            root in proptest::collection::vec("[ab]{1,2}|c\\.|\\.d", 0..3),
        ) {
            let (real, root) = (format!("/{}", real.join("/")), format!("/{}", root.join("/")));
            proptest::prop_assert_eq!(
                lies_under(Path::new(&real), Path::new(&root)),
                Path::new(&real).starts_with(&root),
                "{} under {}", real, root
            );
        }

        /// A plain name under the root is one that nothing normalises away, whose
        /// components are the root's and then names only, and that lies under the root.
        #[test]
        fn plain_under_is_a_name_nothing_normalises(
            rel in proptest::collection::vec("a|\\.a|b\\.|\\.|\\.\\.|", 0..4),
            root in proptest::collection::vec("a|b", 1..3),
            slash in proptest::bool::ANY,
        ) {
            use std::path::{Component, PathBuf};
            let root = format!("/{}", root.join("/"));
            let path = format!("{root}{}{}", if slash { "/" } else { "" }, rel.join("/"));
            let (p, r) = (Path::new(&path), Path::new(&root));
            let plain = p.components().collect::<PathBuf>().as_os_str() == p.as_os_str()
                && !p.components().any(|c| c == Component::ParentDir)
                && p.starts_with(r)
                && p.components().count() > r.components().count();
            proptest::prop_assert_eq!(plain_under(r, p), plain, "{}", path);
            if plain {
                proptest::prop_assert!(lies_under(p, r));
            }
        }
    }
}
