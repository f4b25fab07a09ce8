//! The disk store's files: one per stored response, written whole to a temporary
//! name and renamed into place (the rename is the commit: a crash, `kill -9`
//! included, leaves either the old state or the new, never half a file), read back
//! and checked when the store opens.
//!
//! A file is a line `SLUICE-CACHE 1`, a line of JSON (the key, the status, the
//! fields with their values in base64, the times, the `Vary` values, the body's
//! length), then the body. A file whose length does not match what its JSON says, or
//! that does not parse, is deleted on open; so are temporary files left by a crash.
//! The index lives in memory; hits read the body from the file (with `sendfile` on
//! plain TCP).

use std::io::{BufRead, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::{json, Value};

use super::control::ResponseDirectives;
use super::object::{Held, OnDisk, Stored};

const MAGIC: &str = "SLUICE-CACHE 1\n";

/// A name no other write of this process uses, under `dir`.
fn fresh_name(dir: &Path) -> (PathBuf, PathBuf) {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let name = format!("{stamp:x}-{:x}-{n:x}.obj", std::process::id());
    (dir.join(format!(".{name}.tmp")), dir.join(name))
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

/// Makes a store's folder and the folders above it that are missing, readable by
/// sluice's user alone: stored responses can hold what one client was meant to see.
pub(crate) fn make_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Writes `obj` (whose body is in memory) under `dir`; where its body now lies.
pub(crate) fn write(dir: &Path, key: &str, obj: &Stored) -> std::io::Result<OnDisk> {
    let Held::Memory(body) = &obj.body else {
        return Err(std::io::Error::other("the body is on disk already"));
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let fields: Vec<Value> = obj
        .headers
        .iter()
        .map(|(n, v)| json!([n.as_str(), b64.encode(v.as_bytes())]))
        .collect();
    let meta = json!({
        "key": key,
        "status": obj.status.as_u16(),
        "fields": fields,
        "response_time_ms": millis(obj.response_time),
        "initial_age_s": obj.initial_age.as_secs(),
        "lifetime_s": obj.lifetime.as_secs(),
        "swr_s": obj.swr.as_secs(),
        "sie_s": obj.sie.as_secs(),
        "vary": obj.vary.iter().map(|(n, v)| json!([n, v])).collect::<Vec<_>>(),
        "body_len": body.len(),
    })
    .to_string();
    let (tmp, path) = fresh_name(dir);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(MAGIC.as_bytes())?;
        f.write_all(meta.as_bytes())?;
        f.write_all(b"\n")?;
        f.write_all(body)?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let offset = (MAGIC.len() + meta.len() + 1) as u64;
    Ok(OnDisk {
        path,
        offset,
        len: body.len() as u64,
    })
}

/// Every complete object under `dir`, oldest first, with its key; what is not one
/// (a temporary file, a truncated or unreadable object) is deleted and counted.
pub(crate) fn open(dir: &Path) -> (Vec<(String, Stored)>, usize) {
    let mut found = Vec::new();
    let mut dropped = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (found, 0);
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".obj") || name.starts_with('.') {
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(&path);
                dropped += 1;
            }
            continue;
        }
        match read(&path) {
            Some(obj) => found.push(obj),
            None => {
                tracing::warn!(
                    "sluice: cache: {}: incomplete or unreadable, deleted",
                    path.display()
                );
                let _ = std::fs::remove_file(&path);
                dropped += 1;
            }
        }
    }
    found.sort_by_key(|(_, o)| o.response_time);
    (found, dropped)
}

