//! Golden reports from the hand-built fixture, written and read back through the file format.
//! Regenerate with `STALLSCOPE_BLESS=1 cargo test -p profiler-core --test golden`.
mod common;

use common::{assert_golden, encode, fixture};
use profiler_core::{analyze_reader, folded, report_json, report_text};

fn loaded() -> (profiler_core::Analysis, profiler_core::LoadInfo) {
    analyze_reader(encode(&fixture()).as_slice()).unwrap()
}

#[test]
fn text_report() {
    let (analysis, info) = loaded();
    assert_golden("report.txt", &report_text::to_text(&analysis, &info));
}

#[test]
fn json_report() {
    let (analysis, info) = loaded();
    let mut out = Vec::new();
    report_json::write_json(&analysis, &info, &mut out).unwrap();
    assert_golden("report.json", &String::from_utf8(out).unwrap());
}

#[test]
fn folded_stacks() {
    let (analysis, _) = loaded();
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
    let (analysis, info) = analyze_reader(&file[..file.len() * 2 / 3]).unwrap();
    assert!(info.truncated.is_some());
    assert_golden(
        "report_truncated.txt",
        &report_text::to_text(&analysis, &info),
    );
}

#[test]
fn flamegraphs_render() {
    let (analysis, _) = loaded();
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
