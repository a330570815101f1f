//! Ivy's modules import one way: this test reads `ivy/src`, builds the graph
//! of `crate::`/`super::`/`self::` paths between modules and fails naming
//! any cycle. Two graphs are checked:
//!
//! - modules (one per file): an edge from a module to any other module it
//!   names, except to its own ancestors (a child may use what its parent
//!   declares: the parent is its namespace, e.g. `pipeline::Job`);
//! - top-level modules (`config`, `net`, `request`, `http`, `grpc`,
//!   `pipeline`, `model`, `upstream`, `state`, ...): every edge between two
//!   of them, so a folder never imports back up the request's path.
//!
//! Test code (`#[cfg(test)] mod tests`, `tests.rs` files) is left out: only
//! what ships counts. Comments are stripped before reading paths.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path below `crate`, e.g. `["upstream", "replica"]`; empty is
/// the crate root (`main.rs`).
type Module = Vec<String>;

fn main_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every non-test `.rs` file under `src`: its module path and text.
fn modules(src: &Path) -> BTreeMap<Module, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read ivy/src") {
            let path = entry.expect("read ivy/src entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).expect("below src");
            let mut module: Module = rel
                .iter()
                .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            match module.last().map(String::as_str) {
                Some("tests") => continue,
                Some("mod") | Some("main") => {
                    module.pop();
                }
                _ => {}
            }
            let text = std::fs::read_to_string(&path).expect("read a source file");
            out.insert(module, text);
        }
    }
    out
}

/// The file without its test module and without comments.
fn shipped_code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim();
        if t == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|n| n.trim_start().starts_with("mod tests"))
        {
            break;
        }
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// The paths a module's code names, absolute (`crate` stripped), e.g.
/// `use crate::{a::B, c}` gives `a::B` and `c`.
fn named_paths(module: &Module, code: &str, children: &BTreeSet<String>) -> Vec<Module> {
    let mut paths = Vec::new();
    // `use` trees, including groups.
    let mut rest = code;
    while let Some(i) = find_use(rest) {
        let after = &rest[i..];
        let end = after.find(';').unwrap_or(after.len());
        let tree: String = after["use".len()..end].split_whitespace().collect();
        for p in expand(&tree) {
            if let Some(abs) = absolute(module, &p, children) {
                paths.push(abs);
            }
        }
        rest = &after[end..];
    }
    // Paths in code: `crate::a::b`, `super::a`.
    for prefix in ["crate::", "super::"] {
        let mut at = 0;
        while let Some(i) = code[at..].find(prefix) {
            let start = at + i;
            at = start + prefix.len();
            let before = code[..start].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let path: String = code[start..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let segs: Vec<String> = path
                .split("::")
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            if let Some(abs) = absolute(module, &segs, children) {
                paths.push(abs);
            }
        }
    }
    paths
}

/// Where the next `use` statement starts: a line that begins with `use`,
/// `pub use` or `pub(...) use` (not the word in a string).
fn find_use(code: &str) -> Option<usize> {
    let mut line_start = 0;
    for line in code.split_inclusive('\n') {
        let t = line.trim_start();
        let t_at = line_start + (line.len() - t.len());
        let after_vis = if let Some(r) = t.strip_prefix("pub(") {
            r.find(')').map(|i| r[i + 1..].trim_start())
        } else {
            Some(t.strip_prefix("pub ").unwrap_or(t))
        };
        if let Some(r) = after_vis.filter(|r| r.starts_with("use ")) {
            return Some(t_at + (t.len() - r.len()));
        }
        line_start += line.len();
    }
    None
}

/// `a::{b::C, d}` → `[a, b, C]`, `[a, d]`.
fn expand(tree: &str) -> Vec<Vec<String>> {
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree);
        return vec![path
            .split("::")
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()];
    };
    let prefix: Vec<String> = tree[..open]
        .split("::")
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut from) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[from..]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(expand)
        .map(|tail| prefix.iter().cloned().chain(tail).collect())
        .collect()
}

