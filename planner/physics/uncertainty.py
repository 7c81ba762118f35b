"""The stated range of a calibrated prediction: the kernel rates' spread, widened to the end-to-end
spread such predictions show against published serving measurements.

A kernel class's spread (`hardware.kernels.Spread`, from the calibration's leave-one-out residuals)
says how well the measured kernel tables are reproduced: a step to +-5-10%. An engine serving a
whole model adds what no kernel table measures: scheduling between steps, the engine release,
routing and batching as they happen. `topologies/model_spread.yaml` holds, per regime, an 80%
prediction band (p10, p90) of measured time over predicted time on the project's published
measurements: split-conformal order statistics, over the regime's own rows where they differ from
the other regimes' and over all rows where they do not (`python benchmarks/fidelity.py --all
--write-spread topologies/model_spread.yaml` writes it, and its docstring says why; the predictions'
medians do not depend on it). The stated p10-p90 range of a prediction is the wider of the two on
each side. The medians are never moved by it.

Regimes: `decode_dense` and `decode_moe` (TPOT and the throughput of decode and mixed steps),
`first_token` (TTFT and prefill passes).
"""

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import Field

from planner.errors import (
    PlannerInputError,
    issues_from_validation_error,
    load_yaml_file,
)
from planner.paths import data_dir
from planner.schema import EdgeModel

__all__ = ["DECODE_DENSE", "DECODE_MOE", "FIRST_TOKEN", "RegimeSpread", "decode_regime", "regime_spread", "widen"]

SPREAD_FILE = "model_spread.yaml"
DECODE_DENSE, DECODE_MOE, FIRST_TOKEN = "decode_dense", "decode_moe", "first_token"


@dataclass(frozen=True)
class RegimeSpread:
    """Measured over predicted time on the published rows: the bounds of the regime's 80% band."""

    p10: float = 1.0
    p90: float = 1.0
    rows: int = 0


class _RegimeSpec(EdgeModel):
    p10: float = Field(gt=0)
    p50: float = Field(gt=0)
    p90: float = Field(gt=0)
    rows: int = Field(ge=1)
    band_rows: int | None = Field(default=None, ge=1)  # the rows the band was built from (documentary)
    ks_p: float | None = Field(default=None, ge=0, le=1)
    leave_one_family_out_coverage: float | None = Field(default=None, ge=0, le=1)


class _SpreadFile(EdgeModel):
    source: dict[str, str]
    regimes: dict[str, _RegimeSpec]


@functools.lru_cache(maxsize=4)
def _load(directory: Path) -> dict[str, RegimeSpread]:
    from pydantic import ValidationError

    path = directory / SPREAD_FILE
    if not path.exists():
        return {}
    try:
        spec = _SpreadFile.model_validate(load_yaml_file(path, catalog=True))
    except ValidationError as exc:
        raise PlannerInputError(issues_from_validation_error(exc, str(path))) from None
    return {name: RegimeSpread(r.p10, r.p90, r.rows) for name, r in spec.regimes.items()}


@functools.lru_cache(maxsize=1)
def _shipped() -> dict[str, RegimeSpread]:
    return _load(data_dir("topologies").resolve())


def regime_spread(regime: str, directory: Path | None = None) -> RegimeSpread:
    """The end-to-end spread of `regime` (none, p10 = p90 = 1, when the file does not name it)."""
    spreads = _shipped() if directory is None else _load(directory.resolve())
    return spreads.get(regime, RegimeSpread())


def decode_regime(is_moe: bool) -> str:
    return DECODE_MOE if is_moe else DECODE_DENSE


def widen(low_ratio, high_ratio, regime: str) -> tuple[np.ndarray, np.ndarray]:
    """The p10 and p90 of a prediction as ratios to it: the kernel spread's (`low_ratio`,
    `high_ratio`) or the regime's end-to-end spread, whichever is wider on each side."""
    spread = regime_spread(regime)
    return np.minimum(np.asarray(low_ratio, dtype=float), spread.p10), np.maximum(np.asarray(high_ratio, dtype=float), spread.p90)
