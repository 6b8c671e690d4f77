//! Issue 51: the documentation's examples cannot rot. Over README.md and
//! every page of the book (docs/src/**/*.md):
//!
//! 1. every ```toml block is loaded by the real config loaders (the file
//!    stages' `highwater_files::config::parse`, each `[sources.NAME]`
//!    through `highwater_ingest::SourceSpec::parse`, `[osm]` through
//!    `highwater_osm::ops::OsmConfig::parse`); a block marked
//!    ```toml fragment is merged into the page's previous complete block
//!    and the result loaded; ```toml schema is a tile schema file, read by
//!    `highwater_osm::schema::Schema::parse`;
//! 2. every ```sh run block runs, in order, in a temp copy of examples/
//!    with the built `highwater` on PATH (`cargo run --release -p highwater
//!    --` stands for it), each under `bash -e -o pipefail`; its `# exit: N`
//!    line (default 0) is the exit code it must end with and each
//!    `# expect: TEXT` line is text its output must hold. A ```toml
//!    file=PATH block is written to PATH first, so the config shown is the
//!    config run;
//! 3. every config key the code knows (each field of a
//!    `#[serde(deny_unknown_fields)]` struct in crates/*/src: the config
//!    sections are all such structs) and every value of the enums those
//!    fields take, every command and long flag of the clap definition (and
//!    each command's `--help`, verbatim), and every metric `/metrics`
//!    writes appears in the reference;
//! 4. every relative link and #anchor between the pages resolves, and
//!    every page is in SUMMARY.md.
//!
//! How to mark blocks is documented in docs/src/contributing-docs.md.

mod common;
use common::*;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// README.md and the book's pages, as (path relative to the repo, text).
fn pages() -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let root = repo();
    let mut files = vec![root.join("README.md")];
    walk(&root.join("docs/src"), &mut files);
    files.sort();
    let pages: Vec<_> = files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (
                p.strip_prefix(&root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
                text,
            )
        })
        .collect();
    assert!(pages.len() > 10, "the book has {} pages", pages.len());
    pages
}

struct Block {
    page: String,
    line: usize,
    lang: String,
    attrs: Vec<String>,
    text: String,
}

impl Block {
    fn at(&self) -> String {
        format!("{}:{}", self.page, self.line)
    }
    fn attr(&self, name: &str) -> Option<&str> {
        self.attrs.iter().find_map(|a| {
            if a == name {
                Some("")
            } else {
                a.strip_prefix(name).and_then(|r| r.strip_prefix('='))
            }
        })
    }
}

/// The fenced code blocks of a page, in order (also those indented inside
/// a list item). The info string's first word is the language; the rest,
/// split on spaces or commas, are its attributes.
fn blocks(page: &str, text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(usize, usize, String, Vec<String>, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim_start();
        match &mut open {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    let mut words = info
                        .split([' ', ','])
                        .filter(|w| !w.is_empty())
                        .map(str::to_string);
                    let lang = words.next().unwrap_or_default();
                    open = Some((i + 1, indent, lang, words.collect(), String::new()));
                }
            }
            Some((start, ind, lang, attrs, body)) => {
                if trimmed.starts_with("```") && indent <= *ind {
                    out.push(Block {
                        page: page.to_string(),
                        line: *start,
                        lang: std::mem::take(lang),
                        attrs: std::mem::take(attrs),
                        text: std::mem::take(body),
                    });
                    open = None;
                } else {
                    let cut = line
                        .char_indices()
                        .take_while(|(k, c)| *k < *ind && c.is_whitespace())
                        .count();
                    body.push_str(&line[cut..]);
                    body.push('\n');
                }
            }
        }
    }
    assert!(open.is_none(), "{page}: a code block is never closed");
    out
}

fn all_blocks() -> Vec<Block> {
    pages().iter().flat_map(|(p, t)| blocks(p, t)).collect()
}

