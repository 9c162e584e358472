//! numeric: decoding to PostgreSQL's base-10000 digit form and
//! `hash_numeric_extended`.
//!
//! A numeric is stored as base-10000 digits (NBASE) plus a weight: the power of
//! 10000 of the first digit. The hash covers only the digits with leading and
//! trailing zero digits stripped, XOR-ed with the adjusted weight, so that
//! values comparing equal (1.0 and 1.00, -0 and 0) hash equally. It ignores
//! the sign and the display scale; NaN and both infinities hash to the seed
//! and zero hashes to seed - 1.

use super::jenkins::hash_bytes;
use super::scalar::trim_c_space;
use super::{binary_error, text_error, HashInputError, HashType};

const NBASE: u16 = 10_000;
/// Decimal digits per NBASE digit.
const DEC_DIGITS: i64 = 4;
/// Largest display scale the on-disk header can hold.
const DSCALE_MAX: i64 = 0x3FFF;

const SIGN_POS: u16 = 0x0000;
const SIGN_NEG: u16 = 0x4000;
const SIGN_NAN: u16 = 0xC000;
const SIGN_PINF: u16 = 0xD000;
const SIGN_NINF: u16 = 0xF000;

/// A numeric reduced to exactly what its hash depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NumericValue {
    /// NaN, Infinity or -Infinity.
    Special,
    Zero,
    /// Non-zero: digits without leading or trailing zero digits, and the
    /// weight of the first one.
    Finite {
        weight: i16,
        digits: Vec<u16>,
    },
}

impl NumericValue {
    /// Builds the normalized value the way make_result stores it: strips zero
    /// digits at both ends and rejects weights that overflow the int16 field.
    fn from_digits(mut weight: i64, digits: &[u16]) -> Result<NumericValue, &'static str> {
        let Some(first) = digits.iter().position(|&d| d != 0) else {
            return Ok(NumericValue::Zero);
        };
        let last = digits.iter().rposition(|&d| d != 0).unwrap_or(first);
        weight -= first as i64;
        let weight = i16::try_from(weight).map_err(|_| "value overflows numeric format")?;
        Ok(NumericValue::Finite { weight, digits: digits[first..=last].to_vec() })
    }

    pub(crate) fn hash(&self, seed: u64) -> u64 {
        match self {
            NumericValue::Special => seed,
            NumericValue::Zero => seed.wrapping_sub(1),
            NumericValue::Finite { weight, digits } => {
                // The server hashes its in-memory int16 digit array, i.e. in
                // native (little-endian) byte order.
                let bytes: Vec<u8> = digits.iter().flat_map(|d| d.to_le_bytes()).collect();
                // The weight is a C int, sign-extended to 64 bits by the XOR.
                hash_bytes(&bytes, seed) ^ i64::from(*weight) as u64
            }
        }
    }
}

fn floor_div(a: i64, b: i64) -> i64 {
    a.div_euclid(b)
}

