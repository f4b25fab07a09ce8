//! The fleet's keys in Redis, and the commands that use them: `sluice publish` (a new
//! revision, or `--rollback N`) and `sluice fleet status`.

use std::process::ExitCode;

use redis::aio::MultiplexedConnection;

use super::{bundle, DEADLINE, KEEP, MAX_BUNDLE};
use crate::config::{self, FleetRevision, Reader};
use crate::net::redis::shown;

/// Where a command publishes or looks: a Redis address and a channel.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: String,
    pub channel: String,
    /// `--redis-ca`: the PEM roots a `rediss://` server is verified against.
    pub redis_ca: Option<String>,
}

/// The channel's keys.
pub(crate) struct Keys<'a>(pub &'a str);

impl Keys<'_> {
    fn counter(&self) -> String {
        format!("{}:revisions", self.0)
    }
    fn revision(&self, n: u64) -> String {
        format!("{}:rev:{n}", self.0)
    }
    pub(crate) fn head(&self) -> String {
        format!("{}:head", self.0)
    }
    pub(crate) fn member(&self, name: &str) -> String {
        format!("{}:member:{name}", self.0)
    }
    /// The members by the time of their last beat (a sorted set): counting them
    /// never scans the keyspace.
    fn members(&self) -> String {
        format!("{}:members", self.0)
    }
}

/// One exchange with Redis, within [`DEADLINE`]; its error in words.
async fn within<T>(
    f: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(DEADLINE, f).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer in {}s", DEADLINE.as_secs())),
    }
}

/// A connection to `url`, made within [`DEADLINE`].
pub(crate) async fn connect(client: &redis::Client) -> Result<MultiplexedConnection, String> {
    within(client.get_multiplexed_async_connection()).await
}

/// Runs `cmd` within [`DEADLINE`].
pub(crate) async fn query<T: redis::FromRedisValue>(
    conn: &mut MultiplexedConnection,
    cmd: &redis::Cmd,
) -> Result<T, String> {
    within(cmd.query_async::<T>(conn)).await
}

/// What `{channel}:head` holds: the revision the fleet should run and the stamp of
/// the announcement, so that a Redis that lost its data and numbers revisions from 1
/// again is still followed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Head {
    pub revision: u64,
    pub stamp: String,
    /// Announced by `publish --rollback`: an explicit way back, not judged by the
    /// files' signing times (DESIGN §18.3).
    pub rollback: bool,
}

impl Head {
    fn parse(s: &str) -> Option<Head> {
        let mut words = s.split(' ');
        Some(Head {
            revision: words.next()?.parse().ok()?,
            stamp: words.next().unwrap_or("").to_string(),
            rollback: words.next() == Some("rollback"),
        })
    }

    /// What a member remembers of the head it tried.
    pub(crate) fn seen(&self) -> String {
        format!("{} {}", self.revision, self.stamp)
    }
}

/// The revision the fleet should run, when one was published.
pub(crate) async fn head(
    conn: &mut MultiplexedConnection,
    channel: &str,
) -> Result<Option<Head>, String> {
    let v: Option<String> = query(conn, redis::cmd("GET").arg(Keys(channel).head())).await?;
    Ok(v.as_deref().and_then(Head::parse))
}

/// Revision `n`'s bundle: `Err` when Redis did not answer (try again), `Ok(Err)`
/// when it answered with no usable bundle (not kept, not readable).
pub(crate) async fn fetch(
    conn: &mut MultiplexedConnection,
    channel: &str,
    n: u64,
) -> Result<Result<FleetRevision, String>, String> {
    let v: Option<String> = query(conn, redis::cmd("GET").arg(Keys(channel).revision(n))).await?;
    Ok(match v {
        Some(text) => bundle::decode(n, &text),
        None => Err(format!("revision {n} is not kept (the last {KEEP} are)")),
    })
}

/// Stores `text` as the next revision, makes it the head and announces it; its number.
async fn store(conn: &mut MultiplexedConnection, channel: &str, text: &str) -> Result<u64, String> {
    let keys = Keys(channel);
    let n: u64 = query(conn, redis::cmd("INCR").arg(keys.counter())).await?;
    query::<()>(conn, redis::cmd("SET").arg(keys.revision(n)).arg(text)).await?;
    if n > KEEP {
        query::<()>(conn, redis::cmd("DEL").arg(keys.revision(n - KEEP))).await?;
    }
    announce(conn, channel, n, false).await?;
    Ok(n)
}