/// Loads a whole `highwater.toml` with every loader that reads a part of it.
fn load_config(text: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("highwater.toml");
    std::fs::write(&path, text).unwrap();
    highwater_files::config::parse(text, &path, dir.path()).map_err(|e| e.to_string())?;
    let value: toml::Value = toml::from_str(text).map_err(|e| e.to_string())?;
    if let Some(sources) = value.get("sources").and_then(|s| s.as_table()) {
        for (name, v) in sources {
            highwater_ingest::SourceSpec::parse(name, v, &path, dir.path())
                .map_err(|e| e.to_string())?;
        }
    }
    highwater_osm::ops::OsmConfig::parse(value.get("osm"), &path, dir.path())
        .map_err(|e| e.to_string())?;
    Ok(())
}

fn merge(base: &mut toml::Value, add: toml::Value) {
    match (base, add) {
        (toml::Value::Table(b), toml::Value::Table(a)) => {
            for (k, v) in a {
                match b.get_mut(&k) {
                    Some(old) => merge(old, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, a) => *b = a,
    }
}

#[test]
fn every_toml_block_loads_with_the_real_loaders() {
    let mut checked = 0;
    let mut failures = Vec::new();
    let mut previous: BTreeMap<String, toml::Value> = BTreeMap::new();
    for b in all_blocks().into_iter().filter(|b| b.lang == "toml") {
        let result = if b.attr("schema").is_some() {
            highwater_osm::schema::Schema::parse(&b.text, &b.at())
                .map(|_| ())
                .map_err(|e| e.to_string())
        } else if b.attr("fragment").is_some() {
            match previous.get(&b.page) {
                None => Err("a fragment with no complete block before it on the page".into()),
                Some(base) => toml::from_str::<toml::Value>(&b.text)
                    .map_err(|e| e.to_string())
                    .and_then(|add| {
                        let mut whole = base.clone();
                        merge(&mut whole, add);
                        load_config(&toml::to_string(&whole).unwrap())
                    }),
            }
        } else {
            let r = load_config(&b.text);
            if r.is_ok() {
                previous.insert(b.page.clone(), toml::from_str(&b.text).unwrap());
            }
            r
        };
        checked += 1;
        if let Err(e) = result {
            failures.push(format!("{}: {e}", b.at()));
        }
    }
    assert!(checked >= 20, "only {checked} toml blocks found");
    assert!(
        failures.is_empty(),
        "toml blocks that do not load:\n{}",
        failures.join("\n")
    );
}

/// Copies `from` into `to`, leaving out what a run of the examples leaves
/// behind (state, outputs).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if [".highwater", "out", "raw", "lake"].contains(&name.to_str().unwrap()) {
            continue;
        }
        let p = e.path();
        if p.is_dir() {
            copy_tree(&p, &to.join(&name));
        } else {
            std::fs::copy(&p, to.join(&name)).unwrap();
        }
    }
}

