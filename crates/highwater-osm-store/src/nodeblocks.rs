//! Node blocks: how the store keeps nodes and the ways through them.
//!
//! A store holds millions of nodes and, for each, the ways that use it (the
//! reverse index deriving walks when a node moves). One SQLite row per node
//! and one per (node, way) made an import cost two B-tree inserts per node
//! and per way reference, most of an import's time. Instead, nodes live in
//! blocks of consecutive ids: row `first` of `node_blocks` holds the
//! entries whose ids run from `first` up to the next block's `first`, each
//! with its location, whether it has tags (kept in `node_tags`), and the
//! ways through it. An import writes a block per [`BLOCK_ENTRIES_IMPORT`]
//! nodes; an apply rewrites the blocks its changes touch and splits one
//! that grows past [`BLOCK_ENTRIES_MAX`].
//!
//! An entry may have no location: a node that a way references but the
//! store does not hold (clipped by the extract, or deleted), kept so that
//! the way is found when the node arrives.
//!
//! Encoding (all integers little-endian): entry count (varint), then per
//! entry its id as a varint delta from the previous entry's (the first from
//! the block's `first`), a flags byte (1: located, 2: tagged, 4: located
//! in the flat node file, [`crate::flatnodes`]), latitude and
//! longitude in 1e-7 degrees (i32 each) when located here, the way count
//! (varint) and the way ids as zigzag varint deltas. This module is pure:
//! the store reads and writes the bytes.

/// Entries an import puts in a block: small enough that reading one node
/// decodes little, large enough that a block row costs little per node.
pub const BLOCK_ENTRIES_IMPORT: usize = 64;

/// Entries above which an apply splits a block in two.
pub const BLOCK_ENTRIES_MAX: usize = 2 * BLOCK_ENTRIES_IMPORT;

/// One node id's entry in its block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    pub id: i64,
    /// Latitude and longitude in 1e-7 degrees; none when the store holds
    /// no node of this id (only ways referencing it).
    pub loc: Option<(i32, i32)>,
    /// The node has tags (in `node_tags`).
    pub tagged: bool,
    /// The ways through the node, ascending, without repeats.
    pub ways: Vec<i64>,
    /// The node exists and its location is in the flat node file (a store
    /// with `[osm] flat_nodes`), not here: `loc` is then `None` in a
    /// decoded entry and ignored when encoding.
    pub flat: bool,
}

impl Entry {
    /// Neither a node nor referenced: the entry can go.
    pub fn is_void(&self) -> bool {
        self.loc.is_none() && !self.flat && self.ways.is_empty()
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(b: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let byte = *b.get(*i)?;
        *i += 1;
        if shift > 63 {
            return None;
        }
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(v);
        }
        shift += 7;
    }
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Encodes entries (ascending ids, the first at `first`).
pub fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * 12);
    encode_into(entries, &mut out);
    out
}

/// [`encode`] into `out` (cleared first), so that an import encoding
/// millions of blocks reuses one buffer.
pub fn encode_into(entries: &[Entry], out: &mut Vec<u8>) {
    debug_assert!(entries.windows(2).all(|w| w[0].id < w[1].id));
    out.clear();
    let out = &mut *out;
    put_varint(out, entries.len() as u64);
    let mut prev = entries.first().map_or(0, |e| e.id);
    for e in entries {
        put_varint(out, e.id.wrapping_sub(prev) as u64);
        prev = e.id;
        let here = e.loc.filter(|_| !e.flat);
        out.push(u8::from(here.is_some()) | (u8::from(e.tagged) << 1) | (u8::from(e.flat) << 2));
        if let Some((lat, lon)) = here {
            out.extend_from_slice(&lat.to_le_bytes());
            out.extend_from_slice(&lon.to_le_bytes());
        }
        put_varint(out, e.ways.len() as u64);
        let mut pw = 0i64;
        for &w in &e.ways {
            put_varint(out, zigzag(w.wrapping_sub(pw)));
            pw = w;
        }
    }
}

/// One entry's head at `*i`: its id (a delta on `prev`), flags, location
/// and the count of its ways, which follow. `decode_until` and `find` read
/// records through it, so they agree on the layout and on what is damaged.
/// An entry's head: id, flags, location, and how many ways follow.
type Head = (i64, u8, Option<(i32, i32)>, usize);

fn head(b: &[u8], i: &mut usize, prev: i64) -> Option<Head> {
    let id = prev.wrapping_add(get_varint(b, i)? as i64);
    let flags = *b.get(*i)?;
    *i += 1;
    let loc = if flags & 1 != 0 {
        let lat = i32::from_le_bytes(b.get(*i..*i + 4)?.try_into().ok()?);
        let lon = i32::from_le_bytes(b.get(*i + 4..*i + 8)?.try_into().ok()?);
        *i += 8;
        Some((lat, lon))
    } else {
        None
    };
    let nw = get_varint(b, i)? as usize;
    Some((id, flags, loc, nw))
}

