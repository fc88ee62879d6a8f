# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The graph llama.cpp builds for a llama-architecture model (src/models/llama.cpp,
`llama_model_llama::graph<false>`): embeddings; per layer RMS norm, Q/K/V, RoPE, attention over the
cache, the residual, RMS norm, the SwiGLU FFN, the residual, the last layer on the output rows
only; the output norm and the head."""

from __future__ import annotations

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ggml_graph import Graph
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.graphs.common import Cache, GraphBuilder, Ubatch, attention_layers
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.kv_law import ModelGeometry


def build(geometry: ModelGeometry, ub: Ubatch) -> Graph:
    layers, n_embd, n_vocab = attention_layers(geometry), geometry.n_embd, geometry.n_vocab
    g = GraphBuilder(ub, n_embd, n_vocab)
    ctx = g.ctx
    tok_embd = g.weight("token_embd.weight", n_embd, n_vocab)
    inp_l = g.inp_embd(tok_embd)
    inp_pos = g.inp_pos()
    cache = Cache(ctx, ub, dict(enumerate(layers)), ub.kv_size, ub.n_kv)
    inp_out_ids = g.inp_out_ids()
    for il, layer in enumerate(layers):
        inp_sa = inp_l
        cur = g.norm_rms(inp_l, g.weight(f"blk.{il}.attn_norm.weight", n_embd), f"attn_norm-{il}")
        q, k, v = g.qkv(cur, layer, il)
        q = ctx.rope(q, inp_pos, name=f"Qcur-{il}")
        k = ctx.rope(k, inp_pos, name=f"Kcur-{il}")
        cur = g.attn(cache, layer, il, q, k, v)
        if il == len(layers) - 1:
            cur = g.output_rows(cur, inp_out_ids)
            inp_sa = g.output_rows(inp_sa, inp_out_ids)
        ffn_inp = ctx.binary("ADD", cur, inp_sa, f"ffn_inp-{il}")
        cur = g.norm_rms(ffn_inp, g.weight(f"blk.{il}.ffn_norm.weight", n_embd), f"ffn_norm-{il}")
        cur = g.ffn_glu(cur, layer, il)
        inp_l = ctx.binary("ADD", cur, ffn_inp, f"l_out-{il}")
    g.result(inp_l, g.weight("output_norm.weight", n_embd), g.weight("output.weight", n_embd, n_vocab))
    return g.gf
