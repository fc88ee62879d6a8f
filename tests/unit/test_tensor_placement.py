"""--override-tensor priced per tensor: the bytes each pattern moves come from the GGUF's real tensor
infos, in the order llama.cpp applies the patterns (first match wins), on top of the layer law.

Every expected byte count below is the size of an array this test wrote (numpy's nbytes), or the
ggml block law applied to dims the seeds quote, never a figure the code under test produced.
"""

import re

import gguf
import pytest
from gguf_files import write_gguf, write_gguf_header

from ansible_collections.frank.llm_fleet.plugins.module_utils.budget.ledger import render_table
from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import price_shape
from ansible_collections.frank.llm_fleet.plugins.module_utils.shape.model import ShapeError

N_EMBD = 64
N_EXPERT = 8
TWO_CARDS = [{"name": "r9700-0", "memory": "2 GiB"}, {"name": "r9700-1", "memory": "2 GiB"}]
F16 = 2


def expert_bytes() -> int:
    """One block's routed experts as write_gguf writes them: three f16 [N_EXPERT, 2 x n_embd, n_embd]."""
    return 3 * N_EXPERT * 2 * N_EMBD * N_EMBD * F16


def block_bytes(il: int) -> int:
    """Everything else of block il: q, k, v (1 KV head of 32), ffn_down, the f32 router."""
    head_dim = N_EMBD // 2
    return (N_EMBD * N_EMBD + 2 * head_dim * N_EMBD + N_EMBD * 2 * N_EMBD * (il + 1)) * F16 + N_EXPERT * N_EMBD * 4


OUTPUT_BYTES = 32 * N_EMBD * F16
INPUT_BYTES = 32 * N_EMBD * F16


@pytest.fixture
def moe(tmp_path):
    write_gguf(tmp_path / "moe.gguf", n_layer=4, n_embd=N_EMBD, n_head=2, n_head_kv=1, n_expert=N_EXPERT)
    return tmp_path


def price(payload, **shape):
    return price_shape({"runtime": "llamacpp", "model_file": "moe.gguf", "ctx_size": 4096, "tensor_split": [1, 1], **shape}, TWO_CARDS, str(payload))


def term(device, name):
    return sum(t.bytes for t in device.terms if t.name == name)


def host(result, name):
    return sum(t.bytes for t in result.host_terms if t.name == name)


def test_routed_experts_on_host_leave_the_cards_and_keep_the_layer_split(moe):
    # Seed 000: "- Placement law: layer split -ts 1,1 with -ngl 999; the routed experts" ... "are
    # COMPUTED in host RAM via" "-ot exps=CPU" - experts in host RAM are not on the card.
    # -ts 1,1 over 4 blocks + output: blocks 0-2 on card 0, block 3 and the output on card 1.
    whole = price(moe)
    assert [term(d, "weights") for d in whole.devices] == [
        sum(block_bytes(il) + expert_bytes() for il in (0, 1, 2)),
        block_bytes(3) + expert_bytes() + OUTPUT_BYTES,
    ]
    placed = price(moe, override_tensor={"exps": "CPU"})
    assert [term(d, "weights") for d in placed.devices] == [sum(block_bytes(il) for il in (0, 1, 2)), block_bytes(3) + OUTPUT_BYTES]
    assert host(placed, "override_tensor_weights") == 4 * expert_bytes()
    assert host(placed, "input_embeddings") == INPUT_BYTES
    assert placed.fits
    assert f"override_tensor exps=CPU: 12 tensor(s), {4 * expert_bytes() / 2**20:,.1f} MiB in host RAM" in placed.notes
    # The logits (output) buffer is host RAM too: n_vocab x 1 slot x 4 B.
    output = host(placed, "output_buffer") / 2**20
    assert (
        f"host RAM: input_embeddings {INPUT_BYTES / 2**20:,.1f}, override_tensor_weights {4 * expert_bytes() / 2**20:,.1f}, output_buffer {output:,.1f} (MiB)"
        in render_table(placed)
    )
    # The KV stays with its layer: an override moves weights only.
    assert [term(d, "kv") for d in placed.devices] == [term(d, "kv") for d in whole.devices]


