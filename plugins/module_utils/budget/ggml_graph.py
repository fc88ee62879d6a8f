# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A compute graph as ggml holds it, and ggml's graph allocator over it, so that a compute buffer's
size comes out of the arithmetic the engine runs (ggml 0.27, as the lab's llama.cpp b11669 links
it) instead of a fitted formula.

- `Tensor` carries what the allocator reads of a `ggml_tensor`: type, ne, nb (the strides: an op
  may run in place only over a parent of the same layout), op, sources, the view it aliases and
  its offset, and the input/output flags. Weights and cache tensors live in buffers of their own
  (`external`): the allocator never places them.
- `Context` builds tensors with ggml's own shape rules (ggml/src/ggml.c: `ggml_mul_mat`,
  `ggml_get_rows`, `ggml_view_4d`, `ggml_permute`, `ggml_cont_4d`, `ggml_set_rows`, `ggml_cpy`,
  `ggml_cast`, `ggml_flash_attn_ext`, ...): a view keeps its root and the absolute offset
  (`ggml_new_tensor_impl`), `ggml_set_rows` and `ggml_cpy` return views of their destination,
  `ggml_cast` names itself as its second source.
- `Graph.expand` is `ggml_build_forward_expand` (`ggml_visit_parents_graph`): sources first, depth
  first, left to right; an op-less tensor is a leaf, anything else a node, each once.
- `graph_peak` is `ggml_gallocr_alloc_graph_impl` with `ggml_dyn_tallocr` (ggml/src/ggml-alloc.c):
  the input leafs first in leaf order, then every node after its parents; a node whose op may run
  in place (`ggml_op_can_inplace`) takes over a parent of the same layout that has no other
  consumer and no view (`ggml_gallocr_allocate_node`, giving back the parent's tail when it is
  smaller: `ggml_gallocr_free_extra_space`); a tensor is freed once its last consumer ran, a view's
  root once its last view's consumers ran (`ggml_gallocr_free_node`); outputs are never freed. The
  free list is best fit over every block but the last, else the last (which grows the buffer),
  sizes rounded up to the buffer's alignment, freed bytes merged with their neighbours. The buffer
  is the high-water mark (`ggml_gallocr_reserve_n`).