/// numeric_in, without a typmod.
pub(crate) fn parse_text(text: &str) -> Result<NumericValue, HashInputError> {
    let err = |reason: &str| text_error(HashType::Numeric, text, reason);
    let s = trim_c_space(text);
    // The special spellings numeric_in (and float8in) accept.
    if matches!(s.to_ascii_lowercase().as_str(), "nan" | "infinity" | "+infinity" | "-infinity" | "inf" | "+inf" | "-inf") {
        return Ok(NumericValue::Special);
    }

    let bytes = s.as_bytes();
    let mut i = usize::from(matches!(bytes.first(), Some(b'+' | b'-')));
    let int_start = i;
    while i < bytes.len() && bytes[i].is_ascii_digit() {
        i += 1;
    }
    let int_digits = &bytes[int_start..i];
    let mut frac_digits: &[u8] = &[];
    if bytes.get(i) == Some(&b'.') {
        i += 1;
        let frac_start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        frac_digits = &bytes[frac_start..i];
    }
    if int_digits.is_empty() && frac_digits.is_empty() {
        return Err(err("invalid numeric syntax"));
    }

    let mut exponent: i64 = 0;
    if matches!(bytes.get(i), Some(b'e' | b'E')) {
        i += 1;
        let negative = match bytes.get(i) {
            Some(b'-') => {
                i += 1;
                true
            }
            Some(b'+') => {
                i += 1;
                false
            }
            _ => false,
        };
        let exp_start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            // Saturate; anything this large is rejected below anyway.
            exponent = (exponent * 10 + i64::from(bytes[i] - b'0')).min(i64::from(i32::MAX));
            i += 1;
        }
        if i == exp_start {
            // Includes "1e 5", which the server's strtol would accept.
            return Err(err("invalid or unsupported exponent"));
        }
        // Bound from set_var_from_str, which guards its int arithmetic.
        if exponent >= i64::from(i32::MAX / 2) {
            return Err(err("value overflows numeric format"));
        }
        if negative {
            exponent = -exponent;
        }
    }
    if i != bytes.len() {
        return Err(err("invalid numeric syntax"));
    }

    let dscale = (frac_digits.len() as i64 - exponent).max(0);
    if dscale > DSCALE_MAX {
        return Err(err("value overflows numeric format"));
    }

    // Decimal position (power of ten) of the first significant digit.
    let all_digits = int_digits.iter().chain(frac_digits).map(|b| b - b'0');
    let leading_zeros = all_digits.clone().take_while(|&d| d == 0).count();
    let significant: Vec<u8> = all_digits.skip(leading_zeros).collect();
    let Some(last_nonzero) = significant.iter().rposition(|&d| d != 0) else {
        return Ok(NumericValue::Zero);
    };
    let significant = &significant[..=last_nonzero];
    let first_pos = int_digits.len() as i64 - 1 - leading_zeros as i64 + exponent;

    // Regroup the decimal digits into base-10000 digits aligned on powers of
    // 10000: decimal position p lands in NBASE digit floor(p / 4).
    let weight = floor_div(first_pos, DEC_DIGITS);
    let last_pos = first_pos - (significant.len() as i64 - 1);
    let ndigits = (weight - floor_div(last_pos, DEC_DIGITS) + 1) as usize;
    let mut digits = vec![0u16; ndigits];
    for (k, &d) in significant.iter().enumerate() {
        let pos = first_pos - k as i64;
        let slot = (weight - floor_div(pos, DEC_DIGITS)) as usize;
        digits[slot] += u16::from(d) * 10u16.pow(pos.rem_euclid(DEC_DIGITS) as u32);
    }
    NumericValue::from_digits(weight, &digits).map_err(err)
}

