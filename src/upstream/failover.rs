//! Active-passive failover (`backup`, `failover { … }`, DESIGN.md §8.5 and §14): the
//! pool has a role, primary or backup, and sends requests only to the peers of its
//! role.
//!
//! Consecutive failure evidence from primaries (a peer that cannot be reached, a
//! timeout, a 5xx) reaching `failure_threshold` switches to backup, and so does every
//! primary becoming ineligible. Backup stays for max(`hold_down`, `failback_delay`);
//! then `recovery_threshold` consecutive successes of primaries switch back: probe
//! passes when the pool has active health, otherwise trials — every 10th request goes
//! to a primary; a failed trial restarts the hold. `failure_threshold` failures of the
//! backup in a row while a primary is eligible return the role early. Each switch is
//! counted and named for the response whose outcome caused it (a switch made by probes:
//! the next response). Atomics only; a switch is one compare-and-swap.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};

use crate::config::Failover;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transition {
    PrimaryFailureThreshold = 1,
    BackupFailure = 2,
    PrimaryRecoveryThreshold = 3,
}

impl Transition {
    /// The switch in the log, as an operator reads it: which pool, to which role, why.
    pub(crate) fn log(self, pool: &str, why: &str) {
        let to = if self.to_backup() {
            "backup"
        } else {
            "primary"
        };
        tracing::warn!(
            pool,
            reason = self.as_str(),
            "sluice: {pool}: switched to {to} ({}: {why})",
            self.as_str()
        );
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Transition::PrimaryFailureThreshold => "primary_failure_threshold",
            Transition::BackupFailure => "backup_failure",
            Transition::PrimaryRecoveryThreshold => "primary_recovery_threshold",
        }
    }

    fn from_u8(v: u8) -> Option<Transition> {
        match v {
            1 => Some(Transition::PrimaryFailureThreshold),
            2 => Some(Transition::BackupFailure),
            3 => Some(Transition::PrimaryRecoveryThreshold),
            _ => None,
        }
    }

    /// Whether the switch went to the backup.
    pub(crate) fn to_backup(self) -> bool {
        self == Transition::PrimaryFailureThreshold
    }
}

#[derive(Debug, Default)]
pub(crate) struct State {
    backup: AtomicBool,
    primary_failures: AtomicU32,
    backup_failures: AtomicU32,
    recovery: AtomicU32,
    /// When backup became active, or its hold last restarted (`now_ms`).
    since_ms: AtomicU64,
    requests: AtomicU64,
    /// A switch probes made, for the next response to name.
    pending: AtomicU8,
    pub switches: AtomicU64,
    /// The last switch's transition (0: none yet) and when it happened (`now_ms`).
    last: AtomicU8,
    last_ms: AtomicU64,
}

impl State {
    fn on_backup(&self) -> bool {
        self.backup.load(Ordering::Relaxed)
    }

    /// The role requests go to now.
    pub(crate) fn role(&self) -> super::Role {
        if self.on_backup() {
            super::Role::Backup
        } else {
            super::Role::Primary
        }
    }

    /// The last switch, and when (`now_ms`); `None` before the first.
    pub(crate) fn last_switch(&self) -> Option<(Transition, u64)> {
        let t = Transition::from_u8(self.last.load(Ordering::Acquire))?;
        Some((t, self.last_ms.load(Ordering::Relaxed)))
    }

    /// On backup: the earliest time (`now_ms`) requests may go back to the primaries
    /// (the switch, or the hold's last restart, plus the longer of `hold_down` and
    /// `failback_delay`). `None` on the primaries.
    pub(crate) fn failback_at(&self, f: &Failover) -> Option<u64> {
        let hold = f.hold_down.max(f.failback_delay).as_millis() as u64;
        self.on_backup()
            .then(|| self.since_ms.load(Ordering::Relaxed) + hold)
    }

    fn hold_over(&self, f: &Failover, now: u64) -> bool {
        let hold = f.hold_down.max(f.failback_delay).as_millis() as u64;
        now >= self.since_ms.load(Ordering::Relaxed) + hold
    }

    /// Whether this request is a trial of the primaries (every 10th once the hold is
    /// over, when no probes decide recovery).
    pub(crate) fn is_trial(&self, f: &Failover, now: u64, probing: bool) -> bool {
        self.on_backup()
            && !probing
            && self.hold_over(f, now)
            && self.requests.fetch_add(1, Ordering::Relaxed) % 10 == 9
    }

    /// `announce`: a switch no request made, named on the next response — set before
    /// the switch shows, so a response on the new role cannot miss it.
    fn switch(
        &self,
        to_backup: bool,
        now: u64,
        t: Transition,
        announce: bool,
    ) -> Option<Transition> {
        if announce {
            self.pending.store(t as u8, Ordering::Release);
        }
        if self
            .backup
            .compare_exchange(!to_backup, to_backup, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            if announce {
                let _ =
                    self.pending
                        .compare_exchange(t as u8, 0, Ordering::AcqRel, Ordering::Relaxed);
            }
            return None;
        }
        self.since_ms.store(now, Ordering::Relaxed);
        self.primary_failures.store(0, Ordering::Relaxed);
        self.backup_failures.store(0, Ordering::Relaxed);
        self.recovery.store(0, Ordering::Relaxed);
        self.switches.fetch_add(1, Ordering::Relaxed);
        self.last_ms.store(now, Ordering::Relaxed);
        self.last.store(t as u8, Ordering::Release);
        Some(t)
    }

    /// Every primary is ineligible: to backup at once.
    pub(crate) fn primaries_down(&self, now: u64) -> Option<Transition> {
        if self.on_backup() {
            return None;
        }
        self.switch(true, now, Transition::PrimaryFailureThreshold, false)
    }

