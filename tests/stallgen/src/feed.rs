//! Where the feeder gets its batches: straight from the workers' shared memory (pageable),
//! or through a pin-memory thread that first copies each batch into page-locked buffers, as
//! `DataLoader(pin_memory=True)` does.
use std::{
    sync::mpsc::{Receiver, SyncSender, sync_channel},
    thread,
};

use anyhow::{Context as _, Result, anyhow};

use crate::loader::{Batch, Loader};

/// Page-locked buffers the pin-memory thread rotates through.
const PIN_BUFFERS: usize = 2;

/// A page-locked buffer from cuMemHostAlloc.
#[derive(Clone, Copy)]
pub struct Pinned(pub *mut u8);

// SAFETY: the buffer is plain memory; the channels below hand it between exactly one writer
// (the pin thread) and one reader (the feeder) at a time.
unsafe impl Send for Pinned {}

/// A batch the feeder is copying to the GPU.
pub enum Held {
    /// A worker's slot, in pageable shared memory.
    Slot(Batch),
    /// One of the pin thread's buffers.
    Pinned(usize),
}

pub enum Feed {
    Direct(Loader),
    Pinned {
        bufs: Vec<Pinned>,
        ready: Receiver<Result<usize>>,
        free: SyncSender<usize>,
    },
}

impl Feed {
    /// Starts the pin-memory thread over `loader`, with buffers from `alloc`.
    pub fn pinned(
        mut loader: Loader,
        batch_bytes: usize,
        mut alloc: impl FnMut(usize) -> Result<*mut u8>,
    ) -> Result<Self> {
        let bufs = (0..PIN_BUFFERS)
            .map(|_| alloc(batch_bytes).map(Pinned))
            .collect::<Result<Vec<_>>>()?;
        let (ready_tx, ready) = sync_channel::<Result<usize>>(PIN_BUFFERS);
        let (free, free_rx) = sync_channel::<usize>(PIN_BUFFERS);
        for i in 0..PIN_BUFFERS {
            free.send(i)?;
        }
        let thread_bufs = bufs.clone();
        thread::Builder::new()
            .name("pin_memory".to_owned())
            .spawn(move || {
                // The loop ends when the feeder drops its channel ends.
                while let Ok(i) = free_rx.recv() {
                    let r = loader.next_batch().and_then(|b| {
                        // SAFETY: the slot is ours until `release`; buffer `i` came back
                        // through `free`, so the feeder no longer reads it. Both hold
                        // batch_bytes.
                        unsafe {
                            std::ptr::copy_nonoverlapping(b.ptr, thread_bufs[i].0, batch_bytes)
                        };
                        loader.release(b).map(|()| i)
                    });
                    let failed = r.is_err();
                    if ready_tx.send(r).is_err() || failed {
                        break;
                    }
                }
            })
            .context("starting the pin-memory thread")?;
        Ok(Self::Pinned { bufs, ready, free })
    }

    /// Waits for the next batch; returns it and where its bytes are.
    pub fn next(&mut self) -> Result<(Held, *const u8)> {
        match self {
            Self::Direct(loader) => {
                let b = loader.next_batch()?;
                Ok((Held::Slot(b), b.ptr))
            }
            Self::Pinned { bufs, ready, .. } => {
                let i = ready
                    .recv()
                    .map_err(|_| anyhow!("the pin-memory thread stopped"))??;
                Ok((Held::Pinned(i), bufs[i].0.cast_const()))
            }
        }
    }

    /// The batch's copy call has returned: a pageable source was staged by the driver, so
    /// its slot may go back to the worker now.
    pub fn copied(&mut self, h: &Held) -> Result<()> {
        match (self, h) {
            (Self::Direct(loader), Held::Slot(b)) => loader.release(*b),
            _ => Ok(()),
        }
    }

    /// The step has synchronised: a pinned source's asynchronous copy is complete.
    pub fn synced(&mut self, h: Held) -> Result<()> {
        match (self, h) {
            (Self::Pinned { free, .. }, Held::Pinned(i)) => free
                .send(i)
                .map_err(|_| anyhow!("the pin-memory thread stopped")),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::{SEQ_BYTES, read_seq, tests::loader_on_threads};

    #[test]
    fn the_pin_thread_delivers_every_batch_in_order() {
        let (loader, _workers) = loader_on_threads(2);
        let mut feed = Feed::pinned(loader, 8192, |n| {
            Ok(Box::leak(vec![0u8; n].into_boxed_slice()).as_mut_ptr())
        })
        .unwrap();
        for seq in 0..20u64 {
            let (held, ptr) = feed.next().unwrap();
            assert!(matches!(held, Held::Pinned(_)));
            // SAFETY: the buffer is the feeder's until `synced`.
            let bytes = unsafe { std::slice::from_raw_parts(ptr, 8192) };
            assert_eq!(read_seq(bytes), seq);
            assert_eq!(bytes[SEQ_BYTES], seq as u8 | 1);
            feed.copied(&held).unwrap();
            feed.synced(held).unwrap();
        }
    }
}
