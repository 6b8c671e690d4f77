//! OSM helpers for end-to-end tests: the test data, and elements in a
//! canonical form both osmium's OPL and the store can be read into.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

pub fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../highwater-osm/tests/data")
}

/// `%hex%` escapes of OPL.
pub fn opl_unescape(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let j = after.find('%').expect("closed escape");
        let c = u32::from_str_radix(&after[..j], 16)
            .ok()
            .and_then(char::from_u32)
            .expect("valid escape");
        out.push(c);
        rest = &after[j + 1..];
    }
    out.push_str(rest);
    out
}

/// An element as both sides can state it: kind and id, location, refs or
/// members, sorted tags.
pub type Canon = (
    String,
    Option<(i32, i32)>,
    Vec<String>,
    Vec<(String, String)>,
);

pub fn canon_from_opl(line: &str) -> Canon {
    let mut f = line.split(' ');
    let id = f.next().unwrap().to_string();
    let (mut x, mut y, mut list, mut tags) = (None, None, Vec::new(), Vec::new());
    for field in f {
        let (k, v) = field.split_at(1);
        match k {
            "T" if !v.is_empty() => {
                for kv in v.split(',') {
                    let (a, b) = kv.split_once('=').unwrap();
                    tags.push((opl_unescape(a), opl_unescape(b)));
                }
            }
            "x" => x = Some((v.parse::<f64>().unwrap() * 1e7).round() as i32),
            "y" => y = Some((v.parse::<f64>().unwrap() * 1e7).round() as i32),
            "N" | "M" if !v.is_empty() => list = v.split(',').map(opl_unescape).collect(),
            _ => {}
        }
    }
    tags.sort();
    (id, y.zip(x), list, tags)
}

pub fn canon_from_store(e: &highwater_osm::Element) -> Canon {
    use highwater_osm::{Element, MemberKind};
    let tags = |t: &highwater_osm::Tags| {
        t.iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<Vec<_>>()
    };
    match e {
        Element::Node(n) => (
            format!("n{}", n.id),
            n.lat_e7.zip(n.lon_e7),
            Vec::new(),
            tags(&n.tags),
        ),
        Element::Way(w) => (
            format!("w{}", w.id),
            None,
            w.refs.iter().map(|r| format!("n{r}")).collect(),
            tags(&w.tags),
        ),
        Element::Relation(r) => (
            format!("r{}", r.id),
            None,
            r.members
                .iter()
                .map(|m| {
                    let k = match m.kind {
                        MemberKind::Node => 'n',
                        MemberKind::Way => 'w',
                        MemberKind::Relation => 'r',
                    };
                    format!("{k}{}@{}", m.id, m.role)
                })
                .collect(),
            tags(&r.tags),
        ),
    }
}

/// Monaco 3047 with the diffs `seqs` applied by `osmium apply-changes`, in
/// canonical form (written beside `work`).
pub fn osmium_applied(work: &Path, seqs: std::ops::RangeInclusive<i64>) -> Vec<Canon> {
    let mut args: Vec<String> = vec![
        "apply-changes".into(),
        data()
            .join("monaco-3047-20210801.osm.pbf")
            .to_string_lossy()
            .into_owned(),
    ];
    for seq in seqs {
        args.push(
            data()
                .join(format!("monaco-updates/000/003/{:03}.osc.gz", seq % 1000))
                .to_string_lossy()
                .into_owned(),
        );
    }
    let opl = work.join("osmium.opl");
    args.extend([
        "-f".into(),
        "opl".into(),
        "-O".into(),
        "-o".into(),
        opl.to_string_lossy().into_owned(),
    ]);
    let out = std::process::Command::new("osmium").args(&args).output().unwrap_or_else(|e| {
        panic!("osmium is needed for this comparison ({e}); install Debian's osmium-tool (scripts/deps.sh does)")
    });
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(&opl)
        .unwrap()
        .lines()
        .map(canon_from_opl)
        .collect()
}

/// The store's elements in canonical form.
pub fn store_canon(store: &Path) -> Vec<Canon> {
    let store = highwater_osm::open_store(store).unwrap();
    let mut ours: Vec<Canon> = Vec::new();
    store.export(|e| ours.push(canon_from_store(&e))).unwrap();
    ours
}

/// Asserts two element lists are equal, naming the first differences.
pub fn assert_same_elements(ours: &[Canon], theirs: &[Canon]) {
    assert_eq!(ours.len(), theirs.len(), "element count");
    let diffs: Vec<_> = ours
        .iter()
        .zip(theirs)
        .filter(|(a, b)| a != b)
        .take(5)
        .collect();
    assert!(diffs.is_empty(), "first differences: {diffs:#?}");
}

/// Copies Monaco's minutely diffs `seqs` (3048..=3076 are in the fixtures,
/// sequence numbers as the server gives them, or their last three digits)
/// into `updates/000/003/` of the project, as a replication folder; returns
/// that folder.
pub fn monaco_updates(p: &super::Project, seqs: std::ops::RangeInclusive<i64>) -> PathBuf {
    let upd = p.path("updates/000/003");
    std::fs::create_dir_all(&upd).unwrap();
    for seq in seqs {
        for ext in ["osc.gz", "state.txt"] {
            let name = format!("{:03}.{ext}", seq % 1000);
            std::fs::copy(
                data().join("monaco-updates/000/003").join(&name),
                upd.join(&name),
            )
            .unwrap();
        }
    }
    upd
}
