"""Speculative decoding with the model's own MTP module: the accepted-length arithmetic, a step worked
out by hand under the roofline, the HBM the module adds, the published figures behind the defaults,
the problem and CLI errors, and the solver's choice of draft tokens."""

from dataclasses import replace

import numpy as np
import pytest

from planner.cli.main import main
from planner.errors import PlannerInputError
from planner.model.architecture import mtp_module_params, param_counts
from planner.model.catalog import ModelSpec, arch_from_spec
from planner.modes import Engine, ServingRole, StepModel
from planner.physics.batch_table import step_context
from planner.physics.deployment import Layout, Precisions
from planner.physics.estimate import estimate
from planner.physics.inputs import DeploymentInputs
from planner.physics.links import default_replica_links
from planner.physics.roofline import verified_attention_factor
from planner.physics.speculation import Speculation, accepted_length
from planner.physics.step_calibrated import decode_attention
from planner.precision import FlopsFormat, Precision
from planner.problem.resolve import resolve_problem
from planner.problem.schema import parse_problem
from planner.solver.solve import solve

# A toy dense model small enough to count by hand: 2 layers, d = 1024, 8 heads of 128 (8 KV heads),
# SwiGLU width 4096, vocabulary 32,000, untied head, one MTP module.
TOY = {"id": "toy", "name": "Toy", "n_layers": 2, "hidden_size": 1024, "vocab_size": 32000,
       "attention": {"kind": "gqa", "n_heads": 8, "n_kv_heads": 8, "head_dim": 128}, "dense_intermediate_size": 4096,
       "max_context_tokens": 8192, "mtp": {"layers": 1, "acceptance_rates": [0.8, 0.5], "acceptance_source": "test"}}
LAYER = 4 * 1024 * 1024 + 2 * 1024 + 3 * 1024 * 4096  # q, k, v, o + two norms + gate, up, down = 16,779,264
HEAD = 32000 * 1024  # 32,768,000
MTP = LAYER + 2 * 1024 * 1024 + 3 * 1024  # its block, the 2d x d projection, three norms = 18,879,488
KV_PER_TOKEN_LAYER = 2 * 8 * 128 * 2  # a key and a value per KV head, bf16: 4,096 bytes


def test_accepted_length_by_hand():
    assert accepted_length((0.9, 0.7, 0.4), 0) == 1.0
    assert accepted_length((0.9, 0.7, 0.4), 1) == pytest.approx(1.9)
    assert accepted_length((0.9, 0.7, 0.4), 3) == pytest.approx(1 + 0.9 + 0.63 + 0.252)  # 2.782
    with pytest.raises(ValueError):
        accepted_length((0.9,), 2)
    assert Speculation(2, accepted_tokens=2.18).tokens_per_step == 2.18  # a measured length is taken as given
    with pytest.raises(ValueError):
        Speculation(2, accepted_tokens=3.5)  # at most 1 + k


def test_deepseek_r1_default_reproduces_tensorrt_llm_acceptance_lengths(models):
    # TensorRT-LLM tech blog 1, 'Autoregressive MTP Layers': 1.92, 2.58, 2.82, 2.99, 3.01 tokens per step with MTP 1-5
    rates = models["deepseek-r1"].mtp_acceptance.rates
    for k, published in enumerate((1.92, 2.58, 2.82, 2.99, 3.01), start=1):
        assert accepted_length(rates, k) == pytest.approx(published, abs=0.005)
    # DeepSeek-V3 technical report: the second token is accepted 85-90% of the time
    assert 0.85 <= models["deepseek-v3"].mtp_acceptance.rates[0] <= 0.90


def test_mtp_module_size_matches_the_published_checkpoint(models):
    # DeepSeek-V3 README: 685B on Hugging Face = 671B main model + 14B MTP module (which carries its own embedding and head
    # copy); each figure rounded to 1B, so the module is 685 - 671 = 14 +- 1 billion
    arch = models["deepseek-v3"]
    checkpoint_module = mtp_module_params(arch) + 2 * arch.vocab_size * arch.hidden_size
    assert 13.0e9 < checkpoint_module < 15.0e9
    assert round(param_counts(arch).total / 1e9) == 671
    assert mtp_module_params(arch_from_spec(ModelSpec.model_validate(TOY))) == MTP


def _toy_inputs(hw, k: int, batch: int = 1) -> DeploymentInputs:
    arch = arch_from_spec(ModelSpec.model_validate(TOY))
    precisions = Precisions(Precision.BF16, Precision.BF16, Precision.BF16, FlopsFormat.BF16)
    spec = Speculation(k, arch.mtp_acceptance.rates, source="test") if k else None
    return DeploymentInputs(arch, hw.racks["hgx-h100"], Layout(), batch, 1000, 200, precisions, hw.overheads,
                            role=ServingRole.DECODE, step_model=StepModel.ROOFLINE, speculative=spec)


