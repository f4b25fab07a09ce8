//! The `sluice` command: run, check, demo, proxy, reload, upgrade, completions, man,
//! version.
//! The command line only: the server's life is `sluice::lifecycle`.

// `unsafe` only in `allocator` (why: its doc comment).
#![deny(unsafe_code)]

mod allocator;

use std::path::Path;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use sluice::config::{self, Config};
use sluice::lifecycle;

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "A reverse proxy and application gateway: one binary, one config file."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The shells `sluice completions` writes for.
#[derive(Clone, Copy, ValueEnum)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Subcommand)]
enum Command {
    /// Run with a config file (logs go to stderr).
    Run {
        /// The config file.
        #[arg(short, long, default_value = "sluice.conf")]
        config: String,
        /// A minisign public key: every config file read (at start, reload and
        /// rollback) needs a valid FILE.minisig by it.
        #[arg(long)]
        verify_key: Option<String>,
    },
    /// Check a config file: print errors and warnings, and a summary when it loads.
    Check {
        /// The config file.
        #[arg(short, long, default_value = "sluice.conf")]
        config: String,
        /// Treat warnings as errors.
        #[arg(long)]
        strict: bool,
        /// A minisign public key: every config file needs a valid FILE.minisig by it.
        #[arg(long)]
        verify_key: Option<String>,
    },
    /// Run the embedded demo: two built-in backends behind one pool, and the dashboard.
    ///
    /// Needs no file. The demo answers on --listen; the dashboard and admin API are on
    /// --admin (http://127.0.0.1:2019/ by default).
    Demo {
        /// Where the demo listens.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: String,
        /// Where the admin API and dashboard listen.
        #[arg(long, default_value = "127.0.0.1:2019")]
        admin: String,
    },
    /// Print a shell completion script: `sluice completions bash > /etc/bash_completion.d/sluice`.
    Completions {
        /// The shell.
        shell: Shell,
    },
    /// Print the manual page (roff): `sluice man > /usr/local/share/man/man1/sluice.1`.
    Man,
    /// Ask a running sluice to reload its config file (POST /reload on its admin API).
    Reload {
        /// The admin API's address (default: the `admin` of --config, else
        /// 127.0.0.1:2019).
        #[arg(long)]
        admin: Option<String>,
        /// A file holding the admin API's token (else $SLUICE_ADMIN_TOKEN, else the
        /// token of --config's admin block).
        #[arg(long)]
        token_file: Option<String>,
        /// The running config file, for its admin address and token.
        #[arg(short, long)]
        config: Option<String>,
        /// Check --config's signatures with this minisign public key before asking
        /// (the server checks with its own key regardless).
        #[arg(long)]
        verify_key: Option<String>,
    },
    /// Replace the running sluice with the binary at its path (POST /upgrade on its
    /// admin API): the new process takes over the listening sockets, the old one
    /// drains and exits. Exits 0 once the new process serves, 1 (with why) when it did
    /// not start; the old one then serves on.
    Upgrade {
        /// The admin API's address (default: the `admin` of --config, else
        /// 127.0.0.1:2019).
        #[arg(long)]
        admin: Option<String>,
        /// A file holding the admin API's token (else $SLUICE_ADMIN_TOKEN, else the
        /// token of --config's admin block).
        #[arg(long)]
        token_file: Option<String>,
        /// The running config file, for its admin address and token.
        #[arg(short, long)]
        config: Option<String>,
    },
    /// A one-line reverse proxy with no config file.
    Proxy {
        /// Where to listen: a port (8080 or :8080, every interface) or IP:PORT.
        #[arg(long)]
        from: String,
        /// Backends: HOST:PORT, a port or :PORT (this machine), http://, https://,
        /// h2c:// or unix: addresses; several after one --to, or --to repeated.
        #[arg(long, num_args = 1.., required = true)]
        to: Vec<String>,
    },
    /// Publish a config to a fleet (every instance with `fleet` applies it), or
    /// announce an earlier revision again (--rollback N). The config is checked first:
    /// one that does not load never reaches Redis.
    Publish {
        /// The config file (with its imports and, when signed, their .minisig files).
        #[arg(short, long, required_unless_present = "rollback")]
        config: Option<String>,
        /// Announce revision N again instead of publishing.
        #[arg(long, value_name = "N", conflicts_with = "config")]
        rollback: Option<u64>,
        #[command(flatten)]
        to: FleetTarget,
        /// Check every file's signature with this minisign public key first.
        #[arg(long)]
        verify_key: Option<String>,
    },
    /// Look at a fleet.
    Fleet {
        #[command(subcommand)]
        command: FleetCommand,
    },
    /// Print the version.
    Version,
}

