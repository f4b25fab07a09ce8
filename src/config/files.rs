//! Where a load reads its files from: the disk, or the texts a revision kept.
//!
//! A revision keeps the text of every file it read (DESIGN §18.11), so a rollback
//! restores exactly what ran, imports included, whatever is on disk now; and a fleet
//! bundle (§18.6) is the same thing published: every file read, with its signature.
//! The parser and the signature check read through a [`Reader`], so one code path
//! loads a file from disk, a kept revision and a published bundle.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::diag::Sources;

/// One file of a revision or a bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptFile {
    pub text: Arc<str>,
    /// Its `FILE.minisig`, when it had one.
    pub minisig: Option<Arc<str>>,
}

/// Files by the name the load gave them (the path as the main file or an `import`
/// spelled it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Files {
    pub map: BTreeMap<String, KeptFile>,
}

impl Files {
    /// The files `ids` of `sources`, with the signatures `reader` has for them (none
    /// when `with_signatures` is false).
    pub fn of(
        sources: &Sources,
        ids: std::ops::Range<usize>,
        reader: &Reader<'_>,
        with_signatures: bool,
    ) -> Files {
        let map = ids
            .map(|id| {
                let name = sources.name(id).to_string();
                let minisig = with_signatures
                    .then(|| reader.signature(&name).ok())
                    .flatten()
                    .map(Arc::from);
                let text = Arc::from(sources.text(id));
                (name, KeptFile { text, minisig })
            })
            .collect();
        Files { map }
    }

    /// Every byte held: texts and signatures.
    pub fn size(&self) -> usize {
        self.map
            .iter()
            .map(|(n, f)| n.len() + f.text.len() + f.minisig.as_ref().map_or(0, |s| s.len()))
            .sum()
    }
}

/// Where files are read from.
#[derive(Debug, Clone, Copy)]
pub enum Reader<'a> {
    Disk,
    Kept(&'a Files),
}

impl Reader<'_> {
    pub(crate) fn read(&self, path: &Path) -> std::io::Result<String> {
        match self {
            Reader::Disk => std::fs::read_to_string(path),
            Reader::Kept(files) => files
                .map
                .get(&*path.to_string_lossy())
                .map(|f| f.text.to_string())
                .ok_or_else(|| not_kept(path)),
        }
    }

    pub(crate) fn exists(&self, path: &Path) -> bool {
        match self {
            Reader::Disk => path.exists(),
            Reader::Kept(files) => files.map.contains_key(&*path.to_string_lossy()),
        }
    }

    /// The same file however it is spelled, for import cycles.
    pub(crate) fn canonical(&self, path: &Path) -> PathBuf {
        match self {
            Reader::Disk => std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
            Reader::Kept(_) => path.to_path_buf(),
        }
    }

    /// The files `pattern` names, sorted; signatures beside config files left out.
    pub(crate) fn glob(&self, pattern: &str) -> Result<Vec<PathBuf>, glob::PatternError> {
        let mut v: Vec<PathBuf> = match self {
            Reader::Disk => glob::glob(pattern)?.filter_map(Result::ok).collect(),
            Reader::Kept(files) => {
                let p = glob::Pattern::new(pattern)?;
                let opts = glob::MatchOptions {
                    require_literal_separator: true,
                    ..Default::default()
                };
                files
                    .map
                    .keys()
                    .filter(|k| p.matches_with(k, opts))
                    .map(PathBuf::from)
                    .collect()
            }
        };
        v.retain(|p| p.extension().is_none_or(|e| e != "minisig"));
        v.sort();
        Ok(v)
    }

    /// The text of `NAME.minisig`.
    pub(crate) fn signature(&self, name: &str) -> Result<String, String> {
        let sig_path = format!("{name}.minisig");
        match self {
            Reader::Disk => std::fs::read_to_string(&sig_path).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => format!("{sig_path} is missing"),
                _ => format!("{sig_path}: {e}"),
            }),
            Reader::Kept(files) => files
                .map
                .get(name)
                .and_then(|f| f.minisig.as_ref())
                .map(|s| s.to_string())
                .ok_or_else(|| format!("{sig_path} is missing from the bundle")),
        }
    }
}

fn not_kept(path: &Path) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::NotFound,
        format!("{} is not in the bundle", path.display()),
    )
}
