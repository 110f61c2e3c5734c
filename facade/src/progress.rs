//! Progress on stderr for long operations (feature `cli`): the bar the `ckpt` command and the Python package
//! show while a conversion, save or reshard writes, measured by the bytes this process's durable writers
//! accept ([`ckpt_io::bytes_written`]) against an estimate ([`crate::output_estimate`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often the bar samples the meter.
const TICK: Duration = Duration::from_millis(100);

/// Runs `f` while a bar on stderr (`show`; nothing is drawn otherwise) fills with the bytes this process's
/// durable writers accept, out of `total`, labelled `what`; cleared when `f` returns. The count is capped
/// at `total` (an estimate: headers and metadata come on top).
///
/// ```
/// let n = ckpt::progress::with_write_meter(false, 1 << 20, "nothing", || 7);
/// assert_eq!(n, 7);
/// ```
pub fn with_write_meter<T>(show: bool, total: u64, what: &str, f: impl FnOnce() -> T) -> T {
    if !show {
        return f();
    }
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {bytes}/{total_bytes} ({elapsed}, {eta} left)")
    {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(what.to_owned());
    let start = ckpt_io::bytes_written();
    let done = AtomicBool::new(false);
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                pb.set_position(ckpt_io::bytes_written().saturating_sub(start).min(total));
                std::thread::sleep(TICK);
            }
        });
        let out = f();
        done.store(true, Ordering::Relaxed);
        out
    });
    pb.finish_and_clear();
    out
}
