//! `convert_in` and `reshard_in` with threads standing in for the processes of a job: the files are those of
//! one process, byte for byte (the same calls under mpirun: `tests/mpi.rs`).
#![allow(clippy::unwrap_used)]

use std::path::Path;

use ckpt::collective::ThreadGroup;
use ckpt::tensor::{Tensor, Value};
use ckpt::{ConvertOptions, Format, convert_in, reshard_in};

fn files(d: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap())
        })
        .collect();
    v.sort();
    v
}

/// The same calls with threads standing in for processes (2 and 5 of them: more than the ranks, shards or
/// partition files) write what one process writes, byte for byte, for every split target.
#[test]
fn processes_as_threads_write_what_one_process_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let pt = tmp.path().join("m.pt");
    let w = Tensor::from_slice(&(0..60).map(|i| i as f32).collect::<Vec<_>>(), &[10, 6]).unwrap();
    let sd = Value::dict([
        (
            "model",
            Value::dict([
                ("w", Value::Tensor(w)),
                ("b", Value::Tensor(Tensor::from_slice(&[1.0f32; 3], &[3]).unwrap())),
            ]),
        ),
        ("epoch", Value::Int(3)),
    ]);
    ckpt::torch::save(&sd, &pt, &ckpt::torch::WriteOptions::default()).unwrap();
    let options = ConvertOptions::default().with_world_size(4);
    let one_dcp = tmp.path().join("one_dcp");
    ckpt::convert(&pt, None, &one_dcp, Format::Distcp, &options).unwrap();
    let one_hfai = tmp.path().join("one_hfai");
    ckpt::convert(&pt, None, &one_hfai, Format::Hfai, &options).unwrap();
    let one_re = tmp.path().join("one_re");
    ckpt::reshard(&one_dcp, &one_re, 3).unwrap();
    // RecIS (resharded from its files, and laid out from a torch source), PBG, hfai reshards.
    let recis = ckpt_conformance::fixtures("recis").join("golden").join("two_shard_adamw");
    let pbg = ckpt_conformance::fixtures("pbg").join("ckpt");
    let recis_pt = tmp.path().join("recis.pt");
    ckpt::convert(&recis, None, &recis_pt, Format::Torch, &ConvertOptions::default()).unwrap();
    let three = ConvertOptions::default().with_world_size(3);
    let one_recis = tmp.path().join("one_recis");
    ckpt::convert(&recis, None, &one_recis, Format::Recis, &three).unwrap();
    let one_recis_pt = tmp.path().join("one_recis_pt");
    ckpt::convert(&recis_pt, None, &one_recis_pt, Format::Recis, &three).unwrap();
    let one_pbg = tmp.path().join("one_pbg");
    ckpt::convert(&pbg, None, &one_pbg, Format::Pbg, &ConvertOptions::default()).unwrap();
    let one_recis_re = tmp.path().join("one_recis_re");
    ckpt::reshard(&recis, &one_recis_re, 3).unwrap();
    let one_hfai_re = tmp.path().join("one_hfai_re");
    ckpt::reshard(&one_hfai, &one_hfai_re, 3).unwrap();
    for processes in [2, 5] {
        let out = |name: &str| tmp.path().join(format!("{name}{processes}"));
        std::thread::scope(|s| {
            for g in ThreadGroup::new(processes) {
                let (pt, options, out, one_dcp) = (&pt, &options, &out, &one_dcp);
                let (recis, recis_pt, pbg, three, one_hfai) = (&recis, &recis_pt, &pbg, &three, &one_hfai);
                s.spawn(move || {
                    convert_in(pt, None, &out("dcp"), Format::Distcp, options, &g).unwrap();
                    convert_in(pt, None, &out("hfai"), Format::Hfai, options, &g).unwrap();
                    reshard_in(one_dcp, &out("re"), 3, &g).unwrap();
                    convert_in(recis, None, &out("recis"), Format::Recis, three, &g).unwrap();
                    convert_in(recis_pt, None, &out("recis_pt"), Format::Recis, three, &g).unwrap();
                    convert_in(pbg, None, &out("pbg"), Format::Pbg, &ConvertOptions::default(), &g).unwrap();
                    reshard_in(recis, &out("recis_re"), 3, &g).unwrap();
                    reshard_in(one_hfai, &out("hfai_re"), 3, &g).unwrap();
                    // A failure on rank 0's checks reaches every process.
                    let e = reshard_in(one_dcp, pt, 3, &g).unwrap_err();
                    assert!(e.to_string().contains("a torch checkpoint is there"), "{e}");
                });
            }
        });
        assert_eq!(files(&one_dcp), files(&out("dcp")));
        assert_eq!(files(&one_hfai), files(&out("hfai")));
        assert_eq!(files(&one_re), files(&out("re")));
        for (one, name) in [
            (&one_recis, "recis"),
            (&one_recis_pt, "recis_pt"),
            (&one_pbg, "pbg"),
            (&one_recis_re, "recis_re"),
            (&one_hfai_re, "hfai_re"),
        ] {
            assert!(files(one) == files(&out(name)), "{name} with {processes} processes");
        }
    }
}
