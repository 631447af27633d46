"""Who calls a CUDA runtime function, by native stack: a CUPTI callback on the runtime API records the C stack
(libc's backtrace: library, exported symbol, offset) and the thread's name at every call of the named functions,
on every thread of the process (DALI's and nvJPEG's included, which a torch profiler trace shows only by an opaque
id). For the GPU machine's diagnostics (torch_ddp_bound.py --backtraces); CUPTI takes one subscriber, so not
together with torch's profiler.

    recorder = CallRecorder({"cudaDeviceSynchronize"}); recorder.start(); ...; recorder.stop(); print(recorder.report())
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
from collections import Counter

RUNTIME_API_DOMAIN = 2  # CUPTI_CB_DOMAIN_RUNTIME_API
API_ENTER = 0  # CUPTI_API_ENTER: the callback at the call's start
MAX_FRAMES = 48  # native frames recorded per call
TOP_STACKS = 6  # distinct stacks printed per function


class _CallbackData(ctypes.Structure):
    """CUPTI's CUpti_CallbackData (cupti_callbacks.h), the fields read here and those before them."""

    _fields_ = [
        ("callbackSite", ctypes.c_int),
        ("functionName", ctypes.c_char_p),
        ("functionParams", ctypes.c_void_p),
        ("functionReturnValue", ctypes.c_void_p),
        ("symbolName", ctypes.c_char_p),
    ]


_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)


def find_cupti() -> str:
    """The path of a libcupti shared library among the installed packages (torch's CUDA wheels bring one)."""
    for root in sys.path:
        found = sorted(glob.glob(os.path.join(root, "nvidia", "**", "libcupti.so*"), recursive=True))
        if found:
            return found[0]
    return "libcupti.so"


class CallRecorder:
    """Counts the native stacks (and thread names) of every call of `functions` between start() and stop()."""

    def __init__(self, functions: set[str]):
        self.functions = {name.encode() for name in functions}
        self.stacks: Counter[tuple[str, str, tuple[str, ...]]] = Counter()
        self.libc = ctypes.CDLL("libc.so.6")
        self.libc.backtrace.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        self.libc.backtrace_symbols.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        self.libc.backtrace_symbols.restype = ctypes.POINTER(ctypes.c_char_p)
        self.libc.free.argtypes = [ctypes.c_void_p]
        self.cupti = ctypes.CDLL(find_cupti())
        self.subscriber = ctypes.c_void_p()
        self.callback = _CALLBACK(self._on_call)  # kept referenced while subscribed
        self.lock = threading.Lock()

    def start(self) -> None:
        """Subscribe to CUPTI's runtime API callbacks (raises with CUPTI's status if it refuses)."""
        status = self.cupti.cuptiSubscribe(ctypes.byref(self.subscriber), self.callback, None)
        if status != 0:
            raise RuntimeError(f"cuptiSubscribe failed with CUPTI status {status} (another subscriber: a profiler?)")
        status = self.cupti.cuptiEnableDomain(1, self.subscriber, RUNTIME_API_DOMAIN)
        if status != 0:
            raise RuntimeError(f"cuptiEnableDomain failed with CUPTI status {status}")

    def stop(self) -> None:
        """Unsubscribe: no more calls are recorded."""
        self.cupti.cuptiUnsubscribe(self.subscriber)

    def _on_call(self, _userdata, _domain, _cbid, data) -> None:
        info = ctypes.cast(data, ctypes.POINTER(_CallbackData)).contents
        if info.callbackSite != API_ENTER or info.functionName not in self.functions:
            return
        frames = (ctypes.c_void_p * MAX_FRAMES)()
        count = self.libc.backtrace(frames, MAX_FRAMES)
        symbols = self.libc.backtrace_symbols(frames, count)
        stack = tuple(symbols[i].decode(errors="replace") for i in range(count))
        self.libc.free(ctypes.cast(symbols, ctypes.c_void_p))
        # the frames of this recorder (ctypes, libffi, CUPTI, Python) left out: they are the same for every call
        stack = tuple(frame for frame in stack if not _is_own_frame(frame))
        with self.lock:
            self.stacks[(info.functionName.decode(), _thread_name(), stack)] += 1

    def report(self) -> str:
        """Per function, the most frequent stacks with their thread's name and count."""
        lines = []
        for function in sorted({key[0] for key in self.stacks}):
            calls = [(key, n) for key, n in self.stacks.items() if key[0] == function]
            lines.append(f"{function}: {sum(n for _, n in calls)} calls, {len(calls)} distinct stacks")
            for (_, thread, stack), n in sorted(calls, key=lambda item: -item[1])[:TOP_STACKS]:
                lines.append(f"  {n} x on thread '{thread}':")
                lines += [f"      {frame}" for frame in stack]
        return "\n".join(lines) or "no calls recorded"


def _is_own_frame(frame: str) -> bool:
    """Whether a backtrace line belongs to this recorder's way in (ctypes, libffi, CUPTI, the interpreter)."""
    return any(part in frame for part in ("libffi", "_ctypes", "libcupti", "libc.so", "python3"))


def _thread_name() -> str:
    """The calling thread's name as Linux lists it (DALI names its threads), with its id."""
    tid = threading.get_native_id()
    try:
        with open(f"/proc/self/task/{tid}/comm") as comm:
            return f"{comm.read().strip()} ({tid})"
    except OSError:
        return str(tid)
