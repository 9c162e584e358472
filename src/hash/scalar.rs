//! Text input for the simple fixed-size and string types, mirroring the
//! PostgreSQL 15 input functions (int4in, oidin, boolin, charin, uuid_in,
//! byteain, textin, bpcharin).

use super::{binary_error, text_error, HashInputError, HashType};

/// C `isspace` in the "C" locale, which PostgreSQL's input functions use.
/// Unlike `u8::is_ascii_whitespace` it includes vertical tab.
pub(crate) fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

pub(crate) fn trim_c_space(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_ascii() && is_c_space(c as u8))
}

/// Splits an optional leading sign; returns (is_negative, rest).
fn split_sign(s: &str) -> (bool, &str) {
    match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    }
}

/// Magnitude of a non-empty ASCII digit string, or None if it is not one or
/// exceeds u64 (PostgreSQL 15 accepts neither underscores nor hex prefixes).
fn parse_digits(s: &str) -> Option<Result<u64, ()>> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut v: u64 = 0;
    for b in s.bytes() {
        match v.checked_mul(10).and_then(|v| v.checked_add(u64::from(b - b'0'))) {
            Some(n) => v = n,
            None => return Some(Err(())),
        }
    }
    Some(Ok(v))
}

/// int2in / int4in / int8in: optional whitespace, sign, at least one digit.
pub(crate) fn parse_int(ty: HashType, text: &str, min: i64, max: i64) -> Result<i64, HashInputError> {
    let (negative, digits) = split_sign(trim_c_space(text));
    let magnitude =
        parse_digits(digits).ok_or_else(|| text_error(ty, text, "invalid integer syntax"))?.map_err(|_| text_error(ty, text, "out of range"))?;
    let value = if negative { 0i128 - i128::from(magnitude) } else { i128::from(magnitude) };
    if value < i128::from(min) || value > i128::from(max) {
        return Err(text_error(ty, text, "out of range"));
    }
    Ok(value as i64)
}

/// oidin, which is built on strtoul: a leading minus sign is accepted and
/// negates modulo 2^64, and the result must round-trip through either an
/// unsigned or a signed 32-bit integer. So "-1" is 4294967295.
pub(crate) fn parse_oid(text: &str) -> Result<u32, HashInputError> {
    let ty = HashType::Oid;
    let (negative, digits) = split_sign(trim_c_space(text));
    let magnitude =
        parse_digits(digits).ok_or_else(|| text_error(ty, text, "invalid oid syntax"))?.map_err(|_| text_error(ty, text, "out of range"))?;
    let converted = if negative { magnitude.wrapping_neg() } else { magnitude };
    let oid = converted as u32;
    if converted == u64::from(oid) || converted == oid as i32 as i64 as u64 {
        Ok(oid)
    } else {
        Err(text_error(ty, text, "out of range"))
    }
}

/// boolin: trimmed, case-insensitive, any unambiguous prefix of
/// true/false/yes/no, "on"/"of"/"off", or exactly "1"/"0".
pub(crate) fn parse_bool(text: &str) -> Result<bool, HashInputError> {
    let word = trim_c_space(text).to_ascii_lowercase();
    let is_prefix_of = |full: &str, min_len: usize| word.len() >= min_len && full.starts_with(word.as_str());
    let value = match word.as_bytes().first() {
        Some(b't') if is_prefix_of("true", 1) => Some(true),
        Some(b'y') if is_prefix_of("yes", 1) => Some(true),
        Some(b'f') if is_prefix_of("false", 1) => Some(false),
        Some(b'n') if is_prefix_of("no", 1) => Some(false),
        // A lone "o" could be either "on" or "off".
        Some(b'o') if is_prefix_of("on", 2) => Some(true),
        Some(b'o') if is_prefix_of("off", 2) => Some(false),
        Some(b'1') if word.len() == 1 => Some(true),
        Some(b'0') if word.len() == 1 => Some(false),
        _ => None,
    };
    value.ok_or_else(|| text_error(HashType::Bool, text, "invalid boolean syntax"))
}

