//! The report's file formats (the Perfetto trace, the HTML page) of one recording, or of
//! several recordings of one job: written beside the recording (or in `--flamegraph-dir`),
//! each file's path then said with how to open it.
use std::{
    io::{BufWriter, Write as _},
    path::Path,
};

use anyhow::Context as _;
use profiler_core::{Destination, Format, Inputs};

use crate::{owner, plan::Outputs};

/// How to open a file of `format`, for the line that says where it went.
fn how_to_open(format: Format, path: &Path) -> String {
    match format {
        Format::Perfetto => "open it at https://ui.perfetto.dev (Open trace file)".into(),
        Format::Html => {
            let shown = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
            format!(
                "open file://{} in a browser (it needs no network)",
                shown.display()
            )
        }
        _ => String::new(),
    }
}

/// Writes the file formats `out` asks for, each as `<dir>/<stem>.<extension>`, and says
/// where they went.
pub fn write(out: &Outputs, dir: &Path, stem: &str, input: &Inputs<'_, '_>) -> anyhow::Result<()> {
    let formats = out.file_formats();
    if formats.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for format in formats {
        let Destination::File { extension } = format.destination() else {
            continue;
        };
        let renderer = format
            .renderer()
            .with_context(|| format!("this stallscope was built without the {format} format"))?;
        let path = dir.join(format!("{stem}.{extension}"));
        let mut w = BufWriter::new(owner::create_private(&path)?);
        renderer
            .render(input, &mut w)
            .and_then(|()| w.flush())
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!(
            "stallscope: wrote {}: {}",
            path.display(),
            how_to_open(format, &path)
        );
    }
    Ok(())
}
