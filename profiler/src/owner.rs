//! Output files hold stacks and paths, which are sensitive: they are created 0600 and, under
//! sudo, handed to the invoking user so that `report` needs no root.
use std::{fs::File, os::unix::fs::OpenOptionsExt, path::Path};

use anyhow::Context as _;

pub fn create_private(path: &Path) -> anyhow::Result<File> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    if let Some((uid, gid)) = crate::sudo::invoking_user() {
        let _ = std::os::unix::fs::fchown(&file, Some(uid), Some(gid));
    }
    Ok(file)
}

/// A new folder in the temporary directory, `PREFIX-PID-NANOS`, that only the user can read
/// (under sudo, the invoking user): made by this call, never one someone else made first.
pub fn create_private_dir(prefix: &str) -> anyhow::Result<std::path::PathBuf> {
    use std::os::unix::fs::DirBuilderExt as _;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("{prefix}-{}-{nanos:x}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    if let Some((uid, gid)) = crate::sudo::invoking_user() {
        let _ = std::os::unix::fs::chown(&dir, Some(uid), Some(gid));
    }
    Ok(dir)
}
