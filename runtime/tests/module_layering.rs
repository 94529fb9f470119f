//! The layering of `runtime/src`'s top-level modules: no module depends, through any chain of
//! `crate::…` paths (tests included), on a module that depends on it.
//!
//! A top-level module is a file `src/X.rs` or a folder `src/X/` (with `src/X.rs` or
//! `src/X/mod.rs`); its dependencies are the modules named by `crate::NAME` or
//! `crate::{NAME, …}` anywhere in its files, comments left out (a doc link is not an import).
//! Besides acyclicity, two rules of the layering are checked by name:
//! - `store` (the neuron store's format) does not depend on `model`, so the two never depend
//!   on each other (`convert`, which needs both, sits above them);
//! - `plan` is the contract: no module it depends on depends on it, directly or not.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without comments (line comments, doc comments and block comments); string
/// literals are kept as they are (no `crate::` path appears in one).
fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut chars = src.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            if c == '\\' {
                if let Some(n) = chars.next() {
                    out.push(n);
                }
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match (c, chars.peek()) {
            ('"', _) => {
                in_string = true;
                out.push(c);
            }
            ('/', Some('/')) => {
                for n in chars.by_ref() {
                    if n == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            ('/', Some('*')) => {
                chars.next();
                let mut depth = 1;
                let mut prev = ' ';
                for n in chars.by_ref() {
                    match (prev, n) {
                        ('/', '*') => {
                            depth += 1;
                            prev = ' ';
                            continue;
                        }
                        ('*', '/') => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                            prev = ' ';
                            continue;
                        }
                        _ => {}
                    }
                    prev = n;
                }
            }
            _ => out.push(c),
        }
    }
    out
}

fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The top-level modules named by `crate::NAME` and `crate::{NAME, …}` in `src`.
fn crate_refs(src: &str) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let bytes = src.as_bytes();
    let mut at = 0;
    while let Some(i) = src[at..].find("crate::") {
        let start = at + i;
        at = start + "crate::".len();
        // `crate` as a whole word: not `$crate`, not `my_crate::`.
        if start > 0 {
            let p = bytes[start - 1];
            if p.is_ascii_alphanumeric() || p == b'_' || p == b'$' {
                continue;
            }
        }
        let rest = &src[at..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group: split at commas outside nested braces.
            let mut depth = 0;
            let mut item_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if c.is_whitespace() => {}
                    _ if item_start && depth == 0 => {
                        item_start = false;
                        let name = ident(&group[j..]);
                        if !name.is_empty() && name != "self" {
                            refs.insert(name);
                        }
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                refs.insert(name);
            }
        }
    }
    refs
}

/// Every top-level module of `runtime/src` and the other top-level modules it names.
fn module_graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut modules: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_string();
        if path.is_dir() {
            let mut files = Vec::new();
            rust_files(&path, &mut files);
            modules.entry(name).or_default().extend(files);
        } else if path.extension().is_some_and(|e| e == "rs") && name != "lib" {
            modules.entry(name).or_default().push(path);
        }
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(name, files)| {
            let mut deps = BTreeSet::new();
            for f in files {
                let text = strip_comments(&std::fs::read_to_string(f).unwrap());
                deps.extend(
                    crate_refs(&text)
                        .into_iter()
                        .filter(|d| d != name && names.contains(d)),
                );
            }
            (name.clone(), deps)
        })
        .collect()
}

/// A cycle through the graph, as a path whose first and last modules are the same.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        New,
        Open,
        Done,
    }
    fn visit(
        graph: &Graph,
        node: &str,
        state: &mut BTreeMap<String, State>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), State::Open);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next).copied().unwrap_or(State::New) {
                State::Open => {
                    let from = stack.iter().position(|m| m == next).unwrap();
                    let mut cycle = stack[from..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                State::New => {
                    if let Some(c) = visit(graph, next, state, stack) {
                        return Some(c);
                    }
                }
                State::Done => {}
            }
        }
        stack.pop();
        state.insert(node.to_string(), State::Done);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if state.get(node).copied().unwrap_or(State::New) == State::New {
            if let Some(c) = visit(graph, node, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// Whether `to` can be reached from `from` (a path of one edge or more), and one such path.
fn path(graph: &Graph, from: &str, to: &str) -> Option<Vec<String>> {
    let mut seen = BTreeSet::new();
    let mut queue = std::collections::VecDeque::from([vec![from.to_string()]]);
    while let Some(p) = queue.pop_front() {
        for next in graph.get(p.last().unwrap()).into_iter().flatten() {
            let mut q = p.clone();
            q.push(next.clone());
            if next == to {
                return Some(q);
            }
            if seen.insert(next.clone()) {
                queue.push_back(q);
            }
        }
    }
    None
}

fn describe(graph: &Graph) -> String {
    graph
        .iter()
        .map(|(m, deps)| {
            let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
            format!("  {m} -> {}\n", deps.join(" "))
        })
        .collect()
}

#[test]
fn top_level_modules_form_no_import_circle() {
    let graph = module_graph();
    // The scan sees the modules it must (a guard against a scan that finds nothing).
    for m in [
        "cache", "exec", "model", "plan", "schedule", "sparse", "store",
    ] {
        assert!(
            graph.contains_key(m),
            "no module `{m}` found:\n{}",
            describe(&graph)
        );
    }
    assert!(graph["exec"].contains("schedule"), "{}", describe(&graph));
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "import circle between runtime modules: {}\nthe graph:\n{}",
            cycle.join(" -> "),
            describe(&graph)
        );
    }
}

#[test]
fn model_and_store_do_not_depend_on_each_other() {
    let graph = module_graph();
    if let Some(p) = path(&graph, "store", "model") {
        panic!(
            "store depends on model: {}\nthe graph:\n{}",
            p.join(" -> "),
            describe(&graph)
        );
    }
    assert!(
        !(graph["model"].contains("store") && path(&graph, "store", "model").is_some()),
        "model and store depend on each other"
    );
}

#[test]
fn nothing_plan_depends_on_depends_on_plan() {
    let graph = module_graph();
    for dep in &graph["plan"] {
        if let Some(p) = path(&graph, dep, "plan") {
            panic!(
                "plan depends on `{dep}`, which depends on plan: {}\nthe graph:\n{}",
                p.join(" -> "),
                describe(&graph)
            );
        }
    }
}

#[test]
fn the_scan_reads_paths_and_groups_but_not_comments() {
    let src = "use crate::{model::Model, plan::{A, B}, self};\n\
               // crate::exec in a comment\n\
               /* crate::trace /* nested */ crate::sample */\n\
               let x = crate::quant::row_bytes; let y = $crate::gguf; my_crate::neuron;\n";
    let refs = crate_refs(&strip_comments(src));
    let want: BTreeSet<String> = ["model", "plan", "quant"].map(String::from).into();
    assert_eq!(refs, want);
    let mut g = Graph::new();
    g.insert("a".into(), ["b".to_string()].into());
    g.insert("b".into(), ["c".to_string()].into());
    g.insert("c".into(), ["a".to_string()].into());
    assert_eq!(find_cycle(&g).unwrap(), ["a", "b", "c", "a"]);
    g.get_mut("c").unwrap().clear();
    assert_eq!(find_cycle(&g), None);
    assert_eq!(path(&g, "a", "c").unwrap(), ["a", "b", "c"]);
}
