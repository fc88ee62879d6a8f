# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The graphs llama.cpp builds for Gemma 2 and Gemma 3 (src/models/gemma2.cpp, gemma3.cpp): the
embeddings scaled, per layer RMS norm, Q/K/V (Gemma 3: Q and K RMS-normed) with RoPE and a Q
scale, attention over the layer's own cache (iSWA: full-attention and sliding-window layers each
have a cache, `llm_graph_input_attn_kv_iswa`), post-attention norm and residual, norm, the GeGLU
FFN, post-FFN norm and residual; the output norm, the head and its soft-capping.
Gemma 2 soft-caps the attention logits (without flash attention: scale, tanh, scale before the
soft_max; flash attention takes the cap as a parameter) and always the final logits; Gemma 3 caps
the final logits only where its header gives a cap. b11669 scales Gemma 3's embeddings by an
input row of scales (`inp_scale_rows`, the token rows' sqrt(n_embd), 1 for vector rows) where
the vendored source scales by a constant as Gemma 2 still does."""

from __future__ import annotations

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ggml_graph import Graph
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.graphs.common import Cache, GraphBuilder, Ubatch, attention_layers
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.kv_law import ModelGeometry


def build(geometry: ModelGeometry, ub: Ubatch) -> Graph:
    layers, n_embd, n_vocab = attention_layers(geometry), geometry.n_embd, geometry.n_vocab
    gemma3 = geometry.architecture == "gemma3"
    # Gemma 2 always soft-caps its logits (its cap defaults to 30); Gemma 3 where its header gives a cap.
    final_softcap = not gemma3 or geometry.final_logit_softcap > 0
    g = GraphBuilder(ub, n_embd, n_vocab)
    ctx = g.ctx
    tok_embd = g.weight("token_embd.weight", n_embd, n_vocab)
    inp_l = g.inp_embd(tok_embd)
    if gemma3:
        inp_l = ctx.binary("MUL", inp_l, ctx.input("inp_scale_rows", "f32", (1, ub.n_tokens)), "inp_scaled")
    else:
        inp_l = ctx.scale(inp_l, "inp_scaled")
    inp_pos = g.inp_pos()
    iswa = any(layer.kind == "swa" for layer in layers)
    full = Cache(ctx, ub, {il: layer for il, layer in enumerate(layers) if layer.kind == "full"}, ub.kv_size, ub.n_kv)
    swa = Cache(ctx, ub, {il: layer for il, layer in enumerate(layers) if layer.kind == "swa"}, ub.kv_size_swa, ub.n_kv_swa) if iswa else None
    inp_out_ids = g.inp_out_ids()
    for il, layer in enumerate(layers):
        cur = g.norm_rms(inp_l, g.weight(f"blk.{il}.attn_norm.weight", n_embd), f"attn_norm-{il}")
        q, k, v = g.qkv(cur, layer, il)
        if gemma3:
            q = g.norm_rms(q, g.weight(f"blk.{il}.attn_q_norm.weight", layer.head_dim_k), f"Qcur_normed-{il}")
        q = ctx.rope(q, inp_pos, name=f"Qcur-{il}")
        if gemma3:
            k = g.norm_rms(k, g.weight(f"blk.{il}.attn_k_norm.weight", layer.head_dim_k), f"Kcur_normed-{il}")
        k = ctx.rope(k, inp_pos, name=f"Kcur-{il}")
        q = ctx.scale(q)
        cache = swa if layer.kind == "swa" and swa is not None else full
        cur = g.attn(cache, layer, il, q, k, v, softcap=not gemma3, iswa=iswa, wo_name="attn_wo")
        if il == len(layers) - 1:
            cur = g.output_rows(cur, inp_out_ids)
            inp_l = g.output_rows(inp_l, inp_out_ids)
        cur = g.norm_rms(cur, g.weight(f"blk.{il}.post_attention_norm.weight", n_embd), f"attn_post_norm-{il}")
        sa_out = ctx.binary("ADD", cur, inp_l, f"sa_out-{il}")
        cur = g.norm_rms(sa_out, g.weight(f"blk.{il}.ffn_norm.weight", n_embd), f"ffn_norm-{il}")
        cur = g.ffn_glu(cur, layer, il, "geglu")
        cur = g.norm_rms(cur, g.weight(f"blk.{il}.post_ffw_norm.weight", n_embd), f"ffn_post_norm-{il}")
        inp_l = ctx.binary("ADD", cur, sa_out, f"l_out-{il}")
    g.result(inp_l, g.weight("output_norm.weight", n_embd), tok_embd, softcap=final_softcap)
    return g.gf
