//! The PMTiles v3 format (protomaps/PMTiles `spec/v3/spec.md`), as a
//! writer needs it: tile ids on the Hilbert curve, the 127-byte header,
//! directories (root, leaves) and the archive's head laid out from a list
//! of entries. What goes into an archive, and when, is [`super::publish`].
//!
//! Writer rules kept (each checked by a test here or read back by the
//! `pmtiles` reader on PyPI in `tests/osm_pmtiles.rs`):
//! - the header at the start, the root directory right after it, the two
//!   within the first 16,384 bytes: a root too large is split into leaf
//!   directories (one level, as the spec asks), more entries per leaf until
//!   the root fits;
//! - leaves in ascending tile-id order; every length above 0;
//! - offsets encoded as 0 when contiguous with the previous entry, else
//!   offset + 1; tile ids delta-encoded;
//! - `clustered` only when tile data is in tile-id order (a dedup'd entry
//!   pointing back to an earlier blob allowed): a full write; an
//!   incremental one appends, and says it is not clustered;
//! - directories and metadata gzip'd (internal compression 2); tiles are
//!   the MBTiles file's gzip'd MVT (tile compression 2, type 1);
//! - entries of consecutive tile ids with the same blob merged into one run.
//!
//! No crate is used: the `pmtiles` crate's writer streams a whole,
//! clustered archive in tile order and cannot lay an archive out around an
//! earlier one's data section, which the incremental publish is; what is
//! needed is the ~200 lines below.

/// The header's size.
pub const HEADER_BYTES: usize = 127;
/// The header and the root directory fit within this many bytes.
pub const HEAD_ROOT_BYTES_MAX: usize = 16_384;
/// Entries per leaf directory to start from when the root must split.
const LEAF_ENTRIES_FIRST: usize = 4096;

/// Tile type MVT.
pub const TILE_TYPE_MVT: u8 = 1;
/// Compression gzip.
pub const GZIP: u8 = 2;

/// The tile id of z/x/y: the tiles of the zooms below, then the position
/// on z's Hilbert curve.
pub fn tile_id(z: u8, x: u32, y: u32) -> u64 {
    let below = ((1u64 << (2 * u32::from(z))) - 1) / 3;
    let n = 1u64 << z;
    let (mut x, mut y) = (u64::from(x), u64::from(y));
    let mut d = 0u64;
    let mut s = n / 2;
    while s > 0 {
        let rx = u64::from(x & s > 0);
        let ry = u64::from(y & s > 0);
        d += s * s * ((3 * rx) ^ ry);
        rotate(n, &mut x, &mut y, rx, ry);
        s /= 2;
    }
    below + d
}

fn rotate(n: u64, x: &mut u64, y: &mut u64, rx: u64, ry: u64) {
    if ry == 0 {
        if rx == 1 {
            *x = n - 1 - *x;
            *y = n - 1 - *y;
        }
        std::mem::swap(x, y);
    }
}

/// z/x/y of a tile id ([`tile_id`]'s inverse).
pub fn zxy(id: u64) -> (u8, u32, u32) {
    let mut z = 0u8;
    let mut below = 0u64;
    while below + (1u64 << (2 * u32::from(z))) <= id {
        below += 1u64 << (2 * u32::from(z));
        z += 1;
    }
    let n = 1u64 << z;
    let mut t = id - below;
    let (mut x, mut y) = (0u64, 0u64);
    let mut s = 1u64;
    while s < n {
        let rx = 1 & (t / 2);
        let ry = 1 & (t ^ rx);
        rotate(s, &mut x, &mut y, rx, ry);
        x += s * rx;
        y += s * ry;
        t /= 4;
        s *= 2;
    }
    (z, x as u32, y as u32)
}

/// One directory entry: a tile run (`run_length` ≥ 1) or a leaf (0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub tile_id: u64,
    pub offset: u64,
    pub length: u32,
    pub run_length: u32,
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A directory's bytes before compression (spec 4.2).
pub fn encode_directory(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * 6 + 8);
    varint(&mut out, entries.len() as u64);
    let mut last = 0;
    for e in entries {
        varint(&mut out, e.tile_id - last);
        last = e.tile_id;
    }
    for e in entries {
        varint(&mut out, u64::from(e.run_length));
    }
    for e in entries {
        varint(&mut out, u64::from(e.length));
    }
    let mut next = 0;
    for (i, e) in entries.iter().enumerate() {
        if i > 0 && e.offset == next {
            varint(&mut out, 0);
        } else {
            varint(&mut out, e.offset + 1);
        }
        next = e.offset + u64::from(e.length);
    }
    out
}

