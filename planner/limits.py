"""Upper bounds on every size a user can ask for, in files and on the command line alike. They are
chosen so that the largest accepted input still finishes within its time limit and 2 GB: a problem
with 4,096 racks of one type and a demand needing 3,872 replicas enumerates and solves in under 5 s
and 220 MB (`planner solve` on llama-3.1-70b-hgx-h100 with the count and demand raised)."""

from planner.units import BILLION, MS, SECONDS_PER_DAY, SECONDS_PER_HOUR

__all__ = [
    "MAX_ACCELERATORS_PER_RACK",
    "MAX_BATCH_PER_REPLICA",
    "MAX_CURVE_POINTS",
    "MAX_DEMAND_OUTPUT_TOKENS_PER_S",
    "MAX_DEMAND_REQUESTS_PER_S",
    "MAX_DRAFT_TOKENS",
    "MAX_FRONTIER_POINTS",
    "MAX_INPUT_TOKENS",
    "MAX_LATENCY_LIMIT_MS",
    "MAX_MODELS",
    "MAX_OUTPUT_TOKENS",
    "MAX_PARALLEL_DEGREE",
    "MAX_PREFILL_CHUNK_TOKENS",
    "MAX_PRICE_USD_PER_ACCELERATOR_HOUR",
    "MAX_RACKS_PER_TYPE",
    "MAX_RACK_TYPES",
    "MAX_REDUNDANT_EXPERTS",
    "MAX_REPLICAS",
    "MAX_SEED",
    "MAX_SWEEP_AXIS_VALUES",
    "MAX_SWEEP_PROBLEMS",
    "MAX_TIME_LIMIT_S",
    "MAX_USD_PER_HOUR",
    "MAX_WORKLOADS",
]

MAX_DEMAND_OUTPUT_TOKENS_PER_S = 1e4 * BILLION  # a hundred times all of 2025's frontier serving
MAX_DEMAND_REQUESTS_PER_S = BILLION
MAX_LATENCY_LIMIT_MS = 1e-2 * SECONDS_PER_DAY / MS  # 864 s: anything slower is not a latency limit
MAX_USD_PER_HOUR = 1e3 * BILLION
MAX_PRICE_USD_PER_ACCELERATOR_HOUR = 1e4
MAX_RACKS_PER_TYPE = 4096  # issue 14's fleet target is 1,000 racks over 5 generations
MAX_RACK_TYPES = 16
MAX_ACCELERATORS_PER_RACK = 16_384  # the largest built scale-up domain: 9,216-chip TPU pods
MAX_WORKLOADS = 64
MAX_MODELS = 16
MAX_PARALLEL_DEGREE = MAX_ACCELERATORS_PER_RACK  # TP, EP, PP or attention DP of one replica
MAX_REDUNDANT_EXPERTS = 4096
MAX_DRAFT_TOKENS = 16  # speculative decoding: engines verify a handful (TensorRT-LLM's DeepSeek-R1 tables stop at 5)
MAX_BATCH_PER_REPLICA = 1 << 20
MAX_REPLICAS = 100_000
MAX_INPUT_TOKENS = 100_000_000
MAX_OUTPUT_TOKENS = 10_000_000
MAX_PREFILL_CHUNK_TOKENS = 1 << 20
MAX_TIME_LIMIT_S = SECONDS_PER_HOUR
MAX_SEED = 2**31 - 1  # CP-SAT's random_seed is a 32-bit signed integer
MAX_FRONTIER_POINTS = 200  # one CP-SAT solve each
MAX_CURVE_POINTS = 4096  # one vectorised evaluation each
MAX_SWEEP_PROBLEMS = 10_000  # points of one sweep file (each a full solve)
MAX_SWEEP_AXIS_VALUES = 256
