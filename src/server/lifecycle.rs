//! The process's life: build the runtime, bind the listeners, compile the first
//! generation, accept; on SIGHUP reload; on SIGTERM/SIGINT stop accepting, let requests
//! in flight finish for up to `grace`, then exit 0. A second SIGTERM/SIGINT during the
//! drain exits at once; either way the requests cut are counted in the log.
//!
//! A reload is all or nothing: the file is read and checked, new listeners are bound,
//! and only then is the new generation swapped in; any failure leaves the running one
//! serving, untouched, and says why. Listeners the new config keeps are not touched,
//! added ones are bound, removed ones closed; connections are never cut by a reload.
//! Requests in flight finish on the generation they started with.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::drain::Drain;
use super::listeners::{self, bind_new, key, key_text, wanted, Accepting, Bound, Kind, ListenKey};
use crate::access::AccessLog;
use crate::admin::revisions::{FleetState, Origin, Revisions};
use crate::admin::{self, Command, Refused};
use crate::config::units::format_duration;
use crate::config::{self, Config};
use crate::runtime::{Generation, Live};

/// A tokio runtime with `workers` threads (default: the machine's cores).
pub fn runtime(workers: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    // One worker needs no work stealing: the current-thread scheduler does the same
    // work with fewer atomics and no cross-thread wakeups.
    let mut b = match workers {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    if let Some(n) = workers.filter(|n| *n > 1) {
        b.worker_threads(n);
    }
    b.enable_all().build()
}

/// Where the running config came from: the file a reload re-reads, if any, and the
/// text it was loaded from (revision 1's).
#[derive(Debug, Clone, Default)]
pub struct Source {
    pub file: Option<String>,
    /// What revision 1 read.
    pub kept: config::Kept,
    /// `--verify-key`: every file a reload or rollback reads must be signed by it.
    pub verify_key: Option<Arc<crate::config::signed::VerifyKey>>,
    /// The key id the start's files were verified with.
    pub signed_by: Option<String>,
    /// When the start's files were signed, by path.
    pub signed_at: crate::config::signed::SignedAt,
    /// Printed on stdout with each listening address (the demo's banner).
    pub banner: Option<String>,
}

/// Runs `config` until stopped.
pub fn serve(config: Config, source: Source) -> ExitCode {
    match runtime(config.global.workers) {
        Ok(rt) => serve_on(rt, config, source),
        Err(e) => {
            eprintln!("sluice: cannot start the runtime: {e}");
            ExitCode::from(1)
        }
    }
}

/// Raises the soft limit on open descriptors to the hard one: a proxy holds two a
/// request, and distributions start services at 1024, which a modest burst exhausts
/// (nginx's `worker_rlimit_nofile`, HAProxy's automatic `ulimit-n`).
fn raise_open_file_limit() {
    use rlimit::Resource;
    match Resource::NOFILE.get() {
        Ok((soft, hard)) if soft < hard => match Resource::NOFILE.set(hard, hard) {
            Ok(()) => tracing::info!("sluice: open file limit raised from {soft} to {hard}"),
            Err(e) => tracing::warn!(
                "sluice: open file limit stays at {soft} (cannot raise it to {hard}: {e})"
            ),
        },
        Ok(_) => {}
        Err(e) => tracing::warn!("sluice: cannot read the open file limit: {e}"),
    }
}

/// Why sluice could not start serving.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Bind(#[from] super::BindError),
    #[error("cannot listen on {addr} for the admin API: {source}; write `admin off` in `global` to run without it")]
    Admin {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the access log: {0}")]
    AccessLog(#[source] std::io::Error),
    #[error("cannot write the pid file {}: {source}", path.display())]
    PidFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// `pid_file`: written (atomically: a temporary file renamed over it) once the
/// listeners are bound; removed when the server ends cleanly (this is dropped).
struct PidFile(std::path::PathBuf);

impl PidFile {
    fn write(path: &std::path::Path) -> Result<PidFile, StartError> {
        let fail = |source| StartError::PidFile {
            path: path.to_path_buf(),
            source,
        };
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        std::fs::write(&tmp, format!("{}\n", std::process::id())).map_err(fail)?;
        std::fs::rename(&tmp, path).map_err(fail)?;
        Ok(PidFile(path.to_path_buf()))
    }
}

impl PidFile {
    fn path(&self) -> std::path::PathBuf {
        self.0.clone()
    }

    /// After an upgrade: the file is the new process's when it holds another PID
    /// (left in place); removed when it still holds this one's (the new config names
    /// another file, or none).
    fn release(self) {
        let ours = format!("{}\n", std::process::id());
        if std::fs::read_to_string(&self.0).is_ok_and(|t| t != ours) {
            std::mem::forget(self);
        }
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// [`serve`] on a runtime the caller built (and may have started tasks on).
pub fn serve_on(rt: tokio::runtime::Runtime, config: Config, source: Source) -> ExitCode {
    raise_open_file_limit();
    let code = rt.block_on(async move {
        let (config, source, fleet) = fleet_start(config, source).await;
        match start(config, source, fleet).await {
            Ok((server, commands)) => {
                server.run(commands).await;
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("sluice: {e}");
                super::handover::tell_parent(&format!("ERROR={e}"));
                ExitCode::from(1)
            }
        }
    });
    rt.shutdown_timeout(Duration::from_millis(100));
    code
}

/// With `fleet`: the newest published revision, when Redis answers and it loads
/// (DESIGN §18.6); else the file given, which is the fallback. What the member starts
/// from.
async fn fleet_start(config: Config, mut source: Source) -> (Config, Source, Option<FleetState>) {
    let (Some(fleet), Some(file)) = (config.global.fleet.clone(), source.file.clone()) else {
        return (config, source, None);
    };
    crate::net::redis::configure(config.global.redis_timeout, config.global.redis_ca.clone());
    let url = crate::net::redis::shown(&fleet.url);
    let mut state = FleetState::default();
    let newest = match crate::fleet::member::newest(&fleet).await {
        Ok(Some((rev, head))) => {
            state.tried = head;
            rev
        }
        Ok(None) => {
            tracing::info!(
                "sluice: fleet: nothing published on {url} (channel {}) yet; serving {file}",
                fleet.channel
            );
            return (config, source, Some(state));
        }
        Err(why) => {
            tracing::warn!("sluice: fleet: Redis at {url}: {why}; serving {file} until it answers");
            return (config, source, Some(state));
        }
    };
    let n = newest.revision;
    let key = source.verify_key.clone();
    match config::load_fleet(&file, &newest, key.as_deref(), &Default::default(), false) {
        Ok(l) => {
            for w in l.warnings.warnings() {
                tracing::warn!("{}", w.render(&l.warnings.sources));
            }
            tracing::info!("sluice: fleet: starting with revision {n} from {url}");
            state.revision = n;
            state.result = "ok".into();
            source.kept = l.kept;
            source.signed_by = l.signed_by;
            source.signed_at = l.signed_at;
            (l.config, source, Some(state))
        }
        Err(report) => {
            tracing::error!("sluice: fleet: revision {n} refused, serving {file}:\n{report}");
            let first = report.to_string().lines().next().unwrap_or("").to_string();
            state.result = format!("refused: {first}");
            (config, source, Some(state))
        }
    }
}

/// Starts following the fleet, from `state`.
fn join_fleet(
    cfg: config::FleetConfig,
    state: FleetState,
    commands: &mpsc::Sender<Command>,
    revisions: &Arc<Mutex<Revisions>>,
) -> JoinHandle<()> {
    revisions.lock().unwrap_or_else(|e| e.into_inner()).fleet = Some(state);
    let member = crate::fleet::member::Member {
        cfg,
        commands: commands.clone(),
        revisions: revisions.clone(),
        started: std::time::Instant::now(),
    };
    tokio::spawn(member.run())
}

/// Binds the listeners, compiles revision 1, starts the admin API and the access log,
/// and starts accepting; the server, and where the admin API's commands arrive.
async fn start(
    config: Config,
    source: Source,
    fleet: Option<FleetState>,
) -> Result<(Server, mpsc::Receiver<Command>), StartError> {
    let bound = bind_new(&wanted(&config), &HashMap::new())?;
    let _ = crate::stats::STARTED.set(std::time::SystemTime::now());
    crate::reply::set_server_tokens(config.global.server_tokens);
    let live = Live::new(Generation::compile(&config, None));
    let mut first = Revisions::default();
    let (kept, by, at) = (&source.kept, &source.signed_by, &source.signed_at);
    first.record(Origin::Start, kept.clone(), by.clone(), at.clone());
    let revisions = Arc::new(Mutex::new(first));
    let (commands_tx, commands) = mpsc::channel(8);
    let fleet_task = match (fleet, config.global.fleet.clone()) {
        (Some(state), Some(cfg)) => Some(join_fleet(cfg, state, &commands_tx, &revisions)),
        _ => None,
    };
    let own_commands = commands_tx.clone();
    let admin_token = admin::Token::default();
    admin_token.store(config.global.admin_token.clone().map(Arc::new));
    let api = admin::Api {
        live: live.clone(),
        revisions: revisions.clone(),
        commands: commands_tx,
        token: admin_token.clone(),
        origin_tests: Default::default(),
        open: Arc::default(),
    };
    let admin_open = api.open.clone();
    let (admin_addr, admin_fd, admin_task) = admin_api(config.global.admin, api).await?;
    crate::admin::log::set_json(config.global.log_json);
    let access: super::conn::Access = Arc::new(arc_swap::ArcSwapOption::empty());
    access.store(connections_log(&config, None).map_err(StartError::AccessLog)?);
    let mut server = Server {
        access,
        live,
        drain: Drain::new(),
        listeners: HashMap::new(),
        revisions,
        grace: config.global.grace,
        source,
        admin_addr,
        admin_config: config.global.admin,
        admin_fd,
        admin_task,
        admin_open,
        admin_token,
        signals: Signals::new(),
        pid_file: None,
        config: Arc::new(config.clone()),
        fleet_task,
        commands: own_commands,
    };
    // Signals first (above): once a listener is announced, a SIGHUP must reload, not
    // kill (the default action) a process still setting up.
    tracing::info!("sluice: loaded revision 1: {}", config.summary());
    // The listeners are bound (above); the file is there before any is announced.
    server.pid_file = match &config.global.pid_file {
        Some(p) => Some(PidFile::write(p)?),
        None => None,
    };
    server.discovered().await;
    server.start(bound);
    super::handover::close_unclaimed();
    tokio::spawn(watch_certificates(server.live.clone()));
    tell_systemd(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::MainPid(std::process::id()),
    ]);
    super::handover::tell_parent("READY=1");
    Ok((server, commands))
}

/// The admin API on `addr` (when it is on): where it listens, a duplicate of its
/// socket (for an upgrade) and its accept loop.
async fn admin_api(
    addr: Option<SocketAddr>,
    api: admin::Api,
) -> Result<(Option<SocketAddr>, Option<OwnedFd>, Option<JoinHandle<()>>), StartError> {
    let Some(addr) = addr else {
        return Ok((None, None, None));
    };
    let a = listeners::start_admin(addr, api)
        .await
        .map_err(|source| StartError::Admin { addr, source })?;
    Ok((a.local, a.fd, Some(a.task)))
}

/// Tells systemd (`Type=notify`, `NOTIFY_SOCKET` set) where the process is: ready,
/// reloading, stopping. Nothing without `NOTIFY_SOCKET`; a failure is logged at debug
/// only (the service still runs).
fn tell_systemd(states: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::debug!("sluice: notifying systemd: {e}");
    }
}

struct Server {
    /// Removed when the server is dropped at the end of a clean run.
    pid_file: Option<PidFile>,
    /// The access log the connections write to; a reload may replace it.
    access: super::conn::Access,
    live: Arc<Live>,
    drain: Drain,
    listeners: HashMap<ListenKey, Accepting>,
    revisions: Arc<Mutex<Revisions>>,
    grace: Duration,
    source: Source,
    admin_addr: Option<SocketAddr>,
    /// The admin address as the config wrote it (an upgrade names its socket by it),
    /// a duplicate of its socket, and its accept loop.
    admin_config: Option<SocketAddr>,
    admin_fd: Option<OwnedFd>,
    admin_task: Option<JoinHandle<()>>,
    /// Connections open to the admin API.
    admin_open: Arc<std::sync::atomic::AtomicUsize>,
    /// The admin API's token, which a reload may change.
    admin_token: admin::Token,
    signals: Signals,
    /// The config the live generation was compiled from: compiled again when a
    /// discovered pool's peers change.
    config: Arc<Config>,
    /// The fleet member, stopped when this process stops serving (a successor or
    /// nobody speaks for the instance from then on).
    fleet_task: Option<JoinHandle<()>>,
    /// Where a fleet member started by a reload sends its revisions.
    commands: mpsc::Sender<Command>,
}

/// WebSocket tunnels or L4 relays open in this process.
fn tunnels_open() -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    crate::tunnel::OPEN.load(Relaxed) + crate::l4::RELAYS_OPEN.load(Relaxed) > 0
}

/// How an upgrade ended.
enum Upgrade {
    /// The new process (this PID) serves; this one steps aside.
    Serving(u32),
    /// It did not start (why); this process serves on.
    Failed(String),
    /// A stop signal came meanwhile; the new process was stopped.
    Stopped,
}

impl Server {
    /// Serves until a stop signal or an upgrade: reloads, rollbacks and log reopens as
    /// they come; then drains (or steps aside for the new process) and closes the
    /// access log.
    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let upgraded = loop {
            tokio::select! {
                s = self.signals.next() => match s {
                    Signal::Reload => {
                        let _ = self.reloading(Self::reload);
                    }
                    Signal::Stop => break None,
                    Signal::Reopen => {
                        if let Some(log) = self.access.load_full() {
                            log.reopen();
                        }
                        for log in self.live.load().kept.site_logs.values() {
                            log.reopen();
                        }
                    }
                    Signal::Upgrade => match self.upgrade().await {
                        Upgrade::Serving(pid) => break Some(pid),
                        Upgrade::Failed(_) => {}
                        Upgrade::Stopped => break None,
                    },
                },
                _ = crate::upstream::discover::CHANGED.notified() => self.rediscover(),
                Some(c) = commands.recv() => match c {
                    Command::Reload(reply) => {
                        let _ = reply.send(self.reloading(Self::reload));
                    }
                    Command::Rollback(n, reply) => {
                        let _ = reply.send(self.reloading(|s| s.rollback(n)));
                    }
                    Command::Fleet(rev, rollback, reply) => {
                        let _ = reply.send(self.reloading(|s| s.fleet(&rev, rollback)));
                    }
                    Command::Upgrade(reply) => match self.upgrade().await {
                        Upgrade::Serving(pid) => {
                            let _ = reply.send(Ok(pid));
                            break Some(pid);
                        }
                        Upgrade::Failed(why) => {
                            let _ = reply.send(Err(why));
                        }
                        Upgrade::Stopped => {
                            let _ = reply.send(Err("sluice is stopping".into()));
                            break None;
                        }
                    },
                },
            }
        };
        let access = self.access.clone();
        let live = self.live.clone();
        if let Some(t) = self.fleet_task.take() {
            t.abort();
        }
        // The admin API's commands are answered 503 from now on.
        drop(commands);
        match upgraded {
            Some(pid) => self.step_aside(pid).await,
            None => self.stop().await,
        }
        if let Some(log) = access.swap(None) {
            // Every line of the requests that finished reaches the file.
            log.close();
        }
        for log in live.load().kept.site_logs.values() {
            log.close();
        }
    }

    /// Starts the new binary with every listening socket and waits for it to be ready.
    async fn upgrade(&mut self) -> Upgrade {
        let sockets = self.handover();
        tracing::info!(
            "sluice: upgrade: starting the binary again with {} listening sockets",
            sockets.len()
        );
        let starting = super::handover::start_successor(sockets);
        tokio::pin!(starting);
        let mut reload_after = false;
        let result = loop {
            tokio::select! {
                r = &mut starting => break r,
                s = self.signals.next() => match s {
                    Signal::Stop => {
                        tracing::warn!("sluice: upgrade: abandoned (stop signal); the new process is stopped");
                        return Upgrade::Stopped;
                    }
                    Signal::Upgrade => tracing::warn!("sluice: upgrade: one is under way; this SIGUSR2 is ignored"),
                    Signal::Reload => {
                        tracing::info!("sluice: upgrade: under way; the SIGHUP reloads once it is done (a new process reads the file anyway)");
                        reload_after = true;
                    }
                    Signal::Reopen => {
                        if let Some(log) = self.access.load_full() {
                            log.reopen();
                        }
                    }
                },
            }
        };
        match result {
            Ok(pid) => {
                tracing::info!("sluice: upgrade: PID {pid} is ready and serves; this process (PID {}) stops accepting", std::process::id());
                Upgrade::Serving(pid)
            }
            Err(why) => {
                tracing::error!("sluice: upgrade failed, still serving here: {why}");
                // The new process may have written its PID before it was stopped.
                if let Some(p) = self.pid_file.take() {
                    self.pid_file = PidFile::write(&p.path()).ok();
                    std::mem::forget(p);
                }
                if reload_after {
                    let _ = self.reloading(Self::reload);
                }
                Upgrade::Failed(why)
            }
        }
    }

    /// Duplicates of every listening socket, named by their listeners, for the new
    /// process.
    fn handover(&self) -> Vec<super::handover::Handover> {
        let listeners = self.listeners.iter().filter_map(|(k, a)| {
            let fd = a.fd.as_ref()?.try_clone().ok()?;
            Some(super::handover::Handover {
                key: key_text(k),
                fd,
            })
        });
        let admin = self
            .admin_config
            .zip(self.admin_fd.as_ref())
            .and_then(|(addr, fd)| {
                Some(super::handover::Handover {
                    key: listeners::admin_key(addr),
                    fd: fd.try_clone().ok()?,
                })
            });
        listeners.chain(admin).collect()
    }

    /// After an upgrade: the new process accepts on the same sockets; this one stops
    /// accepting, lets its requests finish (up to `grace`) and its tunnels (up to
    /// `tunnel_drain`), and exits. Its pid file is the new process's now.
    async fn step_aside(mut self, pid: u32) {
        if let Some(p) = self.pid_file.take() {
            p.release();
        }
        if let Some(t) = self.admin_task.take() {
            t.abort();
        }
        self.admin_fd = None;
        // systemd's main process is the new one (it sends READY=1 itself); no STOPPING=1
        // from here, which would read as the service stopping.
        tell_systemd(&[sd_notify::NotifyState::MainPid(pid)]);
        self.drain.step_aside();
        for (_, a) in std::mem::take(&mut self.listeners) {
            let _ = a.task.await;
        }
        let tunnel_drain = self.live.load().tunnel_drain;
        tracing::info!(
            "sluice: upgrade: handed over to PID {pid}; {} requests in flight get up to {}, tunnels up to {}; kept-alive connections close after their next response",
            self.drain.requests_in_flight(),
            format_duration(self.grace),
            format_duration(tunnel_drain)
        );
        let started = tokio::time::Instant::now();
        let in_flight = self.drain.requests_in_flight();
        let mut deadline = started + self.grace;
        let mut stopping = false;
        loop {
            tokio::select! {
                r = tokio::time::timeout_at(deadline, self.drain.closed()) => match r {
                    Ok(()) => {
                        tracing::info!(
                            "sluice: upgrade: drained: {in_flight} requests finished in {}, exiting",
                            format_duration(started.elapsed())
                        );
                        return self.admin_answered().await;
                    }
                    // Past `grace`: only tunnels keep the process, up to `tunnel_drain`,
                    // looked at every second.
                    Err(_) if !stopping && tunnels_open() && started + tunnel_drain > deadline => {
                        deadline = (deadline + Duration::from_secs(1)).min(started + tunnel_drain);
                    }
                    Err(_) => break,
                },
                s = self.signals.next() => match s {
                    // As for any stop: what is open gets `grace` from now; a second
                    // stop cuts it.
                    Signal::Stop if !stopping => {
                        stopping = true;
                        self.drain.start();
                        deadline = deadline.min(tokio::time::Instant::now() + self.grace);
                    }
                    Signal::Stop => break,
                    _ => tracing::warn!("sluice: this process handed over to PID {pid}; send signals there"),
                },
            }
        }
        tracing::info!(
            "sluice: upgrade: exiting with {} requests still in flight",
            self.drain.requests_in_flight()
        );
        self.admin_answered().await;
    }

    /// Waits (for at most 2 s) until no connection to the admin API is open: the
    /// answer to the `POST /upgrade` that started the new process is sent before this
    /// process exits.
    async fn admin_answered(&self) {
        let end = tokio::time::Instant::now() + Duration::from_secs(2);
        while self.admin_open.load(std::sync::atomic::Ordering::Relaxed) > 0
            && tokio::time::Instant::now() < end
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn start(&mut self, mut bound: Vec<(ListenKey, Bound)>) {
        // QUIC first: a TCP listener knows its `Alt-Svc` before its first accept.
        bound.sort_by_key(|(k, _)| k.2 != Kind::Quic);
        for (k, b) in bound {
            let accepting = {
                let list = |name: String| self.list(name);
                let ctx = listeners::Context {
                    live: &self.live,
                    drain: &self.drain,
                    access: &self.access,
                    banner: self.source.banner.as_deref(),
                    admin: self.admin_addr,
                    alt_svc: self.alt_svc_for(k),
                    list: &list,
                };
                listeners::start(k, b, &ctx)
            };
            self.listeners.insert(k, accepting);
        }
        self.link_alt_svc();
    }

    /// Lists a listener for the admin API — before it is announced, so whoever reads
    /// the announcement finds it on `/status`.
    fn list(&self, name: String) {
        self.revisions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .listeners
            .push(name);
    }

    /// Points each TCP TLS listener's `Alt-Svc` at the `quic` listener that shares its
    /// address, or clears it when there is none (a reload removed it).
    fn link_alt_svc(&self) {
        for (k, a) in &self.listeners {
            let Some(alt) = &a.alt_svc else {
                continue;
            };
            alt.store(self.alt_svc_for(*k));
        }
    }

    /// The `Alt-Svc` of TCP listener `k`: the `quic` listener of its address, if any.
    fn alt_svc_for(&self, k: ListenKey) -> Option<Arc<http::HeaderValue>> {
        let quic = (k.0, k.1, Kind::Quic, k.3, k.4);
        self.listeners
            .get(&quic)
            .map(|q| Arc::new(super::h3::alt_svc(q.port)))
    }

    /// Re-reads the config file and, if it loads, makes it the live generation.
    /// Runs a reload or a rollback between systemd's RELOADING=1 (with the monotonic
    /// time `Type=notify-reload` asks for) and READY=1, whatever its result.
    fn reloading<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        let mut states = vec![sd_notify::NotifyState::Reloading];
        states.extend(sd_notify::NotifyState::monotonic_usec_now().ok());
        tell_systemd(&states);
        let r = f(self);
        tell_systemd(&[sd_notify::NotifyState::Ready]);
        r
    }

    fn reload(&mut self) -> Result<u64, Refused> {
        let Some(file) = self.source.file.clone() else {
            tracing::warn!("sluice: reload: started without a config file, nothing to re-read");
            return Err(Refused::Invalid(
                "sluice was started without a config file: nothing to re-read".into(),
            ));
        };
        // A file signed before the running revision's is refused (DESIGN §18.3).
        let running = {
            let r = self.revisions.lock().unwrap_or_else(|e| e.into_inner());
            r.get(r.current())
                .map(|rev| rev.signed_at.clone())
                .unwrap_or_default()
        };
        let key = self.source.verify_key.as_deref();
        // A fleet member re-reads its own file and keeps the published revision.
        let loaded = match self.running_fleet() {
            Some(rev) => match config::load_fleet(&file, &rev, key, &running, false) {
                // The file left the fleet: it is the whole config again.
                Ok(l) if l.config.global.fleet.is_none() => {
                    config::load_file_verified(&file, key, &running)
                }
                l => l,
            },
            None => config::load_file_verified(&file, key, &running),
        };
        let result = self.apply(loaded, Origin::Reload);
        let (counter, error) = match &result {
            Ok(_) => (&crate::stats::COUNTERS.reloads_ok, None),
            Err(Refused::Invalid(why)) => {
                (&crate::stats::COUNTERS.reloads_rejected, Some(why.clone()))
            }
            Err(Refused::NoRevision(n)) => (
                &crate::stats::COUNTERS.reloads_rejected,
                Some(format!("no revision {n}")),
            ),
        };
        crate::stats::bump(counter);
        self.revisions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last_reload = Some(crate::admin::revisions::LastReload {
            ok: result.is_ok(),
            at: std::time::SystemTime::now(),
            error,
        });
        result
    }

    /// Loads revision `n`'s files again, exactly as they ran, as a new revision.
    fn rollback(&mut self, n: u64) -> Result<u64, Refused> {
        let kept = {
            let r = self.revisions.lock().unwrap_or_else(|e| e.into_inner());
            r.get(n).map(|rev| {
                (
                    rev.kept.clone(),
                    rev.signed_by.clone(),
                    rev.signed_at.clone(),
                )
            })
        };
        let Some((kept, signed_by, signed_at)) = kept else {
            return Err(Refused::NoRevision(n));
        };
        let loaded = config::load_kept(&kept).map(|mut l| {
            // The restored files were verified when they were first loaded.
            l.signed_by = signed_by;
            l.signed_at = signed_at;
            l
        });
        self.apply(loaded, Origin::Rollback)
    }

    /// Applies a fleet revision with this instance's own `global` (its file, read
    /// again).
    fn fleet(&mut self, rev: &config::FleetRevision, rollback: bool) -> Result<u64, Refused> {
        let Some(file) = self.source.file.clone() else {
            return Err(Refused::Invalid("started without a config file".into()));
        };
        let running = self.running_signed_at();
        let key = self.source.verify_key.as_deref();
        // The head's `rollback` mark is Redis's word: it passes over signing times
        // only for a bundle this instance has run (a revision it keeps).
        let rollback = rollback && self.has_run(rev);
        let loaded = config::load_fleet(&file, rev, key, &running, rollback);
        self.apply(loaded, Origin::Fleet)
    }

    /// Whether a kept revision ran `rev`'s files.
    fn has_run(&self, rev: &config::FleetRevision) -> bool {
        let r = self.revisions.lock().unwrap_or_else(|e| e.into_inner());
        let ran = r
            .iter()
            .filter_map(|k| k.kept.fleet.as_ref())
            .any(|f| f.files == rev.files);
        ran
    }

    /// The fleet revision the running config was taken from, if any.
    fn running_fleet(&self) -> Option<config::FleetRevision> {
        let r = self.revisions.lock().unwrap_or_else(|e| e.into_inner());
        r.get(r.current()).and_then(|rev| rev.kept.fleet.clone())
    }

    /// When the running revision's files were signed.
    fn running_signed_at(&self) -> config::signed::SignedAt {
        let r = self.revisions.lock().unwrap_or_else(|e| e.into_inner());
        r.get(r.current())
            .map(|rev| rev.signed_at.clone())
            .unwrap_or_default()
    }

    /// Makes a loaded config the live generation, all or nothing.
    fn apply(
        &mut self,
        loaded: Result<config::Loaded, config::Report>,
        origin: Origin,
    ) -> Result<u64, Refused> {
        let keep = self.current();
        let loaded = match loaded {
            Ok(l) => l,
            Err(report) => {
                tracing::error!(
                    "sluice: {} rejected, still serving revision {keep}:\n{report}",
                    origin.as_str()
                );
                return Err(Refused::Invalid(report.to_string()));
            }
        };
        for w in loaded.warnings.warnings() {
            tracing::warn!("{}", w.render(&loaded.warnings.sources));
        }
        let (kept, signed_by, signed_at) = (loaded.kept, loaded.signed_by, loaded.signed_at);
        let config = loaded.config;
        if config.global.admin != self.admin_addr
            && config.global.admin.is_some()
            && self.admin_addr.is_some()
        {
            tracing::warn!("sluice: a new `admin` address takes effect at the next start");
        }
        // The API keeps the address it was bound to until the next start: a config
        // without a token cannot leave it open off loopback.
        if let Some(bound) = self.admin_addr {
            if !bound.ip().to_canonical().is_loopback() && config.global.admin_token.is_none() {
                let why = format!("the admin API stays on {bound} (off loopback) until the next start, and this config gives it no token; keep the token, or restart to move the API to loopback");
                tracing::error!(
                    "sluice: {} rejected, still serving revision {keep}: {why}",
                    origin.as_str()
                );
                return Err(Refused::Invalid(why));
            }
        }
        let bound = match bind_new(&wanted(&config), &self.listeners) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(
                    "sluice: {} rejected, still serving revision {keep}: {e}",
                    origin.as_str()
                );
                return Err(Refused::Invalid(e.to_string()));
            }
        };
        if let Err(e) = self.open_access_log(&config) {
            tracing::error!(
                "sluice: {} rejected, still serving revision {keep}: {e}",
                origin.as_str()
            );
            return Err(Refused::Invalid(e.to_string()));
        }
        crate::reply::set_server_tokens(config.global.server_tokens);
        self.admin_token
            .store(config.global.admin_token.clone().map(Arc::new));
        let next = Generation::compile(&config, Some(&self.live.load()));
        self.live.swap(next);
        self.close_unwanted(&config, origin);
        self.start(bound);
        self.grace = config.global.grace;
        self.follow_fleet(&config);
        self.config = Arc::new(config.clone());
        let fleet = kept.fleet.as_ref().map(|f| f.revision);
        let revision = self.record(origin, kept, signed_by, signed_at);
        let verb = match (origin, fleet) {
            (Origin::Rollback, _) => "rolled back".to_string(),
            (Origin::Fleet, Some(n)) => format!("applied fleet revision {n}"),
            _ => "reloaded".to_string(),
        };
        tracing::info!("sluice: {verb}: revision {revision}: {}", config.summary());
        Ok(revision)
    }

    /// Waits (up to 5 s) until every discovered pool had its first answer, and
    /// compiles with them: the first request finds the peers.
    async fn discovered(&mut self) {
        let end = tokio::time::Instant::now() + Duration::from_secs(5);
        let sources: Vec<_> = self
            .live
            .load()
            .pools()
            .filter_map(|p| p.discovery.clone())
            .collect();
        if sources.is_empty() {
            return;
        }
        let unanswered = |d: &Arc<crate::upstream::discover::Discovery>| {
            d.refreshes.load(std::sync::atomic::Ordering::Relaxed) == 0
        };
        while sources.iter().any(unanswered) && tokio::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The answers that woke `CHANGED` so far are all in this compile.
        let _ =
            futures_util::FutureExt::now_or_never(crate::upstream::discover::CHANGED.notified());
        self.rediscover();
    }

    /// A discovered pool's peers changed: the running config, compiled again with
    /// them (no new revision; listeners untouched).
    fn rediscover(&mut self) {
        let previous = self.live.load();
        let mut next = Generation::compile(&self.config, Some(&previous));
        // The certificates as served now: files replaced since the config was loaded
        // were picked up in place (`watch_certificates`), not from the config.
        next.tls = previous.tls.clone();
        self.live.swap(next);
    }

    /// A reload that adds, changes or removes `fleet`: the member follows the new
    /// settings from now on (a new one catches up with the head at once).
    fn follow_fleet(&mut self, config: &Config) {
        let running = self.config.global.fleet.as_ref();
        if config.global.fleet.as_ref() == running {
            return;
        }
        if let Some(t) = self.fleet_task.take() {
            t.abort();
        }
        self.revisions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .fleet = None;
        match &config.global.fleet {
            Some(f) => {
                tracing::info!(
                    "sluice: fleet: following {} (channel {}) as {}",
                    crate::net::redis::shown(&f.url),
                    f.channel,
                    f.name
                );
                let state = FleetState::default();
                let task = join_fleet(f.clone(), state, &self.commands, &self.revisions);
                self.fleet_task = Some(task);
            }
            None => tracing::info!("sluice: fleet: this instance left the fleet"),
        }
    }

    /// Numbers a revision that now runs; a fleet member's state follows it.
    fn record(
        &self,
        origin: Origin,
        kept: config::Kept,
        signed_by: Option<String>,
        signed_at: config::signed::SignedAt,
    ) -> u64 {
        let mut r = self.revisions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(state) = r.fleet.as_mut() {
            let fleet = kept.fleet.as_ref().map_or(0, |f| f.revision);
            match origin {
                Origin::Fleet => {
                    state.revision = fleet;
                    state.result = "ok".into();
                }
                // A local way back runs what it restores (0: the instance's own file).
                Origin::Rollback => state.revision = fleet,
                // A reload keeps the revision, and the word on the last one tried.
                Origin::Start | Origin::Reload => {}
            }
        }
        r.record(origin, kept, signed_by, signed_at)
    }

    /// Opens the access log `config` asks for, when it is not the one open now.
    fn open_access_log(&self, config: &Config) -> Result<(), StartError> {
        crate::admin::log::set_json(config.global.log_json);
        let current = self.access.load_full();
        self.access
            .store(connections_log(config, current).map_err(StartError::AccessLog)?);
        Ok(())
    }

    /// Closes the listeners `config` no longer has (their connections go on).
    fn close_unwanted(&mut self, config: &Config, origin: Origin) {
        let wanted: Vec<ListenKey> = wanted(config).iter().map(|(l, k)| key(l, *k)).collect();
        let mut closed = Vec::new();
        self.listeners.retain(|k, a| {
            let kept = wanted.contains(k);
            if !kept {
                tracing::info!(
                    "sluice: {}: no longer listening on {}",
                    origin.as_str(),
                    a.local
                );
                a.close.notify_one();
                closed.push(a.local.clone());
            }
            kept
        });
        self.revisions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .listeners
            .retain(|l| !closed.contains(l));
    }

    fn current(&self) -> u64 {
        self.revisions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .current()
    }

    /// Closes the listeners, then waits up to `grace` (or a second signal) for the
    /// requests in flight.
    async fn stop(mut self) {
        tell_systemd(&[sd_notify::NotifyState::Stopping]);
        // Stop accepting first: once the accept loops return, the listeners are closed.
        self.drain.start();
        for (_, a) in self.listeners {
            let _ = a.task.await;
        }
        let drain = &self.drain;
        tracing::info!(
            "sluice: stopping: listeners closed; {} requests in flight get up to {} to finish",
            drain.requests_in_flight(),
            format_duration(self.grace)
        );
        let started = tokio::time::Instant::now();
        let in_flight = drain.requests_in_flight();
        let deadline = started + self.grace;
        let why = loop {
            tokio::select! {
                r = tokio::time::timeout_at(deadline, drain.closed()) => match r {
                    Ok(()) => {
                        tracing::info!(
                            "sluice: drained: {in_flight} requests finished in {}, exiting",
                            format_duration(started.elapsed())
                        );
                        return;
                    }
                    Err(_) => break "after grace",
                },
                s = self.signals.next() => match s {
                    Signal::Stop => break "on a second signal",
                    // A reload or an upgrade asked for during the drain is moot.
                    Signal::Reload | Signal::Reopen | Signal::Upgrade => continue,
                },
            }
        };
        tracing::warn!(
            "sluice: shutdown: cut {} requests still in flight {why}",
            drain.requests_in_flight()
        );
    }
}

