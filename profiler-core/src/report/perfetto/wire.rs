//! Protobuf's wire format for the two packets a trace holds millions of: a track event that is
//! a slice's begin or end with no arguments (a thread's states), and a CPU sample. Building a
//! rust-protobuf `TracePacket` for each cost about 130 ns, most of an hour's trace; these are
//! written straight into the output buffer. Field numbers are Perfetto's (`trace_packet.proto`,
//! `track_event.proto`, `profile_packet.proto`); the tests decode what these write with
//! Perfetto's generated messages and compare them with the messages built the slow way.

pub(super) const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
pub(super) const SEQ_NEEDS_INCREMENTAL_STATE: u32 = 2;
/// Packets are gathered here and written out in pieces of about this size.
pub(super) const FLUSH_AT: usize = 1 << 20;

pub(super) fn io_err(e: protobuf::Error) -> std::io::Error {
    std::io::Error::other(e)
}

const VARINT: u32 = 0;
const I64: u32 = 1;
const LEN: u32 = 2;

// TracePacket
const TIMESTAMP: u32 = 8;
const SEQUENCE_ID: u32 = 10;
const TRACK_EVENT: u32 = 11;
const SEQUENCE_FLAGS: u32 = 13;
const PERF_SAMPLE: u32 = 66;
// TrackEvent
const DEBUG_ANNOTATIONS: u32 = 4;
const TYPE: u32 = 9;
const NAME_IID: u32 = 10;
const TRACK_UUID: u32 = 11;
// PerfSample
const PID: u32 = 2;
const TID: u32 = 3;
const CALLSTACK_IID: u32 = 4;
// DebugAnnotation
const ANNOTATION_NAME: u32 = 10;
const INT_VALUE: u32 = 4;
const DOUBLE_VALUE: u32 = 5;
const STRING_VALUE: u32 = 6;
/// `Trace.packet`.
const PACKET: u32 = 1;

/// A debug annotation's value, of the kinds a slice's arguments take.
#[derive(Clone, Copy)]
pub enum Value<'a> {
    Int(i64),
    Float(f64),
    Str(&'a str),
}

fn len_field_len(number: u32, len: usize) -> usize {
    varint_len(u64::from(number << 3)) + varint_len(len as u64) + len
}

fn annotation_len(name: &str, v: Value<'_>) -> usize {
    len_field_len(ANNOTATION_NAME, name.len())
        + match v {
            Value::Int(i) => field_len(INT_VALUE, i as u64),
            Value::Float(_) => varint_len(u64::from(DOUBLE_VALUE << 3)) + 8,
            Value::Str(s) => len_field_len(STRING_VALUE, s.len()),
        }
}

fn bytes_field(buf: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    key(buf, number, LEN);
    varint(buf, bytes.len() as u64);
    buf.extend_from_slice(bytes);
}

fn annotation(buf: &mut Vec<u8>, name: &str, v: Value<'_>) {
    key(buf, DEBUG_ANNOTATIONS, LEN);
    varint(buf, annotation_len(name, v) as u64);
    bytes_field(buf, ANNOTATION_NAME, name.as_bytes());
    match v {
        // int64 is encoded as its two's complement, ten bytes when negative.
        Value::Int(i) => field(buf, INT_VALUE, i as u64),
        Value::Float(f) => {
            key(buf, DOUBLE_VALUE, I64);
            buf.extend_from_slice(&f.to_le_bytes());
        }
        Value::Str(s) => bytes_field(buf, STRING_VALUE, s.as_bytes()),
    }
}

fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    (70 - (v | 1).leading_zeros() as usize) / 7
}

fn key(buf: &mut Vec<u8>, field: u32, wire: u32) {
    varint(buf, u64::from(field << 3 | wire));
}

fn field(buf: &mut Vec<u8>, number: u32, v: u64) {
    key(buf, number, VARINT);
    varint(buf, v);
}