#[derive(Subcommand)]
enum FleetCommand {
    /// One line per member: name, revision, last result, version, uptime, last seen.
    Status {
        #[command(flatten)]
        to: FleetTarget,
    },
}

/// Where a fleet lives.
#[derive(clap::Args)]
struct FleetTarget {
    /// The fleet's Redis: redis://[:PASSWORD@]HOST:PORT[/DB] or rediss://…
    #[arg(long)]
    to: String,
    /// The fleet's channel (and key prefix).
    #[arg(long, default_value = "sluice")]
    channel: String,
    /// PEM roots a rediss:// server is verified against (else the system's).
    #[arg(long)]
    redis_ca: Option<String>,
}

impl FleetTarget {
    fn target(self) -> sluice::fleet::Target {
        sluice::fleet::Target {
            url: self.to,
            channel: self.channel,
            redis_ca: self.redis_ca,
        }
    }
}

fn main() -> ExitCode {
    // Before anything else (and any thread): what an upgrade handed this process.
    sluice::handover::capture();
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("sluice {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Check {
            config,
            strict,
            verify_key,
        } => match key(verify_key.as_deref(), "check") {
            Ok(k) => check(&config, strict, k.as_deref()),
            Err(code) => code,
        },
        Command::Run { config, verify_key } => run(config, verify_key),
        Command::Proxy { from, to } => {
            if !init_logging() {
                return ExitCode::from(1);
            }
            proxy(&from, &to)
        }
        Command::Demo { listen, admin } => {
            if !init_logging() {
                return ExitCode::from(1);
            }
            demo(&listen, &admin)
        }
        Command::Publish {
            config,
            rollback,
            to,
            verify_key,
        } => publish(config, rollback, to, verify_key),
        Command::Fleet {
            command: FleetCommand::Status { to },
        } => sluice::fleet::cli_status(&to.target()),
        Command::Completions { shell } => completions(shell),
        Command::Man => man(),
        Command::Reload {
            admin,
            token_file,
            config,
            verify_key,
        } => match reload_target("reload", admin, token_file, config, verify_key) {
            Ok((admin, token)) => reload(&admin, token.as_deref()),
            Err(why) => {
                eprintln!("sluice reload: {why}");
                ExitCode::from(1)
            }
        },
        Command::Upgrade {
            admin,
            token_file,
            config,
        } => match reload_target("upgrade", admin, token_file, config, None) {
            Ok((admin, token)) => upgrade(&admin, token.as_deref()),
            Err(why) => {
                eprintln!("sluice upgrade: {why}");
                ExitCode::from(1)
            }
        },
    }
}

/// `sluice completions SHELL`: the script, on stdout.
fn completions(shell: Shell) -> ExitCode {
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(shell, &mut Cli::command(), "sluice", &mut std::io::stdout());
    ExitCode::SUCCESS
}

/// `sluice man`: the manual page (roff), on stdout.
fn man() -> ExitCode {
    match clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice man: {e}");
            ExitCode::from(1)
        }
    }
}

