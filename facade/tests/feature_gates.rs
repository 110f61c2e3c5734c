//! Integration tests that need features declare them in their package's `Cargo.toml` (`[[test]]
//! required-features`): `cargo test --test <name>` without the features then fails naming them, where an
//! inner `#![cfg(feature = ...)]` would compile the test to an empty binary that passes.
//!
//! A plain `cargo test -p ckpt` skips such targets without a word, so this test, built without `full`, is
//! reported as ignored with the names of the tests cargo skipped. With `--features full` (what
//! `scripts/test.sh` runs) it checks the declarations of every workspace member.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The ignore reason below, which must name exactly the facade's tests that require `full`.
const REASON_MARKER: &str = "cargo skipped the integration tests ";

/// `[[test]]` targets of a manifest: (name, path if given, required features).
fn declared_tests(manifest: &str) -> Vec<(String, Option<String>, Vec<String>)> {
    let mut out = Vec::new();
    let mut current: Option<(String, Option<String>, Vec<String>)> = None;
    let quoted = |v: &str| v.split('"').skip(1).step_by(2).map(str::to_owned).collect::<Vec<_>>();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            out.extend(current.take());
            if line == "[[test]]" {
                current = Some((String::new(), None, Vec::new()));
            }
            continue;
        }
        let Some(t) = current.as_mut() else { continue };
        if let Some((key, value)) = line.split_once('=') {
            match key.trim() {
                "name" => t.0 = quoted(value).concat(),
                "path" => t.1 = Some(quoted(value).concat()),
                "required-features" => t.2 = quoted(value),
                _ => {}
            }
        }
    }
    out.extend(current);
    out
}

/// The directories of the workspace members, from the root manifest's `members` list.
fn members(root: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let start = text.find("members = [").expect("the root manifest lists its members");
    let list = &text[start..start + text[start..].find(']').unwrap()];
    list.split('"').skip(1).step_by(2).map(|m| root.join(m)).collect()
}

#[test]
#[cfg_attr(
    not(feature = "full"),
    ignore = "needs --features full; cargo skipped the integration tests cli, cli_crash, composite, convert_memory, destinations, dropped, dtypes, gguf, layouts, matrix, messages, open, packages, pickles, ranks, real_files, s3 and training"
)]
fn feature_gated_tests_are_declared_not_compiled_out() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    for member in members(&root) {
        let manifest = std::fs::read_to_string(member.join("Cargo.toml")).unwrap();
        let declared = declared_tests(&manifest);
        for (name, path, features) in &declared {
            assert!(!name.is_empty(), "{}: a [[test]] without a name", member.display());
            let file = member.join(path.clone().unwrap_or_else(|| format!("tests/{name}.rs")));
            assert!(file.is_file(), "{}: [[test]] {name} has no file {}", member.display(), file.display());
            assert!(!features.is_empty(), "{}: [[test]] {name} declares no required-features", member.display());
        }
        let Ok(dir) = std::fs::read_dir(member.join("tests")) else { continue };
        for entry in dir {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                assert!(
                    !text.lines().any(|l| l.trim_start().starts_with("#![cfg(feature")),
                    "{} compiles itself out without a feature: declare [[test]] required-features instead",
                    path.display()
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 5, "only {checked} test files found");

    // The ignore reason names exactly the facade's tests that need `full`.
    let facade = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    let need_full: BTreeSet<String> = declared_tests(&facade)
        .into_iter()
        .filter(|(_, _, f)| f.iter().any(|f| f == "full"))
        .map(|(name, _, _)| name)
        .collect();
    let source = include_str!("feature_gates.rs");
    let reason = source
        .lines()
        .filter_map(|l| l.split_once(REASON_MARKER).map(|(_, rest)| rest))
        .find(|rest| !rest.starts_with('"'))
        .expect("the ignore reason");
    let named: BTreeSet<String> = reason
        .trim_end_matches('"')
        .split([',', ' '])
        .filter(|w| !w.is_empty() && *w != "and")
        .map(str::to_owned)
        .collect();
    assert_eq!(named, need_full, "the ignore reason must name the tests that need `full`");
}

#[test]
fn declarations_are_parsed() {
    let manifest = "[package]\nname = \"x\"\n\n[[test]]\nname = \"a\"\nrequired-features = [\"full\", \"cli\"]\n\n\
                    [[test]]\nname = \"b\"\npath = \"tests/other.rs\"\n\n[lints]\nworkspace = true\n";
    assert_eq!(
        declared_tests(manifest),
        [
            ("a".to_owned(), None, vec!["full".to_owned(), "cli".to_owned()]),
            ("b".to_owned(), Some("tests/other.rs".to_owned()), vec![]),
        ]
    );
}
