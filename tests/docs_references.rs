//! The docs cite source files, test files and test names in backticks; a rename that forgets
//! them leaves a reader looking for code that is not there. Every file path the README and
//! `docs/` cite must name a file of the tree (or end one: `exec/inline.rs` is
//! `runtime/src/exec/inline.rs`), and every long snake_case name they cite (a test, a function,
//! a field, a metric) must appear in the code.

use std::path::{Path, PathBuf};

/// Names the docs cite that are not ours: what a disassembly of another crate shows.
const FOREIGN_NAMES: &[&str] = &[
    // The `half` crate's out-of-line conversion (docs/aarch64.md).
    "f16_to_f32_fp16",
];

/// Extensions of the files whose text the cited names are looked for in.
const CODE: &[&str] = &["rs", "py", "toml", "js", "html", "css", "sh"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file under `dir`, relative to the root, skipping build outputs and version control.
fn walk(dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if [".git", "target", "node_modules", "__pycache__"]
            .iter()
            .any(|skip| name == *skip)
        {
            continue;
        }
        if path.is_dir() {
            walk(&path, out);
        } else if let Ok(rel) = path.strip_prefix(root()) {
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// The text between each pair of backticks of `text` (code spans; fenced blocks' lines are
/// skipped, being commands rather than citations).
fn code_spans(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut parts = line.split('`');
        parts.next();
        while let (Some(span), Some(_)) = (parts.next(), parts.next()) {
            out.push(span.trim());
        }
    }
    out
}

/// A cited file path: no spaces, a slash, a known extension, no pattern (`*`, `{a,b}`) and no
/// placeholder in capitals (`ARCH.json`).
fn is_path(span: &str) -> bool {
    let ext = span.rsplit('.').next().unwrap_or("");
    !span.contains(char::is_whitespace)
        && span.contains('/')
        && !span.starts_with("../")
        && !span.contains("://")
        && !span.contains(['*', '{'])
        && [
            "rs", "md", "py", "toml", "json", "jsonl", "js", "html", "css", "txt",
        ]
        .contains(&ext)
        && !span
            .split(['/', '.'])
            .any(|part| part.len() > 1 && part.chars().all(|c| c.is_ascii_uppercase()))
}

/// A long snake_case name: lowercase words joined by at least three underscores.
fn is_long_name(span: &str) -> bool {
    span.split('_').count() >= 4
        && span.split('_').all(|w| {
            !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        })
        && span.starts_with(|c: char| c.is_ascii_lowercase())
}

#[test]
fn every_path_and_name_the_docs_cite_exists() {
    let mut files = Vec::new();
    walk(&root(), &mut files);
    let code: String = files
        .iter()
        .filter(|f| CODE.iter().any(|e| f.ends_with(&format!(".{e}"))))
        .filter_map(|f| std::fs::read_to_string(root().join(f)).ok())
        .collect();
    let docs: Vec<&String> = files
        .iter()
        .filter(|f| {
            f.as_str() == "README.md"
                || f.as_str() == "bench/README.md"
                || (f.starts_with("docs/") && f.ends_with(".md"))
        })
        .collect();
    assert!(docs.len() > 5, "the docs were not found: {docs:?}");
    let (mut paths, mut names) = (0, 0);
    let mut missing = Vec::new();
    for doc in docs {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        for span in code_spans(&text) {
            if is_path(span) {
                paths += 1;
                let found = files
                    .iter()
                    .any(|f| f == span || f.ends_with(&format!("/{span}")));
                if !found {
                    missing.push(format!("{doc}: file `{span}`"));
                }
            } else if is_long_name(span) && !FOREIGN_NAMES.contains(&span) {
                names += 1;
                // Metrics are registered without the namespace prefix they are served with.
                let bare = span.strip_prefix("conductor_").unwrap_or(span);
                if !code.contains(span) && !code.contains(bare) {
                    missing.push(format!("{doc}: name `{span}`"));
                }
            }
        }
    }
    assert!(
        paths > 50 && names > 20,
        "too few citations found ({paths} paths, {names} names): the scanner is broken"
    );
    assert!(
        missing.is_empty(),
        "cited in the docs but not in the tree:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_scanner_finds_paths_and_names_and_skips_the_rest() {
    let text = "See `runtime/src/exec/inline.rs` and `a_test_that_is_long` or `Layout::X8`.\n\
                ```sh\nrun `not_this_one_here_either`\n```\n`docs/ARCH.json` `x_y`";
    let spans = code_spans(text);
    assert_eq!(
        spans,
        [
            "runtime/src/exec/inline.rs",
            "a_test_that_is_long",
            "Layout::X8",
            "docs/ARCH.json",
            "x_y"
        ]
    );
    assert!(is_path(spans[0]) && !is_path(spans[2]) && !is_path(spans[3]));
    assert!(!is_path("bench/results/a-*.json") && !is_path("bench/results/a-{25,50}.json"));
    assert!(is_long_name(spans[1]) && !is_long_name(spans[4]) && !is_long_name(spans[2]));
}
