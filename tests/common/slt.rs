//! The `.slt` record format of the differential suite (described in
//! `tests/differential.rs`), shared with the corpus tests that read every
//! statement of the suite.

#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    StatementOk,
    StatementError(String),
    DistributedOk,
    Query { sort: bool, extended: Option<Vec<Option<String>>> },
    Unsupported,
}

#[derive(Debug)]
pub struct Record {
    pub line: usize,
    pub header: String,
    pub kind: Kind,
    pub sql: String,
}

fn parse_header(header: &str) -> Result<Kind, String> {
    let words: Vec<&str> = header.split_whitespace().collect();
    match words.as_slice() {
        ["statement", "ok"] => Ok(Kind::StatementOk),
        ["statement", "error", code] if code.len() == 5 && code.chars().all(|c| c.is_ascii_alphanumeric()) => {
            Ok(Kind::StatementError(code.to_uppercase()))
        }
        ["distributed", "ok"] => Ok(Kind::DistributedOk),
        ["unsupported"] => Ok(Kind::Unsupported),
        ["query", order, rest @ ..] => {
            let sort = match *order {
                "rowsort" => true,
                "nosort" => false,
                other => return Err(format!("unknown sort mode {other:?} (rowsort or nosort)")),
            };
            let extended = match rest {
                [] => None,
                ["extended", ..] => {
                    let params = header.split_once("extended").map(|(_, p)| p.trim()).unwrap_or("");
                    Some(if params.is_empty() {
                        Vec::new()
                    } else {
                        params
                            .split(',')
                            .map(|p| {
                                let p = p.trim();
                                (!p.eq_ignore_ascii_case("null")).then(|| p.to_string())
                            })
                            .collect()
                    })
                }
                other => return Err(format!("unexpected words after the sort mode: {other:?}")),
            };
            Ok(Kind::Query { sort, extended })
        }
        _ => Err(format!("unknown record header {header:?}")),
    }
}

pub fn parse_file(text: &str) -> Result<Vec<Record>, String> {
    let mut records = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let kind = parse_header(trimmed).map_err(|e| format!("line {}: {e}", i + 1))?;
        let mut sql = String::new();
        while let Some((_, l)) = lines.peek() {
            if l.trim().is_empty() {
                break;
            }
            let (_, l) = lines.next().unwrap();
            if l.trim_start().starts_with('#') {
                continue;
            }
            sql.push_str(l);
            sql.push('\n');
        }
        let sql = sql.trim_end().to_string();
        if sql.is_empty() {
            return Err(format!("line {}: record {trimmed:?} has no SQL", i + 1));
        }
        records.push(Record { line: i + 1, header: trimmed.to_string(), kind, sql });
    }
    Ok(records)
}

/// Every `tests/slt/*.slt` file, sorted by name.
pub fn suite_files() -> Vec<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/slt");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/slt")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "slt"))
        .collect();
    files.sort();
    files
}
