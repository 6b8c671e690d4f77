//! The manifest entry: the recorded evidence and recipe of a finished item.

use crate::evidence::{Digest, Stat};
use serde::{Deserialize, Serialize};

/// Whether an item finished. A failed item keeps its error and is retried on
/// the next run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed => "failed",
        }
    }
}

/// What an entry records. `Item` is a unit of work with an output; `Member`
/// is an input of an aggregate item, kept only as a stat cache so that an
/// unchanged aggregate does not re-read its inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    Item,
    Member,
}

impl EntryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Item => "item",
            EntryKind::Member => "member",
        }
    }
}

/// One manifest entry. `item` is the input's path relative to the config
/// file's folder, with `/` separators.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub kind: EntryKind,
    pub item: String,
    /// `None` under signals that read no bytes (`mtime`, `exists`).
    pub digest: Option<Digest>,
    #[serde(flatten)]
    pub stat: Stat,
    /// Wall clock when the evidence was taken, for the racy rule.
    pub observed_at_ns: i64,
    pub recipe: String,
    pub output: String,
    pub status: Status,
    pub error: Option<String>,
    pub processed_at_ns: i64,
    pub duration_ms: u64,
}

/// The entries of one kind of one stage, by item: a list sorted by
/// `Entry::item`, searched by halving. A no-change plan of a large stage is
/// mostly the loading of this list (issue 24), so it is one allocation of
/// entries, with no node per entry and no second copy of each item's name
/// as a key (git's index is the model: one sorted array).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entries {
    sorted: Vec<Entry>,
}

impl Entries {
    pub fn new() -> Entries {
        Entries::default()
    }

    /// From entries already sorted by item, each item once (a store's
    /// `ORDER BY item`): checked, since a wrong order would make lookups
    /// miss entries, which plans as new work rather than as unchanged.
    pub fn from_sorted(sorted: Vec<Entry>) -> Entries {
        assert!(
            sorted.windows(2).all(|w| w[0].item < w[1].item),
            "entries handed to Entries::from_sorted are not sorted by item, or repeat one"
        );
        Entries { sorted }
    }

    pub fn get(&self, item: &str) -> Option<&Entry> {
        self.sorted
            .binary_search_by(|e| e.item.as_str().cmp(item))
            .ok()
            .map(|i| &self.sorted[i])
    }

    pub fn contains_key(&self, item: &str) -> bool {
        self.get(item).is_some()
    }

    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// In item order, as a map's `(key, value)` pairs.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Entry)> + '_ {
        self.sorted.iter().map(|e| (&e.item, e))
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> + '_ {
        self.sorted.iter().map(|e| &e.item)
    }

    pub fn values(&self) -> std::slice::Iter<'_, Entry> {
        self.sorted.iter()
    }

    /// The entries in item order, for positional pairing with a list in
    /// the same order.
    pub fn as_slice(&self) -> &[Entry] {
        &self.sorted
    }
}

impl std::ops::Index<&str> for Entries {
    type Output = Entry;
    fn index(&self, item: &str) -> &Entry {
        self.get(item)
            .unwrap_or_else(|| panic!("no entry for item {item:?}"))
    }
}

/// From pairs in any order, as a map's `collect`: sorted, the last entry of
/// a repeated item kept. The key must be the entry's own item.
impl FromIterator<(String, Entry)> for Entries {
    fn from_iter<I: IntoIterator<Item = (String, Entry)>>(iter: I) -> Entries {
        iter.into_iter()
            .map(|(k, e)| {
                assert_eq!(k, e.item, "an entry keyed by another item's name");
                e
            })
            .collect()
    }
}

/// From entries in any order: sorted, the last entry of a repeated item kept.
impl FromIterator<Entry> for Entries {
    fn from_iter<I: IntoIterator<Item = Entry>>(iter: I) -> Entries {
        let mut sorted: Vec<Entry> = iter.into_iter().collect();
        // Stable, so that of a repeated item the last one stays last.
        sorted.sort_by(|a, b| a.item.cmp(&b.item));
        let mut out: Vec<Entry> = Vec::with_capacity(sorted.len());
        for e in sorted {
            match out.last_mut() {
                Some(last) if last.item == e.item => *last = e,
                _ => out.push(e),
            }
        }
        Entries { sorted: out }
    }
}

impl IntoIterator for Entries {
    type Item = Entry;
    type IntoIter = std::vec::IntoIter<Entry>;
    fn into_iter(self) -> Self::IntoIter {
        self.sorted.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(item: &str, output: &str) -> Entry {
        Entry {
            kind: EntryKind::Item,
            item: item.to_string(),
            digest: None,
            stat: Stat::default(),
            observed_at_ns: 0,
            recipe: "r".to_string(),
            output: output.to_string(),
            status: Status::Ok,
            error: None,
            processed_at_ns: 0,
            duration_ms: 0,
        }
    }

    #[test]
    fn entries_find_what_a_map_would() {
        // Byte order, as SQLite's BINARY collation and BTreeMap<String> sort:
        // `a.txt` < `a/b` ('.' < '/'), upper case before lower case.
        let names = ["B", "a.txt", "a/b", "a/b/c", "b", "é"];
        let map: std::collections::BTreeMap<String, Entry> = names
            .iter()
            .rev()
            .map(|n| (n.to_string(), entry(n, n)))
            .collect();
        let e: Entries = map.clone().into_iter().collect();
        assert_eq!(e.len(), names.len());
        assert_eq!(e.keys().collect::<Vec<_>>(), map.keys().collect::<Vec<_>>());
        for n in names {
            assert_eq!(e.get(n), map.get(n));
            assert_eq!(e[n].item, n);
        }
        assert!(e.get("a").is_none() && e.get("c").is_none() && !e.contains_key(""));
        assert_eq!(Entries::from_sorted(e.clone().into_iter().collect()), e);
    }

    #[test]
    fn a_repeated_item_keeps_its_last_entry_as_a_map_does() {
        let e: Entries = [entry("x", "first"), entry("y", "y"), entry("x", "last")]
            .into_iter()
            .collect();
        assert_eq!(e.len(), 2);
        assert_eq!(e["x"].output, "last");
    }

    #[test]
    #[should_panic(expected = "not sorted by item")]
    fn unsorted_entries_are_our_bug_and_refused() {
        Entries::from_sorted(vec![entry("b", "b"), entry("a", "a")]);
    }
}
