//! A tiny training program that checkpoints through the per-rank save path: `W` ranks, each owning a
//! shard (rows) of the model's tensors, save one DCP checkpoint with [`RankSave`] (begin, ticket, join,
//! write, report, commit), the ticket and the reports travelling through the program's own
//! [`Collective`]; then each rank loads back only its own boxes with [`DcpReader::read_region`], in a
//! job of the same or of another size, and checks every value.
//!
//! ```text
//! cargo run -p ckpt --features distcp --example train_ranks -- save /tmp/run/step-3 --ranks 4 --step 3
//! cargo run -p ckpt --features distcp --example train_ranks -- load /tmp/run/step-3 --ranks 3 --step 3
//! # the ranks as MPI processes instead of threads:
//! cargo build -p ckpt --features distcp,mpi --example train_ranks
//! mpirun -np 4 target/debug/examples/train_ranks save /tmp/run/step-3 --step 3
//! ```
//!
//! Without `mpirun` the ranks are threads of one process ([`ThreadGroup`], `--ranks N`, default 2); built
//! with the `mpi` feature and started by `mpirun`, they are its processes (`MpiCollective`). The output is
//! an ordinary DCP checkpoint: torch's `FileSystemReader` (`dcp.load`) loads it into a job of any size
//! (`facade/tests/train_ranks.rs` runs this program's code and has torch load what it wrote).
//!
//! This is what `save_rank` does in one call; a program drives the steps itself when something else
//! plans the items and exchanges the messages, as `torch.distributed.checkpoint` does for
//! `ckpt.dcp.Writer` in the Python package:
//!
//! 1. rank 0 [begins](RankSave::begin) the save (the lock, clean-up of a killed save, the staging
//!    directory beside the destination) and broadcasts its [ticket](RankSave::ticket);
//! 2. every other rank [joins](RankSave::join) with the ticket;
//! 3. every rank [writes](RankSave::write) its items (its rows of the sharded tensors; rank 0 also the
//!    replicated ones, which DCP stores once) into its own `__{rank}_0.distcp`, durably, and makes its
//!    [report](RankSave::report);
//! 4. the reports, with where each item landed, are gathered on rank 0 ([`Message`]), which builds the
//!    checkpoint's `.metadata` (every tensor's chunks, every item's place, the nesting) and
//!    [commits](RankSave::commit): `.metadata` last, then the directory swapped in whole;
//! 5. rank 0 broadcasts the verdict, so every rank returns the same outcome.
//!
//! A rank that fails reports its error instead of its items: rank 0 then commits nothing and every rank
//! returns the error. The previous checkpoint at the destination stays whole until the swap, whatever
//! happens (a killed rank included); the next save removes what a killed one left.
//!
//! The state at step `s` (`R` = 12 rows of width `D` = 4), the same formulas on every rank:
//! `model.emb` `[R, D]` f32 and `optim.emb_exp_avg` `[R, D]` f32 sharded by rows (`Shard(0)`),
//! `model.head` `[D, 3]` f32 replicated, `optim.step` a 0-d i64.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ckpt::DType;
use ckpt::collective::{Collective, ThreadGroup};
use ckpt::distcp::{
    ChunkStorageMetadata, DcpReader, ItemData, Metadata, MetadataIndex, RankItem, RankSave, StorageInfo,
    StorageMetadata, TensorProperties, TensorStorageMetadata, WriteOptions, shard_box,
};
use ckpt::tensor::{PathItem, Tensor, Value};

/// Rows of the sharded tensors.
pub const ROWS: usize = 12;
/// Their width.
pub const D: usize = 4;

/// What a rank returns on failure.
pub type Failure = Box<dyn std::error::Error + Send + Sync>;

/// One tensor of a rank's state: its key, the whole tensor's shape, where this rank's box starts, the
/// box, and whether this rank writes it (a replicated tensor is written by rank 0 alone, as DCP does).
#[derive(Debug, Clone)]
pub struct Shard {
    /// The flattened key (`model.emb`): the first dot separates the nesting (`model` → `emb`).
    pub fqn: &'static str,
    /// The whole tensor's shape.
    pub size: Vec<usize>,
    /// Where this rank's box starts in the whole tensor.
    pub offsets: Vec<usize>,
    /// This rank's box.
    pub local: Tensor,
    /// Whether this rank writes the box.
    pub writes: bool,
}

