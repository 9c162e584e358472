//! The layer order written at the top of docs/architecture.md holds in the
//! code: every `crate::…` path in `src/` names a module of a lower layer (or
//! the file's own top-level module). Siblings, the modules one line of the
//! order lists together, do not import each other. A module missing from the
//! order fails too, so a new one has to be given its place.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The layers, top first, as the map's first fenced block lists them.
fn layer_order() -> Vec<Vec<String>> {
    let map = std::fs::read_to_string("docs/architecture.md").expect("docs/architecture.md");
    let block = map.split("```").nth(1).expect("a fenced block with the layer order at the top of docs/architecture.md");
    block
        .lines()
        .skip(1) // the fence's info string
        .filter(|line| !line.trim().is_empty())
        .map(|line| line.split('|').map(|m| m.trim().to_string()).collect())
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`src/planner/ddl.rs`
/// → `planner`, `src/config.rs` → `config`).
fn top_module(path: &Path) -> String {
    let relative = path.strip_prefix("src").unwrap();
    let first = relative.components().next().unwrap().as_os_str().to_string_lossy().to_string();
    first.trim_end_matches(".rs").to_string()
}

/// The top-level modules a file's code names through `crate::`: `crate::a::…`
/// and each item of `crate::{a::…, b, …}`. Comments count too: a doc link
/// to a higher layer is the same dependency in prose.
fn named_modules(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            let end = matching_brace(group);
            for item in split_top_level(&group[..end]) {
                out.push(leading_identifier(item.trim()));
            }
        } else {
            out.push(leading_identifier(after));
        }
        rest = after;
    }
    out.retain(|m| !m.is_empty());
    out
}

fn matching_brace(text: &str) -> usize {
    let mut depth = 0;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            _ => {}
        }
    }
    text.len()
}

fn split_top_level(text: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn leading_identifier(text: &str) -> String {
    text.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

#[test]
fn no_module_imports_upward_or_sideways() {
    let order = layer_order();
    let layer: HashMap<String, usize> = order.iter().enumerate().flat_map(|(i, line)| line.iter().map(move |m| (m.clone(), i))).collect();
    let mut files = Vec::new();
    rust_files(Path::new("src"), &mut files);
    let mut violations = Vec::new();
    let mut unplaced = Vec::new();
    for file in &files {
        let module = top_module(file);
        if module == "lib" {
            continue;
        }
        let Some(&from) = layer.get(&module) else {
            unplaced.push(module);
            continue;
        };
        let source = std::fs::read_to_string(file).unwrap();
        for named in named_modules(&source) {
            if named == module || named == "self" || named == "super" {
                continue;
            }
            match layer.get(&named) {
                Some(&to) if to > from => {}
                Some(_) => violations.push(format!("{}: {module} (layer {from}) names crate::{named}", file.display())),
                None => unplaced.push(named),
            }
        }
    }
    unplaced.sort();
    unplaced.dedup();
    assert!(unplaced.is_empty(), "modules missing from the layer order in docs/architecture.md: {unplaced:?}");
    violations.sort();
    violations.dedup();
    assert!(violations.is_empty(), "imports against the layer order (top first: {order:?}):\n{}", violations.join("\n"));
}

#[test]
fn the_scan_sees_grouped_and_nested_paths() {
    let names = named_modules("use crate::{a::b, c, d::{e, f}}; fn g() { crate::h::i(); }");
    assert_eq!(names, ["a", "c", "d", "h"]);
}
