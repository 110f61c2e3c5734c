//! Releasing replaced files off the critical path.
//!
//! When a commit replaces a file, the old inode's blocks and page cache are freed when its last reference
//! goes: inline in `rename(2)` (or `unlink`, or `O_TRUNC`) if nothing else holds it. Measured on the
//! development VM, that took 0.37 to 0.77 s for a 1 GiB file (see `benches/README.md`). The commit
//! therefore keeps an `O_PATH` descriptor of the old file across the rename (or unlink) and hands it to
//! this module's background thread, which closes it. At process exit the kernel closes what is left.

use std::fs::File;
use std::sync::mpsc::{Sender, channel};
use std::sync::{Condvar, Mutex, OnceLock};

struct Releaser {
    tx: Mutex<Sender<Vec<File>>>,
}

static RELEASER: OnceLock<Option<Releaser>> = OnceLock::new();
static PENDING: Mutex<usize> = Mutex::new(0);
static IDLE: Condvar = Condvar::new();

fn releaser() -> Option<&'static Releaser> {
    RELEASER
        .get_or_init(|| {
            let (tx, rx) = channel::<Vec<File>>();
            let spawned = std::thread::Builder::new().name("ckpt-release".into()).spawn(move || {
                for files in rx {
                    drop(files);
                    if let Ok(mut n) = PENDING.lock() {
                        *n = n.saturating_sub(1);
                        IDLE.notify_all();
                    }
                }
            });
            spawned.ok().map(|_| Releaser { tx: Mutex::new(tx) })
        })
        .as_ref()
}

/// Closes `files` on the background thread (inline if it cannot be started).
pub(crate) fn later(files: Vec<File>) {
    if files.is_empty() {
        return;
    }
    let Some(r) = releaser() else { return drop(files) };
    if let Ok(mut n) = PENDING.lock() {
        *n += 1;
    }
    let sent = r.tx.lock().ok().map(|tx| tx.send(files));
    match sent {
        Some(Ok(())) => {}
        Some(Err(e)) => {
            drop(e.0);
            done_one();
        }
        None => done_one(),
    }
}

fn done_one() {
    if let Ok(mut n) = PENDING.lock() {
        *n = n.saturating_sub(1);
        IDLE.notify_all();
    }
}

/// Blocks until every replaced file handed to the background thread has been released. Benchmarks call it
/// to keep one save's cleanup out of the next measurement; programs never need to.
pub fn wait_for_releases() {
    let Ok(mut n) = PENDING.lock() else { return };
    while *n > 0 {
        match IDLE.wait(n) {
            Ok(g) => n = g,
            Err(_) => return,
        }
    }
}
