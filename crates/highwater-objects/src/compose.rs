//! An object composed from new bytes and byte ranges of objects already in
//! the bucket (issue 50): S3's multipart upload with `UploadPartCopy`
//! parts, so that what is already stored is copied inside the service and
//! only what is new crosses the network.
//!
//! object_store has the multipart upload (`MultipartStore`) but no ranged
//! part copy; the copy request is signed here with object_store's own SigV4
//! signer ([`AwsAuthorizer`]) and sent with the reqwest already in the
//! tree, so no second S3 client or signer is built.
//!
//! S3's rules, which [`plan`] keeps: every part but the last holds at
//! least the minimum part size (5 MiB on AWS and MinIO), a part at most
//! 5 GiB, at most 10,000 parts. New bytes shorter than the minimum are
//! topped up with the head of the copied range after them (those bytes are
//! downloaded and sent again), and a copied range shorter than the minimum
//! in the middle is downloaded and sent: the bytes sent are the new bytes
//! plus at most one minimum part per junction.

use bytes::Bytes;
use object_store::aws::{AwsAuthorizer, AwsCredential};

/// S3's smallest part but the last, on AWS and MinIO.
pub const PART_MIN_BYTES_S3: u64 = 5 << 20;
/// S3's largest part.
pub const PART_BYTES_MAX: u64 = 5 << 30;
/// S3's most parts in one upload.
pub const PARTS_MAX: usize = 10_000;

/// One piece of the object to compose, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Bytes sent from here.
    Bytes(Bytes),
    /// `len` bytes of the object `from` (in the same bucket), from `offset`.
    Copy { from: String, offset: u64, len: u64 },
}

/// Where one part's bytes come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Chunk {
    Bytes(Bytes),
    /// Read back from the bucket and sent again (too short to copy).
    Download {
        from: String,
        offset: u64,
        len: u64,
    },
}

/// One part of the upload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    Upload(Vec<Chunk>),
    Copy { from: String, offset: u64, len: u64 },
}

