# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A port of ggml's graph allocator (ggml/src/ggml-alloc.c), so a compute buffer's size comes out
of the same arithmetic the engine runs rather than a fitted formula.

- `DynAllocator` is `ggml_dyn_tallocr` for one chunk (a CPU buffer has no size limit below
  SIZE_MAX/2, so it never opens a second): best fit over the free blocks besides the last,
  else the last block (which grows the buffer), sizes rounded up to the alignment, freed bytes
  merged with the blocks they touch (`ggml_dyn_tallocr_alloc`, `ggml_dyn_tallocr_free_bytes`).
- `graph_peak` is `ggml_gallocr_alloc_graph_impl` over a `Graph`: the leafs first, then the
  inputs in node order, then every node after its parents; a node whose op may run in place
  (`ggml_op_can_inplace`) takes over a parent with the same layout that has no other consumer
  (`ggml_gallocr_allocate_node`); a tensor is freed when its last consumer has run, a view's
  source when its last view has (`ggml_gallocr_free_node`); outputs are never freed.
  The buffer the engine reserves is the allocator's high-water mark (`ggml_gallocr_reserve_n`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# ggml-alloc.c ggml_op_can_inplace: the ops that may write over a source.
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
# ggml.c ggml_impl_is_view: the ops whose result aliases their source.
VIEW_OPS = frozenset(("VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"))
# Bytes per element of the unblocked types; a block type is (block bytes, elements per block).
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