#[test]
fn every_runnable_shell_block_runs() {
    let bins = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(bin(), bins.path().join("highwater")).unwrap();
    let path = format!(
        "{}:{}",
        bins.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut ran = 0;
    for (page, text) in pages() {
        let work = tempfile::tempdir().unwrap();
        copy_tree(&repo().join("examples"), &work.path().join("examples"));
        for b in blocks(&page, &text) {
            if b.lang == "toml" {
                if let Some(file) = b.attr("file") {
                    let to = work.path().join(file);
                    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
                    std::fs::write(&to, &b.text).unwrap();
                }
                continue;
            }
            if !(b.lang == "sh" && b.attr("run").is_some()) {
                continue;
            }
            let script = b
                .text
                .replace("cargo run --release -p highwater --", "highwater");
            let mut exit = 0;
            let mut expect = Vec::new();
            for line in script.lines() {
                if let Some(n) = line.trim().strip_prefix("# exit:") {
                    exit = n.trim().parse().expect("# exit: N");
                }
                if let Some(t) = line.trim().strip_prefix("# expect:") {
                    expect.push(t.trim().to_string());
                }
            }
            let o = std::process::Command::new("bash")
                .args(["-e", "-o", "pipefail", "-c", &script])
                .current_dir(work.path())
                .env("PATH", &path)
                .env("NO_COLOR", "1")
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap();
            let all = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            assert_eq!(
                o.status.code(),
                Some(exit),
                "{}: the block exited {:?}, the page says {exit}:\n{}\n--- output:\n{all}",
                b.at(),
                o.status.code(),
                b.text
            );
            for t in &expect {
                assert!(
                    all.contains(t.as_str()),
                    "{}: the output lacks {t:?}:\n{all}",
                    b.at()
                );
            }
            ran += 1;
        }
    }
    assert!(ran >= 5, "only {ran} runnable shell blocks");
}

/// The README opens with the same two commands it always did, and stays a
/// front door.
#[test]
fn the_readme_opens_with_the_two_commands() {
    let text = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines = text.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines; the book takes the rest"
    );
    let first = blocks("README.md", &text).into_iter().next().unwrap();
    let commands: Vec<&str> = first
        .text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        commands,
        [
            "cargo run --release -p highwater -- --config examples/basic/highwater.toml run",
            "bash scripts/test.sh"
        ]
    );
    // The first command, as the book's runnable blocks run it.
    let work = tempfile::tempdir().unwrap();
    copy_tree(&repo().join("examples"), &work.path().join("examples"));
    let o = std::process::Command::new(bin())
        .args(["--config", "examples/basic/highwater.toml", "run"])
        .current_dir(work.path())
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The keys of every `#[serde(deny_unknown_fields)]` struct under
/// crates/*/src, each with where it is declared.
fn config_keys() -> BTreeMap<String, String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    for c in std::fs::read_dir(repo().join("crates")).unwrap() {
        let src = c.unwrap().path().join("src");
        if src.is_dir() {
            walk(&src, &mut files);
        }
    }
    let mut keys = BTreeMap::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            if lines[i].trim() != "#[serde(deny_unknown_fields)]" {
                i += 1;
                continue;
            }
            while i < lines.len() && !lines[i].contains("struct ") {
                i += 1;
            }
            let name = lines[i]
                .split("struct ")
                .nth(1)
                .unwrap()
                .split([' ', '{', '<'])
                .next()
                .unwrap()
                .to_string();
            i += 1;
            let mut rename: Option<String> = None;
            while i < lines.len() && lines[i].trim() != "}" {
                let l = lines[i].trim();
                if let Some(r) = l.split("rename = \"").nth(1) {
                    rename = r.split('"').next().map(str::to_string);
                }
                if !l.starts_with("//") && !l.starts_with("#[") {
                    let l = l
                        .trim_start_matches("pub(crate) ")
                        .trim_start_matches("pub ");
                    if let Some((field, _)) = l.split_once(':') {
                        if !field.is_empty()
                            && field
                                .chars()
                                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                        {
                            let key = rename.take().unwrap_or_else(|| field.to_string());
                            let at =
                                format!("{} {name}", f.strip_prefix(repo()).unwrap().display());
                            keys.entry(key).or_insert(at);
                        }
                    }
                }
                i += 1;
            }
        }
    }
    keys
}

