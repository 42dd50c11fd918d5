//! `/flamegraph?cause=CAUSE`: one cause's stacks over the segments kept, merged and drawn.
use std::path::PathBuf;

use profiler_core::attribution::Cause;
use profiler_core::report::flamegraph as folded;

/// The SVG, or a status and message for the client.
pub fn render(
    dirs: &[PathBuf],
    cause: &str,
    window: std::time::Duration,
) -> Result<String, (u16, String)> {
    if window.is_zero() {
        return Err((
            404,
            "flame graphs are off: start the agent with --flamegraphs 10m\n".into(),
        ));
    }
    let Some(c) = Cause::ALL.iter().copied().find(|c| c.name() == cause) else {
        let names: Vec<&str> = Cause::ALL.iter().map(|c| c.name()).collect();
        return Err((
            404,
            format!("no cause {cause:?}; causes: {}\n", names.join(", ")),
        ));
    };
    let suffix = format!(".cause-{cause}.folded");
    let mut text = Vec::new();
    for dir in dirs {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().ends_with(&suffix) {
                text.push(std::fs::read_to_string(entry.path()).unwrap_or_default());
            }
        }
    }
    let lines = folded::merge_folded(text.iter().flat_map(|t| t.lines()));
    if lines.is_empty() {
        return Err((
            404,
            format!("no GPU idle time was labelled {cause} in the last {window:?} recorded\n"),
        ));
    }
    let title = format!("GPU idle time: {cause}, the last {window:?}");
    let mut svg = Vec::new();
    folded::flamegraph_svg(&lines, &title, folded::cause_unit(c), &mut svg)
        .map_err(|e| (500, format!("drawing the flame graph failed: {e}\n")))?;
    Ok(String::from_utf8_lossy(&svg).into_owned())
}
