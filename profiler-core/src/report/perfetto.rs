//! The timeline as a Perfetto trace (`.pftrace`), encoded with Perfetto's own protos (the
//! `perfetto_protos` crate, generated from Perfetto's published `.proto` files).
//!
//! One packet sequence. Per recording a top-level track names the host and file; under it,
//! per GPU: its utilization and GPM SM-activity counters, its lost time as slices named by
//! cause, its stalls. Each traced process is a Perfetto process (its ranks named), each
//! thread a thread track holding its states, with the thread's CUDA calls and block IOs and
//! the process's NCCL collectives as child tracks of the process. On-CPU samples are
//! `PerfSample`s with interned callstacks, so the UI draws them as a CPU profile; they are
//! encoded on a second thread, on packet sequences of their own.
//!
//! Timestamps are the recording's CLOCK_MONOTONIC; with several recordings (hosts), each is
//! moved to wall-clock time so the ranks line up as closely as the hosts' clocks agree, and
//! the clock caveat goes into every recording's metadata.
use crate::fxhash::FxHashMap;
use std::io::{self, Write};
use std::sync::mpsc::Receiver;

use perfetto_protos::counter_descriptor::CounterDescriptor;
use perfetto_protos::debug_annotation::{DebugAnnotation, debug_annotation};
use perfetto_protos::process_descriptor::ProcessDescriptor;
use perfetto_protos::thread_descriptor::ThreadDescriptor;
use perfetto_protos::trace_packet::{TracePacket, trace_packet};
use perfetto_protos::track_descriptor::{TrackDescriptor, track_descriptor};
use perfetto_protos::track_event::{EventName, track_event};
use protobuf::{EnumOrUnknown, Message as _};

use crate::timeline::{Arg, Point, RecordingLanes, Slice};
use crate::timeline::{STATES, StateRun};

mod clock;
mod samples;
mod wire;

use clock::Clock;
use wire::{FLUSH_AT, SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE, io_err};

/// The tracks and their events; the first recording's samples are on the next sequence, the
/// second's on the one after, and so on.
const SEQUENCE: u32 = 1;
const SAMPLE_SEQUENCES: u32 = 2;
/// PIDs of the second and later recordings are moved up by this much (Linux's PID_MAX_LIMIT)
/// times the recording's index, so that hosts' PIDs never merge.
const PID_SPACE: u32 = 1 << 22;

struct Encoder<'w> {
    w: &'w mut dyn Write,
    buf: Vec<u8>,
    /// Pieces of the samples' sequences, written between this encoder's own.
    side: Receiver<Vec<u8>>,
    next_uuid: u64,
    next_iid: u64,
    /// One packet reused for every track event that `wire` does not write: a fresh
    /// `TracePacket` is large, and building one per event was most of the encoding time.
    event: TracePacket,
    /// Event names interned so far; a name's first event carries its interning.
    names: FxHashMap<String, u64>,
}

impl<'w> Encoder<'w> {
    fn new(w: &'w mut dyn Write, side: Receiver<Vec<u8>>) -> io::Result<Self> {
        let seq = || {
            Some(
                trace_packet::Optional_trusted_packet_sequence_id::TrustedPacketSequenceId(
                    SEQUENCE,
                ),
            )
        };
        let mut event = TracePacket::new();
        event.optional_trusted_packet_sequence_id = seq();
        event.sequence_flags = Some(SEQ_NEEDS_INCREMENTAL_STATE);
        event.mut_track_event();
        let mut enc = Encoder {
            w,
            buf: Vec::with_capacity(FLUSH_AT + 4096),
            side,
            next_uuid: 0,
            next_iid: 0,
            event,
            names: FxHashMap::default(),
        };
        let mut first = TracePacket::new();
        first.optional_trusted_packet_sequence_id = seq();
        first.sequence_flags = Some(SEQ_INCREMENTAL_STATE_CLEARED);
        first.first_packet_on_sequence = Some(true);
        enc.write(&first)?;
        Ok(enc)
    }

    fn write(&mut self, p: &TracePacket) -> io::Result<()> {
        wire::packet_key(&mut self.buf);
        p.write_length_delimited_to_vec(&mut self.buf)
            .map_err(io_err)?;
        self.flush_some()
    }

    fn flush_some(&mut self) -> io::Result<()> {
        if self.buf.len() >= FLUSH_AT {
            self.w.write_all(&self.buf)?;
            self.buf.clear();
            while let Ok(piece) = self.side.try_recv() {
                self.w.write_all(&piece)?;
            }
        }
        Ok(())
    }

