# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The graph llama.cpp builds for a llama-architecture model (src/models/llama.cpp,
`llama_model_llama::graph`), node by node as the allocator sees it, for the reserve the scheduler
runs (`llama_context::graph_reserve`): the tensors ggml-alloc places in the compute buffer, with
their shapes, types, views and consumers. Weights and the KV cache live in other buffers
(external); the inputs (`ggml_set_input`) are graph leafs.

Read from ggml-org/llama.cpp as stored (src/models/llama.cpp, src/llama-graph.cpp,
src/llama-kv-cache.cpp, ggml/src/ggml.c `ggml_build_forward_select`), not from the lab's b11669
itself: the engine's boot lines count 3 nodes and 2 input tensors more than this graph holds,
and 2-3 nodes more per layer without flash attention (graph_law.COMPUTE_RULE keeps the law
pricing llama until they agree).
"""

from __future__ import annotations

from dataclasses import dataclass

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ggml_alloc import Graph, Tensor

QUANTIZED = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl")


@dataclass(frozen=True)
class AttnLayer:
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_kv: int  # cells per stream the layer's cache exposes to the graph


@dataclass(frozen=True)
class Batch:
    n_tokens: int
    n_outputs: int
    n_stream: int  # kv streams: n_seq_max, or 1 with a unified cache


@dataclass(frozen=True)
class Cache:
    flash_attn: bool
    type_k: str
    type_v: str
    k_rot: int = 0  # Hadamard rotation size of the K cache (0: none)
    v_rot: int = 0


def _input(name: str, ne: tuple[int, ...], dtype: str) -> Tensor:
    return Tensor(name, "NONE", ne, dtype, is_input=True)


def _weight(name: str) -> Tensor:
    return Tensor(name, "NONE", (1,), "f16", external=True)


def _op(name: str, op: str, ne: tuple[int, ...], *src: Tensor, dtype: str = "f32") -> Tensor:
    return Tensor(name, op, ne, dtype, src)


def _mul_mat(name: str, weight: Tensor, x: Tensor, rows: int) -> Tensor:
    """`ggml_mul_mat(w, x)`: one f32 row of `rows` per column of x."""
    return _op(name, "MUL_MAT", (rows, *x.ne[1:]), weight, x)


def _rms_norm(name: str, x: Tensor) -> Tensor:
    """`llm_graph_context::build_norm` (LLM_NORM_RMS): ggml_rms_norm then ggml_mul by the weight."""
    normed = _op(f"{name}.rms", "RMS_NORM", x.ne, x)
    return _op(name, "MUL", x.ne, normed, _weight(f"{name}.weight"))


def _hadamard(name: str, x: Tensor, rot: Tensor, nrot: int) -> Tensor:
    """`llama_mul_mat_hadamard`: x cut into nrot-wide rows, multiplied by the rotation, reshaped back."""
    total = 1
    for n in x.ne:
        total *= n
    rows = x.view("RESHAPE", (nrot, total // nrot))
    rotated = _op(name, "MUL_MAT", (nrot, total // nrot), rot, rows)
    return rotated.view("RESHAPE", x.ne)


class AttnInputs:
    """`llm_graph_context::build_attn_inp_kv` / `llama_kv_cache::build_input_*`: the indices the new
    K and V rows go to, the KQ mask (f16 for flash attention, f32 for soft_max), the rotations."""

    def __init__(self, batch: Batch, n_kv: int, cache: Cache, n_embd_v_gqa: int, tag: str = "") -> None:
        tokens = batch.n_tokens
        self.k_idxs = _input(f"k_idxs{tag}", (tokens,), "i64")
        # A transposed V cache (no flash attention) is written element by element.
        self.v_idxs = _input(f"v_idxs{tag}", (tokens if cache.flash_attn else tokens * n_embd_v_gqa,), "i64")
        # `build_attn_inp_kq_mask`: flash attention takes an f16 mask, built as such (no cast).
        self.kq_mask = _input(f"kq_mask{tag}", (n_kv, tokens // batch.n_stream, 1, batch.n_stream), "f16" if cache.flash_attn else "f32")
        self.k_rot = _input(f"k_rot{tag}", (cache.k_rot, cache.k_rot), "f32") if cache.k_rot else None
        self.v_rot = _input(f"v_rot{tag}", (cache.v_rot, cache.v_rot), "f32") if cache.v_rot else None


def build_attn(
    graph: Graph,
    inp: AttnInputs,
    layer: AttnLayer,
    batch: Batch,
    cache: Cache,
    q_cur: Tensor,
    k_cur: Tensor,
    v_cur: Tensor,
    n_embd: int,
    il: int,
) -> Tensor:
    """`llm_graph_context::build_attn` (llm_graph_input_attn_kv) and `build_attn_mha`: rotate for a
    quantised cache, store K and V (set_rows into the cache: no bytes here), attend over every
    stream's cells, project by wo."""
    if inp.k_rot is not None:
        q_cur = _hadamard(f"q_rot-{il}", q_cur, inp.k_rot, cache.k_rot)
        k_cur = _hadamard(f"k_rot-{il}", k_cur, inp.k_rot, cache.k_rot)
    if inp.v_rot is not None:
        v_cur = _hadamard(f"v_rot-{il}", v_cur, inp.v_rot, cache.v_rot)
    graph.expand(q_cur)
    graph.expand(v_cur)
    graph.expand(k_cur)
    n_stream, tokens = batch.n_stream, batch.n_tokens
    per_stream = tokens // n_stream
    k_cache = Tensor(f"cache_k-{il}", "NONE", (layer.head_dim_k * layer.n_head_kv, layer.n_kv * n_stream), cache.type_k, external=True)
    v_cache = Tensor(f"cache_v-{il}", "NONE", (layer.head_dim_v * layer.n_head_kv, layer.n_kv * n_stream), cache.type_v, external=True)
    # llama_kv_cache::cpy_k / cpy_v: ggml_set_rows returns a view of the cache (its data is the cache's).
    k_rows = k_cur.view("RESHAPE", (layer.head_dim_k * layer.n_head_kv, tokens))
    graph.expand(Tensor(f"k_store-{il}", "SET_ROWS", k_cache.ne, cache.type_k, (k_cache, k_rows, inp.k_idxs), external=True))
    v_rows = v_cur.view("RESHAPE", (layer.head_dim_v * layer.n_head_kv, tokens) if cache.flash_attn else (1, tokens * layer.head_dim_v * layer.n_head_kv))
    graph.expand(Tensor(f"v_store-{il}", "SET_ROWS", v_cache.ne, cache.type_v, (v_cache, v_rows, inp.v_idxs), external=True))
    # llama_kv_cache::get_k / get_v: 4-d views over every stream's cells.
    k = k_cache.view("VIEW", (layer.head_dim_k, layer.n_head_kv, layer.n_kv, n_stream))
    v = v_cache.view("VIEW", (layer.head_dim_v, layer.n_head_kv, layer.n_kv, n_stream))
    q = q_cur.view("VIEW", (layer.head_dim_k, layer.n_head, per_stream, n_stream))
    q = q.view("PERMUTE", (layer.head_dim_k, per_stream, layer.n_head, n_stream), layout=(1,))
    k = k.view("PERMUTE", (layer.head_dim_k, layer.n_kv, layer.n_head_kv, n_stream), layout=(1,))
    v = v.view("PERMUTE", (layer.head_dim_v, layer.n_kv, layer.n_head_kv, n_stream), layout=(1,))
    if cache.flash_attn:
        # The flash-attention kernel reads f16: an f32 cache is cast first, every stream at once.
        if cache.type_k == "f32":
            k = _op(f"k_f16-{il}", "CPY", k.ne, k, dtype="f16")
        if cache.type_v == "f32":
            v = _op(f"v_f16-{il}", "CPY", v.ne, v, dtype="f16")
        fa = _op(f"fattn-{il}", "FLASH_ATTN_EXT", (layer.head_dim_v, layer.n_head, per_stream, n_stream), q, k, v, inp.kq_mask)
        cur = fa.view("RESHAPE", (layer.head_dim_v * layer.n_head, tokens))
    else:
        kq = _op(f"kq-{il}", "MUL_MAT", (layer.n_kv, per_stream, layer.n_head, n_stream), k, q)
        kq = _op(f"kq_soft_max-{il}", "SOFT_MAX", kq.ne, kq, inp.kq_mask)
        # The V cache is stored transposed without flash attention: no copy before kqv.
        kqv = _op(f"kqv-{il}", "MUL_MAT", (layer.head_dim_v, per_stream, layer.n_head, n_stream), v, kq)
        merged = kqv.view("PERMUTE", (layer.head_dim_v, layer.n_head, per_stream, n_stream), layout=(1,))
        cur = _op(f"kqv_out-{il}", "CONT", (layer.head_dim_v * layer.n_head, tokens), merged)
    graph.expand(cur)
    if inp.v_rot is not None:
        cur = _hadamard(f"out_rot-{il}", cur, inp.v_rot, cache.v_rot)
    return _mul_mat(f"attn_out-{il}", _weight(f"wo-{il}"), cur, n_embd)


