//! Splits a COPY FROM stream into rows incrementally, at exactly the line ends
//! PostgreSQL 15's CopyReadLineText finds (backslash escapes in text format,
//! quotes in CSV, the first line's end fixing the newline style, the `\.`
//! end-of-data marker) or at binary tuple boundaries. Data arrives in pieces
//! of any size; only the row in progress is kept.

use super::{CopyFormat, Format};
use crate::error::sqlstate::BAD_COPY_FILE_FORMAT;
use crate::error::{PgError, PgResult};
use bytes::{Buf, Bytes, BytesMut};

const BINARY_SIGNATURE: &[u8; 11] = b"PGCOPY\n\xff\r\n\0";
/// Signature, flags and header-extension length.
const BINARY_HEADER_LEN: usize = 19;
/// Ends binary COPY data: a tuple with field count -1.
pub const BINARY_TRAILER: [u8; 2] = [0xff, 0xff];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Eol {
    Unknown,
    Nl,
    Cr,
    CrNl,
}

impl Eol {
    fn bytes(self) -> &'static [u8] {
        match self {
            Eol::Unknown | Eol::Nl => b"\n",
            Eol::Cr => b"\r",
            Eol::CrNl => b"\r\n",
        }
    }
}

/// One row of input, as it came.
#[derive(Debug)]
pub struct Row {
    /// The row with its line end; a last line that had none gets one, so
    /// that rows can be concatenated.
    pub data: Bytes,
    /// Bytes of `data` before the line end.
    pub content_len: usize,
    /// PostgreSQL's line number for the row: the header is line 1, and in CSV
    /// the line ends inside quoted fields count too (binary: the tuple's number).
    pub line: u64,
    /// Line feeds and carriage returns inside quoted CSV fields, from which
    /// the line numbers another server gives this row can be worked out.
    pub quoted_newlines: u32,
    pub quoted_returns: u32,
}

impl Row {
    pub fn content(&self) -> &[u8] {
        &self.data[..self.content_len]
    }
}

/// A row still in the reader's buffer, lent until the reader is next used:
/// a caller that copies rows on anyway saves taking each one out.
#[derive(Debug)]
pub struct RowInPlace<'a> {
    /// The row with its line end (one is added to a last line that had none).
    pub data: &'a [u8],
    pub content_len: usize,
    pub line: u64,
}

impl RowInPlace<'_> {
    pub fn content(&self) -> &[u8] {
        &self.data[..self.content_len]
    }
}

/// Where the next row lies: the first `end` bytes of the buffer.
struct Span {
    end: usize,
    content_len: usize,
    line: u64,
    quoted_newlines: u32,
    quoted_returns: u32,
}

/// Where the scan of the row in progress stands.
#[derive(Default)]
struct Scan {
    pos: usize,
    in_quote: bool,
    last_was_esc: bool,
    newlines: u32,
    returns: u32,
}

enum Scanned {
    NeedMore,
    /// A complete line: its end in the buffer and the length before the line end.
    Line {
        end: usize,
        content_len: usize,
    },
    /// The end-of-data marker, after `content_len` bytes of a last row.
    EndMarker {
        content_len: usize,
    },
}

enum Marker {
    NeedMore,
    End,
    Absent,
}

pub struct RowReader {
    format: CopyFormat,
    /// Fields every binary tuple must have.
    fields: usize,
    buf: BytesMut,
    eol: Eol,
    line: u64,
    header: Option<Bytes>,
    header_done: bool,
    scan: Scan,
    /// Past the end-of-data marker or binary trailer: the rest is not data.
    ended: bool,
    data_after_trailer: bool,
    at_eof: bool,
    /// Bytes at the front of the buffer lent out as the last `RowInPlace`,
    /// dropped when the reader is next used.
    lent: usize,
}

impl RowReader {
    pub fn new(format: CopyFormat, fields: usize) -> Self {
        let header_done = !format.header && format.format != Format::Binary;
        RowReader {
            format,
            fields,
            buf: BytesMut::with_capacity(64 * 1024),
            eol: Eol::Unknown,
            line: 0,
            header: None,
            header_done,
            scan: Scan::default(),
            ended: false,
            data_after_trailer: false,
            at_eof: false,
            lent: 0,
        }
    }

    /// Adds input; `next` then returns the rows it completes.
    pub fn push(&mut self, data: &[u8]) {
        self.take_back_lent();
        if self.ended {
            // PostgreSQL ignores whatever follows `\.`, but not data after a binary trailer.
            self.data_after_trailer |= self.format.is_binary() && !data.is_empty();
            return;
        }
        self.buf.extend_from_slice(data);
    }

