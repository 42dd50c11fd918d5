//! The on-CPU samples of one recording as `PerfSample`s on a packet sequence of their own: one
//! packet interning every stack they use, then a packet per sample. Encoded in pieces of about
//! [`FLUSH_AT`] bytes and sent to the thread that writes the file.
use std::io;
use std::sync::mpsc::SyncSender;

use perfetto_protos::interned_data::InternedData;
use perfetto_protos::profile_common::{Callstack, Frame, InternedString, Mapping};
use perfetto_protos::trace_packet::{TracePacket, trace_packet};
use protobuf::Message as _;

use super::clock::Clock;
use super::wire::{
    self, FLUSH_AT, SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE, io_err,
};
use crate::fxhash::FxHashMap;
use crate::timeline::RecordingLanes;

fn packet(
    buf: &mut Vec<u8>,
    seq: u32,
    flags: u32,
    fill: impl FnOnce(&mut TracePacket),
) -> io::Result<()> {
    let mut p = TracePacket::new();
    p.optional_trusted_packet_sequence_id =
        Some(trace_packet::Optional_trusted_packet_sequence_id::TrustedPacketSequenceId(seq));
    p.sequence_flags = Some(flags);
    fill(&mut p);
    wire::packet_key(buf);
    p.write_length_delimited_to_vec(buf).map_err(io_err)
}

fn interned_string(iid: u64, s: &str) -> InternedString {
    let mut i = InternedString::new();
    i.iid = Some(iid);
    i.str = Some(s.as_bytes().to_vec());
    i
}

/// Encodes `r`'s samples on sequence `seq` into `out`. A closed channel (the writer failed)
/// ends it quietly: the writer reports its own error.
pub(super) fn encode(
    r: &RecordingLanes<'_>,
    clock: &Clock,
    pid_base: u32,
    seq: u32,
    out: &SyncSender<Vec<u8>>,
) -> io::Result<()> {
    if r.samples.is_empty() {
        return Ok(());
    }
    let mut buf = Vec::with_capacity(FLUSH_AT + 4096);
    packet(&mut buf, seq, SEQ_INCREMENTAL_STATE_CLEARED, |p| {
        p.first_packet_on_sequence = Some(true);
    })?;
    let mut next_iid = 0u64;
    let mut iid = || {
        next_iid += 1;
        next_iid
    };
    let mut interned = InternedData::new();
    let (mapping, path) = (iid(), iid());
    interned
        .mapping_paths
        .push(interned_string(path, "[symbolized by stallscope]"));
    let mut m = Mapping::new();
    m.iid = Some(mapping);
    m.path_string_ids = vec![path];
    interned.mappings.push(m);
    let mut functions: FxHashMap<String, u64> = FxHashMap::default();
    let mut callstacks: FxHashMap<u32, u64> = FxHashMap::default();
    for s in r.samples.iter() {
        if callstacks.contains_key(&s.stack) {
            continue;
        }
        let unknown;
        let frames = match r.stacks.get(&s.stack) {
            Some(f) => f.as_slice(),
            None => {
                unknown = [format!("[unknown stack {}]", s.stack)];
                &unknown[..]
            }
        };
        let mut ids = Vec::with_capacity(frames.len());
        for f in frames {
            let name = match functions.get(f.as_str()) {
                Some(&id) => id,
                None => {
                    let id = iid();
                    interned.function_names.push(interned_string(id, f));
                    functions.insert(f.clone(), id);
                    id
                }
            };
            let frame = iid();
            let mut fr = Frame::new();
            fr.iid = Some(frame);
            fr.function_name_id = Some(name);
            fr.mapping_id = Some(mapping);
            interned.frames.push(fr);
            ids.push(frame);
        }
        let cs = iid();
        let mut c = Callstack::new();
        c.iid = Some(cs);
        c.frame_ids = ids;
        interned.callstacks.push(c);
        callstacks.insert(s.stack, cs);
    }
    packet(&mut buf, seq, SEQ_NEEDS_INCREMENTAL_STATE, |p| {
        p.interned_data = Some(interned).into();
        p.timestamp = Some(clock.ts(r.start_ns));
    })?;
    let pids: FxHashMap<u32, u32> = r
        .processes
        .iter()
        .flat_map(|p| p.threads.iter().map(move |t| (t.tid, p.pid)))
        .collect();
    let sequence = wire::Sequence {
        id: seq,
        flags: SEQ_NEEDS_INCREMENTAL_STATE,
    };
    for s in r.samples.iter() {
        let Some(&pid) = pids.get(&s.tid) else {
            continue;
        };
        let stack = callstacks.get(&s.stack).copied();
        wire::perf_sample(
            &mut buf,
            sequence,
            clock.ts(s.ts_ns),
            pid_base + pid,
            pid_base + s.tid,
            stack,
        );
        if buf.len() >= FLUSH_AT {
            let full = std::mem::replace(&mut buf, Vec::with_capacity(FLUSH_AT + 4096));
            if out.send(full).is_err() {
                return Ok(());
            }
        }
    }
    let _ = out.send(buf);
    Ok(())
}
