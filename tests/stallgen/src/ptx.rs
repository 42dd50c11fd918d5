//! The one kernel stallgen launches: a single thread that spins on %globaltimer for as many
//! nanoseconds as its only parameter says, so the GPU counts as busy for exactly that long.

/// The kernel's name in [`SPIN_PTX`].
pub const SPIN_NAME: &std::ffi::CStr = c"spin";

/// PTX for `spin(u64 duration_ns)`, NUL-terminated for cuModuleLoadData. sm_70 and PTX 7.0
/// JIT-compile on every GPU a current driver supports. The simulated GPU reads the same
/// first parameter as the kernel's duration, so the job runs unchanged on both.
pub const SPIN_PTX: &std::ffi::CStr = c"
.version 7.0
.target sm_70
.address_size 64
.visible .entry spin(.param .u64 spin_param_0)
{
  .reg .pred %p<2>;
  .reg .b64 %rd<6>;
  ld.param.u64 %rd1, [spin_param_0];
  mov.u64 %rd2, %globaltimer;
$L_loop:
  mov.u64 %rd3, %globaltimer;
  sub.s64 %rd4, %rd3, %rd2;
  setp.lt.u64 %p1, %rd4, %rd1;
  @%p1 bra $L_loop;
  ret;
}
";
