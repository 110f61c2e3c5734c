//! The child process of the crash tests (`ckpt_conformance::crash`): saves one generation of a
//! deterministic checkpoint, to be killed at a failpoint or at a random instant.
//!
//! `crash_child FORMAT DST GENERATION [MIB]`; exits 0 after a complete save, 1 with the error on stderr.
//! With `CKPT_FAILPOINT_ACTION=stop` it pauses at the armed point (the lock test holds a save that way).
//! `crash_child read:FORMAT DST GENERATION [MIB]` reads instead: prints the generation found (out of
//! 1..=GENERATION) and exits 0, or prints why not and exits 1. `CKPT_TEST_UID=<uid>` drops root to that
//! user (and its group) first: permission tests, since root bypasses file permissions.

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
    if let Some(uid) = std::env::var("CKPT_TEST_UID").ok().and_then(|v| v.parse::<u32>().ok()) {
        // SAFETY: plain libc calls on this process, before any other thread exists.
        let ok =
            unsafe { libc::setgroups(0, std::ptr::null()) == 0 && libc::setgid(uid) == 0 && libc::setuid(uid) == 0 };
        assert!(ok, "cannot become uid {uid}: {}", std::io::Error::last_os_error());
    }
    let dst = std::path::Path::new(dst);
    if let Some(format) = format.strip_prefix("read:") {
        let candidates: Vec<u32> = (1..=generation).collect();
        match ckpt_conformance::crash::read_generation(format, dst, mib, &candidates) {
            Ok(g) => println!("{g:?}"),
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
        return;
    }
    if let Err(e) = ckpt_conformance::crash::save(format, dst, generation, mib) {
        eprintln!("{e}");
        std::process::exit(1);
    }
}