/// A varint field's encoded size, key included.
fn field_len(number: u32, v: u64) -> usize {
    varint_len(u64::from(number << 3)) + varint_len(v)
}

/// What every packet of the sequence carries after its payload.
#[derive(Clone, Copy)]
pub struct Sequence {
    pub id: u32,
    pub flags: u32,
}

impl Sequence {
    fn len(self) -> usize {
        field_len(SEQUENCE_ID, self.id.into()) + field_len(SEQUENCE_FLAGS, self.flags.into())
    }

    fn write(self, buf: &mut Vec<u8>) {
        field(buf, SEQUENCE_ID, self.id.into());
        field(buf, SEQUENCE_FLAGS, self.flags.into());
    }
}

/// The key of a `Trace.packet`; its length and the packet follow.
pub fn packet_key(buf: &mut Vec<u8>) {
    key(buf, PACKET, LEN);
}

/// One `Trace.packet` holding `ts`, a submessage of `body_len` bytes as field `payload` that
/// `body` writes, and the sequence fields.
fn packet(
    buf: &mut Vec<u8>,
    seq: Sequence,
    ts: u64,
    payload: u32,
    body_len: usize,
    body: impl FnOnce(&mut Vec<u8>),
) {
    let inner = field_len(TIMESTAMP, ts)
        + varint_len(u64::from(payload << 3))
        + varint_len(body_len as u64)
        + body_len
        + seq.len();
    packet_key(buf);
    varint(buf, inner as u64);
    field(buf, TIMESTAMP, ts);
    key(buf, payload, LEN);
    varint(buf, body_len as u64);
    let at = buf.len();
    body(buf);
    debug_assert_eq!(buf.len() - at, body_len);
    seq.write(buf);
}

/// A `TrackEvent` of type `kind` (a `track_event::Type` value) on `track`, named by an iid
/// already interned on the sequence, or unnamed (a slice's end).
pub fn track_event(
    buf: &mut Vec<u8>,
    seq: Sequence,
    ts: u64,
    kind: u64,
    track: u64,
    name_iid: Option<u64>,
) {
    track_event_with(buf, seq, ts, kind, track, name_iid, &[]);
}