#[test]
fn every_config_key_is_in_the_reference() {
    let keys = config_keys();
    // The scan itself must work: keys of each loader's sections.
    for k in [
        "on_delete",
        "observe_ignore",
        "lease_duration_s",
        "chunk_rows",
        "statement_timeout_s",
        "endpoint_env",
        "flat_nodes",
        "drain_rebuild_share",
        "admin_levels",
        "classes",
        "zoom_max",
        "target_file_mb",
        "warn_share_of_interval",
    ] {
        assert!(
            keys.contains_key(k),
            "the scan of the config structs missed {k}: {keys:?}"
        );
    }
    let reference = std::fs::read_to_string(repo().join("docs/src/reference/config.md")).unwrap();
    let missing: Vec<String> = keys
        .iter()
        // A key is named as `key`, or, for a table, in its section's
        // heading (`[sources.NAME.checks]`, `[stages.NAME]`).
        .filter(|(k, _)| {
            !reference.contains(&format!("`{k}`"))
                && !reference.contains(&format!(".{k}]"))
                && !reference.contains(&format!("[{k}"))
        })
        .map(|(k, at)| format!("`{k}` ({at})"))
        .collect();
    assert!(
        missing.is_empty(),
        "config keys the code reads that docs/src/reference/config.md does not name:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_command_flag_and_metric_is_in_the_reference() {
    let commands = std::fs::read_to_string(repo().join("docs/src/reference/commands.md")).unwrap();
    fn walk(
        cmd: &clap::Command,
        path: String,
        text: &str,
        missing: &mut Vec<String>,
        n: &mut usize,
    ) {
        if !path.is_empty() && !text.contains(&format!("highwater {path}")) {
            missing.push(format!("highwater {path}"));
        }
        for a in cmd.get_arguments() {
            if let Some(long) = a.get_long() {
                *n += 1;
                if !text.contains(&format!("--{long}")) {
                    missing.push(format!("highwater {path} --{long}"));
                }
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.get_name() == "help" {
                continue;
            }
            let p = format!("{path} {}", sub.get_name()).trim().to_string();
            walk(sub, p, text, missing, n);
        }
    }
    let mut missing = Vec::new();
    let mut n = 0;
    walk(
        &highwater_cli::command(),
        String::new(),
        &commands,
        &mut missing,
        &mut n,
    );
    assert!(n > 50, "only {n} flags in the clap tree");
    assert!(
        missing.is_empty(),
        "not in docs/src/reference/commands.md:\n{}",
        missing.join("\n")
    );

    let source =
        std::fs::read_to_string(repo().join("crates/highwater-serve/src/metrics.rs")).unwrap();
    let metrics: BTreeSet<&str> = source
        .split('"')
        .filter(|s| {
            s.starts_with("highwater_") && s.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        })
        .collect();
    assert!(metrics.len() >= 15, "{metrics:?}");
    let reference = std::fs::read_to_string(repo().join("docs/src/reference/metrics.md")).unwrap();
    let missing: Vec<_> = metrics
        .iter()
        .filter(|m| !reference.contains(&format!("`{m}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics not in docs/src/reference/metrics.md: {missing:?}"
    );
}

/// mdBook's id for a heading: lower case, letters, digits, `-` and `_`
/// kept, spaces to `-`, everything else dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The ids of a page's headings (outside code blocks), numbered as mdBook
/// numbers repeats (`x`, `x-1`, ...).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
        }
        if fence || !line.starts_with('#') {
            continue;
        }
        let s = slug(line.trim_start_matches('#').replace('`', "").as_str());
        let n = seen.entry(s.clone()).or_insert(0);
        ids.insert(if *n == 0 {
            s.clone()
        } else {
            format!("{s}-{n}")
        });
        *n += 1;
    }
    ids
}

/// The `[text](target)` links of a page outside code, with their lines.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fence = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
        }
        if fence {
            continue;
        }
        // Inline code spans hold no links.
        let plain: String = line
            .split('`')
            .enumerate()
            .filter(|(k, _)| k % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = plain.as_str();
        while let Some(k) = rest.find("](") {
            rest = &rest[k + 2..];
            if let Some(end) = rest.find(')') {
                out.push((i + 1, rest[..end].to_string()));
                rest = &rest[end..];
            }
        }
    }
    out
}

