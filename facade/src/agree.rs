//! The processes of a group agreeing on one outcome: every process's result exchanged, so that a failure
//! anywhere is an error everywhere and no process is left waiting.

use std::path::Path;

use ckpt_collective::Collective;

use crate::error::{Error, Result};
use crate::report::{ConvertSummary, chain};

/// Every process's outcome, exchanged: `Ok` on every process when all succeeded, else an error on every
/// process (its own, or [`Error::RankFailed`] naming the first process that failed).
pub(crate) fn agree<T>(group: &dyn Collective, own: Result<T>) -> Result<T> {
    let msg = match &own {
        Ok(_) => Vec::new(),
        Err(e) => chain(e).into_bytes(),
    };
    let all = group.all_gather(msg).map_err(|e| Error::RankFailed { rank: group.rank(), message: e.to_string() })?;
    let own = own?;
    match all.iter().enumerate().find(|(_, m)| !m.is_empty()) {
        Some((rank, m)) => Err(Error::RankFailed { rank, message: String::from_utf8_lossy(m).into_owned() }),
        None => Ok(own),
    }
}

/// The outcome of the ranks this process hosted ([`ckpt_collective::host_ranks`]) as one result: the first error of
/// a rank's own (`is_other` tells the "another rank failed" errors, which a rank's own error wins over), else
/// the first such report, else the results in rank order.
// For the targets whose writers run once per rank.
#[cfg(any(feature = "hfai", feature = "recis", feature = "pbg"))]
pub(crate) fn hosted_outcome<T, E: crate::error::Cause>(
    ran: ckpt_tensor::Result<Vec<(usize, std::result::Result<T, E>)>>,
    is_other: impl Fn(&E) -> bool,
    at: &Path,
) -> Result<Vec<T>> {
    use crate::error::At;
    let mut first = None;
    let mut out = Vec::new();
    for (_, r) in ran.at(at)? {
        match r {
            Err(e) if !is_other(&e) => return Err(e.at(at)),
            Err(e) => first = first.or(Some(e)),
            Ok(v) => out.push(v),
        }
    }
    match first {
        Some(e) => Err(e.at(at)),
        None => Ok(out),
    }
}

/// Rank 0's outcome (`own` is `Some` there) delivered to every process.
pub(crate) fn agree_with_root<T: Wire>(group: &dyn Collective, own: Option<Result<T>>, at: &Path) -> Result<T> {
    let msg = match &own {
        Some(Ok(v)) => {
            let mut m = vec![0u8];
            m.extend(v.to_wire());
            m
        }
        Some(Err(e)) => {
            let mut m = vec![1u8];
            m.extend(chain(e).into_bytes());
            m
        }
        None => Vec::new(),
    };
    let verdict =
        group.broadcast(msg, 0).map_err(|e| Error::RankFailed { rank: group.rank(), message: e.to_string() })?;
    if let Some(own) = own {
        return own;
    }
    match verdict.split_first() {
        Some((0, body)) => T::from_wire(body).ok_or_else(|| Error::RankFailed {
            rank: 0,
            message: format!("{}: sent an unreadable outcome", at.display()),
        }),
        Some((_, body)) => Err(Error::RankFailed { rank: 0, message: String::from_utf8_lossy(body).into_owned() }),
        None => Err(Error::RankFailed { rank: 0, message: "sent no outcome".into() }),
    }
}

/// What a process's outcome travels as.
pub(crate) trait Wire: Sized {
    fn to_wire(&self) -> Vec<u8>;
    fn from_wire(bytes: &[u8]) -> Option<Self>;
}

impl Wire for () {
    fn to_wire(&self) -> Vec<u8> {
        Vec::new()
    }
    fn from_wire(_: &[u8]) -> Option<Self> {
        Some(())
    }
}

impl Wire for ConvertSummary {
    /// Three counts, then each dropped name length-prefixed (names may hold any character).
    fn to_wire(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for n in [self.tensors as u64, self.bytes, self.values as u64, self.dropped.len() as u64] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        for d in &self.dropped {
            out.extend_from_slice(&(d.len() as u64).to_le_bytes());
            out.extend_from_slice(d.as_bytes());
        }
        out
    }
    fn from_wire(mut bytes: &[u8]) -> Option<Self> {
        let word = |b: &mut &[u8]| -> Option<u64> {
            let (head, rest) = b.split_first_chunk::<8>()?;
            *b = rest;
            Some(u64::from_le_bytes(*head))
        };
        let tensors = usize::try_from(word(&mut bytes)?).ok()?;
        let total = word(&mut bytes)?;
        let values = usize::try_from(word(&mut bytes)?).ok()?;
        let count = word(&mut bytes)?;
        let mut dropped = Vec::new();
        for _ in 0..count {
            let len = usize::try_from(word(&mut bytes)?).ok()?;
            let name = bytes.get(..len)?;
            dropped.push(String::from_utf8(name.to_vec()).ok()?);
            bytes = bytes.get(len..)?;
        }
        Some(ConvertSummary { tensors, bytes: total, values, dropped })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn summaries_travel_whole() {
        let s = ConvertSummary { tensors: 3, bytes: 1 << 40, values: 2, dropped: vec!["a\nb".into(), String::new()] };
        let back = ConvertSummary::from_wire(&s.to_wire()).unwrap();
        assert_eq!((back.tensors, back.bytes, back.values, back.dropped), (3, 1 << 40, 2, s.dropped.clone()));
        assert!(ConvertSummary::from_wire(&s.to_wire()[..30]).is_none());
    }
}
