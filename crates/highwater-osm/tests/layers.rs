//! The OSM code has no circle (issue 25): each module of this crate names
//! (`crate::x`) only modules of lower layers, so the trait names no
//! dataset, features and expiry name neither, and no dataset names
//! another. Below this crate, `highwater-osm-store` cannot name it at all:
//! it does not depend on it (checked here too, on its manifest).
//!
//! Read from the sources, comments left out: a new `crate::` path that
//! climbs a layer fails this test, naming the file and the line.

use std::path::{Path, PathBuf};

/// Every top module of the crate and its layer, lowest first. A module may
/// name modules of lower layers, and its own submodules; one of the same
/// layer, only if it is itself (the datasets, layer 8, never name one
/// another). The store crate's modules, re-exported at the crate root, are
/// layer 0.
const LAYERS: &[(&str, u32)] = &[
    ("cells", 0),
    ("flatnodes", 0),
    ("import", 0),
    ("model", 0),
    ("nodeblocks", 0),
    ("spill", 0),
    ("store", 0),
    ("xml", 0),
    ("mvt", 1),
    ("geom", 1),
    ("coast", 2),
    ("schema", 3),
    ("features", 4),
    ("areas", 5),
    ("derive", 5),
    ("dataset", 6),
    ("aggregates", 8),
    ("search", 8),
    ("tiles", 8),
    ("registry", 9),
    ("fetch", 10),
    ("ops", 11),
];

fn layer(module: &str) -> Option<u32> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|&(_, l)| l)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top modules a line names through `crate::`: `crate::x::...` and
/// each `x` of `crate::{x, y::z}`.
fn named(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        // `highwater_osm_store::...` and the like are not this crate.
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let ident = |s: &str| -> String {
            s.trim_start()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        };
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let m = ident(part);
                if !m.is_empty() {
                    out.push(m);
                }
            }
        } else {
            let m = ident(rest);
            if !m.is_empty() {
                out.push(m);
            }
        }
    }
    out
}

#[test]
fn no_module_names_a_module_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut bad = Vec::new();
    let mut seen = 0;
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if top == "lib" {
            continue;
        }
        let own = layer(&top)
            .unwrap_or_else(|| panic!("{}: module {top:?} has no layer in LAYERS", rel.display()));
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for m in named(line) {
                seen += 1;
                if m == top {
                    continue;
                }
                let Some(l) = layer(&m) else {
                    bad.push(format!(
                        "{}:{}: crate::{m} has no layer",
                        rel.display(),
                        n + 1
                    ));
                    continue;
                };
                if l >= own {
                    bad.push(format!(
                        "{}:{}: {top} (layer {own}) names crate::{m} (layer {l})",
                        rel.display(),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(seen > 100, "the scan found only {seen} crate:: paths");
    assert!(
        bad.is_empty(),
        "modules naming a layer at or above their own:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_store_crate_depends_on_no_crate_above_it() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../highwater-osm-store/Cargo.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    for line in text.lines() {
        let dep = line.split(['=', ' ']).next().unwrap_or("");
        assert!(
            !(dep.starts_with("highwater-osm") && dep != "highwater-osm-store"),
            "{}: {line}",
            manifest.display()
        );
    }
}

#[test]
fn the_trait_names_no_dataset_kind() {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/dataset.rs"))
            .unwrap();
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        for kind in ["\"tiles\"", "\"search\"", "\"aggregates\""] {
            assert!(
                !line.contains(&format!("kind() == {kind}"))
                    && !line.contains(&format!("kind() != {kind}")),
                "dataset.rs:{}: {line}",
                n + 1
            );
        }
    }
}

/// Issue 25: "adding a fourth touches only its own folder and one
/// registration line." Nothing but the registry names a kind: `dataset`
/// (the trait), `ops` (config, apply, status) and `fetch` name no
/// dataset module and no kind's name, and the registry's list has one
/// line per kind. (`tests/fourth_kind.rs` runs a fourth kind through
/// `ops`.)
#[test]
fn only_the_registry_names_the_kinds() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let kinds = ["tiles", "search", "aggregates"];
    for file in ["dataset.rs", "ops.rs", "fetch.rs"] {
        let text = std::fs::read_to_string(src.join(file)).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for m in named(line) {
                assert!(!kinds.contains(&m.as_str()), "{file}:{}: {line}", n + 1);
            }
            for k in kinds {
                assert!(
                    !line.contains(&format!("\"{k}\"")) && !line.contains(&format!("osm.{k}")),
                    "{file}:{}: {line}",
                    n + 1
                );
            }
        }
    }
    let registry = std::fs::read_to_string(src.join("registry.rs")).unwrap();
    let list = registry
        .split("pub const KINDS")
        .nth(1)
        .and_then(|r| r.split("];").next())
        .expect("registry.rs has `pub const KINDS: [Kind; N] = [...];`");
    for k in kinds {
        let lines: Vec<&str> = list
            .lines()
            .filter(|l| l.contains(&format!("crate::{k}::")))
            .collect();
        assert_eq!(
            lines,
            [format!("    crate::{k}::KIND,")],
            "one registration line for {k}"
        );
    }
}
