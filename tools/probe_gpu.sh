#!/usr/bin/env bash
# One probe of a GPU machine for `planner calibrate` (README, "Calibrate on your own accelerators"):
# the shapes of a dense 8B and 70B model, an MoE model and DeepSeek-V3 (MLA, 256 experts), every
# kernel class, within BUDGET_S seconds (default 240), tables and probe.yaml written to OUT.
#   tools/probe_gpu.sh OUT
# Needs python3 with a CUDA or ROCm build of PyTorch, pandas and pyarrow, and the planner's light
# dependencies (pydantic, PyYAML, rich, numpy, networkx). Where pip cannot reach an index, wheels
# left in .whl/ beside this checkout are installed first (pip download them on a machine that can).
# For a Python 3.12 device image without pydantic, e.g.:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl pydantic==2.13.4 pydantic_core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: tools/probe_gpu.sh OUT}
budget_s=${BUDGET_S:-240}
models=${MODELS:-"llama-3.1-8b llama-3.1-70b qwen3-30b-a3b deepseek-v3"}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/planner-site .whl/*.whl
    export PYTHONPATH=$PYTHONPATH:/tmp/planner-site
fi
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv || rocm-smi --showproductname || true) 2>/dev/null
PYTHONUNBUFFERED=1 python3 -m planner probe $models --out "$out" --budget-s "$budget_s"
