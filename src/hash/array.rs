//! Arrays as distribution values: their text and binary forms taken apart
//! into elements the way PostgreSQL 15's array_in and array_recv do, and the
//! elements' hashes combined as hash_array_extended does.
//!
//! hash_array_extended starts from 1 and, for each element in storage order
//! (all dimensions flattened), multiplies by 31 and adds the element's
//! extended hash under the same seed, or 0 for a NULL element. Dimensions and
//! lower bounds do not enter the hash.

use super::{binary_error, hash_binary, hash_text, text_error, HashInputError, HashType};
use crate::hash::scalar::is_c_space;

/// Combines the elements' hashes (None: a NULL element).
fn combine(hashes: impl IntoIterator<Item = Option<u64>>) -> u64 {
    hashes.into_iter().fold(1u64, |result, h| (result << 5).wrapping_sub(result).wrapping_add(h.unwrap_or(0)))
}

/// The hash of an array of `element` given in array_in's text form.
pub(super) fn hash_array_text(array: HashType, element: HashType, text: &str) -> Result<u64, HashInputError> {
    let elements = parse_text(text).map_err(|why| text_error(array, text, why))?;
    let mut hashes = Vec::with_capacity(elements.len());
    for e in elements {
        hashes.push(match e {
            Some(value) => Some(hash_text(element, &value)?),
            None => None,
        });
    }
    Ok(combine(hashes))
}

/// The hash of an array of `element` given in array_send's binary form.
pub(super) fn hash_array_binary(array: HashType, element: HashType, bytes: &[u8]) -> Result<u64, HashInputError> {
    let mut input = Binary { bytes, array };
    let dimensions = input.int()?;
    if !(0..=6).contains(&dimensions) {
        return Err(binary_error(array, format_args!("{dimensions} dimensions")));
    }
    let _has_nulls = input.int()?;
    let _element_type = input.int()?;
    let mut count: i64 = if dimensions == 0 { 0 } else { 1 };
    for _ in 0..dimensions {
        let length = input.int()?;
        let _lower_bound = input.int()?;
        if length < 0 {
            return Err(binary_error(array, "a negative dimension"));
        }
        count *= i64::from(length);
    }
    let mut hashes = Vec::new();
    for _ in 0..count {
        let length = input.int()?;
        hashes.push(match length {
            -1 => None,
            n if n < 0 => return Err(binary_error(array, "a negative element length")),
            n => Some(hash_binary(element, input.take(n as usize)?)?),
        });
    }
    if !input.bytes.is_empty() {
        return Err(binary_error(array, "bytes after the last element"));
    }
    Ok(combine(hashes))
}

/// The unread part of a binary array.
struct Binary<'a> {
    bytes: &'a [u8],
    array: HashType,
}

impl<'a> Binary<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], HashInputError> {
        if self.bytes.len() < n {
            return Err(binary_error(self.array, "it ends early"));
        }
        let (taken, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(taken)
    }

    fn int(&mut self) -> Result<i32, HashInputError> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into().expect("four bytes")))
    }
}

/// The elements of an array literal, flattened (None: NULL), as array_in
/// reads them with `,` as the delimiter: an optional `[lo:hi]…=` dimension
/// decoration, then nested braces whose sub-arrays at each level have the
/// same length. Anything array_in would refuse is refused.
fn parse_text(text: &str) -> Result<Vec<Option<String>>, &'static str> {
    let mut rest = text.trim_start_matches(|c: char| c.is_ascii() && is_c_space(c as u8));
    if rest.starts_with('[') {
        let equals = rest.find('=').ok_or("a dimension decoration without \"=\"")?;
        if !rest[..equals].bytes().all(|b| b.is_ascii_digit() || matches!(b, b'[' | b']' | b':' | b'-' | b'+') || is_c_space(b)) {
            return Err("a malformed dimension decoration");
        }
        rest = rest[equals + 1..].trim_start_matches(|c: char| c.is_ascii() && is_c_space(c as u8));
    }
    let mut parser = Parser { chars: rest.chars().peekable(), elements: Vec::new(), lengths: Vec::new() };
    if parser.chars.next() != Some('{') {
        return Err("no opening \"{\"");
    }
    parser.level(0)?;
    if parser.chars.any(|c| !(c.is_ascii() && is_c_space(c as u8))) {
        return Err("text after the closing \"}\"");
    }
    Ok(parser.elements)
}

struct Parser<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    elements: Vec<Option<String>>,
    /// The length of the sub-arrays seen at each depth, which must agree.
    lengths: Vec<Option<usize>>,
}

