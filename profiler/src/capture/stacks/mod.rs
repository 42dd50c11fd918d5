//! From a raw stack sample to named frames.
//!
//! The kernel hands over addresses (user and kernel, leaf first) walked by frame pointers,
//! and, unless switched off, a copy of the top of the user stack with the registers. An
//! [`Unwinder`] turns these into user addresses and says how far it got; the decoder names
//! them through the shared [`Namer`]. [`FramePointers`] trusts the kernel's walk alone;
//! [`Cfi`] (the default) keeps a frame-pointer walk that reaches the thread's first frame and
//! otherwise unwinds the copy with the objects' DWARF CFI ([`Dwarf`]).
mod dwarf;
mod symbolize;

use std::borrow::Cow;

pub use dwarf::{Dwarf, Quality, StackCopy, Walk};
pub use symbolize::{Namer, Stacks, frames};

/// One stack sample as the kernel captured it: addresses, leaf first.
#[derive(Clone, Copy, Debug)]
pub struct RawStack<'a> {
    pub pid: u32,
    pub user: &'a [u64],
    pub kernel: &'a [u64],
    /// The user registers and stack bytes, when the kernel sent them.
    pub copy: Option<StackCopy<'a>>,
    /// Walk the copy for where this thread's stack ends (see [`Reach`]) even when frame
    /// pointers need no copy.
    pub find_end: bool,
}

impl<'a> RawStack<'a> {
    pub fn of(pid: u32, stack: &'a profiler_common::Stack, copy: Option<StackCopy<'a>>) -> Self {
        RawStack {
            pid,
            user: frames(&stack.user, stack.user_len),
            kernel: frames(&stack.kernel, stack.kernel_len),
            copy,
            find_end: false,
        }
    }
}

/// Which walk produced a stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    FramePointers,
    Dwarf,
}

/// A sample's user addresses (leaf first: the sampled PC, then return addresses), and how
/// they were found.
#[derive(Clone, Debug)]
pub struct Unwound<'a> {
    pub user: Cow<'a, [u64]>,
    pub quality: Quality,
    pub method: Method,
    /// Time spent walking the stack copy, if it was walked.
    pub walk_ns: Option<u64>,
    pub reach: Reach,
}

/// What a walk of the stack copy learned of how much of it the next samples of the thread
/// need (see [`Walk::end`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reach {
    /// One byte past the highest address a complete walk read.
    pub end: Option<u64>,
    /// The walk wanted a word past the end of the copy.
    pub ran_off: bool,
}

impl From<&Walk> for Reach {
    fn from(w: &Walk) -> Self {
        Reach {
            end: w.end,
            ran_off: w.ran_off,
        }
    }
}

/// Turns a stack sample into user addresses.
pub trait Unwinder: Send {
    fn unwind<'a>(&mut self, stack: &RawStack<'a>, namer: &mut Namer) -> Unwound<'a>;
    /// A process exec'ed: what was known of its mappings is stale.
    fn forget(&mut self, _pid: u32) {}
    /// A process mapped new code: an address that lay in no mapping may lie in one now.
    fn new_code(&mut self, _pid: u32) {}
    /// Named problems met so far (an object without unwind information, ...), each once.
    fn warnings(&self) -> &[String] {
        &[]
    }
}

/// Functions a thread's first frame is in: a walk that ends in one is complete.
const THREAD_ROOTS: [&str; 8] = [
    "_start",
    "__libc_start_main",
    "__libc_start_call_main",
    "start_thread",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
];

/// How far the kernel's frame-pointer walk got: complete when its outermost frame is a
/// thread's first.
fn frame_pointer_quality(pid: u32, user: &[u64], namer: &mut Namer) -> Quality {
    let Some(&outermost) = user.last() else {
        return Quality::Failed;
    };
    let name = if user.len() == 1 {
        namer
            .name_stack(pid, &[outermost], &[])
            .pop()
            .unwrap_or_default()
    } else {
        namer.name_return_address(pid, outermost)
    };
    if THREAD_ROOTS.contains(&name.as_str()) {
        Quality::Complete
    } else {
        Quality::Truncated
    }
}

/// The stack the kernel walked by frame pointers: every address is a frame. Code built
/// without frame pointers ends the walk early, at an `[unknown]` frame.
#[derive(Clone, Copy, Debug, Default)]
pub struct FramePointers;