    /// Writes what is left, then every remaining piece of the samples as they come.
    fn finish(self) -> io::Result<()> {
        self.w.write_all(&self.buf)?;
        for piece in self.side.iter() {
            self.w.write_all(&piece)?;
        }
        self.w.flush()
    }

    fn seq() -> wire::Sequence {
        wire::Sequence {
            id: SEQUENCE,
            flags: SEQ_NEEDS_INCREMENTAL_STATE,
        }
    }

    /// A packet of its own (track descriptors, interned stacks) on the sequence.
    fn packet(&mut self, mut p: TracePacket) -> io::Result<()> {
        p.optional_trusted_packet_sequence_id = Some(
            trace_packet::Optional_trusted_packet_sequence_id::TrustedPacketSequenceId(SEQUENCE),
        );
        self.write(&p)
    }

    fn uuid(&mut self) -> u64 {
        self.next_uuid += 1;
        self.next_uuid
    }

    fn iid(&mut self) -> u64 {
        self.next_iid += 1;
        self.next_iid
    }

    fn track(&mut self, d: TrackDescriptor) -> io::Result<()> {
        let mut p = TracePacket::new();
        p.data = Some(trace_packet::Data::TrackDescriptor(d));
        self.packet(p)
    }

    fn named_track(&mut self, parent: Option<u64>, name: &str) -> io::Result<u64> {
        let uuid = self.uuid();
        let mut d = TrackDescriptor::new();
        d.uuid = Some(uuid);
        d.parent_uuid = parent;
        d.static_or_dynamic_name = Some(track_descriptor::Static_or_dynamic_name::Name(
            name.to_owned(),
        ));
        self.track(d)?;
        Ok(uuid)
    }

    fn counter_track(&mut self, parent: u64, name: &str, unit: &str) -> io::Result<u64> {
        let uuid = self.uuid();
        let mut d = TrackDescriptor::new();
        d.uuid = Some(uuid);
        d.parent_uuid = Some(parent);
        d.static_or_dynamic_name = Some(track_descriptor::Static_or_dynamic_name::Name(
            name.to_owned(),
        ));
        let mut c = CounterDescriptor::new();
        c.unit_name = Some(unit.to_owned());
        d.counter = Some(c).into();
        self.track(d)?;
        Ok(uuid)
    }

    /// Writes the reused event packet at `ts`, then clears what only this event had.
    fn emit(&mut self, ts: u64) -> io::Result<()> {
        self.event.timestamp = Some(ts);
        wire::packet_key(&mut self.buf);
        let r = self
            .event
            .write_length_delimited_to_vec(&mut self.buf)
            .map_err(io_err)
            .and_then(|()| self.flush_some());
        self.event.interned_data.clear();
        let e = self.event.mut_track_event();
        e.name_field = None;
        e.debug_annotations.clear();
        e.counter_value_field = None;
        r
    }

    fn instant(
        &mut self,
        track: u64,
        ts: u64,
        name: &str,
        args: Vec<DebugAnnotation>,
    ) -> io::Result<()> {
        self.name(name);
        let e = self.event.mut_track_event();
        e.type_ = Some(EnumOrUnknown::new(track_event::Type::TYPE_INSTANT));
        e.track_uuid = Some(track);
        e.debug_annotations = args;
        self.emit(ts)
    }

    /// Sets the event's name by iid, interning it in this packet if it is new.
    fn name(&mut self, name: &str) {
        let iid = match self.names.get(name) {
            Some(&iid) => iid,
            None => {
                let iid = self.iid();
                self.names.insert(name.to_owned(), iid);
                let mut n = EventName::new();
                n.iid = Some(iid);
                n.name = Some(name.to_owned());
                self.event
                    .interned_data
                    .mut_or_insert_default()
                    .event_names
                    .push(n);
                iid
            }
        };
        self.event.mut_track_event().name_field = Some(track_event::Name_field::NameIid(iid));
    }

