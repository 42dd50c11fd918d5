//! One self-contained HTML page: the verdict, the cause table, an interactive timeline (the
//! GPU lanes coloured by cause, a lane per traced process with its threads' states, hover for
//! numbers, click a stall for its evidence), the per-cause flame graphs (inferno's SVGs, each
//! in its own frame so their scripts keep working), the per-thread table and the CUDA section.
//!
//! The page needs no network: its script and style are inlined, and its data is one JSON
//! document in the page, drawn from the same lanes as the Perfetto trace. Each lane is cut
//! down to at most [`LANE_POINTS`] entries (short neighbours joined, named by the one that
//! took the most time), so an hour-long recording stays a few megabytes.
use std::io::{self, Write};

use serde::Serialize;
use serde_json::{Value, json};

use super::json::{JsonJob, JsonReport};
use super::model::{Inputs, Render, Subject};
use crate::attribution::CAUSES;
use crate::timeline::{Lost, RecordingLanes, STATES, Slice};

mod downsample;

pub use downsample::{Entry, downsample};

/// Entries a lane keeps at most: a few per pixel of a wide screen.
pub const LANE_POINTS: usize = 4000;

const SCRIPT: &str = include_str!("timeline.js");
const STYLE: &str = include_str!("page.css");

pub use super::model::Flamegraph;

/// The HTML format: one self-contained page.
pub struct Html;

impl Render for Html {
    fn render(&self, input: &Inputs<'_, '_>, w: &mut dyn Write) -> io::Result<()> {
        write_page(input.subject, input.lanes, input.graphs, w)
    }
}

#[derive(Serialize)]
struct Data {
    title: String,
    /// The JSON report (of one recording, or of the job).
    report: Value,
    causes: Vec<Value>,
    states: Vec<&'static str>,
    recordings: Vec<Value>,
    flamegraphs: Vec<Value>,
}

