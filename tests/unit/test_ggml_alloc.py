"""The ggml-alloc port on hand-built graphs whose peaks are worked out by hand in each test."""

from __future__ import annotations

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ggml_alloc import DynAllocator, Graph, Tensor, graph_peak


def test_sizes_are_rounded_up_to_the_alignment():
    alloc = DynAllocator(32)
    assert alloc.alloc(1) == 0
    assert alloc.alloc(33) == 32  # the first took 32 bytes
    assert alloc.max_size == 96  # 32 + 64


def test_an_alignment_that_is_not_a_power_of_two_is_refused():
    with pytest.raises(ValueError, match="power of two"):
        DynAllocator(48)


def test_freed_neighbours_merge_into_one_block():
    alloc = DynAllocator(32)
    a, b, c = alloc.alloc(100), alloc.alloc(64), alloc.alloc(32)  # 0..128, 128..192, 192..224
    alloc.free(a, 100)
    alloc.free(b, 64)  # starts where a's block ends: one block 0..192
    assert alloc.blocks[0] == [0, 192]
    assert alloc.alloc(192) == 0  # fits the merged block: the buffer does not grow
    assert alloc.max_size == 224
    assert c == 192


def test_the_smallest_block_that_fits_is_taken():
    alloc = DynAllocator(32)
    big, _keep1, small, _keep2 = alloc.alloc(128), alloc.alloc(32), alloc.alloc(64), alloc.alloc(32)
    alloc.free(big, 128)
    alloc.free(small, 64)
    assert alloc.alloc(64) == small  # 64-byte block over the 128-byte one
    assert alloc.alloc(64) == big  # then the 128-byte block, not the end of the buffer
    assert alloc.max_size == 256  # 128 + 32 + 64 + 32


def _weight(n):
    return Tensor("w", "NONE", (n,), external=True)


def test_an_in_place_op_reuses_its_only_consumers_parent():
    # x (1 KiB input), y = mul_mat(w, x) 1 KiB, z = add(y, x): y has one consumer, z writes over it.
    x = Tensor("x", "NONE", (256,), is_input=True)
    y = Tensor("y", "MUL_MAT", (256,), src=(_weight(256), x))
    z = Tensor("z", "ADD", (256,), src=(y, x))
    graph = Graph()
    graph.expand(z)
    assert graph_peak(graph, 32) == 2048  # x and y; z takes y's bytes
    # The same graph with an op that may not run in place needs a third tensor while x is alive.
    z2 = Tensor("z", "MUL_MAT", (256,), src=(y, x))
    graph2 = Graph()
    graph2.expand(z2)
    assert graph_peak(graph2, 32) == 3072


def test_a_parent_with_two_consumers_is_not_written_over():
    x = Tensor("x", "NONE", (256,), is_input=True)
    y = Tensor("y", "MUL_MAT", (256,), src=(_weight(256), x))
    a = Tensor("a", "RMS_NORM", (256,), src=(y,))
    b = Tensor("b", "ADD", (256,), src=(a, y))  # a: one consumer, taken in place
    graph = Graph()
    graph.expand(b)
    # x is freed once y is computed; a cannot take y (two consumers) and lands in x's block.
    assert graph_peak(graph, 32) == 2048


def test_a_freed_block_too_small_leaves_the_tensor_at_the_end():
    x = Tensor("x", "NONE", (64,), is_input=True)  # 256 B
    y = Tensor("y", "MUL_MAT", (256,), src=(_weight(64), x))  # 1 KiB: x freed after it
    z = Tensor("z", "MUL_MAT", (512,), src=(_weight(256), y))  # 2 KiB: x's 256 B block is too small
    graph = Graph()
    graph.expand(z)
    assert graph_peak(graph, 32) == 256 + 1024 + 2048


def test_an_in_place_op_over_a_view_gets_its_own_bytes():
    # rope over a reshape of a matmul result: ggml-alloc never marks a view as its own (it skips
    # views when allocating), so its reuse-the-view branch does not fire and rope gets new bytes.
    x = Tensor("x", "NONE", (256,), is_input=True)
    q = Tensor("q", "MUL_MAT", (256,), src=(_weight(256), x))
    q3 = q.view("RESHAPE", (64, 4))
    rope = Tensor("rope", "ROPE", (64, 4), src=(q3, x))
    graph = Graph()
    graph.expand(rope)
    assert graph_peak(graph, 32) == 3072  # x, q, rope


def test_outputs_are_never_freed():
    x = Tensor("x", "NONE", (256,), is_input=True)
    y = Tensor("y", "MUL_MAT", (256,), src=(_weight(256), x), is_output=True)
    z = Tensor("z", "MUL_MAT", (256,), src=(_weight(256), y))
    w = Tensor("w2", "MUL_MAT", (256,), src=(_weight(256), z))
    graph = Graph()
    graph.expand(w)
    # x is freed after y and z takes its block; y (an output) stays, so w goes on top: 3 x 1 KiB.
    assert graph_peak(graph, 32) == 3072
