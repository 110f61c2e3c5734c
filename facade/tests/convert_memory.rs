//! Heap memory of conversions and reshards (issue 15): every `ckpt::convert` between the formats the facade
//! supports (torch `.pt`, safetensors, hf shards, distcp, hfai, RecIS, PyTorch-BigGraph where convertible)
//! and every `ckpt::reshard` holds at most the largest tensor plus 64 MiB of heap beyond what it started
//! with.
//!
//! The heap is counted by this test binary's global allocator (every allocation and release, not sampled),
//! and rayon runs on a pool of 2 threads of its own, so the result depends on neither timing nor the machine's
//! CPU count. Memory-mapped source files are not heap: a conversion that borrows its source's bytes pays
//! nothing for them. The counters are process-wide, so every measurement runs under one mutex, one at a
//! time, and the sources are several times the bound: a conversion that materializes its whole source
//! fails.
//!
//! Run with `--nocapture` to see the table of measured peaks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use ckpt::tensor::{Tensor, Value};
use ckpt::{ConvertOptions, Format};

/// The system allocator, counting the bytes in use and their peak.
struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = IN_USE.fetch_add(by, Ordering::SeqCst) + by;
    PEAK.fetch_max(now, Ordering::SeqCst);
}

// SAFETY: every call is forwarded to `System` unchanged; only counters are updated besides.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) };
        IN_USE.fetch_sub(layout.size(), Ordering::SeqCst);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Counted as the new block allocated before the old one is released (what a moving realloc holds).
            grew(new_size);
            IN_USE.fetch_sub(layout.size(), Ordering::SeqCst);
        }
        p
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// One measurement at a time: the counters are process-wide.
static SERIAL: Mutex<()> = Mutex::new(());

const MIB: usize = 1 << 20;
/// The largest tensor of every generated checkpoint.
const LARGEST: usize = 16 * MIB;
/// Issue 15's bound.
const BOUND: usize = LARGEST + 64 * MIB;
/// Dense tensors of the state dict, `LARGEST` bytes each ([4096, 1024] float32).
const DENSE: usize = 10;
/// Rows of the state dict's RecIS hash table `tbl` (ids int64, embedding and one slot `[ROWS, 32]` float32,
/// `LARGEST` bytes each).
const ROWS: usize = LARGEST / (32 * 4);
/// Entity partitions of the PyTorch-BigGraph checkpoint (`[PBG_ROWS, 64]` float32, `LARGEST` bytes each).
const PBG_PARTS: u32 = 10;
const PBG_ROWS: usize = LARGEST / (64 * 4);
const PBG_DIM: usize = 64;

/// Runs `f` and returns the most heap it held at once beyond what was in use when it started.
fn peak_growth(f: impl FnOnce()) -> usize {
    // The write buffers pooled by earlier saves would otherwise count as held before `f`, not by it.
    ckpt::io::release_idle_buffers();
    let base = IN_USE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    f();
    PEAK.load(Ordering::SeqCst).saturating_sub(base)
}

fn f32_tensor(len: usize, seed: usize, shape: &[usize]) -> Tensor {
    let data: Vec<f32> = (0..len).map(|k| (k ^ seed) as f32).collect();
    Tensor::from_slice(&data, shape).unwrap()
}

/// A training state dict of about 210 MiB: `DENSE` float32 weights of 16 MiB, and a RecIS hash table
/// (`tbl@id`, `tbl@embedding`, `tbl@exp_avg`) that RecIS targets write as a sparse table.
fn state_dict() -> Value {
    let mut items: Vec<(String, Value)> = (0..DENSE)
        .map(|i| (format!("layer{i}.weight"), Value::Tensor(f32_tensor(LARGEST / 4, i, &[4096, 1024]))))
        .collect();
    let ids: Vec<i64> = (0..ROWS as i64).map(|k| k * 7 + 3).collect();
    items.push(("tbl@id".into(), Value::Tensor(Tensor::from_slice(&ids, &[ROWS]).unwrap())));
    for (s, slot) in ["embedding", "exp_avg"].into_iter().enumerate() {
        items.push((format!("tbl@{slot}"), Value::Tensor(f32_tensor(ROWS * 32, 100 + s, &[ROWS, 32]))));
    }
    Value::dict(items.iter().map(|(k, v)| (k.as_str(), v.clone())))
}