/// `sluice proxy`: `--from PORT` is `:PORT` (every interface), `--to PORT` and
/// `--to :PORT` are that port on loopback. Its errors speak of its flags, never of the
/// config it writes for itself.
fn proxy(from: &str, to: &[String]) -> ExitCode {
    let plain = |v: &str| {
        !v.is_empty()
            && !v
                .chars()
                .any(|c| c.is_whitespace() || "{};\"'#".contains(c))
    };
    let port = |v: &str| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit());
    if !plain(from) {
        eprintln!("sluice proxy: --from `{from}`: not an address; write a port (8080), :8080 or 127.0.0.1:8080");
        return ExitCode::from(2);
    }
    let listen = if port(from) {
        format!(":{from}")
    } else {
        from.to_string()
    };
    let mut backends = Vec::new();
    for t in to {
        if !plain(t) {
            eprintln!("sluice proxy: --to `{t}`: not an address; write HOST:PORT, :PORT (this machine) or http://HOST:PORT");
            return ExitCode::from(2);
        }
        backends.push(match t.strip_prefix(':') {
            Some(p) if port(p) => format!("127.0.0.1:{p}"),
            _ if port(t) => format!("127.0.0.1:{t}"),
            _ => t.clone(),
        });
    }
    // Line 2 holds --from, line 4 the backends, one word each after `proxy`.
    let text = format!(
        "global {{ admin off }}\nlisten {listen}\nsite * {{\nproxy {}\n}}\n",
        backends.join(" ")
    );
    match config::load_text("sluice proxy", &text) {
        Ok(l) => lifecycle::serve(
            l.config,
            lifecycle::Source {
                kept: l.kept,
                ..Default::default()
            },
        ),
        Err(r) => {
            for d in r.errors() {
                let flag = if d.span.line == 2 { "--from" } else { "--to" };
                let value = if d.span.line == 2 {
                    from.to_string()
                } else {
                    // Which backend: the words on its line before the error's column,
                    // less `proxy`.
                    let line = text.lines().nth(3).unwrap_or("");
                    // Columns count characters, not bytes.
                    let col = (d.span.col as usize).saturating_sub(1);
                    let before: String = line.chars().take(col).collect();
                    let k = before.split_whitespace().count().saturating_sub(1);
                    to.get(k).cloned().unwrap_or_else(|| to.join(" "))
                };
                eprintln!("sluice proxy: {flag} {value}: {}", d.message);
            }
            ExitCode::from(2)
        }
    }
}

fn init_logging() -> bool {
    match sluice::init_logging() {
        Ok(()) => true,
        Err(e) => {
            eprintln!("sluice: {e}");
            false
        }
    }
}

/// Loads a config file for `run`, printing what went wrong if it cannot; returns it
/// with the file's text (revision 1's).
/// `--verify-key FILE`, read; `Err`: the exit after saying why it cannot be.
type Key = Option<std::sync::Arc<config::signed::VerifyKey>>;

/// `sluice run`: loads the file and serves it.
fn run(config: String, verify_key: Option<String>) -> ExitCode {
    if !init_logging() {
        return ExitCode::from(1);
    }
    let key = match key(verify_key.as_deref(), "run") {
        Ok(k) => k,
        Err(code) => return code,
    };
    match load(&config, key.as_deref()) {
        Some(l) => lifecycle::serve(
            l.config,
            lifecycle::Source {
                file: Some(config),
                kept: l.kept,
                banner: None,
                verify_key: key,
                signed_by: l.signed_by,
                signed_at: l.signed_at,
            },
        ),
        None => ExitCode::from(1),
    }
}

/// `sluice publish`: a config, or `--rollback N`.
fn publish(
    config: Option<String>,
    rollback: Option<u64>,
    to: FleetTarget,
    verify_key: Option<String>,
) -> ExitCode {
    match (rollback, config) {
        (Some(n), _) => sluice::fleet::cli_rollback(n, &to.target()),
        (None, Some(file)) => match key(verify_key.as_deref(), "publish") {
            Ok(k) => sluice::fleet::cli_publish(&file, k.as_deref(), &to.target()),
            Err(code) => code,
        },
        // clap requires one of them.
        (None, None) => ExitCode::from(2),
    }
}

