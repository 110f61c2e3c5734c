//! A format is named only where the facade keeps it (issue 40): outside `format.rs` (the enum and its
//! table), `formats.rs` (the registry), `formats/` (each format's adaptor), `options.rs` and `options/` (a
//! format's options, in its variant and by name), no module of `src/` names a format crate (`ckpt_distcp`,
//! ...) or a variant of `Format` (`Format::Hf`) in its code: what differs by format is asked of its adaptor
//! or of the registry.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

mod scan;
use scan::code;

/// The files of `src/` that may name formats.
const ALLOWED: &[&str] = &["format.rs", "formats.rs", "options.rs"];

/// The directories of `src/` that may name formats: each format's adaptor (`formats/<format>.rs`) and the
/// options' table and parser (`options/named.rs`, a format's options by name, beside its variant).
const ALLOWED_DIRS: &[&str] = &["formats", "options"];

/// Names allowed in one file, each with its reason: `ckpt export-tsv` is PyTorch-BigGraph's own command.
const ALLOWED_NAMES: &[(&str, &str, &str)] = &[("bin/ckpt.rs", "Pbg", "export-tsv is PBG's own command")];

/// The facade's dependencies that are not format crates: the tensor model, the commit path, process groups,
/// the pickle decoder.
const NOT_FORMATS: &[&str] = &["ckpt_tensor", "ckpt_io", "ckpt_collective", "ckpt_pickle"];

/// The identifiers of `code`, each with the identifier it follows by `::` (`Format::Hf` gives `("Hf",
/// Some("Format"))`).
fn words(code: &str) -> Vec<(String, Option<String>)> {
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    let mut word = String::new();
    let mut after_path = false;
    let mut previous: Option<String> = None;
    for c in code.chars().chain([' ']) {
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            let qualifier = if after_path { previous.clone() } else { None };
            previous = Some(word.clone());
            out.push((std::mem::take(&mut word), qualifier));
            after_path = false;
        }
        if c == ':' {
            after_path = true;
        } else if !c.is_whitespace() {
            after_path = false;
            previous = None;
        }
    }
    out
}

/// The format crates: the facade's `ckpt-*` dependencies less [`NOT_FORMATS`], as identifiers.
fn format_crates() -> Vec<String> {
    let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    let deps = manifest.split("[dependencies]").nth(1).unwrap().split("\n[").next().unwrap();
    deps.lines()
        .filter_map(|l| l.split_once(['.', ' ', '=']).map(|(name, _)| name.trim()))
        .filter(|name| name.starts_with("ckpt-"))
        .map(|name| name.replace('-', "_"))
        .filter(|name| !NOT_FORMATS.contains(&name.as_str()))
        .collect()
}

/// Every name of a format in `text`'s code: a format crate, or `Format::<Variant>`.
fn format_names(text: &str, crates: &[String], variants: &[String]) -> Vec<String> {
    words(&code(text))
        .into_iter()
        .filter_map(|(word, qualifier)| {
            if crates.contains(&word) {
                return Some(word);
            }
            (qualifier.as_deref() == Some("Format") && variants.contains(&word)).then(|| format!("Format::{word}"))
        })
        .collect()
}

#[test]
fn formats_are_named_only_in_the_enum_the_registry_the_adaptors_and_options() {
    let crates = format_crates();
    assert!(crates.len() >= 8 && crates.iter().any(|c| c == "ckpt_distcp"), "{crates:?}");
    let variants: Vec<String> = ckpt::Format::ALL.iter().map(|f| format!("{f:?}")).collect();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut offending = Vec::new();
    let mut scanned = 0;
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !ALLOWED_DIRS.contains(&name.as_str()) {
                    dirs.push(path);
                }
                continue;
            }
            if !name.ends_with(".rs") || ALLOWED.contains(&name.as_str()) {
                continue;
            }
            scanned += 1;
            for found in format_names(&std::fs::read_to_string(&path).unwrap(), &crates, &variants) {
                if !ALLOWED_NAMES.iter().any(|(file, allowed, _)| *file == name && found.contains(allowed)) {
                    offending.push(format!("src/{name}: {found}"));
                }
            }
        }
    }
    assert!(scanned >= 15, "only {scanned} files scanned: the scan is broken");
    assert!(offending.is_empty(), "formats named outside their adaptor: {offending:#?}");
}

#[test]
fn the_scan_sees_format_names_in_code_only() {
    let crates = vec!["ckpt_distcp".to_owned(), "ckpt_safetensors".to_owned()];
    let variants = vec!["Hf".to_owned(), "Hfai".to_owned(), "Torch".to_owned()];
    let text = "use ckpt_distcp::{A, B};\n\
                // Format::Torch, ckpt_safetensors::x\n\
                /// [`ckpt_distcp::save`]\n\
                let a = Format::Hf; let b = Format::ALL; let c = format :: Hfai; let d = \"Format::Torch\";\n\
                let e = crate::format::Format::Hfai; let f = my_ckpt_distcp; let g = ckpt_tensor::Value;\n";
    assert_eq!(format_names(text, &crates, &variants), ["ckpt_distcp", "Format::Hf", "Format::Hfai"]);
}
