//! The fields of a file's response that depend on the file alone: its type
//! (`Content-Type`) and its validator (`ETag`), and the check that the file lies under
//! the root. Made for every file served, so made without the formatting machinery,
//! without a search through every known type for the types most sites serve, and
//! without taking paths apart into components (docs/performance.md, tenth part: these
//! took about a fifth of a 64 KiB file's user-space instructions).

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
    guess(path).and_then(|t| HeaderValue::from_str(&t).ok())
}

/// [`COMMON`]'s types, each made once for the process; a copy of one shares its bytes
/// (a static `HeaderValue`: no count to change).
fn common() -> &'static [Option<HeaderValue>] {
    static TYPES: OnceLock<Vec<Option<HeaderValue>>> = OnceLock::new();
    TYPES.get_or_init(|| {
        COMMON
            .iter()
            .map(|ext| {
                let t = guess(Path::new(&format!("x.{ext}")))?;
                HeaderValue::from_str(&t).ok()?;
                Some(HeaderValue::from_static(Box::leak(t.into_boxed_str())))
            })
            .collect()
    })
}

fn guess(path: &Path) -> Option<String> {
    Some(
        mime_guess::from_path(path)
            .first_or_octet_stream()
            .to_string(),
    )
}

/// `v` in base `RADIX` (10 or 16, lowercase digits), appended to `out`.
pub(super) fn push_number<const RADIX: u64>(out: &mut String, mut v: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b"0123456789abcdef"[(v % RADIX) as usize];
        v /= RADIX;
        if v == 0 {
            break;
        }
    }
    out.extend(digits[i..].iter().map(|&d| char::from(d)));
}

/// Whether `real` lies in `root` or is `root`. Both are canonical (from the kernel or
/// `canonicalize`: no `.`, `..`, doubled or trailing `/`), so comparing bytes up to a
/// `/` says what comparing components would.
pub(super) fn lies_under(real: &Path, root: &Path) -> bool {
    let (r, base) = (real.as_os_str().as_bytes(), root.as_os_str().as_bytes());
    r.starts_with(base) && (r.len() == base.len() || base.ends_with(b"/") || r[base.len()] == b'/')
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

    #[test]
    fn numbers_in_both_bases() {
        for v in [0, 9, 10, 15, 16, 255, 1_700_000_000, u64::MAX] {
            let (mut d, mut h) = (String::new(), String::new());
            push_number::<10>(&mut d, v);
            push_number::<16>(&mut h, v);
            assert_eq!((d, h), (v.to_string(), format!("{v:x}")));
        }
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
    }
}