fn key(path: Option<&str>, command: &str) -> Result<Key, ExitCode> {
    match path.map(config::signed::VerifyKey::from_file).transpose() {
        Ok(k) => Ok(k),
        Err(why) => {
            eprintln!("sluice {command}: --verify-key {why}");
            Err(ExitCode::from(1))
        }
    }
}

fn load(path: &str, key: Option<&config::signed::VerifyKey>) -> Option<config::Loaded> {
    if !Path::new(path).is_file() {
        eprintln!("sluice: cannot read config file {path}: no such file");
        sluice::handover::tell_parent(&format!(
            "ERROR=cannot read config file {path}: no such file"
        ));
        return None;
    }
    // A start has no running revision: nothing to compare signing times with.
    match config::load_file_verified(path, key, &Default::default()) {
        Ok(l) => {
            for w in l.warnings.warnings() {
                eprintln!("{}", w.render(&l.warnings.sources));
            }
            Some(l)
        }
        Err(r) => {
            eprintln!("{r}");
            eprintln!(
                "sluice: {path}: config rejected ({}); nothing was started",
                count(r.errors().count(), "error")
            );
            sluice::handover::tell_parent(&format!(
                "ERROR={path}: config rejected ({}):\n{r}",
                count(r.errors().count(), "error")
            ));
            None
        }
    }
}

fn check(path: &str, strict: bool, key: Option<&config::signed::VerifyKey>) -> ExitCode {
    if !Path::new(path).is_file() {
        eprintln!("sluice check: cannot read config file {path}: no such file");
        return ExitCode::from(1);
    }
    match config::load_file_verified(path, key, &Default::default()) {
        Ok(l) => {
            let mut warnings: Vec<_> = l.warnings.warnings().cloned().collect();
            if strict {
                warnings.extend(unresolved_names(&l.config));
            }
            for w in &warnings {
                eprintln!("{}", w.render(&l.warnings.sources));
            }
            if strict && !warnings.is_empty() {
                eprintln!(
                    "sluice check: {path}: {}, refused under --strict",
                    count(warnings.len(), "warning")
                );
                return ExitCode::from(1);
            }
            println!("sluice check: {path}: ok: {}", l.config.summary());
            ExitCode::SUCCESS
        }
        Err(r) => {
            eprintln!("{r}");
            eprintln!(
                "sluice check: {path}: {}",
                count(r.errors().count(), "error")
            );
            ExitCode::from(1)
        }
    }
}

/// `1 error`, `2 errors`.
fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// Backend names that resolve to nothing now, as warnings (`check --strict`). The
/// command asks the resolver, not `config`: loading a config never touches the
/// network.
fn unresolved_names(config: &Config) -> Vec<config::diag::Diagnostic> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(lookup_names(config)),
        Err(e) => {
            eprintln!("sluice check: cannot start the resolver: {e}");
            Vec::new()
        }
    }
}