    fn span(
        &mut self,
        track: u64,
        start: u64,
        end: u64,
        name: &str,
        args: &[(&'static str, Arg)],
    ) -> io::Result<()> {
        if let Some(&iid) = self.names.get(name) {
            let mut simple = [("", wire::Value::Int(0)); 4];
            let fits = args.len() <= simple.len()
                && args.iter().zip(&mut simple).all(|((k, v), slot)| {
                    let value = match v {
                        Arg::Int(i) => wire::Value::Int(*i),
                        Arg::Float(f) => wire::Value::Float(*f),
                        Arg::Str(s) => wire::Value::Str(s),
                        Arg::Json(_) => return false,
                    };
                    *slot = (k, value);
                    true
                });
            if fits {
                let (begins, ends) = (
                    track_event::Type::TYPE_SLICE_BEGIN as u64,
                    track_event::Type::TYPE_SLICE_END as u64,
                );
                let seq = Self::seq();
                let args = &simple[..args.len()];
                wire::track_event_with(&mut self.buf, seq, start, begins, track, Some(iid), args);
                wire::track_event(&mut self.buf, seq, end, ends, track, None);
                return self.flush_some();
            }
        }
        self.name(name);
        let e = self.event.mut_track_event();
        e.type_ = Some(EnumOrUnknown::new(track_event::Type::TYPE_SLICE_BEGIN));
        e.track_uuid = Some(track);
        e.debug_annotations
            .extend(args.iter().map(|(k, v)| annotation(k, v)));
        self.emit(start)?;
        let e = self.event.mut_track_event();
        e.type_ = Some(EnumOrUnknown::new(track_event::Type::TYPE_SLICE_END));
        self.emit(end)
    }

    /// A thread's state runs: millions in an hour, so each state's name is looked up once.
    fn states(&mut self, track: u64, runs: &[StateRun], clock: &Clock) -> io::Result<()> {
        let mut iids = [None; STATES.len()];
        let (begins, ends) = (
            track_event::Type::TYPE_SLICE_BEGIN as u64,
            track_event::Type::TYPE_SLICE_END as u64,
        );
        for run in runs {
            let (start, end) = (clock.ts(run.start_ns), clock.ts(run.end_ns));
            let slot = &mut iids[run.state as usize];
            let Some(iid) = *slot else {
                // The first run of a state interns its name.
                self.span(track, start, end, run.state.name(), &[])?;
                *slot = self.names.get(run.state.name()).copied();
                continue;
            };
            wire::track_event(&mut self.buf, Self::seq(), start, begins, track, Some(iid));
            wire::track_event(&mut self.buf, Self::seq(), end, ends, track, None);
            if self.buf.len() >= FLUSH_AT {
                self.flush_some()?;
            }
        }
        Ok(())
    }

    fn slices<'s>(
        &mut self,
        track: u64,
        slices: impl IntoIterator<Item = &'s Slice>,
        clock: &Clock,
    ) -> io::Result<()> {
        for s in slices {
            self.span(
                track,
                clock.ts(s.start_ns),
                clock.ts(s.end_ns),
                &s.name,
                &s.args,
            )?;
        }
        Ok(())
    }

    fn counter(&mut self, track: u64, points: &[Point], clock: &Clock) -> io::Result<()> {
        for p in points {
            let e = self.event.mut_track_event();
            e.type_ = Some(EnumOrUnknown::new(track_event::Type::TYPE_COUNTER));
            e.track_uuid = Some(track);
            e.counter_value_field = Some(track_event::Counter_value_field::DoubleCounterValue(
                p.value,
            ));
            self.emit(clock.ts(p.ts_ns))?;
        }
        Ok(())
    }
}

fn annotation(name: &str, value: &Arg) -> DebugAnnotation {
    let mut d = match value {
        Arg::Json(v) => json_annotation(v),
        other => {
            let mut d = DebugAnnotation::new();
            d.value = Some(match other {
                Arg::Int(i) => debug_annotation::Value::IntValue(*i),
                Arg::Float(f) => debug_annotation::Value::DoubleValue(*f),
                Arg::Str(s) => debug_annotation::Value::StringValue(s.clone()),
                Arg::Json(_) => unreachable!("matched above"),
            });
            d
        }
    };
    d.name_field = Some(debug_annotation::Name_field::Name(name.to_owned()));
    d
}

fn json_annotation(v: &serde_json::Value) -> DebugAnnotation {
    use serde_json::Value as J;
    let mut d = DebugAnnotation::new();
    match v {
        J::Null => d.value = Some(debug_annotation::Value::StringValue("null".into())),
        J::Bool(b) => d.value = Some(debug_annotation::Value::BoolValue(*b)),
        J::Number(n) => {
            d.value = Some(match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => debug_annotation::Value::IntValue(i),
                (None, Some(f)) => debug_annotation::Value::DoubleValue(f),
                (None, None) => debug_annotation::Value::StringValue(n.to_string()),
            });
        }
        J::String(s) => d.value = Some(debug_annotation::Value::StringValue(s.clone())),
        J::Array(items) => d.array_values = items.iter().map(json_annotation).collect(),
        J::Object(map) => {
            d.dict_entries = map
                .iter()
                .map(|(k, v)| {
                    let mut e = json_annotation(v);
                    e.name_field = Some(debug_annotation::Name_field::Name(k.clone()));
                    e
                })
                .collect();
        }
    }
    d
}

