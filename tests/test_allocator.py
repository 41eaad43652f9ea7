"""Freed memory kept for reuse: a large array comes from glibc's heap, not a mapping of its own,
unless the user set glibc's malloc. Each case runs in a fresh interpreter, whose allocator no
other test has touched."""

import os
import platform
import subprocess
import sys

import pytest

from hpctrain.device.allocator import keep_freed_memory, user_setting

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")

# mallinfo2 (glibc 2.33+): hblkhd, the bytes of blocks glibc mapped with mmap of their own
MAPPED_AFTER_A_LARGE_ARRAY = """
import ctypes, numpy as np
from hpctrain.device.allocator import keep_freed_memory
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena ordblks smblks hblks hblkhd usmblks "
                                               "fsmblks uordblks fordblks keepcost").split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
print(keep_freed_memory())
array = np.ones(64 << 20, np.uint8)
print(libc.mallinfo2().hblkhd)
"""


def mapped_after_a_large_array(**environ: str) -> tuple[str, int]:
    clean = {k: v for k, v in os.environ.items() if user_setting({k: v}) is None}
    done = subprocess.run([sys.executable, "-c", MAPPED_AFTER_A_LARGE_ARRAY], check=True,
                          capture_output=True, text=True, env={**clean, **environ})
    decided, mapped = done.stdout.splitlines()
    return decided, int(mapped)


@glibc_only
def test_a_large_array_comes_from_the_heap_once_freed_memory_is_kept():
    decided, mapped = mapped_after_a_large_array()
    assert decided == "freed memory kept (glibc malloc: no mmap, no trim)"
    assert mapped < 64 << 20


@glibc_only
def test_the_users_malloc_setting_wins():
    decided, mapped = mapped_after_a_large_array(MALLOC_MMAP_MAX_="65536")
    assert decided == "malloc as MALLOC_MMAP_MAX_ sets it"
    assert mapped >= 64 << 20  # glibc's own behaviour: the array has a mapping of its own


def test_glibc_settings_are_recognised_by_name():
    assert user_setting({}) is None
    assert user_setting({"MALLOC_TRIM_THRESHOLD_": "0"}) == "MALLOC_TRIM_THRESHOLD_"
    assert user_setting({"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"}) == "GLIBC_TUNABLES"
    assert user_setting({"GLIBC_TUNABLES": "glibc.rtld.nns=4"}) is None
    assert user_setting({"MALLOC_CHECK": "1"}) is None  # not one of glibc's tunables
    assert keep_freed_memory({"MALLOC_ARENA_MAX": "2"}) == "malloc as MALLOC_ARENA_MAX sets it"