    /// No more input: what remains is the last row.
    pub fn finish(&mut self) {
        self.at_eof = true;
    }

    /// The header line (text, CSV) or the file header (binary), once read:
    /// every server the rows are sent on to needs it in front of them.
    pub fn header(&self) -> Option<&Bytes> {
        self.header.as_ref()
    }

    /// Whether lines end in a bare line feed (as far as seen so far).
    pub fn lines_end_in_line_feed(&self) -> bool {
        self.eol == Eol::Nl
    }

    /// The line number of the row being read, for errors about it.
    pub fn current_line(&self) -> u64 {
        self.line + 1
    }

    /// The next complete row; None until more input arrives (or, after
    /// `finish`, when there are no more rows).
    pub fn next_row(&mut self) -> PgResult<Option<Row>> {
        self.take_back_lent();
        let Some(span) = self.next_span()? else { return Ok(None) };
        let data = self.buf.split_to(span.end).freeze();
        Ok(Some(Row {
            data,
            content_len: span.content_len,
            line: span.line,
            quoted_newlines: span.quoted_newlines,
            quoted_returns: span.quoted_returns,
        }))
    }

    /// As `next`, but the row stays in the reader's buffer until the reader
    /// is used again.
    pub fn next_in_place(&mut self) -> PgResult<Option<RowInPlace<'_>>> {
        self.take_back_lent();
        let Some(span) = self.next_span()? else { return Ok(None) };
        self.lent = span.end;
        Ok(Some(RowInPlace { data: &self.buf[..span.end], content_len: span.content_len, line: span.line }))
    }

    fn take_back_lent(&mut self) {
        self.buf.advance(std::mem::take(&mut self.lent));
    }

    fn next_span(&mut self) -> PgResult<Option<Span>> {
        if self.data_after_trailer {
            return Err(PgError::new(BAD_COPY_FILE_FORMAT, "received copy data after EOF marker"));
        }
        if self.ended {
            return Ok(None);
        }
        if self.format.is_binary() {
            return self.next_tuple();
        }
        loop {
            let eol_at_start = self.eol;
            let (end, content_len) = match self.scan_line()? {
                Scanned::NeedMore if !self.at_eof || self.buf.is_empty() => return Ok(None),
                Scanned::NeedMore => {
                    let content_len = self.buf.len();
                    (self.terminate(content_len), content_len)
                }
                Scanned::Line { end, content_len } => (end, content_len),
                Scanned::EndMarker { content_len } => {
                    self.ended = true;
                    if content_len == 0 {
                        return Ok(None);
                    }
                    (self.terminate(content_len), content_len)
                }
            };
            let scan = std::mem::take(&mut self.scan);
            // PostgreSQL compares quoted characters with the line end it knows
            // when it meets them; a carriage return while it knows none.
            let embedded = if eol_at_start == Eol::Nl { scan.newlines } else { scan.returns };
            self.line += 1 + u64::from(embedded);
            if !self.header_done {
                self.header_done = true;
                self.header = Some(self.buf.split_to(end).freeze());
                continue;
            }
            return Ok(Some(Span { end, content_len, line: self.line, quoted_newlines: scan.newlines, quoted_returns: scan.returns }));
        }
    }

    /// Cuts the buffer after its first `content_len` bytes and ends that last
    /// row with the line end; returns the row's length.
    fn terminate(&mut self, content_len: usize) -> usize {
        self.buf.truncate(content_len);
        self.buf.extend_from_slice(self.eol.bytes());
        self.buf.len()
    }

    fn scan_line(&mut self) -> PgResult<Scanned> {
        let csv = self.format.format == Format::Csv;
        let quote = self.format.quote;
        // An escape equal to the quote needs no handling of its own.
        let escape = (self.format.escape != quote).then_some(self.format.escape);
        let buf = &self.buf[..];
        let s = &mut self.scan;
        loop {
            let Some(&c) = buf.get(s.pos) else { return Ok(Scanned::NeedMore) };
            let next = buf.get(s.pos + 1).copied();
            let need_lookahead = next.is_none() && !self.at_eof;
            if csv {
                if (c == b'\\' || c == b'\r') && need_lookahead {
                    return Ok(Scanned::NeedMore);
                }
                if s.in_quote && Some(c) == escape {
                    s.last_was_esc = !s.last_was_esc;
                }
                if c == quote && !s.last_was_esc {
                    s.in_quote = !s.in_quote;
                }
                if Some(c) != escape {
                    s.last_was_esc = false;
                }
                if s.in_quote {
                    s.newlines += u32::from(c == b'\n');
                    s.returns += u32::from(c == b'\r');
                }
            }
            let quoted = csv && s.in_quote;
            if c == b'\r' && !quoted {
                let end = match self.eol {
                    Eol::Unknown | Eol::CrNl => {
                        if need_lookahead {
                            return Ok(Scanned::NeedMore);
                        }
                        if next == Some(b'\n') {
                            self.eol = Eol::CrNl;
                            s.pos + 2
                        } else if self.eol == Eol::CrNl {
                            return Err(stray_return(csv));
                        } else {
                            self.eol = Eol::Cr;
                            s.pos + 1
                        }
                    }
                    Eol::Nl => return Err(stray_return(csv)),
                    Eol::Cr => s.pos + 1,
                };
                return Ok(Scanned::Line { end, content_len: s.pos });
            }
            if c == b'\n' && !quoted {
                if matches!(self.eol, Eol::Cr | Eol::CrNl) {
                    return Err(stray_newline(csv));
                }
                self.eol = Eol::Nl;
                return Ok(Scanned::Line { end: s.pos + 1, content_len: s.pos });
            }
            if c == b'\\' && (!csv || s.pos == 0) {
                if need_lookahead {
                    return Ok(Scanned::NeedMore);
                }
                match next {
                    Some(b'.') => match end_marker(&buf[s.pos + 2..], self.eol, csv, self.at_eof)? {
                        Marker::NeedMore => return Ok(Scanned::NeedMore),
                        Marker::End => return Ok(Scanned::EndMarker { content_len: s.pos }),
                        Marker::Absent => {}
                    },
                    // Whatever follows a backslash in text format is data, line ends included.
                    Some(_) if !csv => {
                        s.pos += 2;
                        continue;
                    }
                    _ => {}
                }
            }
            if csv && !s.in_quote {
                // Outside quotes only the quote and line ends matter (a
                // backslash only at the start of the line, seen above).
                s.pos += 1 + memchr::memchr3(quote, b'\n', b'\r', &buf[s.pos + 1..]).unwrap_or(buf.len() - s.pos - 1);
            } else if csv {
                s.pos += 1;
            } else {
                // Only backslashes and line ends matter in text format.
                s.pos += 1 + memchr::memchr3(b'\\', b'\n', b'\r', &buf[s.pos + 1..]).unwrap_or(buf.len() - s.pos - 1);
            }
        }
    }

    fn next_tuple(&mut self) -> PgResult<Option<Span>> {
        if !self.header_done {
            let Some(extension) = self.binary_header()? else { return Ok(None) };
            self.header = Some(self.buf.split_to(BINARY_HEADER_LEN + extension).freeze());
            self.header_done = true;
        }
        // A partial field count at the end is taken for the end, as PostgreSQL does.
        let Some(count) = self.buf.get(..2).map(|b| i16::from_be_bytes([b[0], b[1]])) else { return Ok(None) };
        if count == -1 {
            self.buf.advance(2);
            self.ended = true;
            self.data_after_trailer = !self.buf.is_empty();
            return self.next_span();
        }
        if count < 0 || count as usize != self.fields {
            return Err(PgError::new(BAD_COPY_FILE_FORMAT, format!("row field count is {count}, expected {}", self.fields)));
        }
        let mut at = 2;
        for _ in 0..count {
            let Some(len) = self.buf.get(at..at + 4).map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]])) else { return self.incomplete_tuple() };
            at += 4;
            if len < -1 {
                return Err(PgError::new(BAD_COPY_FILE_FORMAT, "invalid field size"));
            }
            at += len.max(0) as usize;
            if at > self.buf.len() {
                return self.incomplete_tuple();
            }
        }
        self.line += 1;
        Ok(Some(Span { end: at, content_len: at, line: self.line, quoted_newlines: 0, quoted_returns: 0 }))
    }

    fn incomplete_tuple(&self) -> PgResult<Option<Span>> {
        if self.at_eof {
            return Err(PgError::new(BAD_COPY_FILE_FORMAT, "unexpected EOF in COPY data"));
        }
        Ok(None)
    }

    /// Checks the binary file header; returns its extension's length once
    /// all of it has arrived.
    fn binary_header(&self) -> PgResult<Option<usize>> {
        let bad = |why: &str| PgError::new(BAD_COPY_FILE_FORMAT, why.to_string());
        if self.buf.len() < BINARY_HEADER_LEN {
            if self.at_eof {
                return Err(bad("COPY file signature not recognized"));
            }
            return Ok(None);
        }
        if &self.buf[..11] != BINARY_SIGNATURE {
            return Err(bad("COPY file signature not recognized"));
        }
        let word = |at: usize| i32::from_be_bytes([self.buf[at], self.buf[at + 1], self.buf[at + 2], self.buf[at + 3]]);
        let flags = word(11);
        if flags & (1 << 16) != 0 {
            return Err(bad("invalid COPY file header (WITH OIDS)"));
        }
        if flags >> 16 != 0 {
            return Err(bad("unrecognized critical flags in COPY file header"));
        }
        let extension = word(15);
        if extension < 0 {
            return Err(bad("invalid COPY file header (missing length)"));
        }
        if self.buf.len() < BINARY_HEADER_LEN + extension as usize {
            if self.at_eof {
                return Err(bad("invalid COPY file header (wrong length)"));
            }
            return Ok(None);
        }
        Ok(Some(extension as usize))
    }
}

