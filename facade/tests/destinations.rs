//! A destination is a checkpoint of the target format, or it is new (issue 41, point 1): every target
//! format written over each kind of thing that can stand at a destination, with and without
//! `overwrite`: refused with [`Error::DestinationTaken`] naming what is there, or written with exactly the
//! files a write to a new path gives (nothing stale, nothing merged), and read back.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use ckpt::tensor::{Tensor, Value};
use ckpt::{ConvertOptions, Error, Format, TargetOptions};
use ckpt_conformance::fixtures;

/// The target formats ckpt writes.
const TARGETS: [Format; 8] = [
    Format::Torch,
    Format::Safetensors,
    Format::Gguf,
    Format::Distcp,
    Format::Hfai,
    Format::Hf,
    Format::Recis,
    Format::Pbg,
];

fn state_dict() -> Value {
    let rows: Vec<f32> = (0..24).map(|i| i as f32).collect();
    Value::dict([
        ("a", Value::Tensor(Tensor::from_slice(&rows, &[12, 2]).unwrap())),
        ("b", Value::Tensor(Tensor::from_slice(&rows[..12], &[12]).unwrap())),
    ])
}

/// Options writing `to` in its smallest (`more` false) or a larger layout: more ranks, parts or shards.
fn options(to: Format, more: bool) -> ConvertOptions {
    let o = ConvertOptions::default().with_world_size(if more { 3 } else { 1 });
    match to {
        Format::Hf => o
            .with_world_size(1)
            .with_target(TargetOptions::Hf { max_shard_size: Some(if more { 40 } else { 1 << 30 }) }),
        Format::Recis => o.with_world_size(if more { 4 } else { 2 }),
        Format::Pbg => o.with_world_size(1),
        _ => o,
    }
}

/// Writes a checkpoint of `to` at `dst` (`more`: with more ranks, parts or shards), through `ckpt::save` or,
/// for the formats whose layout needs a source of their own (RecIS tables, PBG partitions), `ckpt::convert`.
fn write(to: Format, dst: &Path, more: bool, overwrite: bool) -> Result<ckpt::ConvertSummary, Error> {
    let o = options(to, more).with_overwrite(overwrite);
    match to {
        Format::Recis => ckpt::convert(fixtures("recis").join("golden/two_shard_adamw"), None, dst, to, &o),
        Format::Pbg => ckpt::convert(fixtures("pbg").join("ckpt"), None, dst, to, &o),
        _ => ckpt::save(&state_dict(), dst, to, &o),
    }
}

