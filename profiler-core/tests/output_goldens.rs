//! Goldens for the outputs the per-recording reports do not cover: a job of several
//! recordings (text and JSON), the HTML page's embedded data, the Perfetto trace (decoded and
//! summarised), the flame-graph format's files, the gate's three renders of `diff` and `check`, `doctor`'s text and JSON, and
//! the agent's OpenMetrics exposition. Every input is a fixed recording of
//! `tests/recordings/gpu/` or a fixed reading, so nothing depends on this machine.
//! Regenerate with `STALLSCOPE_BLESS=1 cargo test -p profiler-core --test output_goldens`.
mod common;

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use common::assert_golden;
use perfetto_protos::trace::Trace;
use profiler_core::doctor::{Check, Diagnosis};
use profiler_core::exposition::{Exposition, add_report};
use profiler_core::gate::{
    check::{Budget, check},
    diff::{Thresholds, diff},
    input::Run,
    render::{write_check, write_diff},
};
use profiler_core::pipeline::{self, Analyzed, Keep, Loaded};
use profiler_core::report::json::{JsonReport, ReportDoc, SegmentDoc, read_report};
use profiler_core::report::{html, json::to_json_value, perfetto};
use profiler_core::{Files, Format, Inputs, Subject};
use protobuf::Message as _;
use serde_json::{Value, json};

