//! `cache { … }` on a route (DESIGN §15.1): every option checked now, the disk
//! store's folder made and written to once, so a cache that cannot work fails the load.

use std::time::Duration;

use super::args::*;
use super::route::on_off;
use super::values::*;
use super::vocab::Place;
use super::{Builder, Res};
use crate::config::diag::Diagnostic;
use crate::config::model::*;
use crate::config::parser::{Directive, Word};

const DEFAULT_STORE: u64 = 64 << 20;
const DEFAULT_MAX_OBJECT: u64 = 8 << 20;

impl Builder {
    /// `cache [{ store …; max_object SIZE; key PART...; heuristic on|off; default_ttl D;
    /// stale_while_revalidate D; stale_if_error D; lock D; mode M; client_revalidate on|off;
    /// purge_store URL }]`.
    pub(super) fn cache(&mut self, d: &Directive) -> Res<CacheConfig> {
        if let Some(w) = d.args.first() {
            return Err(extra(
                w,
                "write the options in a block: cache { store memory 256M }",
            ));
        }
        let mut c = CacheConfig {
            store: CacheStore::Memory(DEFAULT_STORE),
            max_object: DEFAULT_MAX_OBJECT,
            key: vec![
                CacheKeyPart::Method,
                CacheKeyPart::Host,
                CacheKeyPart::Path,
                CacheKeyPart::Query,
            ],
            heuristic: false,
            default_ttl: Duration::ZERO,
            stale_while_revalidate: Duration::ZERO,
            stale_if_error: Duration::ZERO,
            lock: Duration::from_secs(5),
            mode: CacheMode::Normal,
            client_revalidate: true,
            purge_store: None,
            span: d.span(),
        };
        let mut seen = std::collections::HashMap::new();
        let mut max_object_at = None;
        for item in d.block.as_deref().unwrap_or(&[]) {
            if !self.known_here(item, Place::Cache) {
                continue;
            }
            if let Some(first) = seen.insert(item.name.text.clone(), item.span()) {
                self.errors.push(twice(item, first));
                continue;
            }
            if item.name.text == "max_object" {
                max_object_at = item.args.first().map(|w| w.span);
            }
            let r = self.cache_option(item, &mut c);
            self.push(r);
        }
        let cap = match &c.store {
            CacheStore::Memory(n) | CacheStore::Disk(_, n) => *n,
        };
        if max_object_at.is_none() {
            c.max_object = c.max_object.min(cap);
        }
        if c.max_object > cap {
            let at = max_object_at.unwrap_or(c.span);
            return Err(Diagnostic::error(
                at,
                format!(
                    "max_object {} is larger than the store ({cap} bytes)",
                    c.max_object
                ),
            )
            .with_hint("an object larger than its store could never be kept; raise the store's size or lower max_object"));
        }
        Ok(c)
    }

    fn cache_option(&self, item: &Directive, c: &mut CacheConfig) -> Res<()> {
        no_block(item)?;
        match item.name.text.as_str() {
            "store" => c.store = self.cache_store(item)?,
            "max_object" => {
                c.max_object = size(one_arg(item, "max_object SIZE")?)?;
                if c.max_object == 0 {
                    return Err(Diagnostic::error(
                        item.args[0].span,
                        "max_object must be more than 0",
                    )
                    .with_hint("to cache nothing, remove the cache block"));
                }
            }
            "key" => c.key = cache_key(item)?,
            "heuristic" => c.heuristic = on_off(item)?,
            "client_revalidate" => c.client_revalidate = on_off(item)?,
            "default_ttl" => c.default_ttl = duration(one_arg(item, "default_ttl DURATION")?)?,
            "stale_while_revalidate" => {
                c.stale_while_revalidate =
                    duration(one_arg(item, "stale_while_revalidate DURATION")?)?
            }
            "stale_if_error" => {
                c.stale_if_error = duration(one_arg(item, "stale_if_error DURATION")?)?
            }
            "lock" => c.lock = duration(one_arg(item, "lock DURATION")?)?,
            "mode" => {
                let w = one_arg(item, "mode normal|stale_only|cache_only")?;
                c.mode = match w.text.as_str() {
                    "normal" => CacheMode::Normal,
                    "stale_only" => CacheMode::StaleOnly,
                    "cache_only" => CacheMode::CacheOnly,
                    _ => return Err(expected(w, "`normal`, `stale_only` or `cache_only`")),
                };
            }
            "purge_store" => {
                c.purge_store = Some(super::filters::redis_url(one_arg(
                    item,
                    "purge_store redis://HOST:PORT",
                )?)?)
            }
            _ => unreachable!("known_here checked the name"),
        }
        Ok(())
    }

