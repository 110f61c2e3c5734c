//! Every format and command through a real S3-compatible server (moto, started on 127.0.0.1 by each test
//! and stopped when it ends), the commit protocol on an object store, and each fault the storage layer
//! classifies, injected by a proxy in front of the server. Nothing here skips: without moto the tests
//! fail and name the set-up command.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

use ckpt::storage::{Location, PutCondition, StorageError, StorageOptions, Store};
use ckpt_conformance::s3::{Fault, FaultProxy, MotoServer, SECRET_KEY};

/// Runs `ckpt args…` against `endpoint` with the standard AWS variables.
fn ckpt(endpoint: &str, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ckpt"));
    for (k, v) in MotoServer::env(endpoint) {
        c.env(k, v);
    }
    c.args(args).output().expect("run ckpt")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[track_caller]
fn ok(endpoint: &str, args: &[&str]) -> String {
    let out = ckpt(endpoint, args);
    assert!(out.status.success(), "ckpt {args:?} failed:\n{}", text(&out));
    text(&out)
}

/// Runs a failing command; returns its exit code and output, checking that no secret leaked.
#[track_caller]
fn fails(endpoint: &str, args: &[&str]) -> (i32, String) {
    let out = ckpt(endpoint, args);
    let all = text(&out);
    assert!(!out.status.success(), "ckpt {args:?} should fail:\n{all}");
    assert!(!all.contains(SECRET_KEY), "the secret key leaked:\n{all}");
    (out.status.code().unwrap_or(-1), all)
}

/// A store handle on `url` at `endpoint` (what the tests inspect the bucket with).
fn store(endpoint: &str, url: &str) -> Store {
    let Location::Remote(url) = Location::parse(url).unwrap() else { panic!("{url} is not a URL") };
    Store::open(&url, &options(endpoint)).unwrap()
}

/// The storage options of the AWS variables [`ckpt`] sets for `endpoint`.
fn options(endpoint: &str) -> StorageOptions {
    let mut options = StorageOptions::default();
    for (k, v) in MotoServer::env(endpoint) {
        let key = k.to_ascii_lowercase();
        options = options.with(if key == "aws_endpoint_url" { "aws_endpoint" } else { &key }, &v);
    }
    options
}

fn names(endpoint: &str, url: &str) -> Vec<String> {
    store(endpoint, url).list().unwrap().into_iter().map(|o| o.name).collect()
}

fn fixture(rel: &str) -> String {
    ckpt_conformance::repo_root().join("conformance/fixtures").join(rel).display().to_string()
}

#[test]
fn every_format_round_trips_through_s3() {
    let server = MotoServer::start();
    server.create_bucket("ckpt");
    let e = &server.endpoint();
    let scratch = tempfile::tempdir().unwrap();
    let pt = fixture("torch/checkpoint.pt");
    // (source, URL, format, extra arguments, commit point the bucket must hold)
    let cases: Vec<(String, &str, &str, Vec<&str>, &str)> = vec![
        (pt.clone(), "s3://ckpt/rt/model.pt", "torch", vec![], ""),
        (pt.clone(), "s3://ckpt/rt/model.safetensors", "safetensors", vec![], ""),
        (pt.clone(), "s3://ckpt/rt/hf", "hf", vec!["--max-shard-size", "64"], "model.safetensors.index.json"),
        (fixture("distcp/torch213/m2"), "s3://ckpt/rt/dcp", "distcp", vec![], ".metadata"),
        (fixture("hfai/multi_n2/ckpt"), "s3://ckpt/rt/hfai", "hfai", vec![], "ckpt.checksums.json"),
        (fixture("recis/golden/two_shard_adamw"), "s3://ckpt/rt/recis", "recis", vec![], "index"),
        (fixture("pbg/ckpt"), "s3://ckpt/rt/pbg", "pbg", vec![], "checkpoint_version.txt"),
    ];
    for (src, url, to, extra, commit) in &cases {
        let mut args = vec!["convert", src.as_str(), url, "--to", to, "--verbose"];
        args.extend(extra.iter().copied());
        let said = ok(e, &args);
        assert!(said.contains(&format!("published {url}")), "{said}");
        let listed = names(e, url);
        if commit.is_empty() {
            // A single file: one object, nothing beside it (no lock left).
            let (parent, name) = url.rsplit_once('/').unwrap();
            assert_eq!(names(e, parent).iter().filter(|n| n.starts_with(&format!(".{name}"))).count(), 0);
        } else {
            assert!(listed.iter().any(|n| n == commit), "{url}: no {commit} in {listed:?}");
            assert!(!listed.iter().any(|n| n.contains("ckpt-lock")), "{url}: a lock was left: {listed:?}");
        }
        let inspect = ok(e, &["inspect", url, "--verbose"]);
        assert!(
            inspect.contains(&format!("{to} checkpoint {url}")) || *to == "safetensors" || *to == "hf",
            "{inspect}"
        );
        assert!(inspect.contains("fetched"), "{inspect}");
        ok(e, &["verify", "--deep", url]);
        let same = ok(e, &["diff", src, url]);
        assert!(same.contains("equal"), "{src} against {url}:\n{same}");
        // And back to a local path, from the URL.
        let back = scratch.path().join(format!("back-{to}"));
        let mut args = vec!["convert", url, back.to_str().unwrap(), "--to", to];
        args.extend(extra.iter().copied());
        ok(e, &args);
        assert!(ok(e, &["diff", url, back.to_str().unwrap()]).contains("equal"));
    }
    // inspect fetches what listing needs: a DCP checkpoint's .metadata (and the small manifest), not its
    // data files; the headers of Hugging Face shards.
    for (url, data_suffix) in [("s3://ckpt/rt/dcp", ".distcp"), ("s3://ckpt/rt/hf", ".safetensors")] {
        let objects = store(e, url).list().unwrap();
        let all: u64 = objects.iter().map(|o| o.size).sum();
        let data: u64 = objects.iter().filter(|o| o.name.ends_with(data_suffix)).map(|o| o.size).sum();
        let said = ok(e, &["inspect", url, "--verbose"]);
        let line = fetched_line(&said, url);
        let number = |i: usize, unit: &str| -> u64 {
            line.split(", ").nth(i).and_then(|b| b.strip_suffix(unit)).and_then(|b| b.parse().ok()).unwrap()
        };
        let (fetched, requests) = (number(1, " bytes"), number(2, " requests"));
        if data_suffix == ".distcp" {
            // The metadata, and the bytes of the one object the listing shows (`obj.rank`: its ZIP record).
            assert!(fetched >= all - data && fetched < all - data + 1024, "{url}: {said}");
        } else {
            // One request per object (these shards are smaller than the 64 KiB first read), and a listing.
            assert!(fetched <= all && requests <= objects.len() as u64 + 1, "{url}: {line}");
        }
    }
    // A .pt of 2,000 tensors: inspect fetches its central directory and data.pkl, not its tensors, in a
    // few requests, and lists what the local file lists.
    let many = scratch.path().join("many.pt");
    let entries: Vec<(String, ckpt::Value)> = (0..2000)
        .map(|i| {
            let t = ckpt::Tensor::from_slice(&vec![i as f32; 256], &[16, 16]).unwrap();
            (format!("layer{i}.weight"), ckpt::Value::Tensor(t))
        })
        .collect();
    ckpt::torch::save(&ckpt::Value::dict(entries), &many, &ckpt::torch::WriteOptions::default()).unwrap();
    ok(e, &["convert", many.to_str().unwrap(), "s3://ckpt/rt/many.pt", "--to", "torch"]);
    let said = ok(e, &["inspect", "s3://ckpt/rt/many.pt", "--verbose", "--json"]);
    let line = fetched_line(&said, "s3://ckpt/rt/many.pt");
    let (fetched, requests) = bytes_and_requests(line);
    let size = std::fs::metadata(&many).unwrap().len();
    assert!(fetched * 4 < size && requests <= 16, "{line} of a {size}-byte file");
    let listed = |text: &str| -> serde_json::Value {
        let json: String = text.lines().filter(|l| !l.starts_with("fetched ")).collect::<Vec<_>>().join("\n");
        serde_json::from_str::<serde_json::Value>(&json).unwrap()["entries"].clone()
    };
    assert_eq!(listed(&said), listed(&ok(e, &["inspect", many.to_str().unwrap(), "--json"])));
    // cat of one tensor, reshard from URL to URL, export-tsv to URLs.
    let entry = ok(e, &["inspect", "s3://ckpt/rt/dcp", "--json"]);
    let json: serde_json::Value = serde_json::from_str(
        entry.lines().take_while(|l| !l.starts_with("fetched")).collect::<Vec<_>>().join("\n").as_str(),
    )
    .unwrap_or_else(|err| panic!("{err}: {entry}"));
    let first = json["entries"][0]["name"].as_str().unwrap();
    ok(e, &["cat", "s3://ckpt/rt/dcp", first]);
    ok(e, &["reshard", "s3://ckpt/rt/dcp", "s3://ckpt/rt/dcp3", "--world-size", "3"]);
    assert!(ok(e, &["diff", "s3://ckpt/rt/dcp", "s3://ckpt/rt/dcp3"]).contains("equal"));
    // export-tsv writes to URLs (its source's config names entity files beside the checkpoint, read locally).
    ok(
        e,
        &[
            "export-tsv",
            &fixture("pbg/ckpt"),
            "--entities-output",
            "s3://ckpt/tsv/e.tsv",
            "--relation-types-output",
            "s3://ckpt/tsv/r.tsv",
        ],
    );
    let local_e = scratch.path().join("e.tsv");
    let local_r = scratch.path().join("r.tsv");
    ok(
        e,
        &[
            "export-tsv",
            &fixture("pbg/ckpt"),
            "--entities-output",
            local_e.to_str().unwrap(),
            "--relation-types-output",
            local_r.to_str().unwrap(),
        ],
    );
    let remote = store(e, "s3://ckpt/tsv");
    let got = remote.read("e.tsv", 0..std::fs::metadata(&local_e).unwrap().len()).unwrap();
    assert_eq!(&got[..], &std::fs::read(&local_e).unwrap()[..]);
    // A URL is never a relative path: nothing named `s3:` appears in the working directory.
    assert!(!Path::new("s3:").exists());
}

#[test]
fn commits_on_the_object_store() {
    let server = MotoServer::start();
    server.create_bucket("ckpt");
    let e = &server.endpoint();
    let dcp = fixture("distcp/torch213/m2");
    let url = "s3://ckpt/runs/step-1";
    ok(e, &["convert", &dcp, url, "--to", "distcp"]);
    let first = names(e, url);

    // Another save holds the lock: refused, naming the holder; nothing changed.
    let s = store(e, url);
    let holder = serde_json::json!({ "pid": 1, "host": "another-host", "started": 0 }).to_string();
    s.put(ckpt::storage::LOCK_NAME, holder.into(), PutCondition::Create).unwrap();
    let (code, said) = fails(e, &["convert", &dcp, url, "--to", "distcp"]);
    assert_eq!(code, 4, "{said}");
    assert!(
        said.contains("another save to this destination is in progress") && said.contains("another-host"),
        "{said}"
    );
    // verify names the lock (a warning: the save may still be running).
    let said = ok(e, &["verify", url]);
    assert!(said.contains("warning:") && said.contains("lock of a save"), "{said}");
    s.delete(ckpt::storage::LOCK_NAME).unwrap();

    // A killed save: its lock (a dead process of this host), files uploaded, no commit point. verify
    // lists them; the next save removes them.
    s.delete(".metadata").unwrap();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_owned();
    let dead = serde_json::json!({ "pid": 4_194_304 + 9, "host": host, "started": 0 }).to_string();
    s.put(ckpt::storage::LOCK_NAME, dead.into(), PutCondition::Create).unwrap();
    s.put("__7_0.distcp", bytes::Bytes::from_static(b"half a file"), PutCondition::Overwrite).unwrap();
    let (_, said) = fails(e, &["verify", url]);
    assert!(said.contains("__7_0.distcp") && said.contains("did not commit"), "{said}");
    ok(e, &["convert", &dcp, url, "--to", "distcp"]);
    let second = names(e, url);
    assert_eq!(second.len(), first.len(), "{second:?}");
    assert!(second.contains(&".metadata".to_owned()) && !second.iter().any(|n| n.starts_with("__7_")), "{second:?}");
    assert!(second.iter().all(|n| !first.contains(n) || !n.ends_with(".distcp")), "new data file names each save");
    ok(e, &["verify", "--deep", url]);

    // A later save killed after uploading a data file, the previous checkpoint standing: verify lists the
    // object its manifest does not name; the next save removes it.
    s.put("__0_0.0123456789ab.distcp", bytes::Bytes::from_static(b"half"), PutCondition::Overwrite).unwrap();
    let said = ok(e, &["verify", url]);
    assert!(
        said.contains("warning:") && said.contains("0123456789ab.distcp: left by a save that did not commit"),
        "{said}"
    );
    ok(e, &["convert", &dcp, url, "--to", "distcp"]);
    assert!(!names(e, url).iter().any(|n| n.contains("0123456789ab")));
    ok(e, &["verify", "--deep", url]);

    // Conditional writes on this server: If-None-Match refuses an existing object.
    assert!(matches!(s.put(".metadata", "x".into(), PutCondition::Create), Err(StorageError::Conflict { .. })));
    let etag = s.head(".metadata").unwrap().unwrap().etag.unwrap();
    assert!(matches!(
        s.put(".metadata", "x".into(), PutCondition::Update("\"nope\"".into())),
        Err(StorageError::Conflict { .. })
    ));
    let _ = etag;
}

/// Issue 41.1 at a URL: a prefix holding objects that are not a checkpoint of the target format is refused
/// (exit 2, naming them), and `--overwrite` replaces them whole; a checkpoint of the format is replaced.
#[test]
fn a_url_destination_is_a_checkpoint_of_the_target_format_or_new() {
    let server = MotoServer::start();
    server.create_bucket("ckpt");
    let e = &server.endpoint();
    let dcp = fixture("distcp/torch213/m2");
    let url = "s3://ckpt/runs/notes";
    let s = store(e, url);
    s.put("notes.txt", bytes::Bytes::from_static(b"hi"), PutCondition::Overwrite).unwrap();
    let (code, said) = fails(e, &["convert", &dcp, url, "--to", "distcp"]);
    assert_eq!(code, 2, "{said}");
    assert!(said.contains("1 objects that are not a checkpoint (notes.txt)") && said.contains("--overwrite"), "{said}");
    assert_eq!(names(e, url), ["notes.txt"]);
    ok(e, &["convert", &dcp, url, "--to", "distcp", "--overwrite"]);
    let written = names(e, url);
    assert!(!written.contains(&"notes.txt".to_owned()) && written.contains(&".metadata".to_owned()), "{written:?}");
    ok(e, &["verify", "--deep", url]);
    // An hfai checkpoint there: refused for distcp; a distcp checkpoint is replaced.
    let hfai = "s3://ckpt/runs/hfai";
    ok(e, &["convert", &dcp, hfai, "--to", "hfai"]);
    let (code, said) = fails(e, &["convert", &dcp, hfai, "--to", "distcp"]);
    assert_eq!(code, 2, "{said}");
    assert!(said.contains("an hfai checkpoint is there"), "{said}");
    ok(e, &["convert", &dcp, url, "--to", "distcp"]);
    ok(e, &["convert", &dcp, hfai, "--to", "distcp", "--overwrite"]);
    assert!(!names(e, hfai).iter().any(|n| n.starts_with("PART_")), "{:?}", names(e, hfai));
    ok(e, &["verify", "--deep", hfai]);
}

/// A `rows × cols` f32 tensor counting up from `from`.
fn f32s(rows: usize, cols: usize, from: f32) -> ckpt::Tensor {
    let v: Vec<f32> = (0..rows * cols).map(|i| from + i as f32).collect();
    ckpt::Tensor::from_slice(&v, &[rows, cols]).unwrap()
}

/// Two tensors of 6 MiB each in a `.pt` file: two shards of a Hugging Face target with a 7 MB limit, each
/// a multipart upload with 5 MiB parts.
fn two_tensor_source(dir: &Path) -> String {
    let n = 3 << 19;
    let tensor = |k: f32| {
        let values: Vec<f32> = (0..n).map(|i| i as f32 * k).collect();
        ckpt::Value::Tensor(ckpt::Tensor::from_slice(&values, &[n]).unwrap())
    };
    let sd = ckpt::Value::dict([("a", tensor(1.0)), ("b", tensor(-0.5))]);
    let path = dir.join("two.pt");
    ckpt::torch::save(&sd, &path, &ckpt::torch::WriteOptions::default()).unwrap();
    path.display().to_string()
}

/// A source big enough for multipart uploads (12 MiB of f32 in a safetensors file).
fn big_source(dir: &Path) -> String {
    let n = 3 << 20;
    let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let t = ckpt::Tensor::from_slice(&values, &[n]).unwrap();
    let sd = ckpt::Value::dict([("w", ckpt::Value::Tensor(t))]);
    let path = dir.join("big.pt");
    ckpt::torch::save(&sd, &path, &ckpt::torch::WriteOptions::default()).unwrap();
    path.display().to_string()
}

#[test]
fn faults_get_their_own_errors_and_commit_nothing() {
    let server = MotoServer::start();
    server.create_bucket("ckpt");
    let dir = tempfile::tempdir().unwrap();
    let dcp = fixture("distcp/torch213/m2");
    let quick = ["--storage-option", "max_retries=2", "--storage-option", "retry_timeout=10s"];
    let with = |args: &[&str]| -> Vec<String> { args.iter().chain(quick.iter()).map(|s| (*s).to_owned()).collect() };
    let run = |proxy: &FaultProxy, args: &[&str]| {
        let args = with(args);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        ckpt(&proxy.endpoint(), &refs)
    };

    // Throttled twice, then served: retried with backoff, committed.
    let proxy =
        FaultProxy::start(server.port(), Fault::Status { status: 503, code: "SlowDown", times: Some(2), method: None });
    let out = run(&proxy, &["convert", &dcp, "s3://ckpt/f/retried", "--to", "distcp"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(proxy.injected(), 2);
    assert!(names(&server.endpoint(), "s3://ckpt/f/retried").contains(&".metadata".to_owned()));

    // Throttled on every upload: a specific error after the retries, and no commit point.
    proxy.set(Fault::Status { status: 503, code: "SlowDown", times: None, method: Some("PUT") });
    let (code, said) = {
        let out = run(&proxy, &["convert", &dcp, "s3://ckpt/f/throttled", "--to", "distcp"]);
        (out.status.code().unwrap_or(-1), text(&out))
    };
    assert_eq!(code, 4, "{said}");
    assert!(said.contains("kept throttling"), "{said}");
    assert!(!names(&server.endpoint(), "s3://ckpt/f/throttled").contains(&".metadata".to_owned()));

    // A server failing (500) on every upload.
    proxy.set(Fault::Status { status: 500, code: "InternalError", times: None, method: Some("PUT") });
    let out = run(&proxy, &["convert", &dcp, "s3://ckpt/f/failing", "--to", "distcp"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("server failed"), "{}", text(&out));
    assert!(!names(&server.endpoint(), "s3://ckpt/f/failing").contains(&".metadata".to_owned()));

    // A server that dies mid-upload (connections closed halfway through every large body).
    proxy.set(Fault::DropUploads { min_body: 1 << 20 });
    let big = big_source(dir.path());
    let args =
        ["convert", big.as_str(), "s3://ckpt/f/dropped", "--to", "distcp", "--storage-option", "part_size=5242880"];
    let out = run(&proxy, &args);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("connection to the server failed"), "{}", text(&out));
    assert!(!names(&server.endpoint(), "s3://ckpt/f/dropped").contains(&".metadata".to_owned()));
    // The same upload through a healthy server: multipart, committed, equal.
    proxy.set(Fault::None);
    let out = run(&proxy, &args);
    assert!(out.status.success(), "{}", text(&out));
    assert!(ok(&server.endpoint(), &["diff", &big, "s3://ckpt/f/dropped"]).contains("equal"));
    // A second save to the same URL dies mid-upload: the previous checkpoint stays whole and loadable
    // (the new data files have names of their own; `.metadata` is replaced only at the commit).
    let before = names(&server.endpoint(), "s3://ckpt/f/dropped");
    proxy.set(Fault::DropUploads { min_body: 1 << 20 });
    let out = run(&proxy, &args);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    proxy.set(Fault::None);
    ok(&server.endpoint(), &["verify", "--deep", "s3://ckpt/f/dropped"]);
    assert!(ok(&server.endpoint(), &["diff", &big, "s3://ckpt/f/dropped"]).contains("equal"));
    assert_eq!(names(&server.endpoint(), "s3://ckpt/f/dropped"), before, "no part of the failed save is visible");

    // Hugging Face shards re-saved to the same URL: shard names that would replace an object of the
    // previous checkpoint carry the save's id (the index names them), so a save that dies mid-upload
    // leaves the previous checkpoint whole and loadable, as DCP's.
    let two = two_tensor_source(dir.path());
    let hf = "s3://ckpt/f/hf";
    let args = [
        "convert",
        two.as_str(),
        hf,
        "--to",
        "hf",
        "--max-shard-size",
        "7000000",
        "--storage-option",
        "part_size=5242880",
    ];
    let standard =
        ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"];
    let out = run(&proxy, &args);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(names(&server.endpoint(), hf), standard, "the first save takes huggingface_hub's names");
    let out = run(&proxy, &args);
    assert!(out.status.success(), "{}", text(&out));
    let resaved = names(&server.endpoint(), hf);
    assert_eq!(resaved.len(), 3, "{resaved:?}");
    assert!(resaved.iter().all(|n| !standard[..2].contains(&n.as_str())), "{resaved:?}");
    let shards: Vec<&String> = resaved.iter().filter(|n| n.ends_with(".safetensors")).collect();
    assert_eq!(shards.len(), 2, "{resaved:?}");
    for (i, shard) in shards.iter().enumerate() {
        let stem = format!("model-0000{}-of-00002.", i + 1);
        let id = shard.strip_prefix(&stem).and_then(|r| r.strip_suffix(".safetensors")).unwrap_or_default();
        assert!(id.len() == 12 && id.bytes().all(|c| c.is_ascii_hexdigit()), "{shard}");
    }
    let listed = store(&server.endpoint(), hf);
    let size = listed.head("model.safetensors.index.json").unwrap().unwrap().size;
    let index = String::from_utf8(listed.read("model.safetensors.index.json", 0..size).unwrap().to_vec()).unwrap();
    assert!(shards.iter().all(|s| index.contains(&format!("\"{s}\""))), "{index}");
    ok(&server.endpoint(), &["verify", "--deep", hf]);
    assert!(ok(&server.endpoint(), &["diff", &two, hf]).contains("equal"));
    // A third save dies mid-upload: the second stays whole and loadable, nothing of the third visible.
    proxy.set(Fault::DropUploads { min_body: 1 << 20 });
    let out = run(&proxy, &args);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    proxy.set(Fault::None);
    ok(&server.endpoint(), &["verify", "--deep", hf]);
    assert!(ok(&server.endpoint(), &["diff", &two, hf]).contains("equal"));
    assert_eq!(names(&server.endpoint(), hf), resaved, "no part of the failed save is visible");
    // The next save collides with nothing: huggingface_hub's names again, the second save's removed.
    let out = run(&proxy, &args);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(names(&server.endpoint(), hf), standard);
    assert!(ok(&server.endpoint(), &["diff", &two, hf]).contains("equal"));

    // A slow server: every request held longer than the request timeout.
    proxy.set(Fault::Delay(std::time::Duration::from_secs(3)));
    let out = run(
        &proxy,
        &[
            "inspect",
            "s3://ckpt/f/retried",
            "--storage-option",
            "timeout=500ms",
            "--storage-option",
            "retry_timeout=2s",
        ],
    );
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("did not answer in time"), "{}", text(&out));

    // Credentials the server refuses; the secret never shows.
    proxy.set(Fault::RefuseKey(ckpt_conformance::s3::ACCESS_KEY));
    let out = run(&proxy, &["inspect", "s3://ckpt/f/retried"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("refused the credentials"), "{}", text(&out));
    assert!(!text(&out).contains(SECRET_KEY));

    // A missing bucket, reading and writing.
    let e = &server.endpoint();
    let (code, said) = fails(e, &["inspect", "s3://no-such-bucket/x"]);
    assert!(code == 4 && said.contains("bucket does not exist"), "{said}");
    let (code, said) = fails(e, &["convert", &dcp, "s3://no-such-bucket/x", "--to", "distcp"]);
    assert!(code == 4 && said.contains("bucket does not exist"), "{said}");
    // Nothing at the URL.
    let (code, said) = fails(e, &["inspect", "s3://ckpt/nothing/here.pt"]);
    assert!(code == 4 && said.contains("no such object"), "{said}");

    // A checkpoint truncated on the server: the reader says what is wrong.
    ok(e, &["convert", &big, "s3://ckpt/f/model.pt", "--to", "torch"]);
    let s = store(e, "s3://ckpt/f");
    let whole = s.read("model.pt", 0..s.head("model.pt").unwrap().unwrap().size).unwrap();
    s.put("model.pt", whole.slice(..whole.len() / 2), PutCondition::Overwrite).unwrap();
    let (code, said) = fails(e, &["inspect", "s3://ckpt/f/model.pt"]);
    assert_eq!(code, 3, "{said}");
    let (code, _) = fails(e, &["verify", "--deep", "s3://ckpt/f/model.pt"]);
    assert!(code == 1 || code == 3);

    // Unknown schemes and options are usage errors, never local paths.
    let (code, said) = fails(e, &["inspect", "ftp://host/x.pt"]);
    assert!(code == 2 && said.contains("no storage is registered"), "{said}");
    let (code, said) = fails(e, &["inspect", "s3://ckpt/f/model.pt", "--storage-option", "no_such_option=1"]);
    assert!(code == 2 && said.contains("no_such_option"), "{said}");
}

/// Runs `conformance/python/s3/<script>` (torch's DCP storage over S3: `dcp_fsspec.py`, fsspec's
/// `FsspecWriter`/`FsspecReader` on s3fs; `dcp_s3torchconnector.py`, AWS's `S3StorageWriter`/`S3StorageReader`).
fn torch_s3(script: &str, endpoint: &str, args: &[&str]) -> Output {
    let script = ckpt_conformance::repo_root().join("conformance/python/s3").join(script);
    let mut c = Command::new(ckpt_conformance::python());
    for (k, v) in MotoServer::env(endpoint) {
        c.env(k, v);
    }
    c.arg(script).args(args).args(["--endpoint", endpoint]).output().expect("run python")
}

#[test]
fn torch_and_ckpt_read_each_others_dcp_checkpoints_on_s3() {
    let server = MotoServer::start();
    server.create_bucket("interop");
    let e = &server.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("ref.pt");
    let reference = reference.to_str().unwrap();
    for (script, at) in [("dcp_fsspec.py", "s3://interop/fsspec"), ("dcp_s3torchconnector.py", "s3://interop/s3tc")] {
        let url = |name: &str| format!("{at}/{name}");
        // torch writes through its S3 storage; ckpt reads it.
        let out = torch_s3(script, e, &["write", &url("torch-written"), "--reference", reference]);
        assert!(out.status.success(), "{script}: {}", text(&out));
        assert!(ok(e, &["diff", reference, &url("torch-written")]).contains("equal"));
        ok(e, &["verify", &url("torch-written")]);
        // ckpt writes; torch loads it through its S3 storage, bit for bit.
        ok(e, &["convert", reference, &url("ckpt-written"), "--to", "distcp"]);
        let out = torch_s3(script, e, &["read", &url("ckpt-written"), "--reference", reference]);
        assert!(out.status.success(), "{script}: {}", text(&out));
        // And a reshard of torch's checkpoint, from the bucket to the bucket, loads in torch.
        ok(e, &["reshard", &url("torch-written"), &url("resharded"), "--world-size", "2"]);
        let out = torch_s3(script, e, &["read", &url("resharded"), "--reference", reference]);
        assert!(out.status.success(), "{script}: {}", text(&out));
    }
}

/// The `fetched <url> (as read): N objects, B bytes, R requests` line of a lazy read's `--verbose` output:
/// (bytes, requests).
/// What `--verbose` said a command fetched from `url` (`fetched <url>: …`, or `fetched <url> (as read): …`
/// where the reads fetched what they read): `N objects, N bytes, N requests`.
#[track_caller]
fn fetched_line<'a>(said: &'a str, url: &str) -> &'a str {
    said.lines()
        .find_map(|l| {
            l.strip_prefix(&format!("fetched {url}: "))
                .or_else(|| l.strip_prefix(&format!("fetched {url} (as read): ")))
        })
        .unwrap_or_else(|| panic!("no transfer line for {url}:\n{said}"))
}

/// The bytes and requests of a transfer line's counts (`N objects, N bytes, N requests`).
#[track_caller]
fn bytes_and_requests(line: &str) -> (u64, u64) {
    let field = |i: usize| -> u64 {
        line.split(", ").nth(i).and_then(|f| f.split(' ').next()).and_then(|n| n.parse().ok()).unwrap()
    };
    (field(1), field(2))
}

#[track_caller]
fn fetched_as_read(said: &str, url: &str) -> (u64, u64) {
    let line = said
        .lines()
        .find_map(|l| l.strip_prefix(&format!("fetched {url} (as read): ")))
        .unwrap_or_else(|| panic!("no lazy transfer line for {url}:\n{said}"));
    bytes_and_requests(line)
}

#[test]
fn reads_fetch_only_what_they_need() {
    use ckpt::distcp::{DcpReader, Error as DcpError, ReadOptions, WriteOptions, save};
    let server = MotoServer::start();
    server.create_bucket("ckpt");
    let e = &server.endpoint();
    let scratch = tempfile::tempdir().unwrap();
    // Three large tensors in one data file (a single-rank save): 8 MiB, 2 MiB, 2 MiB.
    let dir = scratch.path().join("dcp");
    let (a, b, c) = (f32s(4096, 512, 0.0), f32s(1024, 512, 1e7), f32s(1024, 512, 2e7));
    let sd = ckpt::Value::dict([
        ("a", ckpt::Value::Tensor(a.clone())),
        ("b", ckpt::Value::Tensor(b.clone())),
        ("c", ckpt::Value::Tensor(c)),
        ("step", ckpt::Value::Int(7)),
    ]);
    save(&sd, &dir, &WriteOptions::default()).unwrap();
    let url = "s3://ckpt/lazy/dcp";
    let remote = store(e, url);
    let mut small = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        let size = remote.upload_file(&name, &entry.path()).unwrap();
        if !name.ends_with(".distcp") {
            small += size;
        }
    }

    // `ckpt cat URL b`: b's 2 MiB, its item's ZIP metadata, and the small files (.metadata), no more.
    let b_bytes = (1024 * 512 * 4) as u64;
    let out = ckpt(e, &["cat", url, "b", "--verbose"]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    let (fetched, requests) = fetched_as_read(&said, url);
    assert!(fetched >= b_bytes + small, "{said}");
    assert!(fetched as f64 <= 1.1 * b_bytes as f64 + small as f64, "{fetched} bytes for {b_bytes}: {said}");
    assert!(requests <= 12, "{said}");
    eprintln!("cat b: {fetched} bytes in {requests} requests for {b_bytes} tensor bytes + {small} of small files");
    let local = ckpt(e, &["cat", dir.to_str().unwrap(), "b"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&local.stdout));

    // A region through the library: rows 1000..2024 of a (2 MiB of its 8 MiB).
    let options = store(e, url).options().clone();
    let source =
        ckpt::storage::fetch_with(&Location::parse(url).unwrap(), &options, ckpt::storage::Fetch::Lazy).unwrap();
    let opened = source.transfer().unwrap();
    assert_eq!(opened.bytes, small, "opening fetches the small files alone");
    let reader = DcpReader::open_with(source.path(), &ReadOptions::default().with_fill(source.fill())).unwrap();
    let region = reader.read_region("a", &[1000, 0], &[1024, 512]).unwrap();
    assert_eq!(region, a.region(&[1000, 0], &[1024, 512]).unwrap().to_contiguous().unwrap());
    let need = (1024 * 512 * 4) as u64;
    let fetched = source.transfer().unwrap().bytes - opened.bytes;
    assert!(fetched >= need && fetched as f64 <= 1.1 * need as f64, "{fetched} bytes for a {need}-byte region");
    eprintln!("region of a: {fetched} bytes for a {need}-byte region");
    // Read again: nothing fetched twice. A whole tensor through the facade's reader equals the local one.
    let before = source.transfer().unwrap();
    reader.read_region("a", &[1100, 0], &[10, 512]).unwrap();
    assert_eq!(source.transfer().unwrap().bytes, before.bytes);
    let lazy = ckpt::SourceOptions::default().with_fill(source.path(), source.fill());
    let ck = ckpt::open_source(source.path(), None, &ckpt::ReadLimits::default(), &lazy).unwrap();
    assert_eq!(ck.tensor("b").unwrap(), b);

    // A data object truncated on the server after the listing: a specific error, never zeros.
    let truncated =
        ckpt::storage::fetch_with(&Location::parse(url).unwrap(), &options, ckpt::storage::Fetch::Lazy).unwrap();
    let data = std::fs::read(dir.join("__0_0.distcp")).unwrap();
    remote.put("__0_0.distcp", data[..data.len() / 2].to_vec().into(), PutCondition::Overwrite).unwrap();
    let reader = DcpReader::open_with(truncated.path(), &ReadOptions::default().with_fill(truncated.fill())).unwrap();
    // c is the last tensor written: in the half the server no longer has.
    let err = reader.read_tensor("c").unwrap_err();
    match &err {
        DcpError::Fetch { key, source, .. } => {
            assert_eq!(key, "c");
            assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof, "{err}");
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("truncated"), "{err}");
    // Listed truncated: the reader refuses the checkpoint at open, naming the item past the file's end.
    let (_, said) = fails(e, &["cat", url, "c"]);
    assert!(said.contains("reaches past the end"), "{said}");
}

/// `ckpt cat` of a safetensors file and of a Hugging Face shard directory on S3 fetches the headers and
/// the one tensor read, no more (`Fetch::Lazy`), with the local `cat`'s output.
#[test]
fn lazy_safetensors_and_shards_fetch_one_tensor() {
    let server = MotoServer::start();
    server.create_bucket("ckpt");
    let e = &server.endpoint();
    let scratch = tempfile::tempdir().unwrap();
    // 8 MiB, 2 MiB, 2 MiB.
    let tensors = vec![
        ("a".to_string(), f32s(4096, 512, 0.0)),
        ("b".to_string(), f32s(1024, 512, 1e7)),
        ("c".to_string(), f32s(1024, 512, 2e7)),
    ];
    let b_bytes = (1024 * 512 * 4) as u64;

    // One file.
    let file = scratch.path().join("model.safetensors");
    ckpt::safetensors::write_file(&tensors, None, &file).unwrap();
    let bytes = std::fs::read(&file).unwrap();
    let header = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let url = "s3://ckpt/lazy/model.safetensors";
    store(e, "s3://ckpt/lazy").upload_file("model.safetensors", &file).unwrap();
    let out = ckpt(e, &["cat", url, "b", "--verbose"]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    let (fetched, requests) = fetched_as_read(&said, url);
    assert!(fetched >= b_bytes, "{said}");
    assert!(fetched as f64 <= 1.1 * (b_bytes + header) as f64, "{fetched} bytes for {b_bytes} + {header}: {said}");
    assert!(requests <= 6, "{said}");
    eprintln!(
        "cat b of a file: {fetched} bytes in {requests} requests for {b_bytes} tensor bytes + {header} of header"
    );
    let local = ckpt(e, &["cat", file.to_str().unwrap(), "b"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&local.stdout));

    // Shards: one tensor a shard (4 MiB shards).
    let dir = scratch.path().join("hf");
    let options = ckpt::hf::WriteOptions::default().with_max_shard_size(4 << 20);
    let values: Vec<ckpt::Value> = tensors.iter().map(|(_, t)| ckpt::Value::Tensor(t.clone())).collect();
    let leaves = tensors.iter().zip(&values).map(|((n, _), v)| (n.as_str(), &[][..], v));
    ckpt::hf::save_entries(leaves, &dir, &options).unwrap();
    let url = "s3://ckpt/lazy/hf";
    let remote = store(e, url);
    let mut headers = 0;
    let mut small = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        let size = remote.upload_file(&name, &entry.path()).unwrap();
        if name.ends_with(".safetensors") {
            let bytes = std::fs::read(entry.path()).unwrap();
            headers += 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap());
        } else {
            small += size;
        }
    }
    let out = ckpt(e, &["cat", url, "b", "--verbose"]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    let (fetched, requests) = fetched_as_read(&said, url);
    let need = b_bytes + headers + small;
    assert!(fetched >= b_bytes + small, "{said}");
    assert!(fetched as f64 <= 1.1 * need as f64, "{fetched} bytes for {need}: {said}");
    eprintln!(
        "cat b of shards: {fetched} bytes in {requests} requests for {b_bytes} tensor bytes + {headers} of headers + {small} of index"
    );
    let local = ckpt(e, &["cat", dir.to_str().unwrap(), "b"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&local.stdout));
}

/// `ckpt cat` of a `torch.save` file on S3 fetches its ZIP index and the one storage record read (`Fetch::Lazy`).
#[test]
fn lazy_torch_save_fetches_one_storage() {
    let server = MotoServer::start();
    server.create_bucket("ckpt");
    let e = &server.endpoint();
    let scratch = tempfile::tempdir().unwrap();
    let (a, b, c) = (f32s(4096, 512, 0.0), f32s(1024, 512, 1e7), f32s(1024, 512, 2e7));
    let sd = ckpt::Value::dict([
        ("a", ckpt::Value::Tensor(a)),
        ("b", ckpt::Value::Tensor(b.clone())),
        ("c", ckpt::Value::Tensor(c)),
        ("step", ckpt::Value::Int(7)),
    ]);
    let file = scratch.path().join("model.pt");
    ckpt::torch::save(&sd, &file, &ckpt::torch::WriteOptions::default()).unwrap();
    store(e, "s3://ckpt/lazy").upload_file("model.pt", &file).unwrap();
    let url = "s3://ckpt/lazy/model.pt";
    let b_bytes = (1024 * 512 * 4) as u64;

    // Through the library: opening fetches the index alone; b its record (and its 64-byte aligned header).
    let options = store(e, url).options().clone();
    let source =
        ckpt::storage::fetch_with(&Location::parse(url).unwrap(), &options, ckpt::storage::Fetch::Lazy).unwrap();
    assert!(source.fill().is_some(), "a .pt is read lazily");
    let index = source.transfer().unwrap().bytes;
    assert!(index < 200_000, "the index: {index} bytes");
    let lazy = ckpt::SourceOptions::default().with_fill(source.path(), source.fill());
    let ck = ckpt::open_source(source.path(), None, &ckpt::ReadLimits::default(), &lazy).unwrap();
    assert_eq!(source.transfer().unwrap().bytes, index, "opening fetches nothing more");
    assert_eq!(ck.tensor("b").unwrap(), b);
    let fetched = source.transfer().unwrap().bytes - index;
    assert!(fetched >= b_bytes && fetched as f64 <= 1.1 * b_bytes as f64, "{fetched} bytes for {b_bytes}");
    eprintln!("torch b: {fetched} bytes for {b_bytes} tensor bytes, after {index} bytes of index");

    // `ckpt cat URL b`: the same bytes, what the local cat prints.
    let out = ckpt(e, &["cat", url, "b", "--verbose"]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    let (fetched, requests) = fetched_as_read(&said, url);
    assert!(fetched as f64 <= 1.1 * b_bytes as f64 + index as f64, "{fetched} bytes for {b_bytes} + {index}: {said}");
    eprintln!("cat b of a .pt: {fetched} bytes in {requests} requests for {b_bytes} tensor bytes + {index} of index");
    let local = ckpt(e, &["cat", file.to_str().unwrap(), "b"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&local.stdout));

    // hfai parts (PART_*.pt, read through the torch reader): each part's ZIP index, then b's record.
    let hfai = "s3://ckpt/lazy/hfai";
    let said = ok(e, &["convert", file.to_str().unwrap(), hfai, "--to", "hfai"]);
    let total: u64 = store(e, hfai).list().unwrap().iter().map(|o| o.size).sum();
    let local_dir = scratch.path().join("hfai");
    ok(e, &["convert", file.to_str().unwrap(), local_dir.to_str().unwrap(), "--to", "hfai"]);
    let key = "model.b";
    let out = ckpt(e, &["cat", hfai, key, "--verbose"]);
    let said = format!("{said}{}", text(&out));
    assert!(out.status.success(), "{said}");
    let (fetched, requests) = fetched_as_read(&said, hfai);
    assert!(fetched >= b_bytes && fetched < b_bytes + 400_000, "{fetched} bytes of {total} for {b_bytes}: {said}");
    eprintln!("cat {key} of hfai parts: {fetched} bytes of {total} in {requests} requests for {b_bytes} tensor bytes");
    let local = ckpt(e, &["cat", local_dir.to_str().unwrap(), key]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&local.stdout));
    // inspect of the parts: their ZIP indexes alone, and the listing of the local copy.
    let (fetched, requests) = inspected(e, hfai, &local_dir);
    assert!(fetched < total / 4 && fetched < 400_000, "inspect fetched {fetched} bytes of {total}");
    eprintln!("inspect of hfai parts: {fetched} bytes of {total} in {requests} requests");
}

/// `ckpt inspect --json --verbose` of `url`: the bytes and requests it fetched, once its listing is checked
/// against the local copy `local`'s.
#[track_caller]
fn inspected(endpoint: &str, url: &str, local: &Path) -> (u64, u64) {
    let said = ok(endpoint, &["inspect", url, "--json", "--verbose"]);
    let entries = |text: &str| -> serde_json::Value {
        let json: String = text.lines().filter(|l| !l.starts_with("fetched ")).collect::<Vec<_>>().join("\n");
        serde_json::from_str::<serde_json::Value>(&json).unwrap_or_else(|e| panic!("{e}: {text}"))["entries"].clone()
    };
    assert_eq!(entries(&said), entries(&ok(endpoint, &["inspect", local.to_str().unwrap(), "--json"])), "{url}");
    bytes_and_requests(fetched_line(&said, url))
}

/// RecIS's checkpoint manager with an object-store root: each id a prefix committed with its `index` last,
/// the `checkpoint` list one object rewritten after it (read back from the bucket, so that ids saved
/// earlier stay listed), checkpoints rotated out by `max_keep` removed from the bucket.
#[test]
fn recis_manager_lists_and_rotates_checkpoints_under_a_url() {
    use ckpt::recis::manager::{ShardState, checkpoint_id};
    use ckpt::recis::name::SliceInfo;
    use ckpt::recis::table::TableChild;
    use ckpt::recis::{CheckpointManager, HashTable, Slot};

    let server = MotoServer::start();
    server.create_bucket("ckpt");
    let e = &server.endpoint();
    // The library's writers take their store's configuration from the process default (as the CLI sets it).
    StorageOptions::set_process_default(options(e));
    let root = "s3://ckpt/recis-run";
    let state = |scale: f32| {
        let emb = ckpt::Tensor::from_slice(&[0.5 * scale, 1.5 * scale, -2.0 * scale], &[3, 1]).unwrap();
        let child = TableChild::new("user", vec![7, 9, 11], vec![Slot::new("embedding", emb).unwrap()]).unwrap();
        ShardState { tables: vec![HashTable::single(SliceInfo::full(65536).unwrap(), child)], ..Default::default() }
    };
    let manager = CheckpointManager::new(root).with_max_keep(2);
    assert_eq!(manager.list().unwrap(), Vec::<String>::new(), "no list in the bucket yet");
    for step in [100, 200] {
        manager.save(&state(step as f32), &checkpoint_id(step), &ckpt::collective::SingleProcess).unwrap();
    }
    // A second manager (another process) reads the list from the bucket and rotates what the first saved.
    let later = CheckpointManager::new(root).with_max_keep(2);
    assert_eq!(later.list().unwrap(), ["ckpt_100", "ckpt_200"]);
    later.save(&state(300.0), &checkpoint_id(300), &ckpt::collective::SingleProcess).unwrap();
    assert_eq!(later.list().unwrap(), ["ckpt_200", "ckpt_300"]);
    let objects = names(e, root);
    assert!(
        objects.contains(&"checkpoint".to_owned()) && objects.contains(&"ckpt_300/index".to_owned()),
        "{objects:?}"
    );
    assert!(!objects.iter().any(|n| n.starts_with("ckpt_100/")), "rotated out: {objects:?}");
    assert!(objects.iter().any(|n| n.starts_with("ckpt_200/")), "{objects:?}");
    // The root reads as its latest checkpoint, every byte checked.
    ok(e, &["verify", "--deep", root]);
    let local = tempfile::tempdir().unwrap();
    CheckpointManager::new(local.path()).save(&state(300.0), "ckpt_300", &ckpt::collective::SingleProcess).unwrap();
    let said = ok(e, &["diff", &local.path().join("ckpt_300").display().to_string(), root]);
    assert!(said.contains("equal"), "{said}");
}

/// Asserts that the conversions `a` and `b` are the same: the same bytes, or for safetensors files (whose
/// `__metadata__` map a writer may order otherwise) the same tensors, in the same order, and metadata.
#[track_caller]
fn assert_same_output(a: &Path, b: &Path) {
    if a.extension().is_some_and(|e| e == "safetensors") {
        let (x, y) = (ckpt::safetensors::read_file(a).unwrap(), ckpt::safetensors::read_file(b).unwrap());
        assert_eq!(x.tensors, y.tensors, "{a:?} and {b:?}");
        assert_eq!(x.metadata, y.metadata, "{a:?} and {b:?}");
        return;
    }
    let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    let at = x.iter().zip(&y).position(|(p, q)| p != q);
    assert!(x == y, "{a:?} ({} bytes) and {b:?} ({} bytes) differ at {at:?}", x.len(), y.len());
}

/// Uploads every file under `dir` to `url`, each under its path relative to `dir`; returns the total size.
fn upload_tree(endpoint: &str, dir: &Path, url: &str) -> u64 {
    let remote = store(endpoint, url);
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap().to_str().unwrap().to_owned();
                total += remote.upload_file(&rel, &path).unwrap();
            }
        }
    }
    total
}

