//! Evidence: what proves that an item changed.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The stat fields that the stat cache compares. They are git's index fields:
/// if all of them match the recorded ones, and the record is not racy, the
/// recorded digest is reused without reading the file again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    pub size: u64,
    pub mtime_ns: i64,
    /// ctime is in the comparison because `touch -d` and `cp -p` can restore
    /// an mtime, but nothing outside the kernel can set a ctime.
    pub ctime_ns: i64,
    pub ino: u64,
    pub dev: u64,
}

/// How a stage decides that an input changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Signal {
    /// A BLAKE3 hash of every byte: the authority, and the default.
    #[default]
    Hash,
    /// Size and mtime against the recorded ones, with a margin for coarse
    /// timestamps. Errs towards extra work: a `touch` re-runs the item.
    Mtime,
    /// Only whether the item was processed before. Valid only for immutable
    /// inputs (dated deliveries, content-addressed names): an edit in place
    /// is never seen.
    Exists,
    /// Size plus a hash of the first and last MiB. Honestly named: an edit
    /// in the middle of a large file is missed.
    Fingerprint,
}

impl Signal {
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Hash => "hash",
            Signal::Mtime => "mtime",
            Signal::Exists => "exists",
            Signal::Fingerprint => "fingerprint",
        }
    }

    /// The digest algorithm a new manifest entry gets under this signal,
    /// or `None` when the signal reads no bytes.
    pub fn algo(self) -> Option<Algo> {
        match self {
            Signal::Hash => Some(Algo::Blake3),
            Signal::Fingerprint => Some(Algo::Fingerprint1),
            Signal::Mtime | Signal::Exists => None,
        }
    }
}

/// A digest format. Each recorded digest names its format, so that a later
/// highwater with a new default can still compute the old one and compare:
/// a new hash format never shows up as "everything changed".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algo {
    /// BLAKE3 of the whole content, 256 bits.
    Blake3,
    /// BLAKE3 of the size, the first MiB and the last MiB.
    Fingerprint1,
    /// BLAKE3 over a sorted set of (path, member evidence): the evidence of
    /// an aggregate item.
    Set1,
    /// A container compared as data (issue 49): the first 128 bits are
    /// BLAKE3 of every byte (the quick first check, comparable with a
    /// [`Algo::Blake3`] digest's first half), the last 128 bits a digest of
    /// what a reader sees (schema and rows, decompressed members). Bytes
    /// that differ with equal data are a layout change, not a change.
    Data1,
}

impl Algo {
    pub fn prefix(self) -> &'static str {
        match self {
            Algo::Blake3 => "b3",
            Algo::Fingerprint1 => "fp1",
            Algo::Set1 => "set1",
            Algo::Data1 => "data1",
        }
    }

    pub fn from_prefix(prefix: &str) -> Option<Algo> {
        match prefix {
            "b3" => Some(Algo::Blake3),
            "fp1" => Some(Algo::Fingerprint1),
            "set1" => Some(Algo::Set1),
            "data1" => Some(Algo::Data1),
            _ => None,
        }
    }
}

/// A recorded digest: its format and 256 bits. Stored and shown as
/// `algo:hex`. Fixed-size and `Copy`, so that comparing and carrying the
/// digests of a hundred thousand unchanged files allocates nothing.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest {
    algo: Algo,
    bytes: [u8; 32],
}

impl Digest {
    pub fn new(algo: Algo, hash: &blake3::Hash) -> Digest {
        Digest {
            algo,
            bytes: *hash.as_bytes(),
        }
    }

    /// Parses a stored digest; `None` for a format this version does not
    /// know or text that is not 64 hex digits (the item is then treated as
    /// changed, which is the safe side).
    pub fn parse(s: &str) -> Option<Digest> {
        let (prefix, hex) = s.split_once(':')?;
        let algo = Algo::from_prefix(prefix)?;
        let hex = hex.as_bytes();
        if hex.len() != 64 {
            return None;
        }
        // A table and one check at the end, not a branch per digit: a
        // no-change plan parses one digest per item (issue 24; the branchy
        // form was 5% of a 100,000-item plan).
        let mut bytes = [0u8; 32];
        let mut bad = 0u8;
        for (b, pair) in bytes.iter_mut().zip(hex.chunks_exact(2)) {
            let (hi, lo) = (HEX_VALUE[pair[0] as usize], HEX_VALUE[pair[1] as usize]);
            bad |= hi | lo;
            *b = (hi << 4) | (lo & 0x0f);
        }
        (bad & HEX_BAD == 0).then_some(Digest { algo, bytes })
    }

