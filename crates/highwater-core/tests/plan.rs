//! Planner tests: one `check` helper over in-memory entries and observations.
//! No file is touched; the planner is pure.

use highwater_core::evidence::{Algo, Digest};
use highwater_core::plan::{
    digest_needed, plan_aggregate, plan_items, Observation, PlanSettings, Reason,
};
use highwater_core::Entries;
use highwater_core::{guard, Entry, EntryKind, Signal, Stat, Status};
use std::collections::BTreeMap;

const SEC: i64 = 1_000_000_000;

fn digest(content: &str) -> Digest {
    Digest::new(Algo::Blake3, &blake3::hash(content.as_bytes()))
}

fn stat(size: u64, mtime_s: i64) -> Stat {
    Stat {
        size,
        mtime_ns: mtime_s * SEC,
        ctime_ns: mtime_s * SEC,
        ino: 1,
        dev: 1,
    }
}

fn settings(signal: Signal) -> PlanSettings {
    PlanSettings {
        signal,
        recipe: "r1:a".into(),
        granularity_ns: SEC,
        rehash: false,
    }
}

/// A previous entry: `content` hashed at `observed_s`, file mtime `mtime_s`.
fn entry(item: &str, content: &str, mtime_s: i64, observed_s: i64) -> Entry {
    Entry {
        kind: EntryKind::Item,
        item: item.into(),
        digest: Some(digest(content)),
        stat: stat(content.len() as u64, mtime_s),
        observed_at_ns: observed_s * SEC,
        recipe: "r1:a".into(),
        output: format!("out/{item}"),
        status: Status::Ok,
        error: None,
        processed_at_ns: observed_s * SEC,
        duration_ms: 1,
    }
}

/// What the reader would hand the planner: it computes a digest only when
/// `digest_needed` asks for one, as the real reader does.
fn observe(
    prev: Option<&Entry>,
    item: &str,
    content: &str,
    st: Stat,
    s: &PlanSettings,
) -> Observation {
    let mut obs = Observation {
        item: item.into(),
        stat: st,
        digests: digest_needed(prev, &st, s)
            .into_iter()
            .map(|a| {
                assert_eq!(a, Algo::Blake3, "only BLAKE3 in these tests");
                digest(content)
            })
            .collect(),
        observed_at_ns: 100 * SEC,
        output: format!("out/{item}"),
        output_exists: true,
    };
    highwater_core::plan::reuse_cached_digest(prev, &mut obs);
    obs
}

/// Plans one item and checks its reason (`None` = unchanged).
fn check(prev: Option<Entry>, content: &str, st: Stat, s: &PlanSettings, want: Option<Reason>) {
    let obs = observe(prev.as_ref(), "a.txt", content, st, s);
    let mut prevs = BTreeMap::new();
    if let Some(p) = prev {
        prevs.insert(p.item.clone(), p);
    }
    let plan = plan_items("s", &prevs.clone().into_iter().collect(), vec![obs], s);
    let got = plan.changed.first().map(|c| c.reason);
    assert_eq!(got, want, "plan: {plan:#?}");
    assert_eq!(plan.unchanged + plan.changed.len(), 1);
}

#[test]
fn hash_signal_reasons() {
    let s = settings(Signal::Hash);
    check(None, "abc", stat(3, 10), &s, Some(Reason::New));
    check(
        Some(entry("a.txt", "abc", 10, 50)),
        "abc",
        stat(3, 10),
        &s,
        None,
    );
    check(
        Some(entry("a.txt", "abc", 10, 50)),
        "abcd",
        stat(4, 10),
        &s,
        Some(Reason::Size),
    );
    check(
        Some(entry("a.txt", "abc", 10, 50)),
        "xyz",
        stat(3, 60),
        &s,
        Some(Reason::Content),
    );
    // A touch: new mtime, same bytes. Re-read, found equal, not re-run.
    check(
        Some(entry("a.txt", "abc", 10, 50)),
        "abc",
        stat(3, 60),
        &s,
        None,
    );
    let mut failed = entry("a.txt", "abc", 10, 50);
    failed.status = Status::Failed;
    failed.error = Some("boom".into());
    check(Some(failed), "abc", stat(3, 10), &s, Some(Reason::Failed));
    let mut other_recipe = entry("a.txt", "abc", 10, 50);
    other_recipe.recipe = "r1:b".into();
    check(
        Some(other_recipe),
        "abc",
        stat(3, 10),
        &s,
        Some(Reason::Recipe),
    );
}

