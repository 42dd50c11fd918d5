//! Handle tables (contexts, streams, events, modules, functions) and stream ordering.
//!
//! Handles are opaque non-null values that look like the pointers the real driver returns; they
//! are never dereferenced, so a stale or forged handle is an error, not a crash.
//!
//! Stream ordering follows the legacy default stream: work on the NULL stream waits for all
//! earlier work in the context's blocking streams, and work on a blocking stream waits for
//! earlier NULL-stream work. `CU_STREAM_NON_BLOCKING` streams only wait for themselves.
//!
//! What a stream has pending is its tail (last operation) plus the events it was told to wait
//! for since (cuStreamWaitEvent): the work they were recorded after. The next operation
//! submitted on the stream takes those as dependencies and becomes the tail, which then covers
//! them; until then a stream sync, query, event record or context sync sees them directly, so a
//! stream whose only pending thing is a waited event is not done until that event is.
use std::collections::HashMap;
use std::sync::Arc;

use crate::engine::Op;
use crate::memory::Memory;
use crate::ptx::Image;
use crate::result::{CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE, CuResult};

/// First handle value, then every 16 bytes, like heap pointers.
const HANDLE_BASE: u64 = 0x5eed_0000_0000;
/// `CU_STREAM_PER_THREAD`.
pub const CU_STREAM_PER_THREAD: u64 = 2;
/// Stream handles that mean the default stream: NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD.
/// The per-thread default stream is treated as the legacy one.
const DEFAULT_STREAM_HANDLES: [u64; 3] = [0, 1, CU_STREAM_PER_THREAD];

pub struct Context {
    /// The GPU (device ordinal) the context runs on.
    pub device: u32,
    /// The device's primary context (cuDevicePrimaryCtxRetain) rather than a created one.
    pub primary: bool,
    /// Tail of the NULL stream.
    pub default_tail: Option<Arc<Op>>,
    /// Event waits of the NULL stream not yet absorbed by an operation.
    pub default_waits: Vec<Arc<Op>>,
}

pub struct StreamInfo {
    pub ctx: u64,
    pub nonblocking: bool,
    pub tail: Option<Arc<Op>>,
    /// Event waits not yet absorbed by an operation.
    pub waits: Vec<Arc<Op>>,
}

impl StreamInfo {
    /// A new, empty stream of context `ctx`.
    pub fn new(ctx: u64, nonblocking: bool) -> Self {
        StreamInfo {
            ctx,
            nonblocking,
            tail: None,
            waits: Vec::new(),
        }
    }
}

impl Context {
    /// A new context on GPU `device`, its NULL stream empty.
    pub fn new(device: u32, primary: bool) -> Self {
        Context {
            device,
            primary,
            default_tail: None,
            default_waits: Vec::new(),
        }
    }
}

/// Where a recorded event sits: after `after`, reached no earlier than `recorded_ns`.
pub struct Recorded {
    pub after: Vec<Arc<Op>>,
    pub recorded_ns: u64,
}

pub struct EventInfo {
    pub timing: bool,
    pub recorded: Option<Recorded>,
}

pub struct ModuleInfo {
    pub ctx: u64,
    pub image: Image,
}

pub struct FunctionInfo {
    pub module: u64,
    pub name: String,
    /// Whether a launch may read `kernelParams[0]` (false only for PTX kernels without params).
    pub has_params: bool,
}

/// A resolved stream argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKey {
    /// The NULL stream of a context.
    Default(u64),
    Created(u64),
}

#[derive(Default)]
pub struct Tables {
    next_handle: u64,
    pub contexts: HashMap<u64, Context>,
    pub streams: HashMap<u64, StreamInfo>,
    pub events: HashMap<u64, EventInfo>,
    pub modules: HashMap<u64, ModuleInfo>,
    pub functions: HashMap<u64, FunctionInfo>,
    /// Each GPU's primary context and how many retains it has.
    pub primary: HashMap<u32, (u64, u32)>,
    pub memory: Memory,
}

