//! PostgreSQL's binary COPY stream (`COPY (SELECT …) TO STDOUT (FORMAT
//! binary)`), decoded straight into the sink's Arrow builders.
//!
//! Why binary COPY and not a query: the server formats nothing (integers,
//! floats and timestamps travel as their own bytes), the stream has no
//! per-row protocol message, and the decoder below reads fields out of one
//! reused buffer: no allocation per row or per value.
//!
//! The format (PostgreSQL docs, "COPY … Binary Format"): an 11-byte
//! signature, a flags word, a header extension; then per tuple a 16-bit
//! field count (-1 ends the stream) and per field a 32-bit length (-1 is
//! NULL) followed by the value in the type's binary send format.
//!
//! The decoder is fed the stream as it arrives ([`CopyDecoder::feed`]).

use crate::sink::{ColType, Column, ParquetSink, Value};

const SIGNATURE: &[u8; 11] = b"PGCOPY\n\xff\r\n\0";

/// Microseconds between 1970-01-01 and PostgreSQL's epoch, 2000-01-01.
pub const PG_EPOCH_US: i64 = 946_684_800_000_000;

/// Days between 1970-01-01 and 2000-01-01.
pub const PG_EPOCH_DAYS: i32 = 10_957;

/// Decodes the stream as it arrives, in chunks of any size (the server
/// sends one CopyData message per row; a row may still span chunks).
/// Rows are decoded straight from the chunk when whole; only a row cut by
/// a chunk boundary is copied, into `pending`.
#[derive(Default)]
pub struct CopyDecoder {
    pending: Vec<u8>,
    header_done: bool,
    ended: bool,
    /// Bytes consumed so far, for error messages.
    offset: u64,
}

fn be_i16(b: &[u8]) -> i16 {
    i16::from_be_bytes([b[0], b[1]])
}