fn emb(step: i64, i: usize, j: usize) -> f32 {
    (step * 1000) as f32 + (i * D + j) as f32
}

fn head(step: i64, k: usize) -> f32 {
    k as f32 * 0.5 + step as f32
}

/// Rows `offsets[0]..offsets[0] + sizes[0]` of a `[ROWS, D]` tensor given by `f`.
fn rows(offsets: &[usize], sizes: &[usize], f: impl Fn(usize, usize) -> f32) -> Result<Tensor, Failure> {
    let (start, n) = (offsets.first().copied().unwrap_or(0), sizes.first().copied().unwrap_or(0));
    let data: Vec<f32> = (start..start + n).flat_map(|i| (0..D).map(move |j| (i, j))).map(|(i, j)| f(i, j)).collect();
    Ok(Tensor::from_slice(&data, &[n, D])?)
}

/// Rank `rank`'s part of the state at `step` in a job of `world` ranks.
///
/// # Errors
/// A tensor that cannot be made (never, for these shapes).
pub fn state(rank: usize, world: usize, step: i64) -> Result<Vec<Shard>, Failure> {
    let (off, len) = shard_box(&[ROWS, D], 0, rank, world);
    let head_t = Tensor::from_slice(&(0..D * 3).map(|k| head(step, k)).collect::<Vec<_>>(), &[D, 3])?;
    Ok(vec![
        Shard {
            fqn: "model.emb",
            size: vec![ROWS, D],
            offsets: off.clone(),
            local: rows(&off, &len, |i, j| emb(step, i, j))?,
            writes: true,
        },
        Shard { fqn: "model.head", size: vec![D, 3], offsets: vec![0, 0], local: head_t, writes: rank == 0 },
        Shard {
            fqn: "optim.emb_exp_avg",
            size: vec![ROWS, D],
            offsets: off.clone(),
            local: rows(&off, &len, |i, j| -emb(step, i, j))?,
            writes: true,
        },
        Shard {
            fqn: "optim.step",
            size: vec![],
            offsets: vec![],
            local: Tensor::from_slice(&[step], &[])?,
            writes: rank == 0,
        },
    ])
}

/// The whole state at `step`, nested as the checkpoint's `planner_data` says (`{"model": {"emb": ...}}`):
/// what `torch.distributed.checkpoint` loads into one process.
///
/// # Errors
/// A tensor that cannot be made (never, for these shapes).
pub fn full_state(step: i64) -> Result<Value, Failure> {
    let mut model = Vec::new();
    let mut optim = Vec::new();
    for s in state(0, 1, step)? {
        let (outer, inner) = s.fqn.split_once('.').unwrap_or(("", s.fqn));
        let at = if outer == "model" { &mut model } else { &mut optim };
        at.push((inner, Value::Tensor(s.local)));
    }
    Ok(Value::dict([("model", Value::dict(model)), ("optim", Value::dict(optim))]))
}

/// Where one item a rank wrote landed: what rank 0 needs for `.metadata`.
#[derive(Debug, Clone, PartialEq)]
pub struct Placed {
    /// The key.
    pub fqn: String,
    /// The whole tensor's shape.
    pub size: Vec<usize>,
    /// The box's offsets.
    pub offsets: Vec<usize>,
    /// The box's sizes.
    pub sizes: Vec<usize>,
    /// The element type.
    pub dtype: DType,
    /// Where its bytes are.
    pub info: StorageInfo,
}

/// What every rank sends rank 0 after writing: its report for the commit, and where its items landed (or
/// why it failed before it could report).
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// [`RankSave::report`]'s bytes; empty when the rank could not even join the save.
    pub report: Vec<u8>,
    /// Its items, or its error.
    pub items: Result<Vec<Placed>, String>,
}