/// Regression for the racy stat cache: on a filesystem with one-second
/// timestamps, a same-size rewrite in the same second as the hash leaves
/// every stat field equal. The record is racy, so the file is re-read.
#[test]
fn racy_record_is_reread_even_with_an_identical_stat() {
    let s = settings(Signal::Hash);
    let racy = entry("a.txt", "abc", 50, 50);
    assert_eq!(
        digest_needed(Some(&racy), &stat(3, 50), &s),
        vec![Algo::Blake3]
    );
    check(Some(racy), "xyz", stat(3, 50), &s, Some(Reason::Content));
    // A settled record with the same stat is trusted without reading.
    let settled = entry("a.txt", "abc", 10, 50);
    assert!(digest_needed(Some(&settled), &stat(3, 10), &s).is_empty());
    // --rehash reads it anyway.
    let forced = PlanSettings { rehash: true, ..s };
    assert_eq!(
        digest_needed(Some(&settled), &stat(3, 10), &forced),
        vec![Algo::Blake3]
    );
}

#[test]
fn mtime_and_exists_signals() {
    let m = settings(Signal::Mtime);
    check(
        Some(entry("a.txt", "abc", 10, 50)),
        "abc",
        stat(3, 10),
        &m,
        None,
    );
    check(
        Some(entry("a.txt", "abc", 10, 50)),
        "abc",
        stat(3, 11),
        &m,
        Some(Reason::Mtime),
    );
    check(
        Some(entry("a.txt", "abc", 50, 50)),
        "abc",
        stat(3, 50),
        &m,
        Some(Reason::Mtime),
    );
    let e = settings(Signal::Exists);
    check(
        Some(entry("a.txt", "abc", 10, 50)),
        "xyzw",
        stat(4, 90),
        &e,
        None,
    );
}

#[test]
fn deleted_and_missing_and_order() {
    let s = settings(Signal::Hash);
    let mut prevs = BTreeMap::new();
    for item in ["b", "d"] {
        prevs.insert(item.to_string(), entry(item, "x", 10, 50));
    }
    let mut gone_output = observe(prevs.get("b"), "b", "x", stat(1, 10), &s);
    gone_output.output_exists = false;
    let fresh = observe(None, "a", "y", stat(1, 10), &s);
    let plan = plan_items(
        "s",
        &prevs.clone().into_iter().collect(),
        vec![gone_output, fresh],
        &s,
    );
    let got: Vec<_> = plan
        .changed
        .iter()
        .map(|c| (c.item.as_str(), c.reason))
        .collect();
    assert_eq!(
        got,
        [
            ("a", Reason::New),
            ("b", Reason::Missing),
            ("d", Reason::Deleted)
        ]
    );
}

#[test]
fn a_new_digest_format_is_never_a_change() {
    // An entry recorded with a fingerprint, and the stage now on `hash`: the
    // planner compares in the recorded format and records the new one.
    let s = settings(Signal::Hash);
    let mut e = entry("a.txt", "abc", 10, 50);
    e.digest = Some(Digest::new(Algo::Fingerprint1, &blake3::hash(b"fp")));
    let need = digest_needed(Some(&e), &stat(3, 10), &s);
    assert_eq!(
        need,
        vec![Algo::Blake3],
        "cache hit for fp1, b3 computed to record"
    );
    let mut obs = observe(None, "a.txt", "abc", stat(3, 10), &s);
    highwater_core::plan::reuse_cached_digest(Some(&e), &mut obs);
    let mut prevs = BTreeMap::new();
    prevs.insert("a.txt".to_string(), e);
    let plan = plan_items("s", &prevs.clone().into_iter().collect(), vec![obs], &s);
    assert_eq!(plan.unchanged, 1);
    assert_eq!(plan.refresh[0].digest, Some(digest("abc")));
}

