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

use crate::sink::{ColType, Column, ParquetSink, Value};
use std::io::Read;

const SIGNATURE: &[u8; 11] = b"PGCOPY\n\xff\r\n\0";

/// Microseconds between 1970-01-01 and PostgreSQL's epoch, 2000-01-01.
pub const PG_EPOCH_US: i64 = 946_684_800_000_000;

/// Days between 1970-01-01 and 2000-01-01.
pub const PG_EPOCH_DAYS: i32 = 10_957;

/// The read buffer's starting size; it grows only for a field larger than
/// it (a big text or bytea value), so memory is bounded by the largest value.
const BUFFER_BYTES: usize = 1 << 20;

pub struct CopyDecoder<R: Read> {
    r: R,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// Bytes consumed before `buf[0]`, for error messages.
    offset: u64,
}

impl<R: Read> CopyDecoder<R> {
    pub fn new(r: R) -> CopyDecoder<R> {
        CopyDecoder {
            r,
            buf: vec![0; BUFFER_BYTES],
            pos: 0,
            end: 0,
            offset: 0,
        }
    }

    /// Makes `n` bytes available at `pos`.
    fn need(&mut self, n: usize) -> Result<(), String> {
        if self.end - self.pos >= n {
            return Ok(());
        }
        self.buf.copy_within(self.pos..self.end, 0);
        self.offset += self.pos as u64;
        self.end -= self.pos;
        self.pos = 0;
        if self.buf.len() < n {
            self.buf.resize(n.next_power_of_two(), 0);
        }
        while self.end < n {
            let got = self
                .r
                .read(&mut self.buf[self.end..])
                .map_err(|e| format!("reading the COPY stream: {e}"))?;
            if got == 0 {
                return Err(format!(
                    "the COPY stream ended inside a row, at byte {}",
                    self.offset + self.end as u64
                ));
            }
            self.end += got;
        }
        Ok(())
    }

    fn i16(&mut self) -> Result<i16, String> {
        self.need(2)?;
        let v = i16::from_be_bytes([self.buf[self.pos], self.buf[self.pos + 1]]);
        self.pos += 2;
        Ok(v)
    }

    fn i32(&mut self) -> Result<i32, String> {
        self.need(4)?;
        let b = &self.buf[self.pos..self.pos + 4];
        let v = i32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        self.pos += 4;
        Ok(v)
    }

    /// Reads and checks the header.
    pub fn header(&mut self) -> Result<(), String> {
        self.need(19)?;
        if &self.buf[self.pos..self.pos + 11] != SIGNATURE {
            return Err("the COPY stream does not start with the binary signature".into());
        }
        self.pos += 11;
        let _flags = self.i32()?;
        let ext = self.i32()?;
        if ext < 0 {
            return Err("the COPY header extension has a negative length".into());
        }
        self.need(ext as usize)?;
        self.pos += ext as usize;
        Ok(())
    }

    /// Decodes the next row into `sink`; `false` at the end of the stream.
    pub fn row(&mut self, cols: &[Column], sink: &mut ParquetSink) -> Result<bool, String> {
        let n = self.i16()?;
        if n == -1 {
            return Ok(false);
        }
        if n as usize != cols.len() {
            return Err(format!(
                "a COPY row has {n} fields where {} columns were asked for",
                cols.len()
            ));
        }
        for (i, c) in cols.iter().enumerate() {
            let len = self.i32()?;
            if len == -1 {
                sink.push_value(i, Value::Null)?;
                continue;
            }
            if len < 0 {
                return Err(format!("column `{}`: a negative field length", c.name));
            }
            let len = len as usize;
            self.need(len)?;
            let raw = &self.buf[self.pos..self.pos + len];
            self.pos += len;
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
                    Value::Int(i16::from_be_bytes([raw[0], raw[1]]) as i64)
                }
                ColType::I32 => {
                    fixed(4)?;
                    Value::Int(i32::from_be_bytes(raw.try_into().expect("4 bytes")) as i64)
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
                ColType::Text => Value::Text(std::str::from_utf8(raw).map_err(|e| {
                    format!("column `{}`: a value that is not UTF-8 ({e})", c.name)
                })?),
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
                    let v = i32::from_be_bytes(raw.try_into().expect("4 bytes"));
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
        sink.end_row()?;
        Ok(true)
    }
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
            },
            Column {
                name: "note".into(),
                ty: ColType::Text,
            },
        ]
    }

    fn decode(bytes: &[u8]) -> Result<u64, String> {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = ParquetSink::new(dir.path(), &cols(), 2, 100, "");
        // A reader that returns one byte at a time: every field straddles
        // a read boundary.
        struct Dribble<'a>(&'a [u8]);
        impl Read for Dribble<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                if self.0.is_empty() || buf.is_empty() {
                    return Ok(0);
                }
                buf[0] = self.0[0];
                self.0 = &self.0[1..];
                Ok(1)
            }
        }
        let mut d = CopyDecoder::new(Dribble(bytes));
        d.header()?;
        while d.row(&cols(), &mut sink)? {}
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
        let e = decode(b"PGCOPY\n\xff\r\nX00000000").unwrap_err();
        assert!(e.contains("signature"), "{e}");
    }
}
