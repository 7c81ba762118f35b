"""The TTFT queueing model (planner/physics/first_token.py), by hand and by simulation."""

import numpy as np
import pytest

from planner.physics.first_token import ServicePath, first_token


def test_one_path_by_hand():
    """A replica that starts a step every 20 ms: an arrival waits 10 ms on average, 18 ms at the
    90th percentile, then its 100 ms of service."""
    ft = first_token(np.array([0.020]), [ServicePath(1.0, np.array([0.100]))])
    assert ft.wait_s[0] == pytest.approx(0.010)
    assert ft.mean_s[0] == pytest.approx(0.110)
    assert ft.quantile_s[0] == pytest.approx(0.118)


def test_a_cache_mix_by_hand():
    """Half the requests miss (100 ms of service) and half hit (30 ms): mean 10 + 65 = 75 ms; the
    90th percentile sits among the misses, at most 18 + 100 ms. When 95% hit, the misses are fewer
    than 10% of requests and the 90th percentile is a hit's: 18 + 30 ms."""
    cycle = np.array([0.020])
    half = first_token(cycle, [ServicePath(0.5, np.array([0.100])), ServicePath(0.5, np.array([0.030]))])
    assert half.mean_s[0] == pytest.approx(0.075)
    assert half.quantile_s[0] == pytest.approx(0.118)
    mostly_hits = first_token(cycle, [ServicePath(0.05, np.array([0.100])), ServicePath(0.95, np.array([0.030]))])
    assert mostly_hits.mean_s[0] == pytest.approx(0.010 + 0.005 + 0.0285)
    assert mostly_hits.quantile_s[0] == pytest.approx(0.048)


def test_poisson_arrivals_against_a_busy_replica_by_simulation():
    """Poisson arrivals at a replica that admits at the start of each 20 ms step, then serves for
    100 ms: the simulated mean and 90th percentile of TTFT match the formulas; with a 50/50 cache
    mix the simulated 90th percentile lies below the stated bound."""
    rng = np.random.default_rng(7)
    cycle = 0.020
    arrivals = np.cumsum(rng.exponential(0.003, 200_000))
    wait = np.ceil(arrivals / cycle) * cycle - arrivals
    ttft = wait + 0.100
    ft = first_token(np.array([cycle]), [ServicePath(1.0, np.array([0.100]))])
    assert np.mean(ttft) == pytest.approx(ft.mean_s[0], rel=2e-3)
    assert np.quantile(ttft, 0.9) == pytest.approx(ft.quantile_s[0], rel=2e-3)
    hit = rng.random(len(arrivals)) < 0.5
    mixed = wait + np.where(hit, 0.030, 0.100)
    ft = first_token(np.array([cycle]), [ServicePath(0.5, np.array([0.100])), ServicePath(0.5, np.array([0.030]))])
    assert np.mean(mixed) == pytest.approx(ft.mean_s[0], rel=2e-3)
    assert np.quantile(mixed, 0.9) <= ft.quantile_s[0]
