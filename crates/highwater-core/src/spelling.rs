//! The recorded spelling of a file name or path: text that stands for any
//! bytes a Unix name may hold, and back (issue 47).
//!
//! Names are bytes on Linux. A lossy conversion made `lib\xff.txt` and
//! `lib\xfe.txt` one recorded name, `lib\u{fffd}.txt`, which names no file:
//! reading the first re-ran its item at every plan (its recorded file was
//! never found), and creating an absent `opt\xfe.conf` re-ran nothing. A
//! name with a newline printed raw in the text plan.
//!
//! The spelling: valid UTF-8 stays as it is, except a backslash (`\\`) and
//! the ASCII control characters, and every byte that is not UTF-8, which are
//! written `\xHH`. So every name an ordinary project holds is spelled as
//! itself, every spelling is printable on one line, and [`unspell`] gives
//! the bytes back exactly.

/// The spelling of `bytes`.
pub fn spell(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                c if c.is_ascii_control() => {
                    out.push_str(&format!("\\x{:02x}", c as u32));
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Whether `s` is spelled as itself (no escape in it): the common case,
/// which [`unspell`] need not scan.
pub fn is_plain(s: &str) -> bool {
    !s.contains('\\')
}

/// The bytes a spelling stands for. A backslash not followed by `\` or
/// `xHH` stands for itself (text no [`spell`] made, taken leniently).
pub fn unspell(s: &str) -> Vec<u8> {
    if is_plain(s) {
        return s.as_bytes().to_vec();
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' {
            if b.get(i + 1) == Some(&b'\\') {
                out.push(b'\\');
                i += 2;
                continue;
            }
            if b.get(i + 1) == Some(&b'x') {
                if let Some(v) = s
                    .get(i + 2..i + 4)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ordinary_names_are_spelled_as_themselves() {
        for n in ["lib.txt", "data/ä ö.csv", "日本/地図.gpkg", ".x.swp", "a b"] {
            assert_eq!(spell(n.as_bytes()), n);
            assert!(is_plain(&spell(n.as_bytes())));
        }
    }

    #[test]
    fn other_bytes_are_escaped_on_one_line() {
        assert_eq!(spell(b"lib\xff.txt"), "lib\\xff.txt");
        assert_eq!(spell(b"opt\xfe.conf"), "opt\\xfe.conf");
        assert_eq!(spell(b"two\nlines"), "two\\x0alines");
        assert_eq!(spell(b"back\\slash"), "back\\\\slash");
        assert_ne!(spell(b"lib\xff.txt"), spell(b"lib\xfe.txt"));
    }

    proptest! {
        #[test]
        fn every_name_comes_back_exactly(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let s = spell(&bytes);
            prop_assert!(!s.contains('\n'));
            prop_assert_eq!(unspell(&s), bytes);
        }
    }
}
