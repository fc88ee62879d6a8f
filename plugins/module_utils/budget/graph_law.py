# Copyright: frank.llm_fleet maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""llama.cpp's context buffers beyond the KV: the batch it sizes, the output (logits) buffer and
the compute buffer, by the engine's own rules (llama.cpp b11669, as the lab runs it).

- batch (`tools/server`, `src/llama-context.cpp` ctor): n_batch = min(--batch-size (2048),
  --ctx-size as given), n_ubatch = min(--ubatch-size, n_batch); the server's
  n_outputs_max = min(n_batch, n_parallel x (1 + n_draft)) (`server_output_limits`).
- output buffer (`llama_context::output_reserve(n_seq_max)`): n_vocab x n_outputs_max x 4 B of
  logits, in the output device's host buffer (host RAM).
- compute buffer (`llama_context::sched_reserve`, ggml-alloc): the peak of the graphs the engine
  reserves (`reserved_ubatches`): a prompt batch of min(n_ctx, n_ubatch) tokens over n_seq_max
  sequences, rounded up to a multiple of n_seq_max by `graph_reserve`, with min(n_ubatch,
  n_outputs_max) outputs, and a generation batch of n_seq_max tokens and outputs.
  By replay (`replay_graphs`, `COMPUTE_RULE` "replay"): each graph built tensor by tensor as the
  engine builds it for the architecture (budget/graphs/) and placed by a port of ggml's graph
  allocator (budget/ggml_graph.py); the buffer is the largest peak. To the byte on every served
  boot of the differential corpus (tests/differential).
  By the law (an architecture without a replay): ggml-alloc places tensors by liveness, so there
  is no closed form; the law takes the largest of the graph's phases, each the sum of the tensors
  alive together, with multipliers calibrated on the corpus (boots of the real engine):
    inputs  = KQ mask per cache (n_kv x n_tokens, f16 with flash attention, f32 without)
              + per cache the Hadamard rotation matrices (`llama_kv_cache::build_input_k_rot`,
              `build_input_v_rot`, f32 inputs): with a quantised K cache and one head dim per cache,
              a multiple of 64, nrot x nrot with nrot the largest power of two from 64 dividing the
              head dim; with a quantised V cache likewise, 64 x 64
    attn    = inputs + 4.5 E + 2 Q + a K row per token + [no FA] KQ (n_kv x n_tokens x n_head x 4)
              + [FA, f32 K or V] the cache cast to f16 (n_kv x n_stream x n_embd_k_gqa x 2 each)
    ffn     = inputs + 4.5 E + 3 x n_tokens x n_ff x 4 (the last layer runs its FFN on the outputs only)
    logits  = 5 E + n_outputs x n_vocab x 4 [+ inputs when the logits are the larger]: ggml-alloc
              allocates the inputs first, at the bottom of the buffer; freed after the last
              attention, their block takes the logits only if they fit in it (best fit)
  with E = n_tokens x n_embd x 4 and Q = n_tokens x n_head x head_dim x 4. Mamba: the larger of
  3.5 x n_tokens x 2 d_inner x 4 + 2.0 x n_seq x d_inner x d_state x 4 + 0.02 x n_tokens x
  d_inner x d_state x 4 and the logits phase 3 E + n_outputs x n_vocab x 4.
  Both are the CPU backend's single buffer; on a GPU each device holding layers is billed the
  whole figure (the buffer does not scale with the number of layers, ggml-org/llama.cpp#27953),
  which the ledger extrapolates.
"""

from __future__ import annotations

from dataclasses import dataclass

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ggml_graph import Graph, graph_peak
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.graphs import common as graph_common
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.graphs import gemma as gemma_graph
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.graphs import llama as llama_graph
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.graphs import mamba as mamba_graph
from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.kv_law import LlamaCppKv, ModelGeometry

DEFAULT_BATCH = 2048  # common/common.h n_batch
# The multipliers of the compute law's phases (see the module docstring), fitted on the corpus.
K_EMBD_ATTN = 4.5
K_Q = 2
K_KV_ROWS = 1
K_FFN = 3
K_EMBD_LOGITS = 5
MASK_PAD = 64
MAMBA_XZ, MAMBA_STATE, MAMBA_SCAN = 3.5, 2.0, 0.02
MAMBA_LOGITS_EMBD = 3
# The CPU buffer type's alignment (ggml-backend.cpp, TENSOR_ALIGNMENT).
CPU_ALIGNMENT = 32
# Which rule prices each architecture's compute buffer: "replay" (ggml-alloc's arithmetic over
# the graph the engine builds, budget/graphs/: to the byte on the corpus) or, for any other
# architecture, "law" (the calibrated phases above); tests/differential measures both.
COMPUTE_RULE = {"llama": "replay", "gemma2": "replay", "gemma3": "replay", "mamba": "replay"}
REPLAYS = {"llama": llama_graph.build, "gemma2": gemma_graph.build, "gemma3": gemma_graph.build, "mamba": mamba_graph.build}


@dataclass(frozen=True)
class LlamaCppBatch:
    n_batch: int
    n_ubatch: int
    n_outputs_max: int


def llamacpp_batch(ctx_size: int, parallel: int, batch: int | None, ubatch: int, n_draft: int = 0) -> LlamaCppBatch:
    """The batch sizes llama-server's context takes (printed as `llama_context: n_batch`, `n_ubatch`,
    `n_outputs_max`)."""
    n_batch = min(batch or DEFAULT_BATCH, ctx_size)
    n_ubatch = min(ubatch, n_batch)
    return LlamaCppBatch(n_batch, n_ubatch, min(n_batch, parallel * (1 + n_draft)))


def output_buffer_bytes(geometry: ModelGeometry, n_outputs_max: int) -> int:
    """`llama_context: CPU output buffer size`: one f32 logit row per output slot."""
    return geometry.n_vocab * n_outputs_max * 4


def _attention_layers(geometry: ModelGeometry) -> list[tuple[str, int, int, int]]:
    return [(layer.kind, layer.n_head_kv, layer.head_dim_k, layer.head_dim_v) for layer in geometry.layers if layer.kind in ("full", "swa")]


def compute_buffer_bytes(
    geometry: ModelGeometry,
    kv: LlamaCppKv,
    batch: LlamaCppBatch,
    n_seq_max: int,
    flash_attn: bool,
    type_k: str,
    type_v: str,
    unified: bool = False,
) -> int:
    """The compute buffer the engine reserves for one context (all its layers in one buffer)."""
    if COMPUTE_RULE.get(geometry.architecture) == "replay" and geometry.architecture in REPLAYS:
        return replay_compute_bytes(geometry, kv, batch, n_seq_max, flash_attn, type_k, type_v, unified)
    graphs = reserved_graphs(kv.n_ctx, batch, n_seq_max)
    if geometry.ssm_d_inner and not _attention_layers(geometry):
        return round(max(_mamba_bytes(geometry, tokens, outputs, n_seq_max) for tokens, outputs in graphs))
    return round(max(_graph_bytes(geometry, kv, tokens, outputs, flash_attn, type_k, type_v) for tokens, outputs in graphs))


def replay_graphs(
    geometry: ModelGeometry,
    kv: LlamaCppKv,
    batch: LlamaCppBatch,
    n_seq_max: int,
    flash_attn: bool,
    type_k: str,
    type_v: str,
    unified: bool,
) -> list[tuple[tuple[int, int, int], Graph]]:
    """Each graph `llama_context::sched_reserve` reserves, built as the engine builds it for the
    architecture (budget/graphs/), keyed by (n_tokens, n_seqs, n_outputs) as the engine prints them."""
    builder = REPLAYS[geometry.architecture]
    graphs = []
    for n_tokens, n_seqs, n_outputs in reserved_ubatches(kv.n_ctx, batch, n_seq_max):
        ub = graph_common.Ubatch(
            n_tokens=-(-n_tokens // n_seqs) * n_seqs,
            n_seqs=n_seqs,
            n_outputs=n_outputs,
            n_stream=1 if unified else n_seqs,
            kv_size=kv.cells_per_stream,
            n_kv=kv.cells_per_stream,
            kv_size_swa=kv.swa_cells_per_stream,
            n_kv_swa=kv.swa_cells_per_stream,
            flash_attn=flash_attn,
            type_k=type_k.lower(),
            type_v=type_v.lower(),
        )
        graphs.append(((n_tokens, n_seqs, n_outputs), builder(geometry, ub)))
    return graphs


def replay_compute_bytes(*args: object, **kwargs: object) -> int:
    """The compute buffer by replay: the largest peak over the reserved graphs, each placed by the
    ggml-alloc port (`ggml_gallocr_reserve_n` only ever grows the buffer)."""
    return max(graph_peak(graph, CPU_ALIGNMENT) for _key, graph in replay_graphs(*args, **kwargs))  # type: ignore[arg-type]


def reserved_ubatches(n_ctx: int, batch: LlamaCppBatch, n_seq_max: int) -> list[tuple[int, int, int]]:
    """(n_tokens, n_seqs, n_outputs) of the graphs `llama_context::sched_reserve` reserves: the
    prompt graph, min(n_ctx, n_ubatch) tokens over n_seq_max sequences with min(that,
    n_outputs_max) outputs, and the generation graph, n_seq_max tokens, sequences and outputs.
    `graph_reserve` rounds the token count up to a multiple of the sequences."""
    n_tokens = min(n_ctx, batch.n_ubatch)
    return [(n_tokens, n_seq_max, min(n_tokens, batch.n_outputs_max)), (n_seq_max, n_seq_max, n_seq_max)]


def reserved_graphs(n_ctx: int, batch: LlamaCppBatch, n_seq_max: int) -> list[tuple[int, int]]:
    """(n_tokens as built, n_outputs) of the reserved graphs, for the law: `graph_reserve` rounds a
    token count up to a multiple of the sequences (one ubatch of n_tokens / n_seqs per sequence)."""
    return [(-(-n_tokens // n_seqs) * n_seqs, n_outputs) for n_tokens, n_seqs, n_outputs in reserved_ubatches(n_ctx, batch, n_seq_max)]


def _rotation_bytes(layers: list[tuple[str, int, int, int]], kind: str, type_k: str, type_v: str) -> int:
    """The rotation inputs' bytes of one cache (f32 nrot x nrot each; graphs/common.py's rule)."""
    dims_k = {dim_k for k, _h, dim_k, _dv in layers if k == kind}
    dims_v = {dim_v for k, _h, _dk, dim_v in layers if k == kind}
    nrots = (graph_common.k_rotation(dims_k, type_k.lower()), graph_common.v_rotation(dims_v, type_v.lower()))
    return sum(nrot * nrot * 4 for nrot in nrots)


def _mamba_bytes(geometry: ModelGeometry, n_tokens: int, n_outputs: int, n_seq: int) -> float:
    d_inner, d_state = geometry.ssm_d_inner, geometry.ssm_d_state
    scan = MAMBA_XZ * n_tokens * 2 * d_inner * 4 + MAMBA_STATE * n_seq * d_inner * d_state * 4 + MAMBA_SCAN * n_tokens * d_inner * d_state * 4
    logits = MAMBA_LOGITS_EMBD * n_tokens * geometry.n_embd * 4 + n_outputs * geometry.n_vocab * 4
    return max(scan, logits)


def _graph_bytes(geometry: ModelGeometry, kv: LlamaCppKv, n_tokens: int, n_outputs: int, flash_attn: bool, type_k: str, type_v: str) -> float:
    layers = _attention_layers(geometry)
    if not layers:
        return 0.0
    # Every stream's cells are in the graph (init_full): n_kv per stream, tokens split over the streams.
    n_kv = {"full": kv.cells_per_stream, "swa": kv.swa_cells_per_stream}
    kinds = {layer[0] for layer in layers}
    widest = max(n_kv[kind] for kind in kinds)
    n_head = geometry.n_head or max(heads for _k, heads, _dk, _dv in layers)
    head_dim = max(dim_k for _k, _h, dim_k, _dv in layers)
    kv_rows = max(heads * dim_k for _k, heads, dim_k, _dv in layers)
    embd = n_tokens * geometry.n_embd * 4
    # One KQ mask per cache (iSWA builds the full and the sliding one even at equal sizes).
    mask = sum(n_kv[kind] * n_tokens * (2 if flash_attn else 4) for kind in kinds)
    rotations = sum(_rotation_bytes(layers, kind, type_k, type_v) for kind in kinds)
    mask += rotations
    attn = mask + K_EMBD_ATTN * embd + K_Q * n_tokens * n_head * head_dim * 4 + K_KV_ROWS * n_tokens * kv_rows * 4
    if flash_attn:
        # The CPU flash-attention kernel reads f16: an f32 cache is cast first, every stream at once.
        widest_row = max(heads * dim_k for _k, heads, dim_k, _dv in layers)
        attn += sum(widest * kv.n_streams * widest_row * 2 for cache_type in (type_k, type_v) if cache_type.lower() == "f32")
    else:
        attn += widest * n_tokens * n_head * 4
    # The last layer keeps only the output rows before its FFN: one layer runs its FFN on them alone.
    ffn_tokens = n_tokens if len(geometry.layers) > 1 else n_outputs
    ffn = mask + K_EMBD_ATTN * embd + K_FFN * ffn_tokens * geometry.n_ff * 4
    # The inputs sit at the bottom of the buffer: freed after the last attention, their block takes
    # the logits only when they fit in it; a larger logits tensor is placed above them.
    logits_rows = n_outputs * geometry.n_vocab * 4
    logits = K_EMBD_LOGITS * embd + logits_rows + (mask if logits_rows > mask else 0)
    return max(attn, ffn, logits)
