//! The seed's story and its four steps, run through the real binary.

mod common;
use common::*;

/// 900 files arrive; after the first run, 4 differ from yesterday. The run
/// processes 4, skips 896, leaves the 896 outputs byte-identical with their
/// mtimes untouched, and says so in the seed's words.
#[test]
fn seed_story_900_files_4_changed() {
    let p = Project::new(&upper_config(""));
    for i in 0..900 {
        p.write(
            &format!("data/d{}/f{i:03}.txt", i % 7),
            &format!("parcel {i:03}\n"),
        );
    }
    // Step 1: everything runs.
    let r = p.run_json(&["--jobs", "4"], 0);
    let s = stage(&r, "upper");
    assert_eq!(
        (s["discovered"].as_u64(), s["processed"].as_u64()),
        (Some(900), Some(900))
    );
    assert_eq!(s["new"], 900);
    let before = p.tree("out");
    assert_eq!(before.len(), 900);
    assert_eq!(p.read("out/d0/f000.txt.upper"), "PARCEL 000\n");

    // Step 2: nothing runs.
    let r = p.run_json(&[], 0);
    assert_eq!(stage(&r, "upper")["processed"], 0);
    assert_eq!(stage(&r, "upper")["unchanged"], 900);

    // Step 3: four files change content at the same size.
    for i in [3, 100, 500, 899] {
        p.write(
            &format!("data/d{}/f{i:03}.txt", i % 7),
            &format!("PARCEL {i:03}\n"),
        );
    }
    let plan = p.check(&["plan"], 0);
    assert!(
        plan.stdout
            .contains("upper: discovered 900, 4 changed (896 unchanged, 0 new)"),
        "{}",
        plan.stdout
    );
    let r = p.check(&["run"], 0);
    assert!(
        r.stdout
            .contains("discovered 900, 4 changed (896 unchanged, 0 new)"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("reasons: content 4"), "{}", r.stdout);
    assert!(
        r.stdout.contains("4 processed, 896 skipped"),
        "{}",
        r.stdout
    );
    let after = p.tree("out");
    let mut differing = Vec::new();
    for (k, v) in &before {
        if after[k] != *v {
            differing.push(k.clone());
        }
    }
    assert_eq!(
        differing,
        [
            "d2/f100.txt.upper",
            "d3/f003.txt.upper",
            "d3/f500.txt.upper",
            "d3/f899.txt.upper"
        ],
        "only the four outputs changed, bytes and mtimes of the rest untouched"
    );

    // Step 4: bump the recipe. The guard refuses and touches nothing...
    let cfg = p
        .read("highwater.toml")
        .replace("version = \"1\"", "version = \"2\"");
    p.write("highwater.toml", &cfg);
    let export = p.export();
    let r = p.check(&["run"], 2);
    assert!(r.stderr.contains("900/900 items"), "{}", r.stderr);
    assert!(r.stderr.contains("recipe was bumped"), "{}", r.stderr);
    assert!(r.stderr.contains("--force"), "{}", r.stderr);
    assert_eq!(p.tree("out"), after);
    assert_eq!(p.export(), export);
    // ...and with --force everything runs, for the reason `recipe`.
    let r = p.run_json(&["--force"], 0);
    assert_eq!(stage(&r, "upper")["processed"], 900);
    assert_eq!(stage(&r, "upper")["reasons"]["recipe"], 900);
    let r = p.run_json(&[], 0);
    assert_eq!(stage(&r, "upper")["processed"], 0);
}

#[test]
fn plan_json_shape_and_deterministic_order() {
    let p = Project::new(&upper_config(""));
    for n in ["b", "a", "c/d"] {
        p.write(&format!("data/{n}.txt"), n);
    }
    let one = p.check(&["plan", "--json"], 0).stdout;
    let two = p.check(&["plan", "--json"], 0).stdout;
    assert_eq!(one, two);
    let v: serde_json::Value = serde_json::from_str(&one).unwrap();
    let s = &v["stages"][0];
    assert_eq!(s["name"], "upper");
    assert_eq!(s["total"], 3);
    assert_eq!(s["unchanged"], 0);
    let inputs: Vec<_> = s["changed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["input"].as_str().unwrap(), c["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(
        inputs,
        [
            ("data/a.txt", "new"),
            ("data/b.txt", "new"),
            ("data/c/d.txt", "new")
        ]
    );
    assert!(
        !p.exists(".highwater/lock"),
        "plan takes no lock and writes no output"
    );
    assert!(!p.exists("out"));
}
