"""Builds the glyph PBFs `highwater serve` hands to MapLibre at
/glyphs/{fontstack}/{range}.pbf (issue 25: labels drawn from nothing but
highwater itself).

    python3 scripts/glyphs.py OUT_DIR

Reads Noto Sans Regular and Bold from Debian's `fonts-noto-core`
(/usr/share/fonts/truetype/noto; SIL Open Font License 1.1) and writes,
for the ranges 0-255 and 256-511 (Latin, Latin-1 and Latin Extended-A/B:
the names of Western and Central Europe), OUT_DIR/noto_sans_regular/0-255.pbf
and so on. Needs freetype-py and numpy (PyPI); the output is committed, so
neither serve nor the tests need them.

The format is the one MapLibre reads (the `glyphs.proto` of
mapbox/node-fontnik): per glyph a signed distance field at 24 px with a
3 px buffer, value 255 - 255 * (d / 8 + 0.25) for the distance d in pixels
from the outline (positive outside), as MapLibre's own TinySDF draws local
glyphs, so the 0.75 edge its shader cuts at sits on the outline.
"""

import os
import sys

import freetype
import numpy as np

FONTS = {
    "noto_sans_regular": "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "noto_sans_bold": "/usr/share/fonts/truetype/noto/NotoSans-Bold.ttf",
}
RANGES = [(0, 255), (256, 511)]
SIZE_PX, BUFFER_PX, RADIUS_PX, CUTOFF = 24, 3, 8.0, 0.25


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, wire, payload):
    key = varint((num << 3) | wire)
    if wire == 0:
        return key + varint(payload)
    return key + varint(len(payload)) + payload


def sint(n):
    return (n << 1) ^ (n >> 63)


def sdf(alpha):
    """The distance field of a coverage bitmap (h x w, 0..255), padded by
    the buffer: the exact squared distance to the nearest covered point,
    with partly covered pixels placed on the edge by their coverage."""
    h, w = alpha.shape
    H, W = h + 2 * BUFFER_PX, w + 2 * BUFFER_PX
    a = np.zeros((H, W))
    a[BUFFER_PX:BUFFER_PX + h, BUFFER_PX:BUFFER_PX + w] = alpha / 255.0
    inf = 1e20
    outer = np.full((H, W), inf)
    inner = np.zeros((H, W))
    full = a >= 1.0
    part = (a > 0) & ~full
    outer[full] = 0
    inner[full] = inf
    d = 0.5 - a
    outer[part] = np.where(d[part] > 0, d[part] ** 2, 0)
    inner[part] = np.where(d[part] < 0, d[part] ** 2, 0)
    ys, xs = np.mgrid[0:H, 0:W]
    pts = np.stack([ys.ravel(), xs.ravel()], 1).astype(float)
    d2 = ((pts[:, None, :] - pts[None, :, :]) ** 2).sum(-1)
    do = np.sqrt((d2 + outer.ravel()[None, :]).min(1))
    di = np.sqrt((d2 + inner.ravel()[None, :]).min(1))
    v = 255 - 255 * ((do - di) / RADIUS_PX + CUTOFF)
    return np.clip(np.round(v), 0, 255).astype(np.uint8).tobytes()


def build(name, path, lo, hi):
    face = freetype.Face(path)
    face.set_pixel_sizes(0, SIZE_PX)
    ascender = round(face.size.ascender / 64)
    glyphs = b""
    for cp in range(lo, hi + 1):
        index = face.get_char_index(cp)
        if index == 0:
            continue
        face.load_glyph(index, freetype.FT_LOAD_RENDER | freetype.FT_LOAD_NO_HINTING)
        g = face.glyph
        bm = g.bitmap
        w, h = bm.width, bm.rows
        msg = field(1, 0, cp)
        if w and h:
            rows = np.array(bm.buffer, dtype=np.uint8).reshape(h, bm.pitch)[:, :w]
            msg += field(2, 2, sdf(rows))
        msg += field(3, 0, w) + field(4, 0, h)
        msg += field(5, 0, sint(g.bitmap_left)) + field(6, 0, sint(g.bitmap_top - ascender))
        msg += field(7, 0, round(g.advance.x / 64))
        glyphs += field(3, 2, msg)
    stack = field(1, 2, name.encode()) + field(2, 2, f"{lo}-{hi}".encode()) + glyphs
    return field(1, 2, stack)


def main():
    out = sys.argv[1]
    for name, path in FONTS.items():
        os.makedirs(os.path.join(out, name), exist_ok=True)
        for lo, hi in RANGES:
            data = build(name, path, lo, hi)
            with open(os.path.join(out, name, f"{lo}-{hi}.pbf"), "wb") as f:
                f.write(data)
            print(name, f"{lo}-{hi}", len(data), "bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
