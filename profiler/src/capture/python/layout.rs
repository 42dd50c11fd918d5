//! The layouts of the CPython structures stallscope reads out of a live process's
//! memory (from the kernel programs and from /proc/PID/mem), one per minor version 3.8 to
//! 3.13. The table is not written by hand: `layouts.c`, next to this file, compiled against
//! each version's own headers (internal ones included, with `-DPy_BUILD_CORE`) prints each
//! entry with offsetof and sizeof; its top comment says how to regenerate it. The numbers hold
//! for release builds with the GIL (no Py_DEBUG, Py_TRACE_REFS or free threading), the builds
//! every distribution ships, and were checked against running 3.8.18, 3.9.18, 3.10.13, 3.11.7,
//! 3.12.1 and 3.13.0 interpreters (3.13's also against its own `_Py_DebugOffsets`). x86_64
//! and aarch64 are both LP64 with natural alignment, so one table serves both:
//! `tests/tests/python_layouts.rs` compiles layouts.c for each and holds both to this table.

/// Where the fields stallscope reads lie, in bytes from the start of their struct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub version: (u8, u8),
    /// _PyRuntimeState: interpreters.head
    pub runtime_interpreters_head: u64,
    /// PyInterpreterState: next
    pub interp_next: u64,
    /// PyInterpreterState: tstate_head (3.8-3.10) / threads.head (3.11+)
    pub interp_threads_head: u64,
    /// PyThreadState: next
    pub tstate_next: u64,
    /// PyThreadState: thread_id (the pthread_t)
    pub tstate_thread_id: u64,
    /// PyThreadState: native_thread_id, where it exists (3.11+; else None)
    pub tstate_native_thread_id: Option<u64>,
    /// PyThreadState: `frame` (3.8-3.10, a PyFrameObject*), `cframe` (3.11, 3.12, a _PyCFrame*),
    /// `current_frame` (3.13+, a _PyInterpreterFrame*)
    pub tstate_frame: u64,
    /// _PyCFrame: current_frame (3.11, 3.12 only; None otherwise)
    pub cframe_current_frame: Option<u64>,
    /// The frame struct: PyFrameObject (3.8-3.10) or _PyInterpreterFrame (3.11+): f_code
    /// (3.8-3.12) / f_executable (3.13)
    pub frame_code: u64,
    /// f_back (3.8-3.10) / previous (3.11+)
    pub frame_previous: u64,
    /// f_lasti (3.8-3.10, an int: in bytes in 3.8, 3.9, in 2-byte code units in 3.10) /
    /// prev_instr (3.11, 3.12, a pointer) / instr_ptr (3.13, a pointer)
    pub frame_instr: u64,
    /// is_entry (3.11, a bool: the first frame of an evaluation loop run) / owner (3.12+, a
    /// char, see `owner_cstack`); None before 3.11
    pub frame_owner: Option<u64>,
    /// PyCodeObject: co_name
    pub code_name: u64,
    /// PyCodeObject: co_qualname (3.11+; None before)
    pub code_qualname: Option<u64>,
    /// PyCodeObject: co_filename
    pub code_filename: u64,
    /// PyCodeObject: co_firstlineno (an int)
    pub code_firstlineno: u64,
    /// PyCodeObject: co_lnotab (3.8, 3.9) / co_linetable (3.10+): a PyBytesObject*
    pub code_linetable: u64,
    /// PyCodeObject: co_code_adaptive (3.11+: the instructions are inline from here); None before
    pub code_code_adaptive: Option<u64>,
    /// PyCodeObject: _co_firsttraceable (3.11+, an int), None before
    pub code_firsttraceable: Option<u64>,
    /// PyObject: ob_type
    pub object_type: u64,
    /// PyVarObject: ob_size
    pub var_object_size: u64,
    /// PyBytesObject: ob_sval
    pub bytes_sval: u64,
    /// PyASCIIObject: length
    pub unicode_length: u64,
    /// PyASCIIObject: state, the byte holding the state bitfield. In every version 3.8-3.13
    /// (found by setting each field in a zeroed struct) its bits are: interned bits 0-1, kind
    /// bits 2-4, compact bit 5, ascii bit 6, and bit 7 is `ready` in 3.8-3.11 and
    /// `statically_allocated` in 3.12, 3.13 (3.12 dropped `ready` and put
    /// `statically_allocated` in its place, so nothing moved). See the three fields below.
    pub unicode_state: u64,
    /// The lowest bit of `kind` (3 bits: 1, 2 or 4 bytes a character) in the state byte
    pub unicode_kind_shift: u8,
    /// The bit of `compact` in the state byte
    pub unicode_compact_bit: u8,
    /// The bit of `ascii` in the state byte
    pub unicode_ascii_bit: u8,
    /// sizeof(PyASCIIObject): a compact ASCII string's characters start here
    pub ascii_object_size: u64,
    /// sizeof(PyCompactUnicodeObject): a compact non-ASCII string's characters start here
    pub compact_unicode_object_size: u64,
    /// The value `owner` has in a shim frame that a C call of the interpreter pushed
    /// (FRAME_OWNED_BY_CSTACK, 3.12+), None otherwise
    pub owner_cstack: Option<u8>,
}

