//! COPY data formats, read the way PostgreSQL 15 reads them: rows split at the
//! same line ends (`reader`), and single fields picked out of a row without
//! parsing the rest of it, so the coordinator can route rows by one column.

mod reader;

pub use reader::{Row, RowInPlace, RowReader, BINARY_TRAILER};

/// A shard's rows go out once this much has piled up, as one COPY statement.
pub const BATCH_BYTES: usize = 256 * 1024;
/// COPY statements a node may have queued before the sender waits for it:
/// bounds what is in flight while keeping every node busy.
pub const MAX_IN_FLIGHT: usize = 8;

use crate::error::sqlstate::BAD_COPY_FILE_FORMAT;
use crate::error::{PgError, PgResult};
use std::borrow::Cow;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Csv,
    Binary,
}

/// The options of a COPY statement that decide how its data is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyFormat {
    pub format: Format,
    pub delimiter: u8,
    /// The NULL marker, compared with a field's raw (still escaped) bytes.
    pub null: Vec<u8>,
    pub quote: u8,
    pub escape: u8,
    /// The first line names the columns (text and CSV).
    pub header: bool,
}

impl CopyFormat {
    /// PostgreSQL's defaults for a format.
    pub fn new(format: Format) -> Self {
        let csv = format == Format::Csv;
        CopyFormat {
            format,
            delimiter: if csv { b',' } else { b'\t' },
            null: if csv { Vec::new() } else { b"\\N".to_vec() },
            quote: b'"',
            escape: b'"',
            header: false,
        }
    }

    pub fn is_binary(&self) -> bool {
        self.format == Format::Binary
    }
}

/// The field a row is routed by, and how CSV's FORCE_NULL / FORCE_NOT_NULL
/// options treat it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct KeyField {
    pub index: usize,
    pub force_null: bool,
    pub force_not_null: bool,
}

/// Field `key.index` of a row's content (without its line end), as the
/// column's input function would receive it: None for NULL.
pub fn field<'a>(format: &CopyFormat, content: &'a [u8], key: KeyField) -> PgResult<Option<Cow<'a, [u8]>>> {
    match format.format {
        Format::Text => text_field_raw(content, format.delimiter, key.index).map(|raw| (raw != format.null.as_slice()).then(|| unescape_text(raw))),
        Format::Csv => csv_field(format, content, key),
        Format::Binary => binary_field(content, key.index).map(|v| v.map(Cow::Borrowed)),
    }
}

/// Appends a value as one text or CSV field that PostgreSQL reads back as
/// `value` (None: NULL), escaping or quoting whatever the format needs.
/// Binary rows are never written this way; they get the text form.
pub fn write_field(format: &CopyFormat, value: Option<&[u8]>, out: &mut bytes::BytesMut) {
    let Some(value) = value else {
        out.extend_from_slice(&format.null);
        return;
    };
    match format.format {
        Format::Csv => {
            out.extend_from_slice(&[format.quote]);
            for &b in value {
                if b == format.quote || b == format.escape {
                    out.extend_from_slice(&[format.escape]);
                }
                out.extend_from_slice(&[b]);
            }
            out.extend_from_slice(&[format.quote]);
        }
        Format::Text | Format::Binary => {
            for &b in value {
                match b {
                    b'\\' => out.extend_from_slice(b"\\\\"),
                    b'\n' => out.extend_from_slice(b"\\n"),
                    b'\r' => out.extend_from_slice(b"\\r"),
                    b'\t' => out.extend_from_slice(b"\\t"),
                    _ if b == format.delimiter => out.extend_from_slice(&[b'\\', b]),
                    _ => out.extend_from_slice(&[b]),
                }
            }
        }
    }
}

fn missing_field() -> PgError {
    PgError::new(BAD_COPY_FILE_FORMAT, "missing data for the distribution column")
}

/// Field `index` of one row in the default text format (tab-separated,
/// backslash escapes, `\N` for NULL, trailing newline optional). None for NULL
/// or when the row has fewer fields.
pub fn text_field(row: &[u8], index: usize) -> Option<Cow<'_, str>> {
    let row = row.strip_suffix(b"\n").unwrap_or(row);
    let row = row.strip_suffix(b"\r").unwrap_or(row);
    let raw = text_field_raw(row, b'\t', index).ok().filter(|raw| *raw != b"\\N")?;
    Some(match unescape_text(raw) {
        Cow::Borrowed(b) => String::from_utf8_lossy(b),
        Cow::Owned(b) => Cow::Owned(String::from_utf8_lossy(&b).into_owned()),
    })
}