/// charin: a backslash and exactly three octal digits give that byte;
/// otherwise the first byte of the input (0 for an empty string).
pub(crate) fn parse_char(text: &str) -> u8 {
    let b = text.as_bytes();
    let is_octal = |c: u8| (b'0'..=b'7').contains(&c);
    if b.len() == 4 && b[0] == b'\\' && b[1..].iter().all(|&c| is_octal(c)) {
        // The server stores this in a C char, so 0o400 and up wrap.
        (((u32::from(b[1] - b'0') << 6) | (u32::from(b[2] - b'0') << 3) | u32::from(b[3] - b'0')) & 0xff) as u8
    } else {
        b.first().copied().unwrap_or(0)
    }
}

/// The word hashcharextended hashes for a "char" (or bool) byte, or None for
/// bytes >= 0x80: the function widens a C `char`, whose signedness depends on
/// the server's CPU (signed on x86-64, unsigned on AArch64), so such bytes
/// hash differently across platforms.
pub(crate) fn char_word(byte: u8) -> Option<u32> {
    (byte < 0x80).then_some(u32::from(byte))
}

pub(crate) const CHAR_HIGH_BIT: &str = "bytes >= 0x80 hash differently on signed-char and unsigned-char servers";

/// text values cannot contain NUL bytes.
pub(crate) fn check_text(ty: HashType, text: &str) -> Result<&str, HashInputError> {
    if text.contains('\0') {
        return Err(text_error(ty, text, "contains a NUL byte"));
    }
    Ok(text)
}

/// textrecv verifies the bytes are valid in the (UTF-8) server encoding.
pub(crate) fn check_text_bytes(ty: HashType, bytes: &[u8]) -> Result<&[u8], HashInputError> {
    match std::str::from_utf8(bytes) {
        Ok(s) if !s.contains('\0') => Ok(bytes),
        Ok(_) => Err(binary_error(ty, "contains a NUL byte")),
        Err(e) => Err(binary_error(ty, format_args!("invalid UTF-8: {e}"))),
    }
}

/// bpchar's hash (hashbpcharextended) ignores trailing spaces, because
/// char(n) pads with spaces and 'a'::char(3) must equal 'a  '::char(3). Only
/// ASCII spaces count, not other whitespace.
pub(crate) fn strip_bpchar(bytes: &[u8]) -> &[u8] {
    let len = bytes.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1);
    &bytes[..len]
}

/// byteain: `\x` followed by hex pairs (whitespace allowed between pairs), or
/// the escape format where `\\` is a backslash and `\ooo` an octal byte.
pub(crate) fn parse_bytea(text: &str) -> Result<Vec<u8>, HashInputError> {
    let ty = HashType::Bytea;
    let bytes = text.as_bytes();
    if let Some(hex) = bytes.strip_prefix(b"\\x") {
        let mut out = Vec::with_capacity(hex.len() / 2);
        let mut i = 0;
        while i < hex.len() {
            if matches!(hex[i], b' ' | b'\n' | b'\t' | b'\r') {
                i += 1;
                continue;
            }
            let hi = hex_value(hex[i]).ok_or_else(|| text_error(ty, text, "invalid hexadecimal digit"))?;
            let lo = hex.get(i + 1).ok_or_else(|| text_error(ty, text, "odd number of hexadecimal digits"))?;
            let lo = hex_value(*lo).ok_or_else(|| text_error(ty, text, "invalid hexadecimal digit"))?;
            out.push(hi << 4 | lo);
            i += 2;
        }
        return Ok(out);
    }

    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            out.push(bytes[i]);
            i += 1;
        } else if bytes.get(i + 1) == Some(&b'\\') {
            out.push(b'\\');
            i += 2;
        } else {
            match bytes.get(i + 1..i + 4) {
                Some(&[a @ b'0'..=b'3', b @ b'0'..=b'7', c @ b'0'..=b'7']) => {
                    out.push((a - b'0') << 6 | (b - b'0') << 3 | (c - b'0'));
                    i += 4;
                }
                _ => return Err(text_error(ty, text, "invalid escape sequence")),
            }
        }
    }
    Ok(out)
}