/// The entry whose head is given, its `nw` ways read from `*i`.
fn entry(b: &[u8], i: &mut usize, (id, flags, loc, nw): Head) -> Option<Entry> {
    let mut ways = Vec::with_capacity(nw.min(b.len()));
    let mut pw = 0i64;
    for _ in 0..nw {
        pw = pw.wrapping_add(unzigzag(get_varint(b, i)?));
        ways.push(pw);
    }
    Some(Entry {
        id,
        loc,
        tagged: flags & 2 != 0,
        ways,
        flat: flags & 4 != 0,
    })
}

/// Reads entries from a block until `stop` says so (it sees each entry
/// and returns true to stop after it). None when the bytes are not a
/// block: the caller names the store.
pub fn decode_until(
    first: i64,
    b: &[u8],
    mut stop: impl FnMut(&Entry) -> bool,
) -> Option<Vec<Entry>> {
    let mut i = 0;
    let n = get_varint(b, &mut i)? as usize;
    // A count beyond what the bytes can hold is corruption, not a request
    // to allocate.
    let mut out = Vec::with_capacity(n.min(b.len()));
    let mut prev = first;
    for _ in 0..n {
        let h = head(b, &mut i, prev)?;
        prev = h.0;
        let e = entry(b, &mut i, h)?;
        let done = stop(&e);
        out.push(e);
        if done {
            break;
        }
    }
    Some(out)
}

/// Every entry of a block.
pub fn decode(first: i64, b: &[u8]) -> Option<Vec<Entry>> {
    decode_until(first, b, |_| false)
}

/// The entry for `id` in a block, if it has one: reads only up to it, and
/// keeps nothing of the entries before it (their ways are skipped, not
/// collected: a lookup is most of what deriving a diff does). The same
/// answer, and the same refusal of damaged bytes, as taking the last entry
/// [`decode_until`] reads.
pub fn find(first: i64, b: &[u8], id: i64) -> Option<Option<Entry>> {
    let mut i = 0;
    let n = get_varint(b, &mut i)? as usize;
    let mut prev = first;
    for _ in 0..n {
        let h = head(b, &mut i, prev)?;
        prev = h.0;
        if h.0 < id {
            for _ in 0..h.3 {
                get_varint(b, &mut i)?;
            }
            continue;
        }
        let e = entry(b, &mut i, h)?;
        return Some((e.id == id).then_some(e));
    }
    Some(None)
}

/// Decoded blocks a reader keeps while what it reads cannot change under
/// it (a read or write transaction; a writer drops them when it edits a
/// block). The nodes of a way are mostly consecutive ids in one block, and
/// a diff's apply derives the same features once per dataset: without it,
/// each node read was a B-tree seek, a blob copy and a decode of the block
/// up to the node, the largest share of a minutely diff's apply and drain.
#[derive(Debug, Default)]
pub struct Cache {
    /// By the block's first id: its entries, ascending.
    blocks: std::collections::BTreeMap<i64, Vec<Entry>>,
}

/// Blocks a [`Cache`] keeps at most (about 64 entries each, a few KiB):
/// past it the cache starts again empty, so a full pass over the store
/// holds a bounded number of blocks. What the cache saves is decoding a
/// block again for the next node of the same way, which a few hundred
/// blocks already catch; 4,096 made a minutely apply on the 100M-node
/// store fault in ~1.5k more fresh pages (~6 MB) for no measured gain, and
/// full rebuilds of the 1M world took the same time either way.
pub const BLOCKS_CACHED_MAX: usize = 512;

impl Cache {
    /// The entry for `id` if a kept block covers it: `Some(None)` when the
    /// block has no entry of that id, `None` when no kept block can say.
    /// A block covers ids from its first to its last entry's for sure;
    /// past its last entry, only the store knows where the next begins.
    pub fn get(&self, id: i64) -> Option<Option<&Entry>> {
        let (_, entries) = self.blocks.range(..=id).next_back()?;
        if entries.last().is_none_or(|e| e.id < id) {
            return None;
        }
        Some(
            entries
                .binary_search_by_key(&id, |e| e.id)
                .ok()
                .map(|p| &entries[p]),
        )
    }

    /// Keeps a block's decoded entries.
    pub fn put(&mut self, first: i64, entries: Vec<Entry>) {
        debug_assert!(entries.windows(2).all(|w| w[0].id < w[1].id));
        if self.blocks.len() >= BLOCKS_CACHED_MAX {
            self.blocks.clear();
        }
        self.blocks.insert(first, entries);
    }

    /// Forgets every block: the store's blocks changed.
    pub fn clear(&mut self) {
        self.blocks.clear();
    }
}