/// The Perfetto format: the timeline as a trace.
pub struct Perfetto;

impl super::model::Render for Perfetto {
    fn render(&self, input: &super::model::Inputs<'_, '_>, w: &mut dyn Write) -> io::Result<()> {
        write_trace(input.lanes, input.subject.clock_note(), w)
    }
}

/// Writes `recordings` as one trace. `clock_note` is the caveat of comparing hosts' times.
pub fn write_trace(
    recordings: &[RecordingLanes<'_>],
    clock_note: Option<&str>,
    w: &mut dyn Write,
) -> io::Result<()> {
    let wall = recordings.len() > 1 && recordings.iter().all(|r| r.wall_offset_ns != 0);
    let clock = |r: &RecordingLanes<'_>| Clock {
        offset: if wall { r.wall_offset_ns } else { 0 },
    };
    // The samples are half the packets: another thread encodes them, each recording's on a
    // sequence of its own, and this one writes their pieces between its own.
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel(4);
        let producer = scope.spawn(move || {
            for (k, r) in recordings.iter().enumerate() {
                let seq = SAMPLE_SEQUENCES + k as u32;
                samples::encode(r, &clock(r), PID_SPACE * k as u32, seq, &tx)?;
            }
            Ok::<(), io::Error>(())
        });
        let mut enc = Encoder::new(w, rx)?;
        for (k, r) in recordings.iter().enumerate() {
            recording(&mut enc, r, &clock(r), PID_SPACE * k as u32, clock_note)?;
        }
        let written = enc.finish();
        let produced = producer.join().expect("the sample encoder does not panic");
        written.and(produced)
    })
}

fn recording(
    enc: &mut Encoder<'_>,
    r: &RecordingLanes<'_>,
    clock: &Clock,
    pid_base: u32,
    clock_note: Option<&str>,
) -> io::Result<()> {
    let host = if r.host.is_empty() { "host" } else { &r.host };
    let top = enc.named_track(None, &format!("stallscope: {host} ({})", r.name))?;
    let mut args = vec![
        annotation("file", &Arg::Str(r.name.clone())),
        annotation("host", &Arg::Str(host.to_owned())),
        annotation(
            "duration_s",
            &Arg::Float((r.end_ns - r.start_ns) as f64 / 1e9),
        ),
        annotation(
            "timestamps",
            &Arg::Str(if clock.offset != 0 {
                "wall-clock time (each host's CLOCK_MONOTONIC moved by its start time)".into()
            } else {
                "the host's CLOCK_MONOTONIC".into()
            }),
        ),
    ];
    if let Some(note) = clock_note {
        args.push(annotation("clock_caveat", &Arg::Str(note.to_owned())));
    }
    enc.instant(top, clock.ts(r.start_ns), "recording", args)?;

    for g in &r.gpus {
        let gpu = enc.named_track(Some(top), &format!("GPU {}: {}", g.index, g.name))?;
        let util = enc.counter_track(gpu, &format!("GPU {} utilization (NVML)", g.index), "%")?;
        enc.counter(util, &g.util, clock)?;
        if !g.sm_active.is_empty() {
            let sm = enc.counter_track(gpu, &format!("GPU {} SM active (GPM)", g.index), "%")?;
            enc.counter(sm, &g.sm_active, clock)?;
        }
        let lost = enc.named_track(
            Some(gpu),
            &format!("GPU {} lost time by cause (idle, then waiting)", g.index),
        )?;
        enc.slices(lost, g.lost.iter().map(|(_, _, s)| s), clock)?;
        let stalls = enc.named_track(Some(gpu), &format!("GPU {} stalls", g.index))?;
        enc.slices(stalls, g.stalls.iter().map(|(_, s)| s), clock)?;
        if !g.steps.is_empty() {
            let steps = enc.named_track(Some(gpu), &format!("GPU {} training steps", g.index))?;
            enc.slices(steps, &g.steps, clock)?;
        }
    }

    for p in &r.processes {
        let pid = pid_base + p.pid;
        let uuid = enc.uuid();
        let mut d = TrackDescriptor::new();
        d.uuid = Some(uuid);
        let mut pd = ProcessDescriptor::new();
        pd.pid = Some(pid as i32);
        let rank = match (p.rank, p.collectives.is_empty()) {
            (Some(n), _) => format!(" · rank {n}"),
            (None, false) => " · rank ?".to_owned(),
            (None, true) => String::new(),
        };
        pd.process_name = Some(format!("{} (pid {}{rank}, {host})", p.name, p.pid));
        pd.cmdline = p.cmdline.split(' ').map(str::to_owned).collect();
        d.process = Some(pd).into();
        enc.track(d)?;
        for lane in &p.collectives {
            let t = enc.named_track(Some(uuid), "NCCL collectives (queued → done on the GPU)")?;
            enc.slices(t, lane, clock)?;
        }
        for t in &p.threads {
            let tuuid = enc.uuid();
            let mut d = TrackDescriptor::new();
            d.uuid = Some(tuuid);
            d.parent_uuid = Some(uuid);
            let mut td = ThreadDescriptor::new();
            td.pid = Some(pid as i32);
            td.tid = Some((pid_base + t.tid) as i32);
            td.thread_name = Some(format!("{} ({})", t.name, t.role));
            d.thread = Some(td).into();
            enc.track(d)?;
            enc.states(tuuid, &t.states, clock)?;
            for (i, lane) in t.cuda.iter().enumerate() {
                let name = format!("{} {}: CUDA calls{}", t.name, t.tid, depth(i));
                let c = enc.named_track(Some(uuid), &name)?;
                enc.slices(c, lane, clock)?;
            }
            for (i, lane) in t.block_io.iter().enumerate() {
                let name = format!("{} {}: block IO{}", t.name, t.tid, depth(i));
                let c = enc.named_track(Some(uuid), &name)?;
                enc.slices(c, lane, clock)?;
            }
        }
    }
    Ok(())
}

