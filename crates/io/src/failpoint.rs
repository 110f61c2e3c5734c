//! Named failpoints at every step of the commit protocol: a test hook for crash and fault-injection tests.
//!
//! Every step of [`FileCommit`](crate::FileCommit), [`DirCommit`](crate::DirCommit) and
//! [`DurableWriter`](crate::DurableWriter) calls [`hit`] with its name (the list is [`POINTS`]). Unused,
//! a hit costs one relaxed atomic load. The hook is driven by environment variables, read once per process:
//!
//! - `CKPT_FAILPOINT=<spec>` arms it. `<spec>` is `N` (the N-th hit of any point, counting from 1),
//!   `NAME` (the first hit of that point) or `NAME:N` (its N-th hit).
//! - `CKPT_FAILPOINT_ACTION=kill` (default) sends `SIGKILL` to the process itself at the armed hit: the
//!   crash a power loss or an OOM kill produces, without unwinding. `error` makes that step fail with an
//!   injected `io::Error` instead (the error path, in process). `stop` sends `SIGSTOP` (the process
//!   pauses there until a `SIGCONT`: how a test holds a save half-way, e.g. to try a second writer).
//! - `CKPT_FAILPOINT_LOG=<file>` appends the name of every hit to `<file>`, one per line, so a test
//!   harness can count the points a save passes and then kill it at each of them.
//!
//! Tests in one process arm it with [`configure`] instead: that configuration applies to the calling
//! thread only (other tests running in parallel are not affected), and wins over the environment there.

use std::cell::{Cell, RefCell};
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// Every failpoint name, in protocol order (the `N` of a chunk write or a file in a directory repeats).
pub const POINTS: &[&str] = &[
    "lock.acquired",
    "file.create",
    "file.created",
    "file.write",
    "file.sync",
    "file.synced",
    "file.rename",
    "file.renamed",
    "file.parent_sync",
    "file.done",
    "dir.staging",
    "dir.staged",
    "dir.manifest",
    "dir.sync",
    "dir.exchange",
    "dir.half_swapped",
    "dir.exchanged",
    "dir.parent_sync",
    "dir.remove_old",
    "dir.done",
];

const UNINIT: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
static HITS: AtomicU64 = AtomicU64::new(0);
static CONFIG: Mutex<Option<Config>> = Mutex::new(None);

thread_local! {
    static LOCAL_ON: Cell<bool> = const { Cell::new(false) };
    static LOCAL: RefCell<Option<Config>> = const { RefCell::new(None) };
}

/// What to do at the armed hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `SIGKILL` the process.
    Kill,
    /// Fail the step with an injected error.
    Error,
    /// `SIGSTOP` the process (it goes on after `SIGCONT`).
    Stop,
}

/// Which hit is armed, and what happens there.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Config {
    /// The armed point: `(None, n)` the n-th hit of any point, `(Some(name), n)` the n-th hit of `name`.
    pub target: Option<(Option<String>, u64)>,
    /// What the armed hit does.
    pub action: Option<Action>,
    /// A file to which every hit's name is appended.
    pub log: Option<String>,
    /// Hits of each point so far, by name (for `NAME:N`).
    counts: Vec<(&'static str, u64)>,
    /// Hits of any point so far.
    total: u64,
}

impl Config {
    /// A configuration arming `spec` (see [`Config::parse_spec`]) with `action`.
    pub fn armed(spec: &str, action: Action) -> Config {
        Config { target: Config::parse_spec(spec), action: Some(action), ..Config::default() }
    }

    /// Parses a `CKPT_FAILPOINT` spec (`N`, `NAME`, `NAME:N`).
    pub fn parse_spec(spec: &str) -> Option<(Option<String>, u64)> {
        let spec = spec.trim();
        if spec.is_empty() {
            return None;
        }
        if let Ok(n) = spec.parse::<u64>() {
            return Some((None, n));
        }
        match spec.rsplit_once(':') {
            Some((name, n)) => Some((Some(name.to_owned()), n.parse().ok()?)),
            None => Some((Some(spec.to_owned()), 1)),
        }
    }

    fn from_env() -> Option<Config> {
        let target = std::env::var("CKPT_FAILPOINT").ok().and_then(|s| Config::parse_spec(&s));
        let log = std::env::var("CKPT_FAILPOINT_LOG").ok().filter(|s| !s.is_empty());
        let action = match std::env::var("CKPT_FAILPOINT_ACTION").ok().as_deref() {
            Some("error") => Action::Error,
            Some("stop") => Action::Stop,
            _ => Action::Kill,
        };
        (target.is_some() || log.is_some()).then_some(Config { target, action: Some(action), log, ..Config::default() })
    }
}

/// Sets the calling thread's failpoint configuration (`None`: back to the environment's). For tests.
pub fn configure(config: Option<Config>) {
    LOCAL_ON.with(|on| on.set(config.is_some()));
    LOCAL.with(|c| *c.borrow_mut() = config);
}