    pub fn algo(&self) -> Algo {
        self.algo
    }

    /// The 256 bits, for a binary copy of the manifest (the SQLite store's
    /// manifest snapshot), which keeps them without hex.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.bytes
    }

    /// The inverse of [`Digest::algo`] and [`Digest::as_bytes`].
    pub fn from_bytes(algo: Algo, bytes: [u8; 32]) -> Digest {
        Digest { algo, bytes }
    }

    /// A [`Algo::Data1`] digest from the hash of the bytes and the hash of
    /// the data, 128 bits of each.
    pub fn data1(bytes: &blake3::Hash, data: &blake3::Hash) -> Digest {
        let mut b = [0u8; 32];
        b[..16].copy_from_slice(&bytes.as_bytes()[..16]);
        b[16..].copy_from_slice(&data.as_bytes()[..16]);
        Digest {
            algo: Algo::Data1,
            bytes: b,
        }
    }

    /// The part that hashes the file's bytes (128 bits), for a digest that
    /// has one: the first half of a BLAKE3 or a data digest.
    pub fn byte_half(&self) -> Option<&[u8]> {
        matches!(self.algo, Algo::Blake3 | Algo::Data1).then(|| &self.bytes[..16])
    }

    /// The data half of a [`Algo::Data1`] digest.
    pub fn data_half(&self) -> Option<&[u8]> {
        (self.algo == Algo::Data1).then(|| &self.bytes[16..])
    }
}

/// How a recorded digest compares with the ones observed now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sameness {
    Same,
    /// The bytes differ, the data does not (both were compared as data).
    Layout,
    Changed,
    /// No observed digest can be compared with the recorded one.
    Unknown,
}

/// Compares a recorded digest with the observed ones: the same format
/// directly; a BLAKE3 and a data digest through their byte halves (a stage
/// that switched `compare` mode neither re-runs everything nor claims a
/// layout change it cannot prove); two data digests by bytes, then data.
pub fn compare_digests(recorded: &Digest, observed: &[Digest]) -> Sameness {
    if let Some(now) = observed.iter().find(|d| d.algo == recorded.algo) {
        if now == recorded {
            return Sameness::Same;
        }
        return match (recorded.data_half(), now.data_half()) {
            (Some(a), Some(b)) if a == b => Sameness::Layout,
            _ => Sameness::Changed,
        };
    }
    let Some(rb) = recorded.byte_half() else {
        return Sameness::Unknown;
    };
    match observed.iter().find_map(Digest::byte_half) {
        Some(ob) if ob == rb => Sameness::Same,
        Some(_) => Sameness::Changed,
        None => Sameness::Unknown,
    }
}

/// Marks a byte that is not a lowercase hex digit in [`HEX_VALUE`].
const HEX_BAD: u8 = 0x80;

/// Each byte's value as a lowercase hex digit, or [`HEX_BAD`].
const HEX_VALUE: [u8; 256] = {
    let mut t = [HEX_BAD; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.algo.prefix())?;
        f.write_str(":")?;
        for b in self.bytes {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Digest, D::Error> {
        let s = String::deserialize(d)?;
        Digest::parse(&s).ok_or_else(|| serde::de::Error::custom("not a digest"))
    }
}

/// True when a record cannot be trusted to describe the file's content by its
/// stat alone: the file was modified within `granularity_ns` of the moment it
/// was observed, so a second write in the same timestamp tick would leave the
/// stat unchanged. This is git's racy-git rule. A racy record is re-read on
/// the next run, and the refreshed record is then no longer racy.
pub fn is_racy(recorded_mtime_ns: i64, observed_at_ns: i64, granularity_ns: i64) -> bool {
    recorded_mtime_ns.saturating_add(granularity_ns) >= observed_at_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_parses_back_from_its_text_and_anything_else_is_refused() {
        let d = Digest::new(Algo::Blake3, &blake3::hash(b"item"));
        let text = d.to_string();
        assert_eq!(Digest::parse(&text), Some(d));
        let hex = &text[3..];
        for bad in [
            format!("b3:{}", hex.to_uppercase()),
            format!("b3:{}g", &hex[..63]),
            format!("b3:{}", &hex[..62]),
            format!("b3:{hex}0"),
            format!("zz:{hex}"),
            hex.to_string(),
        ] {
            assert_eq!(Digest::parse(&bad), None, "{bad}");
        }
    }
}
