//! gzip: the decompressed bytes of all its members, not the header (mtime,
//! original name, OS, compression level).

use super::{CompareError, DataDigest, Order};
use std::path::Path;

pub struct Gzip;

impl DataDigest for Gzip {
    fn name(&self) -> &'static str {
        "gzip"
    }

    fn sniff(&self, head: &[u8]) -> bool {
        // Magic and the only method gzip defines, Deflate (RFC 1952).
        head.starts_with(&[0x1f, 0x8b, 0x08])
    }

    fn digest(
        &self,
        path: &Path,
        _order: Order,
        h: &mut blake3::Hasher,
    ) -> Result<(), CompareError> {
        let f = std::io::BufReader::with_capacity(256 << 10, std::fs::File::open(path)?);
        // Multi-member: `cat a.gz b.gz` is one valid gzip file.
        let mut d = flate2::read::MultiGzDecoder::new(f);
        std::io::copy(&mut d, h)?;
        Ok(())
    }
}