impl Message {
    /// The message as bytes: the report's length (8 bytes, little-endian), the report, then the items as
    /// JSON.
    pub fn to_bytes(&self) -> Vec<u8> {
        let items = match &self.items {
            Ok(items) => serde_json::json!({ "items": items.iter().map(|p| serde_json::json!({
                "fqn": p.fqn, "size": p.size, "offsets": p.offsets, "sizes": p.sizes,
                "dtype": p.dtype.torch_name(), "file": p.info.relative_path, "offset": p.info.offset,
                "length": p.info.length, "transforms": p.info.transform_descriptors,
            })).collect::<Vec<_>>() }),
            Err(e) => serde_json::json!({ "error": e }),
        };
        let mut out = (self.report.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&self.report);
        out.extend_from_slice(items.to_string().as_bytes());
        out
    }

    /// A message from [`Message::to_bytes`]'s bytes.
    ///
    /// # Errors
    /// Bytes that are not such a message.
    pub fn from_bytes(bytes: &[u8]) -> Result<Message, Failure> {
        let (len, rest) = bytes.split_first_chunk::<8>().ok_or("a rank's message is shorter than its header")?;
        let len = usize::try_from(u64::from_le_bytes(*len))?;
        let report = rest.get(..len).ok_or("a rank's message is shorter than its report")?.to_vec();
        let json: serde_json::Value = serde_json::from_slice(rest.get(len..).unwrap_or_default())?;
        if let Some(e) = json.get("error").and_then(|e| e.as_str()) {
            return Ok(Message { report, items: Err(e.to_owned()) });
        }
        let sizes = |v: &serde_json::Value, key: &str| -> Result<Vec<usize>, Failure> {
            Ok(serde_json::from_value(v.get(key).cloned().ok_or(format!("an item has no {key}"))?)?)
        };
        let text = |v: &serde_json::Value, key: &str| -> Result<String, Failure> {
            Ok(v.get(key).and_then(|s| s.as_str()).ok_or(format!("an item has no {key}"))?.to_owned())
        };
        let number = |v: &serde_json::Value, key: &str| -> Result<u64, Failure> {
            Ok(v.get(key).and_then(serde_json::Value::as_u64).ok_or(format!("an item has no {key}"))?)
        };
        let mut items = Vec::new();
        for v in json.get("items").and_then(|i| i.as_array()).ok_or("a rank's message has no items")? {
            let dtype = text(v, "dtype")?;
            items.push(Placed {
                fqn: text(v, "fqn")?,
                size: sizes(v, "size")?,
                offsets: sizes(v, "offsets")?,
                sizes: sizes(v, "sizes")?,
                dtype: DType::from_torch_name(&dtype).ok_or(format!("an item of dtype {dtype}"))?,
                info: StorageInfo {
                    relative_path: text(v, "file")?,
                    offset: number(v, "offset")?,
                    length: number(v, "length")?,
                    transform_descriptors: serde_json::from_value(v.get("transforms").cloned().unwrap_or_default())
                        .unwrap_or_default(),
                },
            });
        }
        Ok(Message { report, items: Ok(items) })
    }
}

/// The checkpoint's `.metadata`, from every rank's items (rank order): each key's whole shape and chunks,
/// where each chunk lies, and how the keys nest.
pub fn metadata(messages: &[Message]) -> Metadata {
    let mut md = Metadata::default();
    let mut planner = Vec::new();
    for placed in messages.iter().filter_map(|m| m.items.as_ref().ok()).flatten() {
        let at = match md.state_dict_metadata.iter().position(|(k, _)| *k == placed.fqn) {
            Some(at) => at,
            None => {
                let empty = TensorStorageMetadata {
                    properties: TensorProperties::new(placed.dtype),
                    size: placed.size.clone(),
                    chunks: Vec::new(),
                };
                md.state_dict_metadata.push((placed.fqn.clone(), StorageMetadata::Tensor(empty)));
                let path = placed.fqn.split('.').map(|p| PathItem::Key(p.to_owned())).collect();
                planner.push((placed.fqn.clone(), path));
                md.state_dict_metadata.len() - 1
            }
        };
        let mut index = 0;
        if let Some((_, StorageMetadata::Tensor(t))) = md.state_dict_metadata.get_mut(at) {
            index = t.chunks.len();
            t.chunks.push(ChunkStorageMetadata { offsets: placed.offsets.clone(), sizes: placed.sizes.clone() });
        }
        let key = MetadataIndex { fqn: placed.fqn.clone(), offset: Some(placed.offsets.clone()), index: Some(index) };
        md.storage_data.push((key, placed.info.clone()));
    }
    md.planner_data = Some(planner);
    md
}

