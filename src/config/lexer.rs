//! Turns config text into words, with positions.
//!
//! A word is a run of characters up to white space, `;` or a line end, or a `"…"`
//! string (escapes `\"`, `\\`, `\n`; in the string after a `~` word, a regex, any other
//! backslash is kept as written, so `"^/v\d+/"` reaches the regex as it reads). `{` and `}` are block delimiters when they stand
//! alone or are glued to the edge of a word (`route /a {respond "x"}`), while a
//! `{…}` group inside a word stays in it, so `{$PORT}` and `{host}` are not blocks. `#` at the
//! start of a word comments out the rest of the line. `{$NAME}` / `{$NAME:default}` are
//! replaced from the environment here, so every later stage sees final text.

use super::diag::{Diagnostic, FileId, Span};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TokenKind {
    Word,
    Open,
    Close,
    /// A line end or `;`: the end of a directive.
    End,
}

#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub kind: TokenKind,
    pub text: String,
    pub quoted: bool,
    pub span: Span,
    /// Characters the token takes in the source (quotes, escapes and `{$VAR}` as
    /// written), so a message can point just past it.
    pub width: u32,
}

/// Reads the environment; a seam so tests need not touch the process environment.
pub trait Env {
    fn get(&self, name: &str) -> Option<String>;
}

pub(crate) struct ProcessEnv;

impl Env for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

pub(crate) fn tokenize(file: FileId, text: &str, env: &dyn Env) -> Result<Vec<Token>, Diagnostic> {
    let mut out = Vec::new();
    for (idx, line) in text.lines().enumerate() {
        let line_no = idx as u32 + 1;
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        let span_at = |i: usize| Span {
            file,
            line: line_no,
            col: i as u32 + 1,
        };
        while i < chars.len() {
            let c = chars[i];
            if c.is_whitespace() {
                i += 1;
                continue;
            }
            if c == '#' {
                break;
            }
            if c == ';' {
                out.push(Token::punct(TokenKind::End, ";", span_at(i)));
                i += 1;
                continue;
            }
            let start = i;
            let (raw, quoted) = if c == '"' {
                let regex = out.last().is_some_and(|t: &Token| {
                    t.kind == TokenKind::Word && !t.quoted && t.text == "~"
                });
                let (s, next) = quoted_string(&chars, i, regex, span_at)?;
                i = next;
                (s, true)
            } else {
                while i < chars.len() && !chars[i].is_whitespace() && chars[i] != ';' {
                    i += 1;
                }
                (chars[start..i].iter().collect::<String>(), false)
            };
            let word = Raw {
                text: &raw,
                quoted,
                start,
                width: i - start,
            };
            word.tokens(&mut out, &span_at, env)?;
        }
        out.push(Token {
            width: 0,
            ..Token::punct(TokenKind::End, "", span_at(chars.len()))
        });
    }
    Ok(out)
}

impl Token {
    /// A one-character token: `;`, `{`, `}` (or the empty end of a line).
    fn punct(kind: TokenKind, text: &str, span: Span) -> Token {
        Token {
            kind,
            text: text.into(),
            quoted: false,
            span,
            width: 1,
        }
    }
}

/// One word as read from a line, before its braces are split off.
struct Raw<'a> {
    text: &'a str,
    quoted: bool,
    /// Its first column (0-based) and its width in characters, quotes included.
    start: usize,
    width: usize,
}