def test_a_speculative_step_worked_out_by_hand(hw):
    """Roofline, one H100, batch 1, 1,000 + 200 tokens (mean context 1,100), decode replica: every pass is
    memory-bound, so the step is the bytes it streams over the achievable bandwidth."""
    accel = hw.racks["hgx-h100"].accelerator
    bw = accel.hbm_bandwidth_bytes_per_s * accel.hbm_bandwidth_fraction
    context = 1000 + 200 / 2
    main_bytes = (2 * LAYER + HEAD) * 2 + 2 * KV_PER_TOKEN_LAYER * context  # weights once, the two layers' KV once
    draft_pass = (MTP + HEAD) * 2 + KV_PER_TOKEN_LAYER * context  # the module, the shared head, its one layer of KV
    plain = estimate(_toy_inputs(hw, 0))
    assert plain.tpot_s == pytest.approx(main_bytes / bw, rel=1e-9)
    e = estimate(_toy_inputs(hw, 2))
    # k = 2: verify 3 tokens per sequence (same bytes), then 2 MTP passes (3 positions, then 1 token)
    step = (main_bytes + 2 * draft_pass) / bw
    length = 1 + 0.8 + 0.8 * 0.5  # 2.2 tokens per step
    assert e.tpot_s == pytest.approx(step / length, rel=1e-9)
    assert e.decode_tokens_per_s == pytest.approx(1 * length / step, rel=1e-9)
    assert e.stage_time_s == pytest.approx(step, rel=1e-9)


def test_the_mtp_module_in_hbm(hw):
    plain, spec = estimate(_toy_inputs(hw, 0, batch=4)), estimate(_toy_inputs(hw, 1, batch=4))
    assert spec.memory.weights_bytes - plain.memory.weights_bytes == pytest.approx(MTP * 2)  # bf16
    # a decode replica under the roofline pages KV at min(prompt + output, (prompt + output / 2) x 1.1) = 1,200 tokens
    assert spec.memory.kv_bytes - plain.memory.kv_bytes == pytest.approx(4 * KV_PER_TOKEN_LAYER * 1200)


def test_fp4_checkpoints_keep_the_mtp_layer_in_bf16(run_estimate, models):
    arch = models["deepseek-r1"]
    base = run_estimate("deepseek-r1", "hgx-b200", 8, 1024, 1024, tp=8, ep=8, weights="nvfp4", compute="fp4", kv="bf16")
    spec = estimate(replace(base.inputs, speculative=Speculation(1, arch.mtp_acceptance.rates)))
    routed = 256 * 3 * 7168 * 2048  # the module's 256 experts; the rest of its 11.6B is dense
    dense = mtp_module_params(arch) - routed
    assert spec.memory.weights_bytes - base.memory.weights_bytes == pytest.approx((dense / 8 + routed / 8) * 2, rel=1e-9)


def test_no_draft_tokens_is_the_plain_estimate(tmp_path, capsys):
    flags = ["estimate", "--model", "deepseek-r1", "--rack", "hgx-h200", "--tp", "8", "--batch", "4", "--isl", "512", "--osl", "256"]
    assert main(flags + ["--json", str(tmp_path / "a.json")]) == 0
    assert main(flags + ["--speculative-tokens", "0", "--json", str(tmp_path / "b.json")]) == 0
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text()
    assert main(flags + ["--speculative-tokens", "2", "--json", str(tmp_path / "c.json")]) == 0
    assert '"draft_tokens": 2' in (tmp_path / "c.json").read_text()


