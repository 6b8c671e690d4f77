//! Windows: explicit, half-open `[start, end)` intervals in UTC, aligned to a
//! grid of `interval` from a configured `start`. Times are microseconds since
//! the Unix epoch; nothing here reads a clock. The caller says what "now" is,
//! and only uses it to decide which windows are closed.

use crate::time::{civil_from_days, days_from_civil};
use std::fmt;
use thiserror::Error;

pub const US_PER_S: i64 = 1_000_000;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum TimeError {
    #[error("`{text}` is not a duration; write e.g. `1h`, `10m`, `90s`, `1d` or `1h30m`")]
    Duration { text: String },
    #[error("`{text}` is not an RFC 3339 time; write e.g. `2026-03-01T00:00:00Z` or `2026-03-01T01:00:00+01:00`")]
    Timestamp { text: String },
    #[error("`{text}` is not a window; write START/END, e.g. `2026-03-01T08:00:00Z/2026-03-01T09:00:00Z`")]
    Window { text: String },
    #[error("window {window} is not aligned to the grid of {interval} from {start}; use a window that starts on the grid and spans whole intervals")]
    Unaligned {
        window: String,
        interval: String,
        start: String,
    },
}

/// Parses `1h`, `10m`, `90s`, `250ms`, `1d`, `1h30m` into microseconds.
pub fn parse_duration(text: &str) -> Result<i64, TimeError> {
    let err = || TimeError::Duration {
        text: text.to_string(),
    };
    let s = text.trim();
    if s.is_empty() {
        return Err(err());
    }
    let mut total: i64 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(err());
        }
        let n: i64 = rest[..digits].parse().map_err(|_| err())?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = match &rest[..unit_len] {
            "ms" => 1_000,
            "s" => US_PER_S,
            "m" => 60 * US_PER_S,
            "h" => 3_600 * US_PER_S,
            "d" => 86_400 * US_PER_S,
            _ => return Err(err()),
        };
        rest = &rest[unit_len..];
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(err)?;
    }
    Ok(total)
}

/// Formats microseconds as the shortest duration text (`1h`, `90s`).
pub fn format_duration(us: i64) -> String {
    for (unit, name) in [
        (86_400 * US_PER_S, "d"),
        (3_600 * US_PER_S, "h"),
        (60 * US_PER_S, "m"),
        (US_PER_S, "s"),
        (1_000, "ms"),
    ] {
        if us != 0 && us % unit == 0 {
            return format!("{}{name}", us / unit);
        }
    }
    format!("{us}us")
}

/// Parses RFC 3339 (`T` or a space between date and time, fraction up to
/// microseconds, `Z` or an offset) into UTC microseconds. An offset is
/// applied, so `01:00:00+01:00` and `00:00:00Z` are the same instant: local
/// time never decides which window a time is in.
pub fn parse_rfc3339(text: &str) -> Result<i64, TimeError> {
    let err = || TimeError::Timestamp {
        text: text.to_string(),
    };
    let b = text.trim().as_bytes();
    if b.len() < 20 {
        return Err(err());
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, TimeError> {
        let s = std::str::from_utf8(&b[r]).map_err(|_| err())?;
        if !s.bytes().all(|c| c.is_ascii_digit()) {
            return Err(err());
        }
        s.parse().map_err(|_| err())
    };
    if b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(err());
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 || sec > 60
    {
        return Err(err());
    }
    let mut i = 19;
    let mut frac_us = 0i64;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return Err(err());
        }
        let digits = &b[start..i.min(start + 6)];
        let mut v = 0i64;
        for &c in digits {
            v = v * 10 + (c - b'0') as i64;
        }
        for _ in digits.len()..6 {
            v *= 10;
        }
        frac_us = v;
    }
    let offset_s = match b.get(i) {
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(&sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
            let oh = num(i + 1..i + 3)?;
            let om = num(i + 4..i + 6)?;
            if oh > 23 || om > 59 {
                return Err(err());
            }
            let o = oh * 3600 + om * 60;
            if sign == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return Err(err()),
    };
    // A leap second folds into the next second: windows are half-open, so
    // 23:59:60 belongs to the window that starts at 00:00:00.
    let days = days_from_civil(y, mo as u32, d as u32);
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset_s;
    Ok(secs * US_PER_S + frac_us)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        _ => 28,
    }
}

/// The UTC calendar fields of an instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Civil {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub micro: u32,
}

pub fn civil(us: i64) -> Civil {
    let secs = us.div_euclid(US_PER_S);
    let micro = us.rem_euclid(US_PER_S) as u32;
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    Civil {
        year,
        month,
        day,
        hour: (sod / 3600) as u32,
        minute: ((sod % 3600) / 60) as u32,
        second: (sod % 60) as u32,
        micro,
    }
}