fn loaded(scenario: &str) -> Loaded {
    let p = common::gpu_recording(scenario);
    let file = std::fs::File::open(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    pipeline::load(format!("v1-{scenario}.rec"), file)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn analyzed(scenario: &str, keep: Keep) -> Analyzed {
    pipeline::analyze(loaded(scenario), keep)
}

fn timeline() -> Keep {
    Keep {
        timeline: true,
        cause_stacks: false,
    }
}

/// Two hosts of one job: each rank's recording, reported together.
#[test]
fn a_job_of_two_recordings_in_text_and_json() {
    let job = pipeline::analyze_job(
        vec![loaded("dataloader-cpu"), loaded("host-compute")],
        Keep::default(),
    );
    let report = pipeline::job_report(&job);
    for (format, file) in [
        (Format::Text, "job/two-recordings.txt"),
        (Format::Json, "job/two-recordings.json"),
        (Format::Markdown, "job/two-recordings.md"),
    ] {
        assert_golden(file, &rendered_report(format, Subject::Job(&report)));
    }
}

fn rendered_report(format: Format, subject: Subject<'_, '_>) -> String {
    let mut out = Vec::new();
    format
        .renderer()
        .unwrap()
        .render(&Inputs::report(subject), &mut out)
        .unwrap();
    String::from_utf8(out).unwrap()
}

/// One recording's report in Markdown: a straggler's job, with stalls and ranks.
#[test]
fn a_report_in_markdown() {
    for scenario in ["nccl-straggler-ddp", "pageable-copy"] {
        let a = analyzed(scenario, Keep::default());
        assert_golden(
            &format!("markdown/{scenario}.md"),
            &rendered_report(Format::Markdown, Subject::One(&a.report())),
        );
    }
}

/// A long array as its length with its first and last items: the page's lanes hold thousands
/// of slices, whose every value the timeline's own tests check.
fn summarised(v: &Value) -> Value {
    match v {
        Value::Array(items) if items.len() > 4 => json!({
            "len": items.len(),
            "first": summarised(&items[0]),
            "last": summarised(&items[items.len() - 1]),
        }),
        Value::Array(items) => Value::Array(items.iter().map(summarised).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| match k.as_str() {
                    // The JSON report has goldens of its own; the page embeds it whole.
                    "report" => (k.clone(), json!("(the JSON report)")),
                    "svg" => (
                        k.clone(),
                        json!(format!("({} bytes of SVG)", v.as_str().map_or(0, str::len))),
                    ),
                    _ => (k.clone(), summarised(v)),
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

#[test]
fn the_html_pages_data() {
    let mut a = analyzed("pageable-copy", timeline());
    let events = a.events.take().expect("kept");
    let lanes = a.lanes(events);
    let report = a.report();
    let graphs = [html::Flamegraph {
        name: "oncpu".into(),
        svg: "<svg/>".into(),
    }];
    let mut page = Vec::new();
    html::write_page(
        Subject::One(&report),
        std::slice::from_ref(&lanes),
        &graphs,
        &mut page,
    )
    .unwrap();
    let page = String::from_utf8(page).unwrap();
    let open = "<script type=\"application/json\" id=\"stallscope-data\">";
    let start = page.find(open).expect("the data element") + open.len();
    let end = start + page[start..].find("</script>").expect("its end");
    let data: Value = serde_json::from_str(&page[start..end].replace("<\\/", "</")).unwrap();
    assert_eq!(
        data["report"],
        to_json_value(&report),
        "the page embeds the JSON report as it is"
    );
    let text = serde_json::to_string_pretty(&summarised(&data)).unwrap() + "\n";
    assert_golden("html/pageable-copy.data.json", &text);
}

/// The trace as a reader sees it: its tracks by name and kind, and how many events of each
/// kind each holds.
fn trace_summary(bytes: &[u8]) -> String {
    let trace = Trace::parse_from_bytes(bytes).expect("a trace Perfetto's protos read");
    let mut tracks: BTreeMap<u64, String> = BTreeMap::new();
    let mut events: BTreeMap<String, BTreeMap<&'static str, u64>> = BTreeMap::new();
    let mut samples = 0u64;
    let mut interned = 0u64;
    for p in &trace.packet {
        if p.has_track_descriptor() {
            let d = p.track_descriptor();
            let kind = if d.process.is_some() {
                "process"
            } else if d.thread.is_some() {
                "thread"
            } else if d.counter.is_some() {
                "counter"
            } else {
                "track"
            };
            let name = if d.process.is_some() {
                d.process.process_name().to_owned()
            } else if d.thread.is_some() {
                d.thread.thread_name().to_owned()
            } else {
                d.name().to_owned()
            };
            tracks.insert(d.uuid(), format!("{kind} {name}"));
        }
        if p.has_track_event() {
            let e = p.track_event();
            let track = tracks
                .get(&e.track_uuid())
                .cloned()
                .unwrap_or_else(|| "(unnamed track)".into());
            let kind = match e.type_() {
                perfetto_protos::track_event::track_event::Type::TYPE_SLICE_BEGIN => "begin",
                perfetto_protos::track_event::track_event::Type::TYPE_SLICE_END => "end",
                perfetto_protos::track_event::track_event::Type::TYPE_COUNTER => "counter",
                _ => "other",
            };
            *events.entry(track).or_default().entry(kind).or_default() += 1;
        }
        if p.has_perf_sample() {
            samples += 1;
        }
        if p.interned_data.is_some() {
            interned += 1;
        }
    }
    let mut out = format!(
        "{} packets, {} tracks, {samples} CPU samples, {interned} packets of interned data\n",
        trace.packet.len(),
        tracks.len()
    );
    for (track, kinds) in events {
        let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
        out += &format!("{track}: {}\n", kinds.join(", "));
    }
    out
}

#[test]
fn the_perfetto_trace_decoded() {
    let mut a = analyzed("nccl-straggler-ddp", timeline());
    let events = a.events.take().expect("kept");
    let lanes = a.lanes(events);
    let mut bytes = Vec::new();
    perfetto::write_trace(std::slice::from_ref(&lanes), None, &mut bytes).unwrap();
    assert_golden(
        "perfetto/nccl-straggler-ddp.summary.txt",
        &trace_summary(&bytes),
    );
}

fn run(scenario: &str) -> Run {
    let a = analyzed(scenario, Keep::default());
    Run::from_report(&a.report(), &format!("v1-{scenario}.rec"))
}

fn rendered(write: impl Fn(Format, &mut Vec<u8>)) -> [(Format, String); 3] {
    Format::GATE.map(|f| {
        let mut out = Vec::new();
        write(f, &mut out);
        (f, String::from_utf8(out).unwrap())
    })
}

fn extension(f: Format) -> &'static str {
    match f {
        Format::Text => "txt",
        Format::Markdown => "md",
        Format::Json => "json",
        other => unreachable!("{other} is no gate format"),
    }
}

/// A job whose bottleneck moved from the loop's own work to the DataLoader's workers.
#[test]
fn the_gates_diff_and_check_in_each_format() {
    let base = [run("host-compute")];
    let new = [run("dataloader-cpu")];
    let report = diff(&base, &new, &Thresholds::parse(&[]).unwrap()).unwrap();
    assert_eq!(report.exit_code(), 1, "dataloader_cpu rose");
    for (f, text) in rendered(|f, w| write_diff(&report, f, w).unwrap()) {
        assert_golden(&format!("gate/diff.{}", extension(f)), &text);
    }
    let budget = Budget::parse(
        "idle = \"15%\"\ndataloader_cpu = \"5%\"\nbusy = \"20%\"\nlost_events = 0\nstep_ms_p50 = \"350ms\"\n",
        "budget.toml",
    )
    .unwrap();
    let checked = check(&new[0], &budget).unwrap();
    assert_eq!(checked.exit_code(), 1, "over its idle budget");
    for (f, text) in rendered(|f, w| write_check(&checked, f, w).unwrap()) {
        assert_golden(&format!("gate/check.{}", extension(f)), &text);
    }
}

/// doctor's renders over one reading of each outcome, as `doctor` gathers them.
#[test]
fn doctors_text_and_json() {
    let d = Diagnosis {
        checks: vec![
            Check::pass("kernel module", "nvidia 580.159.04 loaded"),
            profiler_core::doctor::gpu::replays(1).on_gpu(0),
            profiler_core::doctor::gpu::persistence(false).on_gpu(0),
            Check::fail(
                "ECC",
                "volatile 0 corrected / 2 uncorrected",
                "drain the node and reset the GPU",
            )
            .on_gpu(1),
            Check::unavailable("kernel log", "/dev/kmsg: permission denied"),
        ],
    };
    assert_golden("doctor/readings.txt", &d.to_text());
    assert_golden("doctor/readings.json", &(d.to_json() + "\n"));
}

/// What the agent serves after two segments, one of them a ranked job's.
#[test]
fn the_agents_exposition() {
    let mut e = Exposition::default();
    let mut secs = 0.0;
    for scenario in ["disk", "nccl-straggler-ddp"] {
        let a = analyzed(scenario, Keep::default());
        secs += add_report(&mut e, &JsonReport::new(&a.report()));
    }
    assert!(secs > 0.0);
    assert_golden("exposition/two-segments.txt", &e.render());
}

/// `record --segment`'s document reads back typed, its report whole.
#[test]
fn a_segment_document_reads_back_typed() {
    let a = analyzed("host-compute", Keep::default());
    let report = a.report();
    let mut out = Vec::new();
    profiler_core::report::json::write_segment(&report, 3, "/tmp/run.3.rec", &mut out).unwrap();
    let doc: SegmentDoc<ReportDoc> = serde_json::from_slice(&out).unwrap();
    assert_eq!((doc.segment, doc.recording.as_str()), (3, "/tmp/run.3.rec"));
    assert_eq!(
        serde_json::to_string(&doc.report).unwrap(),
        serde_json::to_string(&JsonReport::new(&report)).unwrap()
    );
    assert!(out.ends_with(b"}\n"), "one document, then a newline");
}

/// Every JSON report golden reads back typed and writes the same document again: each field
/// deserializes, in every scenario's shape, to the value it was written with.
#[test]
fn every_json_report_golden_reads_back_typed_and_writes_the_same_document() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut files: Vec<_> = std::fs::read_dir(dir.join("gpu"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.push(dir.join("report.json"));
    assert!(files.len() > 5, "{files:?}");
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        let doc = read_report(&bytes, &f.display().to_string()).unwrap();
        let was: Value = serde_json::from_slice(&bytes).unwrap();
        let again = serde_json::to_value(&doc).unwrap();
        let differs = was
            .as_object()
            .unwrap()
            .iter()
            .find(|(k, v)| again.get(k.as_str()) != Some(*v))
            .map(|(k, _)| k.clone());
        assert!(
            was == again,
            "{} reads back otherwise, first at {differs:?}",
            f.display()
        );
    }
}

/// Written straight from the report, the document keeps its fields in the struct's order.
#[test]
fn a_report_read_back_writes_the_same_bytes() {
    let a = analyzed("nccl-straggler-ddp", Keep::default());
    let written = serde_json::to_string_pretty(&JsonReport::new(&a.report())).unwrap();
    let doc = read_report(written.as_bytes(), "x.json").unwrap();
    assert!(serde_json::to_string_pretty(&doc).unwrap() == written);
}

/// Files kept in memory by name, as a format of several files writes them.
#[derive(Default)]
struct Memory(Mutex<BTreeMap<String, Arc<Mutex<Vec<u8>>>>>);

struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Files for Memory {
    fn create(&self, name: &str) -> io::Result<Box<dyn Write + Send + '_>> {
        let file = Arc::new(Mutex::new(Vec::new()));
        let again = self.0.lock().unwrap().insert(name.to_owned(), file.clone());
        assert!(again.is_none(), "{name} is written twice");
        Ok(Box::new(Shared(file)))
    }
}

/// An SVG as what it draws: its title and how many frames it has.
fn svg_summary(svg: &str) -> String {
    let title = svg
        .split("<text id=\"title\"")
        .nth(1)
        .and_then(|t| t.split('>').nth(1))
        .and_then(|t| t.split('<').next())
        .unwrap_or("(no title)");
    format!("{title}: {} frames", svg.matches("<g>").count())
}

/// The flame-graph format through the one output registry: each graph's folded lines whole,
/// its SVG summarised (inferno draws it; the folded lines are what this crate decides), and
/// the graphs drawn again for an HTML page, in the same order as the files.
#[test]
fn the_flame_graph_files() {
    let mut a = analyzed(
        "dataloader-cpu",
        Keep {
            timeline: false,
            cause_stacks: true,
        },
    );
    let causes = std::mem::take(&mut a.causes);
    let report = a.report();
    let input = Inputs {
        cause_stacks: &causes,
        for_page: true,
        ..Inputs::report(Subject::One(&report))
    };
    let files = Memory::default();
    let page = Format::Flamegraph.write_files(&input, &files).unwrap();
    let files = files.0.into_inner().unwrap();
    let mut out = String::new();
    for (name, bytes) in &files {
        let text = String::from_utf8(bytes.lock().unwrap().clone()).unwrap();
        if name.ends_with(".svg") {
            out += &format!("== {name}: {}\n", svg_summary(&text));
        } else {
            out += &format!("== {name}: {} lines\n{text}", text.lines().count());
        }
    }
    assert_golden("flamegraph/dataloader-cpu.txt", &out);
    let drawn: Vec<&str> = page.iter().map(|g| g.name.as_str()).collect();
    let mut svgs: Vec<&str> = files
        .keys()
        .filter_map(|n| n.strip_suffix(".svg"))
        .collect();
    // The page's order is the graphs': on-CPU, off-CPU, then the causes.
    svgs.sort_by_key(|n| (!n.starts_with("oncpu"), !n.starts_with("offcpu"), *n));
    assert_eq!(drawn, svgs);
    assert!(drawn.contains(&"cause-dataloader_cpu"), "{drawn:?}");
    for g in &page {
        assert!(g.svg.starts_with("<?xml"), "{}", g.name);
    }
    // Without the page, nothing is drawn twice.
    let alone = Inputs {
        for_page: false,
        ..input
    };
    assert!(
        Format::Flamegraph
            .write_files(&alone, &Memory::default())
            .unwrap()
            .is_empty()
    );
}