/// The layouts of every supported version, oldest first.
pub const LAYOUTS: &[Layout] = &[
    // CPython 3.8.18, from its own headers by layouts.c
    Layout {
        version: (3, 8),
        runtime_interpreters_head: 32,
        interp_next: 0,
        interp_threads_head: 8,
        tstate_next: 8,
        tstate_thread_id: 176,
        tstate_native_thread_id: None,
        tstate_frame: 24,
        cframe_current_frame: None,
        frame_code: 32,
        frame_previous: 24,
        frame_instr: 104,
        frame_owner: None,
        code_name: 112,
        code_qualname: None,
        code_filename: 104,
        code_firstlineno: 40,
        code_linetable: 120,
        code_code_adaptive: None,
        code_firsttraceable: None,
        object_type: 8,
        var_object_size: 16,
        bytes_sval: 32,
        unicode_length: 16,
        unicode_state: 32,
        unicode_kind_shift: 2,
        unicode_compact_bit: 5,
        unicode_ascii_bit: 6,
        ascii_object_size: 48,
        compact_unicode_object_size: 72,
        owner_cstack: None,
    },
    // CPython 3.9.18, from its own headers by layouts.c
    Layout {
        version: (3, 9),
        runtime_interpreters_head: 32,
        interp_next: 0,
        interp_threads_head: 8,
        tstate_next: 8,
        tstate_thread_id: 176,
        tstate_native_thread_id: None,
        tstate_frame: 24,
        cframe_current_frame: None,
        frame_code: 32,
        frame_previous: 24,
        frame_instr: 104,
        frame_owner: None,
        code_name: 112,
        code_qualname: None,
        code_filename: 104,
        code_firstlineno: 40,
        code_linetable: 120,
        code_code_adaptive: None,
        code_firsttraceable: None,
        object_type: 8,
        var_object_size: 16,
        bytes_sval: 32,
        unicode_length: 16,
        unicode_state: 32,
        unicode_kind_shift: 2,
        unicode_compact_bit: 5,
        unicode_ascii_bit: 6,
        ascii_object_size: 48,
        compact_unicode_object_size: 72,
        owner_cstack: None,
    },
    // CPython 3.10.13, from its own headers by layouts.c
    Layout {
        version: (3, 10),
        runtime_interpreters_head: 32,
        interp_next: 0,
        interp_threads_head: 8,
        tstate_next: 8,
        tstate_thread_id: 176,
        tstate_native_thread_id: None,
        tstate_frame: 24,
        cframe_current_frame: None,
        frame_code: 32,
        frame_previous: 24,
        frame_instr: 96,
        frame_owner: None,
        code_name: 112,
        code_qualname: None,
        code_filename: 104,
        code_firstlineno: 40,
        code_linetable: 120,
        code_code_adaptive: None,
        code_firsttraceable: None,
        object_type: 8,
        var_object_size: 16,
        bytes_sval: 32,
        unicode_length: 16,
        unicode_state: 32,
        unicode_kind_shift: 2,
        unicode_compact_bit: 5,
        unicode_ascii_bit: 6,
        ascii_object_size: 48,
        compact_unicode_object_size: 72,
        owner_cstack: None,
    },
    // CPython 3.11.7, from its own headers by layouts.c
    Layout {
        version: (3, 11),
        runtime_interpreters_head: 40,
        interp_next: 0,
        interp_threads_head: 16,
        tstate_next: 8,
        tstate_thread_id: 152,
        tstate_native_thread_id: Some(160),
        tstate_frame: 56,
        cframe_current_frame: Some(8),
        frame_code: 32,
        frame_previous: 48,
        frame_instr: 56,
        frame_owner: Some(68),
        code_name: 120,
        code_qualname: Some(128),
        code_filename: 112,
        code_firstlineno: 72,
        code_linetable: 136,
        code_code_adaptive: Some(184),
        code_firsttraceable: Some(168),
        object_type: 8,
        var_object_size: 16,
        bytes_sval: 32,
        unicode_length: 16,
        unicode_state: 32,
        unicode_kind_shift: 2,
        unicode_compact_bit: 5,
        unicode_ascii_bit: 6,
        ascii_object_size: 48,
        compact_unicode_object_size: 72,
        owner_cstack: None,
    },
    // CPython 3.12.1, from its own headers by layouts.c
    Layout {
        version: (3, 12),
        runtime_interpreters_head: 40,
        interp_next: 0,
        interp_threads_head: 72,
        tstate_next: 8,
        tstate_thread_id: 136,
        tstate_native_thread_id: Some(144),
        tstate_frame: 56,
        cframe_current_frame: Some(0),
        frame_code: 0,
        frame_previous: 8,
        frame_instr: 56,
        frame_owner: Some(70),
        code_name: 120,
        code_qualname: Some(128),
        code_filename: 112,
        code_firstlineno: 68,
        code_linetable: 136,
        code_code_adaptive: Some(192),
        code_firsttraceable: Some(176),
        object_type: 8,
        var_object_size: 16,
        bytes_sval: 32,
        unicode_length: 16,
        unicode_state: 32,
        unicode_kind_shift: 2,
        unicode_compact_bit: 5,
        unicode_ascii_bit: 6,
        ascii_object_size: 40,
        compact_unicode_object_size: 56,
        owner_cstack: Some(3),
    },
    // CPython 3.13.0, from its own headers by layouts.c
    Layout {
        version: (3, 13),
        runtime_interpreters_head: 632,
        interp_next: 7264,
        interp_threads_head: 7344,
        tstate_next: 8,
        tstate_thread_id: 152,
        tstate_native_thread_id: Some(160),
        tstate_frame: 72,
        cframe_current_frame: None,
        frame_code: 0,
        frame_previous: 8,
        frame_instr: 56,
        frame_owner: Some(70),
        code_name: 120,
        code_qualname: Some(128),
        code_filename: 112,
        code_firstlineno: 68,
        code_linetable: 136,
        code_code_adaptive: Some(200),
        code_firsttraceable: Some(184),
        object_type: 8,
        var_object_size: 16,
        bytes_sval: 32,
        unicode_length: 16,
        unicode_state: 32,
        unicode_kind_shift: 2,
        unicode_compact_bit: 5,
        unicode_ascii_bit: 6,
        ascii_object_size: 40,
        compact_unicode_object_size: 56,
        owner_cstack: Some(3),
    },
];