/// The log the connections begin each request's line on: the global `access_log`
/// (`current` when it is the same), or one that writes nothing when only sites have
/// their own (so their requests still get a line). The sites' files are checked to
/// open here, so a reload naming one that cannot be written is refused whole.
fn connections_log(
    config: &Config,
    current: Option<Arc<AccessLog>>,
) -> std::io::Result<Option<Arc<AccessLog>>> {
    let site_logs: Vec<&crate::config::AccessLogConfig> = config
        .sites
        .iter()
        .filter_map(|s| match &s.access_log {
            Some(crate::config::SiteLog::To(c)) => Some(c),
            _ => None,
        })
        .collect();
    for c in &site_logs {
        AccessLog::check(c)?;
    }
    match &config.global.access_log {
        Some(c) => match current {
            Some(l) if !l.discard && l.config == *c => Ok(Some(l)),
            _ => AccessLog::start(c.clone()).map(Some),
        },
        None if site_logs.is_empty() => Ok(None),
        None => match current {
            Some(l) if l.discard => Ok(Some(l)),
            _ => Ok(Some(AccessLog::discard())),
        },
    }
}

/// How often certificate files are looked at for changes.
const CERT_POLL: Duration = Duration::from_secs(2);

/// Reloads the live generation's certificates whose files changed (a stat of each file
/// per tick; the files are read only when one changed), and fetches the OCSP staples
/// that are due (`runtime::ocsp`).
async fn watch_certificates(live: Arc<Live>) {
    let mut tick = tokio::time::interval(CERT_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let gen = live.load();
        let Some(tls) = gen.tls.as_ref() else {
            continue;
        };
        let certs = tls.certs.clone();
        drop(gen);
        let files = certs.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for slot in &files.slots {
                slot.refresh();
            }
        })
        .await;
        // OCSP staples due (each fetch bounded), all at once.
        futures_util::future::join_all(certs.slots.iter().map(|s| s.staple())).await;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    /// SIGTERM or SIGINT.
    Stop,
    /// SIGHUP.
    Reload,
    /// SIGUSR1: reopen the access log file.
    Reopen,
    /// SIGUSR2: start the binary again and hand it the listeners.
    Upgrade,
}

/// SIGTERM, SIGINT (Ctrl-C), SIGHUP, SIGUSR1 and SIGUSR2.
struct Signals {
    unix: Option<[tokio::signal::unix::Signal; 5]>,
}

impl Signals {
    fn new() -> Signals {
        use tokio::signal::unix::{signal, SignalKind};
        let unix = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::hangup()),
            signal(SignalKind::user_defined1()),
            signal(SignalKind::user_defined2()),
        ) {
            (Ok(t), Ok(i), Ok(h), Ok(u), Ok(u2)) => Some([t, i, h, u, u2]),
            _ => None,
        };
        Signals { unix }
    }

    async fn next(&mut self) -> Signal {
        match &mut self.unix {
            Some([term, int, hup, usr1, usr2]) => {
                tokio::select! {
                    _ = term.recv() => Signal::Stop,
                    _ = int.recv() => Signal::Stop,
                    _ = hup.recv() => Signal::Reload,
                    _ = usr1.recv() => Signal::Reopen,
                    _ = usr2.recv() => Signal::Upgrade,
                }
            }
            None => {
                let _ = tokio::signal::ctrl_c().await;
                Signal::Stop
            }
        }
    }
}
