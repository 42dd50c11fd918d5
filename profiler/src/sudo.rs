//! Who ran stallscope through sudo: the user whose files and commands stallscope makes
//! theirs (output files, a launched command), and whose ptrace rule applies.

fn id(var: &str) -> Option<u32> {
    std::env::var(var).ok().and_then(|v| v.parse().ok())
}

/// The invoking user's UID and GID under sudo; `None` otherwise (or when sudo's variables
/// do not parse).
pub fn invoking_user() -> Option<(u32, u32)> {
    Some((id("SUDO_UID")?, id("SUDO_GID")?))
}

/// The invoking user's UID under sudo.
pub fn invoking_uid() -> Option<u32> {
    id("SUDO_UID")
}