#[test]
fn aggregate_reruns_on_add_change_and_remove() {
    let s = settings(Signal::Hash);
    let members = |items: &[(&str, &str)]| -> Vec<Observation> {
        items
            .iter()
            .map(|(i, c)| observe(None, i, c, stat(c.len() as u64, 10), &s))
            .collect()
    };
    let first = plan_aggregate(
        "agg",
        None,
        &Entries::new(),
        members(&[("a", "1"), ("b", "2")]),
        "out/all",
        false,
        &s,
    );
    assert_eq!(first.changed[0].reason, Reason::New);
    let obs = first.changed[0].observation.clone().unwrap();
    let rec = highwater_core::plan::aggregate_entry(&obs, &s, Status::Ok, None, 0, 0);
    let same = plan_aggregate(
        "agg",
        Some(&rec),
        &Entries::new(),
        members(&[("b", "2"), ("a", "1")]),
        "out/all",
        true,
        &s,
    );
    assert_eq!(same.unchanged, 1, "order of discovery does not matter");
    for variant in [
        members(&[("a", "1"), ("b", "3")]),
        members(&[("a", "1")]),
        members(&[("a", "1"), ("b", "2"), ("c", "3")]),
    ] {
        let p = plan_aggregate(
            "agg",
            Some(&rec),
            &Entries::new(),
            variant,
            "out/all",
            true,
            &s,
        );
        assert_eq!(p.changed[0].reason, Reason::Content);
    }
    let empty = plan_aggregate(
        "agg",
        Some(&rec),
        &Entries::new(),
        vec![],
        "out/all",
        true,
        &s,
    );
    assert_eq!(empty.changed[0].reason, Reason::Deleted);
}

#[test]
fn guard_counts_only_redone_outputs() {
    let s = settings(Signal::Hash);
    let mut prevs = BTreeMap::new();
    let mut obs = Vec::new();
    for i in 0..10 {
        let item = format!("f{i}");
        let mut e = entry(&item, "x", 10, 50);
        e.recipe = "r1:old".into();
        obs.push(observe(Some(&e), &item, "x", stat(1, 10), &s));
        prevs.insert(item, e);
    }
    let plan = plan_items("s", &prevs.clone().into_iter().collect(), obs, &s);
    let r = guard::check(&plan, 0.5, 1, true, false).unwrap_err();
    assert_eq!(r.counts[&Reason::Recipe], 10);
    assert!(r.likely_cause().contains("recipe"));
    assert!(guard::check(&plan, 0.5, 1, true, true).is_ok(), "--force");
    assert!(
        guard::check(&plan, 0.5, 1, false, false).is_ok(),
        "empty output location"
    );
    // Ten brand-new inputs without outputs beside ten settled ones: new work.
    let mut fresh = Vec::new();
    for i in 0..10 {
        let mut o = observe(None, &format!("n{i}"), "y", stat(1, 10), &s);
        o.output_exists = false;
        fresh.push(o);
    }
    let plan = plan_items("s", &Entries::new(), fresh, &s);
    assert!(guard::check(&plan, 0.5, 1, true, false).is_ok());
}

#[test]
fn guard_ignores_a_handful_of_items() {
    let s = settings(Signal::Hash);
    let mut prevs = BTreeMap::new();
    let e = entry("a", "x", 10, 50);
    let obs = vec![observe(Some(&e), "a", "y", stat(1, 20), &s)];
    prevs.insert("a".to_string(), e);
    let plan = plan_items("s", &prevs.clone().into_iter().collect(), obs, &s);
    assert!(
        guard::check(&plan, 0.5, 10, true, false).is_ok(),
        "1 of 1 is not a mass rebuild"
    );
    assert!(guard::check(&plan, 0.5, 1, true, false).is_err());
}
