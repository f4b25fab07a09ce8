//! Sizes and durations as the config language writes them.
//!
//! Sizes: a whole number with an optional `K`, `M` or `G` (powers of 1024, either case,
//! optional trailing `B`); a bare number is bytes; fractions are refused with the
//! nearest whole spelling as a hint. Durations: whole numbers with `ms`, `s`, `m`, `h`,
//! combinable (`1m30s`); a bare number is refused because its unit would be a guess.

use std::time::Duration;

/// Why a size or duration was refused, with a hint for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnitError {
    pub message: String,
    pub hint: Option<String>,
}

fn err(message: impl Into<String>, hint: Option<String>) -> UnitError {
    UnitError {
        message: message.into(),
        hint,
    }
}

pub(crate) fn parse_size(text: &str) -> Result<u64, UnitError> {
    let upper = text.to_ascii_uppercase();
    let body = upper.strip_suffix('B').unwrap_or(&upper);
    let (digits, mult) = match body.chars().last() {
        Some('K') => (&body[..body.len() - 1], 1u64 << 10),
        Some('M') => (&body[..body.len() - 1], 1u64 << 20),
        Some('G') => (&body[..body.len() - 1], 1u64 << 30),
        _ => (body, 1),
    };
    if let Some((whole, frac)) = digits.split_once('.') {
        let hint = fraction_hint(whole, frac, mult);
        return Err(err(format!("size `{text}` has a fraction"), hint));
    }
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err(
            format!("`{text}` is not a size"),
            Some("write a whole number with an optional K, M or G, like 64K or 10M".into()),
        ));
    }
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| err(format!("size `{text}` is too large"), None))
}

fn fraction_hint(whole: &str, frac: &str, mult: u64) -> Option<String> {
    if mult == 1 {
        return Some("a size in bytes is a whole number".into());
    }
    let value: f64 = format!("{whole}.{frac}").parse().ok()?;
    let lower = mult >> 10;
    let unit = match lower {
        1 => "",
        1024 => "K",
        _ => "M",
    };
    let scaled = value * 1024.0;
    if scaled.fract() == 0.0 {
        Some(format!("write {}{unit}", scaled as u64))
    } else {
        Some("sizes are whole numbers of bytes, K, M or G".into())
    }
}

pub(crate) fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let bad = || {
        err(
            format!("`{text}` is not a duration"),
            Some(
                "write a whole number with ms, s, m, h or d, like 500ms, 30s, 1m30s or 365d".into(),
            ),
        )
    };
    if text.is_empty() {
        return Err(bad());
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err(
            format!("duration `{text}` has no unit"),
            Some(format!(
                "write {text}s for seconds or {text}ms for milliseconds"
            )),
        ));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let n_end = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        if n_end == 0 {
            if rest.starts_with('.') || rest.contains('.') {
                return Err(err(
                    format!("duration `{text}` has a fraction"),
                    Some("use a smaller unit: 1500ms instead of 1.5s".into()),
                ));
            }
            return Err(bad());
        }
        let n: u64 = rest[..n_end].parse().map_err(|_| bad())?;
        rest = &rest[n_end..];
        let (unit_len, unit) = if rest.starts_with("ms") {
            (2, Duration::from_millis(1))
        } else if rest.starts_with('s') {
            (1, Duration::from_secs(1))
        } else if rest.starts_with('m') {
            (1, Duration::from_secs(60))
        } else if rest.starts_with('h') {
            (1, Duration::from_secs(3600))
        } else if rest.starts_with('d') {
            (1, Duration::from_secs(86_400))
        } else if rest.starts_with('.') {
            return Err(err(
                format!("duration `{text}` has a fraction"),
                Some("use a smaller unit: 1500ms instead of 1.5s".into()),
            ));
        } else {
            return Err(bad());
        };
        rest = &rest[unit_len..];
        let part = unit
            .checked_mul(u32::try_from(n).map_err(|_| bad())?)
            .ok_or_else(bad)?;
        total = total.checked_add(part).ok_or_else(bad)?;
    }
    Ok(total)
}

/// Renders a duration the way the config writes it (`30s`, `1m30s`, `500ms`).
pub(crate) fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    if ms % 1000 != 0 {
        return format!("{ms}ms");
    }
    let mut s = (ms / 1000) as u64;
    let mut out = String::new();
    for (unit, len) in [("h", 3600), ("m", 60)] {
        if s >= len {
            out.push_str(&format!("{}{unit}", s / len));
            s %= len;
        }
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("100"), Ok(100));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("64kb"), Ok(65536));
        assert_eq!(parse_size("10M"), Ok(10 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        let e = parse_size("1.5M").unwrap_err();
        assert_eq!(e.hint.as_deref(), Some("write 1536K"));
        assert!(parse_size("M").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("12X").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("30")
            .unwrap_err()
            .message
            .contains("no unit"));
        assert!(parse_duration("1.5s")
            .unwrap_err()
            .message
            .contains("fraction"));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("s").is_err());
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
    }
}