def test_specific_patterns_win_over_the_broad_sweep_whatever_order_the_inventory_writes(moe):
    # Seed 000: "--override-tensor flag (b11030 deprecates repeated flags, and the" / "loader is
    # first-match-wins, so the specific patterns must precede" / "the broad exps=CPU sweep", and the
    # deployed layout "Blocks 0-4 on ROCm0 + 45-47 on ROCm1": chosen blocks' experts stay on their
    # own card, the rest go to host RAM. Here block 0 stays on card 0, block 3 on card 1.
    shape = {"override_tensor": {"exps": "CPU", r"blk\.0\.ffn_.*_exps": "ROCm0", r"blk\.3\.ffn_.*_exps": "ROCm1"}}
    placed = price(moe, **shape)
    assert [term(d, "weights") for d in placed.devices] == [
        sum(block_bytes(il) for il in (0, 1, 2)) + expert_bytes(),
        block_bytes(3) + expert_bytes() + OUTPUT_BYTES,
    ]
    assert host(placed, "override_tensor_weights") == 2 * expert_bytes()
    assert not [v for v in placed.failures if v.rule == "override_tensor"]


def test_a_tensor_sent_to_the_other_card_leaves_its_home_and_lands_there(moe):
    # Block 1's up-projection experts to ROCm1: off card 0's layer weights, onto card 1 as their own term.
    placed = price(moe, override_tensor={r"blk\.1\.ffn_up_exps": "ROCm1"})
    one_matrix = N_EXPERT * 2 * N_EMBD * N_EMBD * F16
    assert term(placed.devices[0], "weights") == sum(block_bytes(il) + expert_bytes() for il in (0, 1, 2)) - one_matrix
    assert term(placed.devices[1], "override_tensor_weights") == one_matrix
    assert placed.devices[0].used + placed.devices[1].used == price(moe).devices[0].used + price(moe).devices[1].used


def test_an_override_brings_a_host_layer_tensor_onto_the_card(moe):
    # --n-gpu-layers 2 of 4 blocks + output: blocks 0-2 stay in host RAM (the layer law); an override
    # to ROCm0 still puts block 0's experts on card 0, and host RAM holds them no more.
    layered = price(moe, n_gpu_layers=2)
    assert host(layered, "host_layers") == sum(block_bytes(il) + expert_bytes() for il in (0, 1, 2))
    placed = price(moe, n_gpu_layers=2, override_tensor={r"blk\.0\.ffn_.*_exps": "ROCm0"})
    assert host(placed, "host_layers") == sum(block_bytes(il) + expert_bytes() for il in (0, 1, 2)) - expert_bytes()
    assert term(placed.devices[0], "override_tensor_weights") == expert_bytes()


def test_a_pattern_every_match_of_which_an_earlier_one_took_places_nothing(moe):
    # llama.cpp applies the longer pattern first; `exps` then finds only tensors already placed.
    placed = price(moe, override_tensor={"exps": "ROCm0", "ffn_.*_exps": "CPU"})
    bad = [v.message for v in placed.failures if v.rule == "override_tensor"]
    assert bad == [
        "override_tensor: exps=ROCm0 places nothing: each of the 12 tensors it matches is taken by an earlier pattern "
        "(the first match wins); fix the pattern or drop it"
    ]


@pytest.mark.parametrize(
    ("buffer", "error"),
    [
        ("GPU", "override_tensor.exps: buffer 'GPU' is no buffer type llama.cpp lists; use CPU or a device buffer such as ROCm0 or CUDA0"),
        ("ROCm2", "override_tensor.exps: buffer ROCm2 names device 2, but the shape lists 2 device(s)"),
    ],
)
def test_a_buffer_llama_cpp_cannot_name_is_refused_with_the_field(moe, buffer, error):
    with pytest.raises(ShapeError, match=f"^{re.escape(error)}$"):
        price(moe, override_tensor={"exps": buffer})


def test_without_a_readable_header_the_cards_keep_the_overridden_tensors_and_say_so():
    shape = {
        "runtime": "llamacpp",
        "model_geometry": {"n_layer": 2, "n_head_kv": 1, "head_dim": 32, "layer_bytes": "100 MiB"},
        "ctx_size": 4096,
        "override_tensor": {"exps": "CPU"},
    }
    result = price_shape(shape, [{"name": "gpu", "memory": "8 GiB"}])
    assert any(t.name == "weights" and t.bytes == 200 * 2**20 for t in result.devices[0].terms)
    assert any("no GGUF header is readable here to size them" in note and "upper bound" in note for note in result.notes)


def test_an_explicit_geometry_keeps_its_sizes_and_the_patterns_are_still_checked(moe):
    # model_geometry's layer_bytes price the weights; the header's tensor bytes are not mixed into them.
    geometry = {"n_layer": 4, "n_head_kv": 1, "head_dim": 32, "layer_bytes": "100 MiB"}
    placed = price(moe, model_geometry=geometry, override_tensor={"exps": "CPU", "ngram_embeddings": "CPU"})
    assert [term(d, "weights") for d in placed.devices] == [300 * 2**20, 100 * 2**20]
    assert not any(t.name == "override_tensor_weights" for t in placed.host_terms)
    assert any(note.startswith("override_tensor: model_geometry sizes the weights") for note in placed.notes)
    assert [v.message.split(" matches ")[0] for v in placed.failures if v.rule == "override_tensor"] == ["override_tensor: ngram_embeddings=CPU"]


