//! A fleet on Redis (DESIGN §18.6): one config published once, applied by every
//! instance that follows the channel, each reporting what it runs.
//!
//! - `bundle`: what a revision is (every config file read, with its signature) and its
//!   encoding.
//! - `store`: the Redis keys, read and written by `sluice publish`, `sluice fleet
//!   status` and the instances.
//! - `member`: an instance's side: follow the channel, hand each new revision to the
//!   server to apply exactly as a reload, write a heartbeat.
//!
//! The keys, under the channel's name (`sluice` by default):
//! `{channel}:revisions` (the last number given), `{channel}:rev:N` (a bundle; the last
//! [`KEEP`] are kept), `{channel}:head` (the revision the fleet should run: the newest,
//! or the one a rollback named, with a stamp and the `rollback` mark; a publish never
//! moves it back past a newer one), `{channel}:member:NAME` (a heartbeat hash,
//! expiring after [`HEARTBEAT_TTL`]) and `{channel}:members` (names by their last
//! beat, so counting members scans nothing). A publish or a rollback is announced on
//! the channel `{channel}` with the revision's number.

pub(crate) mod bundle;
pub(crate) mod member;
pub(crate) mod store;

pub use store::{cli_publish, cli_rollback, cli_status, Target};

use std::time::Duration;

/// Published revisions kept in Redis.
pub(crate) const KEEP: u64 = 50;
/// The largest bundle published or applied.
pub(crate) const MAX_BUNDLE: usize = 8 << 20;
/// How often an instance writes its heartbeat.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(5);
/// How long a heartbeat lives: a member silent for longer is gone from `fleet status`.
pub(crate) const HEARTBEAT_TTL: Duration = Duration::from_secs(15);
/// How long one Redis exchange of the fleet may take.
pub(crate) const DEADLINE: Duration = Duration::from_secs(5);

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
