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