impl Parser<'_> {
    fn skip_spaces(&mut self) {
        while self.chars.next_if(|c| c.is_ascii() && is_c_space(*c as u8)).is_some() {}
    }

    /// Reads the items of one brace level (its "{" already read) through its "}".
    fn level(&mut self, depth: usize) -> Result<(), &'static str> {
        if self.lengths.len() <= depth {
            self.lengths.push(None);
        }
        let mut items = 0;
        let mut nested = None;
        self.skip_spaces();
        if self.chars.next_if_eq(&'}').is_none() {
            loop {
                self.skip_spaces();
                let is_array = self.chars.peek() == Some(&'{');
                if *nested.get_or_insert(is_array) != is_array {
                    return Err("elements and sub-arrays mixed at one level");
                }
                if is_array {
                    self.chars.next();
                    self.level(depth + 1)?;
                } else {
                    let element = self.element()?;
                    self.elements.push(element);
                }
                items += 1;
                self.skip_spaces();
                match self.chars.next() {
                    Some(',') => continue,
                    Some('}') => break,
                    _ => return Err("an element not followed by \",\" or \"}\""),
                }
            }
        }
        if nested == Some(true) && self.lengths.len() > depth + 2 {
            return Err("sub-arrays of different depths");
        }
        if nested == Some(false) && self.lengths.len() > depth + 1 {
            return Err("sub-arrays of different depths");
        }
        match self.lengths[depth] {
            Some(known) if known != items => Err("sub-arrays of different lengths"),
            _ => {
                self.lengths[depth] = Some(items);
                Ok(())
            }
        }
    }

    /// One element: quoted (backslash escapes anything), or unquoted up to
    /// the delimiter or brace, trailing spaces dropped unless escaped; an
    /// unquoted NULL is a NULL.
    fn element(&mut self) -> Result<Option<String>, &'static str> {
        let mut value = String::new();
        let mut quoted_or_escaped = false;
        // Characters up to here must stay, spaces included.
        let mut kept = 0;
        if self.chars.next_if_eq(&'"').is_some() {
            loop {
                match self.chars.next() {
                    Some('"') => break,
                    Some('\\') => value.push(self.chars.next().ok_or("an unfinished escape")?),
                    Some(c) => value.push(c),
                    None => return Err("an unfinished quoted element"),
                }
            }
            return Ok(Some(value));
        }
        while let Some(&c) = self.chars.peek() {
            match c {
                ',' | '}' => break,
                '{' | '"' => return Err("a brace or quote inside an unquoted element"),
                '\\' => {
                    self.chars.next();
                    value.push(self.chars.next().ok_or("an unfinished escape")?);
                    quoted_or_escaped = true;
                    kept = value.len();
                }
                c => {
                    self.chars.next();
                    value.push(c);
                    if !(c.is_ascii() && is_c_space(c as u8)) {
                        kept = value.len();
                    }
                }
            }
        }
        value.truncate(kept);
        match value.as_str() {
            "" if !quoted_or_escaped => Err("an empty unquoted element"),
            v if !quoted_or_escaped && v.eq_ignore_ascii_case("null") => Ok(None),
            _ => Ok(Some(value)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Vec<Option<&'static str>> {
        parse_text(text).unwrap().into_iter().map(|e| e.map(|s| &*s.leak())).collect()
    }

    #[test]
    fn literals_come_apart_into_their_elements() {
        assert_eq!(parsed("{a,b}"), vec![Some("a"), Some("b")]);
        assert_eq!(parsed("  { a , \"b c\" ,NULL, \"NULL\", n\\ull }  "), vec![Some("a"), Some("b c"), None, Some("NULL"), Some("null")]);
        assert_eq!(parsed("{\"a\\\"b\",x\\,y,\" \"}"), vec![Some("a\"b"), Some("x,y"), Some(" ")]);
        assert_eq!(parsed("{a\\ , b}"), vec![Some("a "), Some("b")]);
        assert_eq!(parsed("{{1,2},{3,4}}"), vec![Some("1"), Some("2"), Some("3"), Some("4")]);
        assert_eq!(parsed("[0:1]={x,y}"), vec![Some("x"), Some("y")]);
        assert_eq!(parsed("{}"), Vec::<Option<&str>>::new());
    }

    #[test]
    fn what_array_in_refuses_is_refused() {
        for bad in ["a,b", "{a,b", "{a,,b}", "{a}x", "{{1,2},{3}}", "{{1},2}", "{a\"b}", "[1:2]{a,b}", "{\"a}"] {
            assert!(parse_text(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_hash_follows_hash_array_extended() {
        assert_eq!(combine([]), 1);
        assert_eq!(combine([None]), 31);
        assert_eq!(combine([Some(5), None]), (31 + 5) * 31);
    }
}
