//! Log lines on stderr: `2026-12-01T09:30:00.123Z WARN sluice: … pool="site /api/*"
//! peer=10.0.0.5:80` — an RFC 3339 UTC timestamp, the level, the message, then the
//! line's fields as `key=value` (quoted when the value has a space or a quote), so an
//! operator can search by pool, peer or reason. With `global { log_format json }` each
//! line is one JSON object instead: `{"ts":…,"level":"WARN","msg":…}` and the
//! fields as string members (set when a config is applied, so lines before the first
//! load are text).
//!
//! `SLUICE_LOG` sets the level (`error`, `warn`, `info` — the default —, `debug`,
//! `trace`), optionally followed by `TARGET=LEVEL` pairs (`info,h2=debug`). An unknown
//! value is a start-up error, not a silent default. The protocol libraries (`h2`,
//! `hyper`) are held to `error` unless named: a peer must not be able to write log
//! lines at will (an unsolicited h2 PING ACK makes `h2` log one at INFO).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use tracing::level_filters::LevelFilter;
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// Targets whose lines a client could cause; held to ERROR unless `SLUICE_LOG` names them.
const QUIET: [&str; 2] = ["h2", "hyper"];

/// The filter `SLUICE_LOG` asks for (`None`: unset).
pub(crate) fn parse_spec(spec: Option<&str>) -> Result<Targets, String> {
    let mut targets = Targets::new().with_default(LevelFilter::INFO);
    for t in QUIET {
        targets = targets.with_target(t, LevelFilter::ERROR);
    }
    let Some(spec) = spec else {
        return Ok(targets);
    };
    for (i, part) in spec.split(',').map(str::trim).enumerate() {
        match part.split_once('=') {
            None if i == 0 => targets = targets.with_default(level(part)?),
            Some((target, lvl)) if !target.is_empty() => {
                targets = targets.with_target(target, level(lvl)?)
            }
            _ => {
                return Err(format!(
                    "`{part}`: write a level first, then TARGET=LEVEL pairs, like info,h2=debug"
                ))
            }
        }
    }
    Ok(targets)
}

fn level(s: &str) -> Result<LevelFilter, String> {
    match s {
        "off" => Ok(LevelFilter::OFF),
        "error" => Ok(LevelFilter::ERROR),
        "warn" => Ok(LevelFilter::WARN),
        "info" => Ok(LevelFilter::INFO),
        "debug" => Ok(LevelFilter::DEBUG),
        "trace" => Ok(LevelFilter::TRACE),
        _ => Err(format!(
            "unknown level `{s}` (levels: off, error, warn, info, debug, trace)"
        )),
    }
}

/// Installs the stderr logger as `SLUICE_LOG` asks; `Err` names what is wrong with it.
pub fn init() -> Result<(), String> {
    let spec = std::env::var("SLUICE_LOG").ok();
    let targets = parse_spec(spec.as_deref()).map_err(|e| format!("SLUICE_LOG: {e}"))?;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .event_format(Line);
    tracing_subscriber::registry()
        .with(fmt)
        .with(targets)
        .try_init()
        .map_err(|e| e.to_string())
}

/// `log_format json` is in force.
static JSON: AtomicBool = AtomicBool::new(false);

/// Switches the line format (at each config applied).
pub(crate) fn set_json(on: bool) {
    JSON.store(on, Ordering::Relaxed);
}

/// `TIME LEVEL message`.
struct Line;

impl<S, N> FormatEvent<S, N> for Line
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let _ = ctx;
        let mut fields = Fields::default();
        event.record(&mut fields);
        let (time, level) = (rfc3339(SystemTime::now()), event.metadata().level());
        if JSON.load(Ordering::Relaxed) {
            let text = |v: &str| serde_json::Value::from(v).to_string();
            write!(
                w,
                "{{\"ts\":\"{time}\",\"level\":\"{level}\",\"msg\":{}",
                text(&fields.message)
            )?;
            for (name, value) in &fields.rest {
                write!(w, ",{}:{}", text(name), text(value))?;
            }
            return writeln!(w, "}}");
        }
        write!(w, "{time} {level} ")?;
        w.write_str(&fields.message)?;
        for (name, value) in &fields.rest {
            if value.is_empty() || value.contains([' ', '"', '=']) {
                write!(w, " {name}={value:?}")?;
            } else {
                write!(w, " {name}={value}")?;
            }
        }
        writeln!(w)
    }
}

/// An event's message, and its other fields in the order written.
#[derive(Default)]
struct Fields {
    message: String,
    rest: Vec<(&'static str, String)>,
}

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.rest.push((field.name(), value.to_string()));
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.rest.push((field.name(), format!("{value:?}")));
        }
    }
}

pub(crate) use crate::clock::rfc3339;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn timestamps() {
        let t = UNIX_EPOCH + Duration::from_millis(1_796_117_400_123);
        assert_eq!(rfc3339(t), "2026-12-01T09:30:00.123Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn specs() {
        assert!(parse_spec(None).is_ok());
        assert!(parse_spec(Some("debug")).is_ok());
        assert!(parse_spec(Some("info,h2=trace")).is_ok());
        assert!(parse_spec(Some("verbose")).is_err());
        assert!(
            parse_spec(Some("h2=debug")).is_ok(),
            "pairs alone keep the default level"
        );
        assert!(parse_spec(Some("info,=debug")).is_err());
        assert!(parse_spec(Some("info,h2=loud")).is_err());
    }
}
