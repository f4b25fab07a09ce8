//! Configuration: text → syntax tree with spans (`lexer`, `parser`) → typed, validated
//! model (`build`, `model`). Loading is all or nothing: any error rejects the whole file,
//! and the caller keeps whatever it was running.

pub(crate) mod build;
pub(crate) mod certs;
pub mod diag;
pub mod files;
pub(crate) mod lexer;
pub mod model;
pub(crate) mod parser;
pub mod signed;
pub mod template;
pub(crate) mod units;
pub(crate) mod validate;

pub use diag::{Diagnostic, Report, Severity, Sources};
pub use files::{Files, KeptFile, Reader};
pub use model::*;

use std::sync::Arc;

use lexer::{Env, ProcessEnv};

/// The texts a load read, enough to load it again as it was (a rollback).
#[derive(Debug, Clone, Default)]
pub struct Kept {
    /// The main file's name.
    pub main: String,
    /// It and its imports.
    pub files: Arc<Files>,
    /// The fleet revision this load took everything but `global` from.
    pub fleet: Option<FleetRevision>,
}

/// A published fleet revision: its number and its bundle.
#[derive(Debug, Clone)]
pub struct FleetRevision {
    pub revision: u64,
    /// The bundle's main file.
    pub main: String,
    pub files: Arc<Files>,
}

/// A config that loaded, with the warnings it raised and the files it was read from.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    pub warnings: Report,
    /// The id of the key every file was verified with (`--verify-key`).
    pub signed_by: Option<String>,
    /// When each file was signed, by path (empty unless verified).
    pub signed_at: signed::SignedAt,
    /// What it read.
    pub kept: Kept,
}

/// Loads `path` and everything it imports, with the process environment.
pub fn load_file(path: &str) -> Result<Loaded, Report> {
    load_with(|sources| parser::parse_file(path, sources, &ProcessEnv, &Reader::Disk))
}

/// As [`load_file`]; with `key`, every file read must carry a valid signature
/// (`FILE.minisig`) by it, made no earlier than the same file's in `running` (the
/// running revision's), else the load fails with `FILE: signature: …`.
pub fn load_file_verified(
    path: &str,
    key: Option<&signed::VerifyKey>,
    running: &signed::SignedAt,
) -> Result<Loaded, Report> {
    match key {
        None => load_file(path),
        Some(key) => verified(
            load_file(path),
            key,
            &[(0..usize::MAX, Reader::Disk)],
            running,
        ),
    }
}

/// A kept revision again, exactly as it ran (a rollback): its files were verified
/// when it was first loaded, and are not judged by their age now.
pub fn load_kept(kept: &Kept) -> Result<Loaded, Report> {
    match &kept.fleet {
        None => load_with(|sources| {
            let files = Reader::Kept(&kept.files);
            parser::parse_file(&kept.main, sources, &ProcessEnv, &files)
        }),
        Some(f) => fleet_load(
            &kept.main,
            &Reader::Kept(&kept.files),
            f,
            None,
            &Default::default(),
        ),
    }
}

/// A fleet revision (DESIGN §18.6, §18.11): `global` from the instance's own file
/// `local` (read from disk, verified as a reload verifies it), everything else from
/// the published bundle (its signatures in the bundle). A bundle file signed before
/// the same file of the running revision is refused unless `rollback`.
pub fn load_fleet(
    local: &str,
    bundle: &FleetRevision,
    key: Option<&signed::VerifyKey>,
    running: &signed::SignedAt,
    rollback: bool,
) -> Result<Loaded, Report> {
    let none = signed::SignedAt::new();
    let running = if rollback { &none } else { running };
    fleet_load(local, &Reader::Disk, bundle, key, running)
}