def test_the_ple_table_override_moves_the_seeds_54_4_gb_off_the_output_card(tmp_path):
    # Seed 000: "- The 51B-param PLE n-gram table is ONE tensor: per_layer_token_embd." / "weight, dims
    # [160, 320001536], Q8_0, 54.4 GiB — exactly the whole of" part 3; the deployed set is
    # "exps=CPU,per_layer_token_embd.weight=CPU". Q8_0 is 34 B per 32 elements, so the table is
    # 160 x 320,001,536 x 34 / 32 = 54,400,261,120 B: 54.4 decimal GB (the seed's "GiB" is GB; it is
    # 50.66 GiB). Without the override it is an output-class tensor, on the last card.
    q8 = gguf.GGMLQuantizationType.Q8_0
    write_gguf_header(
        tmp_path / "moe.gguf",
        "llama",
        2,
        [
            ("token_embd.weight", (64, 512), q8),
            ("blk.0.attn_q.weight", (64, 64), q8),
            ("blk.1.attn_q.weight", (64, 64), q8),
            ("blk.1.ffn_up_exps.weight", (64, 128, 512), q8),
            ("per_layer_token_embd.weight", (160, 320001536), q8),
            ("output.weight", (64, 512), q8),
        ],
    )
    cards = [{"name": "r9700-0", "memory": "31.86 GiB"}, {"name": "r9700-1", "memory": "31.86 GiB"}]
    shape = {"runtime": "llamacpp", "model_file": "moe.gguf", "ctx_size": 4096, "tensor_split": [1, 1]}
    ple = 160 * 320001536 * 34 // 32
    assert round(ple / 1e9, 1) == 54.4
    resident = price_shape(shape, cards, str(tmp_path))
    assert term(resident.devices[1], "weights") > ple
    assert not resident.fits  # the table alone is larger than the card
    deployed = price_shape({**shape, "override_tensor": {"exps": "CPU", "per_layer_token_embd.weight": "CPU"}}, cards, str(tmp_path))
    experts = 64 * 128 * 512 * 34 // 32
    assert host(deployed, "override_tensor_weights") == ple + experts
    # -ts 1,1 over 2 blocks + output: both blocks on card 0, the output class on card 1.
    assert term(resident.devices[0], "weights") - term(deployed.devices[0], "weights") == experts
    assert term(resident.devices[1], "weights") - term(deployed.devices[1], "weights") == ple
    assert deployed.fits


@pytest.mark.parametrize(("draft_device", "refused"), [("ROCm0", True), ("ROCm1", False), ("CPU", True)])
def test_a_drafter_that_borrows_the_output_head_runs_on_the_output_layers_device(draft_device, refused):
    # Seed 001: "The shared MTP head borrows the main model output head, which a -ts 1,1" / "layer
    # split places on ROCm1. With tensor overrides set, n_copies==1 in the" / "draft's scheduler, and a
    # borrowed output.weight in a ROCm1 buffer aborts the" / "draft graph (ggml-backend.cpp:941) when
    # the draft context is on ROCm0" - "the unit crash-looped 4x at ~12 s per attempt"; ROCm1 served.
    shape = {
        "runtime": "llamacpp",
        "model_geometry": {"n_layer": 4, "n_head_kv": 1, "head_dim": 32, "layer_bytes": "100 MiB"},
        "ctx_size": 4096,
        "tensor_split": [1, 1],
        "override_tensor": {"exps": "CPU", "per_layer_token_embd.weight": "CPU"},
        "spec_type": "draft-mtp,ngram-mod",
        "draft_max": 2,
        "drafter_borrows_output": True,
        "draft_device": draft_device,
    }
    result = price_shape(shape, TWO_CARDS)
    bad = [v.message for v in result.failures if v.rule == "draft_device"]
    assert bad == (
        [
            f"draft_device {draft_device}: the drafter borrows the target's output head, which the layer split puts on r9700-1 (device 1); "
            "with override_tensor the draft graph aborts on any other device: run the drafter there"
        ]
        if refused
        else []
    )
    # The seeds saw the abort with tensor overrides set; without them the gate does not refuse.
    assert not [v for v in price_shape({**shape, "override_tensor": None}, TWO_CARDS).failures if v.rule == "draft_device"]
