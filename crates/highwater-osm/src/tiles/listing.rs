//! Which tiles a build cuts, listed from the shapes index without holding
//! the world (issue 25: a build in bounded memory).
//!
//! A tile can show a feature only if the feature's bounding box meets the
//! tile's box grown by the buffer: the test [`Store::shapes_in`] applies to
//! find a cut's candidates. So the tiles whose boxes meet some row's box
//! (at a zoom the row shows at) are a superset of the tiles with content; a
//! cut of the others finds nothing and writes nothing.
//!
//! - Below [`BLOCK_ZOOM`] a zoom has at most 4^9 tiles: one scan of the
//!   index lists them all, zoom by zoom.
//! - From [`BLOCK_ZOOM`] on, the world is cut block by block, a block being
//!   a tile at [`BLOCK_ZOOM`] and its descendants (341 tiles down to 14).
//!   The scan lists the blocks; each block's tiles are listed from the rows
//!   in its box when it is cut. What a build holds at a time is one
//!   block's rows and one batch's features, whatever the store's size.

use crate::derive::TileLayer;
use crate::store::{ShapeBox, Store, StoreError};
use highwater_core::tile::Tile;
use std::collections::BTreeSet;

/// The zoom of a block: at most 4^10 blocks in all.
pub const BLOCK_ZOOM: u8 = 10;

/// The bounding box of a shape (world coordinates).
type BBox = (f64, f64, f64, f64);

/// Slack on the tile-range bounds, far above a float's rounding at zoom
/// 14 and far below a tile: a listing may take one tile too many at an
/// exact edge, never one too few.
const EDGE_SLACK: f64 = 1e-9;

/// The tiles of zoom `z` (inclusive ranges x0..=x1, y0..=y1) whose box,
/// grown by `buffer` tiles, meets `b`; `None` for a box that meets none
/// (not finite).
pub fn tile_range(b: BBox, z: u8, buffer: f64) -> Option<(u32, u32, u32, u32)> {
    let (minx, miny, maxx, maxy) = b;
    if ![minx, miny, maxx, maxy].iter().all(|v| v.is_finite()) {
        return None;
    }
    let n = (1u64 << z) as f64;
    // Tile x's grown box is [(x - buffer) / n, (x + 1 + buffer) / n]: it
    // meets [minx, maxx] when minx * n - 1 - buffer <= x <= maxx * n + buffer.
    let lo = |v: f64| {
        (v * n - 1.0 - buffer - EDGE_SLACK)
            .ceil()
            .clamp(0.0, n - 1.0) as u32
    };
    let hi = |v: f64| (v * n + buffer + EDGE_SLACK).floor().clamp(0.0, n - 1.0) as u32;
    let (x0, x1, y0, y1) = (lo(minx), hi(maxx), lo(miny), hi(maxy));
    (x0 <= x1 && y0 <= y1).then_some((x0, x1, y0, y1))
}

/// What a scan of the index lists: the tiles of every zoom below
/// [`BLOCK_ZOOM`], and the blocks.
pub struct Listing {
    pub low: Vec<Vec<Tile>>,
    pub blocks: Vec<(u32, u32)>,
}

/// Lists the low-zoom tiles and the blocks from one scan of the shapes
/// index, and `extra` (the sea's box, which the index does not hold).
pub fn list(s: &Store, layer: &TileLayer, extra: Option<BBox>) -> Result<Listing, StoreError> {
    let low_end = BLOCK_ZOOM.min(layer.zoom_max.saturating_add(1));
    let mut low: Vec<BTreeSet<(u32, u32)>> = vec![BTreeSet::new(); usize::from(low_end)];
    let mut blocks: BTreeSet<(u32, u32)> = BTreeSet::new();
    let mut add = |b: BBox, zmin: u8| {
        for z in zmin.max(layer.zoom_min)..low_end {
            add_range(&mut low[usize::from(z)], b, z, layer.buffer);
        }
        if layer.zoom_max >= BLOCK_ZOOM && zmin <= layer.zoom_max {
            add_range(&mut blocks, b, BLOCK_ZOOM, layer.buffer);
        }
    };
    if let Some(b) = extra {
        add(b, 0);
    }
    // Below the block zoom the low-zoom index holds every row that shows
    // there; the blocks need the whole index.
    if layer.zoom_max >= BLOCK_ZOOM {
        s.scan_shapes(false, |(_, b, zmin)| add(b, zmin))?;
    } else {
        s.scan_shapes(true, |(_, b, zmin)| add(b, zmin))?;
    }
    Ok(Listing {
        low: low
            .into_iter()
            .enumerate()
            .map(|(z, set)| {
                set.into_iter()
                    .map(|(x, y)| Tile { z: z as u8, x, y })
                    .collect()
            })
            .collect(),
        blocks: blocks.into_iter().collect(),
    })
}