/// Tile entries from (tile id, offset, length) sorted by tile id, with
/// consecutive ids of one blob merged into a run.
pub fn runs(tiles: impl IntoIterator<Item = (u64, u64, u32)>) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::new();
    for (id, offset, length) in tiles {
        if let Some(e) = out.last_mut() {
            if e.tile_id + u64::from(e.run_length) == id
                && e.offset == offset
                && e.length == length
                && e.run_length < u32::MAX
            {
                e.run_length += 1;
                continue;
            }
        }
        out.push(Entry {
            tile_id: id,
            offset,
            length,
            run_length: 1,
        });
    }
    out
}

/// The root directory and the leaf directories section, compressed: the
/// root alone when it fits beside the header, else leaves of more and
/// more entries until the root of their pointers does.
pub fn directories(entries: &[Entry]) -> (Vec<u8>, Vec<u8>) {
    let root_max = HEAD_ROOT_BYTES_MAX - HEADER_BYTES;
    let root = super::gzip(&encode_directory(entries));
    if root.len() <= root_max {
        return (root, Vec::new());
    }
    let mut per_leaf = LEAF_ENTRIES_FIRST;
    loop {
        let mut leaves = Vec::new();
        let mut pointers = Vec::new();
        for chunk in entries.chunks(per_leaf) {
            let leaf = super::gzip(&encode_directory(chunk));
            pointers.push(Entry {
                tile_id: chunk[0].tile_id,
                offset: leaves.len() as u64,
                length: leaf.len() as u32,
                run_length: 0,
            });
            leaves.extend_from_slice(&leaf);
        }
        let root = super::gzip(&encode_directory(&pointers));
        if root.len() <= root_max {
            return (root, leaves);
        }
        per_leaf *= 2;
    }
}

/// The header's fields (spec 3).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Header {
    pub root_offset: u64,
    pub root_length: u64,
    pub metadata_offset: u64,
    pub metadata_length: u64,
    pub leaf_offset: u64,
    pub leaf_length: u64,
    pub data_offset: u64,
    pub data_length: u64,
    pub addressed_tiles: u64,
    pub tile_entries: u64,
    pub tile_contents: u64,
    pub clustered: bool,
    pub min_zoom: u8,
    pub max_zoom: u8,
    /// min lon, min lat, max lon, max lat.
    pub bounds: [f64; 4],
    pub center_zoom: u8,
    /// lon, lat.
    pub center: [f64; 2],
}

fn e7(v: f64) -> [u8; 4] {
    ((v * 1e7).round() as i32).to_le_bytes()
}

