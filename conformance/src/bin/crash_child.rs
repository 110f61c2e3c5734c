//! The child process of the crash tests (`ckpt_conformance::crash`): saves one generation of a
//! deterministic checkpoint, to be killed at a failpoint or at a random instant.
//!
//! `crash_child FORMAT DST GENERATION [MIB]`; exits 0 after a complete save, 1 with the error on stderr.
//! With `CKPT_FAILPOINT_ACTION=stop` it pauses at the armed point (the lock test holds a save that way).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(format), Some(dst), Some(generation)) = (args.get(1), args.get(2), args.get(3)) else {
        eprintln!("usage: crash_child FORMAT DST GENERATION [MIB]");
        std::process::exit(2);
    };
    let generation: u32 = generation.parse().expect("GENERATION is a number");
    let mib: usize = args.get(4).map_or(8, |m| m.parse().expect("MIB is a number"));
    // Fault injection: a file size limit (RLIMIT_FSIZE) makes writes past it fail with EFBIG, as a full disk
    // fails them with ENOSPC.
    if let Some(limit) = std::env::var("CKPT_TEST_FSIZE_LIMIT").ok().and_then(|v| v.parse::<u64>().ok()) {
        let rlim = libc::rlimit { rlim_cur: limit, rlim_max: limit };
        // SAFETY: plain libc calls on this process: ignore SIGXFSZ (get EFBIG instead), then set the limit.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            libc::setrlimit(libc::RLIMIT_FSIZE, &rlim);
        }
    }
    if let Err(e) = ckpt_conformance::crash::save(format, std::path::Path::new(dst), generation, mib) {
        eprintln!("{e}");
        std::process::exit(1);
    }
}
