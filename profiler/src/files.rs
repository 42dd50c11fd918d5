//! Every file a report writes, beside the recording (or in `--flamegraph-dir`): each
//! recording's flame graphs, and the report's HTML page and Perfetto trace. The formats render
//! through `profiler_core`'s [`Files`]; this makes the files (private to the invoking user,
//! their write errors naming them) and says where each went.
use std::{
    io::{self, BufWriter, Write},
    path::{Path, PathBuf},
    sync::Mutex,
};

use anyhow::Context as _;
use profiler_core::{Files, Format, Inputs, report::model::Flamegraph};

use crate::{owner, plan::Outputs};

/// The files `<dir>/<stem>.<name>` a format asks for, remembered to be said once written.
struct Beside<'p> {
    dir: &'p Path,
    stem: &'p str,
    made: Mutex<Vec<PathBuf>>,
}

impl<'p> Beside<'p> {
    fn new(dir: &'p Path, stem: &'p str) -> Self {
        Self {
            dir,
            stem,
            made: Mutex::new(Vec::new()),
        }
    }

    fn made(self) -> Vec<PathBuf> {
        let mut made = self.made.into_inner().unwrap_or_else(|e| e.into_inner());
        // Several threads draw the flame graphs: say them in one order.
        made.sort();
        made
    }
}

impl Files for Beside<'_> {
    fn create(&self, name: &str) -> io::Result<Box<dyn Write + Send + '_>> {
        let path = self.dir.join(format!("{}.{name}", self.stem));
        let file = owner::create_private(&path).map_err(|e| {
            let kind = e
                .downcast_ref::<io::Error>()
                .map_or(io::ErrorKind::Other, io::Error::kind);
            io::Error::new(kind, format!("{e:#}"))
        })?;
        if let Ok(mut made) = self.made.lock() {
            made.push(path.clone());
        }
        Ok(Box::new(Named {
            w: BufWriter::new(file),
            path,
        }))
    }
}

/// A file whose write errors name it: a format only sees a writer.
struct Named {
    w: BufWriter<std::fs::File>,
    path: PathBuf,
}

impl Named {
    fn named(&self, e: io::Error) -> io::Error {
        io::Error::new(
            e.kind(),
            format!("cannot write {}: {e}", self.path.display()),
        )
    }
}

impl Write for Named {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.w.write(buf).map_err(|e| self.named(e))
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.w.write_all(buf).map_err(|e| self.named(e))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.w.flush().map_err(|e| self.named(e))
    }
}

/// Draws one recording's flame graphs when `out` asks for them, as `<dir>/<stem>.<graph>.svg`
/// and `.folded`, and returns them drawn again for the HTML page when that is asked for too
/// (see [`Inputs::for_page`]).
pub fn flamegraphs(
    out: &Outputs,
    dir: &Path,
    stem: &str,
    input: &Inputs<'_, '_>,
) -> anyhow::Result<Vec<Flamegraph>> {
    if !out.wants(Format::Flamegraph) {
        return Ok(Vec::new());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let files = Beside::new(dir, stem);
    let graphs = Format::Flamegraph.write_files(input, &files)?;
    for path in files.made() {
        eprintln!("stallscope: wrote {}", path.display());
    }
    Ok(graphs)
}

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

/// Writes the one-file formats `out` asks for (the timeline's), each as
/// `<dir>/<stem>.<extension>`, and says where they went with how to open each.
pub fn timeline(
    out: &Outputs,
    dir: &Path,
    stem: &str,
    input: &Inputs<'_, '_>,
) -> anyhow::Result<()> {
    timeline_where(out, dir, stem, input, |_| true)
}

/// As [`timeline`], for the formats `which` accepts.
pub fn timeline_where(
    out: &Outputs,
    dir: &Path,
    stem: &str,
    input: &Inputs<'_, '_>,
    which: impl Fn(Format) -> bool,
) -> anyhow::Result<()> {
    let mut formats = out.file_formats();
    formats.retain(|&f| which(f));
    if formats.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for format in formats {
        let files = Beside::new(dir, stem);
        format.write_files(input, &files)?;
        for path in files.made() {
            eprintln!(
                "stallscope: wrote {}: {}",
                path.display(),
                how_to_open(format, &path)
            );
        }
    }
    Ok(())
}
