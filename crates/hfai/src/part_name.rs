//! The names of hfai's part files: `PART_{rank:03d}.pt`, and what another directory entry's name is to hfai's
//! loader.

/// The file name of rank `rank`'s part: `PART_{rank:03d}.pt` (three digits, more from rank 1000 on).
///
/// ```
/// assert_eq!(ckpt_hfai::part_file_name(7), "PART_007.pt");
/// assert_eq!(ckpt_hfai::part_file_name(1234), "PART_1234.pt");
/// ```
pub fn part_file_name(rank: usize) -> String {
    format!("PART_{rank:03}.pt")
}

/// What a directory entry's name is to hfai's loader, which counts `PART_*.pt` (Python's glob: hidden
/// names never match).
pub(crate) enum PartName {
    /// `PART_{rank:03d}.pt` exactly.
    Rank(usize),
    /// Matches `PART_*.pt` but is not a part name hfai writes (`PART_1.pt`, `PART_x.pt`).
    Foreign,
    /// Not matched by `PART_*.pt`.
    Other,
}

pub(crate) fn classify(name: &str) -> PartName {
    let Some(middle) = name.strip_prefix("PART_").and_then(|n| n.strip_suffix(".pt")) else {
        return PartName::Other;
    };
    match middle.parse::<usize>() {
        Ok(rank) if middle.bytes().all(|b| b.is_ascii_digit()) && part_file_name(rank) == name => PartName::Rank(rank),
        _ => PartName::Foreign,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(matches!(classify("PART_000.pt"), PartName::Rank(0)));
        assert!(matches!(classify("PART_1000.pt"), PartName::Rank(1000)));
        assert!(matches!(classify("PART_0.pt"), PartName::Foreign));
        assert!(matches!(classify("PART_+01.pt"), PartName::Foreign));
        assert!(matches!(classify("PART_0001.pt"), PartName::Foreign));
        assert!(matches!(classify("PART_.pt"), PartName::Foreign));
        assert!(matches!(classify(".PART_000.pt.tmp.12"), PartName::Other));
        assert!(matches!(classify("PART_000.pt.tmp"), PartName::Other));
    }
}