/// `ckpt cat` of one tensor of a RecIS output root (and checkpoint directory) on S3 fetches its small files,
/// its data files' headers and `.pt` indexes and the tensor's blocks, no more (`Fetch::Lazy`), printing
/// what the local `cat` prints; `ckpt diff` of the URL and the local copy finds them equal; and `convert
/// --include` of one tensor fetches that tensor.
#[test]
fn lazy_recis_fetches_one_tensor() {
    let server = MotoServer::start();
    server.create_bucket("ckpt");
    let e = &server.endpoint();
    let scratch = tempfile::tempdir().unwrap();
    // Two shards of two data files each: user's embedding and exp_avg (4 MiB each), item's, model.pt's w
    // (1 MiB), extra.pt's step.
    let users = 4096;
    let ids: Vec<i64> = (0..users as i64).map(|i| i * 7 - 100).collect();
    let sd = ckpt::Value::dict([
        ("user@id", ckpt::Value::Tensor(ckpt::Tensor::from_slice(&ids, &[users]).unwrap())),
        ("user@embedding", ckpt::Value::Tensor(f32s(users, 256, 0.0))),
        ("user@exp_avg", ckpt::Value::Tensor(f32s(users, 256, 1e7))),
        ("item@id", ckpt::Value::Tensor(ckpt::Tensor::from_slice(&(0..512).collect::<Vec<i64>>(), &[512]).unwrap())),
        ("item@embedding", ckpt::Value::Tensor(f32s(512, 16, 2e7))),
        ("model", ckpt::Value::dict([("w", ckpt::Value::Tensor(f32s(1024, 256, 3e7)))])),
        ("step", ckpt::Value::Int(7)),
    ]);
    let root = scratch.path().join("recis");
    let write = ckpt::recis::WriteOptions::default().with_world_size(2).with_parallel(2);
    ckpt::recis::save(&sd, root.join("ckpt_7"), &write).unwrap();
    std::fs::write(root.join("checkpoint"), "ckpt_7\n").unwrap();
    let url = "s3://ckpt/lazy/recis";
    let total = upload_tree(e, &root, url);
    let (mut small, mut headers, mut pt) = (0, 0, 0);
    for o in store(e, url).list().unwrap() {
        if o.name.ends_with(".safetensors") {
            let bytes = std::fs::read(root.join(&o.name)).unwrap();
            headers += 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap());
        } else if o.name.ends_with(".pt") {
            pt += o.size;
        } else {
            small += o.size;
        }
    }

    // The output root: user@embedding's two slices.
    let need = (users * 256 * 4) as u64;
    let out = ckpt(e, &["cat", url, "user@embedding", "--verbose"]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    let (fetched, requests) = fetched_as_read(&said, url);
    assert!(fetched >= need + small, "{said}");
    // The .pt files' indexes: their last 64 KiB at most each (two files, both smaller than 2 MiB).
    let index = small + headers + 2 * ((64 << 10) + 98);
    assert!(fetched as f64 <= 1.1 * need as f64 + index as f64, "{fetched} bytes of {total} for {need}: {said}");
    assert!(fetched < total / 2, "{fetched} bytes of {total}");
    eprintln!(
        "cat user@embedding of a RecIS root: {fetched} bytes of {total} in {requests} requests for {need} tensor \
         bytes + {small} of small files + {headers} of headers ({pt} bytes of .pt files)"
    );
    let local = ckpt(e, &["cat", root.to_str().unwrap(), "user@embedding"]);
    assert!(local.status.success(), "{}", text(&local));
    assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&local.stdout));
    // inspect of the root: its small files, headers and ZIP indexes, no block.
    let (fetched, requests) = inspected(e, url, &root);
    // (Besides the indexes, opening reads the tables' id blocks and `extra.pt`'s values.)
    assert!(fetched < total / 20, "inspect fetched {fetched} bytes of {total} (indexes: {index} bytes)");
    eprintln!("inspect of a RecIS root: {fetched} bytes of {total} in {requests} requests");

    // The checkpoint directory itself: model.pt's w, its record alone besides the indexes.
    let dir_url = "s3://ckpt/lazy/recis/ckpt_7";
    let w = (1024 * 256 * 4) as u64;
    let out = ckpt(e, &["cat", dir_url, "w", "--verbose"]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    let (fetched, _) = fetched_as_read(&said, dir_url);
    assert!(fetched >= w && fetched as f64 <= 1.1 * w as f64 + index as f64, "{fetched} bytes for {w}: {said}");
    eprintln!("cat w of a RecIS directory: {fetched} bytes of {total} for {w} tensor bytes");
    let local = ckpt(e, &["cat", root.join("ckpt_7").to_str().unwrap(), "w"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&local.stdout));

    // diff reads every entry (and the layout) through the fill: equal to the local copy.
    let same = ok(e, &["diff", url, root.to_str().unwrap()]);
    assert!(same.contains("equal"), "{same}");

    // convert --include of one table slot: that slot's blocks.
    let lazy_out = scratch.path().join("lazy.safetensors");
    let local_out = scratch.path().join("local.safetensors");
    let said = ok(
        e,
        &["convert", url, lazy_out.to_str().unwrap(), "--to", "safetensors", "--include", "user@exp_avg", "--verbose"],
    );
    let (fetched, _) = fetched_as_read(&said, url);
    assert!(
        fetched >= need && fetched as f64 <= 1.1 * need as f64 + index as f64,
        "{fetched} bytes of {total}: {said}"
    );
    eprintln!("convert --include user@exp_avg of a RecIS root: {fetched} bytes of {total} for {need} tensor bytes");
    ok(
        e,
        &[
            "convert",
            root.to_str().unwrap(),
            local_out.to_str().unwrap(),
            "--to",
            "safetensors",
            "--include",
            "user@exp_avg",
        ],
    );
    assert_same_output(&lazy_out, &local_out);
}