fn depth(i: usize) -> String {
    if i == 0 {
        String::new()
    } else {
        format!(" ({})", i + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::attribute;
    use crate::timeline::{TimelineEvents, build};

    const DDP: &[u8] = include_bytes!("../../tests/recordings/gpu/v1-nccl-straggler-ddp.rec");

    #[test]
    fn the_trace_decodes_with_perfettos_schema_and_holds_every_slice() {
        let (folded, _) = crate::load_reader(DDP).unwrap();
        let attribution = attribute(&folded.analysis, &folded.timed).unwrap();
        let events = TimelineEvents::keep(folded.timed.clone(), 50_000_000);
        let lanes = build("ddp.rec", &folded.analysis, Some(&attribution), events);
        let mut bytes = Vec::new();
        write_trace(std::slice::from_ref(&lanes), None, &mut bytes).unwrap();
        let trace = perfetto_protos::trace::Trace::parse_from_bytes(&bytes).unwrap();
        let begins = trace
            .packet
            .iter()
            .filter(|p| {
                p.track_event().type_() == track_event::Type::TYPE_SLICE_BEGIN
                    && p.has_track_event()
            })
            .count();
        let ends = trace
            .packet
            .iter()
            .filter(|p| {
                p.has_track_event() && p.track_event().type_() == track_event::Type::TYPE_SLICE_END
            })
            .count();
        let slices: usize = lanes
            .gpus
            .iter()
            .map(|g| g.lost.len() + g.stalls.len() + g.steps.len())
            .sum::<usize>()
            + lanes
                .processes
                .iter()
                .map(|p| {
                    p.collectives.iter().map(Vec::len).sum::<usize>()
                        + p.threads
                            .iter()
                            .map(|t| {
                                t.states.len()
                                    + t.cuda.iter().map(Vec::len).sum::<usize>()
                                    + t.block_io.iter().map(Vec::len).sum::<usize>()
                            })
                            .sum::<usize>()
                })
                .sum::<usize>();
        assert_eq!((begins, ends), (slices, slices));
        let samples = trace.packet.iter().filter(|p| p.has_perf_sample()).count();
        assert_eq!(samples, lanes.samples.len());
        let processes = trace
            .packet
            .iter()
            .filter(|p| p.has_track_descriptor() && p.track_descriptor().process.is_some())
            .count();
        assert_eq!(processes, lanes.processes.len());
    }
}