At reserve time no compute tensor has data, so the in-place rule's `view_src->data ==
parent->data` always holds for a view of a compute tensor: a view at any offset may be taken over.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# ggml-alloc.c ggml_op_can_inplace
INPLACE_OPS = frozenset(
    (
        "FILL",
        "SCALE",
        "DIAG_MASK_ZERO",
        "DIAG_MASK_INF",
        "ADD",
        "ADD_ID",
        "ADD1",
        "SUB",
        "MUL",
        "DIV",
        "SQR",
        "SQRT",
        "LOG",
        "UNARY",
        "ROPE",
        "ROPE_BACK",
        "SILU_BACK",
        "RMS_NORM",
        "RMS_NORM_BACK",
        "CLAMP",
        "SOFT_MAX",
        "SOFT_MAX_BACK",
    )
)
# ggml.c ggml_is_view_op: the ops the scheduler's node listing leaves out.
VIEW_OPS = frozenset(("VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"))
# ggml type traits: (bytes per block, elements per block).
TYPE_SIZE: dict[str, tuple[int, int]] = {
    "f32": (4, 1),
    "f16": (2, 1),
    "bf16": (2, 1),
    "i32": (4, 1),
    "i64": (8, 1),
    "q4_0": (18, 32),
    "q4_1": (20, 32),
    "q5_0": (22, 32),
    "q5_1": (24, 32),
    "q8_0": (34, 32),
    "iq4_nl": (18, 32),
}
QUANTIZED = frozenset(name for name, (_size, block) in TYPE_SIZE.items() if block > 1)


def row_size(dtype: str, n: int) -> int:
    """`ggml_row_size`: the bytes of n elements of a type."""
    size, block = TYPE_SIZE[dtype]
    return size * n // block


def _pad4(ne: tuple[int, ...]) -> tuple[int, int, int, int]:
    dims = tuple(int(n) for n in ne) + (1,) * (4 - len(ne))
    return dims[0], dims[1], dims[2], dims[3]


def contiguous_strides(dtype: str, ne: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    size, block = TYPE_SIZE[dtype]
    nb0 = size
    nb1 = size * (ne[0] // block)
    return nb0, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2]


@dataclass(eq=False)
class Tensor:
    """What the allocator reads of one `ggml_tensor`."""

    name: str
    dtype: str
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]
    op: str = "NONE"
    src: tuple[Tensor, ...] = ()
    view_src: Tensor | None = None  # the root tensor a view aliases
    view_offs: int = 0
    external: bool = False  # in a buffer of its own (a weight, the KV cache)
    is_input: bool = False
    is_output: bool = False
    desc: str = ""  # ggml_op_desc where it differs from the op (a unary or GLU op's own name)

    @property
    def nbytes(self) -> int:
        """`ggml_nbytes`."""
        if any(n <= 0 for n in self.ne):
            return 0
        size, block = TYPE_SIZE[self.dtype]
        if block == 1:
            return size + sum((n - 1) * stride for n, stride in zip(self.ne, self.nb))
        return self.ne[0] * self.nb[0] // block + sum((n - 1) * stride for n, stride in zip(self.ne[1:], self.nb[1:]))

    @property
    def nelements(self) -> int:
        return self.ne[0] * self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def is_view(self) -> bool:
        """`ggml_impl_is_view`."""
        return self.view_src is not None

    @property
    def is_contiguous(self) -> bool:
        return self.nb == contiguous_strides(self.dtype, self.ne)

    def same_layout(self, other: Tensor) -> bool:
        """`ggml_are_same_layout`: type, shape and strides."""
        return self.dtype == other.dtype and self.ne == other.ne and self.nb == other.nb

    @property
    def op_desc(self) -> str:
        return self.desc or self.op


class Context:
    """Tensors built by ggml's shape rules. Names follow the engine's where they matter to a reader."""

    # --- leafs ---
    def new(self, dtype: str, ne: tuple[int, ...], name: str = "", op: str = "NONE", src: tuple[Tensor, ...] = (), desc: str = "") -> Tensor:
        dims = _pad4(ne)
        return Tensor(name, dtype, dims, contiguous_strides(dtype, dims), op, src, desc=desc)

    def input(self, name: str, dtype: str, ne: tuple[int, ...]) -> Tensor:
        """`ggml_new_tensor_*` + `ggml_set_input`."""
        tensor = self.new(dtype, ne, name)
        tensor.is_input = True
        return tensor

    def weight(self, name: str, ne: tuple[int, ...], dtype: str = "f32") -> Tensor:
        """A model tensor (or a cache tensor): data in a buffer of its own."""
        tensor = self.new(dtype, ne, name)
        tensor.external = True
        return tensor

    # --- views ---
    def _view(self, a: Tensor, op: str, ne: tuple[int, ...], nb: tuple[int, ...], offset: int, name: str) -> Tensor:
        root = a.view_src if a.view_src is not None else a
        offs = offset + (a.view_offs if a.view_src is not None else 0)
        return Tensor(name, a.dtype, _pad4(ne), _pad4(nb), op, (a,), root, offs, external=root.external)

    def view(self, a: Tensor, ne: tuple[int, ...], nb: tuple[int, ...], offset: int = 0) -> Tensor:
        """`ggml_view_{1,2,3,4}d`: nb lists nb[1..]; the missing higher strides follow ggml's."""
        dims = _pad4(ne)
        strides = [a.nb[0], *nb]
        while len(strides) < 4:
            strides.append(strides[-1] * dims[len(strides) - 1])
        return self._view(a, "VIEW", dims, tuple(strides), offset, f"{a.name} (view)")

    def view_tensor(self, a: Tensor, name: str = "") -> Tensor:
        """`ggml_view_tensor`: same shape and strides."""
        return self._view(a, "VIEW", a.ne, a.nb, 0, name or f"{a.name} (view)")

    def reshape(self, a: Tensor, *ne: int) -> Tensor:
        """`ggml_reshape_{1,2,3,4}d` (the source must be contiguous)."""
        if not a.is_contiguous:
            raise ValueError(f"reshape of a non-contiguous tensor {a.name}")
        dims = _pad4(ne)
        if dims[0] * dims[1] * dims[2] * dims[3] != a.nelements:
            raise ValueError(f"reshape of {a.name}: {a.ne} to {dims}")
        return self._view(a, "RESHAPE", dims, contiguous_strides(a.dtype, dims), 0, f"{a.name} (reshaped)")

    def permute(self, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
        ne = [0] * 4
        nb = [0] * 4
        for axis, n, stride in zip((axis0, axis1, axis2, axis3), a.ne, a.nb):
            ne[axis], nb[axis] = n, stride
        return self._view(a, "PERMUTE", tuple(ne), tuple(nb), 0, f"{a.name} (permuted)")

    def transpose(self, a: Tensor) -> Tensor:
        ne = (a.ne[1], a.ne[0], a.ne[2], a.ne[3])
        nb = (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
        return self._view(a, "TRANSPOSE", ne, nb, 0, f"{a.name} (transposed)")

    # --- ops ---
    def dup_tensor(self, a: Tensor, op: str, src: tuple[Tensor, ...], name: str = "", desc: str = "") -> Tensor:
        """`ggml_dup_tensor`: a contiguous tensor of a's type and shape."""
        return self.new(a.dtype, a.ne, name, op, src, desc)

    def get_rows(self, a: Tensor, b: Tensor, name: str = "") -> Tensor:
        dtype = "i32" if a.dtype == "i32" else "f32"
        return self.new(dtype, (a.ne[0], b.ne[0], b.ne[1], b.ne[2]), name, "GET_ROWS", (a, b))

    def mul_mat(self, a: Tensor, b: Tensor, name: str = "") -> Tensor:
        return self.new("f32", (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), name, "MUL_MAT", (a, b))

    def binary(self, op: str, a: Tensor, b: Tensor, name: str = "") -> Tensor:
        """`ggml_add`, `ggml_mul`, ...: a tensor of a's shape."""
        return self.dup_tensor(a, op, (a, b), name)

    def unary(self, a: Tensor, which: str, name: str = "") -> Tensor:
        """`ggml_unary` (tanh, gelu, silu, ...): ggml_op_desc prints the unary op's name."""
        return self.dup_tensor(a, "UNARY", (a,), name, desc=which.upper())

    def glu_split(self, which: str, a: Tensor, b: Tensor, name: str = "") -> Tensor:
        """`ggml_swiglu_split` / `ggml_geglu_split`: a tensor of a's shape."""
        return self.new(a.dtype, a.ne, name, "GLU", (a, b), desc=which.upper())

    def rms_norm(self, a: Tensor, name: str = "") -> Tensor:
        return self.dup_tensor(a, "RMS_NORM", (a,), name)

    def scale(self, a: Tensor, name: str = "", inplace: bool = False) -> Tensor:
        """`ggml_scale`; `ggml_scale_inplace` returns a view of a (listed, never placed)."""
        if not inplace:
            return self.dup_tensor(a, "SCALE", (a,), name)
        result = self.view_tensor(a, name)
        result.op, result.src = "SCALE", (a,)
        return result

    def dup(self, a: Tensor, name: str = "") -> Tensor:
        return self.dup_tensor(a, "DUP", (a,), name)

    def cont(self, a: Tensor, *ne: int, name: str = "") -> Tensor:
        """`ggml_cont` / `ggml_cont_{1..4}d`."""
        dims = _pad4(ne) if ne else a.ne
        return self.new(a.dtype, dims, name or f"{a.name} (cont)", "CONT", (a,))

    def rope(self, a: Tensor, pos: Tensor, factors: Tensor | None = None, name: str = "") -> Tensor:
        """`ggml_rope_ext`: a contiguous tensor of a's shape."""
        src = (a, pos) if factors is None else (a, pos, factors)
        return self.dup_tensor(a, "ROPE", src, name)

    def soft_max(self, a: Tensor, mask: Tensor | None, name: str = "") -> Tensor:
        """`ggml_soft_max_ext`."""
        return self.dup_tensor(a, "SOFT_MAX", (a,) if mask is None else (a, mask), name)

    def flash_attn(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, name: str = "") -> Tensor:
        """`ggml_flash_attn_ext`: f32, (v head dim, n_head, n_tokens, n_stream)."""
        return self.new("f32", (v.ne[0], q.ne[2], q.ne[1], q.ne[3]), name, "FLASH_ATTN_EXT", (q, k, v, mask))

    def set_rows(self, a: Tensor, b: Tensor, c: Tensor, name: str = "") -> Tensor:
        """`ggml_set_rows`: a view of the destination a, sources (b, c, a)."""
        result = self.view_tensor(a, name)
        result.op, result.src = "SET_ROWS", (b, c, a)
        return result

    def cpy(self, a: Tensor, b: Tensor) -> Tensor:
        """`ggml_cpy`: a view of the destination b."""
        result = self.view_tensor(b, f"{b.name} (copy of {a.name})")
        result.op, result.src = "CPY", (a, b)
        return result

    def cast(self, a: Tensor, dtype: str) -> Tensor:
        """`ggml_cast`: a new tensor whose second source is itself."""
        result = self.new(dtype, a.ne, f"{a.name} (copy)", "CPY", (a,))
        result.src = (a, result)
        return result

    def ssm_conv(self, sx: Tensor, c: Tensor, name: str = "") -> Tensor:
        """`ggml_ssm_conv`: f32 (d_inner, n_t, n_s), n_t = sx.ne[0] - d_conv + 1, d_conv = c.ne[0]."""
        d_conv, d_inner = c.ne[0], c.ne[1]
        n_t = sx.ne[0] - d_conv + 1
        if sx.ne[1] != d_inner or n_t < 0:
            raise ValueError(f"ssm_conv: {sx.ne} against the kernel {c.ne}")
        return self.new("f32", (d_inner, n_t, sx.ne[2]), name, "SSM_CONV", (sx, c))

    def ssm_scan(self, s: Tensor, x: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor, ids: Tensor, name: str = "") -> Tensor:
        """`ggml_ssm_scan`: one f32 vector, y (x's elements) then the final states (d_state x
        head_dim x n_head per sequence in ids)."""
        size = x.nelements + s.ne[0] * s.ne[1] * s.ne[2] * ids.ne[0]
        return self.new("f32", (size,), name, "SSM_SCAN", (s, x, dt, a, b, c, ids))

    def concat(self, a: Tensor, b: Tensor, dim: int, name: str = "") -> Tensor:
        ne = list(a.ne)
        ne[dim] += b.ne[dim]
        return self.new(a.dtype, tuple(ne), name, "CONCAT", (a, b))

    def pad(self, a: Tensor, p0: int, p1: int = 0, p2: int = 0, p3: int = 0, name: str = "") -> Tensor:
        return self.new(a.dtype, (a.ne[0] + p0, a.ne[1] + p1, a.ne[2] + p2, a.ne[3] + p3), name, "PAD", (a,))


@dataclass
class Graph:
    """A `ggml_cgraph`: leafs and nodes in the order `ggml_build_forward_expand` visits them."""

    nodes: list[Tensor] = field(default_factory=list)
    leafs: list[Tensor] = field(default_factory=list)
    _seen: set[int] = field(default_factory=set)

    def expand(self, tensor: Tensor) -> Tensor:
        """`ggml_visit_parents_graph`: sources first, depth first, in source order."""
        stack: list[tuple[Tensor, int]] = [(tensor, 0)]
        while stack:
            node, at = stack.pop()
            if at == 0:
                if id(node) in self._seen:
                    continue
                self._seen.add(id(node))
            if at < len(node.src):
                stack.append((node, at + 1))
                parent = node.src[at]
                if id(parent) not in self._seen:
                    stack.append((parent, 0))
                continue
            (self.leafs if node.op == "NONE" else self.nodes).append(node)
        return tensor

    def listed_nodes(self) -> list[tuple[int, Tensor]]:
        """The nodes the scheduler's debug listing prints: every node but the view ops, with its index."""
        return [(index, node) for index, node in enumerate(self.nodes) if node.op not in VIEW_OPS]


class DynAllocator:
    """`ggml_dyn_tallocr` over one chunk (a CPU buffer is never split): free blocks by offset."""

    def __init__(self, alignment: int) -> None:
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment {alignment}: must be a power of two")
        self.alignment = alignment
        self.blocks: list[list[int]] = [[0, 1 << 62]]  # [offset, size]; the last block is unbounded
        self.max_size = 0

    def aligned(self, size: int) -> int:
        return -(-size // self.alignment) * self.alignment

    def alloc(self, size: int) -> int:
        """`ggml_dyn_tallocr_alloc`: the smallest free block besides the last that holds `size`
        (the later of equal ones), else the last block; returns the offset."""
        size = self.aligned(size)
        best, best_size = -1, None
        for index, (_offset, block_size) in enumerate(self.blocks[:-1]):
            if block_size >= size and (best_size is None or block_size <= best_size):
                best, best_size = index, block_size
        if best == -1:
            best = len(self.blocks) - 1
        block = self.blocks[best]
        offset = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del self.blocks[best]
        self.max_size = max(self.max_size, offset + size)
        return offset

    def free(self, offset: int, size: int) -> None:
        """`ggml_dyn_tallocr_free_bytes`: merge with the block it ends or starts, else insert."""
        size = self.aligned(size)
        for index, block in enumerate(self.blocks):
            if block[0] + block[1] == offset:
                block[1] += size
                if index + 1 < len(self.blocks) and block[0] + block[1] == self.blocks[index + 1][0]:
                    block[1] += self.blocks[index + 1][1]
                    del self.blocks[index + 1]
                return
            if offset + size == block[0]:
                block[0] = offset
                block[1] += size
                if index > 0 and self.blocks[index - 1][0] + self.blocks[index - 1][1] == block[0]:
                    self.blocks[index - 1][1] += block[1]
                    del self.blocks[index]
                return
        at = 0
        while at < len(self.blocks) and self.blocks[at][0] < offset:
            at += 1
        self.blocks.insert(at, [offset, size])


@dataclass
class _State:
    children: int = 0
    views: int = 0
    allocated: bool = False
    offset: int = 0


def _view_root(view: Tensor) -> Tensor:
    if view.view_src is None:
        raise ValueError(f"{view.name}: not a view")
    return view.view_src


def graph_peak(graph: Graph, alignment: int, trace: list[tuple[str, str, int, int]] | None = None, offsets: dict[int, int] | None = None) -> int:
    """The bytes `ggml_gallocr_reserve_n` sizes one buffer to for this graph. `trace`, when given,
    receives (alloc | inplace | free, tensor name, offset, bytes) in order; `offsets` receives each
    placed tensor's offset by id()."""
    alloc = DynAllocator(alignment)
    state: dict[int, _State] = {}

    def st(tensor: Tensor) -> _State:
        return state.setdefault(id(tensor), _State())

    def free_extra(offset: int, parent: Tensor, node: Tensor) -> None:
        parent_size, node_size = alloc.aligned(parent.nbytes), alloc.aligned(node.nbytes)
        if parent_size > node_size:
            alloc.free(offset + node_size, parent_size - node_size)

    def allocate(node: Tensor) -> None:
        hn = st(node)
        if node.external or hn.allocated or node.is_view:
            return
        hn.allocated = True
        if node.op in INPLACE_OPS:
            for parent in node.src:
                p_hn = st(parent)
                if not p_hn.allocated:
                    continue
                if parent.is_output or (parent.view_src is not None and parent.view_src.is_output):
                    continue
                if not node.same_layout(parent) or p_hn.children != 1 or p_hn.views != 0:
                    continue
                if parent.is_view:
                    root = _view_root(parent)
                    r_hn = st(root)
                    if r_hn.views == 1 and r_hn.children == 0:
                        hn.offset = r_hn.offset
                        p_hn.allocated = False
                        r_hn.allocated = False
                        free_extra(hn.offset, root, node)
                        return
                    continue
                hn.offset = p_hn.offset
                p_hn.allocated = False
                free_extra(hn.offset, parent, node)
                if trace is not None:
                    trace.append(("inplace", f"{node.name} over {parent.name}", hn.offset, node.nbytes))
                if offsets is not None:
                    offsets[id(node)] = hn.offset
                return
        hn.offset = alloc.alloc(node.nbytes)
        if trace is not None:
            trace.append(("alloc", node.name, hn.offset, node.nbytes))
        if offsets is not None:
            offsets[id(node)] = hn.offset

    def free(node: Tensor) -> None:
        if node.is_output:
            return
        hn = st(node)
        alloc.free(hn.offset, node.nbytes)
        hn.allocated = False
        if trace is not None:
            trace.append(("free", node.name, hn.offset, node.nbytes))

    for leaf in graph.leafs:
        allocate(leaf)
    for node in graph.nodes:
        if node.is_view and node.op != "NONE":
            st(node.view_src).views += 1  # type: ignore[arg-type]
        if node.is_input:
            allocate(node)
        for parent in node.src:
            st(parent).children += 1
            if parent.is_input:
                allocate(parent)
    for node in graph.nodes:
        for parent in node.src:
            allocate(parent)
        allocate(node)
        for parent in node.src:
            p_hn = st(parent)
            p_hn.children -= 1
            if p_hn.children or p_hn.views:
                continue
            if parent.is_view:
                root = _view_root(parent)
                r_hn = st(root)
                r_hn.views -= 1
                if r_hn.views == 0 and r_hn.children == 0 and r_hn.allocated:
                    free(root)
            elif p_hn.allocated:
                free(parent)
    return alloc.max_size