impl Tables {
    /// A fresh handle value.
    pub fn new_handle(&mut self) -> u64 {
        self.next_handle += 1;
        HANDLE_BASE + self.next_handle * 16
    }

    /// Checks that `ctx` is a live context.
    pub fn context(&self, ctx: u64) -> CuResult<&Context> {
        self.contexts.get(&ctx).ok_or(CUDA_ERROR_INVALID_CONTEXT)
    }

    /// Resolves a stream argument; `current` is the calling thread's context (0 if none).
    pub fn stream(&self, handle: u64, current: u64) -> CuResult<StreamKey> {
        if DEFAULT_STREAM_HANDLES.contains(&handle) {
            self.context(current)?;
            return Ok(StreamKey::Default(current));
        }
        if self.streams.contains_key(&handle) {
            Ok(StreamKey::Created(handle))
        } else {
            Err(CUDA_ERROR_INVALID_HANDLE)
        }
    }

    /// The GPU whose engines run the work of stream `key`.
    pub fn device_of(&self, key: StreamKey) -> Option<u32> {
        let ctx = match key {
            StreamKey::Default(ctx) => ctx,
            StreamKey::Created(h) => self.streams.get(&h)?.ctx,
        };
        Some(self.contexts.get(&ctx)?.device)
    }

    /// The tail and unabsorbed event waits of `key` (empty for a stream that does not exist).
    fn parts(&self, key: StreamKey) -> (Option<&Arc<Op>>, &[Arc<Op>]) {
        match key {
            StreamKey::Default(ctx) => self
                .contexts
                .get(&ctx)
                .map_or((None, &[]), |c| (c.default_tail.as_ref(), &c.default_waits)),
            StreamKey::Created(h) => self
                .streams
                .get(&h)
                .map_or((None, &[]), |s| (s.tail.as_ref(), &s.waits)),
        }
    }

    /// What `key` itself has pending: its last operation (once that is done, all earlier work
    /// of the stream is) and the event waits queued since, those not done yet.
    pub fn own_pending(&self, key: StreamKey) -> Vec<Arc<Op>> {
        let (tail, waits) = self.parts(key);
        tail.into_iter()
            .chain(waits)
            .filter(|op| !op.is_done())
            .cloned()
            .collect()
    }

    /// Pending work that new work on `key` must wait for.
    pub fn pending_before(&self, key: StreamKey) -> Vec<Arc<Op>> {
        let mut deps = self.own_pending(key);
        match key {
            StreamKey::Default(ctx) => {
                let blocking: Vec<u64> = self
                    .streams
                    .iter()
                    .filter(|(_, s)| s.ctx == ctx && !s.nonblocking)
                    .map(|(h, _)| *h)
                    .collect();
                for h in blocking {
                    deps.extend(self.own_pending(StreamKey::Created(h)));
                }
            }
            StreamKey::Created(h) => {
                if let Some(s) = self.streams.get(&h).filter(|s| !s.nonblocking) {
                    deps.extend(self.own_pending(StreamKey::Default(s.ctx)));
                }
            }
        }
        deps
    }

    /// Makes `op` the last operation of `key`. `op` was submitted after [`Tables::pending_before`]
    /// of `key`, so it depends on the stream's event waits: they are absorbed into it.
    pub fn set_tail(&mut self, key: StreamKey, op: Arc<Op>) {
        match key {
            StreamKey::Default(ctx) => {
                if let Some(c) = self.contexts.get_mut(&ctx) {
                    c.default_tail = Some(op);
                    c.default_waits.clear();
                }
            }
            StreamKey::Created(h) => {
                if let Some(s) = self.streams.get_mut(&h) {
                    s.tail = Some(op);
                    s.waits.clear();
                }
            }
        }
    }