/// numeric_recv: int16 ndigits, weight, sign, dscale, then the NBASE digits,
/// all big-endian.
pub(crate) fn parse_binary(bytes: &[u8]) -> Result<NumericValue, HashInputError> {
    let err = |reason: &str| binary_error(HashType::Numeric, reason);
    let word = |i: usize| u16::from_be_bytes([bytes[2 * i], bytes[2 * i + 1]]);
    if bytes.len() < 8 {
        return Err(err("shorter than the 8-byte header"));
    }
    let ndigits = usize::from(word(0));
    let weight = i64::from(word(1) as i16);
    let sign = word(2);
    let dscale = word(3);
    if bytes.len() != 8 + 2 * ndigits {
        return Err(err("length does not match the digit count"));
    }
    if ![SIGN_POS, SIGN_NEG, SIGN_NAN, SIGN_PINF, SIGN_NINF].contains(&sign) {
        return Err(err("invalid sign"));
    }
    if i64::from(dscale) > DSCALE_MAX {
        return Err(err("invalid scale"));
    }
    let mut digits: Vec<u16> = (4..4 + ndigits).map(word).collect();
    if digits.iter().any(|&d| d >= NBASE) {
        return Err(err("invalid digit"));
    }
    if sign != SIGN_POS && sign != SIGN_NEG {
        return Ok(NumericValue::Special);
    }

    // numeric_recv silently truncates digits hidden by the display scale
    // (trunc_var), so e.g. digits 1,5000 with weight 0 and dscale 0 is 1.
    let kept_decimals = (weight + 1) * DEC_DIGITS + i64::from(dscale);
    if kept_decimals <= 0 {
        return Ok(NumericValue::Zero);
    }
    let kept_digits = ((kept_decimals + DEC_DIGITS - 1) / DEC_DIGITS) as usize;
    if kept_digits <= digits.len() {
        digits.truncate(kept_digits);
        let partial = kept_decimals % DEC_DIGITS;
        if partial > 0 {
            let unit = 10u16.pow((DEC_DIGITS - partial) as u32);
            let last = digits.last_mut().expect("kept_digits > 0");
            *last -= *last % unit;
        }
    }
    NumericValue::from_digits(weight, &digits).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finite(weight: i16, digits: &[u16]) -> NumericValue {
        NumericValue::Finite { weight, digits: digits.to_vec() }
    }

    #[test]
    fn text_forms() {
        assert_eq!(parse_text("12345.678").unwrap(), finite(1, &[1, 2345, 6780]));
        assert_eq!(parse_text(" -0012345.67800 ").unwrap(), finite(1, &[1, 2345, 6780]));
        assert_eq!(parse_text("1.2345678e4").unwrap(), finite(1, &[1, 2345, 6780]));
        assert_eq!(parse_text("0.0001").unwrap(), finite(-1, &[1]));
        assert_eq!(parse_text("0.00001").unwrap(), finite(-2, &[1000]));
        assert_eq!(parse_text("1e10").unwrap(), finite(2, &[100]));
        assert_eq!(parse_text("10000").unwrap(), finite(1, &[1]));
        assert_eq!(parse_text(".5").unwrap(), finite(-1, &[5000]));
        assert_eq!(parse_text("5.").unwrap(), finite(0, &[5]));
        assert_eq!(parse_text("0.000").unwrap(), NumericValue::Zero);
        assert_eq!(parse_text("-0e5").unwrap(), NumericValue::Zero);
        for special in ["NaN", " nan ", "Infinity", "-infinity", "+Infinity", "inf", "-INF", "+inf"] {
            assert_eq!(parse_text(special).unwrap(), NumericValue::Special, "{special:?}");
        }
    }

    #[test]
    fn text_errors() {
        for bad in [
            "",
            " ",
            ".",
            "-",
            "+.",
            "1..2",
            "1.2.3",
            "1e",
            "1e+",
            "1e 5",
            "1_000",
            "0x10",
            "abc",
            "nanx",
            "infinit",
            "1 2",
            "--1",
            "1e-16384",
            "1e131072",
            "1e9999999999",
            "0e-20000",
        ] {
            assert!(parse_text(bad).is_err(), "{bad:?}");
        }
        assert!(parse_text("1e-16383").is_ok());
        assert!(parse_text("1e131071").is_ok());
    }

    fn binary(ndigits: u16, weight: i16, sign: u16, dscale: u16, digits: &[u16]) -> Vec<u8> {
        let mut v = Vec::new();
        for w in [ndigits, weight as u16, sign, dscale].iter().chain(digits) {
            v.extend_from_slice(&w.to_be_bytes());
        }
        v
    }

    #[test]
    fn binary_forms() {
        let b = |w, s, d, digits: &[u16]| parse_binary(&binary(digits.len() as u16, w, s, d, digits));
        assert_eq!(b(0, SIGN_POS, 4, &[1, 5000]).unwrap(), finite(0, &[1, 5000]));
        // dscale 0 truncates the fraction away
        assert_eq!(b(0, SIGN_POS, 0, &[1, 5000]).unwrap(), finite(0, &[1]));
        // dscale 1 keeps one decimal: 1.5678 -> 1.5
        assert_eq!(b(0, SIGN_NEG, 1, &[1, 5678]).unwrap(), finite(0, &[1, 5000]));
        // leading and trailing zero digits are stripped
        assert_eq!(b(2, SIGN_POS, 0, &[0, 12, 0]).unwrap(), finite(1, &[12]));
        assert_eq!(b(-1, SIGN_POS, 2, &[5000]).unwrap(), finite(-1, &[5000]));
        assert_eq!(b(-1, SIGN_POS, 0, &[5000]).unwrap(), NumericValue::Zero);
        assert_eq!(b(0, SIGN_NAN, 0, &[]).unwrap(), NumericValue::Special);
        assert_eq!(b(0, SIGN_NINF, 0, &[]).unwrap(), NumericValue::Special);
        assert!(b(0, SIGN_POS, 0, &[10000]).is_err());
        assert!(b(0, 0x8000, 0, &[1]).is_err());
        assert!(b(0, SIGN_POS, 0x4000, &[1]).is_err());
        assert!(b(0, SIGN_NAN, 0, &[10000]).is_err());
        assert!(parse_binary(&[0, 1, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(parse_binary(&[0, 0, 0, 0]).is_err());
    }

    #[test]
    fn sign_and_scale_do_not_matter() {
        let h = |s| parse_text(s).unwrap().hash(1);
        assert_eq!(h("1.5"), h("-1.50"));
        assert_eq!(h("100"), h("1e2"));
        assert_ne!(h("1"), h("10000"));
    }
}