impl Raw<'_> {
    /// The word's tokens: braces glued to it (`{respond`, `/a{`, `x}`) open or close
    /// blocks, as nginx users write them; a `{…}` group inside a word stays
    /// (placeholders); the word itself with `{$ENV}` expanded.
    fn tokens(
        &self,
        out: &mut Vec<Token>,
        span_at: &dyn Fn(usize) -> Span,
        env: &dyn Env,
    ) -> Result<(), Diagnostic> {
        let (opens, core, closes) = if self.quoted {
            (0, self.text, 0)
        } else {
            glued_braces(self.text)
        };
        for k in 0..opens {
            out.push(Token::punct(TokenKind::Open, "{", span_at(self.start + k)));
        }
        let core_start = self.start + opens;
        if self.quoted || !core.is_empty() {
            let kind = match (self.quoted, core) {
                (false, "{") => TokenKind::Open,
                (false, "}") => TokenKind::Close,
                _ => TokenKind::Word,
            };
            let text = if kind == TokenKind::Word {
                expand_env(core, span_at(core_start), self.quoted, env)?
            } else {
                core.to_string()
            };
            let width = if self.quoted {
                self.width
            } else {
                core.chars().count()
            };
            out.push(Token {
                kind,
                text,
                quoted: self.quoted,
                span: span_at(core_start),
                width: width as u32,
            });
        }
        let close_at = core_start + core.chars().count();
        for (k, brace) in self.text[self.text.len() - closes..].chars().enumerate() {
            let kind = if brace == '{' {
                TokenKind::Open
            } else {
                TokenKind::Close
            };
            out.push(Token::punct(
                kind,
                &brace.to_string(),
                span_at(close_at + k),
            ));
        }
        Ok(())
    }
}

/// Splits the braces glued to an unquoted word off it: leading `{`s with no `}` after
/// them in the word, and trailing `}`s that close nothing in the word (or one trailing
/// `{`). Returns (leading opens, the word, number of trailing brace characters).
fn glued_braces(raw: &str) -> (usize, &str, usize) {
    if raw == "{" || raw == "}" {
        return (0, raw, 0);
    }
    let mut word = raw;
    let mut opens = 0;
    // `{$NAME` stays whole, so an unclosed environment reference is reported as one.
    while word.len() > 1
        && word.starts_with('{')
        && !word[1..].contains('}')
        && !word[1..].starts_with('$')
    {
        word = &word[1..];
        opens += 1;
    }
    if word == "{" {
        return (opens + 1, "", 0);
    }
    let mut closes = 0;
    if word.len() > 1 && word.ends_with('{') {
        word = &word[..word.len() - 1];
        closes = 1;
    } else {
        while !word.is_empty()
            && word.ends_with('}')
            && word.matches('}').count() > word.matches('{').count()
        {
            word = &word[..word.len() - 1];
            closes += 1;
        }
    }
    (opens, word, closes)
}

