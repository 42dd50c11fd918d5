//! Which hook accounts the tracked threads' context switches, from attach to the end: the
//! `sched_switch` tracepoint or per-thread events (see `switch_choice.rs` for the costs), and
//! with `--switch-hook auto`, a move from one to the other whenever the target's share of the
//! host's switches crosses a threshold.
//!
//! A move never leaves a switch unaccounted or accounts one twice. It takes three steps,
//! [`STEP`] apart:
//! 1. the new hook is attached, inert in the old mode; moving to the tracepoint, each CPU's
//!    record of its current task is forgotten first, since the tracepoint saw none of the
//!    switches meanwhile; the mode becomes `BOTH`, where the tracepoint accounts every switch
//!    and a thread's event accounts its switch-out only if the tracepoint did not (a program
//!    that read the mode before it changed);
//! 2. the mode becomes the new hook's alone;
//! 3. the old hook is detached.
//!
//! [`STEP`] is far longer than any program runs, so none still runs on a mode read two steps
//! earlier, and each switch is seen by a program that accounts it: a switch-out the
//! tracepoint passed over (per-thread mode) is taken by the event that fires after it, in
//! `BOTH` or per-thread mode.
use aya::programs::tp_btf::BtfTracePointLinkId;
use profiler_common::switch_hook;

use super::{
    loader::{self, SwitchHook},
    switch_choice::{self, Chooser, SwitchRates},
    switch_hooks::SwitchHooks,
};

/// Between the steps of a move.
const STEP: std::time::Duration = std::time::Duration::from_millis(10);

fn mode(hook: SwitchHook) -> u32 {
    match hook {
        SwitchHook::Tracepoint => switch_hook::TRACEPOINT,
        SwitchHook::PerThread => switch_hook::PER_THREAD,
    }
}

/// The hook, as said on stderr.
pub fn name(hook: SwitchHook) -> &'static str {
    match hook {
        SwitchHook::PerThread => "per-thread events",
        SwitchHook::Tracepoint => "the sched_switch tracepoint",
    }
}

/// The counters a window's rates come from.
#[derive(Clone, Copy)]
struct Reading {
    at_ns: u64,
    host: u64,
    tracked: u64,
}

pub struct SwitchControl {
    /// The hook that accounts the switches, or that a move under way goes to.
    hook: SwitchHook,
    tracepoint: Option<BtfTracePointLinkId>,
    /// The per-thread events, while they are open.
    events: Option<SwitchHooks>,
    /// `auto`: what decides the moves.
    chooser: Option<Chooser>,
    window: Option<Reading>,
    hook_failed: bool,
}

impl SwitchControl {
    /// Attaches `hook` for the threads in `tids` (already tracked); `auto`: moves follow the
    /// rates. After the fork program attaches: a thread created from then on is reported, and
    /// [`Self::born`] decides whether it inherited its creator's event.
    pub fn start(
        ebpf: &mut aya::Ebpf,
        hook: SwitchHook,
        auto: bool,
        tids: &[u32],
    ) -> anyhow::Result<Self> {
        let mut control = Self {
            hook,
            tracepoint: None,
            events: None,
            chooser: auto.then(|| Chooser::new(hook)),
            window: None,
            hook_failed: false,
        };
        loader::set_switch_mode(ebpf, mode(hook))?;
        match hook {
            SwitchHook::Tracepoint => {
                control.tracepoint = Some(loader::attach_switch_tracepoint(ebpf)?)
            }
            SwitchHook::PerThread => control.events = Some(hook_all(ebpf, tids)?),
        }
        Ok(control)
    }

    /// A tracked thread was created: while per-thread events see the switches, it inherited
    /// its creator's event or gets one now.
    pub fn born(&mut self, ebpf: &mut aya::Ebpf, tid: u32, parent: u32, born_ns: u64) {
        let Some(events) = self
            .events
            .as_mut()
            .filter(|_| self.hook == SwitchHook::PerThread)
        else {
            return;
        };
        if let Err(e) = events.born(ebpf, tid, parent, born_ns)
            && !self.hook_failed
        {
            // The thread's switch-outs go unseen: it reads as on-CPU from its first sample on.
            // Said once per recording, with the first cause.
            self.hook_failed = true;
            eprintln!("stallscope: warning: {e:#}; that thread's time is not split");
        }
    }

    pub fn exited(&mut self, tid: u32) {
        if let Some(events) = self.events.as_mut() {
            events.exited(tid);
        }
    }

