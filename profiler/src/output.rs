//! Turns a recording file into what the user sees: the report on stdout (text or JSON) and
//! flamegraphs plus folded stacks on disk. `record` and `report` both end here, on the same
//! file, so a live run and a later `report` print the same thing.
use std::{
    fs::File,
    io::{BufReader, BufWriter, Write},
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use profiler_core::{analyze_reader, attribution::Cause, folded, report_json, report_text};

use crate::{cli::OutputArgs, owner};

fn load(recording: &Path) -> anyhow::Result<(profiler_core::Analysis, profiler_core::LoadInfo)> {
    let file = File::open(recording)
        .with_context(|| format!("cannot open recording {}", recording.display()))?;
    let (analysis, load) = analyze_reader(BufReader::new(file))
        .with_context(|| format!("cannot read recording {}", recording.display()))?;
    if let Some(t) = &load.truncated {
        eprintln!(
            "stallscope: warning: {} is cut short at byte {} (was the recorder killed?); \
             analysed the {} complete records before it",
            recording.display(),
            t.offset,
            t.records_loaded
        );
    }
    Ok((analysis, load))
}

/// Several recordings of one job (one per host): each one's report, then the ranks across
/// all of them.
pub fn render_many(recordings: &[PathBuf], out: &OutputArgs) -> anyhow::Result<()> {
    if let [one] = recordings {
        return render(one, out);
    }
    let mut loaded = Vec::new();
    for r in recordings {
        let (analysis, load) = load(r)?;
        if !out.no_flamegraphs {
            let (dir, stem) = flamegraph_place(r, out);
            for p in write_flamegraphs(&analysis, &dir, &stem)? {
                eprintln!("stallscope: wrote {}", p.display());
            }
        }
        loaded.push((r, analysis, load));
    }
    let analyses: Vec<&profiler_core::Analysis> = loaded.iter().map(|(_, a, _)| a).collect();
    let ranks = profiler_core::attribution::ranks::ranks(&analyses);
    let note = profiler_core::merge::clock_note(&analyses);
    let stdout = std::io::stdout();
    let mut stdout = stdout.lock();
    if out.json {
        let doc = serde_json::json!({
            "version": report_json::JSON_VERSION,
            "recordings": loaded
                .iter()
                .map(|(path, a, l)| {
                    let mut v = report_json::to_json_value(a, l);
                    v["file"] = serde_json::json!(path.display().to_string());
                    v
                })
                .collect::<Vec<_>>(),
            "ranks": ranks,
            "clock_note": note,
        });
        serde_json::to_writer_pretty(&mut stdout, &doc)?;
        writeln!(stdout)?;
    } else {
        for (path, a, l) in &loaded {
            writeln!(stdout, "=== {} ===", path.display())?;
            report_text::write_text(a, l, &mut stdout)?;
            writeln!(stdout)?;
        }
        writeln!(stdout, "=== all recordings ===")?;
        profiler_core::report_text::write_ranks(&ranks, &mut stdout)?;
        writeln!(stdout, "{note}")?;
    }
    stdout.flush()?;
    Ok(())
}

fn flamegraph_place(recording: &Path, out: &OutputArgs) -> (PathBuf, String) {
    let dir = out
        .flamegraph_dir
        .clone()
        .or_else(|| recording.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("."));
    let stem = recording
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "stallscope".into());
    (dir, stem)
}

pub fn render(recording: &Path, out: &OutputArgs) -> anyhow::Result<()> {
    let (analysis, load) = load(recording)?;
    let (dir, stem) = flamegraph_place(recording, out);
    let written = if out.no_flamegraphs {
        Vec::new()
    } else {
        write_flamegraphs(&analysis, &dir, &stem)?
    };

    let stdout = std::io::stdout();
    let mut stdout = stdout.lock();
    if out.json {
        report_json::write_json(&analysis, &load, &mut stdout)?;
        writeln!(stdout)?;
    } else {
        report_text::write_text(&analysis, &load, &mut stdout)?;
    }
    stdout.flush()?;
    for p in written {
        eprintln!("stallscope: wrote {}", p.display());
    }
    Ok(())
}

fn write_flamegraphs(
    analysis: &profiler_core::Analysis,
    dir: &Path,
    stem: &str,
) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // One set at a time: a long recording's folded stacks run to tens of megabytes each.
    type Fold<'a> = Box<dyn Fn() -> (Vec<String>, &'static str) + 'a>;
    let mut sets: Vec<(String, &str, Fold<'_>)> = vec![
        (
            "oncpu".into(),
            "On-CPU",
            Box::new(|| (folded::on_cpu_folded(analysis), "samples")),
        ),
        (
            "offcpu".into(),
            "Off-CPU",
            Box::new(|| (folded::off_cpu_folded(analysis), "us")),
        ),
    ];
    for cause in Cause::ALL {
        sets.push((
            format!("cause-{}", cause.name()),
            cause.name(),
            Box::new(move || folded::cause_folded(analysis, cause)),
        ));
    }
    let mut written = Vec::new();
    for (name, title, fold) in sets {
        let (lines, unit) = fold();
        if lines.is_empty() {
            continue;
        }
        let folded_path = dir.join(format!("{stem}.{name}.folded"));
        let mut w = BufWriter::new(owner::create_private(&folded_path)?);
        folded::write_folded(&lines, &mut w)?;
        w.flush()?;
        written.push(folded_path);
        let svg_path = dir.join(format!("{stem}.{name}.svg"));
        let mut w = BufWriter::new(owner::create_private(&svg_path)?);
        let title = if name.starts_with("cause-") {
            format!("GPU idle time: {title}")
        } else {
            title.to_string()
        };
        folded::flamegraph_svg(&lines, &title, unit, &mut w)?;
        w.flush()?;
        written.push(svg_path);
    }
    Ok(written)
}
