//! zip (and what is built on it: xlsx, docx, odt, jar): each member's name
//! and decompressed bytes, in name order; not timestamps, extra fields,
//! compression methods or the order of members in the archive. A member's
//! own content is compared as bytes: an office document that writes its save
//! time into `docProps/core.xml` changes there.

use super::{CompareError, DataDigest, Order};
use std::path::Path;

pub struct Zip;

impl DataDigest for Zip {
    fn name(&self) -> &'static str {
        "zip"
    }

    fn sniff(&self, head: &[u8]) -> bool {
        // A local file header, or the end record of an empty archive.
        head.starts_with(b"PK\x03\x04") || head.starts_with(b"PK\x05\x06")
    }

    fn digest(
        &self,
        path: &Path,
        _order: Order,
        h: &mut blake3::Hasher,
    ) -> Result<(), CompareError> {
        let f = std::io::BufReader::new(std::fs::File::open(path)?);
        let mut z = ::zip::ZipArchive::new(f)?;
        let mut members: Vec<(String, bool, blake3::Hash)> = Vec::with_capacity(z.len());
        for i in 0..z.len() {
            let mut m = z.by_index(i)?;
            let name = m.name()?.into_owned();
            let dir = m.is_dir();
            let mut mh = blake3::Hasher::new();
            std::io::copy(&mut m, &mut mh)?;
            members.push((name, dir, mh.finalize()));
        }
        members.sort_by(|a, b| a.0.cmp(&b.0).then(a.2.as_bytes().cmp(b.2.as_bytes())));
        h.update(&(members.len() as u64).to_le_bytes());
        for (name, dir, mh) in members {
            h.update(&(name.len() as u64).to_le_bytes());
            h.update(name.as_bytes());
            h.update(&[dir as u8]);
            h.update(mh.as_bytes());
        }
        Ok(())
    }
}