/// The raw bytes of text-format field `index`: a delimiter preceded by a
/// backslash is data, as in PostgreSQL's CopyReadAttributesText.
fn text_field_raw(content: &[u8], delimiter: u8, index: usize) -> PgResult<&[u8]> {
    let mut start = 0;
    let mut field = 0;
    let mut i = 0;
    while i < content.len() {
        let b = content[i];
        if b == b'\\' {
            i += 2;
            continue;
        }
        if b == delimiter {
            if field == index {
                return Ok(&content[start..i]);
            }
            field += 1;
            start = i + 1;
        }
        i += 1;
    }
    if field == index {
        Ok(&content[start..])
    } else {
        Err(missing_field())
    }
}

fn unescape_text(raw: &[u8]) -> Cow<'_, [u8]> {
    if !raw.contains(&b'\\') {
        return Cow::Borrowed(raw);
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b != b'\\' || i + 1 == raw.len() {
            out.push(b);
            i += 1;
            continue;
        }
        let next = raw[i + 1];
        i += 2;
        match next {
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut value = (next - b'0') as u32;
                let mut digits = 1;
                while digits < 3 && i < raw.len() && (b'0'..=b'7').contains(&raw[i]) {
                    value = value * 8 + (raw[i] - b'0') as u32;
                    i += 1;
                    digits += 1;
                }
                out.push(value as u8);
            }
            b'x' if i < raw.len() && raw[i].is_ascii_hexdigit() => {
                let mut value = 0u32;
                let mut digits = 0;
                while digits < 2 && i < raw.len() && raw[i].is_ascii_hexdigit() {
                    value = value * 16 + (raw[i] as char).to_digit(16).unwrap();
                    i += 1;
                    digits += 1;
                }
                out.push(value as u8);
            }
            other => out.push(other),
        }
    }
    Cow::Owned(out)
}

/// CSV field `key.index`, following PostgreSQL's CopyReadAttributesCSV: quotes
/// may open and close anywhere in a field, the escape character only escapes
/// a quote or itself inside quotes, and only an unquoted field equal to the
/// NULL marker is NULL (FORCE_NULL / FORCE_NOT_NULL change that).
fn csv_field<'a>(format: &CopyFormat, content: &'a [u8], key: KeyField) -> PgResult<Option<Cow<'a, [u8]>>> {
    let (quote, escape, delimiter) = (format.quote, format.escape, format.delimiter);
    let mut i = 0;
    let mut field = 0;
    loop {
        let start = i;
        let mut saw_quote = false;
        // Only the key field's value is built; the others are only skipped.
        let wanted = field == key.index;
        let mut value: Vec<u8> = Vec::new();
        let mut found_delimiter = false;
        'field: loop {
            // Outside quotes.
            loop {
                if i >= content.len() {
                    break 'field;
                }
                let c = content[i];
                i += 1;
                if c == delimiter {
                    found_delimiter = true;
                    break 'field;
                }
                if c == quote {
                    saw_quote = true;
                    break;
                }
                if wanted {
                    value.push(c);
                }
            }
            // Inside quotes.
            loop {
                if i >= content.len() {
                    return Err(PgError::new(BAD_COPY_FILE_FORMAT, "unterminated CSV quoted field"));
                }
                let c = content[i];
                i += 1;
                if c == escape && i < content.len() && (content[i] == escape || content[i] == quote) {
                    if wanted {
                        value.push(content[i]);
                    }
                    i += 1;
                    continue;
                }
                if c == quote {
                    break;
                }
                if wanted {
                    value.push(c);
                }
            }
        }
        if wanted {
            let end = if found_delimiter { i - 1 } else { i };
            let raw = &content[start..end];
            let is_null_marker = |v: &[u8]| v == format.null.as_slice();
            let null = !saw_quote && is_null_marker(raw);
            return Ok(match (null, key.force_not_null, key.force_null) {
                (true, true, _) => Some(Cow::Owned(format.null.clone())),
                (true, false, _) => None,
                (false, _, true) if is_null_marker(&value) => None,
                // Unquoted: the raw bytes are the value.
                (false, _, _) if !saw_quote => Some(Cow::Borrowed(raw)),
                (false, _, _) => Some(Cow::Owned(value)),
            });
        }
        if !found_delimiter {
            return Err(missing_field());
        }
        field += 1;
    }
}