/// Sets the head to `head` (`N STAMP [rollback]`) unless a publish raced this one and
/// set a newer revision; a rollback sets it whatever it was.
const SET_HEAD: &str = r"
local now = redis.call('GET', KEYS[1])
if ARGV[3] == '0' and now then
  local n = tonumber(string.match(now, '^%d+'))
  if n and n > tonumber(ARGV[1]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
";

/// Makes `n` the head and tells the members.
async fn announce(
    conn: &mut MultiplexedConnection,
    channel: &str,
    n: u64,
    rollback: bool,
) -> Result<(), String> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let head = match rollback {
        true => format!("{n} {stamp:x} rollback"),
        false => format!("{n} {stamp:x}"),
    };
    let set = redis::cmd("EVAL")
        .arg(SET_HEAD)
        .arg(1)
        .arg(Keys(channel).head())
        .arg(n)
        .arg(head)
        .arg(u8::from(rollback).to_string())
        .clone();
    query::<i64>(conn, &set).await?;
    query::<i64>(conn, redis::cmd("PUBLISH").arg(channel).arg(n)).await?;
    Ok(())
}

/// One member's heartbeat, as `fleet status` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Heartbeat {
    pub name: String,
    pub revision: u64,
    pub result: String,
    pub version: String,
    pub uptime_s: u64,
    pub seen: u64,
}

impl Heartbeat {
    /// `NAME revision N ok|refused: REASON VERSION up Ns seen Ns ago`.
    fn line(&self, now: u64) -> String {
        format!(
            "{} revision {} {} {} up {}s seen {}s ago",
            self.name,
            self.revision,
            self.result,
            self.version,
            self.uptime_s,
            now.saturating_sub(self.seen)
        )
    }
}

/// Writes `beat` under its member key, expiring after the heartbeat TTL.
pub(crate) async fn beat(
    conn: &mut MultiplexedConnection,
    channel: &str,
    beat: &Heartbeat,
) -> Result<(), String> {
    let key = Keys(channel).member(&beat.name);
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("HSET")
        .arg(&key)
        .arg("revision")
        .arg(beat.revision)
        .arg("result")
        .arg(&beat.result)
        .arg("version")
        .arg(&beat.version)
        .arg("uptime_s")
        .arg(beat.uptime_s)
        .arg("seen")
        .arg(beat.seen)
        .ignore()
        .cmd("EXPIRE")
        .arg(&key)
        .arg(super::HEARTBEAT_TTL.as_secs())
        .ignore()
        .cmd("ZADD")
        .arg(Keys(channel).members())
        .arg(beat.seen)
        .arg(&beat.name)
        .ignore()
        // Members silent for a minute leave the set.
        .cmd("ZREMRANGEBYSCORE")
        .arg(Keys(channel).members())
        .arg("-inf")
        .arg(beat.seen.saturating_sub(60))
        .ignore();
    within(pipe.query_async::<()>(conn)).await
}

/// The members whose heartbeat is live (seen within its TTL).
pub(crate) async fn count(
    conn: &mut MultiplexedConnection,
    channel: &str,
) -> Result<usize, String> {
    let since = super::unix_now().saturating_sub(super::HEARTBEAT_TTL.as_secs());
    let cmd = redis::cmd("ZCOUNT")
        .arg(Keys(channel).members())
        .arg(since)
        .arg("+inf")
        .clone();
    query(conn, &cmd).await
}

/// Every member with a live heartbeat, by name.
pub(crate) async fn members(
    conn: &mut MultiplexedConnection,
    channel: &str,
) -> Result<Vec<Heartbeat>, String> {
    let keys = Keys(channel);
    let since = super::unix_now().saturating_sub(super::HEARTBEAT_TTL.as_secs());
    let cmd = redis::cmd("ZRANGEBYSCORE")
        .arg(keys.members())
        .arg(since)
        .arg("+inf")
        .clone();
    let mut names: Vec<String> = query(conn, &cmd).await?;
    names.sort();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let h: std::collections::HashMap<String, String> =
            query(conn, redis::cmd("HGETALL").arg(keys.member(&name))).await?;
        if h.is_empty() {
            continue;
        }
        let num = |f: &str| h.get(f).and_then(|v| v.parse().ok()).unwrap_or(0);
        out.push(Heartbeat {
            name,
            revision: num("revision"),
            result: h.get("result").cloned().unwrap_or_default(),
            version: h.get("version").cloned().unwrap_or_default(),
            uptime_s: num("uptime_s"),
            seen: num("seen"),
        });
    }
    Ok(out)
}