@dataclass(eq=False)
class Tensor:
    """One graph tensor: what ggml-alloc reads of a `ggml_tensor`."""

    name: str
    op: str
    ne: tuple[int, ...]
    dtype: str = "f32"
    src: tuple[Tensor, ...] = ()
    view_src: Tensor | None = None
    view_offs: int = 0
    external: bool = False  # data in another buffer (weights, the KV cache)
    is_input: bool = False
    is_output: bool = False
    layout: tuple[int, ...] = field(default=())  # the strides, when not contiguous

    @property
    def nbytes(self) -> int:
        """`ggml_nbytes` of a contiguous tensor (the CPU buffer's `get_alloc_size`)."""
        block_bytes, block = TYPE_SIZE[self.dtype]
        rows = 1
        for n in self.ne[1:]:
            rows *= n
        return -(-self.ne[0] // block) * block_bytes * rows

    @property
    def is_view(self) -> bool:
        return self.view_src is not None and self.op in VIEW_OPS

    def view(self, op: str, ne: tuple[int, ...], offset: int = 0, layout: tuple[int, ...] = ()) -> Tensor:
        """A view of this tensor (`ggml_view_impl`): its source is the root of any view chain."""
        root = self.view_src or self
        return Tensor(f"{self.name}.{op.lower()}", op, ne, self.dtype, (self,), root, self.view_offs + offset, layout=layout)

    def same_layout(self, other: Tensor) -> bool:
        """`ggml_are_same_layout`: type, shape and strides."""
        return self.dtype == other.dtype and _dims(self.ne) == _dims(other.ne) and self.layout == other.layout


def _dims(ne: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(ne) + (1,) * (4 - len(ne))


class DynAllocator:
    """`ggml_dyn_tallocr` over one chunk: free blocks sorted by offset, the last one unbounded."""

    def __init__(self, alignment: int) -> None:
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment {alignment}: must be a power of two")
        self.alignment = alignment
        self.blocks: list[list[int]] = [[0, 1 << 62]]  # [offset, size]
        self.max_size = 0

    def _aligned(self, size: int) -> int:
        return -(-size // self.alignment) * self.alignment

    def alloc(self, size: int) -> int:
        """`ggml_dyn_tallocr_alloc`: the smallest free block besides the last that holds `size`
        (the later of equal ones), else the last block; returns the offset."""
        size = self._aligned(size)
        best = -1
        best_size = None
        for i, (_offset, block_size) in enumerate(self.blocks[:-1]):
            if block_size >= size and (best_size is None or block_size <= best_size):
                best, best_size = i, block_size
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
        size = self._aligned(size)
        for i, block in enumerate(self.blocks):
            if block[0] + block[1] == offset:
                block[1] += size
                if i + 1 < len(self.blocks) and block[0] + block[1] == self.blocks[i + 1][0]:
                    block[1] += self.blocks[i + 1][1]
                    del self.blocks[i + 1]
                return
            if offset + size == block[0]:
                block[0] = offset
                block[1] += size
                if i > 0 and self.blocks[i - 1][0] + self.blocks[i - 1][1] == block[0]:
                    self.blocks[i - 1][1] += block[1]
                    del self.blocks[i]
                return
        at = 0
        while at < len(self.blocks) and self.blocks[at][0] < offset:
            at += 1
        self.blocks.insert(at, [offset, size])


@dataclass
class Graph:
    """A `ggml_cgraph` as ggml_build_forward_expand lays it out: leafs and nodes in visit order."""

    nodes: list[Tensor] = field(default_factory=list)
    leafs: list[Tensor] = field(default_factory=list)
    _seen: set[int] = field(default_factory=set)

    def expand(self, tensor: Tensor) -> Tensor:
        """`ggml_build_forward_expand` (`ggml_visit_parents`): sources first, depth first, in
        source order; a tensor with no op is a leaf, anything else a node."""
        stack: list[tuple[Tensor, int]] = [(tensor, 0)]
        while stack:
            node, at = stack.pop()
            if id(node) in self._seen:
                continue
            if at < len(node.src):
                stack.append((node, at + 1))
                parent = node.src[at]
                if id(parent) not in self._seen:
                    stack.append((parent, 0))
                continue
            self._seen.add(id(node))
            (self.leafs if node.op == "NONE" else self.nodes).append(node)
        return tensor


@dataclass
class _State:
    children: int = 0
    views: int = 0
    allocated: bool = False
    offset: int = 0


def graph_peak(graph: Graph, alignment: int, trace: list[tuple[str, str, int, int]] | None = None) -> int:
    """The bytes `ggml_gallocr_reserve_n` sizes one buffer to for this graph (one backend, one chunk).
    `trace`, when given, receives (alloc | free | inplace, tensor name, offset, bytes) in order."""
    alloc = DynAllocator(alignment)
    state: dict[int, _State] = {}

    def st(tensor: Tensor) -> _State:
        return state.setdefault(id(tensor), _State())

    def own(tensor: Tensor) -> bool:
        return st(tensor).allocated

    def allocate(node: Tensor) -> None:
        hn = st(node)
        if node.external or hn.allocated or node.is_view:
            return
        hn.allocated = True
        if node.op in INPLACE_OPS:
            for parent in node.src:
                if not own(parent) or parent.is_output or (parent.view_src is not None and parent.view_src.is_output):
                    continue
                if not node.same_layout(parent):
                    continue
                p_hn = st(parent)
                if p_hn.children != 1 or p_hn.views != 0:
                    continue
                if parent.is_view:
                    source = parent.view_src
                    s_hn = st(source)
                    if s_hn.views == 1 and s_hn.children == 0 and parent.view_offs == 0:
                        hn.offset = s_hn.offset
                        p_hn.allocated = False
                        s_hn.allocated = False
                        _free_extra(alloc, hn.offset, source.nbytes, node.nbytes)
                        return
                    continue
                hn.offset = p_hn.offset
                if trace is not None:
                    trace.append(("inplace", f"{node.name} over {parent.name}", hn.offset, node.nbytes))
                p_hn.allocated = False
                _free_extra(alloc, hn.offset, parent.nbytes, node.nbytes)
                return
        hn.offset = alloc.alloc(node.nbytes)
        if trace is not None:
            trace.append(("alloc", node.name, hn.offset, node.nbytes))

    def free(node: Tensor) -> None:
        if node.is_output:
            return
        hn = st(node)
        if trace is not None:
            trace.append(("free", node.name, hn.offset, node.nbytes))
        alloc.free(hn.offset, node.nbytes)
        hn.allocated = False

    for leaf in graph.leafs:
        allocate(leaf)
    for node in graph.nodes:
        if node.is_view:
            st(node.view_src).views += 1
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
                source = parent.view_src
                s_hn = st(source)
                s_hn.views -= 1
                if s_hn.views == 0 and s_hn.children == 0 and s_hn.allocated:
                    free(source)
            elif p_hn.allocated:
                free(parent)
    return alloc.max_size


def _free_extra(alloc: DynAllocator, offset: int, parent_size: int, node_size: int) -> None:
    """`ggml_gallocr_free_extra_space`: a smaller in-place result gives back the parent's tail."""
    parent_size, node_size = alloc._aligned(parent_size), alloc._aligned(node_size)
    if parent_size > node_size:
        alloc.free(offset + node_size, parent_size - node_size)