/// A PyTorch-BigGraph checkpoint of about 160 MiB: entity `node` in `PBG_PARTS` partitions with their
/// RowAdagrad state, one linear relation operator.
fn write_pbg(dir: &Path) {
    write_pbg_sized(dir, PBG_PARTS, PBG_ROWS);
}

/// [`write_pbg`] with `parts` partitions of `rows` rows.
fn write_pbg_sized(dir: &Path, parts: u32, rows: usize) {
    use ckpt::pbg::{EntityPartition, FileCheckpointStorage, Model, ModelParameter, OptimizerState, StateDict};
    let storage = FileCheckpointStorage::new(dir);
    storage.prepare().unwrap();
    let config = format!(
        r#"{{"entities": {{"node": {{"num_partitions": {parts}}}}},
            "relations": [{{"name": "r", "lhs": "node", "rhs": "node", "operator": "linear"}}],
            "dimension": {PBG_DIM}, "entity_path": "data", "edge_paths": [], "checkpoint_path": "ckpt"}}"#
    );
    storage.save_config(&config).unwrap();
    let mut commit = storage.begin_commit().unwrap();
    for p in 0..parts {
        let mut part = EntityPartition::new(f32_tensor(rows * PBG_DIM, p as usize, &[rows, PBG_DIM]));
        let sum = f32_tensor(rows, 7, &[rows]);
        part.optimizer = Some(OptimizerState::encode(&StateDict::row_adagrad(sum, 0.1)).unwrap());
        commit.partition("node", p, part).unwrap();
    }
    let op = f32_tensor(PBG_DIM * PBG_DIM, 1, &[PBG_DIM, PBG_DIM]);
    let param = ModelParameter::new("rhs_operators.0.linear_transformation", op).unwrap();
    commit.model(Model { parameters: Some(vec![param]), ..Model::default() });
    commit.finish(&ckpt::pbg::WriteOptions::default()).unwrap();
}

/// The formats a state dict converts to and from (pbg needs entity partitions: it has its own sources).
const DENSE_FORMATS: [Format; 6] =
    [Format::Torch, Format::Safetensors, Format::Hf, Format::Distcp, Format::Hfai, Format::Recis];

/// Target options: the sharded formats over 2 ranks, hfai tensors over 8 MiB chunked over its parts, hf
/// shards of at most 64 MiB, so that readers gather and writers split.
fn options(to: Format) -> ConvertOptions {
    let target = match to {
        Format::Hfai => ckpt::TargetOptions::Hfai { large_size: Some(8 << 20) },
        Format::Hf => ckpt::TargetOptions::Hf { max_shard_size: Some(64 << 20) },
        _ => ckpt::TargetOptions::Defaults,
    };
    ConvertOptions::default().with_world_size(if to.is_sharded() { 2 } else { 1 }).with_target(target)
}

fn path_for(dir: &Path, name: &str, to: Format) -> PathBuf {
    match to {
        Format::Torch => dir.join(format!("{name}.pt")),
        Format::Safetensors => dir.join(format!("{name}.safetensors")),
        _ => dir.join(name),
    }
}

fn remove(path: &Path) {
    if path.is_dir() {
        std::fs::remove_dir_all(path).unwrap();
    } else {
        std::fs::remove_file(path).unwrap();
    }
}

/// One measured call.
struct Measured {
    from: String,
    to: String,
    peak: usize,
}

/// Converts `src` to `to` in `dir` under a measure, then removes the result.
fn measure_convert(dir: &Path, label: &str, src: &Path, to: Format, out: &mut Vec<Measured>) {
    let dst = path_for(dir, &format!("{label}_to_{to}"), to);
    let options = options(to);
    let peak = peak_growth(|| {
        ckpt::convert(src, None, &dst, to, &options).unwrap_or_else(|e| panic!("{label} → {to}: {e}"));
    });
    out.push(Measured { from: label.into(), to: to.to_string(), peak });
    remove(&dst);
}

/// Sources of `format` for each format, converted (unmeasured) from `first`.
fn sources_from(dir: &Path, label: &str, first: (Format, PathBuf), formats: &[Format]) -> Vec<(Format, PathBuf)> {
    let mut sources = vec![first.clone()];
    for &to in formats.iter().filter(|&&f| f != first.0) {
        let dst = path_for(dir, &format!("{label}_src_{to}"), to);
        ckpt::convert(&first.1, None, &dst, to, &options(to)).unwrap_or_else(|e| panic!("{label} → {to}: {e}"));
        sources.push((to, dst));
    }
    sources
}