/// A client for the target: its `--redis-ca` read first.
fn client(to: &Target) -> Result<redis::Client, String> {
    let ca = match &to.redis_ca {
        Some(path) => Some(std::sync::Arc::new(
            std::fs::read(path).map_err(|e| format!("--redis-ca {path}: {e}"))?,
        )),
        None => None,
    };
    crate::net::redis::configure(DEADLINE, ca);
    crate::net::redis::client(&to.url)
        .map_err(|e| format!("{} is not a usable Redis address: {e}", shown(&to.url)))
}

/// Runs `f` with a connection to the target, on a runtime of its own.
fn with_redis<T>(
    to: &Target,
    f: impl AsyncFnOnce(&mut MultiplexedConnection) -> Result<T, String>,
) -> Result<T, String> {
    let client = client(to)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    rt.block_on(async {
        let mut conn = connect(&client)
            .await
            .map_err(|e| format!("cannot reach Redis at {}: {e}", shown(&to.url)))?;
        f(&mut conn).await
    })
}

/// `sluice publish -c FILE --to URL`: checks `file` (signatures too, with `key`), then
/// publishes every file it read as the next revision.
pub fn cli_publish(file: &str, key: Option<&config::signed::VerifyKey>, to: &Target) -> ExitCode {
    let loaded = match config::load_file_verified(file, key, &Default::default()) {
        Ok(l) => l,
        Err(r) => {
            eprintln!("{r}");
            eprintln!("sluice publish: {file}: config rejected; nothing was published");
            return ExitCode::from(1);
        }
    };
    for w in loaded.warnings.warnings() {
        eprintln!("{}", w.render(&loaded.warnings.sources));
    }
    let sources = &loaded.warnings.sources;
    let files = config::Files::of(sources, 0..sources.len(), &Reader::Disk, true);
    let publisher = loaded
        .config
        .global
        .fleet
        .as_ref()
        .map_or_else(|| "sluice publish".to_string(), |f| f.name.clone());
    let text = bundle::encode(sources.name(0), &files, &publisher);
    if text.len() > MAX_BUNDLE {
        eprintln!(
            "sluice publish: {file}: the bundle is {} bytes, over the {} MiB a revision may hold; nothing was published",
            text.len(),
            MAX_BUNDLE >> 20
        );
        return ExitCode::from(1);
    }
    let signed = files.map.values().filter(|f| f.minisig.is_some()).count();
    match with_redis(to, async |conn| store(conn, &to.channel, &text).await) {
        Ok(n) => {
            println!(
                "sluice publish: revision {n} published to {} (channel {}): {} files, {signed} signed",
                shown(&to.url),
                to.channel,
                files.map.len()
            );
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("sluice publish: {why}; nothing was published");
            ExitCode::from(1)
        }
    }
}

/// `sluice publish --rollback N --to URL`: announces revision `n` again.
pub fn cli_rollback(n: u64, to: &Target) -> ExitCode {
    let done = with_redis(to, async |conn| {
        // Checked first: a rollback to a revision no longer kept changes nothing.
        fetch(conn, &to.channel, n).await??;
        announce(conn, &to.channel, n, true).await
    });
    match done {
        Ok(()) => {
            println!(
                "sluice publish: revision {n} announced again on {} (channel {})",
                shown(&to.url),
                to.channel
            );
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("sluice publish: rollback to {n} refused: {why}");
            ExitCode::from(1)
        }
    }
}

/// `sluice fleet status --to URL`: one line per member.
pub fn cli_status(to: &Target) -> ExitCode {
    let got = with_redis(to, async |conn| {
        let head = head(conn, &to.channel).await?;
        Ok((head, members(conn, &to.channel).await?))
    });
    match got {
        Ok((head, list)) => {
            let now = super::unix_now();
            for m in &list {
                println!("{}", m.line(now));
            }
            eprintln!(
                "sluice fleet: {} (channel {}): head revision {}, {} members",
                shown(&to.url),
                to.channel,
                head.map_or("none".to_string(), |h| h.revision.to_string()),
                list.len()
            );
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("sluice fleet status: {why}");
            ExitCode::from(1)
        }
    }
}
