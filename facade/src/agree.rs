//! The processes of a group agreeing on one outcome: every process's result exchanged, so that a failure
//! anywhere is an error everywhere and no process is left waiting.

use std::path::Path;

use ckpt_collective::Collective;

use ckpt_tensor::Fault;

use crate::error::{Error, Result, fault_code, fault_of_code};
use crate::report::{ConvertSummary, chain};

/// Every process's outcome, exchanged: `Ok` on every process when all succeeded, else an error on every
/// process (its own, or [`Error::RankFailed`] naming the first process that failed).
pub(crate) fn agree<T>(group: &dyn Collective, own: Result<T>) -> Result<T> {
    // An error travels as its fault's byte, then its text; success as nothing.
    let msg = match &own {
        Ok(_) => Vec::new(),
        Err(e) => [vec![fault_code(e.fault())], chain(e).into_bytes()].concat(),
    };
    let all = group.all_gather(msg).map_err(|e| exchange_failed(group.rank(), &e))?;
    let own = own?;
    match all.iter().enumerate().find_map(|(rank, m)| m.split_first().map(|(code, text)| (rank, *code, text))) {
        Some((rank, code, text)) => Err(Error::RankFailed {
            rank,
            fault: fault_of_code(code),
            message: String::from_utf8_lossy(text).into_owned(),
        }),
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
            let mut m = vec![1u8, fault_code(e.fault())];
            m.extend(chain(e).into_bytes());
            m
        }
        None => Vec::new(),
    };
    let verdict = group.broadcast(msg, 0).map_err(|e| exchange_failed(group.rank(), &e))?;
    if let Some(own) = own {
        return own;
    }
    match verdict.split_first() {
        Some((0, body)) => T::from_wire(body).ok_or_else(|| Error::RankFailed {
            rank: 0,
            fault: Fault::Io,
            message: format!("{}: sent an unreadable outcome", at.display()),
        }),
        Some((_, body)) => {
            let (fault, text) = body.split_first().map_or((Fault::Io, &[][..]), |(c, t)| (fault_of_code(*c), t));
            Err(Error::RankFailed { rank: 0, fault, message: String::from_utf8_lossy(text).into_owned() })
        }
        None => Err(Error::RankFailed { rank: 0, fault: Fault::Io, message: "sent no outcome".into() }),
    }
}

/// The error of a process whose group could not exchange outcomes: the environment's. As text, as every
/// [`Error::RankFailed`]: the variant is what crosses the process group as bytes, so it holds no source.
fn exchange_failed(rank: usize, e: &ckpt_tensor::Error) -> Error {
    Error::RankFailed { rank, fault: Fault::Io, message: e.to_string() }
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

/// One byte: 1 for `true`.
impl Wire for bool {
    fn to_wire(&self) -> Vec<u8> {
        vec![u8::from(*self)]
    }

    fn from_wire(bytes: &[u8]) -> Option<Self> {
        match bytes {
            [b] => Some(*b == 1),
            _ => None,
        }
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
    fn every_process_reports_the_failing_ones_fault() {
        use ckpt_collective::ThreadGroup;
        let faults: Vec<(Fault, Fault)> = std::thread::scope(|s| {
            let handles: Vec<_> = ThreadGroup::new(2)
                .into_iter()
                .map(|g| {
                    s.spawn(move || {
                        let own: Result<()> = if g.rank() == 0 {
                            Err(Error::InvalidArgument { path: "/d".into(), reason: "not empty".into() })
                        } else {
                            Ok(())
                        };
                        let all = agree(&g, own).unwrap_err().fault();
                        let own = if g.rank() == 0 {
                            Some(Err(Error::LimitExceeded {
                                path: "/d".into(),
                                limit: "max_header_bytes",
                                what: "header",
                                value: 2,
                                max: 1,
                            }))
                        } else {
                            None
                        };
                        let root = agree_with_root::<()>(&g, own, std::path::Path::new("/d")).unwrap_err().fault();
                        (all, root)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(faults, vec![(Fault::InvalidArgument, Fault::Limit); 2]);
        for f in [Fault::Malformed, Fault::Unsupported, Fault::Limit, Fault::Io, Fault::InvalidArgument] {
            assert_eq!(fault_of_code(fault_code(f)), f);
        }
    }

    #[test]
    fn summaries_travel_whole() {
        let s = ConvertSummary { tensors: 3, bytes: 1 << 40, values: 2, dropped: vec!["a\nb".into(), String::new()] };
        let back = ConvertSummary::from_wire(&s.to_wire()).unwrap();
        assert_eq!((back.tensors, back.bytes, back.values, back.dropped), (3, 1 << 40, 2, s.dropped.clone()));
        assert!(ConvertSummary::from_wire(&s.to_wire()[..30]).is_none());
    }
}
