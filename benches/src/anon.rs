//! Peak anonymous memory of this process while an operation runs, sampled from `/proc/self/status`.
//!
//! Anonymous memory (`RssAnon`) is what a reader or writer allocates: heap, buffers, copies. Pages of
//! mapped files are not counted, so a reader that maps a file and hands out windows of it shows only its
//! index. A background thread samples `RssAnon` every millisecond; [`PeakAnon::finish`] returns the peak
//! above the level at [`PeakAnon::start`]. Short spikes between samples can be missed, so the figure is a
//! lower bound with a resolution of about a millisecond of allocation.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// `RssAnon` of this process in bytes, `None` where `/proc` does not say (not Linux).
pub fn rss_anon() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A running sampler of this process's anonymous memory.
pub struct PeakAnon {
    start: u64,
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PeakAnon {
    /// Starts sampling every `interval`.
    pub fn start(interval: Duration) -> PeakAnon {
        let start = rss_anon().unwrap_or(0);
        let peak = Arc::new(AtomicU64::new(start));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (Arc::clone(&peak), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("peak-anon".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    if let Some(now) = rss_anon() {
                        p.fetch_max(now, Ordering::Relaxed);
                    }
                    std::thread::sleep(interval);
                }
            })
            .ok();
        PeakAnon { start, peak, stop, thread }
    }

    /// Stops sampling (after one last sample) and returns the peak anonymous memory above the level at
    /// [`PeakAnon::start`], in bytes.
    pub fn finish(mut self) -> u64 {
        if let Some(now) = rss_anon() {
            self.peak.fetch_max(now, Ordering::Relaxed);
        }
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak.load(Ordering::Relaxed).saturating_sub(self.start)
    }
}
