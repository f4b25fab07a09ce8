//! Signed configs (DESIGN §15.4, §15.8): with `--verify-key FILE`, every config file
//! read — the main file and each import — needs a valid minisign signature beside it
//! (`FILE.minisig`), checked against the bytes that were parsed. The key comes from the
//! command line, never from the config it verifies.
//!
//! A signature also says when it was made (minisign's trusted comment carries
//! `timestamp:UNIX`, which the signature covers). A reload refuses a file signed before
//! the same file of the running revision (DESIGN §18.3): last month's file and its
//! valid signature, put back on disk, cannot roll the config back. An explicit rollback
//! (`POST /rollback/N`) is the only way back.

use std::collections::BTreeMap;

use std::sync::Arc;

use minisign_verify::{PublicKey, Signature};

use super::diag::{Diagnostic, Sources, Span};
use super::files::Reader;

/// A minisign public key, and its id as `minisign` prints it.
pub struct VerifyKey {
    key: PublicKey,
    id: String,
}

impl std::fmt::Debug for VerifyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerifyKey({})", self.id)
    }
}

impl VerifyKey {
    /// A `minisign.pub` file (its comment line and key line), or the bare key line.
    pub fn from_file(path: &str) -> Result<Arc<VerifyKey>, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        let line = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with("untrusted comment:"))
            .ok_or_else(|| format!("{path}: no public key in the file"))?;
        let key = PublicKey::from_base64(line)
            .map_err(|e| format!("{path}: not a minisign public key: {e}"))?;
        let id = key_id(line).ok_or_else(|| format!("{path}: not a minisign public key"))?;
        Ok(Arc::new(VerifyKey { key, id }))
    }

    /// The key id: 16 upper-case hex digits, as `minisign` prints it.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// The id in a key line: bytes 2..10 of the decoded key, a little-endian number.
fn key_id(b64: &str) -> Option<String> {
    use base64::Engine as _;
    let bin = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let id: [u8; 8] = bin.get(2..10)?.try_into().ok()?;
    Some(format!("{:016X}", u64::from_le_bytes(id)))
}

/// When each file of a load was signed (Unix seconds), by its path.
pub type SignedAt = BTreeMap<String, u64>;

/// Checks the signature of every file of `sources` from `first` on (a rollback's main
/// text was checked when it was first loaded), and that none was signed before the
/// same file in `running` (the running revision's times); the errors, one per file,
/// and when each file was signed.
pub(crate) fn verify(
    sources: &Sources,
    key: &VerifyKey,
    files: std::ops::Range<usize>,
    reader: &Reader<'_>,
    running: &SignedAt,
) -> (Vec<Diagnostic>, SignedAt) {
    let mut errors = Vec::new();
    let mut signed = SignedAt::new();
    for id in files {
        let name = sources.name(id);
        let at = Span {
            file: id,
            line: 0,
            col: 0,
        };
        // A published bundle's files are told from the instance's own by their key,
        // and known by the name their signature covers (a bundle's paths are not
        // signed: an old file under a new folder is still the old file).
        let path = match reader {
            Reader::Disk => name.to_string(),
            Reader::Kept(_) => {
                let base = std::path::Path::new(name)
                    .file_name()
                    .map(|f| f.to_string_lossy());
                format!("fleet:{}", base.unwrap_or_default())
            }
        };
        match check_one(name, sources.text(id).as_bytes(), key, reader) {
            Ok(t) => match running.get(&path) {
                Some(&was) if t < was => errors.push(
                    Diagnostic::error(
                        at,
                        format!(
                            "signature: older than the running revision (signed {}, running {})",
                            when(t),
                            when(was)
                        ),
                    )
                    .with_hint(
                        "a file signed before the one running is a rollback: use POST /rollback/N \
                         on the admin API, or sign the file again",
                    ),
                ),
                // Files of one name: the earliest signature is the bar for the next.
                _ => {
                    let at = signed.entry(path).or_insert(t);
                    *at = (*at).min(t);
                }
            },
            Err(why) => errors.push(Diagnostic::error(at, format!("signature: {why}")).with_hint(format!(
                "sign it with: minisign -S -s YOUR.key -m {name} (the key whose public half is --verify-key)"
            ))),
        }
    }
    (errors, signed)
}

