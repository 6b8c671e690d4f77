//! Issue 25: `[osm] flat_nodes = "path"` from the command line. `osm
//! import` says which node storage it used and why (stderr); each refusal
//! (the file's folder missing, a node id above node_id_max, a store with
//! flat nodes opened without the setting and the reverse) exits 2 naming
//! the file and what to do; a SIGKILL in the middle of an import with flat
//! nodes leaves nothing the next import trips on.

mod common;
use common::osm::data;
use common::*;

const FLAT: &str = r#"
[osm]
store = ".highwater/osm"
flat_nodes = "flat/nodes.flat"

[osm.tiles.base]
schema = "shortbread"
mbtiles = "tiles/base.mbtiles"
"#;

fn monaco() -> String {
    data()
        .join("monaco-3047-20210801.osm.pbf")
        .to_string_lossy()
        .into_owned()
}

fn flat_project() -> Project {
    let p = Project::new(FLAT);
    std::fs::create_dir_all(p.path("flat")).unwrap();
    p
}

#[test]
fn an_import_with_flat_nodes_says_why_and_warns_on_sparse_ids() {
    let p = flat_project();
    let r = p.check(&["osm", "import", &monaco()], 0);
    // Monaco's ids are spread to 9 billion: a page per node. Said, as a
    // warning, with the rule's numbers.
    assert!(
        r.stderr.contains("warning: flat nodes in")
            && r.stderr.contains("look wrong for this extract")
            && r.stderr.contains("% of the id range used"),
        "{}",
        r.stderr
    );
    assert!(p.exists("flat/nodes.flat") && !p.exists("flat/nodes.flat.hw-import"));
    p.check(&["osm", "tiles", "build"], 0);
    p.check(&["osm", "verify", "base", "--all"], 0);
    // Without the setting: node blocks, said as a note.
    let q = Project::new("[osm]\nstore = \".highwater/osm\"\n");
    let r = q.check(&["osm", "import", &monaco()], 0);
    assert!(
        r.stderr.contains("node storage: node blocks in the store"),
        "{}",
        r.stderr
    );
}

#[test]
fn refusals_exit_2_naming_the_file_and_what_to_do() {
    // The folder of the flat file is missing.
    let p = Project::new(FLAT);
    let r = p.check(&["osm", "import", &monaco()], 2);
    assert!(
        r.stderr.contains("flat_nodes") && r.stderr.contains("does not exist"),
        "{}",
        r.stderr
    );
    assert!(!p.exists(".highwater/osm/store.db"));

    // A node id above node_id_max.
    let p = flat_project();
    std::fs::write(
        p.path("big.osm"),
        format!(
            "<osm version=\"0.6\"><node id=\"{}\" lat=\"1\" lon=\"2\"/></osm>",
            (1i64 << 36) + 7
        ),
    )
    .unwrap();
    let r = p.check(&["osm", "import", "big.osm"], 2);
    assert!(
        r.stderr.contains("nodes.flat") && r.stderr.contains("node_id_max"),
        "{}",
        r.stderr
    );

    // A store with flat nodes opened without the setting, and the reverse.
    let p = flat_project();
    p.check(&["osm", "import", &monaco()], 0);
    std::fs::write(
        p.path("highwater.toml"),
        "[osm]\nstore = \".highwater/osm\"\n",
    )
    .unwrap();
    let r = p.check(&["osm", "status"], 2);
    assert!(
        r.stderr.contains("nodes.flat") && r.stderr.contains("add flat_nodes"),
        "{}",
        r.stderr
    );
    let q = Project::new("[osm]\nstore = \".highwater/osm\"\n");
    q.check(&["osm", "import", &monaco()], 0);
    std::fs::create_dir_all(q.path("flat")).unwrap();
    std::fs::write(q.path("highwater.toml"), FLAT).unwrap();
    let diff = data().join("monaco-updates/000/003/048.osc.gz");
    let r = q.check(&["osm", "apply", diff.to_str().unwrap()], 2);
    assert!(
        r.stderr.contains("imported without flat nodes") && r.stderr.contains("remove the setting"),
        "{}",
        r.stderr
    );
}

#[test]
fn a_sigkill_in_an_import_with_flat_nodes_and_the_next_import_completes() {
    let p = flat_project();
    // Killed with the rows written, as the node blocks (and the flat
    // file) are about to be written.
    p.killed_at(&["osm", "import", &monaco()], "import-kill-blocks");
    assert!(!p.exists(".highwater/osm/store.db"), "nothing published");
    assert!(!p.exists("flat/nodes.flat"), "no flat file published");
    // Killed once the store is built, just before it is published.
    p.killed_at(&["osm", "import", &monaco()], "import-kill");
    assert!(!p.exists(".highwater/osm/store.db"));
    p.check(&["osm", "import", &monaco()], 0);
    assert!(p.exists("flat/nodes.flat") && !p.exists("flat/nodes.flat.hw-import"));
    p.check(&["osm", "tiles", "build"], 0);
    p.check(&["osm", "verify", "base", "--all"], 0);
}

/// `osm import --replace` killed between its two renames: the new flat
/// node file is in place, the old store (retired) is not yet swapped out.
/// The old store must refuse to serve writers rather than read the new
/// file's locations, and the next `--replace` must complete.
#[test]
fn a_replace_killed_between_the_flat_file_and_the_store_swap_is_refused_then_completes() {
    let p = flat_project();
    p.check(&["osm", "import", &monaco()], 0);
    p.check(&["osm", "tiles", "build"], 0);
    p.killed_at(
        &["osm", "import", "--replace", &monaco()],
        "import-kill-swap",
    );
    assert!(p.exists("flat/nodes.flat") && !p.exists("flat/nodes.flat.hw-import"));
    // The old store, left in place and retired, refuses a writer.
    let r = p.hw(&["osm", "tiles", "build"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("--replace"),
        "the refusal says what to do: {}",
        r.stderr
    );
    p.check(&["osm", "import", "--replace", &monaco()], 0);
    p.check(&["osm", "tiles", "build"], 0);
    p.check(&["osm", "verify", "base", "--all"], 0);
}
