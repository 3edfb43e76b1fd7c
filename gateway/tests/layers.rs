//! The crate's modules import downward only: each top-level folder may use its own modules
//! and the layers below it (lib.rs's table), and no two modules import each other, however
//! indirectly. Edges are the `crate::...` paths of each file's code (its tests left out).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod common;

/// Top to bottom: a layer may use those after it.
const LAYERS: [&str; 8] = [
    "http",
    "app",
    "plan",
    "upstream",
    "model",
    "telemetry",
    "api",
    "settings",
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable").flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `a::b` of src/a/b.rs and of src/a/b/mod.rs.
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file
        .strip_prefix(src)
        .expect("under src/")
        .with_extension("");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts.join("::")
}

/// The modules `code` names through `crate::` paths (a `use crate::a::{b, c}` names a::b and
/// a::c), each resolved to the longest known module.
fn edges(code: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let end = rest
            .find(|c: char| {
                !(c.is_alphanumeric()
                    || c == '_'
                    || c == ':'
                    || c == '{'
                    || c == ','
                    || c == ' '
                    || c == '\n')
            })
            .unwrap_or(rest.len());
        let path = &rest[..end];
        let (head, group) = match path.split_once('{') {
            Some((head, group)) => (head, group),
            None => (path, ""),
        };
        let head = head.trim_end_matches(':');
        let mut candidates = vec![head.to_string()];
        for item in group.split(',') {
            let item = item.trim().split("::").next().unwrap_or("");
            if !item.is_empty() && item != "self" {
                candidates.push(format!("{head}::{item}"));
            }
        }
        for candidate in candidates {
            let segments: Vec<&str> = candidate.split("::").collect();
            let found = (1..=segments.len())
                .rev()
                .map(|n| segments[..n].join("::"))
                .find(|m| known.contains(m));
            if let Some(m) = found {
                out.insert(m);
            }
        }
    }
    out
}

/// Each module and the modules it imports.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = common::manifest_dir().join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let modules: BTreeMap<String, PathBuf> = files
        .iter()
        .filter(|f| !f.ends_with("main.rs") && !f.ends_with("lib.rs"))
        .map(|f| (module_of(&src, f), f.clone()))
        .collect();
    let known: BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(module, file)| {
            let text = std::fs::read_to_string(file).expect("a readable source");
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            let code: String = code
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            let mut to = edges(&code, &known);
            // A module's own path and its parents (a folder's mod.rs) are not imports.
            to.retain(|m| m != module && !module.starts_with(&format!("{m}::")));
            (module.clone(), to)
        })
        .collect()
}

/// A cycle through `graph`, if any, as the modules along it.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(m.to_string(), 1);
        path.push(m.to_string());
        for next in graph.get(m).into_iter().flatten() {
            match state.get(next.as_str()).copied().unwrap_or(0) {
                1 => {
                    let start = path.iter().position(|p| p == next).unwrap_or(0);
                    let mut found = path[start..].to_vec();
                    found.push(next.clone());
                    return Some(found);
                }
                0 => {
                    if let Some(found) = visit(next, graph, state, path) {
                        return Some(found);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in graph.keys() {
        if state.get(m.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(found) = visit(m, graph, &mut state, &mut Vec::new()) {
                return Some(found);
            }
        }
    }
    None
}

fn layer(module: &str) -> usize {
    let top = module.split("::").next().unwrap_or("");
    LAYERS
        .iter()
        .position(|l| *l == top)
        .unwrap_or_else(|| panic!("{module} is in no layer of LAYERS"))
}

#[test]
fn no_module_imports_another_that_imports_it() {
    let graph = graph();
    assert!(graph.len() > 20, "{graph:?}");
    if let Some(found) = cycle(&graph) {
        panic!("a module cycle: {}", found.join(" -> "));
    }
}

#[test]
fn every_import_points_down_the_layers() {
    let mut upward = Vec::new();
    for (module, targets) in graph() {
        for target in targets {
            if layer(&target) < layer(&module) {
                upward.push(format!("{module} -> {target}"));
            }
        }
    }
    assert!(upward.is_empty(), "imports up the layers: {upward:?}");
}

#[test]
fn the_check_sees_cycles_and_grouped_imports() {
    let known: BTreeSet<String> = ["a", "a::b", "a::c", "d"].map(String::from).into();
    let found = edges("use crate::a::{b, c::X};\nlet x = crate::d::f();", &known);
    assert_eq!(found, ["a", "a::b", "a::c", "d"].map(String::from).into());
    let mut graph = BTreeMap::new();
    graph.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    graph.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    graph.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(cycle(&graph).unwrap(), ["a", "b", "c", "a"]);
    graph.insert("c".to_string(), BTreeSet::new());
    assert_eq!(cycle(&graph), None);
}
