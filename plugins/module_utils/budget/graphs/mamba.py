# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The graph llama.cpp builds for a Mamba-1 model (src/models/mamba.cpp, `llama_model_mamba::graph`;
the layer in src/models/mamba-base.cpp, `llm_build_mamba_base::build_mamba_layer`): embeddings; per
layer RMS norm, the recurrent states read back (`llm_graph_context::build_rs`, src/llama-graph.cpp),
the input projection split into x and z, the causal convolution over the saved conv states and x
(`ggml_ssm_conv`), its last columns stored back, the selective scan over the saved SSM states
(`ggml_ssm_scan`), its final states stored back, the D skip, the SiLU gate by z, the output
projection and the residual, the last layer on the output rows only; the output norm and the head.

The recurrent memory (src/llama-memory-recurrent.cpp) holds, per layer, an f32 conv-state tensor
`cache_r_l{il}` of (d_conv - 1) x d_inner per cell and an f32 SSM-state tensor `cache_s_l{il}` of
d_state x d_inner per cell, max(1, n_seq_max) cells; at reserve (`init_full`) the graph copies
every cell (n_rs = the cells) and its ubatch holds one sequence per cell.

Held node by node against the lab's b11669 (scripts/engine_graph.py diff); where b11669 differs
from the vendored source (llama-cpp-python 0.3.36), the function that builds the part says so.
"""

from __future__ import annotations

from collections.abc import Callable

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ggml_graph import Context, Graph, Tensor
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.graphs.common import GraphBuilder, Ubatch
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.kv_law import ModelGeometry

F32 = 4  # ggml_element_size of the f32 states and activations


# --- the recurrent-state input and read-back (src/llama-graph.cpp) ---


class RsInput:
    """`llm_graph_input_rs` (`build_rs_inp_impl`): the i32 input rs_s_copy of n_rs cell indices
    and the views of it the layers share (made once, so only the first layer's expansion lists
    them): the ubatch's sequences (s_copy_main, n_seqs indices), which the SSM scan reads, and
    what b11669 reads the SSM states' extra rows through, n_rs - 1 indices. The vendored source's
    s_copy_extra (n_rs - n_seqs indices) is read by no node in b11669's mamba graph; its view of
    n_rs - 1 is placed here from the second index (the offset moves no byte: the view is of an
    input)."""

    def __init__(self, ctx: Context, n_rs: int, n_seqs: int) -> None:
        self.n_rs, self.n_seqs = n_rs, n_seqs
        self.s_copy = ctx.input("rs_s_copy", "i32", (n_rs,))
        self.s_copy_main = ctx.view(self.s_copy, (n_seqs,), ())
        self.s_copy_rest = ctx.view(self.s_copy, (max(n_rs - 1, 0),), (), self.s_copy.nb[0])


def build_rs(
    g: GraphBuilder,
    inp: RsInput,
    s: Tensor,
    state_size: int,
    get_state_rows: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> Tensor:
    """`llm_graph_context::build_rs`: the states reshaped to rows, the zeroed cell cleared in place
    (`ggml_scale_inplace` over a one-row view, expanded), the ubatch's rows gathered (expanded) and
    the extra cells' rows copied back into the cache (expanded); returns the gathered rows.

    b11669 differs from the vendored source, which gathers the ubatch's rows with
    `get_state_rows(states, s_copy_main)` and the extra rows with a second
    `ggml_get_rows(states, s_copy_extra)`. b11669's listing shows instead:
    - the plain gather (`get_state_rows` unset: the conv states) gathers every cell at once, one
      GET_ROWS of n_rs rows reading rs_s_copy itself, and takes the ubatch's rows and the extra
      rows as two views of it (the copy back reads "node_N (view)");
    - a custom gather (the SSM scan, over s_copy_main) is followed by a GET_ROWS of n_rs - 1 rows
      over a view of rs_s_copy the layers share (0, 64K and 4 x 64K for 1, 2 and 5 cells of 64K),
      and the copy back reads an (n_rs - n_seqs)-row view of it.
    At reserve n_rs = n_seqs, so both copies move zero rows; their nodes and the n_rs - 1 rows of
    the extra gather stay in the graph and in the buffer."""
    ctx, gf = g.ctx, g.gf
    n_rs, n_seqs = inp.n_rs, inp.n_seqs
    states = ctx.reshape(s, state_size, s.nelements // state_size)
    # the zeroed cell (rs_z >= 0 at reserve): one row, cleared in place
    state_zero = ctx.view(states, (state_size,), ())
    gf.expand(ctx.scale(state_zero, inplace=True))
    dst = ctx.view(s, (state_size, n_rs - n_seqs), (s.nb[1],), n_seqs * s.nb[1])
    if get_state_rows is None:
        rows = ctx.get_rows(states, inp.s_copy)
        output_states = ctx.view(rows, (state_size, n_seqs), (rows.nb[1],))
        gf.expand(output_states)
        states_extra = ctx.view(rows, (state_size, n_rs - n_seqs), (rows.nb[1],), n_seqs * rows.nb[1])
    else:
        output_states = get_state_rows(states, inp.s_copy_main)
        gf.expand(output_states)
        rows = ctx.get_rows(states, inp.s_copy_rest)
        states_extra = ctx.view(rows, (state_size, n_rs - n_seqs), (rows.nb[1],))
    gf.expand(ctx.cpy(states_extra, dst))
    return output_states


# --- the Mamba layer (src/models/mamba-base.cpp) ---


def mamba_layer(g: GraphBuilder, inp: RsInput, cur: Tensor, geometry: ModelGeometry, il: int, rs_size: int) -> Tensor:
    """`llm_build_mamba_base::build_mamba_layer` (Mamba-1: head_dim 1, n_head d_inner, one group;
    no dt/B/C RMS norms, as the corpus's models have none): conv states read back and the
    convolution input built and its last d_conv - 1 columns stored (expanded), the SSM states read
    back through the scan (`build_rs` with the scan as its gather), the final states stored
    (expanded); the output (D skip, z gate, out projection) is left for the next layer's or the
    result's expansion to reach, as in the engine. b11669 builds the layer as the vendored source
    does (node for node); only `build_rs` under it differs."""
    ctx, gf = g.ctx, g.gf
    d_conv, d_inner, d_state, dt_rank = geometry.ssm_d_conv, geometry.ssm_d_inner, geometry.ssm_d_state, geometry.ssm_dt_rank
    n_seqs = inp.n_seqs
    n_seq_tokens = g.n_tokens // n_seqs
    n_embd = g.n_embd
    conv_states_all = ctx.weight(f"cache_r_l{il}", ((d_conv - 1) * d_inner, rs_size))
    ssm_states_all = ctx.weight(f"cache_s_l{il}", (d_state * d_inner, rs_size))

    conv = build_rs(g, inp, conv_states_all, (d_conv - 1) * d_inner)
    conv = ctx.reshape(conv, d_conv - 1, d_inner, n_seqs)
    cur = ctx.reshape(cur, cur.ne[0], n_seq_tokens, n_seqs)
    xz = ctx.mul_mat(g.weight(f"blk.{il}.ssm_in.weight", n_embd, 2 * d_inner), cur)
    x = ctx.view(xz, (d_inner, xz.ne[1], xz.ne[2]), (xz.nb[1], xz.nb[2]))
    z = ctx.view(xz, (d_inner, xz.ne[1], xz.ne[2]), (xz.nb[1], xz.nb[2]), d_inner * F32)

    conv_x = ctx.concat(conv, ctx.transpose(x), 0)
    last_conv = ctx.view(conv_x, (d_conv - 1, d_inner, n_seqs), (conv_x.nb[1], conv_x.nb[2]), n_seq_tokens * conv_x.nb[0])
    gf.expand(ctx.cpy(last_conv, ctx.view(conv_states_all, ((d_conv - 1) * d_inner * n_seqs,), ())))
    x = ctx.ssm_conv(conv_x, g.weight(f"blk.{il}.ssm_conv1d.weight", d_conv, d_inner))
    x = ctx.binary("ADD", x, g.weight(f"blk.{il}.ssm_conv1d.bias", d_inner))
    x = ctx.unary(x, "silu")

    x_db = ctx.mul_mat(g.weight(f"blk.{il}.ssm_x.weight", d_inner, dt_rank + 2 * d_state), x)
    dt = ctx.view(x_db, (dt_rank, n_seq_tokens, n_seqs), (x_db.nb[1], x_db.nb[2]))
    b = ctx.view(x_db, (d_state, 1, n_seq_tokens, n_seqs), (d_state * x_db.nb[0], x_db.nb[1], x_db.nb[2]), F32 * dt_rank)
    c = ctx.view(x_db, (d_state, 1, n_seq_tokens, n_seqs), (d_state * x_db.nb[0], x_db.nb[1], x_db.nb[2]), F32 * (dt_rank + d_state))
    dt = ctx.cont(dt)
    dt = ctx.mul_mat(g.weight(f"blk.{il}.ssm_dt.weight", dt_rank, d_inner), dt)
    dt = ctx.binary("ADD", dt, g.weight(f"blk.{il}.ssm_dt.bias", d_inner))
    cur = x
    x = ctx.reshape(x, 1, d_inner, n_seq_tokens, n_seqs)
    a = g.weight(f"blk.{il}.ssm_a", d_state, d_inner)

    def get_ssm_rows(states: Tensor, ids: Tensor) -> Tensor:
        ssm = ctx.reshape(states, d_state, 1, d_inner, rs_size)
        return ctx.ssm_scan(ssm, x, dt, a, b, c, ids)

    y_ssm = build_rs(g, inp, ssm_states_all, d_state * d_inner, get_ssm_rows)
    gf.expand(
        ctx.cpy(
            ctx.view(y_ssm, (d_state * d_inner * n_seqs,), (), x.nb[3] * x.ne[3]),
            ctx.view(ssm_states_all, (d_state * d_inner * n_seqs,), ()),
        )
    )
    y = ctx.view(y_ssm, (d_inner, n_seq_tokens, n_seqs), (x.nb[2], x.nb[3]))
    y = ctx.binary("ADD", y, ctx.binary("MUL", cur, g.weight(f"blk.{il}.ssm_d", d_inner)))
    y = ctx.glu_split("swiglu", ctx.cont(z), y)
    cur = ctx.mul_mat(g.weight(f"blk.{il}.ssm_out.weight", d_inner, n_embd), y)
    return ctx.reshape(cur, cur.ne[0], n_seq_tokens * n_seqs)


def build(geometry: ModelGeometry, ub: Ubatch) -> Graph:
    """`llama_model_mamba::graph` (src/models/mamba.cpp): the embeddings (`build_inp_embd`, as
    b11669 builds it: common.GraphBuilder.inp_embd), the recurrent-state input (`build_rs_inp`),
    the output ids, then per layer norm, `build_mamba_layer`, on the last layer the output rows
    of the layer's output and of its input, the residual; the output norm and the head.

    The recurrent memory has max(1, n_seq_max) cells, which at reserve is the ubatch's n_seqs
    (`graph_reserve` builds both graphs with n_seq_max sequences), so `ub.n_seqs` sizes it.
    b11669 builds the model graph as the vendored source does; it differs in `build_inp_embd`
    (common.py) and `build_rs`. Needs the geometry's n_embd, n_vocab, layer count and ssm_d_conv,
    ssm_d_inner, ssm_d_state, ssm_dt_rank (the header's mamba.ssm.* keys)."""
    missing = [key for key in ("ssm_d_conv", "ssm_d_inner", "ssm_d_state", "ssm_dt_rank") if not getattr(geometry, key)]
    if missing:
        raise ValueError(f"mamba graph: the geometry lacks {', '.join(missing)}")
    n_embd, n_vocab = geometry.n_embd, geometry.n_vocab
    g = GraphBuilder(ub, n_embd, n_vocab)
    ctx = g.ctx
    rs_size = max(1, ub.n_seqs)
    tok_embd = g.weight("token_embd.weight", n_embd, n_vocab)
    inp_l = g.inp_embd(tok_embd)
    rs_inp = RsInput(ctx, rs_size, ub.n_seqs)
    inp_out_ids = g.inp_out_ids()
    for il in range(geometry.n_layer):
        cur = g.norm_rms(inp_l, g.weight(f"blk.{il}.attn_norm.weight", n_embd), f"attn_norm-{il}")
        cur = mamba_layer(g, rs_inp, cur, geometry, il, rs_size)
        if il == geometry.n_layer - 1:
            cur = g.output_rows(cur, inp_out_ids)
            inp_l = g.output_rows(inp_l, inp_out_ids)
        inp_l = ctx.binary("ADD", cur, inp_l, f"l_out-{il}")
    g.result(inp_l, g.weight("output_norm.weight", n_embd), g.weight("output.weight", n_embd, n_vocab))
    return g.gf
