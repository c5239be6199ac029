"""The core library keeps small blocks per thread for its next Tensors (src/core/tensor.cpp): what a thread
kept is freed when it ends, however its last Tensors are freed."""
from __future__ import annotations

import pytest

from op_util import CPP, load_op

pytestmark = pytest.mark.build


def test_blocks_a_thread_keeps_in_a_key_destructor_are_freed_when_it_ends(cache_dir):
    # the pool's reaper was a thread_local: one made in a pthread key's destructor (after the thread's
    # thread_local destructors) never ran, and the thread's kept blocks leaked (~7.5 KB a thread here)
    ops = load_op("pool_thread_ops", [CPP / "pool_thread_ops.cpp"])
    ops.free_in_key_destructors(20)  # (malloc's arenas and the key made)
    before = ops.heap_in_use()
    ops.free_in_key_destructors(300)
    grown = ops.heap_in_use() - before
    assert grown < 300 * 1000, f"{grown} bytes still in use after 300 threads ended"