/// Writes this rank's items; returns where they landed.
fn write_own(save: &RankSave, own: &[Shard]) -> Result<Vec<Placed>, Failure> {
    let mine: Vec<&Shard> = own.iter().filter(|s| s.writes).collect();
    let items: Vec<RankItem<'_>> = mine
        .iter()
        .map(|s| RankItem { fqn: s.fqn.to_owned(), offsets: Some(s.offsets.clone()), data: ItemData::Tensor(&s.local) })
        .collect();
    let infos = save.write(&items)?;
    Ok(mine
        .iter()
        .zip(infos)
        .map(|(s, info)| Placed {
            fqn: s.fqn.to_owned(),
            size: s.size.clone(),
            offsets: s.offsets.clone(),
            sizes: s.local.shape().to_vec(),
            dtype: s.local.dtype(),
            info,
        })
        .collect())
}

/// One rank's part of a save of its state `own` to `dir` (see the module docs). Every rank returns the
/// same verdict.
///
/// # Errors
/// This rank's own failure, or the commit's (naming the rank that failed); the group's errors.
pub fn save(group: &dyn Collective, dir: &Path, own: &[Shard]) -> Result<(), Failure> {
    let (rank, world) = (group.rank(), group.world_size());
    let options = WriteOptions::default().with_overwrite(true);
    // 1-2. Rank 0 begins and broadcasts the ticket (empty: it could not begin); the others join.
    let begun = if rank == 0 { Some(RankSave::begin(dir, world, &options)) } else { None };
    let ticket = match &begun {
        Some(Ok(s)) => s.ticket(),
        _ => Vec::new(),
    };
    let ticket = group.broadcast(ticket, 0)?;
    let joined = match begun {
        Some(s) => Ok(s?),
        None if ticket.is_empty() => return Err("rank 0 could not begin the save".into()),
        None => RankSave::join(dir, &ticket, rank, &options),
    };
    // 3. Write and report. A failure is sent to rank 0, not returned at once: rank 0 waits for every rank.
    let (written, message) = match &joined {
        Ok(save) => {
            let written = write_own(save, own).map_err(|e| e.to_string());
            match save.report(written.as_ref().map(|_| ()).map_err(|e| ckpt::io::RankFailure::new(e.as_str()))) {
                Ok(report) => (written.clone(), Message { report, items: written }),
                Err(e) => failed(e.to_string()),
            }
        }
        Err(e) => failed(e.to_string()),
    };
    // 4. Rank 0 gathers every message and commits.
    let gathered = group.gather(message.to_bytes(), 0)?;
    let verdict = match gathered {
        Some(all) => match joined {
            Ok(save) => commit(save, &all).err().map(|e| e.to_string()).unwrap_or_default(),
            Err(e) => e.to_string(),
        },
        None => String::new(),
    };
    // 5. Everyone returns rank 0's verdict (or its own failure).
    let verdict = String::from_utf8_lossy(&group.broadcast(verdict.into_bytes(), 0)?).into_owned();
    written?;
    if verdict.is_empty() { Ok(()) } else { Err(verdict.into()) }
}

/// What a rank that could not join or report sends: no report (rank 0's commit refuses the empty one,
/// naming the rank) and its error.
fn failed(e: String) -> (Result<Vec<Placed>, String>, Message) {
    (Err(e.clone()), Message { report: Vec::new(), items: Err(e) })
}

