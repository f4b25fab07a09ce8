//! The syntax tree: directives with their words and blocks, with `import` expanded.
//!
//! This stage knows nothing of what directives mean; it only checks that braces
//! balance and that imports resolve without cycles. Meaning is `config::build`'s job.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::diag::{Diagnostic, Sources, Span};
use super::files::Reader;
use super::lexer::{tokenize, Env, Token, TokenKind};

/// A word as written, after environment expansion.
#[derive(Debug, Clone)]
pub(crate) struct Word {
    pub text: String,
    pub quoted: bool,
    pub span: Span,
    /// Characters it takes in the source.
    pub width: u32,
}

/// `name args... [{ block }]`.
#[derive(Debug, Clone)]
pub(crate) struct Directive {
    pub name: Word,
    pub args: Vec<Word>,
    pub block: Option<Vec<Directive>>,
    /// Where the block's `{` stands, for "block expected here" messages.
    pub block_span: Option<Span>,
}

impl Directive {
    pub(crate) fn span(&self) -> Span {
        self.name.span
    }

    /// Where an error about a missing argument should point: just past the last word.
    pub(crate) fn end_span(&self) -> Span {
        let last = self.args.last().unwrap_or(&self.name);
        Span {
            col: last.span.col + last.width,
            ..last.span
        }
    }
}

/// Reads a config file and everything it imports.
pub(crate) fn parse_file(
    display: &str,
    sources: &mut Sources,
    env: &dyn Env,
    files: &Reader<'_>,
) -> Result<Vec<Directive>, Diagnostic> {
    let mut stack = Vec::new();
    let mut ctx = Ctx {
        sources,
        env,
        files,
        stack: &mut stack,
    };
    parse_path(Path::new(display), display.to_string(), None, &mut ctx)
}

/// What reading a file and its imports needs throughout.
struct Ctx<'a, 'b> {
    sources: &'a mut Sources,
    env: &'a dyn Env,
    files: &'a Reader<'b>,
    stack: &'a mut Vec<PathBuf>,
}

/// Parses config text that did not come from a file (the embedded demo, tests).
pub(crate) fn parse_text(
    name: &str,
    text: &str,
    sources: &mut Sources,
    env: &dyn Env,
) -> Result<Vec<Directive>, Diagnostic> {
    let tree = parse_alone(name, text, sources, env)?;
    // Imports in embedded text resolve against the working directory.
    let mut stack = Vec::new();
    let mut ctx = Ctx {
        sources,
        env,
        files: &Reader::Disk,
        stack: &mut stack,
    };
    expand_imports(tree, Path::new(name), &mut ctx)
}

/// Parses text into directives without reading the files it imports (`import` stays a
/// directive): what `parse_text` does before it expands them.
pub(crate) fn parse_alone(
    name: &str,
    text: &str,
    sources: &mut Sources,
    env: &dyn Env,
) -> Result<Vec<Directive>, Diagnostic> {
    let file = sources.add(name.to_string(), Arc::from(text));
    let tokens = tokenize(file, text, env)?;
    Parser::new(tokens).block(None)
}

fn parse_path(
    path: &Path,
    display: String,
    imported_at: Option<Span>,
    ctx: &mut Ctx<'_, '_>,
) -> Result<Vec<Directive>, Diagnostic> {
    let canonical = ctx.files.canonical(path);
    if let Some(at) = imported_at {
        if ctx.stack.contains(&canonical) {
            let chain: Vec<String> = ctx
                .stack
                .iter()
                .chain(std::iter::once(&canonical))
                .map(|p| p.display().to_string())
                .collect();
            return Err(Diagnostic::error(at, "import cycle").with_hint(format!(
                "the files import each other: {}",
                chain.join(" -> ")
            )));
        }
    }
    let text = ctx.files.read(path).map_err(|e| {
        let at = imported_at.unwrap_or_default();
        Diagnostic::error(at, format!("cannot read {display}: {e}"))
    })?;
    let file = ctx.sources.add(display, Arc::from(text.as_str()));
    let tokens = tokenize(file, &text, ctx.env)?;
    let mut p = Parser::new(tokens);
    let tree = p.block(None)?;
    ctx.stack.push(canonical);
    let out = expand_imports(tree, path, ctx);
    ctx.stack.pop();
    out
}

