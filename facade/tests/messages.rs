//! Every class of message the `ckpt` tool and the library give over what is not right: a table of input,
//! exit code and the words each message must hold, with the path named once. A file that is not a
//! checkpoint says what it looks like, a directory without marker lists the markers looked for and `--from`,
//! a truncated file says so, a special file is refused at once, an entry not found gets a did-you-mean and a
//! prefix of entries prints the sub-tree; `diff` says how values differ.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ckpt::tensor::{Tensor, Value};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../conformance/fixtures")
}

/// Runs `ckpt args...` (stdin closed), killing it after 60 s so that a hang fails the test instead of
/// blocking it; returns (exit code, stdout, stderr).
fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ckpt"));
    c.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("ckpt {:?} hangs", args.iter().map(|a| a.as_ref().to_owned()).collect::<Vec<_>>());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let code = out.status.code().unwrap_or_else(|| panic!("killed by a signal: {:?}", out.status));
    (code, String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `text` names `path` exactly once.
fn names_once(text: &str, path: &Path) {
    let p = path.display().to_string();
    assert_eq!(text.matches(&p).count(), 1, "{p} should be named once in: {text}");
}

/// One row of the table: what is given, and what the message must say.
struct Case {
    what: &'static str,
    args: Vec<PathBuf>,
    path: PathBuf,
    code: i32,
    says: Vec<String>,
}

/// Writes a small torch.save file and a safetensors file of one tensor and one value.
fn small(dir: &Path) -> (PathBuf, PathBuf) {
    let sd = Value::dict([
        ("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap())),
        ("step", Value::Int(3)),
    ]);
    let pt = dir.join("ok.pt");
    ckpt::torch::save(&sd, &pt, &ckpt::torch::WriteOptions::default()).unwrap();
    let st = dir.join("ok.safetensors");
    let w = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    ckpt::safetensors::write_file(&[("w".to_owned(), w)], None, &st).unwrap();
    (pt, st)
}

/// `src` cut to `len` bytes (or short of its end by `-len`), at `dst`.
fn cut(src: &Path, dst: &Path, keep: impl Fn(usize) -> usize) -> PathBuf {
    let bytes = std::fs::read(src).unwrap();
    std::fs::write(dst, &bytes[..keep(bytes.len())]).unwrap();
    dst.to_path_buf()
}

#[test]
fn every_message_class_names_the_path_once_and_says_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let (pt, st) = small(t);
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let empty = t.join("empty.pt");
    std::fs::write(&empty, b"").unwrap();
    let json = t.join("config.json");
    std::fs::write(&json, b"{\"a\": 1}").unwrap();
    let gz = t.join("model.pt.gz");
    std::fs::write(&gz, b"\x1f\x8b\x08\x00\x00\x00\x00\x00").unwrap();
    let notes = t.join("notes");
    std::fs::create_dir(&notes).unwrap();
    std::fs::write(notes.join("notes.txt"), b"hello").unwrap();
    let empty_dir = t.join("empty_dir");
    std::fs::create_dir(&empty_dir).unwrap();
    let pt_cut = cut(&pt, &t.join("cut.pt"), |n| n - 30);
    let st_head = cut(&st, &t.join("head.safetensors"), |_| 40);
    let st_data = cut(&st, &t.join("data.safetensors"), |n| n - 4);
    let gguf_cut = cut(&fixtures().join("gguf/metadata.gguf"), &t.join("cut.gguf"), |n| n / 2);
    let d215 = fixtures().join("distcp/golden/d215");
    let strs = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let mut cases = vec![
        Case {
            what: "a text file",
            args: vec!["inspect".into(), readme.clone()],
            path: readme.clone(),
            code: 3,
            says: strs(&["not a checkpoint", "this is a text file (starts with \"# ckpt\")", "--from"]),
        },
        Case {
            what: "a text file converted as torch",
            args: vec![
                "convert".into(),
                readme.clone(),
                t.join("out.safetensors"),
                "--from".into(),
                "torch".into(),
                "--to".into(),
                "safetensors".into(),
            ],
            path: readme.clone(),
            code: 3,
            says: strs(&["this is a text file (starts with \"# ckpt\")"]),
        },
        Case {
            what: "an empty file",
            args: vec!["inspect".into(), empty.clone()],
            path: empty.clone(),
            code: 3,
            says: strs(&["not a checkpoint", "this is an empty file"]),
        },
        Case {
            what: "a JSON file",
            args: vec!["inspect".into(), json.clone()],
            path: json.clone(),
            code: 3,
            says: strs(&["this is a JSON file"]),
        },
        Case {
            what: "a gzip file",
            args: vec!["inspect".into(), gz.clone()],
            path: gz.clone(),
            code: 3,
            says: strs(&["this is a gzip file"]),
        },
        Case {
            what: "a directory without marker",
            args: vec!["inspect".into(), notes.clone()],
            path: notes.clone(),
            code: 3,
            says: strs(&[
                "no marker file in the directory",
                ".metadata",
                "PART_*.pt (hfai)",
                "model.safetensors.index.json",
                "latest",
                "tensorkey.json",
                "--from",
            ]),
        },
        Case {
            what: "an empty directory",
            args: vec!["inspect".into(), empty_dir.clone()],
            path: empty_dir.clone(),
            code: 3,
            says: strs(&["the directory is empty", "looked for", "--from"]),
        },
        Case {
            what: "a truncated .pt",
            args: vec!["inspect".into(), pt_cut.clone()],
            path: pt_cut.clone(),
            code: 3,
            says: vec![
                "the file is truncated".into(),
                format!("({} bytes;", std::fs::metadata(&pt_cut).unwrap().len()),
            ],
        },
        Case {
            what: "a safetensors file cut in its header",
            args: vec!["inspect".into(), st_head.clone()],
            path: st_head.clone(),
            code: 3,
            says: strs(&["runs past the end", "the file is truncated"]),
        },
        Case {
            what: "a safetensors file cut in its data",
            args: vec!["inspect".into(), st_data.clone()],
            path: st_data.clone(),
            code: 3,
            says: strs(&["run past the", "the file is truncated?"]),
        },
        Case {
            what: "a truncated GGUF file",
            args: vec!["inspect".into(), gguf_cut.clone()],
            path: gguf_cut.clone(),
            code: 3,
            says: strs(&["truncated"]),
        },
        Case {
            what: "a misspelled entry",
            args: vec!["cat".into(), d215.clone(), "ro".into()],
            path: d215.clone(),
            code: 2,
            says: strs(&["no entry \"ro\"", "did you mean: row?"]),
        },
        Case {
            what: "a misspelled prefix",
            args: vec!["cat".into(), fixtures().join("values/lightning.ckpt"), "state_dic".into()],
            path: fixtures().join("values/lightning.ckpt"),
            code: 2,
            says: strs(&["no entry \"state_dic\"", "did you mean: state_dict,"]),
        },
    ];
    #[cfg(unix)]
    {
        let fifo = t.join("fifo");
        let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        for command in ["inspect", "verify"] {
            cases.push(Case {
                what: "a named pipe",
                args: vec![command.into(), fifo.clone()],
                path: fifo.clone(),
                code: 2,
                says: strs(&["this is a named pipe (FIFO), not a checkpoint file or directory"]),
            });
        }
        cases.push(Case {
            what: "a named pipe read as a declared format",
            args: vec![
                "convert".into(),
                fifo.clone(),
                t.join("out.safetensors"),
                "--from".into(),
                "torch".into(),
                "--to".into(),
                "safetensors".into(),
            ],
            path: fifo.clone(),
            code: 2,
            says: strs(&["a named pipe (FIFO)"]),
        });
        cases.push(Case {
            what: "a character device",
            args: vec!["inspect".into(), "/dev/zero".into()],
            path: "/dev/zero".into(),
            code: 2,
            says: strs(&["this is a character device"]),
        });
    }
    for case in &cases {
        let args: Vec<&dyn AsRef<std::ffi::OsStr>> = case.args.iter().map(|a| a as _).collect();
        let (code, out, err) = run(&args);
        assert_eq!(code, case.code, "{}: {out}{err}", case.what);
        for s in &case.says {
            assert!(err.contains(s.as_str()), "{}: {s:?} not in: {err}", case.what);
        }
        names_once(&err, &case.path);
    }
}

#[test]
fn the_library_refuses_special_files_and_names_what_files_look_like() {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    // Detected, or read as torch: what it looks like.
    for e in [ckpt::open(&readme).err().unwrap(), ckpt::open_as(&readme, ckpt::Format::Torch).err().unwrap()] {
        assert!(
            matches!(&e, ckpt::Error::NotACheckpoint { looks_like, .. } if looks_like.starts_with("a text file")),
            "{e:?}"
        );
        assert_eq!(e.fault(), ckpt::Fault::Malformed);
    }
    #[cfg(unix)]
    {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("fifo");
        assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        // Whether detected or declared: refused before any open, which would block.
        for e in [ckpt::open(&fifo).err().unwrap(), ckpt::open_as(&fifo, ckpt::Format::Torch).err().unwrap()] {
            assert!(matches!(e, ckpt::Error::SpecialFile { kind: "a named pipe (FIFO)", .. }), "{e:?}");
            assert_eq!(e.fault(), ckpt::Fault::InvalidArgument);
        }
    }
}

#[test]
fn cat_of_a_prefix_prints_every_entry_under_it() {
    let ckpt = fixtures().join("values/lightning.ckpt");
    let (code, out, err) = run(&[&"cat", &ckpt, &"state_dict"]);
    assert_eq!(code, 0, "{out}{err}");
    let c = ckpt::open(&ckpt).unwrap();
    let under = c.entries_under("state_dict");
    assert!(under.len() > 2, "{under:?}");
    for name in &under {
        assert_eq!(out.matches(&format!("{name}:\n")).count(), 1, "{name} in: {out}");
    }
    // An entry is no prefix; a name under nothing has none.
    assert!(c.entries_under(&under[0]).is_empty());
    assert!(c.entries_under("nothing").is_empty());
    // The library's error for a prefix read as an entry says what is under it.
    let e = c.tensor("state_dict").err().unwrap();
    assert!(matches!(&e, ckpt::Error::NoEntry { under, .. } if *under == c.entries_under("state_dict").len()), "{e:?}");
    assert!(e.to_string().contains("are under it"), "{e}");
}

#[test]
fn diff_says_how_values_and_tensors_differ() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a.pt"), tmp.path().join("b.pt"));
    let sd = |wd: f64, x: f32, name: &str| {
        Value::dict([
            ("w", Value::Tensor(Tensor::from_slice(&[1.0f32, 2.0, 3.0, x, 5.0, 6.0], &[2, 3]).unwrap())),
            ("weight_decay", Value::Float(wd)),
            ("name", Value::Str(name.into())),
        ])
    };
    let long = "x".repeat(100);
    ckpt::torch::save(&sd(0.0, 4.0, "a"), &a, &ckpt::torch::WriteOptions::default()).unwrap();
    ckpt::torch::save(&sd(0.01, 4.5, &long), &b, &ckpt::torch::WriteOptions::default()).unwrap();
    let d = ckpt::diff(&a, &b, &ckpt::DiffOptions::default()).unwrap();
    let w = &d.tensors[0];
    assert_eq!((w.first_index.as_deref(), w.first_values), (Some(&[1, 0][..]), Some((4.0, 4.5))));
    assert_eq!(w.max_abs, 0.5);
    let wd = d.values_differ.iter().find(|v| v.name == "weight_decay").unwrap();
    assert_eq!((&wd.a, &wd.b), (&Value::Float(0.0), &Value::Float(0.01)));
    assert_eq!(d.differences(), 3);
    let (code, out, _) = run(&[&"diff", &a, &b]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("value differs: weight_decay: 0.0 vs 0.01\n"), "{out}");
    assert!(out.contains("first at [1, 0]: 4.0 vs 4.5"), "{out}");
    // Long values shortened.
    let line = out.lines().find(|l| l.starts_with("value differs: name:")).unwrap();
    assert!(line.contains("'a' vs 'xxxx") && line.ends_with("...") && line.len() < 120, "{line}");
    // Equal: zero differences as 0.
    let (code, out, _) = run(&[&"diff", &a, &a, &"--all"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("equal: w: max abs diff 0, max rel diff 0, 0 of 6 elements outside tolerance"), "{out}");
}
