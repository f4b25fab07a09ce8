//! `challenge [under_load [PERCENT] | always] { … }` (DESIGN §18.12), and the route its
//! page posts to.

use std::path::Path;
use std::time::Duration;

use super::args::*;
use super::values::*;
use super::Res;
use crate::config::diag::Diagnostic;
use crate::config::model::*;
use crate::config::parser::Directive;

const USAGE: &str = "challenge [under_load [PERCENT] | always] { difficulty 16; pass 1h; secret_file FILE; allow CIDR...; except PATTERN... }";

use crate::config::model::CHALLENGE_ENDPOINT as ENDPOINT;

pub(super) fn challenge(d: &Directive, dir: &Path) -> Res<ChallengeConfig> {
    let mode = match d.args.as_slice() {
        [] => ChallengeMode::UnderLoad(80),
        [w, ..] if w.text != "under_load" && w.text != "always" => {
            return Err(expected(w, "`under_load [PERCENT]` or `always`"))
        }
        [w] if w.text == "always" => ChallengeMode::Always,
        [_] => ChallengeMode::UnderLoad(80),
        [w, p] if w.text == "under_load" => {
            let percent = int_in(p, 1, 100).map_err(|_| expected(p, "a percentage, 1..100"))?;
            ChallengeMode::UnderLoad(percent as u8)
        }
        [_, _, x, ..] | [_, x] => return Err(extra(x, &format!("write: {USAGE}"))),
    };
    let mut c = ChallengeConfig {
        mode,
        difficulty: 16,
        pass: Duration::from_secs(3600),
        secret: None,
        allow: Vec::new(),
        except: Vec::new(),
    };
    for i in d.block.as_deref().unwrap_or(&[]) {
        no_block(i)?;
        match i.name.text.as_str() {
            "difficulty" => {
                let w = one_arg(i, "difficulty 16")?;
                c.difficulty = int_in(w, 8, 24).map_err(|_| {
                    expected(w, "a difficulty of 8..24 zero bits")
                        .with_hint("each bit doubles a browser's work: 16 takes a second or less")
                })? as u8;
            }
            "pass" => {
                let w = one_arg(i, "pass 1h")?;
                c.pass = duration(w)?;
                if c.pass < Duration::from_secs(1) {
                    return Err(expected(w, "a pass of 1s or more"));
                }
            }
            "secret_file" => c.secret = Some(secret(i, dir)?),
            "allow" => {
                if i.args.is_empty() {
                    return Err(missing(i, "allow CIDR...", "allow 10.0.0.0/8"));
                }
                c.allow = i.args.iter().map(cidr).collect::<Res<_>>()?;
            }
            "except" => {
                if i.args.is_empty() {
                    return Err(missing(i, "except PATTERN...", "except /health /api/*"));
                }
                c.except = i.args.iter().map(path_pattern).collect::<Res<_>>()?;
            }
            other => {
                return Err(Diagnostic::error(
                    i.span(),
                    format!("`{other}` is not a challenge setting"),
                )
                .with_hint(
                    "a challenge block takes: difficulty, pass, secret_file, allow, except",
                ))
            }
        }
    }
    Ok(c)
}

fn secret(i: &Directive, dir: &Path) -> Res<Vec<u8>> {
    let w = one_arg(i, "secret_file FILE")?;
    secret_file(w, dir, "random bytes sluice signs passes with")
}

/// Each site with a `challenge` gets a route for [`ENDPOINT`] first, carrying the
/// challenge (a site's own runs there as on every route), so the page's post reaches
/// it whatever the routes' patterns.
pub(super) fn endpoints(config: &mut Config) {
    for site in &mut config.sites {
        let is_challenge = |l: &&FilterLine| matches!(l.filter, Filter::Challenge(_));
        let on_site = site.filters.iter().any(|l| is_challenge(&l));
        let Some(line) = site
            .filters
            .iter()
            .chain(site.routes.iter().flat_map(|r| &r.filters))
            .find(is_challenge)
            .cloned()
        else {
            continue;
        };
        let span = line.span;
        // A site's own challenge runs on every route, this one too.
        let filters = if on_site {
            Vec::new()
        } else {
            vec![FilterLine {
                condition: None,
                response: None,
                failure_open: false,
                name: None,
                branches: Vec::new(),
                ..line
            }]
        };
        site.routes.insert(
            0,
            Route {
                name: format!("{} {ENDPOINT}", site.name),
                pattern: PathPattern::Exact(ENDPOINT.to_string()),
                matchers: Vec::new(),
                filters,
                handler: None,
                maintenance: None,
                error_pages: Vec::new(),
                cache: None,
                span,
            },
        );
    }
}
