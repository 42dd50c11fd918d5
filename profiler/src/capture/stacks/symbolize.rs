//! Turns raw stack addresses into interned, named stacks as samples arrive, while the
//! sampled process still exists: a recording must stay readable after every process in it
//! has exited, so names, not addresses, go into the file.
use std::collections::HashMap;

use blazesym::{
    Addr, Pid,
    symbolize::{
        Input, Symbolized, Symbolizer,
        source::{Kernel, Process, Source},
    },
};

/// Interns stacks: the same frames get the same id, and only new stacks are reported.
#[derive(Default)]
pub struct Stacks {
    ids: HashMap<Vec<String>, u32>,
}

impl Stacks {
    /// Returns the id of `frames` and whether it is new (so the caller writes it out).
    pub fn intern(&mut self, frames: Vec<String>) -> (u32, Option<Vec<String>>) {
        if let Some(&id) = self.ids.get(&frames) {
            return (id, None);
        }
        let id = self.ids.len() as u32;
        self.ids.insert(frames.clone(), id);
        (id, Some(frames))
    }
}

pub struct Namer {
    symbolizer: Symbolizer,
    /// (pid, address) -> name; pid 0 holds kernel addresses.
    cache: HashMap<(u32, u64), String>,
}

impl Default for Namer {
    fn default() -> Self {
        Self {
            symbolizer: Symbolizer::new(),
            cache: HashMap::new(),
        }
    }
}

/// The address of the kernel's `_text`, which /proc/kallsyms lists near its start.
fn kernel_text_address() -> Option<u64> {
    use std::io::BufRead as _;
    let file = std::fs::File::open("/proc/kallsyms").ok()?;
    std::io::BufReader::new(file)
        .lines()
        .take(1000)
        .map_while(Result::ok)
        .find_map(|line| {
            let mut fields = line.split_whitespace();
            let addr = u64::from_str_radix(fields.next()?, 16).ok()?;
            (fields.nth(1)? == "_text" && addr != 0).then_some(addr)
        })
}

/// The addresses of a `bpf_get_stack` buffer, leaf first. `len` is the helper's byte count.
pub fn frames(buf: &[u64], len: i32) -> &[u64] {
    let n = (len.max(0) as usize / 8).min(buf.len());
    &buf[..n]
}

/// Return addresses point after the call; step back one byte so that a call that ends a
/// function is named by that function, as perf does. The leaf is a real PC.
fn lookup_addrs(addrs: &[u64]) -> Vec<Addr> {
    addrs
        .iter()
        .enumerate()
        .map(|(i, &a)| if i == 0 { a } else { a.saturating_sub(1) })
        .collect()
}

impl Namer {
    fn names(&mut self, pid: u32, addrs: &[u64], kernel: bool) -> Vec<String> {
        let key_pid = if kernel { 0 } else { pid };
        let lookup = lookup_addrs(addrs);
        let mut missing: Vec<Addr> = lookup
            .iter()
            .copied()
            .filter(|a| !self.cache.contains_key(&(key_pid, *a)))
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            let src = if kernel {
                Source::Kernel(Kernel::default())
            } else {
                Source::Process(Process::new(Pid::from(pid)))
            };
            let resolved = self.symbolizer.symbolize(&src, Input::AbsAddr(&missing));
            for (i, addr) in missing.iter().enumerate() {
                let name = match resolved.as_ref().ok().and_then(|r| r.get(i)) {
                    Some(Symbolized::Sym(sym)) => sym.name.to_string(),
                    _ => "[unknown]".to_string(),
                };
                let name = if kernel { format!("{name}_[k]") } else { name };
                self.cache.insert((key_pid, *addr), name);
            }
        }
        lookup
            .iter()
            .map(|a| self.cache[&(key_pid, *a)].clone())
            .collect()
    }

    /// Loads the kernel's symbols now. The first kernel stack would otherwise do it: a read
    /// and parse of /proc/kallsyms that takes a tenth of a second of CPU, which should be
    /// spent before the programs attach rather than while the target is traced.
    pub fn load_kernel_symbols(&mut self) {
        if let Some(addr) = kernel_text_address() {
            self.names(0, &[addr], true);
        }
    }

    /// Names a sampled stack (addresses leaf first), root first: user frames, then kernel
    /// frames.
    pub fn name_stack(&mut self, pid: u32, user: &[u64], kernel: &[u64]) -> Vec<String> {
        let mut out: Vec<String> = self.names(pid, user, false);
        out.reverse();
        let mut k = self.names(pid, kernel, true);
        // The capture itself runs inside the sched_switch program: not the thread's stack.
        let own = k
            .iter()
            .take_while(|f| {
                f.starts_with("bpf_prog_")
                    || f.starts_with("bpf_trace_run")
                    || f.starts_with("__bpf_trace")
            })
            .count();
        k.drain(..own);
        k.reverse();
        out.extend(k);
        if out.is_empty() {
            out.push("[no stack]".to_string());
        }
        out
    }

    /// Names the function a return address returns into: the caller of a probed function.
    pub fn name_return_address(&mut self, pid: u32, addr: u64) -> String {
        if addr == 0 {
            return String::new();
        }
        // Index 1 marks it a return address (looked up one byte back).
        self.names(pid, &[0, addr], false).pop().unwrap_or_default()
    }

    /// Forgets a process's user addresses (after exec its mappings changed).
    pub fn forget(&mut self, pid: u32) {
        self.cache.retain(|(p, _), _| *p != pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_reuses_ids() {
        let mut s = Stacks::default();
        let (a, new_a) = s.intern(vec!["main".into(), "f".into()]);
        let (b, new_b) = s.intern(vec!["main".into(), "g".into()]);
        let (c, new_c) = s.intern(vec!["main".into(), "f".into()]);
        assert_eq!((a, b, c), (0, 1, 0));
        assert!(new_a.is_some() && new_b.is_some() && new_c.is_none());
    }

    #[test]
    fn stack_lengths_are_clamped() {
        let buf = [1u64, 2, 3];
        assert_eq!(frames(&buf, 16), &[1, 2]);
        assert_eq!(frames(&buf, -14), &[] as &[u64]);
        assert_eq!(frames(&buf, 800), &[1, 2, 3]);
        assert_eq!(lookup_addrs(&[10, 20]), vec![10, 19]);
    }

    #[test]
    fn names_this_process_own_function() {
        let mut n = Namer::default();
        let addr = names_this_process_own_function as *const () as u64 + 1;
        let names = n.names(std::process::id(), &[addr], false);
        assert!(
            names[0].contains("names_this_process_own_function"),
            "{names:?}"
        );
    }
}