/// The names at `path`: a file's own name, a directory's entries (recursively, relative).
fn listing(path: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            out.insert(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            if p.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    if path.is_dir() {
        walk(path, path, &mut out);
    } else {
        out.insert(format!("<file {}>", path.file_name().unwrap().to_string_lossy()));
    }
    out
}

/// What a write of `to` to a new path gives.
fn reference(to: Format, work: &Path) -> BTreeSet<String> {
    let dst = work.join(format!("ref-{to}"));
    write(to, &dst, false, false).unwrap();
    let l = listing(&dst);
    std::fs::remove_dir_all(&dst).or_else(|_| std::fs::remove_file(&dst)).unwrap();
    l.into_iter().map(|n| n.replace(&format!("ref-{to}"), "dst")).collect()
}

/// A kind of thing standing at the destination: its label, how to make it, and what the refusal says is
/// there (`None`: the write goes ahead without `overwrite`).
struct Standing {
    label: String,
    make: Box<dyn Fn(&Path)>,
    refused: Option<String>,
}

fn standings(to: Format) -> Vec<Standing> {
    let one_file = matches!(to, Format::Torch | Format::Safetensors | Format::Gguf);
    let mut out = vec![
        Standing { label: "nothing".into(), make: Box::new(|_| {}), refused: None },
        Standing {
            label: "an empty directory".into(),
            make: Box::new(|p| std::fs::create_dir(p).unwrap()),
            refused: one_file.then(|| "an empty directory".into()),
        },
        Standing {
            label: "a text file".into(),
            make: Box::new(|p| std::fs::write(p, "precious notes\n").unwrap()),
            refused: Some("a text file (starts with \"precious notes\")".into()),
        },
        Standing {
            label: "a binary file".into(),
            make: Box::new(|p| std::fs::write(p, [0u8, 1, 2, 3, 0xff, 0xfe, 0, 9]).unwrap()),
            refused: Some("binary data of no format ckpt knows (first bytes 00 01 02 03 ff fe 00 09)".into()),
        },
        Standing {
            label: "a directory of other files".into(),
            make: Box::new(|p| {
                std::fs::create_dir(p).unwrap();
                for n in ["notes.txt", "a.bin", "b.bin", "c.bin"] {
                    std::fs::write(p.join(n), "x").unwrap();
                }
            }),
            refused: Some("a directory of 4 files that is not a checkpoint (a.bin, b.bin, c.bin, ...)".into()),
        },
        Standing {
            label: format!("a {to} checkpoint with more ranks, parts or shards"),
            make: Box::new(move |p| {
                write(to, p, true, false).unwrap();
            }),
            refused: None,
        },
    ];
    for other in TARGETS.into_iter().filter(|&f| f != to) {
        let article = if other.name().starts_with(['a', 'e', 'i', 'o', 'u', 'h']) { "an" } else { "a" };
        out.push(Standing {
            label: format!("{article} {other} checkpoint"),
            make: Box::new(move |p| {
                write(other, p, false, false).unwrap();
            }),
            refused: Some(format!("{article} {other} checkpoint")),
        });
    }
    out
}

#[test]
fn every_target_over_everything_that_can_stand_at_a_destination() {
    let work = tempfile::tempdir().unwrap();
    for to in TARGETS {
        let fresh = reference(to, work.path());
        for (i, standing) in standings(to).into_iter().enumerate() {
            for overwrite in [false, true] {
                let case = format!("{to} over {} (overwrite {overwrite})", standing.label);
                let parent = work.path().join(format!("{to}-{i}-{overwrite}"));
                std::fs::create_dir(&parent).unwrap();
                let dst = parent.join("dst");
                (standing.make)(&dst);
                let before = (dst.exists()).then(|| listing(&dst));
                let result = write(to, &dst, false, overwrite);
                match (&standing.refused, overwrite) {
                    (Some(what), false) => {
                        let e = result.err().unwrap_or_else(|| panic!("{case}: written"));
                        match &e {
                            Error::DestinationTaken { path, what: said, to: t } => {
                                assert_eq!((path.as_path(), said, *t), (dst.as_path(), what, to), "{case}");
                            }
                            other => panic!("{case}: {other}"),
                        }
                        assert_eq!(e.fault(), ckpt::Fault::InvalidArgument, "{case}");
                        let message = e.to_string();
                        assert_eq!(message.matches(&dst.display().to_string()).count(), 1, "{case}: {message}");
                        assert!(message.contains(what) && message.contains("--overwrite"), "{case}: {message}");
                        assert_eq!(Some(listing(&dst)), before, "{case}: the destination changed");
                    }
                    _ => {
                        result.unwrap_or_else(|e| panic!("{case}: {e}"));
                        assert_eq!(listing(&dst), fresh, "{case}: not the files of a fresh write");
                        let ck = ckpt::open(&dst).unwrap_or_else(|e| panic!("{case}: {e}"));
                        assert_eq!(ck.format(), to, "{case}");
                        assert!(!ck.entries().is_empty(), "{case}");
                    }
                }
                // Nothing left beside the destination: no staging path, no old copy.
                let beside: Vec<String> = std::fs::read_dir(&parent)
                    .unwrap()
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .filter(|n| n != "dst" && !n.ends_with("ckpt-lock"))
                    .collect();
                assert!(beside.is_empty(), "{case}: left beside the destination: {beside:?}");
            }
        }
    }
}

#[test]
fn a_directory_path_for_a_one_file_format_says_so() {
    let work = tempfile::tempdir().unwrap();
    for to in [Format::Torch, Format::Safetensors, Format::Gguf] {
        let dst = PathBuf::from(format!("{}/newdir/", work.path().display()));
        let e = ckpt::save(&state_dict(), &dst, to, &ConvertOptions::default()).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{to}: {e:?}");
        let message = e.to_string();
        assert_eq!(message.matches("newdir").count(), 2, "{message}"); // the path, and the file to name in it
        assert!(message.contains("is one file") && message.contains("directory format"), "{message}");
        assert!(!dst.exists());
    }
}

#[test]
fn reshard_writes_over_a_checkpoint_of_its_format_and_refuses_the_rest() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    write(Format::Distcp, &src, true, false).unwrap();
    let fresh = {
        let dst = work.path().join("fresh");
        ckpt::reshard(&src, &dst, 2).unwrap();
        listing(&dst)
    };
    // Over a DCP with more ranks: replaced, no stale rank files.
    let dst = work.path().join("dst");
    write(Format::Distcp, &dst, true, false).unwrap();
    std::fs::write(work.path().join("notes.txt"), "x").unwrap();
    ckpt::reshard(&src, &dst, 2).unwrap();
    assert_eq!(listing(&dst), fresh);
    // Over a directory of other files: refused, then replaced with `overwrite`.
    let other = work.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), "x").unwrap();
    let e = ckpt::reshard(&src, &other, 2).unwrap_err();
    assert!(matches!(&e, Error::DestinationTaken { what, .. } if what.contains("notes.txt")), "{e}");
    let options = ckpt::ReshardOptions::default().with_overwrite(true);
    ckpt::reshard_with_options(&src, &other, 2, &options).unwrap();
    assert_eq!(listing(&other), fresh);
    // Over an hfai checkpoint: refused; over a file with `overwrite`: a directory replaces it.
    let hfai = work.path().join("hfai");
    write(Format::Hfai, &hfai, false, false).unwrap();
    let e = ckpt::reshard(&src, &hfai, 2).unwrap_err();
    assert!(matches!(&e, Error::DestinationTaken { what, .. } if what == "an hfai checkpoint"), "{e}");
    let file = work.path().join("file");
    std::fs::write(&file, "x").unwrap();
    ckpt::reshard_with_options(&src, &file, 2, &options).unwrap();
    assert_eq!(listing(&file), fresh);
}

