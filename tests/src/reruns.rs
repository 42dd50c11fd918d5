//! The one extra run some timing tests allow themselves on a shared 2-CPU machine, made
//! visible: each is said on stderr and, when `cargo xtask test` asks for it
//! (`STALLSCOPE_TEST_RERUNS=<file>`), appended to a file that xtask prints at the end, so a
//! green run that needed reruns says so.
use std::io::Write as _;

/// The file xtask reads the reruns back from.
pub const RERUNS_ENV: &str = "STALLSCOPE_TEST_RERUNS";

/// Notes that `test` is running once more because its first run failed with `why`.
pub fn note(test: &str, why: &str) {
    let why = why.lines().next().unwrap_or_default();
    let why: String = why.chars().take(300).collect();
    eprintln!("{test}: first run failed ({why}); running once more");
    let Some(path) = std::env::var_os(RERUNS_ENV) else {
        return;
    };
    let line = format!("{test}: {why}\n");
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = appended {
        eprintln!(
            "{test}: cannot note the rerun in {}: {e}",
            path.to_string_lossy()
        );
    }
}

/// What a caught panic said, for [`note`].
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)")
}
