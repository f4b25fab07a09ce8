//! Argument helpers: each returns a diagnostic that points at the right word.

use super::Res;
use crate::config::diag::{Diagnostic, Span};
use crate::config::parser::{Directive, Word};

pub(super) fn unsupported(d: &Directive) -> Diagnostic {
    Diagnostic::error(d.span(), format!("`{}` is not supported yet", d.name.text)).with_hint(
        "this build knows the directive but cannot run it yet; remove it to load this file",
    )
}

pub(super) fn twice(d: &Directive, first: Span) -> Diagnostic {
    Diagnostic::error(d.span(), format!("`{}` is set twice", d.name.text))
        .with_hint(format!("it is first set on line {}; keep one", first.line))
}

pub(super) fn missing(d: &Directive, usage: &str, example: &str) -> Diagnostic {
    Diagnostic::error(
        d.end_span(),
        format!("`{}` expects more: {usage}", d.name.text),
    )
    .with_hint(format!("for example: {example}"))
}

pub(super) fn extra(w: &Word, what: &str) -> Diagnostic {
    Diagnostic::error(w.span, format!("unexpected `{}`", w.text)).with_hint(what.to_string())
}

pub(super) fn expected(w: &Word, what: &str) -> Diagnostic {
    Diagnostic::error(w.span, format!("found `{}`, expected {what}", w.text))
}

pub(super) fn no_args(d: &Directive) -> Res<()> {
    match d.args.first() {
        Some(w) => Err(extra(w, &format!("`{}` takes no arguments", d.name.text))),
        None => Ok(()),
    }
}

pub(super) fn block<'a>(d: &'a Directive, example: &str) -> Res<&'a [Directive]> {
    d.block.as_deref().ok_or_else(|| {
        Diagnostic::error(d.end_span(), format!("`{}` needs a block", d.name.text))
            .with_hint(format!("open it at the end of the line: {example}"))
    })
}

pub(super) fn no_block(d: &Directive) -> Res<()> {
    match d.block_span {
        Some(s) => Err(Diagnostic::error(
            s,
            format!("`{}` takes no block", d.name.text),
        )),
        None => Ok(()),
    }
}

pub(super) fn first_arg<'a>(d: &'a Directive, usage: &str) -> Res<&'a Word> {
    no_block(d)?;
    d.args.first().ok_or_else(|| missing(d, usage, usage))
}

pub(super) fn one_arg<'a>(d: &'a Directive, usage: &str) -> Res<&'a Word> {
    let w = first_arg(d, usage)?;
    match d.args.get(1) {
        Some(x) => Err(extra(x, &format!("write: {usage}"))),
        None => Ok(w),
    }
}

pub(super) fn two_args<'a>(d: &'a Directive, usage: &str) -> Res<(&'a Word, &'a Word)> {
    no_block(d)?;
    match d.args.as_slice() {
        [a, b] => Ok((a, b)),
        [_, _, x, ..] => Err(extra(x, &format!("write: {usage}"))),
        _ => Err(missing(d, usage, usage)),
    }
}
