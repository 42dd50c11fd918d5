/*
 * layouts.c: prints the LP64 layout (x86_64's and aarch64's, which are the
 * same) of the CPython structures stallscope reads, for the one CPython version
 * whose headers it is compiled against, as a Rust `Layout` constant. The table
 * `LAYOUTS` in layout.rs is this program's output for every supported version,
 * oldest first, pasted in. tests/tests/python_layouts.rs compiles it for both
 * architectures (aarch64 with Debian's cross gcc, run under qemu) and holds
 * both outputs to the table.
 *
 * Only offsetof and sizeof are used for offsets; the bit positions of the
 * str state bitfield are found by setting each field in a zeroed struct and
 * looking at which bits changed, so nothing here is worked out by hand.
 *
 * Regenerate (from this directory; the installs are pyenv's, any x86_64
 * build of the same minor version without Py_DEBUG / Py_TRACE_REFS /
 * Py_GIL_DISABLED will do):
 *
 *   for v in 3.8.18 3.9.18 3.10.13 3.11.7 3.12.1 3.13.0; do
 *       inc=/root/.pyenv/versions/$v/include/python${v%.*}
 *       gcc -O0 -Wall -DPy_BUILD_CORE -I"$inc" -I"$inc/internal" \
 *           -o /tmp/layouts-$v layouts.c && /tmp/layouts-$v
 *   done
 *
 * and paste what it prints between the brackets of LAYOUTS in layout.rs.
 */
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if PY_VERSION_HEX < 0x03080000 || PY_VERSION_HEX >= 0x030E0000
#error "layouts.c knows CPython 3.8 to 3.13"
#endif
#if defined(Py_DEBUG) || defined(Py_TRACE_REFS) || defined(Py_GIL_DISABLED)
#error "the table is for release builds with the GIL (no Py_DEBUG, Py_TRACE_REFS, Py_GIL_DISABLED)"
#endif
#if !defined(__x86_64__) && !defined(__aarch64__)
#error "the table is for the LP64 architectures stallscope runs on: x86_64 and aarch64"
#endif

#if PY_VERSION_HEX < 0x03090000
#include <internal/pycore_pystate.h> /* _PyRuntimeState, struct _is */
#include <frameobject.h>             /* PyFrameObject */
#elif PY_VERSION_HEX < 0x030B0000
#include <internal/pycore_runtime.h> /* _PyRuntimeState */
#include <internal/pycore_interp.h>  /* struct _is */
#include <frameobject.h>             /* PyFrameObject */
#else
#include <internal/pycore_runtime.h> /* _PyRuntimeState */
#include <internal/pycore_interp.h>  /* struct _is */
#include <internal/pycore_frame.h>   /* _PyInterpreterFrame, enum _frameowner */
#endif

static void field(const char *name, size_t value)
{
    printf("        %s: %zu,\n", name, value);
}

__attribute__((unused)) static void some(const char *name, size_t value)
{
    printf("        %s: Some(%zu),\n", name, value);
}

__attribute__((unused)) static void none(const char *name)
{
    printf("        %s: None,\n", name);
}

/* The bit (0-7) of the state byte that a field set to 1 lands in, its lowest
 * set bit if it is wider; exits if the field is not within that byte. */
static int state_bit(const PyASCIIObject *o, const char *what)
{
    const unsigned char *bytes = (const unsigned char *)o;
    size_t state = offsetof(PyASCIIObject, state);
    for (size_t i = 0; i < sizeof(*o); i++) {
        if (bytes[i] != 0 && i != state) {
            fprintf(stderr, "layouts.c: str state field %s is not in byte %zu\n", what, state);
            exit(1);
        }
    }
    unsigned char b = bytes[state];
    for (int bit = 0; bit < 8; bit++) {
        if (b & (1u << bit)) {
            return bit;
        }
    }
    fprintf(stderr, "layouts.c: str state field %s set no bit\n", what);
    exit(1);
}