    /// At each tick, with the tracked threads alive then: at the end of a window, a move if
    /// the rates call for one. Nothing here ends a recording: what goes wrong ends the moves,
    /// said once.
    pub fn tick(&mut self, ebpf: &mut aya::Ebpf, now_ns: u64, tids: &[u32]) {
        if self.chooser.is_none() {
            return;
        }
        if let Err(e) = self.decide(ebpf, now_ns, tids) {
            self.chooser = None;
            eprintln!(
                "stallscope: warning: staying with {}: reading the switch rates: {e:#}",
                name(self.hook)
            );
        }
    }

    fn decide(&mut self, ebpf: &mut aya::Ebpf, now_ns: u64, tids: &[u32]) -> anyhow::Result<()> {
        let now = Reading {
            at_ns: now_ns,
            host: switch_choice::host_switches()?,
            tracked: loader::switches_out(ebpf)?,
        };
        let Some(start) = self.window.filter(|w| w.at_ns < now_ns) else {
            self.window = Some(now);
            return Ok(());
        };
        if now_ns - start.at_ns < switch_choice::LIVE_WINDOW.as_nanos() as u64 {
            return Ok(());
        }
        self.window = Some(now);
        let secs = (now_ns - start.at_ns) as f64 / 1e9;
        let rates = SwitchRates {
            target_per_s: now.tracked.saturating_sub(start.tracked) as f64 / secs,
            host_per_s: now.host.saturating_sub(start.host) as f64 / secs,
        };
        let Some(to) = self
            .chooser
            .as_mut()
            .and_then(|c| c.window(&rates, start.at_ns, now_ns))
        else {
            return Ok(());
        };
        match self.begin(ebpf, to, tids) {
            Ok(()) => {
                std::thread::sleep(STEP);
                let finished = loader::set_switch_mode(ebpf, mode(to)).and_then(|()| {
                    std::thread::sleep(STEP);
                    self.release(ebpf)
                });
                if let Err(e) = finished {
                    // Both hooks attached, the mode BOTH or the new one: every switch is still
                    // accounted, at the cost of both. No more moves are tried.
                    self.chooser = None;
                    eprintln!("stallscope: warning: finishing a move between switch hooks: {e:#}");
                }
                eprintln!(
                    "stallscope: context switches now seen by {} (the target made {:.0}/s, \
                     {:.1}% of the host's {:.0}/s)",
                    name(to),
                    rates.target_per_s,
                    rates.target_share() * 100.0,
                    rates.host_per_s
                );
            }
            Err(e) => {
                // The old hook still accounts everything; no more moves are tried.
                self.chooser = None;
                eprintln!(
                    "stallscope: warning: staying with {}: moving to {}: {e:#}",
                    name(self.hook),
                    name(to)
                );
            }
        }
        Ok(())
    }

    /// Step 1 of a move: attaches `to`, inert until the mode says otherwise, and sets `BOTH`;
    /// on an error, the old hook alone is left.
    fn begin(&mut self, ebpf: &mut aya::Ebpf, to: SwitchHook, tids: &[u32]) -> anyhow::Result<()> {
        match to {
            SwitchHook::PerThread => {
                let events = hook_all(ebpf, tids)?;
                if let Err(e) = loader::set_switch_mode(ebpf, switch_hook::BOTH) {
                    events.unhook_all(ebpf)?;
                    return Err(e);
                }
                self.events = Some(events);
            }
            SwitchHook::Tracepoint => {
                let link = loader::attach_switch_tracepoint(ebpf)?;
                let both = loader::clear_cpu_records(ebpf)
                    .and_then(|()| loader::set_switch_mode(ebpf, switch_hook::BOTH));
                if let Err(e) = both {
                    loader::detach_switch_tracepoint(ebpf, link)?;
                    return Err(e);
                }
                self.tracepoint = Some(link);
            }
        }
        self.hook = to;
        self.window = None;
        Ok(())
    }

    /// Step 3 of a move: detaches the hook moved from.
    fn release(&mut self, ebpf: &mut aya::Ebpf) -> anyhow::Result<()> {
        match self.hook {
            SwitchHook::PerThread => {
                if let Some(link) = self.tracepoint.take() {
                    loader::detach_switch_tracepoint(ebpf, link)?;
                }
            }
            SwitchHook::Tracepoint => {
                if let Some(events) = self.events.take() {
                    events.unhook_all(ebpf)?;
                }
            }
        }
        Ok(())
    }
}

/// An event on each of `tids`; those that exited meanwhile need none.
fn hook_all(ebpf: &mut aya::Ebpf, tids: &[u32]) -> anyhow::Result<SwitchHooks> {
    let mut events = SwitchHooks::default();
    for &tid in tids {
        if let Err(e) = events.hook(ebpf, tid) {
            events.unhook_all(ebpf)?;
            return Err(e);
        }
    }
    if events.vanished() > 0 {
        log::info!(
            "{} threads exited between the listing and their hook",
            events.vanished()
        );
    }
    Ok(events)
}
