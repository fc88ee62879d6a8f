"""The ggml graph and allocator port (budget/ggml_graph.py) on hand-built graphs whose peaks are
worked out by hand in each test, and ggml's shape and stride rules where the allocator reads them."""

from __future__ import annotations

import pytest

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ggml_graph import Context, DynAllocator, Graph, graph_peak

CTX = Context()


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
    return CTX.weight("w", (n, n))


def _graph(*outputs):
    graph = Graph()
    for tensor in outputs:
        graph.expand(tensor)
    return graph


def test_an_in_place_op_reuses_its_only_consumers_parent():
    # x (1 KiB input), y = mul_mat(w, x) 1 KiB, z = add(y, x): y has one consumer, z writes over it.
    x = CTX.input("x", "f32", (256,))
    y = CTX.mul_mat(_weight(256), x)
    assert graph_peak(_graph(CTX.binary("ADD", y, x)), 32) == 2048  # x and y; z takes y's bytes
    # The same with an op that may not run in place needs a third tensor while x is alive.
    y = CTX.mul_mat(_weight(256), x)
    assert graph_peak(_graph(CTX.mul_mat(CTX.weight("w2", (256, 256)), CTX.binary("ADD", y, x), "z")), 32) == 2048
    y = CTX.mul_mat(_weight(256), x)
    assert graph_peak(_graph(CTX.concat(y, x, 1)), 32) == 1024 + 1024 + 2048


def test_a_parent_with_two_consumers_is_not_written_over():
    x = CTX.input("x", "f32", (256,))
    y = CTX.mul_mat(_weight(256), x)
    a = CTX.rms_norm(y)
    b = CTX.binary("ADD", a, y)  # a: one consumer, taken in place
    # x is freed once y is computed; a cannot take y (two consumers) and lands in x's block.
    assert graph_peak(_graph(b), 32) == 2048


def test_a_freed_block_too_small_leaves_the_tensor_at_the_end():
    x = CTX.input("x", "f32", (64,))  # 256 B
    y = CTX.mul_mat(CTX.weight("w", (64, 256)), x)  # 1 KiB: x freed after it
    z = CTX.mul_mat(CTX.weight("w", (256, 512)), y)  # 2 KiB: x's 256 B block is too small
    assert graph_peak(_graph(z), 32) == 256 + 1024 + 2048


def test_an_in_place_op_over_a_view_gets_its_own_bytes():
    # rope over a reshape of a matmul result: ggml-alloc never marks a view as its own (it skips
    # views when allocating), so its reuse-the-view branch does not fire and rope gets new bytes.
    x = CTX.input("x", "f32", (256,))
    q = CTX.mul_mat(_weight(256), x)
    rope = CTX.rope(CTX.reshape(q, 64, 4), CTX.input("pos", "i32", (4,)))
    # x at 0, pos, q above them; x is freed once q ran, and rope (no in place over a view) lands
    # in x's freed block instead of growing the buffer.
    assert graph_peak(_graph(rope), 32) == 1024 + 32 + 1024


def test_outputs_are_never_freed():
    x = CTX.input("x", "f32", (256,))
    y = CTX.mul_mat(_weight(256), x)
    y.is_output = True
    z = CTX.mul_mat(_weight(256), y)
    w = CTX.mul_mat(_weight(256), z)
    # x is freed after y and z takes its block; y (an output) stays, so w goes on top: 3 x 1 KiB.
    assert graph_peak(_graph(w), 32) == 3072


def test_a_view_keeps_its_root_alive_until_the_views_consumers_ran():
    # set_rows returns a view of its destination: a destination whose view nobody reads is never freed.
    x = CTX.input("x", "f32", (256,))
    dst = CTX.dup(x)  # 1 KiB
    rows = CTX.get_rows(CTX.weight("emb", (256, 8)), CTX.input("ids", "i32", (1,)))  # 1 KiB
    kept = CTX.set_rows(dst, rows, CTX.input("slots", "i64", (1,)))
    after = CTX.mul_mat(CTX.weight("w", (256, 256)), CTX.rms_norm(x))
    # Inputs x 0..1024, ids, slots 1056..1088; rows above (1088..2112), ids freed; dst finds no
    # free block that fits and grows the buffer (2112..3136). After the set, rows and slots are
    # freed (1024..2112 merged) but dst stays; rms_norm runs in place over x, and after lands in
    # the merged block: the peak is dst's end.
    assert graph_peak(_graph(kept, after), 32) == 3136
    # Read by a consumer, the destination would be freed with its view's last consumer.
    x = CTX.input("x", "f32", (256,))
    dst = CTX.dup(x)
    read = CTX.mul_mat(CTX.weight("w", (256, 256)), CTX.set_rows(dst, CTX.rms_norm(x), CTX.input("slots", "i64", (1,))))
    tail = CTX.mul_mat(CTX.weight("w", (256, 256)), read)
    # x 0..1024, slots; rms_norm cannot take x (dup still reads it): 1056..2080; dst 2080..3104;
    # x, the norm and slots are freed by the set; read lands at 0; its run frees dst (the view's
    # last consumer ran), so tail reuses 1024..: the peak stays dst's end.
    assert graph_peak(_graph(tail), 32) == 3104


def test_a_cast_names_itself_as_its_second_source():
    x = CTX.input("x", "f32", (16, 4))
    cast = CTX.cast(x, "f16")
    assert cast.src[1] is cast and cast.nbytes == 16 * 4 * 2


def test_views_carry_ggml_strides_and_the_root_offset():
    a = CTX.new("f32", (8, 4, 2))
    view = CTX.view(a, (4, 4, 2), (a.nb[1], a.nb[2]), offset=16)
    assert view.nb == (4, 32, 128, 256) and view.view_offs == 16 and view.view_src is a
    again = CTX.view(view, (2, 4), (view.nb[1],), offset=8)
    assert again.view_src is a and again.view_offs == 24  # ggml_new_tensor_impl: the root and the absolute offset
    permuted = CTX.permute(a, 0, 2, 1, 3)
    assert permuted.ne == (8, 2, 4, 1) and permuted.nb == (4, 128, 32, 256) and not permuted.is_contiguous
    with pytest.raises(ValueError, match="non-contiguous"):
        CTX.reshape(permuted, 64)


def test_a_quantised_tensor_counts_its_blocks():
    cache = CTX.weight("cache_k", (128, 256), "q8_0")
    assert cache.nbytes == 128 // 32 * 34 * 256