/// On rank 0: the metadata from every rank's message, then the commit (given up when a message is bad).
fn commit(save: RankSave, all: &[Vec<u8>]) -> Result<(), Failure> {
    let messages = match all.iter().map(|b| Message::from_bytes(b)).collect::<Result<Vec<_>, _>>() {
        Ok(m) => m,
        Err(e) => {
            save.abort();
            return Err(e);
        }
    };
    let md = metadata(&messages);
    save.commit(&md, messages.into_iter().map(|m| m.report).collect())?;
    Ok(())
}

/// One rank's load of its own boxes from `dir` (written by any number of ranks), each compared with
/// `own`; returns the number of values checked.
///
/// # Errors
/// A read that fails; a value that differs.
pub fn load(dir: &Path, own: &[Shard]) -> Result<usize, Failure> {
    let reader = DcpReader::open(dir)?;
    let mut checked = 0;
    for s in own {
        let back = reader.read_region(s.fqn, &s.offsets, s.local.shape())?;
        if back != s.local {
            return Err(format!("{}: the box at {:?} differs from the rank's own", s.fqn, s.offsets).into());
        }
        checked += s.local.numel();
    }
    Ok(checked)
}

/// Runs `f` on `world` ranks as threads of a [`ThreadGroup`]; returns each rank's result. `f` takes part in
/// every collective the other ranks do, failure or not (as [`save`] does: a failure travels to rank 0 and
/// back as the verdict), so a rank that returns an error leaves no other waiting. A rank that panics breaks
/// the group: the others' collectives then fail instead of waiting for it.
pub fn on_threads<T: Send>(
    world: usize,
    f: impl Fn(&ThreadGroup) -> Result<T, Failure> + Sync,
) -> Vec<Result<T, Failure>> {
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = ThreadGroup::new(world)
            .into_iter()
            .map(|g| {
                s.spawn(move || {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&g))).unwrap_or_else(|_| {
                        g.abort();
                        Err(format!("rank {} panicked", g.rank()).into())
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into()))).collect()
    })
}

fn flag(args: &[String], name: &str) -> Option<i64> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok())
}

/// `save` or `load` on one rank of `group`.
fn run(group: &dyn Collective, cmd: &str, dir: &Path, step: i64) -> Result<String, Failure> {
    let own = state(group.rank(), group.world_size(), step)?;
    match cmd {
        "save" => save(group, dir, &own).map(|()| format!("saved step {step}")),
        "load" => load(dir, &own).map(|n| format!("checked {n} values of step {step}")),
        other => Err(format!("unknown command {other}: save or load").into()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, dir) = match args.as_slice() {
        [cmd, dir, ..] => (cmd.clone(), PathBuf::from(dir)),
        _ => {
            eprintln!("usage: train_ranks save|load DIR [--ranks N] [--step S]");
            return ExitCode::FAILURE;
        }
    };
    let step = flag(&args, "--step").unwrap_or(1);
    #[cfg(feature = "mpi")]
    if ckpt::collective::launched_by_mpi() {
        let outcome = ckpt::collective::MpiCollective::init().map_err(Failure::from).and_then(|mpi| {
            let who = format!("rank {} of {}", mpi.rank(), mpi.world_size());
            run(&mpi, &cmd, &dir, step).map(|m| format!("{who}: {m}")).map_err(|e| format!("{who}: {e}").into())
        });
        return report(vec![outcome]);
    }
    let world = usize::try_from(flag(&args, "--ranks").unwrap_or(2)).unwrap_or(2).max(1);
    let outcomes =
        on_threads(world, |g| run(g, &cmd, &dir, step).map(|m| format!("rank {} of {world}: {m}", g.rank())));
    report(outcomes)
}

fn report(outcomes: Vec<Result<String, Failure>>) -> ExitCode {
    let mut ok = true;
    for o in outcomes {
        match o {
            Ok(line) => println!("{line}"),
            Err(e) => {
                eprintln!("error: {e}");
                ok = false;
            }
        }
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
