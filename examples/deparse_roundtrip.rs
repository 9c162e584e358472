//! Round-trips every statement of the given SQL files through the parser and
//! the coordinator's deparser and reports how many come back as the same tree.
//!
//!     cargo run --release --example deparse_roundtrip -- path/to/*.sql
//!
//! Statements the parser refuses are not counted; with `-v` every statement
//! that does not come back equal is printed with its deparsed text.

use tessera::planner::deparse::{round_trip, RoundTrip};

fn main() {
    let mut verbose = false;
    let mut files = Vec::new();
    for arg in std::env::args().skip(1) {
        if arg == "-v" {
            verbose = true;
        } else {
            files.push(arg);
        }
    }
    let (mut parsed, mut equal) = (0usize, 0usize);
    for file in &files {
        let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{file}: {e}"));
        let text = String::from_utf8_lossy(&bytes);
        let statements = pg_query::split_with_scanner(&text).unwrap_or_default();
        for sql in statements {
            let outcome = round_trip(sql);
            if outcome == RoundTrip::NotParsed {
                continue;
            }
            parsed += 1;
            if outcome == RoundTrip::Equal {
                equal += 1;
            } else if verbose {
                println!("{file}: {}\n    {outcome:?}\n", sql.trim());
            }
        }
    }
    println!("{equal} of {parsed} statements round-trip ({} differ)", parsed - equal);
}
