"""Expert-load profiles of a MoE model: read from a file (JSON, SGLang's logical counts, CSV) or
synthesised (lognormal skew or uniform), one row per MoE layer."""

from pathlib import Path

import numpy as np

from planner.errors import load_json_file, read_input_text
from planner.model.architecture import ModelArch

__all__ = ["load_profile", "synthetic_profile"]


def synthetic_profile(arch: ModelArch, sigma: float = 0.9, seed: int = 0, distribution: str = "lognormal") -> np.ndarray:
    """Per-layer expert loads, shape (n_moe_layers, E): lognormal(0, sigma) per expert, or uniform.
    sigma 0.9 is the skew docs/cpsat.md section 6 measured with: of 256 experts the hottest carries about
    8x the mean expert load, 3x the mean load of an EP64 rank (4 experts)."""
    rng = np.random.default_rng(seed)
    shape = (arch.n_moe_layers, arch.moe.n_routed_experts)
    if distribution == "uniform":
        return np.ones(shape)
    return rng.lognormal(mean=0.0, sigma=sigma, size=shape)


def load_profile(path: Path, arch: ModelArch) -> np.ndarray:
    """Loads from a JSON file ({"layers": [[...], ...]}, SGLang's {"logical_count": ...} or a bare
    list of lists; one row per MoE layer, or one row for all) or a CSV file (one row per MoE layer)."""
    if path.suffix == ".csv":
        rows = [[float(x) for x in line.split(",")] for line in read_input_text(path).splitlines() if line.strip()]
    else:
        data = load_json_file(path)
        rows = data.get("layers", data.get("logical_count")) if isinstance(data, dict) else data
        rows = np.asarray(rows, dtype=float)
        rows = rows.reshape(-1, rows.shape[-1]).tolist()
    loads = np.asarray(rows, dtype=float)
    if loads.ndim != 2 or not loads.size:
        raise ValueError(f"{path}: expected rows of per-expert loads, got an array of shape {loads.shape}")
    if not np.isfinite(loads).all():
        raise ValueError(f"{path}: {int((~np.isfinite(loads)).sum())} loads are NaN or infinite")
    experts = arch.moe.n_routed_experts
    if loads.shape[1] != experts:
        raise ValueError(f"{path}: {loads.shape[1]} experts per row, {arch.id} has {experts}")
    if len(loads) == arch.n_layers:  # a row per model layer: keep the MoE layers
        loads = loads[[i for i, moe in enumerate(arch.layer_is_moe) if moe]]
    if len(loads) == 1:
        loads = np.repeat(loads, arch.n_moe_layers, axis=0)
    if len(loads) != arch.n_moe_layers:
        raise ValueError(f"{path}: {len(loads)} rows, expected 1, {arch.n_moe_layers} (MoE layers) or {arch.n_layers}")
    if (loads < 0).any():
        raise ValueError(f"{path}: loads must be non-negative")
    if (loads.sum(axis=1) <= 0).any():
        raise ValueError(f"{path}: a layer's loads are all zero; every MoE layer needs some load")
    return loads