/// Writes the page.
pub fn write_page(
    page: Subject<'_, '_>,
    lanes: &[RecordingLanes<'_>],
    graphs: &[Flamegraph],
    w: &mut dyn Write,
) -> io::Result<()> {
    let report = match page {
        Subject::One(r) => serde_json::to_value(JsonReport::new(r)),
        Subject::Job(j) => serde_json::to_value(JsonJob::new(j)),
    }
    .map_err(io::Error::from)?;
    let title = match lanes {
        [one] => format!("stallscope: {}", one.name),
        many => format!("stallscope: {} recordings", many.len()),
    };
    let min_wall = lanes
        .iter()
        .map(|r| r.wall_offset_ns + i128::from(r.start_ns))
        .min()
        .unwrap_or(0);
    let aligned = lanes.len() > 1 && lanes.iter().all(|r| r.wall_offset_ns != 0);
    let data = Data {
        title: title.clone(),
        report,
        causes: CAUSES
            .iter()
            .map(|c| json!({"name": c.name, "description": c.description, "fix": c.fix}))
            .collect(),
        states: STATES.iter().map(|s| s.name()).collect(),
        recordings: lanes
            .iter()
            .map(|r| {
                let offset_us = if aligned {
                    ((r.wall_offset_ns + i128::from(r.start_ns) - min_wall) / 1000) as i64
                } else {
                    0
                };
                recording(r, offset_us)
            })
            .collect(),
        flamegraphs: graphs
            .iter()
            .map(|g| json!({"name": g.name, "svg": g.svg}))
            .collect(),
    };
    let json = serde_json::to_string(&data).map_err(io::Error::from)?;
    // Inside <script>, only `</` can end the element early; `<\/` is the same JSON string.
    let json = json.replace("</", "<\\/");
    write!(
        w,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n\
         <noscript>This report draws itself with JavaScript.</noscript>\n\
         <script type=\"application/json\" id=\"stallscope-data\">{json}</script>\n\
         <script>\n{SCRIPT}</script>\n</body>\n</html>\n",
        escape(&title)
    )
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn rel_us(r: &RecordingLanes<'_>, ns: u64) -> i64 {
    (ns.saturating_sub(r.start_ns) / 1000) as i64
}

/// The slices as entries in time order (the lanes of calls and collectives are merged).
fn entries<'s>(
    r: &RecordingLanes<'_>,
    slices: impl IntoIterator<Item = (&'s Slice, u32)>,
) -> Vec<Entry> {
    let mut out: Vec<Entry> = slices
        .into_iter()
        .map(|(s, key)| Entry {
            start_us: rel_us(r, s.start_ns),
            end_us: rel_us(r, s.end_ns).max(rel_us(r, s.start_ns)),
            key,
            weight_ns: s.dur_ns(),
        })
        .collect();
    out.sort_by_key(|e| e.start_us);
    out
}

fn packed(list: Vec<Entry>, span_us: i64) -> Value {
    Value::Array(
        downsample(list, span_us, LANE_POINTS)
            .into_iter()
            .map(|e| json!([e.start_us, e.end_us, e.key]))
            .collect(),
    )
}

fn recording(r: &RecordingLanes<'_>, offset_us: i64) -> Value {
    let span_us = rel_us(r, r.end_ns).max(1);
    let cause_key = |name: &str| CAUSES.iter().position(|c| c.name == name).unwrap_or(0) as u32;
    let gpus: Vec<Value> = r
        .gpus
        .iter()
        .map(|g| {
            let step = g.util.len().div_ceil(LANE_POINTS).max(1);
            let util: Vec<Value> = g
                .util
                .chunks(step)
                .map(|c| {
                    let mean = c.iter().map(|p| p.value).sum::<f64>() / c.len() as f64;
                    json!([rel_us(r, c[0].ts_ns), (mean * 10.0).round() / 10.0])
                })
                .collect();
            let sm: Vec<Value> = g
                .sm_active
                .iter()
                .step_by(g.sm_active.len().div_ceil(LANE_POINTS).max(1))
                .map(|p| json!([rel_us(r, p.ts_ns), p.value]))
                .collect();
            // Idle and waiting, each cause its own key; waiting keys follow the causes.
            let lost = entries(
                r,
                g.lost.iter().map(|(kind, cause, s)| {
                    let k = cause_key(cause.name());
                    (
                        s,
                        if *kind == Lost::Waiting {
                            k + CAUSES.len() as u32
                        } else {
                            k
                        },
                    )
                }),
            );
            let stalls: Vec<Value> = g
                .stalls
                .iter()
                .map(|(cause, s)| {
                    let mut v = json!({
                        "start_us": rel_us(r, s.start_ns),
                        "end_us": rel_us(r, s.end_ns),
                        "cause": cause.name(),
                    });
                    for (k, a) in &s.args {
                        v[*k] = arg_value(a);
                    }
                    v
                })
                .collect();
            // [start, end, input wait, copy, host, gpu, collective] (ms).
            let steps: Vec<Value> = g
                .steps
                .iter()
                .map(|s| {
                    let mut v = vec![json!(rel_us(r, s.start_ns)), json!(rel_us(r, s.end_ns))];
                    v.extend(s.args.iter().map(|(_, a)| arg_value(a)));
                    Value::Array(v)
                })
                .collect();
            json!({
                "index": g.index,
                "name": g.name,
                "util": util,
                "sm": sm,
                "lost": packed(lost, span_us),
                "stalls": stalls,
                "steps": steps,
            })
        })
        .collect();
    let processes: Vec<Value> = r
        .processes
        .iter()
        .map(|p| {
            let threads: Vec<Value> = p
                .threads
                .iter()
                .map(|t| {
                    let states: Vec<Entry> = t
                        .states
                        .iter()
                        .map(|run| Entry {
                            start_us: rel_us(r, run.start_ns),
                            end_us: rel_us(r, run.end_ns),
                            key: STATES.iter().position(|x| *x == run.state).unwrap_or(0) as u32,
                            weight_ns: run.dur_ns(),
                        })
                        .collect();
                    let mut names: Vec<String> = Vec::new();
                    let calls = entries(
                        r,
                        t.cuda.iter().flatten().map(|s| {
                            let k = names.iter().position(|n| *n == s.name).unwrap_or_else(|| {
                                names.push(s.name.to_string());
                                names.len() - 1
                            });
                            (s, k as u32)
                        }),
                    );
                    json!({
                        "tid": t.tid,
                        "name": t.name,
                        "role": t.role,
                        "states": packed(states, span_us),
                        "cuda_names": names,
                        "cuda": packed(calls, span_us),
                    })
                })
                .collect();
            let collectives = entries(r, p.collectives.iter().flatten().map(|s| (s, 0)));
            json!({
                "pid": p.pid,
                "name": p.name,
                "cmdline": p.cmdline,
                "rank": p.rank,
                "is_rank": !p.collectives.is_empty(),
                "threads": threads,
                "collectives": packed(collectives, span_us),
            })
        })
        .collect();
    json!({
        "name": r.name,
        "host": r.host,
        "duration_us": span_us,
        "offset_us": offset_us,
        "gpus": gpus,
        "processes": processes,
    })
}

fn arg_value(a: &crate::timeline::Arg) -> Value {
    use crate::timeline::Arg;
    match a {
        Arg::Int(i) => json!(i),
        Arg::Float(f) => json!((f * 1000.0).round() / 1000.0),
        Arg::Str(s) => json!(s),
        Arg::Json(v) => v.clone(),
    }
}

#[cfg(test)]
mod tests;