/// The layout of CPython `major.minor`, if supported.
pub fn layout(major: u8, minor: u8) -> Option<&'static Layout> {
    LAYOUTS.iter().find(|l| l.version == (major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minor(l: &Layout) -> u8 {
        l.version.1
    }

    #[test]
    fn every_version_once_oldest_first() {
        let versions: Vec<(u8, u8)> = LAYOUTS.iter().map(|l| l.version).collect();
        let expected: Vec<(u8, u8)> = (8..=13).map(|m| (3, m)).collect();
        assert_eq!(versions, expected);
    }

    #[test]
    fn lookup() {
        for m in 8..=13 {
            assert_eq!(layout(3, m).map(|l| l.version), Some((3, m)));
        }
        assert!(layout(3, 7).is_none());
        assert!(layout(3, 14).is_none());
        assert!(layout(2, 7).is_none());
        assert!(layout(4, 8).is_none());
    }

    #[test]
    fn optional_fields_exactly_where_they_exist() {
        for l in LAYOUTS {
            let m = minor(l);
            assert_eq!(
                l.tstate_native_thread_id.is_some(),
                m >= 11,
                "{:?}",
                l.version
            );
            assert_eq!(
                l.cframe_current_frame.is_some(),
                m == 11 || m == 12,
                "{:?}",
                l.version
            );
            assert_eq!(l.frame_owner.is_some(), m >= 11, "{:?}", l.version);
            assert_eq!(l.code_qualname.is_some(), m >= 11, "{:?}", l.version);
            assert_eq!(l.code_code_adaptive.is_some(), m >= 11, "{:?}", l.version);
            assert_eq!(l.code_firsttraceable.is_some(), m >= 11, "{:?}", l.version);
            assert_eq!(l.owner_cstack.is_some(), m >= 12, "{:?}", l.version);
        }
    }

    #[test]
    fn offsets_within_plausible_struct_sizes() {
        for l in LAYOUTS {
            let v = l.version;
            // _PyRuntimeState and PyInterpreterState are big (3.13's interpreter puts its
            // `next` past 7 KiB); the rest are small.
            assert!(l.runtime_interpreters_head < 4096, "{v:?}");
            assert!(
                l.interp_next < 16384 && l.interp_threads_head < 16384,
                "{v:?}"
            );
            let tstate = [
                Some(l.tstate_next),
                Some(l.tstate_thread_id),
                l.tstate_native_thread_id,
                Some(l.tstate_frame),
            ];
            for o in tstate.into_iter().flatten() {
                assert!(o < 1024, "{v:?} tstate {o}");
            }
            if let Some(o) = l.cframe_current_frame {
                assert!(o < 64, "{v:?}");
            }
            let frame = [
                Some(l.frame_code),
                Some(l.frame_previous),
                Some(l.frame_instr),
                l.frame_owner,
            ];
            for o in frame.into_iter().flatten() {
                assert!(o < 256, "{v:?} frame {o}");
            }
            for o in code_fields(l) {
                assert!(o < 512, "{v:?} code {o}");
            }
            for o in [
                l.object_type,
                l.var_object_size,
                l.bytes_sval,
                l.unicode_length,
                l.unicode_state,
            ] {
                assert!(o < 128, "{v:?} object {o}");
            }
            assert!(
                l.ascii_object_size < 128 && l.compact_unicode_object_size < 128,
                "{v:?}"
            );
        }
    }

    fn code_fields(l: &Layout) -> Vec<u64> {
        [
            Some(l.code_name),
            l.code_qualname,
            Some(l.code_filename),
            Some(l.code_firstlineno),
            Some(l.code_linetable),
            l.code_code_adaptive,
            l.code_firsttraceable,
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    fn assert_distinct(v: (u8, u8), what: &str, offsets: &[u64]) {
        for (i, a) in offsets.iter().enumerate() {
            for b in &offsets[i + 1..] {
                assert_ne!(a, b, "{v:?}: two {what} fields at {a}");
            }
        }
    }

    #[test]
    fn fields_of_one_struct_do_not_overlap() {
        for l in LAYOUTS {
            let v = l.version;
            assert_ne!(l.interp_next, l.interp_threads_head, "{v:?}");
            let tstate: Vec<u64> = [
                Some(l.tstate_next),
                Some(l.tstate_thread_id),
                l.tstate_native_thread_id,
                Some(l.tstate_frame),
            ]
            .into_iter()
            .flatten()
            .collect();
            assert_distinct(v, "PyThreadState", &tstate);
            let frame: Vec<u64> = [
                Some(l.frame_code),
                Some(l.frame_previous),
                Some(l.frame_instr),
                l.frame_owner,
            ]
            .into_iter()
            .flatten()
            .collect();
            assert_distinct(v, "frame", &frame);
            assert_distinct(v, "PyCodeObject", &code_fields(l));
            // The object header comes first in every object.
            assert!(l.object_type < l.var_object_size, "{v:?}");
            assert!(l.var_object_size < l.bytes_sval, "{v:?}");
            for o in code_fields(l) {
                assert!(
                    o > l.var_object_size,
                    "{v:?}: code field {o} inside the header"
                );
            }
            assert!(
                l.unicode_length > l.object_type && l.unicode_state > l.unicode_length,
                "{v:?}"
            );
            assert!(l.ascii_object_size > l.unicode_state, "{v:?}");
            assert!(l.compact_unicode_object_size > l.ascii_object_size, "{v:?}");
            // co_code_adaptive is the flexible array at the end of the code object.
            if let Some(adaptive) = l.code_code_adaptive {
                for o in code_fields(l) {
                    assert!(
                        o <= adaptive,
                        "{v:?}: code field {o} after co_code_adaptive"
                    );
                }
            }
        }
    }

    #[test]
    fn alignment() {
        for l in LAYOUTS {
            let v = l.version;
            let pointers = [
                Some(l.runtime_interpreters_head),
                Some(l.interp_next),
                Some(l.interp_threads_head),
                Some(l.tstate_next),
                Some(l.tstate_thread_id),
                l.tstate_native_thread_id,
                Some(l.tstate_frame),
                l.cframe_current_frame,
                Some(l.frame_code),
                Some(l.frame_previous),
                Some(l.code_name),
                l.code_qualname,
                Some(l.code_filename),
                Some(l.code_linetable),
                Some(l.object_type),
                Some(l.var_object_size),
                Some(l.unicode_length),
            ];
            for o in pointers.into_iter().flatten() {
                assert_eq!(o % 8, 0, "{v:?}: 8-byte field at {o}");
            }
            // f_lasti is an int before 3.11, a pointer after.
            assert_eq!(
                l.frame_instr % if minor(l) >= 11 { 8 } else { 4 },
                0,
                "{v:?}"
            );
            assert_eq!(l.code_firstlineno % 4, 0, "{v:?}");
            if let Some(o) = l.code_firsttraceable {
                assert_eq!(o % 4, 0, "{v:?}");
            }
        }
    }

    #[test]
    fn unicode_state_bits() {
        for l in LAYOUTS {
            let v = l.version;
            assert!(l.unicode_kind_shift + 3 <= 8, "{v:?}");
            let kind = 0b111u8 << l.unicode_kind_shift;
            for bit in [l.unicode_compact_bit, l.unicode_ascii_bit] {
                assert!(bit < 8, "{v:?}");
                assert_eq!(kind & (1 << bit), 0, "{v:?}: bit {bit} inside kind");
            }
            assert_ne!(l.unicode_compact_bit, l.unicode_ascii_bit, "{v:?}");
        }
    }

    #[test]
    fn owner_cstack_is_a_new_owner_value() {
        for l in LAYOUTS {
            if let Some(o) = l.owner_cstack {
                // FRAME_OWNED_BY_THREAD, _GENERATOR, _FRAME_OBJECT are 0, 1, 2.
                assert!(o > 2, "{:?}", l.version);
            }
        }
    }
}
