//! Issue 9: the fuzz test's `highwater.toml` part. Real configs (a file
//! stage, a table source, OSM datasets) are mutated by truncation, bit
//! flips, splices, and repeated and reordered blocks, with a fixed seed and
//! a bounded count (`HIGHWATER_FUZZ_CASES`, default 40; seed
//! `HIGHWATER_FUZZ_SEED`). Every read-only command on a mutated config ends
//! in a clear error (exit 2, one `error:` line) or a result, never a panic,
//! and the recorded state is untouched.

mod common;
use common::*;

use highwater_core::mutate::{mutate, Rng};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const BASE: &str = r#"
[state]
store = "sqlite:.highwater/state.db"

[stages.upper]
inputs = ["data/**/*.txt"]
output = "out/{relpath}.upper"
command = ["sh", "up.sh", "{input}", "{output}"]
signal = "hash"
guard = 0.5
on_delete = "remove"
[stages.upper.recipe]
version = "1"
files = ["up.sh"]

[sources.orders]
kind = "sqlite"
path = "src.db"
table = "orders"
key = ["id"]
mode = "updated_at"
cursor = "updated_at"
interval = "1h"
start = "2026-03-01T08:00:00Z"
output = "raw/orders/{date}/{hour}"

[osm]
store = ".highwater/osm"
[osm.tiles.base]
zooms = "12-14"
keys = ["building"]
mbtiles = "base.mbtiles"
[osm.search.places]
index = "search-index"
"#;

#[test]
fn fuzz_config() {
    let p = Project::new(BASE);
    p.write("data/a.txt", "a");
    p.check(&["run"], 0);
    let state = p.export();
    let mut rng = Rng(env("HIGHWATER_FUZZ_SEED", 0x9e37_79b9_7f4a_7c15) ^ 3);
    let cases = env("HIGHWATER_FUZZ_CASES", 40);
    let mut refused = 0;
    for case in 0..cases {
        let (text, _) = mutate(&mut rng, BASE.as_bytes(), 64);
        std::fs::write(p.path("case.toml"), &text).unwrap();
        for args in [
            &["--config", "case.toml", "plan"][..],
            &["--config", "case.toml", "status"],
            &["--config", "case.toml", "osm", "status"],
            &[
                "--config",
                "case.toml",
                "windows",
                "orders",
                "--now",
                "2026-03-01T12:00:00Z",
            ],
        ] {
            let r = p.hw(args);
            let what = format!(
                "case {case} {args:?}:\n{}\nstderr: {}",
                String::from_utf8_lossy(&text),
                r.stderr
            );
            assert!(!r.stderr.contains("panicked"), "{what}");
            assert!((0..=2).contains(&r.code), "{what}");
            if r.code == 2 {
                refused += 1;
                assert!(r.stderr.contains("error:"), "{what}");
                assert!(r.stderr.trim().len() > 10, "{what}");
            }
        }
        assert_eq!(p.export(), state, "case {case}: the state moved");
    }
    eprintln!("{cases} configs, {refused} refusals");
}
