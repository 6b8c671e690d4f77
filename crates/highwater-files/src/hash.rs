//! Digests of files: BLAKE3 of every byte, or a fingerprint of the edges.

use highwater_core::evidence::{Algo, Digest};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

/// Files at least this large are hashed with memory mapping on all cores;
/// smaller ones are read on the calling thread (many small files are already
/// spread over threads by the caller).
pub const PARALLEL_HASH_MIN_BYTES: u64 = 4 << 20;

/// The fingerprint reads this much from each end of a file.
pub const FINGERPRINT_EDGE_BYTES: u64 = 1 << 20;

/// Computes a digest of `path` in the given format.
pub fn digest_file(path: &Path, algo: Algo) -> io::Result<Digest> {
    match algo {
        Algo::Blake3 => blake3_file(path),
        Algo::Fingerprint1 => fingerprint_file(path),
        Algo::Set1 => Err(io::Error::other("a set digest is not a file digest")),
        Algo::Data1 => Err(io::Error::other(
            "a data digest is computed by compare::data1_file",
        )),
    }
}

/// BLAKE3 of every byte, streaming; large files use mmap and rayon.
pub fn blake3_file(path: &Path) -> io::Result<Digest> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    let mut h = blake3::Hasher::new();
    if len >= PARALLEL_HASH_MIN_BYTES {
        h.update_mmap_rayon(path)?;
    } else {
        let mut buf = [0u8; 64 * 1024];
        loop {
            let n = match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            h.update(&buf[..n]);
        }
    }
    Ok(Digest::new(Algo::Blake3, &h.finalize()))
}

/// Size, first MiB and last MiB. It misses an edit in the middle of a file
/// larger than two MiB; smaller files are hashed whole.
pub fn fingerprint_file(path: &Path) -> io::Result<Digest> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    let mut h = blake3::Hasher::new();
    h.update(&len.to_le_bytes());
    if len <= 2 * FINGERPRINT_EDGE_BYTES {
        io::copy(&mut f, &mut h)?;
    } else {
        let mut buf = vec![0u8; FINGERPRINT_EDGE_BYTES as usize];
        f.read_exact(&mut buf)?;
        h.update(&buf);
        f.seek(SeekFrom::End(-(FINGERPRINT_EDGE_BYTES as i64)))?;
        f.read_exact(&mut buf)?;
        h.update(&buf);
    }
    Ok(Digest::new(Algo::Fingerprint1, &h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blake3_matches_the_reference_for_small_and_large() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0usize, 5, 70_000, (PARALLEL_HASH_MIN_BYTES + 3) as usize] {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let p = dir.path().join(format!("f{len}"));
            std::fs::write(&p, &data).unwrap();
            let want = Digest::new(Algo::Blake3, &blake3::hash(&data));
            assert_eq!(blake3_file(&p).unwrap(), want, "len {len}");
        }
    }

    #[test]
    fn fingerprint_misses_the_middle_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big");
        let mut data = vec![7u8; 3 << 20];
        std::fs::write(&p, &data).unwrap();
        let a = fingerprint_file(&p).unwrap();
        data[(3 << 20) / 2] = 8;
        std::fs::write(&p, &data).unwrap();
        assert_eq!(fingerprint_file(&p).unwrap(), a, "documented blind spot");
        data[0] = 9;
        std::fs::write(&p, &data).unwrap();
        assert_ne!(fingerprint_file(&p).unwrap(), a);
    }
}