fn expand_imports(
    tree: Vec<Directive>,
    including: &Path,
    ctx: &mut Ctx<'_, '_>,
) -> Result<Vec<Directive>, Diagnostic> {
    let mut out = Vec::with_capacity(tree.len());
    for mut d in tree {
        if d.name.text == "import" {
            let [target] = d.args.as_slice() else {
                return Err(
                    Diagnostic::error(d.span(), "`import` takes one file or glob")
                        .with_hint("write: import sites/*.conf"),
                );
            };
            if d.block.is_some() {
                return Err(Diagnostic::error(d.span(), "`import` takes no block"));
            }
            let dir = including.parent().unwrap_or(Path::new(""));
            let joined = dir.join(&target.text);
            let joined_text = joined.to_string_lossy().to_string();
            let is_glob = target.text.contains(['*', '?', '[']);
            let files: Vec<PathBuf> = if is_glob {
                // A signature beside a config file is not a config file.
                ctx.files.glob(&joined_text).map_err(|e| {
                    Diagnostic::error(target.span, format!("bad import pattern: {}", e.msg))
                })?
            } else {
                if !ctx.files.exists(&joined) {
                    return Err(Diagnostic::error(
                        target.span,
                        format!("imported file {joined_text} does not exist"),
                    )
                    .with_hint("import paths are relative to the file that imports them"));
                }
                vec![joined]
            };
            for f in files {
                let display = f.to_string_lossy().to_string();
                out.extend(parse_path(&f, display, Some(target.span), ctx)?);
            }
            continue;
        }
        if let Some(block) = d.block.take() {
            d.block = Some(expand_imports(block, including, ctx)?);
        }
        out.push(d);
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    /// Blocks closed by a `}` indented left of their directive (`{` and the `}`):
    /// when a block is left open at the end, the first of these is the likely one
    /// missing its `}` (it took an outer block's).
    misclosed: Vec<(Span, Span)>,
}

impl Parser {
    fn new(tokens: Vec<Token>) -> Parser {
        Parser {
            tokens,
            pos: 0,
            misclosed: Vec::new(),
        }
    }

    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    /// Directives until the matching `}` (when `open` is the block's `{` and its
    /// directive's name) or the end.
    fn block(&mut self, open: Option<(Span, Span)>) -> Result<Vec<Directive>, Diagnostic> {
        let mut out = Vec::new();
        loop {
            let Some(tok) = self.peek().cloned() else {
                return match (open, self.misclosed.first()) {
                    (Some(_), Some(&(inner, close))) => Err(Diagnostic::error(
                        inner,
                        "this block is never closed",
                    )
                    .with_hint(format!(
                        "the `}}` on line {} is indented like an outer block's but closes this one: add this block's `}}` above it",
                        close.line
                    ))),
                    (Some((span, _)), None) => Err(Diagnostic::error(
                        span,
                        "this block is never closed",
                    )
                    .with_hint("add a `}` on its own line to close it")),
                    (None, _) => Ok(out),
                };
            };
            match tok.kind {
                TokenKind::End => self.pos += 1,
                TokenKind::Close => {
                    self.pos += 1;
                    return match open {
                        Some((brace, name)) => {
                            if tok.span.line != brace.line && tok.span.col < name.col {
                                self.misclosed.push((brace, tok.span));
                            }
                            Ok(out)
                        }
                        None => Err(Diagnostic::error(tok.span, "`}` without a block to close")
                            .with_hint("remove it, or look for a missing `{` above")),
                    };
                }
                TokenKind::Open => {
                    return Err(
                        Diagnostic::error(tok.span, "`{` without a directive").with_hint(
                            "a block opens at the end of a directive's line: site example.com {",
                        ),
                    )
                }
                TokenKind::Word => out.push(self.directive()?),
            }
        }
    }

    fn directive(&mut self) -> Result<Directive, Diagnostic> {
        let name = self.word();
        let mut args = Vec::new();
        loop {
            let Some(tok) = self.peek().cloned() else {
                return Ok(Directive {
                    name,
                    args,
                    block: None,
                    block_span: None,
                });
            };
            match tok.kind {
                TokenKind::Word => args.push(self.word()),
                TokenKind::End => {
                    self.pos += 1;
                    return Ok(Directive {
                        name,
                        args,
                        block: None,
                        block_span: None,
                    });
                }
                // `}` ends the directive and, for the caller, the block.
                TokenKind::Close => {
                    return Ok(Directive {
                        name,
                        args,
                        block: None,
                        block_span: None,
                    })
                }
                TokenKind::Open => {
                    self.pos += 1;
                    let block = self.block(Some((tok.span, name.span)))?;
                    return Ok(Directive {
                        name,
                        args,
                        block: Some(block),
                        block_span: Some(tok.span),
                    });
                }
            }
        }
    }

    fn word(&mut self) -> Word {
        let t = &self.tokens[self.pos];
        self.pos += 1;
        Word {
            text: t.text.clone(),
            quoted: t.quoted,
            span: t.span,
            width: t.width,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::lexer::ProcessEnv;

    fn parse(text: &str) -> Result<Vec<Directive>, Diagnostic> {
        parse_text("t.conf", text, &mut Sources::default(), &ProcessEnv)
    }

    #[test]
    fn a_missing_brace_is_blamed_on_the_block_left_open_not_the_outer_one() {
        let text = "site a {\n    route /x {\n        respond ok\n    route /y {\n        respond ok\n    }\n}\n";
        let e = parse(text).unwrap_err();
        assert_eq!((e.span.line, e.span.col), (2, 14), "{}", e.message);
        let hint = e.hint.unwrap_or_default();
        assert!(hint.contains("line 7"), "{hint}");
        // Nested two deep: the innermost block left open.
        let text = "site a {\n  route /x {\n    header_up {\n      set a b\n  }\n}\n";
        let e = parse(text).unwrap_err();
        assert_eq!((e.span.line, e.span.col), (3, 15), "{}", e.message);
        // Nothing indented oddly: the outer block, as before.
        let e = parse("site a {\n  respond ok\n").unwrap_err();
        assert_eq!((e.span.line, e.span.col), (1, 8));
    }

    #[test]
    fn nested_blocks_and_inline_blocks() {
        let tree =
            parse("site a {\n  proxy x { failover { failure_threshold 3; hold_down 30s } }\n}\n")
                .unwrap();
        assert_eq!(tree.len(), 1);
        let site = tree[0].block.as_ref().unwrap();
        let proxy = &site[0];
        assert_eq!(proxy.name.text, "proxy");
        let failover = &proxy.block.as_ref().unwrap()[0];
        assert_eq!(failover.block.as_ref().unwrap().len(), 2);
    }

    #[test]
    fn unbalanced_braces_point_at_the_opening() {
        let err = parse("site a {\n  respond ok\n").unwrap_err();
        assert_eq!((err.span.line, err.span.col), (1, 8));
        let err = parse("respond ok\n}\n").unwrap_err();
        assert_eq!((err.span.line, err.span.col), (2, 1));
    }

    /// Found by the `config` fuzz target: the caret of a missing argument stood past
    /// the line's end, further with quotes, escapes or `{$VAR}`.
    #[test]
    fn a_missing_argument_points_just_past_the_last_word_as_written() {
        for (line, col) in [
            ("tls a.pem", 10),
            ("tls \"a \\\" b\"", 13),
            ("tls {$HOME}", 12),
        ] {
            let tree = parse(line).unwrap();
            let at = tree[0].end_span();
            assert_eq!((at.line, at.col), (1, col), "{line}");
            assert_eq!(at.col as usize, line.chars().count() + 1, "{line}");
        }
    }
}
