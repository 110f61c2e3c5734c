//! The facade's modules import downward only: each module names only modules of lower layers (the table in
//! `src/lib.rs`), always by their own path (`crate::format::Format`), never through the crate root's
//! re-exports, so no two modules depend on each other and the order in which to read them is the table's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::Path;

mod scan;
use scan::code;

/// The layers, bottom first, as `src/lib.rs` lists them.
const LAYERS: &[&[&str]] = &[
    &["format", "suggest"],
    &["error"],
    &["limits", "select", "source", "display", "outline"],
    &["checkpoint"],
    &["options", "report"],
    &["agree"],
    &["adaptor"],
    &["formats"],
    &["open", "destination"],
    &["convert", "diff", "inspect", "reshard", "storage", "verify"],
    &["ranks", "progress", "place"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// Every `crate::<name>` a file's code refers to.
fn references(text: &str) -> Vec<String> {
    let code = code(text);
    let mut refs = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        let preceded = rest[..i].chars().last().is_some_and(|c| c.is_alphanumeric() || c == '_');
        rest = after;
        if preceded {
            continue;
        }
        if let Some(group) = after.strip_prefix('{') {
            // `crate::{a::X, b, C}`: the first segment of each path in the group.
            let mut depth = 0;
            let end = group
                .char_indices()
                .find(|&(_, c)| {
                    depth += i32::from(c == '{') - i32::from(c == '}');
                    depth < 0
                })
                .map_or(group.len(), |(j, _)| j);
            let mut depth = 0;
            let mut start = true;
            let mut name = String::new();
            for c in group[..end].chars().chain([',']) {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        if !name.is_empty() {
                            refs.push(std::mem::take(&mut name));
                        }
                        start = true;
                    }
                    c if start && (c.is_alphanumeric() || c == '_') => name.push(c),
                    c if start && !c.is_whitespace() => start = false,
                    _ => {}
                }
            }
            continue;
        }
        let name: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if !name.is_empty() {
            refs.push(name);
        }
    }
    refs
}

#[test]
fn modules_import_downward_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            files.insert(
                path.file_stem().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&path).unwrap(),
            );
        }
    }
    // A module's child modules (formats/<format>.rs, options/named.rs) belong to its layer.
    for parent in ["formats", "options"] {
        for entry in std::fs::read_dir(src.join(parent)).unwrap() {
            let path = entry.unwrap().path();
            let name = format!("{parent}/{}", path.file_stem().unwrap().to_string_lossy());
            files.insert(name, std::fs::read_to_string(&path).unwrap());
        }
    }
    let lib = files.remove("lib").expect("src/lib.rs");
    // Every module of lib.rs is in the table, and every module of the table exists.
    for layer in LAYERS {
        for m in *layer {
            assert!(files.contains_key(*m), "the table names {m}, which src/ lacks");
            assert!(lib.contains(&format!("mod {m};")), "lib.rs does not declare {m}");
        }
    }
    let mut checked = 0;
    for (file, text) in &files {
        let module = file.split('/').next().unwrap();
        let own = layer_of(module).unwrap_or_else(|| panic!("src/{file}.rs is not in the layer table"));
        for name in references(text) {
            if name == module {
                continue;
            }
            let Some(layer) = layer_of(&name) else {
                panic!("src/{file}.rs refers to crate::{name}: an item through the crate root, not a module's path")
            };
            assert!(
                layer < own,
                "src/{file}.rs (layer {own}) imports crate::{name} (layer {layer}): upward or sideways"
            );
            checked += 1;
        }
    }
    assert!(checked > 100, "only {checked} references found: the scan is broken");
}

#[test]
fn the_scan_sees_code_not_comments() {
    assert_eq!(
        references("use crate::error::Error; // crate::convert\n/// [`crate::open`]\nlet s = \"crate::x\";"),
        ["error"]
    );
    assert!(references("mycrate::x").is_empty());
    assert_eq!(references("use crate::{format::Format, error::{At, Error}, Value};"), ["format", "error", "Value"]);
}