/// As [`track_event`], with debug annotations (a slice's arguments).
pub fn track_event_with(
    buf: &mut Vec<u8>,
    seq: Sequence,
    ts: u64,
    kind: u64,
    track: u64,
    name_iid: Option<u64>,
    args: &[(&str, Value<'_>)],
) {
    let len = field_len(TYPE, kind)
        + name_iid.map_or(0, |n| field_len(NAME_IID, n))
        + field_len(TRACK_UUID, track)
        + args
            .iter()
            .map(|&(n, v)| len_field_len(DEBUG_ANNOTATIONS, annotation_len(n, v)))
            .sum::<usize>();
    packet(buf, seq, ts, TRACK_EVENT, len, |buf| {
        field(buf, TYPE, kind);
        if let Some(n) = name_iid {
            field(buf, NAME_IID, n);
        }
        field(buf, TRACK_UUID, track);
        for &(n, v) in args {
            annotation(buf, n, v);
        }
    });
}

/// A `PerfSample` of thread `tid` in `pid`, its stack an interned callstack.
pub fn perf_sample(
    buf: &mut Vec<u8>,
    seq: Sequence,
    ts: u64,
    pid: u32,
    tid: u32,
    callstack: Option<u64>,
) {
    let len = field_len(PID, pid.into())
        + field_len(TID, tid.into())
        + callstack.map_or(0, |c| field_len(CALLSTACK_IID, c));
    packet(buf, seq, ts, PERF_SAMPLE, len, |buf| {
        field(buf, PID, pid.into());
        field(buf, TID, tid.into());
        if let Some(c) = callstack {
            field(buf, CALLSTACK_IID, c);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use perfetto_protos::trace::Trace;
    use perfetto_protos::trace_packet::{TracePacket, trace_packet};
    use perfetto_protos::track_event::track_event;
    use protobuf::{EnumOrUnknown, Message as _};

    fn seq() -> Sequence {
        Sequence { id: 1, flags: 2 }
    }

    fn decoded(buf: &[u8]) -> Vec<TracePacket> {
        Trace::parse_from_bytes(buf).unwrap().packet
    }

    fn expected(ts: u64) -> TracePacket {
        let mut p = TracePacket::new();
        p.timestamp = Some(ts);
        p.optional_trusted_packet_sequence_id =
            Some(trace_packet::Optional_trusted_packet_sequence_id::TrustedPacketSequenceId(1));
        p.sequence_flags = Some(2);
        p
    }

    #[test]
    fn varint_lengths_match_what_is_written() {
        for v in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut buf = Vec::new();
            varint(&mut buf, v);
            assert_eq!(buf.len(), varint_len(v), "{v}");
        }
    }

    #[test]
    fn track_events_decode_as_the_messages_they_stand_for() {
        let mut buf = Vec::new();
        let ts = 1_700_000_000_123_456_789;
        track_event(&mut buf, seq(), ts, 1, 300, Some(7));
        track_event(&mut buf, seq(), ts + 5, 2, u64::MAX, None);
        let mut begin = expected(ts);
        let e = begin.mut_track_event();
        e.type_ = Some(EnumOrUnknown::new(track_event::Type::TYPE_SLICE_BEGIN));
        e.track_uuid = Some(300);
        e.name_field = Some(track_event::Name_field::NameIid(7));
        let mut end = expected(ts + 5);
        let e = end.mut_track_event();
        e.type_ = Some(EnumOrUnknown::new(track_event::Type::TYPE_SLICE_END));
        e.track_uuid = Some(u64::MAX);
        assert_eq!(decoded(&buf), vec![begin, end]);
    }

    #[test]
    fn annotated_events_decode_as_the_messages_they_stand_for() {
        use perfetto_protos::debug_annotation::{DebugAnnotation, debug_annotation};
        let mut buf = Vec::new();
        let args = [
            ("bytes", Value::Int(1 << 40)),
            ("delta", Value::Int(-3)),
            ("latency_ms", Value::Float(2.5)),
            ("kind", Value::Str("read")),
        ];
        track_event_with(&mut buf, seq(), 77, 1, 9, Some(3), &args);
        let mut want = expected(77);
        let e = want.mut_track_event();
        e.type_ = Some(EnumOrUnknown::new(track_event::Type::TYPE_SLICE_BEGIN));
        e.track_uuid = Some(9);
        e.name_field = Some(track_event::Name_field::NameIid(3));
        for (name, v) in args {
            let mut d = DebugAnnotation::new();
            d.name_field = Some(debug_annotation::Name_field::Name(name.into()));
            d.value = Some(match v {
                Value::Int(i) => debug_annotation::Value::IntValue(i),
                Value::Float(f) => debug_annotation::Value::DoubleValue(f),
                Value::Str(s) => debug_annotation::Value::StringValue(s.into()),
            });
            e.debug_annotations.push(d);
        }
        assert_eq!(decoded(&buf), vec![want]);
    }

    #[test]
    fn samples_decode_as_the_messages_they_stand_for() {
        let mut buf = Vec::new();
        perf_sample(&mut buf, seq(), 0, 1 << 22, 4_000_000, Some(1 << 40));
        perf_sample(&mut buf, seq(), 9, 1, 2, None);
        let mut with = expected(0);
        let ps = with.mut_perf_sample();
        ps.pid = Some(1 << 22);
        ps.tid = Some(4_000_000);
        ps.callstack_iid = Some(1 << 40);
        let mut without = expected(9);
        let ps = without.mut_perf_sample();
        ps.pid = Some(1);
        ps.tid = Some(2);
        assert_eq!(decoded(&buf), vec![with, without]);
    }
}