#[test]
fn convert_in_checks_the_destination_on_every_process() {
    use ckpt::collective::ThreadGroup;
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("m.pt");
    write(Format::Torch, &src, false, false).unwrap();
    let dst = work.path().join("dst");
    std::fs::create_dir(&dst).unwrap();
    std::fs::write(dst.join("notes.txt"), "x").unwrap();
    let run = |overwrite: bool| -> Vec<Result<ckpt::ConvertSummary, Error>> {
        let options = ConvertOptions::default().with_world_size(2).with_overwrite(overwrite);
        std::thread::scope(|s| {
            let handles: Vec<_> = ThreadGroup::new(2)
                .into_iter()
                .map(|g| {
                    let (src, dst, options) = (&src, &dst, &options);
                    s.spawn(move || ckpt::convert_in(src, None, dst, Format::Distcp, options, &g))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    for r in run(false) {
        let e = r.unwrap_err();
        assert_eq!(e.fault(), ckpt::Fault::InvalidArgument);
        assert!(e.to_string().contains("notes.txt"), "{e}");
    }
    for r in run(true) {
        r.unwrap();
    }
    assert!(!dst.join("notes.txt").exists());
    assert!(dst.join(".metadata").exists() && dst.join("__1_0.distcp").exists());
}

#[test]
fn hf_shards_go_into_a_model_directory_waiting_for_its_weights() {
    // config.json and the tokenizer's files, as transformers writes them before the weights: the shards go in
    // beside them, which stay; a file of another kind there is still refused.
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("model");
    std::fs::create_dir(&dst).unwrap();
    for name in ["config.json", "tokenizer.json", "generation_config.json"] {
        std::fs::write(dst.join(name), "{}").unwrap();
    }
    write(Format::Hf, &dst, false, false).unwrap();
    let names = listing(&dst);
    for name in ["config.json", "tokenizer.json", "generation_config.json", "model.safetensors"] {
        assert!(names.contains(name), "{name}: {names:?}");
    }
    assert_eq!(ckpt::open(&dst).unwrap().format(), Format::Hf);
    let other = tmp.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("config.json"), "{}").unwrap();
    std::fs::write(other.join("notes.txt"), "mine").unwrap();
    assert!(matches!(write(Format::Hf, &other, false, false), Err(Error::DestinationTaken { .. })));
    // For another target, config.json alone is a directory that is not a checkpoint.
    let dcp = tmp.path().join("dcp");
    std::fs::create_dir(&dcp).unwrap();
    std::fs::write(dcp.join("config.json"), "{}").unwrap();
    assert!(matches!(write(Format::Distcp, &dcp, false, false), Err(Error::DestinationTaken { .. })));
}