    /// `store memory SIZE` or `store disk DIR SIZE`; DIR (relative to the config
    /// file) is made if missing and must take a file.
    fn cache_store(&self, d: &Directive) -> Res<CacheStore> {
        const USAGE: &str = "store memory SIZE | store disk DIR SIZE";
        let positive_size = |w: &Word| -> Res<u64> {
            let n = size(w)?;
            if n == 0 {
                return Err(Diagnostic::error(
                    w.span,
                    "a store's size must be more than 0",
                ));
            }
            Ok(n)
        };
        match d.args.as_slice() {
            [k, n] if k.text == "memory" => Ok(CacheStore::Memory(positive_size(n)?)),
            [k, dir, n] if k.text == "disk" => {
                let n = positive_size(n)?;
                let path = self.dir_of(d.span()).join(&dir.text);
                writable(&path).map_err(|e| {
                    Diagnostic::error(dir.span, format!("{}: {e}", path.display())).with_hint(
                        "the disk store's folder must exist or be creatable, and be writable by sluice",
                    )
                })?;
                Ok(CacheStore::Disk(path, n))
            }
            [k, ..] if k.text != "memory" && k.text != "disk" => {
                Err(expected(k, "`memory` or `disk`"))
            }
            [k, rest @ ..] if rest.len() > if k.text == "memory" { 1 } else { 2 } => {
                let at = if k.text == "memory" { 1 } else { 2 };
                Err(extra(&rest[at], &format!("write: {USAGE}")))
            }
            _ => Err(missing(d, USAGE, "store memory 256M")),
        }
    }
}

/// The folder is one sluice may write in, or may make: it, or (when missing) its
/// nearest existing ancestor, is a folder this process can write to. Checked without
/// touching the disk (`check` changes nothing); the store makes the folder when it
/// opens.
pub(super) fn writable(dir: &std::path::Path) -> std::io::Result<()> {
    let mut at = dir;
    let existing = loop {
        match std::fs::metadata(at) {
            Ok(m) if m.is_dir() => break at,
            Ok(_) => {
                let e = std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a folder");
                return Err(e);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match at.parent() {
                Some(p) if !p.as_os_str().is_empty() => at = p,
                _ => break std::path::Path::new("."),
            },
            Err(e) => return Err(e),
        }
    };
    rustix::fs::access(
        existing,
        rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
    )
    .map_err(|e| {
        std::io::Error::new(
            std::io::Error::from(e).kind(),
            format!("{} is not writable", existing.display()),
        )
    })
}

/// `key PART...`: `method`, `host`, `path`, `query`, `header NAME`, `cookie NAME`.
fn cache_key(d: &Directive) -> Res<Vec<CacheKeyPart>> {
    const USAGE: &str = "key method host path query [header NAME] [cookie NAME]";
    let mut parts = Vec::new();
    let mut words = d.args.iter();
    while let Some(w) = words.next() {
        let part = match w.text.as_str() {
            "method" => CacheKeyPart::Method,
            "host" => CacheKeyPart::Host,
            "path" => CacheKeyPart::Path,
            "query" => CacheKeyPart::Query,
            "header" | "cookie" => {
                let Some(name) = words.next() else {
                    return Err(missing(
                        d,
                        USAGE,
                        "key method host path query header Accept-Language",
                    ));
                };
                if w.text == "cookie" {
                    CacheKeyPart::Cookie(name.text.clone())
                } else {
                    let h = http::HeaderName::from_bytes(name.text.as_bytes())
                        .map_err(|_| expected(name, "a header name"))?;
                    CacheKeyPart::Header(h)
                }
            }
            _ => {
                return Err(expected(
                    w,
                    "method, host, path, query, header NAME or cookie NAME",
                ))
            }
        };
        if parts.contains(&part) {
            return Err(Diagnostic::error(
                w.span,
                format!("`{}` is in the key twice", w.text),
            ));
        }
        parts.push(part);
    }
    for (part, name) in [
        (CacheKeyPart::Method, "method"),
        (CacheKeyPart::Host, "host"),
        (CacheKeyPart::Path, "path"),
    ] {
        if !parts.contains(&part) {
            return Err(
                missing(d, USAGE, "key method host path query").with_hint(format!(
                    "a key always holds the method, scheme, host and path the backend sees \
                 (two requests it would answer differently must never share a response); \
                 list `{name}` in it. Only `query` may be left out"
                )),
            );
        }
    }
    Ok(parts)
}
