"""The probe's shape plan (planner/probe/shapes.py, no PyTorch needed): the GEMMs of a model are the
step model's, worked out by hand for Llama-3.1-8B; the expert-parallel degree keeps a rank's bf16
experts under 4 GiB, worked out for DeepSeek-V3; the coarse-to-fine order keeps every prefix spread
over the whole range; every class is planned even when no model has it."""

from planner.model.catalog import load_model_catalog
from planner.probe.shapes import CLASSES, REFERENCE_MODELS, coarse_to_fine, plan_shapes

CATALOG = load_model_catalog()
REFERENCES = {k: CATALOG[v] for k, v in REFERENCE_MODELS.items()}


def test_coarse_to_fine_puts_the_ends_first_then_halves_the_spacing():
    assert coarse_to_fine(range(10)) == [0, 9, 8, 4, 2, 6, 1, 3, 5, 7]
    assert coarse_to_fine([{"m": 1}, {"m": 1}, {"m": 2}]) == [{"m": 1}, {"m": 2}]  # repeated shapes measured once


def test_llama_8b_gemms_are_its_projections_per_tensor_parallel_rank():
    plan = plan_shapes([CATALOG["llama-3.1-8b"]], REFERENCES, smoke=False)
    pairs = {(s["n"], s["k"]) for s in plan.shapes["gemm"]}
    # hidden 4096, 32 query and 8 KV heads of 128, MLP 14336, vocabulary 128256; TP1: fused qkv (32 + 2 x 8) x 128 = 6144
    assert {(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)} <= pairs
    # TP8: qkv (4 + 2 x 1) x 128 = 768, attention output k = 512, gate-up 2 x 1792 = 3584, down k = 1792, head 16032
    assert {(768, 4096), (4096, 512), (3584, 4096), (4096, 1792), (16032, 4096)} <= pairs
    assert sorted({s["m"] for s in plan.shapes["gemm"]}) == [2**i for i in range(14)]


def test_deepseek_experts_are_split_until_a_rank_holds_under_4_gib():
    plan = plan_shapes([CATALOG["deepseek-v3"]], REFERENCES, smoke=False)
    floor, shapes = plan.shapes["moe"][:3], plan.shapes["moe"][3:]
    # whole experts: 256 x 3 x 7168 x 2048 x 2 B = 22.5 GB; EP4: 5.64 GB > 4.29 GB (4 GiB); EP8: 2.82 GB.
    # split 8 ways inside (TP 8): 22.5 / 8 = 2.82 GB on one rank, no EP needed
    assert {(s["moe_tp_size"], s["moe_ep_size"]) for s in shapes} == {(1, 8), (8, 1)}
    # 1/8 to 1024 tokens per expert, T = per expert x 256 / 8: 4 tokens up to 32768, and the decode steps of
    # batches 1 and 2 (1/32 and 1/16 per expert), at both splits
    for tp in (1, 8):
        tokens = sorted(s["num_tokens"] for s in shapes if s["moe_tp_size"] == tp)
        assert tokens == [1, 2] + [4 * 2**i for i in range(14)]
    # the floor first: 128-wide layers, one of the 256 experts per rank (3 x 128 x 128 x 2 B = 96 KiB), 1, 2 and 4 tokens
    assert [(s["num_tokens"], s["hidden_size"], s["inter_size"], s["moe_ep_size"]) for s in floor] == [(1, 128, 128, 256), (2, 128, 128, 256),
                                                                                                      (4, 128, 128, 256)]


def test_every_class_is_planned_even_for_a_dense_gqa_model():
    plan = plan_shapes([CATALOG["llama-3.1-8b"]], REFERENCES, smoke=True)
    assert set(plan.shapes) == set(CLASSES) and all(plan.shapes[c] for c in CLASSES)
    assert {s["num_heads"] for s in plan.shapes["mla_decode"]} == {8}  # DeepSeek-V3's 128 heads, /16 in smoke mode