fn fleet_load(
    local: &str,
    local_files: &Reader<'_>,
    bundle: &FleetRevision,
    key: Option<&signed::VerifyKey>,
    running: &signed::SignedAt,
) -> Result<Loaded, Report> {
    let mut split = 0;
    let loaded = load_with(|sources| {
        let own = parser::parse_file(local, sources, &ProcessEnv, local_files)?;
        split = sources.len();
        let files = Reader::Kept(&bundle.files);
        let published = parser::parse_file(&bundle.main, sources, &ProcessEnv, &files)?;
        // The instance's `global`, the bundle's everything else.
        let global = own.into_iter().filter(|d| d.name.text == "global");
        let rest = published.into_iter().filter(|d| d.name.text != "global");
        Ok(global.chain(rest).collect())
    });
    let loaded = match key {
        None => loaded,
        Some(key) => {
            let local = (0..split, Reader::Disk);
            let published = (split..usize::MAX, Reader::Kept(&bundle.files));
            verified(loaded, key, &[local, published], running)
        }
    };
    loaded.map(|mut l| {
        l.kept = Kept {
            main: local.to_string(),
            files: Arc::new(Files::of(
                &l.warnings.sources,
                0..split,
                &Reader::Disk,
                false,
            )),
            fleet: Some(bundle.clone()),
        };
        l
    })
}

fn verified(
    loaded: Result<Loaded, Report>,
    key: &signed::VerifyKey,
    parts: &[(std::ops::Range<usize>, Reader<'_>)],
    running: &signed::SignedAt,
) -> Result<Loaded, Report> {
    let sources = match &loaded {
        Ok(l) => &l.warnings.sources,
        Err(r) => &r.sources,
    };
    let mut errors = Vec::new();
    let mut signed_at = signed::SignedAt::new();
    for (range, reader) in parts {
        let range = range.start..range.end.min(sources.len());
        let (mut e, s) = signed::verify(sources, key, range, reader, running);
        errors.append(&mut e);
        signed_at.extend(s);
    }
    match loaded {
        Ok(_) if !errors.is_empty() => Err(Report {
            diagnostics: errors,
            sources: sources.clone(),
        }),
        Ok(mut l) => {
            l.signed_by = Some(key.id().to_string());
            l.signed_at = signed_at;
            Ok(l)
        }
        // A file that does not load and is not signed either: the signature first.
        Err(mut r) => {
            let mut all = errors;
            all.append(&mut r.diagnostics);
            r.diagnostics = all;
            Err(r)
        }
    }
}

/// Loads config text that is not in a file (the demo, `sluice proxy`, tests).
pub fn load_text(name: &str, text: &str) -> Result<Loaded, Report> {
    load_text_env(name, text, &ProcessEnv)
}

pub fn load_text_env(name: &str, text: &str, env: &dyn Env) -> Result<Loaded, Report> {
    load_with(|sources| parser::parse_text(name, text, sources, env))
}

/// Loads config text without reading the files it imports (fuzzing: arbitrary text
/// must not name `/dev/zero`).
pub fn load_alone(name: &str, text: &str, env: &dyn Env) -> Result<Loaded, Report> {
    load_with(|sources| parser::parse_alone(name, text, sources, env))
}

fn load_with(
    parse: impl FnOnce(&mut Sources) -> Result<Vec<parser::Directive>, Diagnostic>,
) -> Result<Loaded, Report> {
    let mut sources = Sources::default();
    let tree = match parse(&mut sources) {
        Ok(t) => t,
        Err(d) => {
            return Err(Report {
                diagnostics: vec![d],
                sources,
            })
        }
    };
    match build::build(&tree, &sources) {
        Ok((config, warnings)) => Ok(Loaded {
            kept: Kept {
                main: sources.name(0).to_string(),
                files: Arc::new(Files::of(&sources, 0..sources.len(), &Reader::Disk, false)),
                fleet: None,
            },
            config,
            warnings: Report {
                diagnostics: warnings,
                sources,
            },
            signed_by: None,
            signed_at: signed::SignedAt::new(),
        }),
        Err(diagnostics) => Err(Report {
            diagnostics,
            sources,
        }),
    }
}