/// A path as seen from `module`, made absolute; `None` for paths outside
/// the crate (`std::`, other crates).
fn absolute(module: &Module, segs: &[String], children: &BTreeSet<String>) -> Option<Module> {
    let first = segs.first()?;
    match first.as_str() {
        "crate" => Some(segs[1..].to_vec()),
        "self" => Some(
            module
                .iter()
                .cloned()
                .chain(segs[1..].iter().cloned())
                .collect(),
        ),
        "super" => {
            let mut base = module.clone();
            let mut rest = segs;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
            Some(base.into_iter().chain(rest.iter().cloned()).collect())
        }
        // `use child::X` from a parent module.
        name if children.contains(name) => {
            Some(module.iter().cloned().chain(segs.iter().cloned()).collect())
        }
        _ => None,
    }
}

/// The longest module that is a prefix of `path`.
fn owner<'a>(path: &[String], known: &'a BTreeMap<Module, String>) -> Option<&'a Module> {
    (0..=path.len())
        .rev()
        .find_map(|n| known.get_key_value(&path[..n]).map(|(k, _)| k))
}

type Graph = BTreeMap<Module, BTreeSet<Module>>;

fn graphs(known: &BTreeMap<Module, String>) -> (Graph, Graph) {
    let mut files = Graph::new();
    let mut tops = Graph::new();
    for (module, code) in known {
        let children: BTreeSet<String> = known
            .keys()
            .filter(|k| k.len() == module.len() + 1 && k.starts_with(module))
            .map(|k| k[module.len()].clone())
            .collect();
        for path in named_paths(module, &shipped_code(code), &children) {
            let Some(to) = owner(&path, known) else {
                continue;
            };
            let is_ancestor = module.starts_with(to);
            if !is_ancestor {
                files.entry(module.clone()).or_default().insert(to.clone());
            }
            let (a, b) = (module.first(), to.first());
            if let (Some(a), Some(b)) = (a, b) {
                if a != b {
                    tops.entry(vec![a.clone()])
                        .or_default()
                        .insert(vec![b.clone()]);
                }
            }
        }
    }
    (files, tops)
}

/// One cycle, if any, as the modules on it.
fn find_cycle(graph: &Graph) -> Option<Vec<Module>> {
    fn visit(
        node: &Module,
        graph: &Graph,
        state: &mut BTreeMap<Module, u8>,
        stack: &mut Vec<Module>,
    ) -> Option<Vec<Module>> {
        state.insert(node.clone(), 1);
        stack.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next) {
                Some(1) => {
                    let at = stack.iter().position(|m| m == next).expect("on the stack");
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(next, graph, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if !state.contains_key(node) {
            if let Some(c) = visit(node, graph, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

fn show(cycle: &[Module]) -> String {
    cycle
        .iter()
        .map(|m| {
            if m.is_empty() {
                "crate".to_string()
            } else {
                m.join("::")
            }
        })
        .collect::<Vec<_>>()
        .join(" -> ")
}

#[test]
fn no_cycle_between_modules() {
    let known = modules(&main_src());
    assert!(
        known.len() > 20,
        "read {} modules from ivy/src",
        known.len()
    );
    let (files, tops) = graphs(&known);
    if let Some(c) = find_cycle(&files) {
        panic!("import cycle between Ivy's modules: {}", show(&c));
    }
    if let Some(c) = find_cycle(&tops) {
        panic!("import cycle between Ivy's top-level modules: {}", show(&c));
    }
}

/// The reader itself: a group import, `super::`, and a cycle it must name.
#[test]
fn the_reader_sees_grouped_and_relative_paths() {
    let known: BTreeMap<Module, String> = [
        (vec!["a".to_string()], "use crate::{b::X, c};\n".to_string()),
        (
            vec!["b".to_string()],
            "// use crate::a;\nfn f() {}\n".to_string(),
        ),
        (
            vec!["c".to_string()],
            "fn g() { super::a::h() }\n".to_string(),
        ),
    ]
    .into_iter()
    .collect();
    let (files, _) = graphs(&known);
    assert_eq!(files[&vec!["a".to_string()]].len(), 2);
    assert!(
        !files.contains_key(&vec!["b".to_string()]),
        "a comment is no import"
    );
    let cycle = find_cycle(&files).expect("a -> c -> a");
    assert_eq!(show(&cycle), "a -> c -> a");
}