impl Part {
    pub fn len(&self) -> u64 {
        match self {
            Part::Upload(c) => c
                .iter()
                .map(|c| match c {
                    Chunk::Bytes(b) => b.len() as u64,
                    Chunk::Download { len, .. } => *len,
                })
                .sum(),
            Part::Copy { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The parts of an upload of `pieces`, every one but the last at least
/// `min` bytes and at most [`PART_BYTES_MAX`]; their bytes in order are the
/// pieces' bytes in order.
pub fn plan(pieces: &[Piece], min: u64) -> Vec<Part> {
    let min = min.max(1);
    let mut parts: Vec<Part> = Vec::new();
    let mut pending: Vec<Chunk> = Vec::new();
    let pending_len = |p: &Vec<Chunk>| Part::Upload(p.clone()).len();
    let n = pieces.len();
    for (i, piece) in pieces.iter().enumerate() {
        match piece {
            Piece::Bytes(b) if b.is_empty() => {}
            Piece::Bytes(b) => {
                pending.push(Chunk::Bytes(b.clone()));
                // New bytes beyond a part's maximum go out in parts of their
                // own (a diff is far smaller; a whole archive is put whole).
                while pending_len(&pending) >= PART_BYTES_MAX {
                    parts.push(Part::Upload(std::mem::take(&mut pending)));
                }
            }
            Piece::Copy { from, offset, len } => {
                let (mut offset, mut len) = (*offset, *len);
                let have = pending_len(&pending);
                if have > 0 && have < min {
                    // Top the pending bytes up to a whole part with the
                    // head of this range.
                    let take = (min - have).min(len);
                    pending.push(Chunk::Download {
                        from: from.clone(),
                        offset,
                        len: take,
                    });
                    offset += take;
                    len -= take;
                }
                if len == 0 {
                    continue;
                }
                let last = pieces[i + 1..].iter().all(|p| match p {
                    Piece::Bytes(b) => b.is_empty(),
                    Piece::Copy { len, .. } => *len == 0,
                });
                let pending_ok = pending.is_empty() || pending_len(&pending) >= min;
                if (len >= min || last) && pending_ok {
                    if !pending.is_empty() {
                        parts.push(Part::Upload(std::mem::take(&mut pending)));
                    }
                    // Equal pieces of at most PART_BYTES_MAX: each at least
                    // the minimum when the range is.
                    let k = len.div_ceil(PART_BYTES_MAX);
                    let step = len.div_ceil(k);
                    let mut at = 0;
                    while at < len {
                        let l = step.min(len - at);
                        parts.push(Part::Copy {
                            from: from.clone(),
                            offset: offset + at,
                            len: l,
                        });
                        at += l;
                    }
                } else {
                    pending.push(Chunk::Download {
                        from: from.clone(),
                        offset,
                        len,
                    });
                }
            }
        }
        let _ = n;
    }
    if !pending.is_empty() {
        parts.push(Part::Upload(pending));
    }
    parts
}

/// What a compose sent and copied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Composed {
    pub etag: String,
    /// Bytes sent in part bodies (new bytes and downloaded ones).
    pub uploaded_bytes: u64,
    /// Bytes copied inside the service.
    pub copied_bytes: u64,
    /// Bytes read back to fill parts up to the minimum.
    pub downloaded_bytes: u64,
    pub parts: usize,
}

/// Where and how to sign a part copy.
#[derive(Clone, Debug)]
pub(crate) struct Signing {
    /// The service's URL (path-style requests), or `None` for AWS's own
    /// (virtual-hosted style).
    pub endpoint: Option<String>,
    pub bucket: String,
    pub region: String,
}

/// Percent-encodes a key for a URL path or `x-amz-copy-source` (`/` kept).
pub(crate) fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

impl Signing {
    fn object_url(&self, key: &str) -> String {
        match &self.endpoint {
            Some(e) => format!(
                "{}/{}/{}",
                e.trim_end_matches('/'),
                self.bucket,
                encode_key(key)
            ),
            None => format!(
                "https://{}.s3.{}.amazonaws.com/{}",
                self.bucket,
                self.region,
                encode_key(key)
            ),
        }
    }

    /// `UploadPartCopy`: part `number` (1-based) of upload `id` of `key`
    /// is `len` bytes of `from` at `offset`. Returns the part's ETag.
    pub(crate) async fn copy_part(
        &self,
        client: &reqwest::Client,
        cred: &AwsCredential,
        key: &str,
        id: &str,
        number: usize,
        (from, offset, len): (&str, u64, u64),
    ) -> Result<String, String> {
        let url = format!(
            "{}?partNumber={number}&uploadId={}",
            self.object_url(key),
            encode_key(id).replace('/', "%2F")
        );
        let mut req = http::Request::builder()
            .method("PUT")
            .uri(&url)
            .header(
                "x-amz-copy-source",
                format!("/{}/{}", self.bucket, encode_key(from)),
            )
            .header(
                "x-amz-copy-source-range",
                format!("bytes={}-{}", offset, offset + len - 1),
            )
            .body(object_store::client::HttpRequestBody::empty())
            .map_err(|e| format!("building the part copy request: {e}"))?;
        AwsAuthorizer::new(cred, "s3", &self.region)
            .try_authorize(&mut req, None)
            .map_err(|e| format!("signing the part copy request: {e}"))?;
        let mut r = client.put(&url);
        for (k, v) in req.headers() {
            r = r.header(k, v);
        }
        let resp = r
            .send()
            .await
            .map_err(|e| format!("UploadPartCopy part {number} of {key}: {e}"))?;
        let status = resp.status();
        let body = resp.text().await.map_err(|e| {
            format!("UploadPartCopy part {number} of {key}: reading the answer: {e}")
        })?;
        // S3 may answer 200 with an <Error> body when a copy fails midway.
        if !status.is_success() || body.contains("<Error>") {
            return Err(format!(
                "UploadPartCopy part {number} of {key} from {from} bytes {offset}+{len}: {status}: {}",
                body.chars().take(500).collect::<String>()
            ));
        }
        let etag = body
            .split_once("<ETag>")
            .and_then(|(_, rest)| rest.split_once("</ETag>"))
            .map(|(e, _)| e.replace("&quot;", "\"").replace("&#34;", "\""))
            .ok_or_else(|| {
                format!("UploadPartCopy part {number} of {key}: no ETag in the answer: {body}")
            })?;
        Ok(etag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize) -> Piece {
        Piece::Bytes(Bytes::from(vec![7u8; n]))
    }

    fn copy(offset: u64, len: u64) -> Piece {
        Piece::Copy {
            from: "old".into(),
            offset,
            len,
        }
    }

    fn total(pieces: &[Piece]) -> u64 {
        pieces
            .iter()
            .map(|p| match p {
                Piece::Bytes(b) => b.len() as u64,
                Piece::Copy { len, .. } => *len,
            })
            .sum()
    }

    /// The parts keep S3's rules and the pieces' bytes, for small and
    /// large heads, copies and tails around the minimum.
    #[test]
    fn parts_keep_the_minimum_and_the_bytes() {
        let min = 100;
        let sizes = [0u64, 1, 50, 99, 100, 101, 250];
        for &h in &sizes {
            for &c in &sizes {
                for &t in &sizes {
                    for &c2 in &[0u64, 30, 300] {
                        let pieces = vec![
                            bytes(h as usize),
                            copy(0, c),
                            bytes(t as usize),
                            copy(500, c2),
                        ];
                        let parts = plan(&pieces, min);
                        let n = parts.len();
                        for (i, p) in parts.iter().enumerate() {
                            assert!(!p.is_empty(), "{pieces:?}: empty part {i}: {parts:?}");
                            if i + 1 < n {
                                assert!(p.len() >= min, "{pieces:?}: part {i} short: {parts:?}");
                            }
                        }
                        let sum: u64 = parts.iter().map(Part::len).sum();
                        assert_eq!(sum, total(&pieces), "{pieces:?}: {parts:?}");
                        // Ranges stay in order: the copied and downloaded
                        // offsets of `old` rise.
                        let mut at = 0;
                        for p in &parts {
                            let ranges: Vec<(u64, u64)> = match p {
                                Part::Copy { offset, len, .. } => vec![(*offset, *len)],
                                Part::Upload(cs) => cs
                                    .iter()
                                    .filter_map(|c| match c {
                                        Chunk::Download { offset, len, .. } => {
                                            Some((*offset, *len))
                                        }
                                        Chunk::Bytes(_) => None,
                                    })
                                    .collect(),
                            };
                            for (o, l) in ranges {
                                assert!(o >= at, "{pieces:?}: {parts:?}");
                                at = o + l;
                            }
                        }
                    }
                }
            }
        }
    }

    /// A large copied range is copied, not sent: what is sent is the new
    /// bytes topped up to one part.
    #[test]
    fn a_small_head_before_a_large_copy_sends_one_part() {
        let parts = plan(&[bytes(10), copy(0, 1000), bytes(5)], 100);
        assert_eq!(parts.len(), 3, "{parts:?}");
        assert_eq!(parts[0].len(), 100);
        assert!(matches!(
            parts[1],
            Part::Copy {
                offset: 90,
                len: 910,
                ..
            }
        ));
        assert_eq!(parts[2].len(), 5);
    }

    #[test]
    fn keys_are_encoded_for_urls() {
        assert_eq!(encode_key("a b/c+d.pmtiles"), "a%20b/c%2Bd.pmtiles");
    }
}