impl Header {
    pub fn to_bytes(&self) -> [u8; HEADER_BYTES] {
        let mut b = Vec::with_capacity(HEADER_BYTES);
        b.extend_from_slice(b"PMTiles");
        b.push(3);
        for v in [
            self.root_offset,
            self.root_length,
            self.metadata_offset,
            self.metadata_length,
            self.leaf_offset,
            self.leaf_length,
            self.data_offset,
            self.data_length,
            self.addressed_tiles,
            self.tile_entries,
            self.tile_contents,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.push(u8::from(self.clustered));
        b.push(GZIP); // internal compression
        b.push(GZIP); // tile compression: the MBTiles file's gzip'd tiles
        b.push(TILE_TYPE_MVT);
        b.push(self.min_zoom);
        b.push(self.max_zoom);
        for v in [
            self.bounds[0],
            self.bounds[1],
            self.bounds[2],
            self.bounds[3],
        ] {
            b.extend_from_slice(&e7(v));
        }
        b.push(self.center_zoom);
        b.extend_from_slice(&e7(self.center[0]));
        b.extend_from_slice(&e7(self.center[1]));
        b.try_into().expect("the header is 127 bytes")
    }
}

/// The archive's head: header, root directory, metadata, leaf
/// directories; the tile data section follows at `data_offset` (= the
/// head's length).
pub struct Head {
    pub bytes: Vec<u8>,
    pub header: Header,
}

/// Lays out the head for `entries` (tile entries, sorted) over a tile data
/// section of `data_length` bytes. `header` gives the fields that are not
/// offsets (counts, zooms, bounds, clustered); `metadata` is the JSON.
pub fn head(entries: &[Entry], metadata: &serde_json::Value, mut header: Header) -> Head {
    let (root, leaves) = directories(entries);
    let meta = super::gzip(metadata.to_string().as_bytes());
    header.root_offset = HEADER_BYTES as u64;
    header.root_length = root.len() as u64;
    header.metadata_offset = header.root_offset + header.root_length;
    header.metadata_length = meta.len() as u64;
    header.leaf_offset = header.metadata_offset + header.metadata_length;
    header.leaf_length = leaves.len() as u64;
    header.data_offset = header.leaf_offset + header.leaf_length;
    let mut bytes = Vec::with_capacity(header.data_offset as usize);
    bytes.extend_from_slice(&header.to_bytes());
    bytes.extend_from_slice(&root);
    bytes.extend_from_slice(&meta);
    bytes.extend_from_slice(&leaves);
    Head { bytes, header }
}

/// Longitude, latitude of a tile's top-left corner.
pub fn lon_lat(z: u8, x: u32, y: u32) -> (f64, f64) {
    let n = (1u64 << z) as f64;
    let lon = x as f64 / n * 360.0 - 180.0;
    let lat = (std::f64::consts::PI * (1.0 - 2.0 * y as f64 / n))
        .sinh()
        .atan()
        .to_degrees();
    (lon, lat)
}

/// Bounds (min lon, min lat, max lon, max lat) of the tiles at the
/// highest zoom among `ids`, and that zoom's range.
pub fn bounds_of(ids: impl IntoIterator<Item = u64>) -> Option<([f64; 4], u8, u8)> {
    let mut zmin = u8::MAX;
    let mut top: Option<(u8, u32, u32, u32, u32)> = None;
    for id in ids {
        let (z, x, y) = zxy(id);
        zmin = zmin.min(z);
        top = match top {
            Some((tz, ..)) if z < tz => top,
            Some((tz, a, b, c, d)) if z == tz => Some((z, a.min(x), b.min(y), c.max(x), d.max(y))),
            _ => Some((z, x, y, x, y)),
        };
    }
    let (z, x0, y0, x1, y1) = top?;
    let (w, n) = lon_lat(z, x0, y0);
    let (e, s) = lon_lat(z, x1 + 1, y1 + 1);
    Some(([w, s, e, n], zmin, z))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spec's table of tile ids.
    #[test]
    fn tile_ids_are_the_specs() {
        for (z, x, y, id) in [
            (0, 0, 0, 0),
            (1, 0, 0, 1),
            (1, 0, 1, 2),
            (1, 1, 1, 3),
            (1, 1, 0, 4),
            (2, 0, 0, 5),
            (12, 3423, 1763, 19_078_479),
        ] {
            assert_eq!(tile_id(z, x, y), id, "{z}/{x}/{y}");
            assert_eq!(zxy(id), (z, x, y), "{id}");
        }
        for z in 0..=6u8 {
            for x in 0..(1u32 << z) {
                for y in 0..(1u32 << z) {
                    assert_eq!(zxy(tile_id(z, x, y)), (z, x, y));
                }
            }
        }
    }

    /// The spec's encoding example: ids delta-encoded, offsets 0 when
    /// contiguous.
    #[test]
    fn directories_encode_as_the_spec_says() {
        let e = [
            Entry {
                tile_id: 5,
                offset: 0,
                length: 10,
                run_length: 1,
            },
            Entry {
                tile_id: 42,
                offset: 10,
                length: 3,
                run_length: 2,
            },
            Entry {
                tile_id: 69,
                offset: 0,
                length: 10,
                run_length: 1,
            },
        ];
        assert_eq!(
            encode_directory(&e),
            vec![3, 5, 37, 27, 1, 2, 1, 10, 3, 10, 1, 0, 1]
        );
    }

    #[test]
    fn runs_merge_consecutive_equal_tiles() {
        let r = runs([(1, 0, 5), (2, 0, 5), (3, 5, 5), (5, 5, 5)]);
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].run_length, 2);
    }

    /// A root too large for the first 16 KiB is split into leaves.
    #[test]
    fn a_large_directory_splits_into_leaves_and_the_root_fits() {
        let entries: Vec<Entry> = (0..200_000u64)
            .map(|i| Entry {
                tile_id: i * 3,
                offset: i * 1000 + (i * 7919) % 991,
                length: 500 + (i % 97) as u32,
                run_length: 1,
            })
            .collect();
        let (root, leaves) = directories(&entries);
        assert!(root.len() + HEADER_BYTES <= HEAD_ROOT_BYTES_MAX);
        assert!(!leaves.is_empty());
    }
}