fn be_i32(b: &[u8]) -> i32 {
    i32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

impl CopyDecoder {
    pub fn new() -> CopyDecoder {
        CopyDecoder::default()
    }

    /// Decodes what `chunk` completes into `sink`.
    pub fn feed(
        &mut self,
        chunk: &[u8],
        cols: &[Column],
        sink: &mut ParquetSink,
    ) -> Result<(), String> {
        if self.pending.is_empty() {
            let used = self.parse(chunk, cols, sink)?;
            self.pending.extend_from_slice(&chunk[used..]);
        } else {
            let mut buf = std::mem::take(&mut self.pending);
            buf.extend_from_slice(chunk);
            let used = self.parse(&buf, cols, sink)?;
            buf.drain(..used);
            self.pending = buf;
        }
        Ok(())
    }

    /// Checks that the stream ended where it should: after the trailer.
    pub fn finish(&self) -> Result<(), String> {
        if !self.ended || !self.pending.is_empty() {
            return Err(format!(
                "the COPY stream ended inside a row, at byte {}",
                self.offset + self.pending.len() as u64
            ));
        }
        Ok(())
    }

    /// Decodes every whole unit (header, row, trailer) at the start of
    /// `buf`; returns the bytes used.
    fn parse(
        &mut self,
        buf: &[u8],
        cols: &[Column],
        sink: &mut ParquetSink,
    ) -> Result<usize, String> {
        let mut at = 0;
        if !self.header_done {
            if buf.len() < 19 {
                return Ok(0);
            }
            if &buf[..11] != SIGNATURE {
                return Err("the COPY stream does not start with the binary signature".into());
            }
            let ext = be_i32(&buf[15..19]);
            if ext < 0 {
                return Err("the COPY header extension has a negative length".into());
            }
            if buf.len() < 19 + ext as usize {
                return Ok(0);
            }
            at = 19 + ext as usize;
            self.header_done = true;
        }
        while at < buf.len() {
            if self.ended {
                return Err("the COPY stream has data after its trailer".into());
            }
            let Some(len) = row_len(&buf[at..], cols.len())? else {
                break;
            };
            if len == 2 {
                // The trailer: a field count of -1.
                self.ended = true;
            } else {
                decode_row(&buf[at..at + len], cols, sink)?;
            }
            at += len;
        }
        self.offset += at as u64;
        Ok(at)
    }
}

/// The length of the row (or trailer) at the start of `b`, if it is whole.
fn row_len(b: &[u8], ncols: usize) -> Result<Option<usize>, String> {
    if b.len() < 2 {
        return Ok(None);
    }
    let n = be_i16(b);
    if n == -1 {
        return Ok(Some(2));
    }
    if n as usize != ncols {
        return Err(format!(
            "a COPY row has {n} fields where {ncols} columns were asked for"
        ));
    }
    let mut at = 2;
    for _ in 0..ncols {
        if b.len() < at + 4 {
            return Ok(None);
        }
        let len = be_i32(&b[at..]);
        at += 4;
        if len > 0 {
            at += len as usize;
        } else if len < -1 {
            return Err("a negative field length in the COPY stream".into());
        }
    }
    Ok((b.len() >= at).then_some(at))
}

/// Decodes one whole row (checked by `row_len`) into `sink`.
fn decode_row(row: &[u8], cols: &[Column], sink: &mut ParquetSink) -> Result<(), String> {
    let mut at = 2;
    for (i, c) in cols.iter().enumerate() {
        let len = be_i32(&row[at..]);
        at += 4;
        if len == -1 {
            sink.push_value(i, Value::Null)?;
            continue;
        }
        let len = len as usize;
        let raw = &row[at..at + len];
        at += len;
        let fixed = |want: usize| -> Result<(), String> {
            if len == want {
                Ok(())
            } else {
                Err(format!(
                    "column `{}`: a {len}-byte value where {want} bytes were expected",
                    c.name
                ))
            }
        };
        let v = match c.ty {
            ColType::Bool => {
                fixed(1)?;
                Value::Bool(raw[0] != 0)
            }
            ColType::I16 => {
                fixed(2)?;
                Value::Int(be_i16(raw) as i64)
            }
            ColType::I32 => {
                fixed(4)?;
                Value::Int(be_i32(raw) as i64)
            }
            ColType::I64 => {
                fixed(8)?;
                Value::Int(i64::from_be_bytes(raw.try_into().expect("8 bytes")))
            }
            ColType::F32 => {
                fixed(4)?;
                Value::Float(f32::from_be_bytes(raw.try_into().expect("4 bytes")) as f64)
            }
            ColType::F64 => {
                fixed(8)?;
                Value::Float(f64::from_be_bytes(raw.try_into().expect("8 bytes")))
            }
            // A decimal is read as the server's exact text (`::text`),
            // scaled by the sink.
            ColType::Text | ColType::Decimal(..) => Value::Text(
                std::str::from_utf8(raw)
                    .map_err(|e| format!("column `{}`: a value that is not UTF-8 ({e})", c.name))?,
            ),
            ColType::Bytes => Value::Bytes(raw),
            ColType::Timestamp | ColType::TimestampTz => {
                fixed(8)?;
                let v = i64::from_be_bytes(raw.try_into().expect("8 bytes"));
                if v == i64::MAX || v == i64::MIN {
                    return Err(format!(
                        "column `{}`: an infinite timestamp cannot be placed in a window",
                        c.name
                    ));
                }
                Value::Micros(v + PG_EPOCH_US)
            }
            ColType::Date => {
                fixed(4)?;
                let v = be_i32(raw);
                if v == i32::MAX || v == i32::MIN {
                    return Err(format!(
                        "column `{}`: an infinite date cannot be stored",
                        c.name
                    ));
                }
                Value::Days(v + PG_EPOCH_DAYS)
            }
        };
        sink.push_value(i, v)?;
    }
    sink.end_row()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(rows: &[Vec<Option<Vec<u8>>>]) -> Vec<u8> {
        let mut s = SIGNATURE.to_vec();
        s.extend(0i32.to_be_bytes());
        s.extend(0i32.to_be_bytes());
        for r in rows {
            s.extend((r.len() as i16).to_be_bytes());
            for f in r {
                match f {
                    None => s.extend((-1i32).to_be_bytes()),
                    Some(b) => {
                        s.extend((b.len() as i32).to_be_bytes());
                        s.extend(b);
                    }
                }
            }
        }
        s.extend((-1i16).to_be_bytes());
        s
    }

    fn cols() -> Vec<Column> {
        vec![
            Column {
                name: "id".into(),
                ty: ColType::I64,
                source_type: "int8".into(),
            },
            Column {
                name: "note".into(),
                ty: ColType::Text,
                source_type: "text".into(),
            },
        ]
    }

    fn decode(bytes: &[u8]) -> Result<u64, String> {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = ParquetSink::new(dir.path(), &cols(), 2, 100, "", &[]);
        // Fed one byte at a time: every field straddles a chunk boundary.
        let mut d = CopyDecoder::new();
        for b in bytes {
            d.feed(std::slice::from_ref(b), &cols(), &mut sink)?;
        }
        d.finish()?;
        let done = sink.finish().map_err(|e| e.to_string())?;
        Ok(done.rows)
    }

    #[test]
    fn decodes_rows_across_read_boundaries() {
        let rows: Vec<Vec<Option<Vec<u8>>>> = (0..5i64)
            .map(|i| {
                vec![
                    Some(i.to_be_bytes().to_vec()),
                    (i % 2 == 0).then(|| format!("n{i}").into_bytes()),
                ]
            })
            .collect();
        assert_eq!(decode(&stream(&rows)), Ok(5));
    }

    #[test]
    fn refuses_a_truncated_stream_and_a_wrong_width() {
        let rows = vec![vec![Some(7i64.to_be_bytes().to_vec()), None]];
        let s = stream(&rows);
        let e = decode(&s[..s.len() - 4]).unwrap_err();
        assert!(e.contains("ended inside a row"), "{e}");
        let bad = vec![vec![Some(vec![1, 2, 3]), None]];
        let e = decode(&stream(&bad)).unwrap_err();
        assert!(e.contains("3-byte value where 8"), "{e}");
        let e = decode(b"PGCOPY\n\xff\r\nX0000000000").unwrap_err();
        assert!(e.contains("signature"), "{e}");
    }
}