/// Field `index` of one binary-format tuple (its field count already checked).
fn binary_field(tuple: &[u8], index: usize) -> PgResult<Option<&[u8]>> {
    let corrupt = || PgError::new(BAD_COPY_FILE_FORMAT, "invalid binary COPY tuple");
    let mut at = 2;
    for i in 0.. {
        let len_bytes: [u8; 4] = tuple.get(at..at + 4).and_then(|b| b.try_into().ok()).ok_or_else(corrupt)?;
        let len = i32::from_be_bytes(len_bytes);
        at += 4;
        let value = if len < 0 {
            None
        } else {
            let v = tuple.get(at..at + len as usize).ok_or_else(corrupt)?;
            at += len as usize;
            Some(v)
        };
        if i == index {
            return Ok(value);
        }
    }
    unreachable!()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(index: usize) -> KeyField {
        KeyField { index, ..Default::default() }
    }

    fn text(content: &[u8], index: usize) -> Option<Vec<u8>> {
        field(&CopyFormat::new(Format::Text), content, key(index)).unwrap().map(|v| v.into_owned())
    }

    fn csv(format: &CopyFormat, content: &[u8], k: KeyField) -> Option<Vec<u8>> {
        field(format, content, k).unwrap().map(|v| v.into_owned())
    }

    #[test]
    fn written_fields_read_back_as_written() {
        let mut pipe = CopyFormat::new(Format::Text);
        pipe.delimiter = b'|';
        let mut semicolon_csv = CopyFormat::new(Format::Csv);
        semicolon_csv.delimiter = b';';
        let values: [&[u8]; 6] = [b"42", b"a\tb", b"x|y;z", b"line\nend\r", b"back\\slash \"quoted\"", b""];
        for format in [CopyFormat::new(Format::Text), pipe, CopyFormat::new(Format::Csv), semicolon_csv] {
            for value in values {
                let mut row = bytes::BytesMut::from(&b"first"[..]);
                row.extend_from_slice(&[format.delimiter]);
                write_field(&format, Some(value), &mut row);
                assert_eq!(field(&format, &row, key(1)).unwrap().as_deref(), Some(value), "{format:?}");
            }
            let mut row = bytes::BytesMut::from(&b"first"[..]);
            row.extend_from_slice(&[format.delimiter]);
            write_field(&format, None, &mut row);
            assert_eq!(field(&format, &row, key(1)).unwrap(), None, "{format:?}");
        }
    }

    #[test]
    fn default_text_fields_and_escapes() {
        let row = b"1\tab\\tc\t\\N\tx\\\\y\\101\n";
        assert_eq!(text_field(row, 0).as_deref(), Some("1"));
        assert_eq!(text_field(row, 1).as_deref(), Some("ab\tc"));
        assert_eq!(text_field(row, 2), None);
        assert_eq!(text_field(row, 3).as_deref(), Some("x\\yA"));
        assert_eq!(text_field(row, 4), None);
    }

    #[test]
    fn text_fields_with_escaped_delimiters() {
        assert_eq!(text(b"a\\\tb\tc", 1), Some(b"c".to_vec()));
        assert_eq!(text(b"a\\\tb\tc", 0), Some(b"a\tb".to_vec()));
        assert_eq!(text(b"\tx", 0), Some(b"".to_vec()));
        assert!(field(&CopyFormat::new(Format::Text), b"a\tb", key(2)).is_err());
        let mut pipe = CopyFormat::new(Format::Text);
        pipe.delimiter = b'|';
        pipe.null = b"NULL".to_vec();
        assert_eq!(field(&pipe, b"1|NULL", key(1)).unwrap(), None);
        assert_eq!(field(&pipe, b"1|\\N", key(1)).unwrap().as_deref(), Some(&b"N"[..]));
    }

    #[test]
    fn csv_quotes_nulls_and_forcing() {
        let f = CopyFormat::new(Format::Csv);
        assert_eq!(csv(&f, b"1,\"a,b\",c", key(1)), Some(b"a,b".to_vec()));
        assert_eq!(csv(&f, b"1,\"a,b\",c", key(2)), Some(b"c".to_vec()));
        assert_eq!(csv(&f, b"\"he said \"\"hi\"\"\",x", key(0)), Some(b"he said \"hi\"".to_vec()));
        assert_eq!(csv(&f, b"1,,3", key(1)), None);
        assert_eq!(csv(&f, b"1,\"\",3", key(1)), Some(Vec::new()));
        assert_eq!(csv(&f, b"a\"b,c\"d,e", key(0)), Some(b"ab,cd".to_vec()));
        assert_eq!(csv(&f, b"1,,3", KeyField { index: 1, force_not_null: true, force_null: false }), Some(Vec::new()));
        assert_eq!(csv(&f, b"1,\"\",3", KeyField { index: 1, force_not_null: false, force_null: true }), None);
        let mut esc = CopyFormat::new(Format::Csv);
        esc.escape = b'\\';
        assert_eq!(csv(&esc, b"\"a\\\"b\\\\c\\d\"", key(0)), Some(b"a\"b\\c\\d".to_vec()));
        assert!(field(&f, b"\"open", key(0)).is_err());
    }

    #[test]
    fn binary_fields() {
        let mut tuple = vec![0, 2];
        tuple.extend_from_slice(&4i32.to_be_bytes());
        tuple.extend_from_slice(&7i32.to_be_bytes());
        tuple.extend_from_slice(&(-1i32).to_be_bytes());
        let f = CopyFormat::new(Format::Binary);
        assert_eq!(field(&f, &tuple, key(0)).unwrap().as_deref(), Some(&7i32.to_be_bytes()[..]));
        assert_eq!(field(&f, &tuple, key(1)).unwrap(), None);
    }
}