fn add_range(set: &mut BTreeSet<(u32, u32)>, b: BBox, z: u8, buffer: f64) {
    if let Some((x0, x1, y0, y1)) = tile_range(b, z, buffer) {
        for x in x0..=x1 {
            for y in y0..=y1 {
                set.insert((x, y));
            }
        }
    }
}

/// The box of a block, grown by the buffer of its own zoom: it meets
/// every box that a tile under it, grown by that tile's (smaller) buffer,
/// meets.
pub fn block_box((x, y): (u32, u32), buffer: f64) -> BBox {
    super::tile_box(
        Tile {
            z: BLOCK_ZOOM,
            x,
            y,
        },
        buffer,
    )
}

/// The tiles of a block, zoom by zoom from [`BLOCK_ZOOM`] (or the layer's
/// lowest zoom) to the layer's highest, whose grown boxes meet one of
/// `rows` (the index's rows in the block's box) at a zoom it shows at.
pub fn block_tiles(
    block: (u32, u32),
    layer: &TileLayer,
    rows: &[ShapeBox],
    extra: Option<BBox>,
) -> Vec<Vec<Tile>> {
    let first = BLOCK_ZOOM.max(layer.zoom_min);
    let mut out = Vec::new();
    for z in first..=layer.zoom_max {
        let d = u32::from(z - BLOCK_ZOOM);
        let (cx0, cy0) = (block.0 << d, block.1 << d);
        let (cx1, cy1) = (cx0 + (1 << d) - 1, cy0 + (1 << d) - 1);
        let mut set: BTreeSet<(u32, u32)> = BTreeSet::new();
        let boxes = rows
            .iter()
            .filter(|(_, _, zmin)| *zmin <= z)
            .map(|(_, b, _)| *b)
            .chain(extra);
        for b in boxes {
            if let Some((x0, x1, y0, y1)) = tile_range(b, z, layer.buffer) {
                for x in x0.max(cx0)..=x1.min(cx1) {
                    for y in y0.max(cy0)..=y1.min(cy1) {
                        set.insert((x, y));
                    }
                }
            }
        }
        out.push(set.into_iter().map(|(x, y)| Tile { z, x, y }).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    // The cut's own grown tile box and candidate test.
    use crate::tiles::{meets, tile_box as grown};

    /// Every tile whose grown box meets the feature's box is in its range
    /// (the listing never misses a tile a cut would fill), and the range
    /// holds no tile more than one beyond that set on any side.
    #[test]
    fn a_tile_range_holds_every_tile_a_cut_finds_the_box_in() {
        let boxes = [
            (0.5, 0.5, 0.5, 0.5),
            (0.123456, 0.654321, 0.1235, 0.6544),
            (0.0, 0.0, 1.0, 1.0),
            (-0.2, 0.3, 0.01, 1.7),
            // Exactly on tile edges at zoom 4 and below.
            (0.25, 0.25, 0.5, 0.5),
            (0.999_999, 0.000_001, 0.999_999_9, 0.000_002),
        ];
        for b in boxes {
            for z in [0u8, 1, 3, 4, 7, 10, 12] {
                for buffer in [0.0, 4.0 / 256.0, 64.0 / 4096.0] {
                    let n = 1u32 << z;
                    let r = tile_range(b, z, buffer);
                    for x in 0..n.min(4096) {
                        for y in 0..n.min(4096) {
                            let t = Tile { z, x, y };
                            if meets(b, grown(t, buffer)) {
                                let (x0, x1, y0, y1) = r.expect("a range");
                                assert!(
                                    (x0..=x1).contains(&x) && (y0..=y1).contains(&y),
                                    "{t:?} meets {b:?} (buffer {buffer}) outside {r:?}"
                                );
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(tile_range((f64::NAN, 0.0, 0.1, 0.1), 3, 0.0), None);
    }

    /// A block's tiles are the tiles under it that a row's box meets, at
    /// the zooms the row shows at.
    #[test]
    fn a_blocks_tiles_are_its_own_at_the_rows_zooms() {
        let layer = TileLayer {
            zoom_min: 0,
            zoom_max: 12,
            ..TileLayer::every_key()
        };
        // One point in the middle of block (512, 512), shown from z11.
        let p = 512.5 / 1024.0;
        let rows = vec![((crate::model::MemberKind::Node, 1), (p, p, p, p), 11)];
        let tiles = block_tiles((512, 512), &layer, &rows, None);
        assert_eq!(tiles.len(), 3);
        assert!(tiles[0].is_empty(), "z10: the row shows from z11");
        assert_eq!(
            tiles[1].len(),
            4,
            "z11: the point is on a corner of four tiles"
        );
        assert!(tiles[1].iter().all(|t| t.x >> 1 == 512 && t.y >> 1 == 512));
        assert!(!tiles[2].is_empty());
        // The neighbouring block lists none of the point's tiles.
        assert!(block_tiles((513, 512), &layer, &rows, None)
            .iter()
            .all(Vec::is_empty));
    }
}
