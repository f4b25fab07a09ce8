//! Signed configs (DESIGN §15.4, §15.8): with `--verify-key FILE`, every config file
//! read — the main file and each import — needs a valid minisign signature beside it
//! (`FILE.minisig`), checked against the bytes that were parsed. The key comes from the
//! command line, never from the config it verifies.

use std::sync::Arc;

use minisign_verify::{PublicKey, Signature};

use super::diag::{Diagnostic, Sources, Span};

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

/// Checks the signature of every file of `sources` from `first` on (a rollback's main
/// text was checked when it was first loaded); the errors, one per file.
pub(crate) fn verify(sources: &Sources, key: &VerifyKey, first: usize) -> Vec<Diagnostic> {
    let mut errors = Vec::new();
    for id in first..sources.len() {
        let name = sources.name(id);
        let at = Span {
            file: id,
            line: 0,
            col: 0,
        };
        if let Err(why) = check_one(name, sources.text(id).as_bytes(), key) {
            errors.push(Diagnostic::error(at, format!("signature: {why}")).with_hint(format!(
                "sign it with: minisign -S -s YOUR.key -m {name} (the key whose public half is --verify-key)"
            )));
        }
    }
    errors
}

fn check_one(name: &str, bytes: &[u8], key: &VerifyKey) -> Result<(), String> {
    let sig_path = format!("{name}.minisig");
    let text = std::fs::read_to_string(&sig_path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("{sig_path} is missing"),
        _ => format!("{sig_path}: {e}"),
    })?;
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
    signed_name(name, sig.trusted_comment())
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
    fn key_ids_read_as_minisign_prints_them() {
        // minisign 0.11 printed "minisign public key 2251FB26D54EF23" for this key
        // (it drops leading zeros; sluice always shows 16 digits).
        let id = key_id("RWQj71Rtsh8lAt1XSSblW8oLtLcJST5qthTg29KgxL2ZwHbMC23COBCi");
        assert_eq!(id.as_deref(), Some("02251FB26D54EF23"));
        assert_eq!(key_id("not base64!"), None);
    }
}
