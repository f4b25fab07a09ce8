//! A published revision: every config file the publisher's check read (the main file
//! and its imports), each with its `.minisig` when it had one, as JSON.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::config::{Files, FleetRevision, KeptFile};

/// The format written; a member refuses another.
const FORMAT: u64 = 1;

/// `files` as a bundle: its main file's name first.
pub(crate) fn encode(main: &str, files: &Files, publisher: &str) -> String {
    let list: Map<String, Value> = files
        .map
        .iter()
        .map(|(name, f)| {
            let sig = f.minisig.as_deref().map(Value::from).unwrap_or(Value::Null);
            (name.clone(), json!({ "text": &*f.text, "minisig": sig }))
        })
        .collect();
    json!({
        "format": FORMAT,
        "main": main,
        "publisher": publisher,
        "published_at": super::unix_now(),
        "files": list,
    })
    .to_string()
}

/// A bundle read back, as revision `revision`.
pub(crate) fn decode(revision: u64, text: &str) -> Result<FleetRevision, String> {
    if text.len() > super::MAX_BUNDLE {
        return Err(format!(
            "the bundle is {} bytes, over the {} MiB a revision may hold",
            text.len(),
            super::MAX_BUNDLE >> 20
        ));
    }
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not a bundle: {e}"))?;
    if v["format"].as_u64() != Some(FORMAT) {
        return Err(format!(
            "a bundle of format {}, which this version ({}) does not read",
            v["format"],
            env!("CARGO_PKG_VERSION")
        ));
    }
    let main = v["main"].as_str().ok_or("the bundle names no main file")?;
    let mut files = Files::default();
    for (name, f) in v["files"].as_object().ok_or("the bundle holds no files")? {
        let text = f["text"]
            .as_str()
            .ok_or("a file of the bundle has no text")?;
        files.map.insert(
            name.clone(),
            KeptFile {
                text: Arc::from(text),
                minisig: f["minisig"].as_str().map(Arc::from),
            },
        );
    }
    if !files.map.contains_key(main) {
        return Err(format!("the bundle's main file {main} is not in it"));
    }
    Ok(FleetRevision {
        revision,
        main: main.to_string(),
        files: Arc::new(files),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_reads_back_as_written() {
        let mut files = Files::default();
        let f = |t: &str, s: Option<&str>| KeptFile {
            text: Arc::from(t),
            minisig: s.map(Arc::from),
        };
        files.map.insert(
            "conf/main.conf".into(),
            f("import sites/*.conf\n", Some("sig")),
        );
        files.map.insert(
            "conf/sites/a.conf".into(),
            f("site a { respond 200 }", None),
        );
        let text = encode("conf/main.conf", &files, "host");
        let back = decode(7, &text).unwrap();
        assert_eq!(back.revision, 7);
        assert_eq!(back.main, "conf/main.conf");
        assert_eq!(*back.files, files);
        assert!(decode(1, "{}").unwrap_err().contains("format"));
        assert!(decode(1, "nope").unwrap_err().contains("not a bundle"));
        let other = text.replace("\"main\":\"conf/main.conf\"", "\"main\":\"x\"");
        assert!(decode(1, &other).unwrap_err().contains("not in it"));
    }
}