/// Passes the failpoint `name`. Returns an injected error when this hit is armed with
/// [`Action::Error`]; kills the process when armed with [`Action::Kill`].
///
/// # Errors
/// The injected error (kind `Other`, message `injected failure at <name>`).
#[inline]
pub fn hit(name: &'static str) -> io::Result<()> {
    if LOCAL_ON.with(Cell::get) {
        return LOCAL.with(|c| c.borrow_mut().as_mut().map_or(Ok(()), |c| c.pass(name)));
    }
    match STATE.load(Ordering::Relaxed) {
        OFF => Ok(()),
        _ => process_hit(name),
    }
}

#[cold]
fn process_hit(name: &'static str) -> io::Result<()> {
    if STATE.load(Ordering::Acquire) == UNINIT {
        if let Ok(mut c) = CONFIG.lock() {
            if STATE.load(Ordering::Acquire) == UNINIT {
                let from_env = Config::from_env();
                let on = from_env.is_some();
                *c = from_env;
                STATE.store(if on { ON } else { OFF }, Ordering::Release);
            }
        }
        if STATE.load(Ordering::Acquire) == OFF {
            return Ok(());
        }
    }
    HITS.fetch_add(1, Ordering::Relaxed);
    let Ok(mut guard) = CONFIG.lock() else { return Ok(()) };
    guard.as_mut().map_or(Ok(()), |c| c.pass(name))
}

/// Stops the whole process (`SIGSTOP`) before the calling thread runs another instruction.
///
/// `kill(getpid(), SIGSTOP)` is not enough from a thread other than the main one: the kernel hands a
/// process-directed signal to the main thread, and the caller runs on until the group stop reaches it — a
/// rank thread of a multi-rank save paused "at" `dir.staged` was seen committing before it stopped. A signal
/// sent to the calling thread itself (`tgkill`) is taken by that thread on its way back from the system
/// call, and stops the whole group from there.
fn stop_here() {
    #[cfg(target_os = "linux")]
    // SAFETY: tgkill(2) on our own process and thread ids; the process resumes here on SIGCONT.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid);
        libc::syscall(libc::SYS_tgkill, libc::getpid() as libc::c_long, tid, libc::SIGSTOP as libc::c_long);
    }
    #[cfg(not(target_os = "linux"))]
    // SAFETY: kill(2) on our own pid; the process resumes here on SIGCONT.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGSTOP);
    }
}

/// Hits of any failpoint in this process under the environment's configuration so far.
pub fn process_hits() -> u64 {
    HITS.load(Ordering::Relaxed)
}

impl Config {
    #[cold]
    fn pass(&mut self, name: &'static str) -> io::Result<()> {
        self.total += 1;
        let per_name = match self.counts.iter_mut().find(|(p, _)| *p == name) {
            Some((_, c)) => {
                *c += 1;
                *c
            }
            None => {
                self.counts.push((name, 1));
                1
            }
        };
        if let Some(log) = &self.log {
            if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(log) {
                let _ = writeln!(f, "{name}");
                // The log must be on disk before a kill at this very hit.
                let _ = f.sync_data();
            }
        }
        let armed = match &self.target {
            Some((None, k)) => *k == self.total,
            Some((Some(p), k)) => p == name && *k == per_name,
            None => false,
        };
        if !armed {
            return Ok(());
        }
        match self.action {
            Some(Action::Error) => Err(io::Error::other(format!("injected failure at {name}"))),
            Some(Action::Stop) => {
                stop_here();
                Ok(())
            }
            _ => {
                // SAFETY: kill(2) on our own pid; SIGKILL cannot be caught, so this never returns.
                unsafe {
                    libc::kill(libc::getpid(), libc::SIGKILL);
                }
                Err(io::Error::other(format!("killed at {name}")))
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Serializes the tests that also flip process-wide settings (environment variables).
    pub(crate) static ARMED: Mutex<()> = Mutex::new(());

    #[test]
    fn specs() {
        assert_eq!(Config::parse_spec("7"), Some((None, 7)));
        assert_eq!(Config::parse_spec("file.sync"), Some((Some("file.sync".into()), 1)));
        assert_eq!(Config::parse_spec("file.write:3"), Some((Some("file.write".into()), 3)));
        assert_eq!(Config::parse_spec(""), None);
        assert_eq!(Config::parse_spec("x:y"), None);
    }

    #[test]
    fn error_action_counts_by_name() {
        configure(Some(Config::armed("file.write:2", Action::Error)));
        assert!(hit("file.create").is_ok());
        assert!(hit("file.write").is_ok());
        let e = hit("file.write").unwrap_err();
        assert_eq!(e.to_string(), "injected failure at file.write");
        assert!(hit("file.write").is_ok());
        configure(None);
        assert!(hit("file.write").is_ok());
    }
}