def llama_graph(layers: list[AttnLayer], n_embd: int, n_ff: int, n_vocab: int, batch: Batch, cache: Cache) -> Graph:
    """`llama_model_llama::graph<false>`: embeddings, per layer RMS norm, attention, residual, RMS
    norm, SwiGLU FFN, residual (the last layer on the output rows only), the output norm and head."""
    graph = Graph()
    tokens = batch.n_tokens
    inp_tokens = _input("inp_tokens", (tokens,), "i32")
    # `build_inp_embd`: the token path and the embeddings input are both in the graph
    # (ggml_build_forward_select); the embeddings input has no consumer, so it is never freed.
    inp_l = graph.expand(_op("inp_embd", "GET_ROWS", (n_embd, tokens), _weight("token_embd"), inp_tokens))
    graph.expand(_input("inp_embd_vectors", (n_embd, tokens), "f32"))
    inp_pos = _input("inp_pos", (tokens,), "i32")
    widest = layers[0]
    inp = AttnInputs(batch, widest.n_kv, cache, max(layer.head_dim_v * layer.n_head_kv for layer in layers))
    out_ids = _input("inp_out_ids", (batch.n_outputs,), "i32")
    for il, layer in enumerate(layers):
        inp_sa = inp_l
        cur = _rms_norm(f"attn_norm-{il}", inp_l)
        q = _mul_mat(f"Qcur-{il}", _weight(f"wq-{il}"), cur, layer.head_dim_k * layer.n_head)
        k = _mul_mat(f"Kcur-{il}", _weight(f"wk-{il}"), cur, layer.head_dim_k * layer.n_head_kv)
        v = _mul_mat(f"Vcur-{il}", _weight(f"wv-{il}"), cur, layer.head_dim_v * layer.n_head_kv)
        q = q.view("RESHAPE", (layer.head_dim_k, layer.n_head, tokens))
        k = k.view("RESHAPE", (layer.head_dim_k, layer.n_head_kv, tokens))
        v = v.view("RESHAPE", (layer.head_dim_v, layer.n_head_kv, tokens))
        q = _op(f"Qrope-{il}", "ROPE", q.ne, q, inp_pos)
        k = _op(f"Krope-{il}", "ROPE", k.ne, k, inp_pos)
        cur = build_attn(graph, inp, layer, batch, cache, q, k, v, n_embd, il)
        rows = tokens
        if il == len(layers) - 1:
            rows = batch.n_outputs
            cur = _op(f"attn_rows-{il}", "GET_ROWS", (n_embd, rows), cur, out_ids)
            inp_sa = _op(f"inp_sa_rows-{il}", "GET_ROWS", (n_embd, rows), inp_sa, out_ids)
        ffn_inp = _op(f"ffn_inp-{il}", "ADD", (n_embd, rows), cur, inp_sa)
        cur = _rms_norm(f"ffn_norm-{il}", ffn_inp)
        up = _mul_mat(f"ffn_up-{il}", _weight(f"up-{il}"), cur, n_ff)
        gate = _mul_mat(f"ffn_gate-{il}", _weight(f"gate-{il}"), cur, n_ff)
        act = _op(f"ffn_swiglu-{il}", "GLU", (n_ff, rows), gate, up)
        down = _mul_mat(f"ffn_down-{il}", _weight(f"down-{il}"), act, n_embd)
        inp_l = _op(f"l_out-{il}", "ADD", (n_embd, rows), down, ffn_inp)
    norm = _rms_norm("result_norm", inp_l)
    norm.is_output = True  # llm_graph_result::set_outputs: t_embd and t_logits
    logits = _mul_mat("result_output", _weight("output"), norm, n_vocab)
    logits.is_output = True
    graph.expand(logits)
    return graph