/// `ckpt convert URL DST --include …` fetches the selected tensors' bytes and the indexes, not the rest of the
/// source (`Fetch::Lazy`), and writes what the local conversion writes: from a DCP checkpoint, a `.pt` file
/// and a safetensors file.
#[test]
fn convert_select_fetches_what_it_selects() {
    let server = MotoServer::start();
    server.create_bucket("ckpt");
    let e = &server.endpoint();
    let scratch = tempfile::tempdir().unwrap();
    // 8 MiB, 2 MiB, 2 MiB, and a value.
    let sd = ckpt::Value::dict([
        ("a", ckpt::Value::Tensor(f32s(4096, 512, 0.0))),
        ("b", ckpt::Value::Tensor(f32s(1024, 512, 1e7))),
        ("c", ckpt::Value::Tensor(f32s(1024, 512, 2e7))),
        ("step", ckpt::Value::Int(7)),
    ]);
    let b_bytes = (1024 * 512 * 4) as u64;
    let dcp = scratch.path().join("dcp");
    ckpt::distcp::save(&sd, &dcp, &ckpt::distcp::WriteOptions::default()).unwrap();
    let pt = scratch.path().join("model.pt");
    ckpt::torch::save(&sd, &pt, &ckpt::torch::WriteOptions::default()).unwrap();
    let st = scratch.path().join("model.safetensors");
    ok(e, &["convert", pt.to_str().unwrap(), st.to_str().unwrap(), "--to", "safetensors"]);
    let sources = [
        (dcp.clone(), "s3://ckpt/select/dcp", "torch", "out.pt"),
        (pt.clone(), "s3://ckpt/select/model.pt", "safetensors", "out.safetensors"),
        (st.clone(), "s3://ckpt/select/model.safetensors", "torch", "out.pt"),
    ];
    for (local, url, to, name) in sources {
        let total = if local.is_dir() {
            upload_tree(e, &local, url)
        } else {
            let (parent, object) = url.rsplit_once('/').unwrap();
            store(e, parent).upload_file(object, &local).unwrap()
        };
        let lazy_out = scratch.path().join(format!("lazy-{to}-{}", local.file_name().unwrap().to_string_lossy()));
        let local_out = scratch.path().join(format!("local-{to}-{}", local.file_name().unwrap().to_string_lossy()));
        std::fs::create_dir_all(&lazy_out).unwrap();
        std::fs::create_dir_all(&local_out).unwrap();
        let (lazy_out, local_out) = (lazy_out.join(name), local_out.join(name));
        let args = |src: &str, dst: &Path| -> Vec<String> {
            ["convert", src, dst.to_str().unwrap(), "--to", to, "--include", "b", "--verbose"]
                .map(str::to_owned)
                .to_vec()
        };
        let said = ok(e, &args(url, &lazy_out).iter().map(String::as_str).collect::<Vec<_>>());
        let (fetched, requests) = fetched_as_read(&said, url);
        // b's bytes, the indexes (a .pt's last 64 KiB, a DCP checkpoint's .metadata, a header), no more.
        assert!(fetched >= b_bytes, "{url}: {said}");
        assert!(fetched as f64 <= 1.1 * b_bytes as f64 + 200_000.0, "{url}: {fetched} bytes of {total}: {said}");
        assert!(fetched < total / 4, "{url}: {fetched} bytes of {total}");
        eprintln!(
            "convert --include b of {url} to {to}: {fetched} bytes of {total} in {requests} requests for {b_bytes}"
        );
        ok(e, &args(local.to_str().unwrap(), &local_out).iter().map(String::as_str).collect::<Vec<_>>());
        assert_same_output(&lazy_out, &local_out);
        let back = ckpt::open(&lazy_out).unwrap();
        assert_eq!(back.entries().iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["b"], "{url}");
    }
}
