//! Every output stallscope writes, by name: one [`Format`] drives `--format` wherever it
//! appears (`report`, `record`, `diff`, `check`, `doctor`), each command accepting its own
//! subset of it. A report's formats all render through [`Render`] from the same [`Inputs`].
use std::io;

use super::model::{Files, Flamegraph, Inputs, Render};

/// An output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Format {
    #[default]
    Text,
    Json,
    Markdown,
    /// One self-contained page: the report, the timeline and the flame graphs.
    Html,
    /// The timeline as a Perfetto trace, for ui.perfetto.dev.
    Perfetto,
    /// The on- and off-CPU flame graphs and each cause's, as SVG and folded stacks.
    Flamegraph,
}

/// Where a format's output goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    Stdout,
    /// A file beside the recording (or in `--flamegraph-dir`): `<stem>.<extension>`.
    File {
        extension: &'static str,
    },
    /// Several files in the same place, each `<stem>.<name>` as the format names it.
    Files,
}

impl Format {
    pub const ALL: [Format; 6] = [
        Format::Text,
        Format::Json,
        Format::Markdown,
        Format::Html,
        Format::Perfetto,
        Format::Flamegraph,
    ];
    /// What `report` and `record` write.
    pub const REPORT: [Format; 6] = Format::ALL;
    /// What `diff` and `check` write.
    pub const GATE: [Format; 3] = [Format::Text, Format::Markdown, Format::Json];
    /// What `doctor` writes.
    pub const DOCTOR: [Format; 2] = [Format::Text, Format::Json];

    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Json => "json",
            Format::Markdown => "markdown",
            Format::Html => "html",
            Format::Perfetto => "perfetto",
            Format::Flamegraph => "flamegraph",
        }
    }

    pub fn destination(self) -> Destination {
        match self {
            Format::Text | Format::Json | Format::Markdown => Destination::Stdout,
            Format::Html => Destination::File { extension: "html" },
            Format::Perfetto => Destination::File {
                extension: "pftrace",
            },
            Format::Flamegraph => Destination::Files,
        }
    }

    /// Whether it draws the timeline, which keeps the timed events past the attribution.
    pub fn draws_timeline(self) -> bool {
        matches!(self, Format::Html | Format::Perfetto)
    }

    /// Whether its file holds the flame graphs, so is written only once they are drawn.
    pub fn embeds_flamegraphs(self) -> bool {
        self == Format::Html
    }

    /// Its renderer; `None` for Perfetto in a build without the `perfetto` feature.
    pub fn renderer(self) -> Option<&'static dyn Render> {
        match self {
            Format::Text => Some(&super::text::Text),
            Format::Json => Some(&super::json::Json),
            Format::Markdown => Some(&super::markdown::Markdown),
            Format::Html => Some(&super::html::Html),
            #[cfg(feature = "perfetto")]
            Format::Perfetto => Some(&super::perfetto::Perfetto),
            #[cfg(not(feature = "perfetto"))]
            Format::Perfetto => None,
            Format::Flamegraph => Some(&super::flamegraph::render::Flamegraphs),
        }
    }

    /// Writes this format's files through `files` (none for a stdout format), and returns what
    /// it drew for an HTML page.
    pub fn write_files(
        self,
        input: &Inputs<'_, '_>,
        files: &dyn Files,
    ) -> io::Result<Vec<Flamegraph>> {
        let extension = match self.destination() {
            Destination::Stdout => return Ok(Vec::new()),
            Destination::File { extension } => extension,
            // The format names each of its files.
            Destination::Files => "",
        };
        let renderer = self.renderer().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                format!("this stallscope was built without the {self} format"),
            )
        })?;
        renderer.render_files(input, files, extension)
    }

    /// The names of `formats`, for a command's `--help` and its value parser.
    pub fn names<const N: usize>(formats: [Format; N]) -> [&'static str; N] {
        formats.map(Format::name)
    }
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Format::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown format {s:?}; one of: {}",
                    Format::names(Format::ALL).join(", ")
                )
            })
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_by_name_and_refuse_others() {
        for f in Format::ALL {
            assert_eq!(f.name().parse::<Format>(), Ok(f));
            assert!(f.renderer().is_some(), "{f} renders");
        }
        let e = "yaml".parse::<Format>().unwrap_err();
        assert!(
            e.contains("text, json, markdown, html, perfetto, flamegraph"),
            "{e}"
        );
    }

    #[test]
    fn the_timeline_formats_are_files_and_the_report_formats_stdout() {
        for f in Format::ALL {
            if f.draws_timeline() {
                assert!(matches!(f.destination(), Destination::File { .. }), "{f}");
            }
        }
        for f in Format::GATE {
            assert_eq!(f.destination(), Destination::Stdout, "{f}");
        }
        assert_eq!(Format::Flamegraph.destination(), Destination::Files);
        assert!(!Format::Flamegraph.draws_timeline());
    }
}
