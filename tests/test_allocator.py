"""Freed memory kept for reuse: a large array comes from glibc's heap, not a mapping of its own,
and stays with the process once freed, unless the user turned it off or set glibc's malloc.
Each case runs in a fresh interpreter, whose allocator no other test has touched."""

import ctypes
import os
import platform
import subprocess
import sys

import pytest

from hpctrain.device.allocator import SWITCH, keep_freed_memory, user_setting

glibc_only = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc" or not hasattr(ctypes.CDLL(None), "mallinfo2"),
    reason="glibc's mallopt, read back with mallinfo2 (glibc 2.33 and later)")

# mallinfo2: hblkhd, the bytes of blocks glibc mapped with an mmap of their own; arena, the
# bytes of its heap (what a freed block stays in unless the heap's top is trimmed)
AFTER_A_LARGE_ARRAY = """
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
del array
print(libc.mallinfo2().arena)
"""


def after_a_large_array(**environ: str) -> tuple[str, int, int]:
    """What keep_freed_memory decided, the bytes mapped of their own with a 64 MiB array alive,
    and the heap's bytes once it was freed."""
    clean = {k: v for k, v in os.environ.items()
             if k != SWITCH and user_setting({k: v}) is None}
    done = subprocess.run([sys.executable, "-c", AFTER_A_LARGE_ARRAY], check=True,
                          capture_output=True, text=True, env={**clean, **environ})
    decided, mapped, heap = done.stdout.splitlines()
    return decided, int(mapped), int(heap)


@glibc_only
def test_a_large_array_comes_from_the_heap_and_stays_there_once_freed():
    decided, mapped, heap = after_a_large_array()
    assert decided == "freed memory kept (glibc malloc: no mmap, no trim)"
    assert mapped < 64 << 20 <= heap


@glibc_only
def test_turned_off_glibc_maps_the_array_and_unmaps_it():
    decided, mapped, heap = after_a_large_array(**{SWITCH: "0"})
    assert decided == f"malloc as it is ({SWITCH}=0)"
    assert heap < 64 << 20 <= mapped


@glibc_only
def test_the_users_malloc_setting_wins():
    decided, mapped, _ = after_a_large_array(MALLOC_MMAP_THRESHOLD_=str(1 << 20))
    assert decided == "malloc as MALLOC_MMAP_THRESHOLD_ sets it"
    assert mapped >= 64 << 20  # above the user's threshold: a mapping of its own


def test_glibc_settings_are_recognised_by_name():
    assert user_setting({}) is None
    assert user_setting({"MALLOC_TRIM_THRESHOLD_": "0"}) == "MALLOC_TRIM_THRESHOLD_"
    assert user_setting({"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"}) == "GLIBC_TUNABLES"
    # what the rule does not set is not a reason to leave it
    assert user_setting({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) is None
    assert user_setting({"MALLOC_ARENA_MAX": "2"}) is None
    assert keep_freed_memory({SWITCH: "0"}) == f"malloc as it is ({SWITCH}=0)"
    assert keep_freed_memory({"MALLOC_TOP_PAD_": "0"}) == "malloc as MALLOC_TOP_PAD_ sets it"