    /// cuStreamWaitEvent: work queued on `key` from now on waits for `ops` (an event's recorded
    /// work) too. Ops already done are dropped, and so are the stream's waits done by now.
    pub fn add_waits(&mut self, key: StreamKey, ops: Vec<Arc<Op>>) {
        let waits = match key {
            StreamKey::Default(ctx) => self.contexts.get_mut(&ctx).map(|c| &mut c.default_waits),
            StreamKey::Created(h) => self.streams.get_mut(&h).map(|s| &mut s.waits),
        };
        if let Some(waits) = waits {
            waits.retain(|op| !op.is_done());
            waits.extend(ops.into_iter().filter(|op| !op.is_done()));
        }
    }

    /// All pending work of context `ctx` (cuCtxSynchronize), event waits included.
    pub fn pending_in_ctx(&self, ctx: u64) -> Vec<Arc<Op>> {
        let mut ops = self.own_pending(StreamKey::Default(ctx));
        for (h, _) in self.streams.iter().filter(|(_, s)| s.ctx == ctx) {
            ops.extend(self.own_pending(StreamKey::Created(*h)));
        }
        ops
    }

    /// All pending work of the process (frees of host memory wait for it).
    pub fn pending_anywhere(&self) -> Vec<Arc<Op>> {
        self.contexts
            .keys()
            .flat_map(|ctx| self.pending_in_ctx(*ctx))
            .collect()
    }

    /// Removes context `ctx` and everything created in it; returns its device allocations as
    /// (backing, reservation, length) for the caller to unmap.
    pub fn remove_context(&mut self, ctx: u64) -> Vec<(usize, u64, usize)> {
        self.contexts.remove(&ctx);
        self.streams.retain(|_, s| s.ctx != ctx);
        let modules: Vec<u64> = self
            .modules
            .iter()
            .filter(|(_, m)| m.ctx == ctx)
            .map(|(h, _)| *h)
            .collect();
        for module in modules {
            self.remove_module(module);
        }
        let allocs: Vec<u64> = self
            .memory
            .device
            .iter()
            .filter(|(_, a)| a.ctx == ctx)
            .map(|(base, _)| *base)
            .collect();
        allocs
            .into_iter()
            .filter_map(|base| {
                let a = self.memory.device.remove(&base)?;
                Some((a.backing, base, a.len))
            })
            .collect()
    }

    /// Removes a module and its functions.
    pub fn remove_module(&mut self, module: u64) -> bool {
        self.functions.retain(|_, f| f.module != module);
        self.modules.remove(&module).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Engines, Work};

    fn tables_with_ctx() -> (Tables, u64) {
        let mut t = Tables::default();
        let ctx = t.new_handle();
        t.contexts.insert(ctx, Context::new(1, false));
        (t, ctx)
    }

    fn add_stream(t: &mut Tables, ctx: u64, nonblocking: bool) -> u64 {
        let h = t.new_handle();
        t.streams.insert(h, StreamInfo::new(ctx, nonblocking));
        h
    }

    fn kernel() -> Work {
        Work::Kernel {
            duration_ns: 0,
            sm_share_pct: 90,
        }
    }

    fn holds(ops: &[Arc<Op>], op: &Arc<Op>) -> bool {
        ops.iter().any(|o| Arc::ptr_eq(o, op))
    }

    #[test]
    fn event_waits_are_pending_until_absorbed() {
        // Ops are never run here (no engine threads), so all stay pending.
        static ENGINES: Engines = Engines::new();
        let op = || ENGINES.submit(kernel(), Vec::new());
        let (mut t, ctx) = tables_with_ctx();
        let (a, b, c) = (
            add_stream(&mut t, ctx, true),
            add_stream(&mut t, ctx, true),
            add_stream(&mut t, ctx, true),
        );
        let (sa, sb, sc) = (
            StreamKey::Created(a),
            StreamKey::Created(b),
            StreamKey::Created(c),
        );
        // K1 on A; an event recorded on A is after it; B waits for that event.
        let k1 = op();
        t.set_tail(sa, k1.clone());
        let event = t.pending_before(sa);
        t.add_waits(sb, event);
        // B's only pending thing is the wait: a sync or query of B sees K1.
        assert!(holds(&t.own_pending(sb), &k1));
        assert!(
            holds(&t.pending_before(sb), &k1),
            "K2 on B will wait for K1"
        );
        assert!(t.pending_before(sc).is_empty(), "C does not");
        assert_eq!(
            t.pending_in_ctx(ctx).len(),
            2,
            "K1 as A's tail and as B's wait"
        );
        // An event recorded on B now covers K1 too.
        let on_b = t.pending_before(sb);
        assert!(holds(&on_b, &k1));
        // K2 absorbs the wait: B's pending work is K2 alone, which depends on K1.
        let k2 = ENGINES.submit(kernel(), t.pending_before(sb));
        t.set_tail(sb, k2.clone());
        let pending = t.own_pending(sb);
        assert_eq!(pending.len(), 1);
        assert!(Arc::ptr_eq(&pending[0], &k2));
        // A never-recorded event has no work: waiting for it adds nothing.
        t.add_waits(sc, Vec::new());
        assert!(t.own_pending(sc).is_empty());
    }

