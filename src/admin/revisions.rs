//! Revisions: every good load is numbered (the first is 1) and kept in memory with its
//! source text, the last 20 of them, so an operator can see what ran when and roll
//! back to it. A rejected load makes none.

use std::collections::VecDeque;
use std::time::SystemTime;

/// How many revisions are kept.
pub(crate) const KEEP: usize = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    Start,
    Reload,
    Rollback,
    /// A fleet revision (DESIGN §18.6).
    Fleet,
}

impl Origin {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Origin::Start => "start",
            Origin::Reload => "reload",
            Origin::Rollback => "rollback",
            Origin::Fleet => "fleet",
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Revision {
    pub number: u64,
    pub loaded_at: SystemTime,
    pub origin: Origin,
    /// The text of every file it read: a rollback restores them all.
    pub kept: crate::config::Kept,
    /// The id of the key its files were verified with (`--verify-key`).
    pub signed_by: Option<String>,
    /// When its files were signed, by path: a reload may not go back past them.
    pub signed_at: crate::config::signed::SignedAt,
}

/// The revisions kept, and what the admin API shows besides.
#[derive(Debug, Default)]
pub(crate) struct Revisions {
    list: VecDeque<Revision>,
    /// The addresses sluice listens on now, as bound.
    pub listeners: Vec<String>,
    /// The last reload (`SIGHUP`, `POST /reload`, `sluice reload`), good or refused;
    /// `None` before any.
    pub last_reload: Option<LastReload>,
    /// `fleet`: what this member runs and what it last heard.
    pub fleet: Option<FleetState>,
}

/// A fleet member's state, as its heartbeat and `/status` show it.
#[derive(Debug, Clone, Default)]
pub(crate) struct FleetState {
    /// The fleet revision running (0: none yet, the local file).
    pub revision: u64,
    /// `ok`, or `refused: REASON` for the last revision tried.
    pub result: String,
    /// The head (`N STAMP`) last tried, applied or refused: not tried again.
    pub tried: String,
    /// Members with a live heartbeat, as last counted.
    pub members: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct LastReload {
    pub ok: bool,
    pub at: SystemTime,
    /// Why it was refused (the rendered errors).
    pub error: Option<String>,
}

impl Revisions {
    /// Records a good load; returns its number.
    pub(crate) fn record(
        &mut self,
        origin: Origin,
        kept: crate::config::Kept,
        signed_by: Option<String>,
        signed_at: crate::config::signed::SignedAt,
    ) -> u64 {
        let number = self.current() + 1;
        if self.list.len() == KEEP {
            self.list.pop_front();
        }
        self.list.push_back(Revision {
            number,
            loaded_at: SystemTime::now(),
            origin,
            kept,
            signed_by,
            signed_at,
        });
        number
    }

    /// The revision serving now (0 before the first load).
    pub(crate) fn current(&self) -> u64 {
        self.list.back().map_or(0, |r| r.number)
    }

    pub(crate) fn get(&self, number: u64) -> Option<&Revision> {
        self.list.iter().find(|r| r.number == number)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Revision> {
        self.list.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_twenty() {
        let mut r = Revisions::default();
        for _ in 0..25 {
            r.record(Origin::Reload, Default::default(), None, Default::default());
        }
        assert_eq!(r.current(), 25);
        assert!(r.get(5).is_none());
        assert!(r.get(6).is_some());
        assert_eq!(r.iter().count(), KEEP);
    }
}