#[test]
fn every_internal_link_resolves() {
    let root = repo();
    let mut checked = 0;
    let mut broken = Vec::new();
    for (page, text) in pages() {
        let dir = root.join(&page).parent().unwrap().to_path_buf();
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                root.join(&page)
            } else {
                dir.join(file)
            };
            if !path.exists() {
                broken.push(format!("{page}:{line}: {target}: no {}", path.display()));
                continue;
            }
            // mdBook publishes docs/src only: a page's link out of it would
            // break in the built book (name such files in code instead).
            if page.starts_with("docs/src/")
                && !path
                    .canonicalize()
                    .unwrap()
                    .starts_with(root.join("docs/src"))
            {
                broken.push(format!(
                    "{page}:{line}: {target}: outside docs/src, not in the built book"
                ));
                continue;
            }
            if let Some(a) = anchor {
                let t = std::fs::read_to_string(&path).unwrap_or_default();
                if !anchors(&t).contains(a) {
                    broken.push(format!("{page}:{line}: {target}: no heading #{a}"));
                }
            }
        }
    }
    // Every page is in SUMMARY.md (mdBook renders only those), and every
    // entry there is a page.
    let summary = std::fs::read_to_string(root.join("docs/src/SUMMARY.md")).unwrap();
    let listed: BTreeSet<String> = links(&summary).into_iter().map(|(_, t)| t).collect();
    for (page, _) in pages() {
        if let Some(rel) = page.strip_prefix("docs/src/") {
            if rel != "SUMMARY.md" && !listed.contains(rel) {
                broken.push(format!("{page}: not in SUMMARY.md"));
            }
        }
    }
    assert!(checked >= 20, "only {checked} internal links");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_checker_sees_a_broken_link() {
    // The checker's parts on a page made to fail: a missing file, a missing
    // anchor, and a link in code that is not a link.
    let text = "# A title\n\nSee [x](nowhere.md) and [y](#a-title) and [z](#gone).\n\n```sh\n[no](link.md)\n```\n";
    let found: Vec<String> = links(text).into_iter().map(|(_, t)| t).collect();
    assert_eq!(found, ["nowhere.md", "#a-title", "#gone"]);
    let ids = anchors(text);
    assert!(ids.contains("a-title") && !ids.contains("gone"));
    assert_eq!(
        slug("`highwater serve`: is everything fresh?"),
        "highwater-serve-is-everything-fresh"
    );
}

