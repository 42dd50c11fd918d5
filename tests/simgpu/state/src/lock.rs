//! A spin lock on a word of the shared mapping, usable across processes.
//!
//! The word holds the holder's pid, so a lock left behind by a killed process can be taken over
//! once that pid is gone. Critical sections are a few hundred nanoseconds, so spinning (with a
//! yield now and then, for a 2-core CI box) beats a futex here.
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a holder may keep the lock before we check whether it still exists.
const STALE_AFTER: Duration = Duration::from_millis(50);

/// Releases the lock on drop.
pub struct LockGuard<'a> {
    word: &'a AtomicU32,
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        self.word.store(0, Ordering::Release);
    }
}

/// Whether process `pid` exists (EPERM means it exists but belongs to someone else).
pub fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 sends nothing; it only checks that the pid exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Takes the lock in `word`, spinning until it is free or its holder is dead.
pub fn lock(word: &AtomicU32) -> LockGuard<'_> {
    let me = std::process::id();
    let mut spins: u32 = 0;
    let mut waiting_since: Option<Instant> = None;
    loop {
        let holder = match word.compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return LockGuard { word },
            Err(holder) => holder,
        };
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
        if !spins.is_multiple_of(4096) || holder == 0 || holder == me {
            continue;
        }
        let since = *waiting_since.get_or_insert_with(Instant::now);
        if since.elapsed() > STALE_AFTER
            && !pid_alive(holder)
            && word
                .compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            return LockGuard { word };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_excludes_and_releases() {
        let word = AtomicU32::new(0);
        {
            let _g = lock(&word);
            assert_eq!(word.load(Ordering::Relaxed), std::process::id());
        }
        assert_eq!(word.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn lock_of_a_dead_holder_is_taken_over() {
        // Pid numbers above pid_max (at most 2^22) never exist.
        let word = AtomicU32::new(0x7fff_fff0);
        let _g = lock(&word);
        assert_eq!(word.load(Ordering::Relaxed), std::process::id());
    }
}
