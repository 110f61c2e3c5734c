//! The per-rank save path from a Rust training program (`examples/train_ranks.rs`, run here in-process):
//! ranks as threads save through `RankSave` with the ticket and reports exchanged over a `ThreadGroup`,
//! load back their own boxes in jobs of the same and of other sizes, a failing rank fails the save on
//! every rank and leaves the previous checkpoint, and torch's own `dcp.load` (`FileSystemReader`) and
//! `dcp_to_torch_save` load what it wrote, equal to the whole state.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[allow(dead_code)] // the example's `main` and command-line parts
#[path = "../examples/train_ranks.rs"]
mod train_ranks;

use std::path::Path;

use ckpt::collective::Collective;
use ckpt::io::failpoint::{self, Action, Config};
use ckpt_conformance::run_python;
use train_ranks::{Message, load, on_threads, save, state};

fn save_on(world: usize, dir: &Path, step: i64) -> Vec<Result<(), train_ranks::Failure>> {
    on_threads(world, |g| save(g, dir, &state(g.rank(), world, step)?))
}

fn load_on(world: usize, dir: &Path, step: i64) -> usize {
    on_threads(world, |g| load(dir, &state(g.rank(), world, step)?)).into_iter().map(|r| r.unwrap()).sum()
}

#[test]
fn ranks_save_their_shards_and_load_their_own_boxes_in_jobs_of_any_size() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("step-3");
    for r in save_on(3, &dir, 3) {
        r.unwrap();
    }
    let mut files: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    files.sort();
    assert!(files.contains(&".metadata".to_owned()), "{files:?}");
    for r in 0..3 {
        assert!(files.contains(&format!("__{r}_0.distcp")), "{files:?}");
    }
    // Every value, by each rank of jobs of 3, 2 and 5 ranks (boxes read where other ranks wrote them).
    let whole = 2 * train_ranks::ROWS * train_ranks::D + train_ranks::D * 3 + 1;
    for world in [3, 2, 5] {
        let checked = load_on(world, &dir, 3);
        let replicated = (world - 1) * (train_ranks::D * 3 + 1);
        assert_eq!(checked, whole + replicated, "{world} ranks");
    }
    assert!(ckpt::verify(&dir).unwrap().is_ok());

    // A second save over it (4 ranks), then a failing rank: every rank fails, naming it; step 4 stays.
    for r in save_on(4, &dir, 4) {
        r.unwrap();
    }
    load_on(2, &dir, 4);
    let outcomes = on_threads(2, |g| {
        if g.rank() == 1 {
            failpoint::configure(Some(Config::armed("file.sync", Action::Error)));
        }
        let r = save(g, &dir, &state(g.rank(), 2, 5)?);
        failpoint::configure(None);
        r
    });
    for (rank, r) in outcomes.iter().enumerate() {
        let e = r.as_ref().expect_err("a save with a failing rank must fail on every rank").to_string();
        assert!(e.contains("injected failure at file.sync"), "rank {rank}: {e}");
    }
    load_on(3, &dir, 4);
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["step-3"], "nothing but the checkpoint beside it");
}

#[test]
fn messages_round_trip_and_bad_ones_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ck");
    let own = state(0, 1, 1).unwrap();
    let save = ckpt::distcp::RankSave::begin(&dir, 1, &ckpt::distcp::WriteOptions::default()).unwrap();
    let items: Vec<_> = own
        .iter()
        .map(|s| ckpt::distcp::RankItem {
            fqn: s.fqn.to_owned(),
            offsets: Some(s.offsets.clone()),
            data: ckpt::distcp::ItemData::Tensor(&s.local),
        })
        .collect();
    let infos = save.write(&items).unwrap();
    let report = save.report(Ok(())).unwrap();
    save.abort();
    let placed: Vec<_> = own
        .iter()
        .zip(infos)
        .map(|(s, info)| train_ranks::Placed {
            fqn: s.fqn.to_owned(),
            size: s.size.clone(),
            offsets: s.offsets.clone(),
            sizes: s.local.shape().to_vec(),
            dtype: s.local.dtype(),
            info,
        })
        .collect();
    let m = Message { report, items: Ok(placed) };
    assert_eq!(Message::from_bytes(&m.to_bytes()).unwrap(), m);
    let failed = Message { report: Vec::new(), items: Err("disk on fire".into()) };
    assert_eq!(Message::from_bytes(&failed.to_bytes()).unwrap(), failed);
    assert!(Message::from_bytes(b"\x05\0\0").is_err());
    assert!(Message::from_bytes(&[9, 0, 0, 0, 0, 0, 0, 0, 1]).is_err());
    let md = train_ranks::metadata(std::slice::from_ref(&m));
    assert_eq!(md.state_dict_metadata.len(), 4);
    assert_eq!(md.storage_data.len(), 4);
}

#[test]
fn torch_loads_what_the_ranks_wrote() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("step-7");
    for r in save_on(3, &dir, 7) {
        r.unwrap();
    }
    let expected = tmp.path().join("expected.pt");
    ckpt::torch::save(&train_ranks::full_state(7).unwrap(), &expected, &ckpt::torch::WriteOptions::default()).unwrap();
    let jobs = serde_json::json!([{
        "kind": "dcp", "name": "train_ranks (3 ranks, RankSave)",
        "dir": dir.to_str().unwrap(), "expected": expected.to_str().unwrap(),
    }]);
    let jobs_path = tmp.path().join("jobs.json");
    std::fs::write(&jobs_path, serde_json::to_vec(&jobs).unwrap()).unwrap();
    let out = run_python("distcp/check_load.py", &[&jobs_path]);
    assert!(out.contains("1/1 jobs passed"), "{out}");
}