/// Whether `\.` ends the data: it must be followed by the line end (then
/// everything after it is ignored). In CSV, anything else makes it data; in
/// text format, an error.
fn end_marker(rest: &[u8], eol: Eol, csv: bool, at_eof: bool) -> PgResult<Marker> {
    let corrupt = |message: &str| if csv { Ok(Marker::Absent) } else { Err(PgError::new(BAD_COPY_FILE_FORMAT, message.to_string())) };
    let mut i = 0;
    let mut next = || {
        let c = rest.get(i).copied();
        i += 1;
        c
    };
    if eol == Eol::CrNl {
        match next() {
            None if !at_eof => return Ok(Marker::NeedMore),
            Some(b'\n') => return corrupt("end-of-copy marker does not match previous newline style"),
            Some(b'\r') => {}
            _ => return corrupt("end-of-copy marker corrupt"),
        }
    }
    let c = match next() {
        None if !at_eof => return Ok(Marker::NeedMore),
        Some(c @ (b'\r' | b'\n')) => c,
        _ => return corrupt("end-of-copy marker corrupt"),
    };
    let matches = match eol {
        Eol::Nl | Eol::CrNl => c == b'\n',
        Eol::Cr => c == b'\r',
        Eol::Unknown => true,
    };
    if !matches {
        return Err(PgError::new(BAD_COPY_FILE_FORMAT, "end-of-copy marker does not match previous newline style"));
    }
    Ok(Marker::End)
}

