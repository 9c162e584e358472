//! date / timestamp / timestamptz: a deliberately small subset of
//! PostgreSQL's datetime input syntax.
//!
//! PostgreSQL's parser accepts a huge variety of forms, several of which
//! depend on session settings (DateStyle decides whether 01/02/03 is
//! January or February; TimeZone decides what an offset-less timestamptz
//! means; timezone_abbreviations decides what "EST" means). We accept only
//! forms whose meaning is fixed, and refuse everything else so the caller
//! asks the server:
//!
//! * date: `YYYY-MM-DD` (4-digit year 0001-9999, 1-2 digit month and day);
//! * timestamp: that date, optionally followed by `T` or spaces and
//!   `HH:MM[:SS[.ffffff]]`, optionally followed by a zone (`Z` or a numeric
//!   offset), which timestamp input ignores;
//! * timestamptz: the same but the zone is mandatory;
//! * `infinity`, `-infinity` and `epoch` (case-insensitive) for all three.
//!
//! Dates are stored as int4 days and timestamps as int8 microseconds, both
//! counted from 2000-01-01 (UTC for timestamptz).

use super::scalar::trim_c_space;
use super::{binary_error, text_error, HashInputError, HashType};

const USECS_PER_SEC: i64 = 1_000_000;
const USECS_PER_DAY: i64 = 86_400 * USECS_PER_SEC;
/// 1970-01-01 relative to 2000-01-01.
const EPOCH_DAYS: i64 = -10_957;

/// Valid finite dates are [4714-11-24 BC, 5874898-01-01), in days from 2000.
const DATE_MIN: i32 = -2_451_545;
const DATE_END: i32 = 2_147_483_494 - 2_451_545;
/// Valid finite timestamps are [4714-11-24 BC, 294277-01-01), in usecs from 2000.
const TIMESTAMP_MIN: i64 = -211_813_488_000_000_000;
const TIMESTAMP_END: i64 = 9_223_371_331_200_000_000;

/// Largest UTC offset hour PostgreSQL accepts in input.
const MAX_OFFSET_HOUR: u32 = 15;

enum Special {
    Infinity,
    NegInfinity,
    Epoch,
}

fn special(s: &str) -> Option<Special> {
    match s.to_ascii_lowercase().as_str() {
        "infinity" => Some(Special::Infinity),
        "-infinity" => Some(Special::NegInfinity),
        "epoch" => Some(Special::Epoch),
        _ => None,
    }
}

struct Cursor<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn eat(&mut self, b: u8) -> bool {
        let hit = self.peek() == Some(b);
        if hit {
            self.pos += 1;
        }
        hit
    }

    /// Reads a run of ASCII digits whose length must be within min..=max.
    /// Returns the value and the number of digits read.
    fn number(&mut self, min: usize, max: usize) -> Option<(u32, usize)> {
        let run = self.s[self.pos..].iter().take_while(|b| b.is_ascii_digit()).count();
        if run < min || run > max {
            return None;
        }
        let digits = &self.s[self.pos..self.pos + run];
        self.pos += run;
        let value = digits.iter().fold(0u32, |v, d| v * 10 + u32::from(d - b'0'));
        Some((value, run))
    }

    fn at_end(&self) -> bool {
        self.pos == self.s.len()
    }
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(year) => 29,
        2 => 28,
        _ => 31,
    }
}