/// RFC 3339 in UTC, with a fraction only when there is one.
///
/// Digits are written by hand: a plan over landed windows names every
/// window by its bounds, and `format!` made that a fifth of a no-change
/// plan over 1,000 windows (issue 49, bench/windows_plan.sh).
pub fn format_rfc3339(us: i64) -> String {
    let mut s = String::with_capacity(27);
    push_rfc3339(&mut s, us);
    s
}

/// [`format_rfc3339`] appended to `out`: names built of several bounds
/// (`orders/2026-03-14T09:00:00Z/2026-03-14T10:00:00Z`) in one buffer.
pub fn push_rfc3339(out: &mut String, us: i64) {
    let c = civil(us);
    if !(0..=9999).contains(&c.year) {
        use std::fmt::Write;
        let _ = write!(
            out,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
            c.year, c.month, c.day, c.hour, c.minute, c.second
        );
        if c.micro != 0 {
            let _ = write!(out, ".{:06}", c.micro);
        }
        out.push('Z');
        return;
    }
    let mut b = [0u8; 27];
    let mut n = 0;
    push_digits(&mut b, &mut n, c.year as u32, 4);
    let fields = [c.month, c.day, c.hour, c.minute, c.second];
    for (v, sep) in fields.into_iter().zip([b'-', b'-', b'T', b':', b':']) {
        b[n] = sep;
        n += 1;
        push_digits(&mut b, &mut n, v, 2);
    }
    if c.micro != 0 {
        b[n] = b'.';
        n += 1;
        push_digits(&mut b, &mut n, c.micro, 6);
    }
    b[n] = b'Z';
    n += 1;
    out.push_str(std::str::from_utf8(&b[..n]).expect("ASCII digits and separators"));
}

/// `n`'s last `width` decimal digits, zero-padded.
fn push_digits(b: &mut [u8], at: &mut usize, n: u32, width: u32) {
    for i in (0..width).rev() {
        b[*at] = b'0' + (n / 10u32.pow(i) % 10) as u8;
        *at += 1;
    }
}

/// A compact UTC form safe in file names: `20260314T090000Z`.
pub fn format_compact(us: i64) -> String {
    let c = civil(us);
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        c.year, c.month, c.day, c.hour, c.minute, c.second
    )
}

/// A half-open window `[start_us, end_us)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Window {
    pub start_us: i64,
    pub end_us: i64,
}

impl Window {
    pub fn contains(&self, t_us: i64) -> bool {
        self.start_us <= t_us && t_us < self.end_us
    }

    /// Parses `START/END` (RFC 3339 each, any offsets).
    pub fn parse(text: &str) -> Result<Window, TimeError> {
        let (a, b) = text.split_once('/').ok_or_else(|| TimeError::Window {
            text: text.to_string(),
        })?;
        let w = Window {
            start_us: parse_rfc3339(a)?,
            end_us: parse_rfc3339(b)?,
        };
        if w.end_us <= w.start_us {
            return Err(TimeError::Window {
                text: text.to_string(),
            });
        }
        Ok(w)
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}, {})",
            format_rfc3339(self.start_us),
            format_rfc3339(self.end_us)
        )
    }
}

/// The grid windows are aligned to: `start + k * interval` for k >= 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    pub start_us: i64,
    pub interval_us: i64,
}

impl Grid {
    pub fn new(start_us: i64, interval_us: i64) -> Grid {
        assert!(interval_us > 0, "interval is validated at config load");
        Grid {
            start_us,
            interval_us,
        }
    }

    /// The k-th window.
    pub fn window(&self, k: i64) -> Window {
        let start_us = self.start_us + k * self.interval_us;
        Window {
            start_us,
            end_us: start_us + self.interval_us,
        }
    }

    /// The index of the window containing `t_us` (negative before the start).
    pub fn index_of(&self, t_us: i64) -> i64 {
        (t_us - self.start_us).div_euclid(self.interval_us)
    }

    /// The windows (by index) that `w` covers, if `w` lies on the grid.
    pub fn indices(&self, w: &Window) -> Result<std::ops::Range<i64>, TimeError> {
        let on_grid = |t: i64| (t - self.start_us).rem_euclid(self.interval_us) == 0;
        if !on_grid(w.start_us) || !on_grid(w.end_us) || w.start_us < self.start_us {
            return Err(TimeError::Unaligned {
                window: w.to_string(),
                interval: format_duration(self.interval_us),
                start: format_rfc3339(self.start_us),
            });
        }
        Ok(self.index_of(w.start_us)..self.index_of(w.end_us))
    }