fn stray_return(csv: bool) -> PgError {
    if csv {
        PgError::new(BAD_COPY_FILE_FORMAT, "unquoted carriage return found in data").with_hint("Use quoted CSV field to represent carriage return.")
    } else {
        PgError::new(BAD_COPY_FILE_FORMAT, "literal carriage return found in data").with_hint("Use \"\\r\" to represent carriage return.")
    }
}

fn stray_newline(csv: bool) -> PgError {
    if csv {
        PgError::new(BAD_COPY_FILE_FORMAT, "unquoted newline found in data").with_hint("Use quoted CSV field to represent newline.")
    } else {
        PgError::new(BAD_COPY_FILE_FORMAT, "literal newline found in data").with_hint("Use \"\\n\" to represent newline.")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` in pieces of `piece` bytes; returns (header, rows as (data, line)).
    type Header = Option<Vec<u8>>;
    type RowsAndLines = Vec<(Vec<u8>, u64)>;

    fn read(format: CopyFormat, input: &[u8], piece: usize) -> PgResult<(Header, RowsAndLines)> {
        let mut reader = RowReader::new(format, 2);
        let mut rows = Vec::new();
        for chunk in input.chunks(piece.max(1)) {
            reader.push(chunk);
            while let Some(row) = reader.next_row()? {
                rows.push((row.data.to_vec(), row.line));
            }
        }
        reader.finish();
        while let Some(row) = reader.next_row()? {
            rows.push((row.data.to_vec(), row.line));
        }
        Ok((reader.header().map(|h| h.to_vec()), rows))
    }

    /// As `read`, through `next_in_place`.
    fn read_in_place(format: CopyFormat, input: &[u8], piece: usize) -> PgResult<Vec<(Vec<u8>, u64)>> {
        let mut reader = RowReader::new(format, 2);
        let mut rows = Vec::new();
        for chunk in input.chunks(piece.max(1)) {
            reader.push(chunk);
            while let Some(row) = reader.next_in_place()? {
                rows.push((row.data.to_vec(), row.line));
            }
        }
        reader.finish();
        while let Some(row) = reader.next_in_place()? {
            rows.push((row.data.to_vec(), row.line));
        }
        Ok(rows)
    }

    fn rows(format: CopyFormat, input: &[u8]) -> Vec<(Vec<u8>, u64)> {
        let whole = read(format.clone(), input, input.len()).unwrap();
        for piece in [1, 2, 3, 7, input.len()] {
            assert_eq!(read(format.clone(), input, piece).unwrap(), whole, "split into pieces of {piece}");
            assert_eq!(read_in_place(format.clone(), input, piece).unwrap(), whole.1, "in place, pieces of {piece}");
        }
        whole.1
    }

    fn text() -> CopyFormat {
        CopyFormat::new(Format::Text)
    }

    fn csv() -> CopyFormat {
        CopyFormat::new(Format::Csv)
    }

    fn owned(rows: &[(&[u8], u64)]) -> Vec<(Vec<u8>, u64)> {
        rows.iter().map(|(d, l)| (d.to_vec(), *l)).collect()
    }

    #[test]
    fn text_lines_and_escaped_line_ends() {
        assert_eq!(rows(text(), b"1\ta\n2\tb\\\nc\n3\tlast"), owned(&[(b"1\ta\n", 1), (b"2\tb\\\nc\n", 2), (b"3\tlast\n", 3)]));
        assert_eq!(rows(text(), b"1\r\n2\r\n"), owned(&[(b"1\r\n", 1), (b"2\r\n", 2)]));
        assert_eq!(rows(text(), b"1\r2\r"), owned(&[(b"1\r", 1), (b"2\r", 2)]));
        assert!(read(text(), b"1\n2\r\n", 100).is_err(), "a carriage return after newline-ended lines");
    }

    #[test]
    fn end_of_data_marker() {
        assert_eq!(rows(text(), b"1\n\\.\nignored\n"), owned(&[(b"1\n", 1)]));
        assert_eq!(rows(text(), b"1\nlast\\.\n"), owned(&[(b"1\n", 1), (b"last\n", 2)]));
        assert_eq!(rows(text(), b"a\\\\.\n"), owned(&[(b"a\\\\.\n", 1)]));
        assert!(read(text(), b"1\n\\.x\n", 100).is_err());
        assert_eq!(rows(csv(), b"1,a\n\\.\n2,b\n"), owned(&[(b"1,a\n", 1)]));
        assert_eq!(rows(csv(), b"\\.x,a\n2,\\.\n"), owned(&[(b"\\.x,a\n", 1), (b"2,\\.\n", 2)]));
    }

    #[test]
    fn csv_quoted_line_ends_and_line_numbers() {
        let input = b"h1,h2\n1,\"a\nb\"\n2,\"x\"\"\ny\"\n3,z\n";
        let mut format = csv();
        format.header = true;
        let (header, got) = read(format.clone(), input, 5).unwrap();
        assert_eq!(header.as_deref(), Some(&b"h1,h2\n"[..]));
        assert_eq!(got, rows(format, input));
        assert_eq!(got, owned(&[(b"1,\"a\nb\"\n", 3), (b"2,\"x\"\"\ny\"\n", 5), (b"3,z\n", 6)]));
        let mut escaped = csv();
        escaped.escape = b'\\';
        // On the first line PostgreSQL does not know the newline style yet and
        // counts no quoted line feed.
        assert_eq!(rows(escaped, b"1,\"a\\\"\nb\"\n2,c\n"), owned(&[(b"1,\"a\\\"\nb\"\n", 1), (b"2,c\n", 2)]));
    }

    #[test]
    fn binary_tuples() {
        let mut input = BINARY_SIGNATURE.to_vec();
        input.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]);
        let tuple = |a: i32, b: Option<&[u8]>| {
            let mut t = vec![0u8, 2];
            t.extend_from_slice(&4i32.to_be_bytes());
            t.extend_from_slice(&a.to_be_bytes());
            match b {
                Some(b) => {
                    t.extend_from_slice(&(b.len() as i32).to_be_bytes());
                    t.extend_from_slice(b);
                }
                None => t.extend_from_slice(&(-1i32).to_be_bytes()),
            }
            t
        };
        input.extend(tuple(1, Some(b"abc")));
        input.extend(tuple(2, None));
        input.extend_from_slice(&BINARY_TRAILER);
        let format = CopyFormat::new(Format::Binary);
        let (header, _) = read(format.clone(), &input, 3).unwrap();
        assert_eq!(header.map(|h| h.len()), Some(BINARY_HEADER_LEN));
        assert_eq!(rows(format.clone(), &input), vec![(tuple(1, Some(b"abc")), 1), (tuple(2, None), 2)]);
        let mut extra = input.clone();
        extra.push(0);
        assert!(read(format.clone(), &extra, 100).is_err(), "data after the trailer");
        assert!(read(format, &input[..input.len() - 5], 100).is_err(), "a cut tuple");
    }
}
