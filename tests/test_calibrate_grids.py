"""Correction grids of `planner calibrate` on noisy tables (planner/hardware/calibrate_grids.py): the
raw and the smoothed (running median) grid, their leave-one-out predictions and the choice between
them. A held-out row must never take part in what predicts it, and what is scored must be what the
grid built without that row gives; on a table of known smooth truth plus known noise the smoothed
grid must predict held-out rows better than the raw one, close to what the noise allows."""

import numpy as np
import pytest

from planner.hardware.calibrate_classes import scored_grid
from planner.hardware.calibrate_fits import Fit
from planner.hardware.calibrate_grids import AxisSpec, build_grid, smooth_first_axis
from planner.hardware.kernel_grids import interpolate

HALF_NORMAL_MEAN = np.sqrt(2.0 / np.pi)  # E|Z| of a standard normal
MEDIAN_OF_FOUR_VARIANCE = 0.2982  # variance of the median of four standard normals (order statistics; mean of the 2nd and 3rd)


def test_smoothed_grid_on_a_hand_made_table():
    # the table of test_calibrate's leave-one-out test: log factors at m = 1, 2, 4, 8, a second row at m = 4, m = 3 between nodes
    m = np.array([1.0, 2.0, 4.0, 8.0, 4.0, 3.0])
    log_c = np.array([0.0, 0.4, 0.2, 0.6, 0.3, 0.1])
    raw, smoothed = build_grid([AxisSpec(m, np.array([1.0, 2.0, 4.0, 8.0]))], log_c)
    assert raw.values == pytest.approx([0.0, 0.4, 0.25, 0.6])
    # nodes 0.0, 0.4, 0.25, 0.6: the ends stay, m = 2 -> median(0, 0.4, 0.25) = 0.25, m = 4 -> median(0.4, 0.25, 0.6) = 0.4
    assert smoothed.values == pytest.approx([0.0, 0.25, 0.4, 0.6])
    # left out: m = 2 -> median(0, 0.25) = 0.125; m = 4, row 0.2 -> median(0.4, 0.3 (the other row), 0.6) = 0.4, row 0.3 ->
    # median(0.4, 0.2, 0.6) = 0.4; m = 3 between the smoothed nodes 0.25 and 0.4 at w = ln 1.5 / ln 2 = 0.58496 -> 0.33774
    assert smoothed.predicted_log == pytest.approx([np.nan, 0.125, 0.4, np.nan, 0.4, 0.337744], abs=1e-6, nan_ok=True)


def test_a_monotone_run_is_left_as_it_is():
    raw = np.array([[0.0, 1.0], [0.1, 0.8], [0.3, 0.7], [0.35, 0.2], [0.9, 0.1]])
    assert smooth_first_axis(raw) == pytest.approx(raw)
    # an isolated spike is taken out: the median of 0.0, 0.1, 0.9 (spike), 0.3, 0.4 is 0.3
    assert smooth_first_axis(np.array([0.0, 0.1, 0.9, 0.3, 0.4]))[2] == pytest.approx(0.3)


def _noisy_table(seed: int):
    """A one-axis table: 12 nodes, a second row at three of them, rows between nodes, noise 0.1."""
    rng = np.random.default_rng(seed)
    nodes = 2.0 ** np.arange(12)
    coords = np.concatenate([nodes, nodes[[2, 5, 9]], [3.0, 24.0, 700.0]])
    return AxisSpec(coords, nodes), 0.3 * np.sin(np.log(coords)) + rng.normal(0.0, 0.1, len(coords))