/// Days from 2000-01-01 to a proleptic Gregorian date.
fn days_since_2000(year: i64, month: u32, day: u32) -> i64 {
    // Count years from March so that the leap day ends the year; then every
    // 400-year era has the same 146097 days.
    let (y, m) = if month <= 2 { (year - 1, month + 9) } else { (year, month - 3) };
    let era = y.div_euclid(400);
    let year_of_era = y.rem_euclid(400);
    let day_of_year = (153 * i64::from(m) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    // 2000-01-01 is day 730425 counting from 0000-03-01.
    era * 146_097 + day_of_era - 730_425
}

/// `YYYY-M[M]-D[D]`, returning days since 2000-01-01.
fn parse_ymd(cur: &mut Cursor) -> Option<i64> {
    let (year, _) = cur.number(4, 4)?;
    if !cur.eat(b'-') {
        return None;
    }
    let (month, _) = cur.number(1, 2)?;
    if !cur.eat(b'-') {
        return None;
    }
    let (day, _) = cur.number(1, 2)?;
    // Year 0 does not exist (1 BC precedes AD 1).
    let year = i64::from(year);
    if year == 0 || !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    Some(days_since_2000(year, month, day))
}

/// `H[H]:MM[:SS[.f{1,6}]]`, returning microseconds since midnight.
fn parse_time(cur: &mut Cursor) -> Option<i64> {
    let (hour, _) = cur.number(1, 2)?;
    if !cur.eat(b':') {
        return None;
    }
    let (minute, _) = cur.number(2, 2)?;
    let (mut second, mut micros) = (0, 0);
    if cur.eat(b':') {
        second = cur.number(2, 2)?.0;
        if cur.eat(b'.') {
            // More than microsecond precision would need the server's
            // floating-point rounding; refuse it.
            let (frac, len) = cur.number(1, 6)?;
            micros = i64::from(frac) * 10i64.pow(6 - len as u32);
        }
    }
    // PostgreSQL also takes 24:00:00 and leap second 60, rolling them over;
    // we leave those to the server.
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    Some((i64::from(hour) * 3600 + i64::from(minute) * 60 + i64::from(second)) * USECS_PER_SEC + micros)
}

/// `Z`, or `+H[H]`, `+HHMM`, `+H[H]:MM`, `+H[H]:MM:SS` (or `-`), returning
/// the offset east of UTC in seconds.
fn parse_zone(cur: &mut Cursor) -> Option<i64> {
    if cur.eat(b'Z') || cur.eat(b'z') {
        return Some(0);
    }
    let sign = if cur.eat(b'+') {
        1
    } else if cur.eat(b'-') {
        -1
    } else {
        return None;
    };
    let (first, len) = cur.number(1, 4)?;
    let (hour, minute, second) = if cur.eat(b':') {
        if len > 2 {
            return None;
        }
        let (minute, _) = cur.number(2, 2)?;
        let second = if cur.eat(b':') { cur.number(2, 2)?.0 } else { 0 };
        (first, minute, second)
    } else {
        match len {
            1 | 2 => (first, 0, 0),
            4 => (first / 100, first % 100, 0),
            _ => return None,
        }
    };
    if hour > MAX_OFFSET_HOUR || minute > 59 || second > 59 {
        return None;
    }
    Some(sign * ((i64::from(hour) * 60 + i64::from(minute)) * 60 + i64::from(second)))
}

/// date_in for the forms described in the module docs.
pub(crate) fn parse_date(text: &str) -> Result<i32, HashInputError> {
    let s = trim_c_space(text);
    let days = match special(s) {
        Some(Special::Infinity) => return Ok(i32::MAX),
        Some(Special::NegInfinity) => return Ok(i32::MIN),
        Some(Special::Epoch) => EPOCH_DAYS,
        None => {
            let mut cur = Cursor { s: s.as_bytes(), pos: 0 };
            match parse_ymd(&mut cur) {
                Some(days) if cur.at_end() => days,
                _ => return Err(text_error(HashType::Date, text, "only YYYY-MM-DD, infinity, -infinity and epoch are supported")),
            }
        }
    };
    Ok(days as i32)
}

/// timestamp_in / timestamptz_in for the forms described in the module docs.
pub(crate) fn parse_timestamp(ty: HashType, text: &str) -> Result<i64, HashInputError> {
    let s = trim_c_space(text);
    match special(s) {
        Some(Special::Infinity) => return Ok(i64::MAX),
        Some(Special::NegInfinity) => return Ok(i64::MIN),
        Some(Special::Epoch) => return Ok(EPOCH_DAYS * USECS_PER_DAY),
        None => {}
    }
    let unsupported = || text_error(ty, text, "only YYYY-MM-DD[( |T)HH:MM[:SS[.ffffff]]][Z|+HH[:MM]], infinity, -infinity and epoch are supported");
    let mut cur = Cursor { s: s.as_bytes(), pos: 0 };
    let days = parse_ymd(&mut cur).ok_or_else(unsupported)?;
    let mut time = 0;
    let mut zone = None;
    if !cur.at_end() {
        if !cur.eat(b'T') {
            if !cur.eat(b' ') {
                return Err(unsupported());
            }
            while cur.eat(b' ') {}
        }
        time = parse_time(&mut cur).ok_or_else(unsupported)?;
        while cur.eat(b' ') {}
        if !cur.at_end() {
            zone = Some(parse_zone(&mut cur).ok_or_else(unsupported)?);
            if !cur.at_end() {
                return Err(unsupported());
            }
        }
    }
    let local = days * USECS_PER_DAY + time;
    Ok(match (ty, zone) {
        // timestamp without time zone silently ignores a given zone.
        (HashType::Timestamp, _) => local,
        (_, Some(offset)) => local - offset * USECS_PER_SEC,
        (_, None) => return Err(text_error(ty, text, "no explicit UTC offset, so the value depends on the session TimeZone")),
    })
}

/// date_recv's range check.
pub(crate) fn check_date(days: i32) -> Result<i32, HashInputError> {
    if days == i32::MIN || days == i32::MAX || (DATE_MIN..DATE_END).contains(&days) {
        Ok(days)
    } else {
        Err(binary_error(HashType::Date, format_args!("date out of range: {days}")))
    }
}

/// timestamp_recv's / timestamptz_recv's range check.
pub(crate) fn check_timestamp(ty: HashType, usecs: i64) -> Result<i64, HashInputError> {
    if usecs == i64::MIN || usecs == i64::MAX || (TIMESTAMP_MIN..TIMESTAMP_END).contains(&usecs) {
        Ok(usecs)
    } else {
        Err(binary_error(ty, format_args!("timestamp out of range: {usecs}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_days() {
        assert_eq!(days_since_2000(2000, 1, 1), 0);
        assert_eq!(days_since_2000(1970, 1, 1), EPOCH_DAYS);
        assert_eq!(days_since_2000(2000, 3, 1), 60);
        assert_eq!(days_since_2000(1999, 12, 31), -1);
        // 0001-01-01 is Julian day 1721426; 2000-01-01 is 2451545.
        assert_eq!(days_since_2000(1, 1, 1), 1_721_426 - 2_451_545);
    }

    #[test]
    fn dates() {
        assert_eq!(parse_date(" 2000-01-02 ").unwrap(), 1);
        assert_eq!(parse_date("2000-1-2").unwrap(), 1);
        assert_eq!(parse_date("Infinity").unwrap(), i32::MAX);
        assert_eq!(parse_date("-infinity").unwrap(), i32::MIN);
        assert_eq!(parse_date("2000-02-29").unwrap(), 59);
        for bad in [
            "1900-02-29",
            "2000-13-01",
            "2000-00-01",
            "2000-01-32",
            "0000-01-01",
            "00-01-01",
            "12000-01-01",
            "2000/01/01",
            "01/02/2000",
            "Jan 1 2000",
            "today",
            "+infinity",
            "2000-01-01 BC",
            "2000-01-01 00:00",
            "",
        ] {
            assert!(parse_date(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn timestamps() {
        let ts = |s| parse_timestamp(HashType::Timestamp, s);
        let tz = |s| parse_timestamp(HashType::TimestampTz, s);
        assert_eq!(ts("2000-01-01").unwrap(), 0);
        assert_eq!(ts("2000-01-01 00:00:01.5").unwrap(), 1_500_000);
        assert_eq!(ts("2000-01-01T01:02").unwrap(), 3_720_000_000);
        assert_eq!(ts("2000-01-01 12:00:00+05").unwrap(), ts("2000-01-01 12:00").unwrap());
        assert_eq!(tz("2000-01-01 05:00:00+05").unwrap(), 0);
        assert_eq!(tz("1999-12-31 19:00:00-05:00").unwrap(), 0);
        assert_eq!(tz("2000-01-01 05:30:00 +0530").unwrap(), 0);
        assert_eq!(tz("2000-01-01T00:00:00Z").unwrap(), 0);
        assert_eq!(tz("epoch").unwrap(), -946_684_800 * USECS_PER_SEC);
        for bad in [
            "2000-01-01 24:00:00",
            "2000-01-01 23:59:60",
            "2000-01-01 12",
            "2000-01-01 12:00:00.1234567",
            "2000-01-01 12:00:00.",
            "2000-01-01 12:00:00+16",
            "2000-01-01 12:00:00+123",
            "2000-01-01 12:00:00 PST",
            "2000-01-01 12:00:00 UTC",
            "now",
            "2000-01-01t12:00",
        ] {
            assert!(ts(bad).is_err(), "{bad:?}");
        }
        assert!(tz("2000-01-01 12:00:00").is_err());
        assert!(tz("2000-01-01").is_err());
    }

    #[test]
    fn binary_ranges() {
        assert!(check_date(DATE_MIN).is_ok());
        assert!(check_date(DATE_MIN - 1).is_err());
        assert!(check_date(DATE_END).is_err());
        assert!(check_date(i32::MAX).is_ok());
        let ty = HashType::Timestamp;
        assert!(check_timestamp(ty, TIMESTAMP_MIN).is_ok());
        assert!(check_timestamp(ty, TIMESTAMP_MIN - 1).is_err());
        assert!(check_timestamp(ty, TIMESTAMP_END).is_err());
        assert!(check_timestamp(ty, i64::MIN).is_ok());
    }
}