/// Replaces `{$NAME}` and `{$NAME:default}` in a word.
fn expand_env(word: &str, span: Span, quoted: bool, env: &dyn Env) -> Result<String, Diagnostic> {
    if !word.contains("{$") {
        return Ok(word.to_string());
    }
    let mut out = String::with_capacity(word.len());
    let mut rest = word;
    // Column of `rest` within the line: quoted words start one past their quote.
    let mut offset = span.col + u32::from(quoted);
    while let Some(pos) = rest.find("{$") {
        out.push_str(&rest[..pos]);
        let here = Span {
            col: offset + rest[..pos].chars().count() as u32,
            ..span
        };
        let after = &rest[pos + 2..];
        let end = after.find('}').ok_or_else(|| {
            Diagnostic::error(here, "unclosed environment reference `{$`")
                .with_hint("write {$NAME} or {$NAME:default}")
        })?;
        let inner = &after[..end];
        let (name, default) = match inner.split_once(':') {
            Some((n, d)) => (n, Some(d)),
            None => (inner, None),
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(Diagnostic::error(
                here,
                format!("`{name}` is not an environment variable name"),
            )
            .with_hint("names are letters, digits and `_`"));
        }
        match (env.get(name), default) {
            (Some(v), _) => out.push_str(&v),
            (None, Some(d)) => out.push_str(d),
            (None, None) => {
                return Err(Diagnostic::error(
                    here,
                    format!("environment variable `{name}` is not set"),
                )
                .with_hint(format!("set it, or give a default: {{${name}:value}}")))
            }
        }
        let consumed = pos + 2 + end + 1;
        offset += rest[..consumed].chars().count() as u32;
        rest = &rest[consumed..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The string whose opening quote is at `chars[open]`, unescaped, and the index just
/// past its closing quote. In a `regex`, an unknown escape is kept as written.
fn quoted_string(
    chars: &[char],
    open: usize,
    regex: bool,
    span_at: impl Fn(usize) -> Span,
) -> Result<(String, usize), Diagnostic> {
    let mut i = open + 1;
    let mut s = String::new();
    loop {
        match chars.get(i) {
            None => {
                return Err(Diagnostic::error(span_at(open), "unterminated string")
                    .with_hint("close the string with `\"` on the same line"))
            }
            Some('"') => return Ok((s, i + 1)),
            Some('\\') => {
                match chars.get(i + 1) {
                    Some('"') => s.push('"'),
                    Some('\\') => s.push('\\'),
                    Some('n') if !regex => s.push('\n'),
                    Some(&c) if regex => {
                        s.push('\\');
                        s.push(c);
                    }
                    other => {
                        let shown = other.map(|c| c.to_string()).unwrap_or_default();
                        return Err(Diagnostic::error(
                            span_at(i),
                            format!("unknown escape `\\{shown}` in a string"),
                        )
                        .with_hint("strings know \\\", \\\\ and \\n"));
                    }
                }
                i += 2;
            }
            Some(&ch) => {
                s.push(ch);
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct MapEnv(HashMap<&'static str, &'static str>);
    impl Env for MapEnv {
        fn get(&self, name: &str) -> Option<String> {
            self.0.get(name).map(|s| s.to_string())
        }
    }

    fn words(text: &str) -> Vec<String> {
        let env = MapEnv(HashMap::from([("PORT", "9000")]));
        tokenize(0, text, &env)
            .unwrap()
            .into_iter()
            .map(|t| match t.kind {
                TokenKind::End => "⏎".to_string(),
                _ => t.text,
            })
            .collect()
    }

    #[test]
    fn blocks_semicolons_and_comments() {
        assert_eq!(
            words("a { b 1; c \"x y\" } # note\nredirect {host}{path}"),
            [
                "a",
                "{",
                "b",
                "1",
                "⏎",
                "c",
                "x y",
                "}",
                "⏎",
                "redirect",
                "{host}{path}",
                "⏎"
            ]
        );
    }

    #[test]
    fn braces_glued_to_words() {
        assert_eq!(
            words("route /a {respond \"x\"}\n"),
            ["route", "/a", "{", "respond", "x", "}", "⏎"]
        );
        assert_eq!(
            words("route /a{ respond {host}}\n"),
            ["route", "/a", "{", "respond", "{host}", "}", "⏎"]
        );
        assert_eq!(
            words("a {b}\n"),
            ["a", "{b}", "⏎"],
            "a placeholder stays a word"
        );
        assert_eq!(words("x {{y\n"), ["x", "{", "{", "y", "⏎"]);
    }

    #[test]
    fn environment_expansion() {
        assert_eq!(words("listen 127.0.0.1:{$PORT}")[1], "127.0.0.1:9000");
        assert_eq!(words("x {$NOPE:7}")[1], "7");
        let err = tokenize(0, "x  {$NOPE}", &MapEnv(HashMap::new())).unwrap_err();
        assert_eq!((err.span.line, err.span.col), (1, 4));
        assert!(err.message.contains("NOPE"));
    }

    #[test]
    fn string_errors_have_positions() {
        let env = MapEnv(HashMap::new());
        let err = tokenize(0, "respond \"abc", &env).unwrap_err();
        assert_eq!(err.span.col, 9);
        let err = tokenize(0, "respond \"a\\qb\"", &env).unwrap_err();
        assert!(err.message.contains("escape"));
    }

    /// After a `~` word the string is a regex: `\"` and `\\` unescape, any other
    /// backslash stays (`\d`, `\.`, `\n`); a quoted `"~"` does not make the next one raw.
    #[test]
    fn strings_after_a_tilde_keep_regex_escapes() {
        assert_eq!(
            words(r#"route ~ "^/v\d+/\.x\n\"q\"\\" {"#),
            ["route", "~", r#"^/v\d+/\.x\n"q"\"#, "{", "⏎"]
        );
        let env = MapEnv(HashMap::new());
        assert!(tokenize(0, r#"x "~" "\d""#, &env).is_err());
        assert!(tokenize(0, "x ~\ny \"\\d\"", &env).is_err());
    }
}
