//! NCCL's C types, codes and strings, as nccl.h (2.21) defines them.
#![allow(non_camel_case_types, reason = "names as in nccl.h")]
use std::ffi::{CStr, c_int};

/// `ncclResult_t` is a C enum: an int-sized value.
pub type ncclResult_t = c_int;
pub type ncclDataType_t = c_int;
pub type ncclRedOp_t = c_int;
/// `ncclComm_t`: an opaque pointer.
pub type ncclComm_t = *mut std::ffi::c_void;
/// `cudaStream_t`, the driver's `CUstream` under another name.
pub type cudaStream_t = *mut std::ffi::c_void;

pub const NCCL_SUCCESS: ncclResult_t = 0;
pub const NCCL_UNHANDLED_CUDA_ERROR: ncclResult_t = 1;
pub const NCCL_SYSTEM_ERROR: ncclResult_t = 2;
pub const NCCL_INTERNAL_ERROR: ncclResult_t = 3;
pub const NCCL_INVALID_ARGUMENT: ncclResult_t = 4;
pub const NCCL_INVALID_USAGE: ncclResult_t = 5;
pub const NCCL_REMOTE_ERROR: ncclResult_t = 6;
pub const NCCL_IN_PROGRESS: ncclResult_t = 7;

/// The Rust-side form of a failing call.
pub type NcclResult<T> = Result<T, ncclResult_t>;

/// NCCL 2.21.5, encoded as NCCL_VERSION(2, 21, 5) = 2 * 10000 + 21 * 100 + 5.
pub const VERSION_CODE: c_int = 22105;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: 128 opaque bytes, passed by value to ncclCommInitRank.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [u8; UNIQUE_ID_BYTES],
}

/// What ncclGetErrorString returns for `code` (the real library's texts).
pub fn error_string(code: ncclResult_t) -> &'static CStr {
    match code {
        NCCL_SUCCESS => c"no error",
        NCCL_UNHANDLED_CUDA_ERROR => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        NCCL_SYSTEM_ERROR => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        NCCL_INTERNAL_ERROR => c"internal error - please report this issue to the NCCL developers",
        NCCL_INVALID_ARGUMENT => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        NCCL_INVALID_USAGE => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        NCCL_REMOTE_ERROR => c"remote process exited or there was a network error",
        NCCL_IN_PROGRESS => c"NCCL operation in progress",
        _ => c"unknown result code",
    }
}

/// Bytes per element of `ncclDataType_t` `t`: int8, uint8, int32, uint32, int64, uint64,
/// float16, float32, float64, bfloat16, then the two fp8 types of NCCL 2.19+.
pub fn type_size(t: ncclDataType_t) -> Option<usize> {
    Some(match t {
        0 | 1 | 10 | 11 => 1,
        6 | 9 => 2,
        2 | 3 | 7 => 4,
        4 | 5 | 8 => 8,
        _ => return None,
    })
}

/// Whether `op` is a built-in `ncclRedOp_t`: sum, prod, max, min, avg.
pub fn valid_op(op: ncclRedOp_t) -> bool {
    (0..=4).contains(&op)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_is_128_bytes() {
        assert_eq!(std::mem::size_of::<ncclUniqueId>(), 128);
        assert_eq!(std::mem::align_of::<ncclUniqueId>(), 1);
    }

    #[test]
    fn types_and_strings() {
        assert_eq!(type_size(7), Some(4), "ncclFloat32");
        assert_eq!(type_size(9), Some(2), "ncclBfloat16");
        assert_eq!(type_size(12), None);
        assert!(valid_op(4) && !valid_op(5));
        assert_eq!(error_string(0), c"no error");
        assert_eq!(error_string(99), c"unknown result code");
    }
}
