//! From a raw stack sample to named frames.
//!
//! The kernel hands over addresses (user and kernel, leaf first); an [`Unwinder`] turns them
//! into frames, root first, naming addresses through the shared [`Namer`]. Frame pointers are
//! the one unwinder today ([`FramePointers`]: the kernel's walk is the stack). An unwinder
//! that reads the Python interpreter's frames, or one that unwinds a copy of the user stack
//! with DWARF CFI, implements the same trait and is handed to the decoder in its place.
mod symbolize;

pub use symbolize::{Namer, Stacks, frames};

/// One stack sample as the kernel captured it: addresses, leaf first.
#[derive(Clone, Copy, Debug)]
pub struct RawStack<'a> {
    pub pid: u32,
    pub user: &'a [u64],
    pub kernel: &'a [u64],
}

impl<'a> RawStack<'a> {
    pub fn of(pid: u32, stack: &'a profiler_common::Stack) -> Self {
        RawStack {
            pid,
            user: frames(&stack.user, stack.user_len),
            kernel: frames(&stack.kernel, stack.kernel_len),
        }
    }
}

/// Turns a stack sample into frames.
pub trait Unwinder: Send {
    /// The frames of `stack`, root first: user frames, then kernel frames.
    fn unwind(&mut self, stack: &RawStack<'_>, namer: &mut Namer) -> Vec<String>;
}

/// The stack the kernel walked by frame pointers: every address is a frame. Code built
/// without frame pointers ends the walk early, at an `[unknown]` frame.
#[derive(Clone, Copy, Debug, Default)]
pub struct FramePointers;

impl Unwinder for FramePointers {
    fn unwind(&mut self, stack: &RawStack<'_>, namer: &mut Namer) -> Vec<String> {
        namer.name_stack(stack.pid, stack.user, stack.kernel)
    }
}

/// The decoder's unwinder: frame pointers unless another is given.
pub struct Unwinding(pub Box<dyn Unwinder>);

impl Default for Unwinding {
    fn default() -> Self {
        Unwinding(Box::new(FramePointers))
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
    fn frame_pointers_name_every_address_root_first() {
        let mut namer = Namer::default();
        let leaf = a_leaf_function();
        let caller = frame_pointers_name_every_address_root_first as *const () as u64 + 8;
        let user = [leaf, caller];
        let stack = RawStack {
            pid: std::process::id(),
            user: &user,
            kernel: &[],
        };
        let mut unwinder: Box<dyn Unwinder> = Box::new(FramePointers);
        let frames = unwinder.unwind(&stack, &mut namer);
        assert_eq!(frames.len(), 2, "{frames:?}");
        assert!(
            frames[0].contains("frame_pointers_name_every_address"),
            "{frames:?}"
        );
        assert!(frames[1].contains("a_leaf_function"), "{frames:?}");
    }

    /// What another unwinder looks like to the decoder: it sees the same sample and namer.
    struct Marked;

    impl Unwinder for Marked {
        fn unwind(&mut self, stack: &RawStack<'_>, namer: &mut Namer) -> Vec<String> {
            let mut frames = FramePointers.unwind(stack, namer);
            frames.insert(0, "[python]".into());
            frames
        }
    }

    #[test]
    fn another_unwinder_plugs_in_through_the_same_trait() {
        let mut namer = Namer::default();
        let Unwinding(mut unwinder) = Unwinding(Box::new(Marked));
        let stack = RawStack {
            pid: std::process::id(),
            user: &[],
            kernel: &[],
        };
        assert_eq!(
            unwinder.unwind(&stack, &mut namer),
            ["[python]", "[no stack]"]
        );
    }
}