impl Unwinder for FramePointers {
    fn unwind<'a>(&mut self, stack: &RawStack<'a>, namer: &mut Namer) -> Unwound<'a> {
        Unwound {
            user: Cow::Borrowed(stack.user),
            quality: frame_pointer_quality(stack.pid, stack.user, namer),
            method: Method::FramePointers,
            walk_ns: None,
            reach: Reach::default(),
        }
    }
}

/// Frame pointers where their walk is complete (the fast path: no unwinding in user space),
/// otherwise DWARF CFI over the stack copy; the longer of the two when neither is complete.
#[derive(Default)]
pub struct Cfi {
    dwarf: Dwarf,
}

impl Unwinder for Cfi {
    fn unwind<'a>(&mut self, stack: &RawStack<'a>, namer: &mut Namer) -> Unwound<'a> {
        let fp = FramePointers.unwind(stack, namer);
        let Some(copy) = stack
            .copy
            .filter(|_| fp.quality != Quality::Complete || stack.find_end)
        else {
            return fp;
        };
        let started = std::time::Instant::now();
        let walk = self.dwarf.unwind(stack.pid, &copy);
        let walk_ns = Some(started.elapsed().as_nanos() as u64);
        let reach = Reach::from(&walk);
        if fp.quality != Quality::Complete
            && (walk.quality == Quality::Complete || walk.frames.len() > fp.user.len())
        {
            Unwound {
                user: Cow::Owned(walk.frames),
                quality: walk.quality,
                method: Method::Dwarf,
                walk_ns,
                reach,
            }
        } else {
            Unwound {
                walk_ns,
                reach,
                ..fp
            }
        }
    }

    fn forget(&mut self, pid: u32) {
        self.dwarf.forget(pid);
    }

    fn new_code(&mut self, pid: u32) {
        self.dwarf.new_code(pid);
    }

    fn warnings(&self) -> &[String] {
        &self.dwarf.warnings
    }
}

/// The decoder's unwinder: [`Cfi`] unless another is given.
pub struct Unwinding(pub Box<dyn Unwinder>);

impl Default for Unwinding {
    fn default() -> Self {
        Unwinding(Box::new(Cfi::default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn a_leaf_function() -> u64 {
        a_leaf_function as *const () as u64 + 1
    }

    #[test]
    fn frame_pointers_keep_every_address_and_judge_by_the_outermost() {
        let mut namer = Namer::default();
        let leaf = a_leaf_function();
        let caller =
            frame_pointers_keep_every_address_and_judge_by_the_outermost as *const () as u64 + 8;
        let user = [leaf, caller];
        let stack = RawStack {
            pid: std::process::id(),
            user: &user,
            kernel: &[],
            copy: None,
            find_end: false,
        };
        let mut unwinder: Box<dyn Unwinder> = Box::new(FramePointers);
        let unwound = unwinder.unwind(&stack, &mut namer);
        assert_eq!(unwound.user[..], user[..]);
        // A test function is not where a thread starts.
        assert_eq!(unwound.quality, Quality::Truncated);
        let frames = namer.name_stack(stack.pid, &unwound.user, &[]);
        assert!(
            frames[0].contains("frame_pointers_keep_every_address"),
            "{frames:?}"
        );
        assert!(frames[1].contains("a_leaf_function"), "{frames:?}");
        let none = RawStack { user: &[], ..stack };
        assert_eq!(unwinder.unwind(&none, &mut namer).quality, Quality::Failed);
    }

    /// Another unwinder sees the same sample and namer through the same trait object.
    struct Reversed;

    impl Unwinder for Reversed {
        fn unwind<'a>(&mut self, stack: &RawStack<'a>, _: &mut Namer) -> Unwound<'a> {
            Unwound {
                user: stack.user.iter().rev().copied().collect(),
                quality: Quality::Complete,
                method: Method::Dwarf,
                walk_ns: None,
                reach: Reach::default(),
            }
        }
    }

    #[test]
    fn another_unwinder_plugs_in_through_the_same_trait() {
        let mut namer = Namer::default();
        let Unwinding(mut unwinder) = Unwinding(Box::new(Reversed));
        let stack = RawStack {
            pid: std::process::id(),
            user: &[1, 2, 3],
            kernel: &[],
            copy: None,
            find_end: false,
        };
        assert_eq!(unwinder.unwind(&stack, &mut namer).user[..], [3, 2, 1]);
        assert!(unwinder.warnings().is_empty());
    }
}