fn table(measured: &[Measured]) -> String {
    let mut s = String::from("| from | to | peak heap MiB | within the bound |\n|---|---|---|---|\n");
    for m in measured {
        let within = if m.peak <= BOUND { "yes" } else { "NO" };
        let _ = writeln!(s, "| {} | {} | {:.1} | {} |", m.from, m.to, m.peak as f64 / MIB as f64, within);
    }
    s
}

#[test]
fn every_conversion_and_reshard_holds_at_most_the_largest_tensor_plus_64_mib() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A fixed pool: the heap held by parallel writers grows with the thread count.
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    pool.install(measure_all);
}

fn measure_all() {
    let dir = tempfile::tempdir().unwrap();
    let mut measured = Vec::new();

    // The state dict in every format but pbg, each converted to every other.
    let pt = dir.path().join("dense.pt");
    ckpt::torch::save(&state_dict(), &pt, &ckpt::torch::WriteOptions::default()).unwrap();
    let dense = sources_from(dir.path(), "dense", (Format::Torch, pt), &DENSE_FORMATS);
    for (from, src) in &dense {
        for to in DENSE_FORMATS.into_iter().filter(|to| to != from) {
            measure_convert(dir.path(), &from.to_string(), src, to, &mut measured);
        }
    }
    // Every sharded format re-sharded from 2 to 3 ranks (row splits that straddle the old items).
    for (format, src) in dense.iter().filter(|(f, _)| f.is_sharded()) {
        let dst = dir.path().join(format!("re_{format}"));
        let peak = peak_growth(|| {
            ckpt::reshard(src, &dst, 3).unwrap_or_else(|e| panic!("reshard {format}: {e}"));
        });
        measured.push(Measured { from: format.to_string(), to: format!("{format} (reshard 2 → 3)"), peak });
        remove(&dst);
    }
    for (_, src) in dense {
        remove(&src);
    }

    // The PyTorch-BigGraph checkpoint to every format, and back from every format that keeps its layout
    // (RecIS cannot: refused, see `pbg_is_refused_where_nothing_can_hold_it`).
    let pbg = dir.path().join("pbg");
    write_pbg(&pbg);
    let pbg_formats = [DENSE_FORMATS.as_slice(), &[Format::Pbg]].concat();
    for to in DENSE_FORMATS {
        measure_convert(dir.path(), "pbg", &pbg, to, &mut measured);
    }
    let kept = sources_from(dir.path(), "pbg", (Format::Pbg, pbg), &pbg_formats);
    for (from, src) in kept.iter().filter(|(f, _)| *f != Format::Recis) {
        measure_convert(dir.path(), &format!("{from} (of pbg)"), src, Format::Pbg, &mut measured);
    }

    let table = table(&measured);
    println!("largest tensor {} MiB, bound {} MiB\n{table}", LARGEST / MIB, BOUND / MIB);
    // 6 × 5 dense conversions, 3 reshards, pbg to 6 formats, 6 back to pbg (pbg → pbg included).
    assert_eq!(measured.len(), 30 + 3 + 6 + 6, "{table}");
    let over: Vec<String> =
        measured.iter().filter(|m| m.peak > BOUND).map(|m| format!("{} → {}", m.from, m.to)).collect();
    assert!(over.is_empty(), "over {} MiB: {over:#?}\n{table}", BOUND / MIB);
}

/// The control: the counter sees a conversion's heap (a tensor gathered from a strided view holds that
/// tensor), so the bounds above are not met by a counter that counts nothing.
#[test]
fn the_counter_sees_a_materialized_tensor() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let grew = peak_growth(|| {
        let t = Tensor::zeros(ckpt::DType::F32, &[1024, 1024]).unwrap();
        let gathered = t.transpose(0, 1).unwrap().to_contiguous().unwrap();
        assert_eq!(gathered.nbytes(), 4 * MIB);
    });
    assert!(grew >= 8 * MIB, "{grew}");
}

