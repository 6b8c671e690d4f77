//! The shapes index's spatial key: a loose quadtree flattened into one
//! integer per feature, so the index is an ordinary B-tree.
//!
//! SQLite's R-tree took about 10 µs per insert, most of an import's time
//! (325,000 features of the 7-region store: 3 s). Here each feature is
//! keyed by the smallest quadtree cell, down to [`LEVEL_MAX`], that holds
//! its whole bounding box: the cell's Morton code at [`LEVEL_MAX`] (of its
//! lower corner) with the cell's level in the low 5 bits. A cell's
//! descendants then have keys in one contiguous range, so a query box
//! becomes a few key ranges (cells inside the box) and point keys (cells
//! that straddle its edge), and a sorted import is a B-tree append.
//!
//! Keys find candidates; the caller keeps those whose bounding box meets
//! the query box. World coordinates outside [0, 1] (beyond ±85.0511°) are
//! held by the edge cells, so they are still found, never clamped in their
//! stored boxes. Pure: the store runs the ranges as SQL.

/// The finest level: cells of 2^-16 of the world, about 600 m at the
/// equator. Smaller features share their cell.
pub const LEVEL_MAX: u32 = 16;

/// Levels below the query box's own size that straddling cells are split
/// to; below that, a straddling cell is taken whole (more candidates, fewer
/// ranges).
const SPLIT_LEVELS_MAX: u32 = 3;

type BBox = (f64, f64, f64, f64);

fn cell_coord(v: f64) -> u32 {
    let n = 1u32 << LEVEL_MAX;
    if v.is_nan() {
        return 0;
    }
    ((v * f64::from(n)).floor().clamp(0.0, f64::from(n - 1))) as u32
}

fn spread(v: u32) -> u64 {
    let mut v = u64::from(v) & 0xffff;
    v = (v | (v << 8)) & 0x00ff_00ff;
    v = (v | (v << 4)) & 0x0f0f_0f0f;
    v = (v | (v << 2)) & 0x3333_3333;
    (v | (v << 1)) & 0x5555_5555
}

fn morton(x: u32, y: u32) -> u64 {
    spread(x) | (spread(y) << 1)
}

fn key(level: u32, x: u32, y: u32) -> i64 {
    // (x, y) is the cell at `level`; its lower corner at LEVEL_MAX.
    let d = LEVEL_MAX - level;
    ((morton(x << d, y << d) << 5) | u64::from(level)) as i64
}

/// The key of the cell that holds a bounding box (minx, miny, maxx, maxy).
pub fn cell_of((minx, miny, maxx, maxy): BBox) -> i64 {
    let (x0, y0, x1, y1) = (
        cell_coord(minx),
        cell_coord(miny),
        cell_coord(maxx),
        cell_coord(maxy),
    );
    let bits = |v: u32| 32 - v.leading_zeros();
    let d = bits(x0 ^ x1).max(bits(y0 ^ y1));
    let level = LEVEL_MAX - d;
    key(level, x0 >> d, y0 >> d)
}

/// Inclusive key ranges whose cells may hold a feature meeting `bbox`:
/// sorted and merged.
pub fn ranges((minx, miny, maxx, maxy): BBox) -> Vec<(i64, i64)> {
    let (qx0, qy0, qx1, qy1) = (
        cell_coord(minx),
        cell_coord(miny),
        cell_coord(maxx.max(minx)),
        cell_coord(maxy.max(miny)),
    );
    // The level at which the query spans about one cell.
    let span = (qx1 - qx0).max(qy1 - qy0) + 1;
    let qlevel = LEVEL_MAX.saturating_sub(32 - span.leading_zeros());
    let split_to = (qlevel + SPLIT_LEVELS_MAX).min(LEVEL_MAX);
    let mut out = Vec::new();
    let mut stack = vec![(0u32, 0u32, 0u32)];
    while let Some((level, x, y)) = stack.pop() {
        let d = LEVEL_MAX - level;
        let (cx0, cy0) = (x << d, y << d);
        let (cx1, cy1) = (cx0 + ((1u32 << d) - 1), cy0 + ((1u32 << d) - 1));
        if cx1 < qx0 || cx0 > qx1 || cy1 < qy0 || cy0 > qy1 {
            continue;
        }
        let inside = cx0 >= qx0 && cx1 <= qx1 && cy0 >= qy0 && cy1 <= qy1;
        if inside || level >= split_to {
            // The cell and all its descendants.
            let start = morton(cx0, cy0) << 5;
            let end = ((morton(cx0, cy0) + (1u64 << (2 * d))) << 5) - 1;
            out.push((start as i64, end as i64));
        } else {
            // Features held by this very cell, then its children.
            let k = key(level, x, y);
            out.push((k, k));
            for (dx, dy) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
                stack.push((level + 1, 2 * x + dx, 2 * y + dy));
            }
        }
    }
    out.sort_unstable();
    let mut merged: Vec<(i64, i64)> = Vec::with_capacity(out.len());
    for (a, b) in out {
        match merged.last_mut() {
            Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn found(feature: BBox, query: BBox) -> bool {
        let k = cell_of(feature);
        ranges(query).iter().any(|&(a, b)| a <= k && k <= b)
    }

    fn meets(a: BBox, b: BBox) -> bool {
        a.2 >= b.0 && a.0 <= b.2 && a.3 >= b.1 && a.1 <= b.3
    }

    fn bbox() -> impl Strategy<Value = BBox> {
        // Mostly small boxes, some large, some beyond the world's edge.
        (
            -0.1f64..1.1,
            -0.1f64..1.1,
            prop_oneof![0.0f64..1e-5, 0.0f64..1e-2, 0.0f64..1.2],
        )
            .prop_flat_map(|(x, y, w)| (Just(x), Just(y), Just(w), 0.0f64..=w))
            .prop_map(|(x, y, w, h)| (x, y, x + w, y + h))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]
        /// Never a miss: a feature whose box meets the query is found.
        #[test]
        fn every_feature_meeting_the_query_is_found(f in bbox(), q in bbox()) {
            if meets(f, q) {
                prop_assert!(found(f, q), "feature {:?} query {:?}", f, q);
            }
        }
    }

    #[test]
    fn a_small_query_needs_few_ranges_and_skips_far_cells() {
        let q = (0.5, 0.5, 0.5 + 1e-4, 0.5 + 1e-4);
        let r = ranges(q);
        assert!(r.len() < 64, "{}", r.len());
        assert!(!found((0.1, 0.1, 0.1001, 0.1001), q));
        // The whole world's cell is always looked at.
        assert!(found((0.0, 0.0, 1.0, 1.0), q));
    }

    #[test]
    fn a_box_straddling_the_middle_is_held_by_the_root() {
        assert_eq!(cell_of((0.49, 0.49, 0.51, 0.51)) & 31, 0);
        assert_eq!(cell_of((0.1, 0.1, 0.1, 0.1)) & 31, i64::from(LEVEL_MAX));
    }
}
