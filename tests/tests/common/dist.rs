//! `cargo xtask dist`'s output, which the release tests take what they install from.
use std::path::{Path, PathBuf};

/// dist/, or where `STALLSCOPE_DIST` says (`cargo xtask test` sets it).
pub fn dir() -> PathBuf {
    std::env::var_os("STALLSCOPE_DIST").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist"),
        PathBuf::from,
    )
}

/// The one file of `dir` whose name ends with `suffix`.
pub fn only(dir: &Path, suffix: &str) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}; build it with `cargo xtask dist`", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "want one {suffix} in {} (`cargo xtask dist`), found {found:?}",
        dir.display()
    );
    found.into_iter().next().unwrap()
}