/// A signing time as an operator reads it, with the number it is.
fn when(t: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(t);
    format!("{} ({t})", httpdate::fmt_http_date(at))
}

/// Checks one file's signature; when it was signed.
fn check_one(
    name: &str,
    bytes: &[u8],
    key: &VerifyKey,
    reader: &Reader<'_>,
) -> Result<u64, String> {
    let sig_path = format!("{name}.minisig");
    let text = reader.signature(name)?;
    let sig = Signature::decode(&text)
        .map_err(|e| format!("{sig_path} is not a minisign signature: {e}"))?;
    key.key.verify(bytes, &sig, true).map_err(|e| match e {
        minisign_verify::Error::UnexpectedKeyId => format!(
            "{sig_path} was made with another key than {} (--verify-key)",
            key.id
        ),
        e => format!("{sig_path} does not match the file ({e}): it changed since it was signed, or the signature is damaged"),
    })?;
    // Checked after the signature: the trusted comment is covered by it.
    signed_name(name, sig.trusted_comment())?;
    signed_time(name, sig.trusted_comment())
}

/// When the signature was made: minisign writes `timestamp:UNIX` in the trusted
/// comment by default. Without it, a file could not be told from an older one.
fn signed_time(name: &str, trusted: &str) -> Result<u64, String> {
    trusted
        .split('\t')
        .find_map(|f| f.strip_prefix("timestamp:"))
        .and_then(|t| t.trim().parse().ok())
        .ok_or_else(|| {
            format!(
                "{name}.minisig has no signing time (sign without -t, so minisign records `timestamp:`)"
            )
        })
}

/// The signature was made for a file of this name: `minisign` records the signed
/// file's base name in the trusted comment (`file:NAME`), which the signature covers —
/// so one signed file cannot stand in for another.
fn signed_name(name: &str, trusted: &str) -> Result<(), String> {
    let base = std::path::Path::new(name)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match trusted.split('\t').find_map(|f| f.strip_prefix("file:")) {
        Some(signed) if signed == base => Ok(()),
        Some(signed) => Err(format!(
            "{name}.minisig is the signature of {signed}, not of {base}"
        )),
        None => Err(format!(
            "{name}.minisig names no file (sign without -t, so minisign records the file's name)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_names_its_file() {
        let t = "timestamp:1796225383\tfile:main.conf\thashed";
        assert!(signed_name("/etc/sluice/main.conf", t).is_ok());
        assert!(signed_name("main.conf", "timestamp:1\tfile:main.conf").is_ok());
        let e = signed_name("/etc/sluice/sites/a.conf", t).unwrap_err();
        assert!(
            e.contains("is the signature of main.conf, not of a.conf"),
            "{e}"
        );
        assert!(signed_name("main.conf", "release 42")
            .unwrap_err()
            .contains("names no file"));
    }

    #[test]
    fn a_signature_says_when_it_was_made() {
        let t = "timestamp:1796225383\tfile:main.conf\thashed";
        assert_eq!(signed_time("main.conf", t), Ok(1796225383));
        let e = signed_time("main.conf", "file:main.conf").unwrap_err();
        assert!(e.contains("has no signing time"), "{e}");
        assert!(when(0).starts_with("Thu, 01 Jan 1970 00:00:00 GMT"));
    }

    #[test]
    fn key_ids_read_as_minisign_prints_them() {
        // minisign 0.11 printed "minisign public key 2251FB26D54EF23" for this key
        // (it drops leading zeros; sluice always shows 16 digits).
        let id = key_id("RWQj71Rtsh8lAt1XSSblW8oLtLcJST5qthTg29KgxL2ZwHbMC23COBCi");
        assert_eq!(id.as_deref(), Some("02251FB26D54EF23"));
        assert_eq!(key_id("not base64!"), None);
    }
}