/// Why some pairs with pbg are not measured: a state dict without entity partitions has nothing a
/// PyTorch-BigGraph checkpoint holds, and recis → pbg is refused whatever the checkpoint.
#[test]
fn pbg_is_refused_where_nothing_can_hold_it() {
    assert!(ckpt::unsupported_reason(Format::Recis, Format::Pbg).is_some());
    let dir = tempfile::tempdir().unwrap();
    let pt = dir.path().join("m.pt");
    let sd = Value::dict([("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap()))]);
    ckpt::torch::save(&sd, &pt, &ckpt::torch::WriteOptions::default()).unwrap();
    let e = ckpt::convert(&pt, None, dir.path().join("pbg"), Format::Pbg, &ConvertOptions::default()).unwrap_err();
    assert!(matches!(e, ckpt::Error::UnsupportedConversion { .. }), "{e}");
}

/// A RecIS table whose slots (48 MiB each, three of them) are each near the bound's slack: resharding
/// gathers each slot's rows for every new shard (`Buffer::deferred`) while shards and their data files are
/// written in parallel, so it holds at most one slot per writer thread besides the ids.
#[test]
fn recis_reshard_of_large_slots_holds_at_most_the_largest_tensor_plus_64_mib() {
    const SLOT: usize = 48 * MIB;
    const ROWS: usize = SLOT / (16 * 4);
    const SLOT_BOUND: usize = SLOT + 64 * MIB;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<i64> = (0..ROWS as i64).map(|k| k * 7 + 3).collect();
    let mut items = vec![("tbl@id".to_owned(), Value::Tensor(Tensor::from_slice(&ids, &[ROWS]).unwrap()))];
    for (s, slot) in ["embedding", "exp_avg", "exp_avg_sq"].into_iter().enumerate() {
        items.push((format!("tbl@{slot}"), Value::Tensor(f32_tensor(ROWS * 16, s, &[ROWS, 16]))));
    }
    let pt = dir.path().join("tbl.pt");
    let sd = Value::dict(items.iter().map(|(k, v)| (k.as_str(), v.clone())));
    ckpt::torch::save(&sd, &pt, &ckpt::torch::WriteOptions::default()).unwrap();
    drop((sd, items, ids));
    let src = dir.path().join("recis");
    ckpt::convert(&pt, None, &src, Format::Recis, &options(Format::Recis)).unwrap();
    let dst = dir.path().join("re");
    let peak = pool.install(|| {
        peak_growth(|| {
            ckpt::reshard(&src, &dst, 3).unwrap();
        })
    });
    println!("recis reshard 2 → 3 of 3 slots of {} MiB: {:.1} MiB", SLOT / MIB, peak as f64 / MIB as f64);
    assert!(peak <= SLOT_BOUND, "{peak} > {SLOT_BOUND}");
}

/// Many small tensors (the harness's shape: 64 of 4 MiB), so the write buffers, not the tensors, dominate:
/// a reshard from 2 to 3 ranks writes three files at once, and the buffers all writers hold together stay
/// within the bound (they once took 72 MiB: three buffers of 8 MiB for each of the three writers).
#[test]
fn resharding_many_small_tensors_holds_at_most_the_largest_tensor_plus_64_mib() {
    const TENSOR: usize = 4 * MIB;
    const SMALL_BOUND: usize = TENSOR + 64 * MIB;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let items: Vec<(String, Value)> = (0..64)
        .map(|i| (format!("layer{i}.weight"), Value::Tensor(f32_tensor(TENSOR / 4, i, &[1024, 1024]))))
        .collect();
    let pt = dir.path().join("small.pt");
    let sd = Value::dict(items.iter().map(|(k, v)| (k.as_str(), v.clone())));
    ckpt::torch::save(&sd, &pt, &ckpt::torch::WriteOptions::default()).unwrap();
    drop((sd, items));
    let mut peaks = Vec::new();
    for format in [Format::Distcp, Format::Hfai, Format::Recis] {
        let src = dir.path().join(format!("src_{format}"));
        ckpt::convert(&pt, None, &src, format, &options(format)).unwrap();
        let dst = dir.path().join(format!("re_{format}"));
        let peak = pool.install(|| {
            peak_growth(|| {
                ckpt::reshard(&src, &dst, 3).unwrap_or_else(|e| panic!("reshard {format}: {e}"));
            })
        });
        println!("{format} reshard 2 → 3 of 64 tensors of 4 MiB: {:.1} MiB", peak as f64 / MIB as f64);
        peaks.push((format, peak));
        remove(&src);
        remove(&dst);
    }
    assert!(peaks.iter().all(|&(_, p)| p <= SMALL_BOUND), "{peaks:?} over {SMALL_BOUND}");
}

/// PyTorch-BigGraph partitions near the bound's slack (48 MiB each) written from a distcp checkpoint, whose
/// embeddings are DCP regions made on demand: the partition files are written one after the other, each
/// region made while it is written, so one partition is in memory at a time (two, when the files were
/// written in parallel, held 2 × 256 MiB + 52 MiB in the harness's full run).
#[test]
fn distcp_to_pbg_of_large_partitions_holds_at_most_the_largest_tensor_plus_64_mib() {
    const PART: usize = 48 * MIB;
    const PART_BOUND: usize = PART + 64 * MIB;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pbg = dir.path().join("pbg");
    write_pbg_sized(&pbg, 3, PART / (PBG_DIM * 4));
    let dcp = dir.path().join("dcp");
    ckpt::convert(&pbg, None, &dcp, Format::Distcp, &options(Format::Distcp)).unwrap();
    let back = dir.path().join("back");
    let peak = pool.install(|| {
        peak_growth(|| {
            ckpt::convert(&dcp, None, &back, Format::Pbg, &options(Format::Pbg)).unwrap();
        })
    });
    println!("distcp → pbg of 3 partitions of {} MiB: {:.1} MiB", PART / MIB, peak as f64 / MIB as f64);
    assert!(peak <= PART_BOUND, "{peak} > {PART_BOUND}");
    let (a, b) = (ckpt::open(&pbg).unwrap(), ckpt::open(&back).unwrap());
    let embeddings: Vec<String> = a
        .entries()
        .into_iter()
        .filter(|e| e.tensor_info().is_some() && e.name.starts_with("embeddings/"))
        .map(|e| e.name)
        .collect();
    assert_eq!(embeddings.len(), 3, "{embeddings:?}");
    for name in embeddings {
        let (ta, tb) = (a.tensor(&name).unwrap(), b.tensor(&name).unwrap());
        assert_eq!(ta.data().unwrap(), tb.data().unwrap(), "{name}");
    }
}

/// A ZeRO 3 checkpoint of `params` float32 parameters of `LARGEST` bytes over 2 ranks, laid out as
/// DeepSpeed 0.19 writes it (each parameter split in halves, one in each rank's flat group; Adam's state
/// beside it), under `root/global_step1` with `latest`.
fn write_zero3(root: &Path, params: usize) {
    let tag = root.join("global_step1");
    std::fs::create_dir_all(&tag).unwrap();
    std::fs::write(root.join("latest"), "global_step1").unwrap();
    let numel = LARGEST / 4;
    let shapes = Value::dict(
        (0..params)
            .map(|i| (format!("layers.{i}.weight"), Value::Size(vec![4096, 1024])))
            .collect::<Vec<_>>()
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone())),
    );
    for rank in 0..2usize {
        let half = |seed: usize| f32_tensor(params * numel / 2, seed * 2 + rank, &[params * numel / 2]);
        let model = Value::dict([
            ("module", Value::dict::<&str>([])),
            ("buffer_names", Value::List(Vec::new())),
            ("param_shapes", Value::List(vec![shapes.clone()])),
            ("shared_params", Value::dict::<&str>([])),
            ("frozen_param_shapes", Value::None),
            ("ds_version", Value::Str("0.19.8".into())),
        ]);
        let file = tag.join(format!("zero_pp_rank_{rank}_mp_rank_00_model_states.pt"));
        ckpt::torch::save(&model, &file, &ckpt::torch::WriteOptions::default()).unwrap();
        let state = Value::dict([(
            "0",
            Value::dict([
                ("step", Value::Tensor(Tensor::from_slice(&[1.0f32], &[]).unwrap())),
                ("exp_avg", Value::Tensor(half(1))),
                ("exp_avg_sq", Value::Tensor(half(2))),
            ]),
        )]);
        let Value::Dict(mut state) = state else { unreachable!() };
        state.items[0].0 = Value::Int(0); // the group index is an int key
        let optim = Value::dict([(
            "optimizer_state_dict",
            Value::dict([
                ("zero_stage", Value::Int(3)),
                ("partition_count", Value::Int(2)),
                (
                    "optimizer_state_dict",
                    Value::dict([("state", Value::Dict(state)), ("param_groups", Value::List(Vec::new()))]),
                ),
                ("fp32_flat_groups", Value::List(vec![Value::Tensor(half(0))])),
            ]),
        )]);
        let file = tag.join(format!("bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"));
        ckpt::torch::save(&optim, &file, &ckpt::torch::WriteOptions::default()).unwrap();
    }
}

/// DeepSpeed ZeRO 3 (2 ranks, 10 parameters of `LARGEST` bytes, each split over both ranks' files) to
/// Hugging Face shards, as it is and cast to bfloat16: every parameter is made from the ranks' windows
/// when the writer streams it, so the conversion holds at most one parameter plus 64 MiB.
#[test]
fn deepspeed_zero3_to_hf_holds_at_most_the_largest_parameter_plus_64_mib() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("zero3");
    write_zero3(&src, DENSE);
    let mut measured = Vec::new();
    for dtype in [None, Some(ckpt::DType::BF16)] {
        let dst = dir.path().join(format!("hf{dtype:?}"));
        // The weights alone (the optimizer state would be made piece by piece as well, but holds twice the bytes).
        let mut options = options(Format::Hf).with_source(ckpt::SourceOptions::default().with_model_only(true));
        if let Some(d) = dtype {
            options = options.with_selection(ckpt::Selection::default().with_dtype(d));
        }
        let peak = pool.install(|| {
            peak_growth(|| {
                ckpt::convert(&src, None, &dst, Format::Hf, &options).unwrap();
            })
        });
        let back = ckpt::open(&dst).unwrap();
        assert_eq!(back.entries().len(), DENSE);
        measured.push(Measured { from: "deepspeed zero3 (2 ranks)".into(), to: format!("hf {dtype:?}"), peak });
        remove(&dst);
    }
    let table = table(&measured);
    println!("{table}");
    assert!(measured.iter().all(|m| m.peak <= BOUND), "{table}");
}

