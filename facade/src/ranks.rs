//! Conversions and reshards split over the processes of a [`Collective`] (an MPI job, threads, one
//! process): [`convert_in`], [`reshard_in`].

use std::path::Path;

use ckpt_collective::Collective;

use crate::adaptor::Source;
use crate::convert::{ConvertOptions, ConvertSummary};
use crate::{Error, Format, Result};

/// [`crate::convert`] split over the processes of `group`: every process calls it with the same arguments.
///
/// The target's `W` ranks ([`ConvertOptions::world_size`]) are hosted round-robin by the `K` processes
/// ([`ckpt_collective::host_ranks`]): each process reads the source regions of its ranks and writes their files,
/// and rank 0 writes the shared metadata after every rank's files are durable, then commits the directory
/// atomically. The files are byte for byte those of [`crate::convert`] in one process.
///
/// - distcp targets: each rank writes its `Shard(0)` rows of every tensor (a distcp source is read region
///   by region; other sources are opened lazily, so a rank touches only the pages of its rows).
/// - hfai targets: each rank writes its `PART_{rank:03d}.pt`, reading from the source only the tensors of its
///   part (`ckpt::hfai::save_rank_resolved`; the split is planned from dtypes and shapes).
/// - hf targets: the shards are the files: shard `i` is written by process `i mod K`, which alone reads its
///   tensors (`ckpt::hf::save_entries_in`); process 0 writes the index.
/// - RecIS targets: shard `r` (its data files) is written by the process of rank `r`, reading only the ids of
///   its slice and their rows (`ckpt::recis::save_rank`, or `ckpt::recis::reshard_rank` from a RecIS
///   source); process 0 writes `model.pt`, `extra.pt`, and the merged `index` last.
/// - PyTorch-BigGraph targets: the `i`-th entity partition file is written by process `i mod K`, reading only
///   its rows (`ckpt::pbg::save_rank`); process 0 writes `config.json`, the model file, and the version file
///   last.
/// - one-file targets (torch, safetensors, hf with one shard): the process of rank 0 writes it; the others
///   wait for its verdict.
///
/// Every process returns the same verdict: a failure on any process makes every process return an error
/// ([`Error::RankFailed`] on the others), none is left waiting.
///
/// ```
/// use ckpt::collective::SingleProcess;
/// use ckpt::tensor::{Tensor, Value};
/// let dir = tempfile::tempdir().unwrap();
/// let pt = dir.path().join("m.pt");
/// let sd = Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap()))]);
/// ckpt::torch::save(&sd, &pt, &ckpt::torch::WriteOptions::default()).unwrap();
/// let options = ckpt::ConvertOptions::default().with_world_size(2);
/// ckpt::convert_in(&pt, None, &dir.path().join("dcp"), "distcp".parse()?, &options, &SingleProcess)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As [`crate::convert`]; [`Error::RankFailed`] when another process failed.
pub fn convert_in(
    src: &Path,
    from: Option<Format>,
    dst: &Path,
    to: Format,
    options: &ConvertOptions,
    group: &dyn Collective,
) -> Result<ConvertSummary> {
    if group.world_size() == 1 {
        return crate::convert(src, from, dst, to, options);
    }
    let prepared = crate::convert::plan(src, from, dst, to, options);
    let (source, target) = agree(group, prepared)?;
    target.write_in(
        &Source::new(src, source, &options.selection, &options.limits, &options.source),
        dst,
        options,
        group,
    )
}

/// [`crate::reshard`] split over the processes of `group`, as [`convert_in`] splits a conversion, the
/// `world_size` ranks hosted round-robin by the processes: for distcp each rank reads only the regions of its
/// `Shard(0)` box from the source and writes its own data files, rank 0 writes `.metadata` last; for hfai
/// each rank writes its part (`ckpt::hfai::reshard_rank`); for RecIS each rank writes its shard's data
/// files, reading only the ids of its slice (`ckpt::recis::reshard_rank`), rank 0 the merged `index` last.
/// The files are those of [`crate::reshard`] in one process.
///
/// # Errors
/// As [`crate::reshard`]; [`Error::RankFailed`] when another process failed.
pub fn reshard_in(src: &Path, dst: &Path, world_size: usize, group: &dyn Collective) -> Result<crate::ReshardSummary> {
    reshard_in_with(src, dst, world_size, &crate::ReadLimits::default(), group)
}

/// [`reshard_in`], reading the source under `limits`.
///
/// # Errors
/// As [`reshard_in`].
pub fn reshard_in_with(
    src: &Path,
    dst: &Path,
    world_size: usize,
    limits: &crate::ReadLimits,
    group: &dyn Collective,
) -> Result<crate::ReshardSummary> {
    if group.world_size() == 1 {
        return crate::reshard_with(src, dst, world_size, limits);
    }
    // Rank 0 checks the request and the destination; everyone learns the outcome before anything is written.
    let checked = if group.rank() == 0 { Some(crate::reshard::check(src, dst, world_size)) } else { None };
    agree_with_root(group, checked.map(|r| r.map(|_| ())), dst)?;
    let (format, adaptor) = crate::reshard::check_format(src)?;
    let (tensors, bytes) = crate::reshard::count(adaptor, src, limits)?;
    adaptor.reshard_in(src, dst, world_size, limits, group)?;
    Ok(crate::ReshardSummary { format, world_size, tensors, bytes })
}

/// Every process's outcome, exchanged: `Ok` on every process when all succeeded, else an error on every
/// process (its own, or [`Error::RankFailed`] naming the first process that failed).
pub(crate) fn agree<T>(group: &dyn Collective, own: Result<T>) -> Result<T> {
    let msg = match &own {
        Ok(_) => Vec::new(),
        Err(e) => crate::verify::chain(e).into_bytes(),
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
#[cfg_attr(not(any(feature = "hfai", feature = "recis", feature = "pbg")), allow(dead_code))]
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
            m.extend(crate::verify::chain(e).into_bytes());
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
