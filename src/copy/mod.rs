//! COPY data formats: picking fields out of rows without parsing whole rows.

use std::borrow::Cow;

/// Field `index` of one row in COPY text format (tab-separated, backslash
/// escapes, `\N` for NULL, trailing newline optional). None for NULL or when the
/// row has fewer fields.
pub fn text_field(row: &[u8], index: usize) -> Option<Cow<'_, str>> {
    let row = row.strip_suffix(b"\n").unwrap_or(row);
    let row = row.strip_suffix(b"\r").unwrap_or(row);
    // An escaped tab is written as backslash-t, so a raw tab always separates fields.
    let raw = row.split(|&b| b == b'\t').nth(index)?;
    if raw == b"\\N" {
        return None;
    }
    if !raw.contains(&b'\\') {
        return Some(String::from_utf8_lossy(raw));
    }
    Some(Cow::Owned(unescape_text(raw)))
}

fn unescape_text(raw: &[u8]) -> String {
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
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_escapes() {
        let row = b"1\tab\\tc\t\\N\tx\\\\y\\101\n";
        assert_eq!(text_field(row, 0).as_deref(), Some("1"));
        assert_eq!(text_field(row, 1).as_deref(), Some("ab\tc"));
        assert_eq!(text_field(row, 2), None);
        assert_eq!(text_field(row, 3).as_deref(), Some("x\\yA"));
        assert_eq!(text_field(row, 4), None);
    }
}