/// The commands reference holds each command's `--help` as the binary
/// prints it: a changed help text fails here until the page is regenerated
/// (`HIGHWATER_DOCS_BLESS=1 cargo test -p highwater --test docs_book`
/// rewrites the blocks in place).
#[test]
fn the_commands_reference_is_the_binarys_help() {
    let path = repo().join("docs/src/reference/commands.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut out = String::new();
    let mut stale = Vec::new();
    let mut command: Option<Vec<String>> = None;
    let mut lines = text.lines();
    let mut blocks = 0;
    while let Some(line) = lines.next() {
        out.push_str(line);
        out.push('\n');
        if let Some(name) = line
            .strip_prefix("## `highwater")
            .and_then(|r| r.strip_suffix('`'))
        {
            command = Some(name.split_whitespace().map(str::to_string).collect());
            continue;
        }
        if line == "```text" {
            let Some(args) = command.take() else { continue };
            let mut old = String::new();
            for l in lines.by_ref() {
                if l == "```" {
                    break;
                }
                old.push_str(l);
                old.push('\n');
            }
            let mut argv = args.clone();
            argv.push("--help".into());
            let o = std::process::Command::new(bin())
                .args(&argv)
                .output()
                .unwrap();
            assert_eq!(o.status.code(), Some(0), "highwater {argv:?}");
            let new = String::from_utf8(o.stdout).unwrap();
            if new.trim_end() != old.trim_end() {
                stale.push(format!("highwater {}", args.join(" ")));
            }
            out.push_str(new.trim_end());
            out.push_str("\n```\n");
            blocks += 1;
        }
    }
    assert!(blocks > 20, "only {blocks} help blocks");
    if !stale.is_empty() && std::env::var_os("HIGHWATER_DOCS_BLESS").is_some() {
        std::fs::write(&path, out).unwrap();
        return;
    }
    assert!(
        stale.is_empty(),
        "docs/src/reference/commands.md differs from --help for:\n{}\n(regenerate: HIGHWATER_DOCS_BLESS=1 cargo test -p highwater --test docs_book)",
        stale.join("\n")
    );
}

/// The values of every enum a config key takes: the type names of the
/// fields of the `#[serde(deny_unknown_fields)]` structs, each found as a
/// `Deserialize` enum under crates/*/src and spelt by its `rename_all`.
fn config_values() -> BTreeMap<String, String> {
    let mut files = Vec::new();
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    for c in std::fs::read_dir(repo().join("crates")).unwrap() {
        let src = c.unwrap().path().join("src");
        if src.is_dir() {
            walk(&src, &mut files);
        }
    }
    let texts: Vec<(PathBuf, String)> = files
        .into_iter()
        .map(|f| {
            let t = std::fs::read_to_string(&f).unwrap();
            (f, t)
        })
        .collect();
    // The type names fields of config structs have.
    let mut types = BTreeSet::new();
    for (_, text) in &texts {
        let lines: Vec<&str> = text.lines().collect();
        let mut inside = false;
        for (i, l) in lines.iter().enumerate() {
            if l.trim() == "#[serde(deny_unknown_fields)]" {
                inside = lines[i + 1..].iter().take(3).any(|n| n.contains("struct "));
                continue;
            }
            if inside && l.trim() == "}" {
                inside = false;
            }
            if inside {
                if let Some((_, ty)) = l.split_once(": ") {
                    for word in ty.split(|c: char| !c.is_alphanumeric() && c != '_') {
                        if word.starts_with(|c: char| c.is_ascii_uppercase()) {
                            types.insert(word.to_string());
                        }
                    }
                }
            }
        }
    }
    let mut values = BTreeMap::new();
    for (f, text) in &texts {
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let Some(name) = l
                .trim_start_matches("pub ")
                .strip_prefix("enum ")
                .and_then(|r| r.strip_suffix(" {"))
            else {
                continue;
            };
            if !types.contains(name) {
                continue;
            }
            let head = lines[i.saturating_sub(3)..i].join("\n");
            if !head.contains("Deserialize") {
                continue;
            }
            let snake = head.contains("rename_all = \"snake_case\"");
            let lower = head.contains("rename_all = \"lowercase\"");
            assert!(
                snake || lower,
                "{}: enum {name}: a config enum without rename_all; teach docs_book.rs its spelling",
                f.display()
            );
            for v in &lines[i + 1..] {
                let v = v.trim();
                if v == "}" {
                    break;
                }
                if v.starts_with("//") || v.starts_with("#[") || v.is_empty() {
                    continue;
                }
                let ident: String = v.chars().take_while(|c| c.is_alphanumeric()).collect();
                if ident.is_empty() {
                    continue;
                }
                let spelt = if lower {
                    ident.to_lowercase()
                } else {
                    let mut s = String::new();
                    for (k, c) in ident.chars().enumerate() {
                        if c.is_ascii_uppercase() && k > 0 {
                            s.push('_');
                        }
                        s.push(c.to_ascii_lowercase());
                    }
                    s
                };
                values.insert(
                    spelt,
                    format!("{} enum {name}", f.strip_prefix(repo()).unwrap().display()),
                );
            }
        }
    }
    values
}

#[test]
fn every_config_value_is_in_the_reference() {
    let values = config_values();
    for v in [
        "fingerprint",
        "commit_order",
        "delta",
        "warn",
        "keep",
        "sqlite",
    ] {
        assert!(
            values.contains_key(v),
            "the scan of config enums missed {v}: {values:?}"
        );
    }
    let reference = std::fs::read_to_string(repo().join("docs/src/reference/config.md")).unwrap();
    let missing: Vec<String> = values
        .iter()
        .filter(|(v, _)| !reference.contains(&format!("`{v}`")))
        .map(|(v, at)| format!("`{v}` ({at})"))
        .collect();
    assert!(
        missing.is_empty(),
        "config values the code accepts that docs/src/reference/config.md does not name:\n{}",
        missing.join("\n")
    );
}