/// Asks the config's resolver for every backend name at once, each within the DNS
/// budget; a warning for each that gives no address. A name may be meant to appear
/// later, so it is never an error.
async fn lookup_names(config: &Config) -> Vec<config::diag::Diagnostic> {
    use sluice::{parse_ip, Dns, DNS_BUDGET as BUDGET};
    let dns = std::sync::Arc::new(Dns::new(&config.global.resolver));
    let mut seen = std::collections::HashSet::new();
    // A `srv:` pool's name is asked for its SRV records, every other name for
    // addresses.
    let srv = |p: &config::ProxyConfig| matches!(&p.discover, Some(d) if matches!(d.kind, config::DiscoverKind::Srv { .. }));
    let names: Vec<(&config::BackendAddr, &str, bool)> = config
        .pools()
        .map(|(_, p)| p)
        .chain(config.tcp.iter().flat_map(|t| t.proxies()))
        .flat_map(|p| {
            p.backends
                .iter()
                .chain(&p.backups)
                .map(move |b| (b, srv(p)))
        })
        .filter_map(|(b, srv)| match &b.target {
            config::Target::Tcp { host, .. } if parse_ip(host).is_none() => seen
                .insert(host.as_str())
                .then_some((b, host.as_str(), srv)),
            _ => None,
        })
        .collect();
    // All at once: the wait is the slowest lookup's, not their sum.
    let mut lookups = tokio::task::JoinSet::new();
    for (i, &(_, host, srv)) in names.iter().enumerate() {
        let (dns, host) = (dns.clone(), host.to_string());
        lookups.spawn(async move {
            let answer = match srv {
                true => dns.srv(&host, BUDGET).await.map(|_| ()),
                false => dns.lookup(&host, BUDGET).await.map(|_| ()),
            };
            (i, answer)
        });
    }
    let mut failed = Vec::new();
    while let Some(Ok((i, answer))) = lookups.join_next().await {
        if let Err(e) = answer {
            failed.push((i, e));
        }
    }
    failed.sort_by_key(|(i, _)| *i);
    failed
        .into_iter()
        .map(|(i, e)| {
            let b = names[i].0;
            config::diag::Diagnostic::warning(b.span, format!("`{}`: {e}", b.text))
                .with_hint("requests to it fail with 502 until the name resolves")
        })
        .collect()
}

/// `sluice reload`: POST /reload to the admin API; prints the new revision or the
/// errors; exit 1 when the config is rejected or sluice cannot be reached.
/// Where `sluice reload` sends its request, and the token it sends: `--admin` and
/// `--token-file` first, then `$SLUICE_ADMIN_TOKEN`, then `--config`'s admin block.
fn reload_target(
    verb: &str,
    admin: Option<String>,
    token_file: Option<String>,
    config: Option<String>,
    verify_key: Option<String>,
) -> Result<(String, Option<String>), String> {
    let key = verify_key
        .map(|k| config::signed::VerifyKey::from_file(&k).map_err(|e| format!("--verify-key {e}")))
        .transpose()?;
    if key.is_some() && config.is_none() {
        return Err("--verify-key checks the file -c names: give -c FILE too".into());
    }
    let loaded = match &config {
        Some(path) => Some(
            config::load_file_verified(path, key.as_deref(), &Default::default())
                .map_err(|r| format!("{r}\nsluice {verb}: {path} is refused here; nothing was asked of the server"))?
                .config,
        ),
        None => None,
    };
    let admin = match (admin, &loaded, &config) {
        (Some(a), _, _) => a,
        (None, Some(c), Some(path)) => match c.global.admin {
            Some(a) => a.to_string(),
            None => {
                return Err(format!(
                    "{path} turns the admin API off (`admin off`), so a running sluice cannot be asked to {verb}; send it {} instead",
                    if verb == "upgrade" { "SIGUSR2" } else { "SIGHUP" }
                ))
            }
        },
        _ => "127.0.0.1:2019".to_string(),
    };
    let token = match token_file {
        Some(f) => Some(
            std::fs::read_to_string(&f)
                .map_err(|e| format!("--token-file {f}: {e}"))?
                .trim_end_matches(['\n', '\r'])
                .to_string(),
        ),
        None => std::env::var("SLUICE_ADMIN_TOKEN").ok().or_else(|| {
            let c = loaded.as_ref()?;
            c.global.admin_token.as_ref().map(|t| t.0.clone())
        }),
    };
    Ok((admin, token))
}