    /// Every backup is ineligible while a primary is: back to primary.
    pub(crate) fn backups_down(&self, now: u64) -> Option<Transition> {
        if !self.on_backup() {
            return None;
        }
        self.switch(false, now, Transition::BackupFailure, false)
    }

    /// A primary's outcome (a request, or a trial while on backup).
    pub(crate) fn primary_result(&self, ok: bool, f: &Failover, now: u64) -> Option<Transition> {
        if !self.on_backup() {
            if ok {
                self.primary_failures.store(0, Ordering::Relaxed);
                return None;
            }
            let n = self.primary_failures.fetch_add(1, Ordering::Relaxed) + 1;
            if n < f.failure_threshold {
                return None;
            }
            return self.switch(true, now, Transition::PrimaryFailureThreshold, false);
        }
        if !ok {
            // A failed trial restarts the hold.
            self.recovery.store(0, Ordering::Relaxed);
            self.since_ms.store(now, Ordering::Relaxed);
            return None;
        }
        self.recovered(f, now, false)
    }

    fn recovered(&self, f: &Failover, now: u64, announce: bool) -> Option<Transition> {
        let n = self.recovery.fetch_add(1, Ordering::Relaxed) + 1;
        if n < f.recovery_threshold {
            return None;
        }
        self.switch(false, now, Transition::PrimaryRecoveryThreshold, announce)
    }

    /// A backup's outcome while on backup.
    pub(crate) fn backup_result(
        &self,
        ok: bool,
        f: &Failover,
        now: u64,
        primary_eligible: bool,
    ) -> Option<Transition> {
        if !self.on_backup() {
            return None;
        }
        if ok {
            self.backup_failures.store(0, Ordering::Relaxed);
            return None;
        }
        let n = self.backup_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n < f.failure_threshold || !primary_eligible {
            return None;
        }
        self.switch(false, now, Transition::BackupFailure, false)
    }

    /// A primary's probe: counts toward recovery once the hold is over. A switch it
    /// makes is named on the next response.
    pub(crate) fn probe_result(&self, passed: bool, f: &Failover, now: u64) -> Option<Transition> {
        if !self.on_backup() || !self.hold_over(f, now) {
            return None;
        }
        if !passed {
            self.recovery.store(0, Ordering::Relaxed);
            return None;
        }
        self.recovered(f, now, true)
    }

    /// The switch probes made, if no response has named it yet, for a response served
    /// by the role it switched to (one from the old role, racing the switch, does not
    /// take it).
    pub(crate) fn take_pending(&self, served_by: super::Role) -> Option<Transition> {
        let raw = self.pending.load(Ordering::Acquire);
        let t = Transition::from_u8(raw)?;
        if t.to_backup() != (served_by == super::Role::Backup) {
            return None;
        }
        self.pending
            .compare_exchange(raw, 0, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        Some(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn f() -> Failover {
        Failover {
            failure_threshold: 2,
            recovery_threshold: 2,
            hold_down: Duration::from_secs(5),
            failback_delay: Duration::from_secs(10),
        }
    }

    #[test]
    fn a_full_cycle_with_trials() {
        let (s, f) = (State::default(), f());
        assert_eq!(s.primary_result(false, &f, 0), None);
        assert_eq!(
            s.primary_result(true, &f, 0),
            None,
            "a success resets the count"
        );
        assert_eq!(s.primary_result(false, &f, 0), None);
        assert_eq!(
            s.primary_result(false, &f, 1_000),
            Some(Transition::PrimaryFailureThreshold)
        );
        assert!(s.on_backup());
        let trials = |at: u64| (0..20).filter(|_| s.is_trial(&f, at, false)).count();
        assert_eq!(
            trials(10_999),
            0,
            "no trial within max(hold_down, failback_delay)"
        );
        assert_eq!(trials(11_000), 2, "then every 10th request");
        assert_eq!(
            s.primary_result(false, &f, 12_000),
            None,
            "a failed trial..."
        );
        assert_eq!(trials(21_999), 0, "...restarts the hold");
        assert_eq!(s.primary_result(true, &f, 22_000), None);
        assert_eq!(
            s.primary_result(true, &f, 22_000),
            Some(Transition::PrimaryRecoveryThreshold)
        );
        assert!(!s.on_backup());
        assert_eq!(s.switches.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn backup_failures_return_early_only_to_an_eligible_primary() {
        let (s, f) = (State::default(), f());
        s.primaries_down(0);
        assert!(s.on_backup());
        assert_eq!(s.backup_result(false, &f, 1, false), None);
        assert_eq!(
            s.backup_result(false, &f, 1, false),
            None,
            "no primary to go to"
        );
        assert_eq!(
            s.backup_result(false, &f, 1, true),
            Some(Transition::BackupFailure)
        );
        s.primaries_down(2);
        assert_eq!(
            s.probe_result(true, &f, 3),
            None,
            "probes wait for the hold too"
        );
        assert_eq!(s.probe_result(true, &f, 10_002), None);
        assert_eq!(
            s.probe_result(true, &f, 10_002),
            Some(Transition::PrimaryRecoveryThreshold)
        );
        assert_eq!(
            s.take_pending(crate::upstream::Role::Backup),
            None,
            "not on a response from the old role"
        );
        assert_eq!(
            s.take_pending(crate::upstream::Role::Primary),
            Some(Transition::PrimaryRecoveryThreshold)
        );
        assert_eq!(
            s.take_pending(crate::upstream::Role::Primary),
            None,
            "named once"
        );
    }
}
