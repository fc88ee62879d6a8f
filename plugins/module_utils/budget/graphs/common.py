# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The parts of a llama.cpp compute graph every architecture shares (src/llama-graph.cpp,
`llm_graph_context`; src/llama-kv-cache.cpp), built tensor by tensor for the reserve the scheduler
runs (`llama_context::graph_reserve`), so ggml-alloc's arithmetic (budget/ggml_graph.py) sizes the
compute buffer as the engine does.

Read from the llama.cpp source as vendored by llama-cpp-python 0.3.36 (upstream 0c1e57098) and
held node by node against the lab's b11669 (scripts/engine_graph.py diff: the scheduler's own
listing of every reserved graph). Where b11669 differs from that source, the engine wins and the
function says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ggml_graph import QUANTIZED, Context, Graph, Tensor, row_size
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.kv_law import ModelGeometry

ROT_MIN = 64


@dataclass(frozen=True)
class Layer:
    """One block as the graph sees it."""

    kind: str  # full | swa | recurrent
    n_head: int = 0
    n_head_kv: int = 0
    head_dim_k: int = 0
    head_dim_v: int = 0
    n_ff: int = 0


def attention_layers(geometry: ModelGeometry) -> list[Layer]:
    """Each block's attention as the graph builds it (the heads and FFN width of the widest layer:
    the GGUF headers the gate reads give one width for every layer of these models)."""
    return [
        Layer(layer.kind, geometry.n_head, layer.n_head_kv, layer.head_dim_k, layer.head_dim_v, geometry.n_ff)
        for layer in geometry.layers
        if layer.kind in ("full", "swa")
    ]


@dataclass(frozen=True)
class Ubatch:
    """The batch one reserved graph is built for, and the cache it attends over."""

    n_tokens: int
    n_seqs: int  # sequences in the ubatch (the streams when the cache is not unified)
    n_outputs: int
    n_stream: int  # cache streams: n_seq_max, or 1 with a unified cache
    kv_size: int  # cells per stream of the full-attention cache (its tensors' ne[1])
    n_kv: int  # cells the graph attends over per stream
    kv_size_swa: int = 0
    n_kv_swa: int = 0
    flash_attn: bool = False
    type_k: str = "f16"
    type_v: str = "f16"


def k_rotation(head_dims: set[int], type_k: str) -> int:
    """`llama_kv_cache::build_input_k_rot`: with a quantised K cache and every layer's head dim a
    multiple of 64, the largest power of two from 64 that divides it (0: no rotation)."""
    if type_k not in QUANTIZED or len(head_dims) != 1:
        return 0
    head_dim = next(iter(head_dims))
    if head_dim % ROT_MIN:
        return 0
    nrot = ROT_MIN
    while head_dim % (nrot * 2) == 0:
        nrot *= 2
    return nrot


def v_rotation(head_dims: set[int], type_v: str) -> int:
    """`llama_kv_cache::build_input_v_rot`: 64 x 64 with a quantised V cache and every head dim a
    multiple of 64."""
    if type_v not in QUANTIZED or len(head_dims) != 1 or next(iter(head_dims)) % ROT_MIN:
        return 0
    return ROT_MIN


