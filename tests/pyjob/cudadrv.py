"""The CUDA driver API through ctypes, for the Python test jobs: `libcuda.so.1` is the
simulated GPU on machines without one, the real driver elsewhere. A context on device 0, as
a framework makes, and stallgen's spin kernel (`tests/stallgen/spin.ptx`)."""
import ctypes
from pathlib import Path

SPIN_PTX = (Path(__file__).resolve().parent.parent / "stallgen" / "spin.ptx").read_bytes() + b"\0"


class Driver:
    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.check(self.lib.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        self.check(self.lib.cuCtxCreate_v2(ctypes.byref(self.ctx), 0, dev), "cuCtxCreate_v2")

    @staticmethod
    def check(status, what):
        if status != 0:
            raise RuntimeError(f"{what} failed: CUresult {status}")

    def spin_kernel(self):
        module = ctypes.c_void_p()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(module), SPIN_PTX), "cuModuleLoadData")
        spin = ctypes.c_void_p()
        self.check(
            self.lib.cuModuleGetFunction(ctypes.byref(spin), module, b"spin"),
            "cuModuleGetFunction",
        )
        return spin