fn reload(admin: &str, token: Option<&str>) -> ExitCode {
    let (ok, value, body) = match admin_post("reload", admin, token) {
        Ok(r) => r,
        Err(code) => return code,
    };
    if ok {
        println!("sluice reload: revision {}", value["revision"]);
        ExitCode::SUCCESS
    } else {
        let error = value["error"].as_str().unwrap_or(&body);
        eprintln!("{}", error.trim_end());
        eprintln!("sluice reload: rejected; the running config keeps serving");
        ExitCode::from(1)
    }
}

/// `sluice upgrade`: POST /upgrade to the admin API, which answers once the new
/// process serves (its PID) or failed to (why; the old one serves on).
fn upgrade(admin: &str, token: Option<&str>) -> ExitCode {
    let (ok, value, body) = match admin_post("upgrade", admin, token) {
        Ok(r) => r,
        Err(code) => return code,
    };
    if ok {
        println!("sluice upgrade: PID {} serves now", value["pid"]);
        ExitCode::SUCCESS
    } else {
        let error = value["error"].as_str().unwrap_or(&body);
        eprintln!("sluice upgrade: {}", error.trim_end());
        eprintln!("sluice upgrade: failed; the running process keeps serving");
        ExitCode::from(1)
    }
}

/// `POST /VERB` to the admin API: whether it answered 200, its JSON and its body.
/// `Err` (after saying why): it could not be reached or refused the token.
fn admin_post(
    verb: &str,
    admin: &str,
    token: Option<&str>,
) -> Result<(bool, serde_json::Value, String), ExitCode> {
    use std::io::{Read, Write};
    let addr = if admin.starts_with(':') {
        format!("127.0.0.1{admin}")
    } else {
        admin.to_string()
    };
    let mut stream = match std::net::TcpStream::connect(&addr) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sluice {verb}: cannot reach the admin API at {addr}: {e}");
            return Err(ExitCode::from(1));
        }
    };
    // An upgrade waits up to 30 s for the new process.
    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(60)));
    // The admin API answers only a Host that is its own address.
    let host = stream
        .peer_addr()
        .map_or_else(|_| addr.clone(), |a| a.to_string());
    let auth = token.map_or_else(String::new, |t| format!("Authorization: Bearer {t}\r\n"));
    let req = format!(
        "POST /{verb} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    let mut out = Vec::new();
    if let Err(e) = stream
        .write_all(req.as_bytes())
        .and_then(|()| stream.read_to_end(&mut out))
    {
        eprintln!("sluice {verb}: {addr}: {e}");
        return Err(ExitCode::from(1));
    }
    let text = String::from_utf8_lossy(&out);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    if head.starts_with("HTTP/1.1 401") {
        let why = if token.is_some() {
            "refused the token given"
        } else {
            "needs a token"
        };
        eprintln!("sluice {verb}: the admin API at {addr} {why}: pass --token-file FILE, set SLUICE_ADMIN_TOKEN, or -c the running config file");
        return Err(ExitCode::from(1));
    }
    let value: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    Ok((head.starts_with("HTTP/1.1 200"), value, body.to_string()))
}

fn demo(listen: &str, admin: &str) -> ExitCode {
    let rt = match lifecycle::runtime(None) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice demo: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let backends = match rt.block_on(sluice::demo::start_backends()) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("sluice demo: cannot start the demo backends: {e}");
            return ExitCode::from(1);
        }
    };
    let text = sluice::demo::config_text(listen, admin, &backends);
    match config::load_text("sluice demo", &text) {
        Ok(l) => lifecycle::serve_on(
            rt,
            l.config,
            lifecycle::Source {
                file: None,
                kept: l.kept,
                banner: Some("sluice demo".into()),
                verify_key: None,
                signed_by: None,
                signed_at: Default::default(),
            },
        ),
        Err(r) => {
            eprintln!("{r}");
            ExitCode::from(2)
        }
    }
}

#[global_allocator]
static GLOBAL: allocator::Mimalloc = allocator::Mimalloc;