int main(void)
{
    printf("    // CPython %s, from its own headers by layouts.c\n", PY_VERSION);
    printf("    Layout {\n");
    printf("        version: (%d, %d),\n", PY_MAJOR_VERSION, PY_MINOR_VERSION);

    field("runtime_interpreters_head", offsetof(_PyRuntimeState, interpreters.head));
    field("interp_next", offsetof(PyInterpreterState, next));
#if PY_VERSION_HEX < 0x030B0000
    field("interp_threads_head", offsetof(PyInterpreterState, tstate_head));
#else
    field("interp_threads_head", offsetof(PyInterpreterState, threads.head));
#endif

    field("tstate_next", offsetof(PyThreadState, next));
    field("tstate_thread_id", offsetof(PyThreadState, thread_id));
#if PY_VERSION_HEX < 0x030B0000
    none("tstate_native_thread_id");
#else
    some("tstate_native_thread_id", offsetof(PyThreadState, native_thread_id));
#endif
#if PY_VERSION_HEX < 0x030B0000
    field("tstate_frame", offsetof(PyThreadState, frame));
    none("cframe_current_frame");
#elif PY_VERSION_HEX < 0x030D0000
    field("tstate_frame", offsetof(PyThreadState, cframe));
    some("cframe_current_frame", offsetof(_PyCFrame, current_frame));
#else
    field("tstate_frame", offsetof(PyThreadState, current_frame));
    none("cframe_current_frame");
#endif

#if PY_VERSION_HEX < 0x030B0000
    field("frame_code", offsetof(PyFrameObject, f_code));
    field("frame_previous", offsetof(PyFrameObject, f_back));
    field("frame_instr", offsetof(PyFrameObject, f_lasti));
    none("frame_owner");
#elif PY_VERSION_HEX < 0x030C0000
    field("frame_code", offsetof(_PyInterpreterFrame, f_code));
    field("frame_previous", offsetof(_PyInterpreterFrame, previous));
    field("frame_instr", offsetof(_PyInterpreterFrame, prev_instr));
    some("frame_owner", offsetof(_PyInterpreterFrame, is_entry));
#elif PY_VERSION_HEX < 0x030D0000
    field("frame_code", offsetof(_PyInterpreterFrame, f_code));
    field("frame_previous", offsetof(_PyInterpreterFrame, previous));
    field("frame_instr", offsetof(_PyInterpreterFrame, prev_instr));
    some("frame_owner", offsetof(_PyInterpreterFrame, owner));
#else
    field("frame_code", offsetof(_PyInterpreterFrame, f_executable));
    field("frame_previous", offsetof(_PyInterpreterFrame, previous));
    field("frame_instr", offsetof(_PyInterpreterFrame, instr_ptr));
    some("frame_owner", offsetof(_PyInterpreterFrame, owner));
#endif

    field("code_name", offsetof(PyCodeObject, co_name));
#if PY_VERSION_HEX < 0x030B0000
    none("code_qualname");
#else
    some("code_qualname", offsetof(PyCodeObject, co_qualname));
#endif
    field("code_filename", offsetof(PyCodeObject, co_filename));
    field("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
#if PY_VERSION_HEX < 0x030A0000
    field("code_linetable", offsetof(PyCodeObject, co_lnotab));
#else
    field("code_linetable", offsetof(PyCodeObject, co_linetable));
#endif
#if PY_VERSION_HEX < 0x030B0000
    none("code_code_adaptive");
    none("code_firsttraceable");
#else
    some("code_code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
    some("code_firsttraceable", offsetof(PyCodeObject, _co_firsttraceable));
#endif

    field("object_type", offsetof(PyObject, ob_type));
    field("var_object_size", offsetof(PyVarObject, ob_size));
    field("bytes_sval", offsetof(PyBytesObject, ob_sval));

    field("unicode_length", offsetof(PyASCIIObject, length));
    field("unicode_state", offsetof(PyASCIIObject, state));
    {
        PyASCIIObject o;
        memset(&o, 0, sizeof(o));
        o.state.kind = 1;
        int kind = state_bit(&o, "kind");
        memset(&o, 0, sizeof(o));
        o.state.kind = 7;
        if (((unsigned char *)&o)[offsetof(PyASCIIObject, state)] != (7u << kind)) {
            fprintf(stderr, "layouts.c: str state field kind is not 3 bits from bit %d\n", kind);
            return 1;
        }
        memset(&o, 0, sizeof(o));
        o.state.compact = 1;
        int compact = state_bit(&o, "compact");
        memset(&o, 0, sizeof(o));
        o.state.ascii = 1;
        int ascii = state_bit(&o, "ascii");
        printf("        unicode_kind_shift: %d,\n", kind);
        printf("        unicode_compact_bit: %d,\n", compact);
        printf("        unicode_ascii_bit: %d,\n", ascii);
    }
    field("ascii_object_size", sizeof(PyASCIIObject));
    field("compact_unicode_object_size", sizeof(PyCompactUnicodeObject));

#if PY_VERSION_HEX < 0x030C0000
    none("owner_cstack");
#else
    printf("        owner_cstack: Some(%d),\n", (int)FRAME_OWNED_BY_CSTACK);
#endif
    printf("    },\n");
    return 0;
}
