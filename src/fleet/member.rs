//! An instance's side of the fleet: follow the channel, have the server apply each
//! new head revision exactly as a reload (through the same command a `POST /reload`
//! sends), and write a heartbeat every [`HEARTBEAT`](super::HEARTBEAT).
//!
//! Redis down: the running revision keeps serving; the outage is logged once, the
//! connection is tried again every second, and the head is read as soon as it is
//! back (catching up on what was published meanwhile). The head is also read at every
//! heartbeat, so an announcement missed while subscribing is never lost for long.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use tokio::sync::{mpsc, oneshot};

use super::store::{self, Heartbeat};
use crate::admin::revisions::Revisions;
use crate::admin::{Command, Refused};
use crate::config::FleetConfig;
use crate::net::redis::shown;

/// One instance of a fleet.
pub(crate) struct Member {
    pub cfg: FleetConfig,
    /// Where revisions are handed to the server.
    pub commands: mpsc::Sender<Command>,
    /// Where the member's state is kept (`Revisions::fleet`).
    pub revisions: Arc<Mutex<Revisions>>,
    pub started: std::time::Instant,
}

impl Member {
    /// Follows the channel until the process ends.
    pub(crate) async fn run(self) {
        let url = shown(&self.cfg.url);
        let client = match crate::net::redis::client(&self.cfg.url) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("sluice: fleet: {url} is not a usable Redis address: {e}; this instance follows no fleet");
                return;
            }
        };
        let mut down = false;
        loop {
            let why = self.follow(&client, &mut down).await;
            if !down {
                tracing::warn!(
                    "sluice: fleet: Redis at {url}: {why}; serving revision {} meanwhile, catching up when it is back (retrying every second)",
                    self.state().revision
                );
            }
            down = true;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// One session with Redis: subscribe, catch up, then apply each announcement and
    /// beat; why it ended.
    async fn follow(&self, client: &redis::Client, down: &mut bool) -> String {
        let mut conn = match store::connect(client).await {
            Ok(c) => c,
            Err(e) => return e,
        };
        let mut sub = match tokio::time::timeout(super::DEADLINE, client.get_async_pubsub()).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return e.to_string(),
            Err(_) => return "no answer to subscribe".into(),
        };
        if let Err(e) = sub.subscribe(&self.cfg.channel).await {
            return format!("subscribe failed: {e}");
        }
        if std::mem::take(down) {
            tracing::info!(
                "sluice: fleet: Redis at {} is reachable again",
                shown(&self.cfg.url)
            );
        }
        let mut messages = sub.on_message();
        let mut tick = tokio::time::interval(super::HEARTBEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if let Err(e) = self.catch_up(&mut conn).await {
                return e;
            }
            tokio::select! {
                m = messages.next() => if m.is_none() {
                    return "the connection closed".into();
                },
                _ = tick.tick() => if let Err(e) = self.beat(&mut conn).await {
                    return e;
                },
            }
        }
    }

    fn state(&self) -> crate::admin::revisions::FleetState {
        let r = self.revisions.lock().unwrap_or_else(|e| e.into_inner());
        r.fleet.clone().unwrap_or_default()
    }

    fn update(&self, f: impl FnOnce(&mut crate::admin::revisions::FleetState)) {
        let mut r = self.revisions.lock().unwrap_or_else(|e| e.into_inner());
        f(r.fleet.get_or_insert_with(Default::default));
    }

    /// Applies the head revision unless it was tried already (applied or refused).
    async fn catch_up(&self, conn: &mut MultiplexedConnection) -> Result<(), String> {
        let Some(head) = store::head(conn, &self.cfg.channel).await? else {
            return Ok(());
        };
        let state = self.state();
        let seen = head.seen();
        if seen == state.tried {
            return Ok(());
        }
        let n = head.revision;
        // Redis not answering ends the session (the head is tried again after it);
        // an answer with no usable bundle is this revision's result.
        let result = match store::fetch(conn, &self.cfg.channel, n).await? {
            Ok(bundle) => self.apply(bundle, head.rollback).await,
            Err(why) => Err(why),
        };
        let result = match result {
            Ok(()) => "ok".to_string(),
            Err(why) => {
                tracing::error!(
                    "sluice: fleet: revision {n} refused, still serving revision {}: {why}",
                    state.revision
                );
                let first = why.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
                format!("refused: {}", first.chars().take(300).collect::<String>())
            }
        };
        self.update(|s| {
            s.tried = seen;
            s.result = result;
        });
        // The fleet sees the result now, not at the next tick.
        self.beat(conn).await
    }

    /// Hands `bundle` to the server; how it went.
    async fn apply(
        &self,
        bundle: crate::config::FleetRevision,
        rollback: bool,
    ) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        let cmd = Command::Fleet(Box::new(bundle), rollback, tx);
        if self.commands.send(cmd).await.is_err() {
            return Err("sluice is stopping".into());
        }
        match rx.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(Refused::Invalid(why))) => Err(why),
            Ok(Err(Refused::NoRevision(n))) => Err(format!("no revision {n}")),
            Err(_) => Err("sluice is stopping".into()),
        }
    }

    /// Writes this member's heartbeat and counts the members.
    async fn beat(&self, conn: &mut MultiplexedConnection) -> Result<(), String> {
        let s = self.state();
        let beat = Heartbeat {
            name: self.cfg.name.clone(),
            revision: s.revision,
            result: if s.result.is_empty() {
                "ok".into()
            } else {
                s.result
            },
            version: env!("CARGO_PKG_VERSION").into(),
            uptime_s: self.started.elapsed().as_secs(),
            seen: super::unix_now(),
        };
        store::beat(conn, &self.cfg.channel, &beat).await?;
        let n = store::count(conn, &self.cfg.channel).await?;
        self.update(|s| s.members = n);
        Ok(())
    }
}

/// The newest revision published on `cfg`'s channel, when there is one (at start).
pub(crate) async fn newest(
    cfg: &FleetConfig,
) -> Result<Option<(crate::config::FleetRevision, String)>, String> {
    let client = crate::net::redis::client(&cfg.url).map_err(|e| e.to_string())?;
    let mut conn = store::connect(&client).await?;
    match store::head(&mut conn, &cfg.channel).await? {
        Some(h) => {
            let rev = store::fetch(&mut conn, &cfg.channel, h.revision).await??;
            Ok(Some((rev, h.seen())))
        }
        None => Ok(None),
    }
}
