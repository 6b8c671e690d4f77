//! Tile coverage against brute force: for random segments and polygons at a
//! small zoom, every cell is tested on its own.

use highwater_core::tile::{add_line, add_polygon, Cells};
use proptest::prelude::*;

/// Whether the segment a-b meets the closed box [x0, x1] × [y0, y1].
fn segment_meets_box(a: (f64, f64), b: (f64, f64), x0: f64, y0: f64, x1: f64, y1: f64) -> bool {
    highwater_core::tile::clip_segment(a, b, (x0, y0, x1, y1)).is_some()
}

fn inside(rings: &[Vec<(f64, f64)>], x: f64, y: f64) -> bool {
    let mut c = false;
    for r in rings {
        for e in r.windows(2) {
            let ((x1, y1), (x2, y2)) = (e[0], e[1]);
            if (y1 <= y) != (y2 <= y) && x < x1 + (y - y1) / (y2 - y1) * (x2 - x1) {
                c = !c;
            }
        }
    }
    c
}

const Z: u8 = 4;
const N: f64 = 16.0;

fn pt() -> impl Strategy<Value = (f64, f64)> {
    (0.0f64..1.0, 0.0f64..1.0)
}

proptest! {
    #[test]
    fn lines_touch_exactly_the_cells_of_their_buffered_band(pts in prop::collection::vec(pt(), 2..5), buffer in prop_oneof![Just(0.0), 0.0f64..1.5]) {
        let mut got = Cells::new();
        add_line(&pts, Z, buffer, &mut got);
        let mut want = Cells::new();
        for cx in 0..16u32 {
            for cy in 0..16u32 {
                let (x0, y0) = ((cx as f64 - buffer) / N, (cy as f64 - buffer) / N);
                let (x1, y1) = ((cx as f64 + 1.0 + buffer) / N, (cy as f64 + 1.0 + buffer) / N);
                if pts.windows(2).any(|s| segment_meets_box(s[0], s[1], x0, y0, x1, y1)) {
                    want.insert((cx, cy));
                }
            }
        }
        // Exact up to floating-point ties on cell edges: every brute-force
        // cell is found, and anything extra touches within 1e-9 of an edge.
        prop_assert!(got.is_superset(&want), "missing {:?}", want.difference(&got).collect::<Vec<_>>());
        for &(cx, cy) in got.difference(&want) {
            let e = 1e-9;
            let (x0, y0) = ((cx as f64 - buffer) / N - e, (cy as f64 - buffer) / N - e);
            let (x1, y1) = ((cx as f64 + 1.0 + buffer) / N + e, (cy as f64 + 1.0 + buffer) / N + e);
            prop_assert!(pts.windows(2).any(|s| segment_meets_box(s[0], s[1], x0, y0, x1, y1)), "extra {:?}", (cx, cy));
        }
    }

    #[test]
    fn polygons_cover_every_cell_they_touch(mut ring in prop::collection::vec(pt(), 3..7)) {
        ring.push(ring[0]);
        let rings = vec![ring];
        let mut got = Cells::new();
        add_polygon(&rings, Z, 0.0, &mut got);
        for cx in 0..16u32 {
            for cy in 0..16u32 {
                // A sample of points in the cell's interior: any inside the
                // area means the cell is touched and must be covered.
                for (fx, fy) in [(0.5, 0.5), (0.1, 0.1), (0.9, 0.1), (0.1, 0.9), (0.9, 0.9), (0.3, 0.7)] {
                    let (x, y) = ((cx as f64 + fx) / N, (cy as f64 + fy) / N);
                    if inside(&rings, x, y) {
                        prop_assert!(got.contains(&(cx, cy)), "cell {:?} has a point inside but is not covered", (cx, cy));
                    }
                }
            }
        }
    }
}
