"""Boot-ledger parsing of engine logs (lines in the engines' own formats)."""

from ansible_collections.frank.llm_fleet.plugins.module_utils.runtimes.registry import parse_boot_log
from ansible_collections.frank.llm_fleet.plugins.module_utils.sizes import GIB, MIB

VLLM_GPU = """\
INFO 11-02 10:11:12 [default_loader.py:267] Loading weights took 41.52 seconds
INFO 11-02 10:11:13 [gpu_model_runner.py:2392] Model loading took 6.2800 GiB and 42.91 seconds
INFO 11-02 10:12:40 [gpu_worker.py:298] Available KV cache memory: 6.80 GiB
INFO 11-02 10:12:40 [kv_cache_utils.py:1087] GPU KV cache size: 1,350,182 tokens
INFO 11-02 10:12:40 [kv_cache_utils.py:1091] Maximum concurrency for 262,144 tokens per request: 5.15x
INFO 11-02 10:12:52 [gpu_model_runner.py:3118] Graph capturing finished in 5 secs, took 0.31 GiB
"""

VLLM_CPU = """\
INFO 11-29 09:40:01 [kv_cache_utils.py:1087] CPU KV cache size: 32,995,712 tokens
INFO 11-29 09:40:01 [kv_cache_utils.py:1091] Maximum concurrency for 2,048 tokens per request: 16111.19x
"""

# The GPU row follows llama.cpp's breakdown layout (total = free + (self = model + context + compute)
# + unaccounted); used, free and compute are the 3090 boot of the domain brief.
LLAMA = """\
0.00.022.497 I load_tensors:   CPU_Mapped model buffer size =     1.63 MiB
0.00.023.478 I llama_kv_cache:        CPU KV buffer size =     3.25 MiB
0.00.025.217 I llama_kv_cache: size =    3.25 MiB (  4096 cells,   2 layers,  4/4 seqs), K (q8_0):    2.12 MiB, V (q4_0):    1.12 MiB
0.00.026.242 I sched_reserve:        CPU compute buffer size =     6.27 MiB
0.03.020.134 I common_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
0.03.020.150 I common_memory_breakdown_print: |   - CUDA0 (RTX 3090)   | 24135 = 2689 + (21436 = 18000 +    2300 +    1136) +          10 |
0.03.020.197 I common_memory_breakdown_print: |   - Host               |                    7 =     1 +       2 +       4                |
"""


def test_vllm_gpu_boot_facts():
    ledger = parse_boot_log(VLLM_GPU)
    assert ledger.engine == "vllm"
    assert (ledger.kv_device, ledger.kv_tokens) == ("GPU", 1_350_182)
    assert (ledger.concurrency_len, ledger.concurrency) == (262_144, 5.15)
    assert ledger.kv_available_bytes == round(6.80 * GIB)
    assert ledger.model_bytes == round(6.28 * GIB)
    assert ledger.graph_bytes == round(0.31 * GIB)


def test_vllm_cpu_build_lines():
    ledger = parse_boot_log(VLLM_CPU)
    assert (ledger.kv_device, ledger.kv_tokens, ledger.concurrency) == ("CPU", 32_995_712, 16111.19)


def test_llamacpp_kv_buffers_and_breakdown():
    ledger = parse_boot_log(LLAMA)
    assert ledger.engine == "llamacpp"
    [kv] = ledger.kv_caches
    assert (kv.cells, kv.layers, kv.seqs_used, kv.seqs_max, kv.type_k, kv.type_v) == (4096, 2, 4, 4, "q8_0", "q4_0")
    assert kv.size_bytes == round(3.25 * MIB)
    assert ledger.buffers["model"]["CPU_Mapped"] == round(1.63 * MIB)
    assert ledger.buffers["compute"]["CPU"] == round(6.27 * MIB)
    gpu = ledger.breakdown["CUDA0 (RTX 3090)"]
    assert gpu == {"total": 24135, "free": 2689, "self": 21436, "model": 18000, "context": 2300, "compute": 1136, "unaccounted": 10}
    assert ledger.breakdown["Host"] == {"self": 7, "model": 1, "context": 2, "compute": 4}


def test_unrelated_text_yields_no_facts():
    ledger = parse_boot_log("hello\n| a | b |\nGPU KV cache size: lots")
    assert ledger.engine == "" and ledger.kv_tokens is None and not ledger.breakdown


def test_vllm_0_32_prints_tokens_and_concurrency_on_one_line():
    # Copied from the lab's vLLM 0.32.0 (CPU build) journal.
    line = (
        "(EngineCore pid=13) INFO 11-29 11:43:28 [kv_cache_utils.py:2327] CPU KV cache size: 8,192 tokens, "
        "Maximum concurrency for 4,096 tokens per request: 2.00x"
    )
    ledger = parse_boot_log(line)
    assert (ledger.engine, ledger.kv_device, ledger.kv_tokens, ledger.concurrency_len, ledger.concurrency) == ("vllm", "CPU", 8192, 4096, 2.0)


def test_expert_plan_lines_give_the_arena_and_its_slots():
    # seeds/004, the c769ff2 boot: "expert cache space 14.87 GiB / 6,496 slots of 2.344 MiB"
    ledger = parse_boot_log("GPU KV cache size: 398,658 tokens,\nexpert cache space 14.87 GiB / 6,496 slots of 2.344 MiB\n")
    assert ledger.arena_bytes == round(14.87 * GIB)
    assert ledger.arena_slots == 6_496
    assert ledger.arena_slot_bytes == round(2.344 * MIB)
    assert ledger.as_dict()["arena_slots"] == 6_496


def test_precise_memory_plan_line_gives_overhead_arena_and_swap_region():
    # seeds/004: "5.25 GiB, expert cache space 17.22 GiB / 7522 slots, swap region 13.7 GiB /" / "5986 slots"
    line = "runtime overhead 5.25 GiB, expert cache space 17.22 GiB / 7522 slots, swap region 13.7 GiB / 5986 slots, GPU KV cache 398,658 tokens"
    ledger = parse_boot_log(line)
    assert ledger.runtime_overhead_bytes == round(5.25 * GIB)
    assert (ledger.arena_bytes, ledger.arena_slots, ledger.arena_slot_bytes) == (round(17.22 * GIB), 7_522, None)
    assert (ledger.swap_region_bytes, ledger.swap_region_slots) == (round(13.7 * GIB), 5_986)
    assert ledger.expert_bytes == []  # the plan line is not mistaken for a bare expert buffer line


def test_the_vllm_cpu_workers_kv_space_line_gives_the_available_kv_memory():
    # Copied from a differential boot of the lab's vLLM 0.32.0 (tests/differential/corpus/vllm/00001ef0.json).
    line = "(Worker pid=35) INFO 12-02 16:14:33 [cpu_worker.py:260] Explicitly set (0.01/23.54) GiB for KV cache on node 0."
    ledger = parse_boot_log(line)
    assert ledger.kv_available_bytes == round(0.01 * GIB)