def _sparse_plane(seed: int):
    """Two axes (8 x 4 nodes), half the nodes measured, three of them twice, rows between nodes: the
    smoothed grid's rows with no other measured node within reach along the first axis fall back to
    the neighbours along the second."""
    rng = np.random.default_rng(seed)
    m_nodes, n_nodes = 2.0 ** np.arange(8), np.array([100.0, 200.0, 400.0, 800.0])
    cells = rng.permutation(32)[:16]
    m, n = m_nodes[cells // 4], n_nodes[cells % 4]
    m = np.concatenate([m, m[:3], [3.0, 40.0]])
    n = np.concatenate([n, n[:3], [150.0, 300.0]])
    return [AxisSpec(m, m_nodes), AxisSpec(n, n_nodes)], 0.2 * np.log(m) / 5 + rng.normal(0.0, 0.1, len(m))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_row_is_never_predicted_from_itself(seed):
    for axes, log_c in ([[_noisy_table(seed)[0]], _noisy_table(seed)[1]], _sparse_plane(seed)):
        builds = build_grid(axes, log_c)
        assert np.isfinite(builds[1].predicted_log).sum() == np.isfinite(builds[0].predicted_log).sum() >= 8
        for row in range(len(log_c)):
            moved = log_c.copy()
            moved[row] += 5.0
            for before, after in zip(builds, build_grid(axes, moved), strict=True):
                assert after.predicted_log[row] == pytest.approx(before.predicted_log[row], abs=1e-12, nan_ok=True)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_what_is_scored_is_the_grid_built_without_the_row(seed):
    # on one axis, a scored row's prediction is the value at its coordinate of the grid built from the other rows
    axis, log_c = _noisy_table(seed)
    builds = build_grid([axis], log_c)
    log_nodes = (np.log(axis.nodes),)
    for row in np.flatnonzero(np.isfinite(builds[0].predicted_log)):
        keep = np.arange(len(log_c)) != row
        without = build_grid([AxisSpec(axis.coords[keep], axis.nodes)], log_c[keep])
        for scored, rebuilt in zip(builds, without, strict=True):
            at_row = interpolate(log_nodes, rebuilt.values, (np.log(axis.coords[row]),))
            assert scored.predicted_log[row] == pytest.approx(float(at_row), abs=1e-12)


def test_smoothing_predicts_a_noisy_table_near_its_noise():
    # 200 tables of 40 nodes (factor 2^(1/4) apart) of a smooth truth, 0.3 sin(ln x / 2), plus normal noise of sd 0.1.
    # A held-out interior row (reach two nodes each side) costs its own noise plus the predictor's: raw, the mean of
    # two neighbours (variance 1/2): sd 0.1 sqrt(1.5); smoothed, the median of four: sd 0.1 sqrt(1 + 0.2982). The two
    # rows next to the ends reach one node each side (median of two = their mean). Mean |error| = sd x sqrt(2/pi).
    sigma, nodes = 0.1, 2.0 ** (np.arange(40) / 4.0)
    rng = np.random.default_rng(11)
    raw_errors, smoothed_errors = [], []
    for _ in range(200):
        log_c = 0.3 * np.sin(np.log(nodes) / 2.0) + rng.normal(0.0, sigma, len(nodes))
        raw, smoothed = build_grid([AxisSpec(nodes, nodes)], log_c)
        raw_errors.append(raw.loo_log_error[1:-1])
        smoothed_errors.append(smoothed.loo_log_error[1:-1])
    raw_mae, smoothed_mae = np.mean(np.abs(raw_errors)), np.mean(np.abs(smoothed_errors))
    expected_raw = sigma * np.sqrt(1.5) * HALF_NORMAL_MEAN
    expected_smoothed = sigma * HALF_NORMAL_MEAN * (36 * np.sqrt(1 + MEDIAN_OF_FOUR_VARIANCE) + 2 * np.sqrt(1.5)) / 38
    assert raw_mae == pytest.approx(expected_raw, rel=0.04)  # 0.0977
    assert smoothed_mae == pytest.approx(expected_smoothed, rel=0.04)  # 0.0913
    assert smoothed_mae < raw_mae
    assert smoothed_mae < 1.2 * sigma * HALF_NORMAL_MEAN  # within 20% of a prediction that knew the truth (noise alone)


class _Context:
    def __init__(self):
        self.grids = {}


def test_the_grid_that_predicts_better_is_stored_and_scored():
    nodes = 2.0 ** (np.arange(40) / 4.0)
    fitted_s = np.full(len(nodes), 1e-5)
    axes = [AxisSpec(nodes, nodes)]
    # a gentle trend with a spike at every fifth node: the raw grid passes each spike on to the held-out rows beside it
    # (half of it: 0.25), the running median leaves it out; the smoothed grid is kept and the record scores it
    log_c = 0.05 * np.log(nodes) + 0.5 * (np.arange(40) % 5 == 2)
    ctx = _Context()
    record = scored_grid(ctx, "spiky", Fit({}, fitted_s), fitted_s * np.exp(log_c), axes)
    raw, smoothed = build_grid(axes, log_c)
    assert raw.loo_log_error[6] == pytest.approx(0.25)  # node 6 between 5 and the spike at 7: (t5 + t7 + 0.5) / 2 - t6
    assert abs(smoothed.loo_log_error[6]) < 0.02  # median of t4, t5, t8 and the spike: (t5 + t8) / 2 = t6 + 0.004
    assert record["smoothed"] is True
    assert ctx.grids["spiky"].log_correction == pytest.approx(smoothed.values)
    assert record["loo_error"][0] == pytest.approx(np.median(np.abs(np.expm1(smoothed.loo_log_error[1:-1]))), rel=1e-3)
    # a clean kink (monotone on either side): raw and smoothed predict alike; the tie keeps the raw grid
    kink = np.maximum(np.log(nodes) - 3.0, 0.0)
    record = scored_grid(ctx, "kink", Fit({}, fitted_s), fitted_s * np.exp(kink), axes)
    assert "smoothed" not in record
    assert ctx.grids["kink"].log_correction == pytest.approx(kink)