    #[test]
    fn the_null_stream_and_blocking_streams_see_each_others_waits() {
        static ENGINES: Engines = Engines::new();
        let op = || ENGINES.submit(kernel(), Vec::new());
        let (mut t, ctx) = tables_with_ctx();
        let blocking = add_stream(&mut t, ctx, false);
        let nonblocking = add_stream(&mut t, ctx, true);
        let k = op();
        t.set_tail(StreamKey::Created(nonblocking), k.clone());
        t.add_waits(StreamKey::Created(blocking), vec![k.clone()]);
        // Legacy NULL-stream work waits for the blocking stream, wait included.
        assert!(holds(&t.pending_before(StreamKey::Default(ctx)), &k));
        t.add_waits(StreamKey::Default(ctx), vec![k.clone()]);
        let other = add_stream(&mut t, ctx, false);
        assert!(holds(&t.pending_before(StreamKey::Created(other)), &k));
        assert!(t.own_pending(StreamKey::Created(other)).is_empty());
    }

    #[test]
    fn default_stream_handles_need_a_current_context() {
        let (t, ctx) = tables_with_ctx();
        assert_eq!(t.stream(0, ctx), Ok(StreamKey::Default(ctx)));
        assert_eq!(t.stream(2, ctx), Ok(StreamKey::Default(ctx)));
        assert_eq!(t.stream(0, 0), Err(CUDA_ERROR_INVALID_CONTEXT));
        assert_eq!(t.stream(0x1234, ctx), Err(CUDA_ERROR_INVALID_HANDLE));
    }

    #[test]
    fn legacy_stream_ordering() {
        // Ops are never run here (no engine threads), so all stay pending.
        static ENGINES: Engines = Engines::new();
        let op = || ENGINES.submit(kernel(), Vec::new());
        let (mut t, ctx) = tables_with_ctx();
        let blocking = add_stream(&mut t, ctx, false);
        let nonblocking = add_stream(&mut t, ctx, true);
        let (a, b) = (op(), op());
        t.set_tail(StreamKey::Created(blocking), a.clone());
        t.set_tail(StreamKey::Created(nonblocking), b.clone());
        assert_eq!(t.device_of(StreamKey::Created(blocking)), Some(1));
        assert_eq!(t.device_of(StreamKey::Default(ctx)), Some(1));
        let on_default = t.pending_before(StreamKey::Default(ctx));
        assert_eq!(on_default.len(), 1);
        assert!(Arc::ptr_eq(&on_default[0], &a));
        let c = op();
        t.set_tail(StreamKey::Default(ctx), c.clone());
        let on_blocking = t.pending_before(StreamKey::Created(blocking));
        assert_eq!(on_blocking.len(), 2);
        let on_nonblocking = t.pending_before(StreamKey::Created(nonblocking));
        assert_eq!(on_nonblocking.len(), 1);
        assert!(Arc::ptr_eq(&on_nonblocking[0], &b));
        assert_eq!(t.pending_in_ctx(ctx).len(), 3);
        t.remove_context(ctx);
        assert!(t.streams.is_empty());
    }
}