/// Read limits other than the defaults, generous enough for the generated checkpoints: a conversion under
/// them reads through the same path as under the defaults (issue 40).
fn other_limits() -> ckpt::ReadLimits {
    ckpt::ReadLimits::default()
        .with_max_header_bytes(1 << 20)
        .with_max_metadata_bytes(64 << 20)
        .with_max_inflated_bytes(1 << 30)
}

/// The conversions of issue 40's side path (distcp to torch, safetensors and hf, torch to distcp), each
/// with `options(to)` changed by `change`.
const SIDE_PATHS: [(Format, Format); 4] = [
    (Format::Distcp, Format::Torch),
    (Format::Distcp, Format::Safetensors),
    (Format::Distcp, Format::Hf),
    (Format::Torch, Format::Distcp),
];

/// Every file under `path` (itself, for a file) with its bytes, by its path under `path`, sorted.
fn files_of(path: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    if path.is_file() {
        return vec![(PathBuf::new(), std::fs::read(path).unwrap())];
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(path).unwrap() {
        let p = entry.unwrap().path();
        let name = PathBuf::from(p.file_name().unwrap());
        out.extend(files_of(&p).into_iter().map(|(rel, bytes)| (name.join(rel), bytes)));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// A safetensors file's header, parsed, and the bytes after it.
fn safetensors_parts(file: &[u8]) -> (serde_json::Value, &[u8]) {
    let len = usize::try_from(u64::from_le_bytes(file[..8].try_into().unwrap())).unwrap();
    (serde_json::from_slice(&file[8..8 + len]).unwrap(), &file[8 + len..])
}

/// The state dict as a 2-rank distcp checkpoint and a torch file in `dir`: (distcp, torch).
fn side_path_sources(dir: &Path) -> (PathBuf, PathBuf) {
    let pt = dir.join("dense.pt");
    ckpt::torch::save(&state_dict(), &pt, &ckpt::torch::WriteOptions::default()).unwrap();
    let dcp = dir.join("dense_dcp");
    ckpt::convert(&pt, None, &dcp, Format::Distcp, &options(Format::Distcp)).unwrap();
    (dcp, pt)
}

/// Issue 40: every conversion goes through its target's writer whatever the options, so one with fsync and
/// checksums off and other read limits holds the same bounded heap as one with the defaults (the
/// streaming conversions of old were taken with the defaults only; other options read the source whole).
#[test]
fn non_default_durability_and_limits_hold_the_same_bound_as_the_defaults() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (dcp, pt) = side_path_sources(dir.path());
    let durabilities = [
        ("defaults", ckpt::io::Durability::default(), ckpt::ReadLimits::default()),
        ("no sync, other limits", ckpt::io::Durability::default().with_sync(false), other_limits()),
        (
            "no sync, no checksums, other limits",
            ckpt::io::Durability::default().with_sync(false).with_checksums(false),
            other_limits(),
        ),
    ];
    let mut measured = Vec::new();
    let mut peaks_by_pair = Vec::new();
    for (from, to) in SIDE_PATHS {
        let src = if from == Format::Distcp { &dcp } else { &pt };
        let mut peaks = Vec::new();
        for (label, durability, limits) in &durabilities {
            let dst = path_for(dir.path(), &format!("{from}_to_{to}"), to);
            let options = options(to).with_durability(*durability).with_limits(*limits);
            let peak = pool.install(|| {
                peak_growth(|| {
                    ckpt::convert(src, None, &dst, to, &options).unwrap_or_else(|e| panic!("{from} → {to}: {e}"));
                })
            });
            remove(&dst);
            peaks.push(peak);
            measured.push(Measured { from: from.to_string(), to: format!("{to} ({label})"), peak });
        }
        peaks_by_pair.push((format!("{from} → {to}"), peaks));
    }
    let table = table(&measured);
    println!("{table}");
    // The same path: no option costs more than a write buffer's worth beyond the defaults.
    for (pair, peaks) in &peaks_by_pair {
        let (default, others) = peaks.split_first().unwrap();
        for p in others {
            assert!(*p <= default + 16 * MIB, "{pair}: {p} against {default} under the defaults\n{table}");
        }
    }
    assert_eq!(measured.len(), SIDE_PATHS.len() * durabilities.len());
    assert!(measured.iter().all(|m| m.peak <= BOUND), "over {} MiB:\n{table}", BOUND / MIB);
}

/// Issue 40: durability is how a conversion is written, not what: without fsync and under other read limits
/// (checksums kept, which are part of what is written), every conversion of the side path writes the
/// same bytes as with the defaults.
#[test]
fn no_sync_and_other_limits_write_the_same_bytes_as_the_defaults() {
    // Its conversions' heap is not measured, but would count in another test's measure.
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (dcp, pt) = side_path_sources(dir.path());
    // The same file name in two directories: a torch file's archive is named after its file.
    let (defaults, others) = (dir.path().join("defaults"), dir.path().join("others"));
    std::fs::create_dir(&defaults).unwrap();
    std::fs::create_dir(&others).unwrap();
    for (from, to) in SIDE_PATHS {
        let src = if from == Format::Distcp { &dcp } else { &pt };
        let default = path_for(&defaults, &format!("{from}_to_{to}"), to);
        ckpt::convert(src, None, &default, to, &options(to)).unwrap();
        let other = path_for(&others, &format!("{from}_to_{to}"), to);
        let options = options(to)
            .with_durability(ckpt::io::Durability::default().with_sync(false).with_direct_io(false))
            .with_limits(other_limits());
        ckpt::convert(src, None, &other, to, &options).unwrap();
        let (a, b) = (files_of(&default), files_of(&other));
        assert!(!a.is_empty());
        assert_eq!(a.iter().map(|f| &f.0).collect::<Vec<_>>(), b.iter().map(|f| &f.0).collect::<Vec<_>>());
        for ((name, x), (_, y)) in a.iter().zip(&b) {
            let (x, y) = if to == Format::Safetensors || name.extension().is_some_and(|e| e == "safetensors") {
                // The `__metadata__` map is written in hash order (as the `safetensors` crate writes it),
                // which differs between any two runs: the header is compared as JSON, the data as bytes.
                let (hx, dx) = safetensors_parts(x);
                let (hy, dy) = safetensors_parts(y);
                assert_eq!(hx, hy, "{from} → {to}: {} header", name.display());
                (dx, dy)
            } else {
                (x.as_slice(), y.as_slice())
            };
            let at = x.iter().zip(y).position(|(a, b)| a != b).unwrap_or(x.len().min(y.len()));
            let around =
                |v: &[u8]| String::from_utf8_lossy(&v[at.saturating_sub(60)..(at + 60).min(v.len())]).into_owned();
            assert!(
                x == y,
                "{from} → {to}: {} differs at byte {at}: {:?} against {:?}",
                name.display(),
                around(x),
                around(y)
            );
        }
        remove(&default);
        remove(&other);
    }
}
