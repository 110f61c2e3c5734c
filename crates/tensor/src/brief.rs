//! Cutting a value read from a file to a few characters for an error message.

/// `v` as `{:?}` prints it, cut after [`BRIEF`] characters with `…`: for a value read from a file in an
/// error message (a memo bomb's value has millions of nodes; formatting stops at the cut).
///
/// ```
/// let long: Vec<u32> = (0..10_000).collect();
/// let s = ckpt_tensor::brief(&long);
/// assert!(s.starts_with("[0, 1, 2") && s.ends_with('…') && s.chars().count() == ckpt_tensor::brief::BRIEF + 1);
/// assert_eq!(ckpt_tensor::brief(&"short"), "\"short\"");
/// ```
pub fn brief(v: &dyn std::fmt::Debug) -> String {
    struct Capped(String, bool);
    impl std::fmt::Write for Capped {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let room = BRIEF.saturating_sub(self.0.chars().count());
            if s.chars().count() <= room {
                self.0.push_str(s);
                return Ok(());
            }
            self.0.extend(s.chars().take(room));
            self.1 = true;
            Err(std::fmt::Error)
        }
    }
    let mut out = Capped(String::new(), false);
    let _ = std::fmt::Write::write_fmt(&mut out, format_args!("{v:?}"));
    if out.1 {
        out.0.push('…');
    }
    out.0
}

/// Characters [`brief()`] keeps.
pub const BRIEF: usize = 120;
