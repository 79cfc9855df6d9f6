#!/usr/bin/env python3
"""What pinning host memory in place costs on this GPU host.

Times cuMemHostRegister and cuMemHostUnregister on anonymous mappings like
the ones foldprint's one pass reads rank files into (W mappings of S MiB,
2 MiB-aligned), and a host-to-device copy from them against one from
pageable memory. It calls the driver (libcuda.so.1) through ctypes and
needs nothing else. Usage: python3 tools/pin_cost.py [W] [S_MiB]
"""

import ctypes
import mmap
import sys
import threading
import time

MIB = 1 << 20
RANKS = int(sys.argv[1]) if len(sys.argv) > 1 else 8
SIZE = (int(sys.argv[2]) if len(sys.argv) > 2 else 128) * MIB
PIECE = 32 * MIB
READ_ONLY = 0x08  # CU_MEMHOSTREGISTER_READ_ONLY

cu = ctypes.CDLL("libcuda.so.1")
cu.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
cu.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]


def check(code, what):
    if code != 0:
        raise SystemExit(f"{what}: CUresult {code}")


check(cu.cuInit(0), "cuInit")
device = ctypes.c_int()
check(cu.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device), "cuDevicePrimaryCtxRetain")
check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
dst = ctypes.c_uint64()
check(cu.cuMemAlloc_v2(ctypes.byref(dst), SIZE), "cuMemAlloc")


def mapping(huge, touched):
    """A 2 MiB-aligned anonymous mapping of SIZE bytes: (the map, its start)."""
    m = mmap.mmap(-1, SIZE + 2 * MIB)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    start = base + (-base) % (2 * MIB)
    if huge:
        m.madvise(mmap.MADV_HUGEPAGE)
    if touched:
        ctypes.memset(start, 1, SIZE)
    return m, start


def ms(since):
    return (time.perf_counter() - since) * 1e3


def copy_all(starts):
    t = time.perf_counter()
    for s in starts:
        check(cu.cuMemcpyHtoD_v2(dst.value, s, SIZE), "cuMemcpyHtoD")
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    return ms(t)


def whole(name, huge, touched, flags, threads):
    maps = [mapping(huge, touched) for _ in range(RANKS)]
    starts = [s for _, s in maps]
    t = time.perf_counter()
    if threads:
        def pin(s):
            cu.cuCtxSetCurrent(ctx)
            check(cu.cuMemHostRegister_v2(s, SIZE, flags), "cuMemHostRegister")
        running = [threading.Thread(target=pin, args=(s,)) for s in starts]
        for x in running:
            x.start()
        for x in running:
            x.join()
    else:
        for s in starts:
            check(cu.cuMemHostRegister_v2(s, SIZE, flags), "cuMemHostRegister")
    pinned = ms(t)
    copied = copy_all(starts)
    t = time.perf_counter()
    for s in starts:
        check(cu.cuMemHostUnregister(s), "cuMemHostUnregister")
    unpinned = ms(t)
    for m, _ in maps:
        m.close()
    gbs = RANKS * SIZE / copied / 1e6
    print(f"{name:40s} pin {pinned:7.1f} ms  copy {copied:6.1f} ms ({gbs:5.1f} GB/s)  unpin {unpinned:6.1f} ms")


def pieces():
    maps = [mapping(True, True) for _ in range(RANKS)]
    starts = [s for _, s in maps]
    count = SIZE // PIECE
    t = time.perf_counter()
    for s in starts:
        for k in range(count):
            check(cu.cuMemHostRegister_v2(s + k * PIECE, PIECE, READ_ONLY), "cuMemHostRegister")
    pinned = ms(t)
    t = time.perf_counter()
    for s in starts:
        for k in range(count):
            check(cu.cuMemcpyHtoD_v2(dst.value, s + k * PIECE, PIECE), "cuMemcpyHtoD")
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    copied = ms(t)
    spans = cu.cuMemcpyHtoD_v2(dst.value, starts[0] + PIECE // 2, PIECE) if count > 1 else 0
    t = time.perf_counter()
    for s in starts:
        for k in range(count):
            check(cu.cuMemHostUnregister(s + k * PIECE), "cuMemHostUnregister")
    unpinned = ms(t)
    for m, _ in maps:
        m.close()
    n = RANKS * count
    print(f"{'32 MiB pieces, read-only':40s} pin {pinned:7.1f} ms ({pinned / n:.2f} a piece)  "
          f"copy {copied:6.1f} ms  unpin {unpinned:6.1f} ms  "
          f"one copy from two pieces: CUresult {spans}")


print(f"{RANKS} mappings of {SIZE // MIB} MiB")
maps = [mapping(True, True) for _ in range(RANKS)]
print(f"{'pageable (not pinned)':40s} copy {copy_all([s for _, s in maps]):6.1f} ms")
for m, _ in maps:
    m.close()
for _ in range(2):
    whole("huge pages, read, flags 0", True, True, 0, False)
    whole("huge pages, read, read-only", True, True, READ_ONLY, False)
    whole("huge pages, read, 8 threads", True, True, 0, True)
    whole("4 KiB pages, read, flags 0", False, True, 0, False)
    whole("huge pages, never touched, flags 0", True, False, 0, False)
    pieces()
