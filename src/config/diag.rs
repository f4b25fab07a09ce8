//! Diagnostics: positions in config files and the messages an operator reads.
//!
//! Every error and warning points at `FILE:LINE:COL` (1-based), quotes the offending
//! line with a caret under the column, and may end with a `hint:` line. Sources are kept
//! here so a diagnostic can be rendered long after parsing finished.

use std::fmt;
use std::sync::Arc;

/// Index of a file in [`Sources`].
pub type FileId = usize;

/// A position in a config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Span {
    pub file: FileId,
    pub line: u32,
    pub col: u32,
}

/// The texts of every file read for one load, with the names they are shown by.
#[derive(Debug, Default, Clone)]
pub struct Sources {
    files: Vec<(String, Arc<str>)>,
}

impl Sources {
    pub fn add(&mut self, name: String, text: Arc<str>) -> FileId {
        self.files.push((name, text));
        self.files.len() - 1
    }

    pub fn name(&self, id: FileId) -> &str {
        self.files
            .get(id)
            .map(|f| f.0.as_str())
            .unwrap_or("<unknown>")
    }

    /// How many files were read.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    pub fn text(&self, id: FileId) -> &str {
        self.files.get(id).map(|f| &*f.1).unwrap_or("")
    }

    fn line(&self, span: Span) -> Option<&str> {
        self.text(span.file)
            .lines()
            .nth(span.line.checked_sub(1)? as usize)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

/// One error or warning about the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub span: Span,
    pub message: String,
    pub hint: Option<String>,
}

impl Diagnostic {
    pub fn error(span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Error,
            span,
            message: message.into(),
            hint: None,
        }
    }

    pub fn warning(span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(span, message)
        }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Renders `FILE:LINE:COL: message`, the source line, a caret, and the hint.
    pub fn render(&self, sources: &Sources) -> String {
        let mut out = String::new();
        let kind = match self.severity {
            Severity::Error => "",
            Severity::Warning => "warning: ",
        };
        if self.span.line == 0 {
            // About a whole file (its signature), not a place in it.
            out.push_str(&format!(
                "{}: {}{}",
                sources.name(self.span.file),
                kind,
                self.message
            ));
        } else {
            out.push_str(&format!(
                "{}:{}:{}: {}{}",
                sources.name(self.span.file),
                self.span.line,
                self.span.col,
                kind,
                self.message
            ));
        }
        if let Some(line) = sources.line(self.span) {
            let pad: String = line
                .chars()
                .take(self.span.col.saturating_sub(1) as usize)
                .map(|c| if c == '\t' { '\t' } else { ' ' })
                .collect();
            out.push_str(&format!("\n    {line}\n    {pad}^"));
        }
        if let Some(hint) = &self.hint {
            out.push_str(&format!("\nhint: {hint}"));
        }
        out
    }
}

/// The outcome of a failed load: every diagnostic found, with the sources to render them.
#[derive(Debug, Clone)]
pub struct Report {
    pub diagnostics: Vec<Diagnostic>,
    pub sources: Sources,
}

impl Report {
    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Error)
    }

    pub fn warnings(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Warning)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.diagnostics.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}", d.render(&self.sources))?;
        }
        Ok(())
    }
}

impl std::error::Error for Report {}

/// The nearest of `candidates` to `word`, when it is close enough to be a likely typo.
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (word.len() / 3).clamp(1, 3);
    candidates
        .into_iter()
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_finds_typos_and_ignores_strangers() {
        let known = ["proxy", "respond", "redirect", "route"];
        assert_eq!(nearest("prxy", known), Some("proxy"));
        assert_eq!(nearest("rout", known), Some("route"));
        assert_eq!(nearest("database", known), None);
    }

    #[test]
    fn render_points_at_the_column() {
        let mut s = Sources::default();
        let f = s.add("a.conf".into(), "site x {\n  prxy 1\n}\n".into());
        let d = Diagnostic::error(
            Span {
                file: f,
                line: 2,
                col: 3,
            },
            "unknown directive `prxy`",
        )
        .with_hint("did you mean `proxy`?");
        assert_eq!(
            d.render(&s),
            "a.conf:2:3: unknown directive `prxy`\n      prxy 1\n      ^\nhint: did you mean `proxy`?"
        );
    }
}
