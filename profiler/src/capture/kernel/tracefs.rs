//! Field offsets of classic tracepoint records, from tracefs `format` files. They change
//! between kernel versions, so they are read at start-up, never compiled in.
use std::{collections::HashMap, path::PathBuf};

const ROOTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// `name -> offset` of one tracepoint's record fields.
pub type Fields = HashMap<String, u32>;

/// Parses the `field:TYPE NAME[N]; offset:O; size:S; signed:X;` lines of a format file.
pub fn parse_format(text: &str) -> Fields {
    let mut fields = Fields::new();
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("field:") else {
            continue;
        };
        let mut parts = rest.split(';').map(str::trim);
        let Some(decl) = parts.next() else { continue };
        let Some(name) = decl.split_whitespace().last() else {
            continue;
        };
        let name = name.split('[').next().unwrap_or(name);
        let offset = parts
            .find_map(|p| p.strip_prefix("offset:"))
            .and_then(|o| o.trim().parse().ok());
        if let Some(offset) = offset {
            fields.insert(name.to_string(), offset);
        }
    }
    fields
}

/// Overrides where tracepoint formats are read from: how tests stand in for a kernel that
/// lacks a tracepoint.
pub const ROOT_ENV: &str = "STALLSCOPE_TRACEFS";

/// Finds tracefs, mounting it at /sys/kernel/tracing when nothing is mounted.
pub fn root() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(ROOT_ENV) {
        return Some(PathBuf::from(dir));
    }
    let found = || {
        ROOTS
            .iter()
            .map(PathBuf::from)
            .find(|r| r.join("events").is_dir())
    };
    if let Some(r) = found() {
        return Some(r);
    }
    let _ = std::process::Command::new("mount")
        .args(["-t", "tracefs", "nodev", ROOTS[0]])
        .status();
    found()
}

/// Reads the record layout of `category/name`; `None` when the tracepoint does not exist.
pub fn fields(category: &str, name: &str) -> Option<Fields> {
    let path = root()?
        .join("events")
        .join(category)
        .join(name)
        .join("format");
    std::fs::read_to_string(path).ok().map(|t| parse_format(&t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_real_format_file() {
        let text = "name: block_rq_complete\nID: 1234\nformat:\n\
            \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
            \tfield:dev_t dev;\toffset:8;\tsize:4;\tsigned:0;\n\
            \tfield:sector_t sector;\toffset:16;\tsize:8;\tsigned:0;\n\
            \tfield:unsigned int nr_sector;\toffset:24;\tsize:4;\tsigned:0;\n\
            \tfield:char rwbs[8];\toffset:36;\tsize:8;\tsigned:0;\n\n\
            print fmt: \"%d,%d\", REC->dev\n";
        let f = parse_format(text);
        assert_eq!(f["dev"], 8);
        assert_eq!(f["sector"], 16);
        assert_eq!(f["nr_sector"], 24);
        assert_eq!(f["rwbs"], 36);
        assert_eq!(f.len(), 5);
    }
}