    /// How many windows are closed at `now_us`: a window is closed when its
    /// end plus the settle delay is not in the future. The clock decides only
    /// this; what a window contains never depends on when it runs.
    pub fn closed_count(&self, now_us: i64, settle_us: i64) -> i64 {
        // Window k is closed when start + (k + 1) * interval <= now - settle.
        (now_us - settle_us - self.start_us)
            .div_euclid(self.interval_us)
            .max(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1h").unwrap(), 3_600 * US_PER_S);
        assert_eq!(parse_duration("1h30m").unwrap(), 5_400 * US_PER_S);
        assert_eq!(parse_duration("250ms").unwrap(), 250_000);
        assert!(parse_duration("1 hour").is_err());
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("").is_err());
        assert_eq!(format_duration(3_600 * US_PER_S), "1h");
        assert_eq!(format_duration(90 * US_PER_S), "90s");
    }

    #[test]
    fn rfc3339_written_by_hand_equals_format_and_parses_back() {
        let reference = |us: i64| {
            let c = civil(us);
            let mut s = format!(
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
                c.year, c.month, c.day, c.hour, c.minute, c.second
            );
            if c.micro != 0 {
                s.push_str(&format!(".{:06}", c.micro));
            }
            s + "Z"
        };
        // Every few hours from 1969 to 2101, with and without fractions,
        // and the ends of the four-digit years.
        let mut us = -86_400_000_000i64 * 400;
        while us < 4_102_444_800_000_000 {
            for t in [us, us + 1, us + 999_999, us + 123_456] {
                let got = format_rfc3339(t);
                assert_eq!(got, reference(t));
                assert_eq!(parse_rfc3339(&got).unwrap(), t);
            }
            us += 3 * 3_600_000_000 + 7_000_001;
        }
        for t in [
            -62_167_219_200_000_000,
            253_402_300_799_999_999,
            i64::MIN / 2,
        ] {
            assert_eq!(format_rfc3339(t), reference(t));
        }
    }

    #[test]
    fn rfc3339_with_offsets_and_fractions() {
        let z = parse_rfc3339("2026-03-01T00:00:00Z").unwrap();
        assert_eq!(parse_rfc3339("2026-03-01T01:00:00+01:00").unwrap(), z);
        assert_eq!(parse_rfc3339("2026-02-28T19:00:00-05:00").unwrap(), z);
        assert_eq!(format_rfc3339(z), "2026-03-01T00:00:00Z");
        let f = parse_rfc3339("2026-03-01 08:59:59.9Z").unwrap();
        assert_eq!(format_rfc3339(f), "2026-03-01T08:59:59.900000Z");
        for bad in [
            "2026-02-30T00:00:00Z",
            "2026-03-01T00:00:00",
            "2026-03-01",
            "2026-13-01T00:00:00Z",
            "2026-03-01T24:00:00Z",
            "x026-03-01T00:00:00Z",
        ] {
            assert!(parse_rfc3339(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn dst_can_neither_skip_nor_repeat_a_window() {
        // Europe's spring-forward night: local 02:00 does not exist, yet the
        // UTC grid has every hour exactly once; the same local hour given
        // with two offsets in autumn maps to two distinct UTC windows.
        let g = Grid::new(
            parse_rfc3339("2026-03-29T00:00:00Z").unwrap(),
            3_600 * US_PER_S,
        );
        let a = Window::parse("2026-03-29T01:00:00+01:00/2026-03-29T03:00:00+02:00").unwrap();
        assert_eq!(
            g.indices(&a).unwrap(),
            0..1,
            "one UTC hour, though the clocks moved two"
        );
        let g = Grid::new(
            parse_rfc3339("2026-10-25T00:00:00Z").unwrap(),
            3_600 * US_PER_S,
        );
        let first = Window::parse("2026-10-25T02:00:00+02:00/2026-10-25T02:00:00+01:00").unwrap();
        assert_eq!(g.indices(&first).unwrap(), 0..1);
        let second = Window::parse("2026-10-25T02:00:00+01:00/2026-10-25T03:00:00+01:00").unwrap();
        assert_eq!(g.indices(&second).unwrap(), 1..2);
    }

    #[test]
    fn grid_and_closed_windows() {
        let h = 3_600 * US_PER_S;
        let g = Grid::new(parse_rfc3339("2026-03-01T00:00:00Z").unwrap(), h);
        let now = parse_rfc3339("2026-03-01T03:01:00Z").unwrap();
        assert_eq!(
            g.closed_count(now, 2 * 60 * US_PER_S),
            2,
            "03:00 + 2m settle is not yet past"
        );
        assert_eq!(g.closed_count(now, 60 * US_PER_S), 3);
        assert_eq!(g.closed_count(g.start_us, 0), 0);
        assert_eq!(g.window(2).start_us, g.start_us + 2 * h);
        assert!(g.window(0).contains(g.start_us) && !g.window(0).contains(g.start_us + h));
        let off = Window {
            start_us: g.start_us + 1,
            end_us: g.start_us + h,
        };
        assert!(g.indices(&off).is_err());
        assert_eq!(format_compact(g.start_us), "20260301T000000Z");
    }
}
