//! Golden reports from the hand-built fixture, written and read back through the file format.
//! Regenerate with `STALLSCOPE_BLESS=1 cargo test -p profiler-core --test golden`.
mod common;

use common::{assert_golden, encode, fixture};
use profiler_core::report::{flamegraph as folded, json as report_json, text as report_text};
use profiler_core::{Analyzed, load_reader};

fn analyzed(bytes: &[u8]) -> Analyzed {
    let (folded, info) = load_reader(bytes).unwrap();
    folded.analyzed(info)
}

fn loaded() -> Analyzed {
    analyzed(&encode(&fixture()))
}

#[test]
fn text_report() {
    assert_golden("report.txt", &report_text::to_text(&loaded().report()));
}

#[test]
fn json_report() {
    let mut out = Vec::new();
    report_json::write_json(&loaded().report(), &mut out).unwrap();
    assert_golden("report.json", &String::from_utf8(out).unwrap());
}

#[test]
fn folded_stacks() {
    let analysis = loaded().analysis;
    assert_golden(
        "on_cpu.folded",
        &(folded::on_cpu_folded(&analysis).join("\n") + "\n"),
    );
    assert_golden(
        "off_cpu.folded",
        &(folded::off_cpu_folded(&analysis).join("\n") + "\n"),
    );
}

#[test]
fn text_report_of_a_truncated_file() {
    let file = encode(&fixture());
    let done = analyzed(&file[..file.len() * 2 / 3]);
    assert!(done.load.truncated.is_some());
    assert_golden(
        "report_truncated.txt",
        &report_text::to_text(&done.report()),
    );
}

#[test]
fn flamegraphs_render() {
    let analysis = loaded().analysis;
    for (svg, title) in [
        (render(|w| folded::on_cpu_svg(&analysis, w)), "On-CPU"),
        (render(|w| folded::off_cpu_svg(&analysis, w)), "Off-CPU"),
    ] {
        assert!(svg.starts_with("<?xml"), "{title}");
        assert!(svg.contains(title));
        assert!(svg.contains("pt_loader (101)"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }
    // Same input, same picture.
    let again = render(|w| folded::on_cpu_svg(&analysis, w));
    assert_eq!(again, render(|w| folded::on_cpu_svg(&analysis, w)));
}

fn render(f: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> String {
    let mut out = Vec::new();
    f(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}