fn hex_value(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

/// uuid_in: 32 hex digits, optionally wrapped in braces, with an optional
/// hyphen after any group of four digits (except the last); no whitespace.
pub(crate) fn parse_uuid(text: &str) -> Result<[u8; 16], HashInputError> {
    let syntax = || text_error(HashType::Uuid, text, "invalid uuid syntax");
    let mut s = text.as_bytes();
    let braced = s.first() == Some(&b'{');
    if braced {
        s = &s[1..];
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        let (hi, lo) = match s {
            [hi, lo, ..] => (hex_value(*hi).ok_or_else(syntax)?, hex_value(*lo).ok_or_else(syntax)?),
            _ => return Err(syntax()),
        };
        *byte = hi << 4 | lo;
        s = &s[2..];
        if i % 2 == 1 && i < 15 && s.first() == Some(&b'-') {
            s = &s[1..];
        }
    }
    if braced {
        s = s.strip_prefix(b"}").ok_or_else(syntax)?;
    }
    if !s.is_empty() {
        return Err(syntax());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int4(s: &str) -> Option<i64> {
        parse_int(HashType::Int4, s, i32::MIN.into(), i32::MAX.into()).ok()
    }

    #[test]
    fn ints() {
        assert_eq!(int4(" +12 "), Some(12));
        assert_eq!(int4("\x0b-7\n"), Some(-7));
        assert_eq!(int4("-2147483648"), Some(-2147483648));
        for bad in ["", " ", "+", "-", "2147483648", "1_000", "0x10", "1.0", "- 1", "1e3", "99999999999999999999999"] {
            assert_eq!(int4(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn oids() {
        assert_eq!(parse_oid("-1").ok(), Some(u32::MAX));
        assert_eq!(parse_oid(" 010 ").ok(), Some(10));
        assert_eq!(parse_oid("-2147483648").ok(), Some(2147483648));
        assert_eq!(parse_oid("4294967295").ok(), Some(u32::MAX));
        for bad in ["4294967296", "-2147483649", "", "0x10", "abc", "18446744073709551616"] {
            assert!(parse_oid(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bools() {
        for t in ["t", "TRUE", " tr ", "y", "yes", "on", "ON", "1"] {
            assert_eq!(parse_bool(t).ok(), Some(true), "{t:?}");
        }
        for f in ["f", "False", "n", "no", "of", "off", "0", "\tF\n"] {
            assert_eq!(parse_bool(f).ok(), Some(false), "{f:?}");
        }
        for bad in ["", "o", "onn", "truee", "2", "yes please", "01"] {
            assert!(parse_bool(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn chars() {
        assert_eq!(parse_char("\\101"), b'A');
        assert_eq!(parse_char("ab"), b'a');
        assert_eq!(parse_char(""), 0);
        assert_eq!(parse_char("\\10"), b'\\');
        assert_eq!(char_word(parse_char("ż")), None);
    }

    #[test]
    fn bytea() {
        assert_eq!(parse_bytea("\\x 41 42\n").unwrap(), b"AB");
        assert_eq!(parse_bytea("\\x").unwrap(), b"");
        assert_eq!(parse_bytea("a\\\\b\\001").unwrap(), b"a\\b\x01");
        for bad in ["\\x4", "\\x4 1", "\\xzz", "\\", "\\400", "abc\\", "\\X41"] {
            assert!(parse_bytea(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn uuids() {
        let want = parse_uuid("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11").unwrap();
        for ok in [
            "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
            "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
            "a0eebc999c0b4ef8bb6d6bb9bd380a11",
            "a0ee-bc99-9c0b-4ef8-bb6d-6bb9-bd38-0a11",
            "{a0eebc99-9c0b4ef8-bb6d6bb9-bd380a11}",
        ] {
            assert_eq!(parse_uuid(ok).unwrap(), want, "{ok:?}");
        }
        for bad in [
            " a0eebc999c0b4ef8bb6d6bb9bd380a11",
            "a0eebc999c0b4ef8bb6d6bb9bd380a11 ",
            "a0eebc99-9c0b4ef8-bb6d6bb9-bd380a11-",
            "a0e-ebc999c0b4ef8bb6d6bb9bd380a11",
            "{a0eebc999c0b4ef8bb6d6bb9bd380a11",
            "a0eebc999c0b4ef8bb6d6bb9bd380a1",
            "g0eebc999c0b4ef8bb6d6bb9bd380a11",
        ] {
            assert!(parse_uuid(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bpchar_strips_only_spaces() {
        assert_eq!(strip_bpchar(b"ab  "), b"ab");
        assert_eq!(strip_bpchar(b"   "), b"");
        assert_eq!(strip_bpchar(b"ab\t"), b"ab\t");
    }
}