def test_a_model_without_mtp_layers_is_refused_by_name(capsys):
    assert main(["estimate", "--model", "llama-3.1-70b", "--rack", "hgx-h100", "--tp", "4", "--batch", "8",
                 "--speculative-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "--speculative-tokens" in err and "no multi-token-prediction layers" in err and "fix:" in err


def _problem(model: str, speculative: dict, **workload) -> dict:
    return {"model": model, "precisions": {"weights": "fp8", "kv_cache": "fp8"}, "cluster": {"racks": [{"type": "hgx-h200", "count": 2}]},
            "workloads": [{"name": "w", "input_tokens": 1024, "output_tokens": 1024, "speculative": speculative, **workload}]}


@pytest.mark.parametrize("model, speculative, field, words", [
    ("llama-3.1-70b", {"draft_tokens": 2}, "workloads[0].speculative", "no multi-token-prediction layers"),
    ("deepseek-v3", {"draft_tokens": 3}, "workloads[0].speculative.draft_tokens", "covers 1 position"),
    ("deepseek-r1", {"draft_tokens": "auto", "acceptance_length": 2.5}, "workloads[0].speculative", "cannot be extrapolated"),
    ("deepseek-r1", {"draft_tokens": 2, "acceptance_length": 3.5}, "workloads[0].speculative", "exceeds 1 + draft_tokens"),
])
def test_problem_errors_name_the_field_and_the_fix(model, speculative, field, words):
    with pytest.raises(PlannerInputError) as caught:
        resolve_problem(parse_problem(_problem(model, speculative)))
    issue = caught.value.issues[0]
    assert issue.field.startswith(field) and words in issue.problem + issue.fix and issue.fix


def test_the_solver_picks_draft_tokens_by_regime():
    # a tight TPOT limit: speculation reaches it cheaper, or alone (the verify step costs little more than a plain one at small batches)
    fast = solve(resolve_problem(parse_problem(_problem("deepseek-r1", {"draft_tokens": "auto"}, tpot_limit_ms=15,
                                                        demand={"output_tokens_per_s": 2000}))))
    assert fast.status == "OPTIMAL" and all(d.candidate.draft_tokens > 0 for d in fast.deployments)
    off = solve(resolve_problem(parse_problem(_problem("deepseek-r1", {"draft_tokens": 0}, tpot_limit_ms=15,
                                                       demand={"output_tokens_per_s": 2000}))))
    assert off.status == "INFEASIBLE" or off.stats.objective > fast.stats.objective
    # throughput with drafts that are almost never accepted: every draft token costs, so none is used
    bulk = solve(resolve_problem(parse_problem(_problem("deepseek-r1", {"draft_tokens": "auto", "acceptance_rates": [0.02, 0.02, 0.02]},
                                                        demand={"output_tokens_per_s": 20000}))))
    assert bulk.status == "OPTIMAL" and all(d.candidate.draft_tokens == 0 for d in bulk.deployments)


def test_verified_attention_grows_with_the_queries_only_where_the_math_bounds_it():
    # the roofline of one layer's attention per context token: max(bytes / BW, queries x FLOPs / F), at `queries` over at 1
    assert verified_attention_factor(100.0, 100.0, 1.0, 2.0, 3) == pytest.approx(3.0)  # memory 50 < math 100: 300 / 100
    assert verified_attention_factor(100.0, 100.0, 1.0, 0.5, 3) == pytest.approx(1.5)  # memory 200 > math 100: 300 / 200
    assert verified_attention_factor(100.0, 100.0, 1.0, 0.5, 2) == pytest.approx(1.0)  # memory 200 = math 200: read once
    # DeepSeek-V3's absorbed MLA on an H200, bf16 cache, all 128 heads on the rank: 2 x 128 x (512 + 64) + 2 x 128 x 512
    # = 278,528 FLOPs against 576 x 2 = 1,152 bytes per context token; at 989.5 TFLOP/s x 0.803 and 4.8 TB/s x 0.8 the
    # math takes 0.351 ns and the read 0.300 ns, so 3 queries (2 draft tokens) take 3x as long
    assert verified_attention_factor(278_528, 1_152, 989.5e12 * 0.803, 4.8e12 * 0.8, 3) == pytest.approx(3.0)
    # Llama-3.1-70B's GQA (64 query heads over 8 KV heads of 128), bf16: 2 x 64 x 128 x 2 = 32,768 FLOPs against
    # 2 x 8 x 128 x 2 = 4,096 bytes: the read (1.07 ns) dwarfs even 4 queries' math (0.165 ns)
    assert verified_attention_factor(32_768, 4_096, 989.5e12 * 0.803, 4.8e12 * 0.8, 4) == pytest.approx(1.0)


def test_a_calibrated_mtp_step_scores_its_queries_against_the_latent_cache(hw, models):
    """DeepSeek-V3 on 16 H200 (attention DP16, EP16, SGLang's tables), 2 sequences per rank at 65,536 + 4,096 tokens, bf16
    cache: one query's attention is bound by its math (the factor above is 3 for 3 queries), so verifying 2 draft
    tokens runs the measured one-query attention time, less its fixed per-layer time, three times over."""
    arch = models["deepseek-v3"]
    precisions = Precisions(Precision.FP8, Precision.BF16, Precision.BF16, FlopsFormat.FP8)
    inp = DeploymentInputs(arch, hw.racks["hgx-h200"], Layout(1, 16, 1, 16), 32, 65536, 4096, precisions, hw.overheads,
                           engine=Engine.SGLANG, role=ServingRole.DECODE, step_model=StepModel.CALIBRATED)
    ctx = step_context(inp, default_replica_links(inp.rack, inp.layout, inp.overheads.collective_latency_s))
    per_rank = np.array([[2.0]])
    one, three = decode_attention(ctx, per_rank), decode_attention(ctx, per_rank, queries=3)
    np.testing.assert_allclose(three.fixed_s, one.fixed_s, rtol=1e-12)
    np.testing.assert_allclose(three.compute_s + three.memory_s, 3 * (one.compute_s + one.memory_s), rtol=1e-9)
    assert np.all(one.compute_s + one.memory_s > 0)
