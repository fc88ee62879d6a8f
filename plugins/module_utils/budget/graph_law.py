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
  reserves, a prompt batch of n_ubatch tokens and a generation batch of n_seq_max tokens. ggml-alloc
  places tensors by liveness, so there is no closed form; the law takes the largest of the
  graph's phases, each the sum of the tensors alive together, with multipliers calibrated on the
  differential corpus (tests/differential/corpus/llamacpp, boots of the real engine):
    inputs  = KQ mask per cache (n_kv x n_tokens, f16 with flash attention, f32 without)
    attn    = inputs + 4 E + 2 Q + a K row per token + [no FA] KQ (n_kv x n_tokens x n_head x 4)
              + [FA, f32 K or V] the cache cast to f16 (n_kv x n_stream x n_embd_k_gqa x 2 each)
    ffn     = inputs + 4 E + 3 x n_tokens x n_ff x 4 (the last layer runs its FFN on the outputs only)
    logits  = inputs + 3 E + n_outputs x n_vocab x 4
  with E = n_tokens x n_embd x 4 and Q = n_tokens x n_head x head_dim x 4. Mamba (a recurrent
  model): 3.35 x n_tokens x 2 d_inner x 4 + 1.77 x n_seq x d_inner x d_state x 4
  + 0.043 x n_tokens x d_inner x d_state x 4, fitted on the corpus's Mamba boots.
  The multipliers are measured on tiny models on the CPU backend (one buffer holds the whole
  graph); on a GPU each device holding layers gets the same size (the buffer does not scale with
  the number of layers, ggml-org/llama.cpp#27953), which the ledger extrapolates.
"""

from __future__ import annotations

from dataclasses import dataclass

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.kv_law import LlamaCppKv, ModelGeometry

DEFAULT_BATCH = 2048  # common/common.h n_batch
# The multipliers of the compute law's phases (see the module docstring), fitted on the corpus.
K_EMBD_ATTN = 4
K_Q = 2
K_KV_ROWS = 1
K_FFN = 3
K_EMBD_LOGITS = 3
MASK_PAD = 64
MAMBA_XZ, MAMBA_STATE, MAMBA_SCAN = 3.35, 1.77, 0.043


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
) -> int:
    """The compute buffer the engine reserves for one context (all its layers in one buffer)."""
    if geometry.ssm_d_inner and not _attention_layers(geometry):
        return round(_mamba_bytes(geometry, batch.n_ubatch, n_seq_max))
    return round(max(_graph_bytes(geometry, kv, batch, tokens, flash_attn, type_k, type_v) for tokens in (batch.n_ubatch, n_seq_max)))


def _mamba_bytes(geometry: ModelGeometry, n_tokens: int, n_seq: int) -> float:
    d_inner, d_state = geometry.ssm_d_inner, geometry.ssm_d_state
    return MAMBA_XZ * n_tokens * 2 * d_inner * 4 + MAMBA_STATE * n_seq * d_inner * d_state * 4 + MAMBA_SCAN * n_tokens * d_inner * d_state * 4


def _graph_bytes(geometry: ModelGeometry, kv: LlamaCppKv, batch: LlamaCppBatch, n_tokens: int, flash_attn: bool, type_k: str, type_v: str) -> float:
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
    attn = mask + K_EMBD_ATTN * embd + K_Q * n_tokens * n_head * head_dim * 4 + K_KV_ROWS * n_tokens * kv_rows * 4
    if flash_attn:
        # The CPU flash-attention kernel reads f16: an f32 cache is cast first, every stream at once.
        widest_row = max(heads * dim_k for _k, heads, dim_k, _dv in layers)
        attn += sum(widest * kv.n_streams * widest_row * 2 for cache_type in (type_k, type_v) if cache_type.lower() == "f32")
    else:
        attn += widest * n_tokens * n_head * 4
    n_outputs = min(n_tokens, batch.n_outputs_max)
    # The last layer keeps only the output rows before its FFN: one layer runs its FFN on them alone.
    ffn_tokens = n_tokens if len(geometry.layers) > 1 else n_outputs
    ffn = mask + K_EMBD_ATTN * embd + K_FFN * ffn_tokens * geometry.n_ff * 4
    logits = K_EMBD_LOGITS * embd + n_outputs * geometry.n_vocab * 4  # the masks are freed after the last attention
    return max(attn, ffn, logits)