class Cache:
    """One KV cache (`llama_kv_cache`): its per-layer tensors and the inputs the graph feeds it."""

    def __init__(self, ctx: Context, ub: Ubatch, layers: dict[int, Layer], kv_size: int, n_kv: int, tag: str = "") -> None:
        self.ctx, self.ub, self.kv_size, self.n_kv = ctx, ub, kv_size, n_kv
        self.v_trans = not ub.flash_attn
        self.tensors: dict[int, tuple[Tensor, Tensor]] = {}
        for il, layer in layers.items():
            k = ctx.weight(f"cache_k_l{il}", (layer.head_dim_k * layer.n_head_kv, kv_size, ub.n_stream), ub.type_k)
            v = ctx.weight(f"cache_v_l{il}", (layer.head_dim_v * layer.n_head_kv, kv_size, ub.n_stream), ub.type_v)
            self.tensors[il] = (k, v)
        n_embd_v_gqa_max = max((layer.head_dim_v * layer.n_head_kv for layer in layers.values()), default=0)
        tokens = ub.n_tokens
        # build_input_k_idxs / build_input_v_idxs (a transposed V is written element by element)
        self.k_idxs = ctx.input(f"attn_inp_k_idxs{tag}", "i64", (tokens,))
        self.v_idxs = ctx.input(f"attn_inp_v_idxs{tag}", "i64", (tokens * n_embd_v_gqa_max if self.v_trans else tokens,))
        # build_attn_inp_kq_mask: f16 for flash attention
        self.kq_mask = ctx.input(f"attn_inp_kq_mask{tag}", "f16" if ub.flash_attn else "f32", (n_kv, tokens // ub.n_stream, 1, ub.n_stream))
        nrot_k = k_rotation({layer.head_dim_k for layer in layers.values()}, ub.type_k)
        nrot_v = v_rotation({layer.head_dim_v for layer in layers.values()}, ub.type_v)
        self.k_rot = ctx.input(f"attn_inp_k_rot{tag}", "f32", (nrot_k, nrot_k)) if nrot_k else None
        self.v_rot = ctx.input(f"attn_inp_v_rot{tag}", "f32", (nrot_v, nrot_v)) if nrot_v else None

    def cpy_k(self, k_cur: Tensor, il: int) -> Tensor:
        """`llama_kv_cache::cpy_k`: the new K rows set into the cache (a view of it)."""
        ctx, k = self.ctx, self.tensors[il][0]
        n_embd_gqa = k_cur.ne[0] * k_cur.ne[1]
        k_cur = ctx.view(k_cur, (n_embd_gqa, k_cur.ne[2]), (k_cur.nb[2],))
        if k.ne[2] > 1:
            k = ctx.reshape(k, n_embd_gqa, self.kv_size * k.ne[2])
        return ctx.set_rows(k, k_cur, self.k_idxs, f"{k.name} (view)")

    def cpy_v(self, v_cur: Tensor, il: int) -> Tensor:
        """`llama_kv_cache::cpy_v`: rows into a flash-attention cache, elements into a transposed one."""
        ctx, v = self.ctx, self.tensors[il][1]
        n_embd_gqa = v_cur.ne[0] * v_cur.ne[1]
        n_tokens = v_cur.ne[2]
        if not self.v_trans:
            v_cur = ctx.view(v_cur, (n_embd_gqa, n_tokens), (v_cur.nb[2],))
            if v.ne[2] > 1:
                v = ctx.reshape(v, n_embd_gqa, self.kv_size * v.ne[2])
            return ctx.set_rows(v, v_cur, self.v_idxs, f"{v.name} (view)")
        if row_size(v_cur.dtype, n_embd_gqa) == v_cur.nb[2]:
            v_cur = ctx.reshape(v_cur, n_embd_gqa, n_tokens)
        else:
            v_cur = ctx.cont(v_cur, n_embd_gqa, n_tokens)
        if n_embd_gqa < v.ne[0]:
            v_cur = ctx.pad(v_cur, v.ne[0] - n_embd_gqa)
        v_view = ctx.reshape(v, 1, v.nelements)
        v_cur = ctx.reshape(v_cur, 1, v_cur.nelements)
        return ctx.set_rows(v_view, v_cur, self.v_idxs, f"{v.name} (view)")

    def get_k(self, il: int, layer: Layer) -> Tensor:
        k = self.tensors[il][0]
        return self.ctx.view(
            k,
            (layer.head_dim_k, layer.n_head_kv, self.n_kv, self.ub.n_stream),
            (row_size(k.dtype, layer.head_dim_k), row_size(k.dtype, k.ne[0]), row_size(k.dtype, k.ne[0] * self.kv_size)),
        )

    def get_v(self, il: int, layer: Layer) -> Tensor:
        v = self.tensors[il][1]
        if not self.v_trans:
            return self.ctx.view(
                v,
                (layer.head_dim_v, layer.n_head_kv, self.n_kv, self.ub.n_stream),
                (row_size(v.dtype, layer.head_dim_v), row_size(v.dtype, v.ne[0]), row_size(v.dtype, v.ne[0] * self.kv_size)),
            )
        return self.ctx.view(
            v,
            (self.n_kv, layer.n_head_kv, layer.head_dim_v, self.ub.n_stream),
            (row_size(v.dtype, self.kv_size * layer.head_dim_v), row_size(v.dtype, self.kv_size), row_size(v.dtype, self.kv_size * v.ne[0])),
        )


def mul_mat_hadamard(ctx: Context, cur: Tensor, rot: Tensor) -> Tensor:
    """`llama_mul_mat_hadamard` (src/llama-impl.h)."""
    n = rot.ne[0]
    res = ctx.cont(cur, n, cur.nelements // n) if not cur.is_contiguous else ctx.reshape(cur, n, cur.nelements // n)
    res = ctx.mul_mat(rot, res)
    return ctx.reshape(res, *cur.ne)


class GraphBuilder:
    """`llm_graph_context`: the context, the graph, and the shared builders."""

    def __init__(self, ub: Ubatch, n_embd: int, n_vocab: int) -> None:
        self.ctx = Context()
        self.gf = Graph()
        self.ub = ub
        self.n_embd = n_embd
        self.n_vocab = n_vocab
        self.n_tokens = ub.n_tokens

    def weight(self, name: str, *ne: int) -> Tensor:
        return self.ctx.weight(name, ne)

    def inp_embd(self, tok_embd: Tensor) -> Tensor:
        """`build_inp_embd` as b11669 builds it: the token rows (named embd), the vector-embeddings
        input (a leaf no node reads), and, selected off, the mixed batch path - the mixed tokens'
        rows set over a copy of the mixed embeddings input, whose copy is never freed (the set's
        view of it has no consumer). Its inputs are placed in that order."""
        ctx, tokens = self.ctx, self.n_tokens
        inp_tokens = ctx.input("inp_tokens", "i32", (tokens,))
        embd = ctx.get_rows(tok_embd, inp_tokens, "embd")
        mixed_tokens = ctx.input("inp_mixed_tokens", "i32", (tokens,))
        mixed_embd = ctx.input("inp_mixed_embd", "f32", (self.n_embd, tokens))
        mixed_slots = ctx.input("inp_mixed_slots", "i64", (tokens,))
        # The vector-embeddings input: a leaf no node consumes (placed with the inputs all the same).
        vectors = ctx.input("inp_embd", "f32", (self.n_embd, tokens))
        rows = ctx.get_rows(tok_embd, mixed_tokens)
        mixed = ctx.set_rows(ctx.dup(mixed_embd), rows, mixed_slots, " (view)")
        for tensor in (embd, rows, vectors, mixed):
            self.gf.expand(tensor)
        return embd

    def inp_pos(self) -> Tensor:
        return self.ctx.input("inp_pos", "i32", (self.n_tokens,))

    def inp_out_ids(self) -> Tensor:
        return self.ctx.input("out_ids", "i32", (self.ub.n_outputs,))

    def norm_rms(self, cur: Tensor, weight: Tensor | None, name: str) -> Tensor:
        """`build_norm` (LLM_NORM_RMS): rms_norm, then the weight."""
        cur = self.ctx.rms_norm(cur, "norm")
        return self.ctx.binary("MUL", cur, weight, name) if weight is not None else cur

    def qkv(self, cur: Tensor, layer: Layer, il: int) -> tuple[Tensor, Tensor, Tensor]:
        """`build_qkv`, separate Q/K/V: three products reshaped to (head dim, heads, tokens)."""
        ctx, tokens = self.ctx, self.n_tokens
        q = ctx.mul_mat(self.weight(f"blk.{il}.attn_q.weight", self.n_embd, layer.head_dim_k * layer.n_head), cur, f"Qcur-{il}")
        k = ctx.mul_mat(self.weight(f"blk.{il}.attn_k.weight", self.n_embd, layer.head_dim_k * layer.n_head_kv), cur, f"Kcur-{il}")
        v = ctx.mul_mat(self.weight(f"blk.{il}.attn_v.weight", self.n_embd, layer.head_dim_v * layer.n_head_kv), cur, f"Vcur-{il}")
        return (
            ctx.reshape(q, layer.head_dim_k, layer.n_head, tokens),
            ctx.reshape(k, layer.head_dim_k, layer.n_head_kv, tokens),
            ctx.reshape(v, layer.head_dim_v, layer.n_head_kv, tokens),
        )

    def attn(
        self,
        cache: Cache,
        layer: Layer,
        il: int,
        q_cur: Tensor,
        k_cur: Tensor,
        v_cur: Tensor,
        softcap: bool = False,
        iswa: bool = False,
        wo_name: str = "attn_out",
    ) -> Tensor:
        """`build_attn`: rotate for a quantised cache, expand q, v, k (llm_graph_input_attn_kv) or
        q, k, v (llm_graph_input_attn_kv_iswa, the layer's own cache) in that order, store K and V,
        attend (`build_attn_mha`), rotate back, project by wo."""
        ctx, gf = self.ctx, self.gf
        if cache.k_rot is not None:
            q_cur = mul_mat_hadamard(ctx, q_cur, cache.k_rot)
            k_cur = mul_mat_hadamard(ctx, k_cur, cache.k_rot)
        if cache.v_rot is not None:
            v_cur = mul_mat_hadamard(ctx, v_cur, cache.v_rot)
        for tensor in (q_cur, k_cur, v_cur) if iswa else (q_cur, v_cur, k_cur):
            gf.expand(tensor)
        gf.expand(cache.cpy_k(k_cur, il))
        gf.expand(cache.cpy_v(v_cur, il))
        k = cache.get_k(il, layer)
        v = cache.get_v(il, layer)
        cur = self.attn_mha(q_cur, k, v, cache.kq_mask, il, softcap)
        if cache.v_rot is not None:
            cur = mul_mat_hadamard(ctx, cur, cache.v_rot)
        wo = self.weight(f"blk.{il}.attn_output.weight", layer.head_dim_v * layer.n_head, self.n_embd)
        return ctx.mul_mat(wo, cur, f"{wo_name}-{il}")

    def attn_mha(self, q: Tensor, k: Tensor, v: Tensor, kq_mask: Tensor, il: int, softcap: bool) -> Tensor:
        """`build_attn_mha`: split the tokens into streams, permute, then flash attention (the
        cache cast to f16 when it is f32) or soft_max(K Q) and V's product, merged back to 2-d."""
        ctx = self.ctx
        v_trans = v.nb[1] > v.nb[2]
        n_stream = k.ne[3]
        q = ctx.view(q, (q.ne[0], q.ne[1], q.ne[2] // n_stream, n_stream), (q.nb[1], q.nb[2], q.nb[2] * (q.ne[2] // n_stream)))
        q = ctx.permute(q, 0, 2, 1, 3)
        k = ctx.permute(k, 0, 2, 1, 3)
        v = ctx.permute(v, 0, 2, 1, 3)
        if self.ub.flash_attn:
            if v_trans:
                v = ctx.transpose(v)
            if k.dtype == "f32":
                k = ctx.cast(k, "f16")
            if v.dtype == "f32":
                v = ctx.cast(v, "f16")
            cur = ctx.flash_attn(q, k, v, kq_mask)
            cur = ctx.reshape(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        else:
            kq = ctx.mul_mat(k, q, f"kq-{il}")
            if softcap:
                kq = ctx.scale(kq, f"kq_scaled_1-{il}")
                kq = ctx.unary(kq, "tanh", f"kq_tanh-{il}")
                kq = ctx.scale(kq, f"kq_scaled_2-{il}")
            kq = ctx.soft_max(kq, kq_mask, f"kq_soft_max-{il}")
            if not v_trans:
                v = ctx.cont(ctx.transpose(v))
            kqv = ctx.mul_mat(v, kq, f"kqv-{il}")
            cur = ctx.permute(kqv, 0, 2, 1, 3)
            cur = ctx.cont(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3], name=f"kqv_out-{il}")
        self.gf.expand(cur)
        return cur

    def ffn_glu(self, cur: Tensor, layer: Layer, il: int, glu: str = "swiglu") -> Tensor:
        """`build_ffn` (LLM_FFN_PAR with silu or gelu): up and gate products, the gated unit, down."""
        ctx = self.ctx
        up = ctx.mul_mat(self.weight(f"blk.{il}.ffn_up.weight", self.n_embd, layer.n_ff), cur, f"ffn_up-{il}")
        gate = ctx.mul_mat(self.weight(f"blk.{il}.ffn_gate.weight", self.n_embd, layer.n_ff), cur, f"ffn_gate-{il}")
        act = ctx.glu_split(glu, gate, up, f"ffn_{glu}-{il}")
        return ctx.mul_mat(self.weight(f"blk.{il}.ffn_down.weight", layer.n_ff, self.n_embd), act, f"ffn_out-{il}")

    def output_rows(self, cur: Tensor, inp_out_ids: Tensor) -> Tensor:
        return self.ctx.get_rows(cur, inp_out_ids)

    def result(self, cur: Tensor, norm_weight: Tensor, output: Tensor, softcap: bool = False) -> Tensor:
        """The final norm (result_norm, an output) and the head (result_output, an output), with
        the final logit soft-capping (scale, tanh, scale) where the model has one."""
        ctx = self.ctx
        cur = self.norm_rms(cur, norm_weight, "result_norm")
        cur.is_output = True  # llm_graph_result::set_outputs: t_embd
        logits = ctx.mul_mat(output, cur, "result_output")
        if softcap:
            logits = ctx.scale(ctx.unary(ctx.scale(logits), "tanh"), "result_output")
        logits.is_output = True  # t_logits
        self.gf.expand(logits)
        return logits