/// One object file, checked: its JSON parses and its length is the JSON's promise.
fn read(path: &Path) -> Option<(String, Stored)> {
    let file = std::fs::File::open(path).ok()?;
    let total = file.metadata().ok()?.len();
    let mut r = std::io::BufReader::new(file);
    let mut magic = String::new();
    r.by_ref().take(64).read_line(&mut magic).ok()?;
    if magic != MAGIC {
        return None;
    }
    let mut line = Vec::new();
    r.by_ref().take(1 << 20).read_until(b'\n', &mut line).ok()?;
    if line.last() != Some(&b'\n') {
        return None;
    }
    let meta: Value = serde_json::from_slice(&line).ok()?;
    let offset = (magic.len() + line.len()) as u64;
    let len = meta["body_len"].as_u64()?;
    if offset.checked_add(len) != Some(total) {
        return None;
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut headers = HeaderMap::new();
    for f in meta["fields"].as_array()? {
        let name = HeaderName::from_bytes(f[0].as_str()?.as_bytes()).ok()?;
        let value = HeaderValue::from_bytes(&b64.decode(f[1].as_str()?).ok()?).ok()?;
        headers.append(name, value);
    }
    let vary = meta["vary"]
        .as_array()?
        .iter()
        .map(|v| {
            Some((
                v[0].as_str()?.to_string(),
                v[1].as_str().map(str::to_string),
            ))
        })
        .collect::<Option<Box<[_]>>>()?;
    // Bounded as the fields' own values are (2^31 s), so no sum of them overflows.
    let secs = |k: &str| {
        meta[k]
            .as_u64()
            .filter(|&n| n <= 1 << 31)
            .map(Duration::from_secs)
    };
    let obj = Stored {
        status: StatusCode::from_u16(meta["status"].as_u64()? as u16).ok()?,
        dirs: ResponseDirectives::of(&headers),
        headers,
        body: Held::Disk(std::sync::Arc::new(OnDisk {
            path: path.to_path_buf(),
            offset,
            len,
        })),
        response_time: UNIX_EPOCH
            .checked_add(Duration::from_millis(meta["response_time_ms"].as_u64()?))
            .filter(|t| *t <= SystemTime::now() + Duration::from_secs(86_400))?,
        initial_age: secs("initial_age_s")?,
        lifetime: secs("lifetime_s")?,
        vary,
        swr: secs("swr_s")?,
        sie: secs("sie_s")?,
    };
    Some((meta["key"].as_str()?.to_string(), obj))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_survives_the_round_trip_and_a_truncated_one_is_dropped() {
        let dir = std::env::temp_dir().join(format!("sluice-disk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("cache-control", HeaderValue::from_static("max-age=60"));
        headers.insert("x-bin", HeaderValue::from_bytes(b"\xfe\x80ok").unwrap());
        let obj = Stored {
            status: StatusCode::OK,
            dirs: ResponseDirectives::of(&headers),
            headers,
            body: Held::Memory(bytes::Bytes::from_static(b"hello disk")),
            response_time: SystemTime::now(),
            initial_age: Duration::from_secs(3),
            lifetime: Duration::from_secs(60),
            vary: vec![("accept".to_string(), None)].into(),
            swr: Duration::ZERO,
            sie: Duration::from_secs(9),
        };
        let at = write(&dir, "GET h /x", &obj).unwrap();
        let bad = write(&dir, "GET h /y", &obj).unwrap();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&bad.path)
            .unwrap();
        f.set_len(bad.offset + 3).unwrap();
        std::fs::write(dir.join(".left.obj.tmp"), b"partial").unwrap();
        let (found, dropped) = open(&dir);
        assert_eq!(dropped, 2, "the truncated object and the temporary file");
        assert_eq!(found.len(), 1);
        let (key, back) = &found[0];
        assert_eq!(key, "GET h /x");
        assert_eq!(back.headers, obj.headers);
        assert_eq!((back.initial_age, back.sie), (obj.initial_age, obj.sie));
        assert_eq!(back.vary, obj.vary);
        let Held::Disk(d) = &back.body else {
            panic!("read back as a file")
        };
        assert_eq!((d.offset, d.len), (at.offset, at.len));
        let bytes = std::fs::read(&d.path).unwrap();
        assert_eq!(&bytes[d.offset as usize..], b"hello disk");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