/// Cuts sorted entries into blocks of at most `per_block`, each keyed by
/// its first id.
pub fn blocks(entries: &[Entry], per_block: usize) -> impl Iterator<Item = (i64, Vec<u8>)> + '_ {
    assert!(per_block > 0, "a block holds at least one entry");
    entries.chunks(per_block).map(|c| (c[0].id, encode(c)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(id: i64, loc: Option<(i32, i32)>, tagged: bool, ways: &[i64]) -> Entry {
        Entry {
            id,
            loc,
            tagged,
            ways: ways.to_vec(),
            flat: false,
        }
    }

    #[test]
    fn entries_round_trip_with_extreme_values() {
        let entries = vec![
            e(
                -(1 << 60),
                Some((i32::MIN, i32::MAX)),
                true,
                &[1 << 60, -(1 << 60)],
            ),
            e(-1, None, false, &[5]),
            e(0, Some((0, 0)), false, &[]),
            e(
                1 << 60,
                Some((-900_000_000, 1_800_000_000)),
                true,
                &[1, 2, 3],
            ),
        ];
        let b = encode(&entries);
        assert_eq!(decode(entries[0].id, &b).unwrap(), entries);
        assert_eq!(
            find(entries[0].id, &b, 0).unwrap(),
            Some(entries[2].clone())
        );
        assert_eq!(find(entries[0].id, &b, 7).unwrap(), None);
        assert_eq!(find(entries[0].id, &b, 1 << 61).unwrap(), None);
    }

    #[test]
    fn truncated_or_garbage_bytes_are_refused_not_panicked_on() {
        let b = encode(&[e(10, Some((1, 2)), true, &[3, 4])]);
        for n in 0..b.len() {
            assert_eq!(decode(10, &b[..n]), None, "{n} bytes");
        }
        assert_eq!(decode(0, &[0xff; 11]), None);
        // A huge count with no bytes behind it.
        assert_eq!(decode(0, &[0xff, 0xff, 0xff, 0xff, 0x0f]), None);
    }

    /// A cache answers only for ids its blocks surely cover, and then as
    /// `find` on the block's bytes does; past a block's last entry it
    /// defers to the store, which alone knows where the next block begins.
    #[test]
    fn cache_answers_as_find_or_not_at_all() {
        let a = vec![
            e(10, Some((1, 1)), false, &[7]),
            e(12, None, false, &[8]),
            e(15, Some((2, 2)), true, &[]),
        ];
        let b = vec![e(40, Some((3, 3)), false, &[]), e(41, None, false, &[9])];
        let mut c = Cache::default();
        c.put(10, a.clone());
        c.put(40, b.clone());
        let (ba, bb) = (encode(&a), encode(&b));
        for id in [10, 11, 12, 14, 15, 40, 41] {
            let bytes = if id < 40 { &ba } else { &bb };
            let first = if id < 40 { 10 } else { 40 };
            assert_eq!(
                c.get(id).map(|e| e.cloned()),
                Some(find(first, bytes, id).unwrap()),
                "id {id}"
            );
        }
        for id in [9, 16, 39, 42, 1 << 40] {
            assert_eq!(c.get(id), None, "id {id}");
        }
        c.clear();
        assert_eq!(c.get(10), None);
        // Full: it starts again rather than grow.
        for k in 0..=BLOCKS_CACHED_MAX as i64 {
            c.put(k * 100, vec![e(k * 100, Some((0, 0)), false, &[])]);
        }
        assert!(c.blocks.len() <= BLOCKS_CACHED_MAX);
        assert!(c.get(BLOCKS_CACHED_MAX as i64 * 100).is_some());
    }

    /// `find` reads without collecting; it must answer exactly as taking
    /// the last entry `decode_until` reads would, on whole blocks and on
    /// damaged ones (every truncation), for ids in, between and around
    /// the block's.
    #[test]
    fn find_answers_as_decoding_up_to_the_id_does() {
        let reference = |first: i64, b: &[u8], id: i64| {
            decode_until(first, b, |e| e.id >= id)
                .map(|v| v.into_iter().last().filter(|e| e.id == id))
        };
        let entries = vec![
            e(-7, Some((1, -1)), false, &[3, -9, 1 << 40]),
            e(-2, None, true, &[]),
            e(4, Some((i32::MAX, i32::MIN)), true, &[5]),
            e(5, None, false, &[6, 7]),
            e(1 << 50, Some((0, 0)), false, &[]),
        ];
        let b = encode(&entries);
        let ids = [-8, -7, -5, -2, 0, 4, 5, 6, 1 << 50, (1 << 50) + 1];
        for n in 0..=b.len() {
            for id in ids {
                assert_eq!(
                    find(-7, &b[..n], id),
                    reference(-7, &b[..n], id),
                    "{n} bytes, id {id}"
                );
            }
        }
        assert_eq!(find(-7, &b, 5).unwrap(), Some(entries[3].clone()));
    }

    #[test]
    fn blocks_key_each_chunk_by_its_first_id() {
        let entries: Vec<Entry> = (0..10)
            .map(|i| e(i * 3, Some((0, 0)), false, &[]))
            .collect();
        let keys: Vec<i64> = blocks(&entries, 4).map(|(k, _)| k).collect();
        assert_eq!(keys, vec![0, 12, 24]);
    }
}
