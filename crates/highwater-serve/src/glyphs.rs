//! `/glyphs/{fontstack}/{range}.pbf`: the label glyphs the map's style
//! names, compiled in, so labels load from nothing but this server (issue
//! 25). Noto Sans Regular and Bold, ranges 0-255 and 256-511, as signed
//! distance fields built by `scripts/glyphs.py` from Debian's
//! `fonts-noto-core` (SIL OFL 1.1, `assets/glyphs/LICENSE-OFL.txt`).

/// The fonts shipped, by the name styles give them (`text-font`).
pub const FONTS: &[&str] = &["noto_sans_regular", "noto_sans_bold"];

/// The first code point past the ranges shipped.
pub const SHIPPED_END: u32 = 512;

/// The stored PBF of a font's range, gzipped (served as is, with
/// `Content-Encoding: gzip`).
fn stored(font: &str, start: u32) -> Option<&'static [u8]> {
    macro_rules! g {
        ($font:literal, $range:literal) => {
            include_bytes!(concat!("../assets/glyphs/", $font, "/", $range, ".pbf.gz"))
        };
    }
    Some(match (font, start) {
        ("noto_sans_regular", 0) => g!("noto_sans_regular", "0-255"),
        ("noto_sans_regular", 256) => g!("noto_sans_regular", "256-511"),
        ("noto_sans_bold", 0) => g!("noto_sans_bold", "0-255"),
        ("noto_sans_bold", 256) => g!("noto_sans_bold", "256-511"),
        _ => return None,
    })
}

/// What `/glyphs/{fontstack}/{range}.pbf` answers.
#[derive(Debug, PartialEq)]
pub enum Glyphs {
    /// A stored range, gzipped.
    Gzipped(&'static [u8]),
    /// A range not shipped (past 511): a valid PBF with no glyphs, so the
    /// map draws the rest of a label rather than failing on one character.
    Empty(Vec<u8>),
    /// Not a fontstack or range this server has: what to ask for instead.
    NotFound(String),
}

/// The glyphs of `fontstack` (comma-separated font names, the first one
/// shipped wins, as MapLibre's fallback would) for `file` (`START-END.pbf`,
/// a 256-aligned range).
pub fn glyphs(fontstack: &str, file: &str) -> Glyphs {
    let Some((start, end)) = file
        .strip_suffix(".pbf")
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
    else {
        return Glyphs::NotFound(format!("{file}: ask for START-END.pbf, e.g. 0-255.pbf"));
    };
    if start % 256 != 0 || end != start + 255 || end > 0xFFFF {
        return Glyphs::NotFound(format!(
            "{file}: a range is 256 code points from a multiple of 256 (0-255, 256-511, ...) up to 65535"
        ));
    }
    let Some(font) = fontstack
        .split(',')
        .map(str::trim)
        .find(|f| FONTS.contains(f))
    else {
        return Glyphs::NotFound(format!(
            "no font in `{fontstack}`: this server has {}",
            FONTS.join(", ")
        ));
    };
    match stored(font, start) {
        Some(b) => Glyphs::Gzipped(b),
        None => Glyphs::Empty(empty(font, start, end)),
    }
}

/// A `glyphs` message with one fontstack and no glyphs.
fn empty(font: &str, start: u32, end: u32) -> Vec<u8> {
    fn string(out: &mut Vec<u8>, field: u8, s: &str) {
        out.push(field << 3 | 2);
        out.push(s.len() as u8); // names and ranges here are < 128 bytes
        out.extend_from_slice(s.as_bytes());
    }
    let mut stack = Vec::new();
    string(&mut stack, 1, font);
    string(&mut stack, 2, &format!("{start}-{end}"));
    let mut out = vec![1 << 3 | 2, stack.len() as u8];
    out.extend(stack);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fontstacks_and_ranges() {
        let check = |stack: &str, file: &str| match glyphs(stack, file) {
            Glyphs::Gzipped(b) => format!("gzip {}", b.len() > 1000 && b[..2] == [0x1f, 0x8b]),
            Glyphs::Empty(b) => format!("empty {}", b.len()),
            Glyphs::NotFound(_) => "404".to_string(),
        };
        let cases = [
            ("noto_sans_regular", "0-255.pbf", "gzip true"),
            ("noto_sans_bold", "256-511.pbf", "gzip true"),
            // The first font shipped in a list wins.
            ("Open Sans Regular,noto_sans_bold", "0-255.pbf", "gzip true"),
            // Past the ranges shipped: an empty, valid answer.
            ("noto_sans_regular", "8192-8447.pbf", "empty 32"),
            ("noto_sans_regular", "0-511.pbf", "404"),
            ("noto_sans_regular", "3-258.pbf", "404"),
            ("noto_sans_regular", "65536-65791.pbf", "404"),
            ("noto_sans_regular", "0-255.json", "404"),
            ("Arial", "0-255.pbf", "404"),
        ];
        for (stack, file, want) in cases {
            assert_eq!(check(stack, file), want, "{stack} {file}");
        }
    }
}
