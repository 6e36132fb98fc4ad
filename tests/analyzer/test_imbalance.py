"""Load imbalance from the training threads' CPU time per step (analyzer/findings/imbalance.py)."""

from __future__ import annotations

import numpy as np

from perfdiag.analyzer.findings.imbalance import MIN_SHARED_HOST_SPREAD, _group_imbalance

# A healthy run of 4 ranks on 2 cores (the demo): the same work, each rank's on-CPU ms per step,
# several ranks in turn slower for a few steps while their cores are shared.
SHARED_HOST = np.array(
    [
        [6.1, 5.8, 5.9, 5.2, 5.4, 5.4, 5.5, 5.4, 6.1, 7.2],
        [6.4, 7.3, 7.7, 7.6, 7.3, 5.7, 5.5, 5.9, 5.5, 5.6],
        [6.6, 7.2, 6.4, 6.7, 6.9, 6.8, 6.5, 11.2, 8.4, 6.3],
        [6.8, 6.7, 7.6, 6.6, 7.8, 6.4, 8.9, 11.0, 11.4, 11.6],
    ]
)
STEPS = np.full(SHARED_HOST.shape, 23.0)
DILATION = 1.35


def test_the_same_work_slower_for_a_while_on_a_shared_host_is_no_imbalance() -> None:
    # Without the shared-host rule its loss would pass as an imbalance.
    assert _group_imbalance(SHARED_HOST, STEPS, DILATION) is not None
    assert _group_imbalance(SHARED_HOST, STEPS, DILATION, MIN_SHARED_HOST_SPREAD) is None


def test_uneven_inputs_are_an_imbalance_on_a_shared_host() -> None:
    rng = np.random.default_rng(3)
    work = rng.choice([3.0, 6.0, 12.0, 24.0], size=(4, 10)) * 0.4 + 5.0
    found = _group_imbalance(work, np.full(work.shape, 40.0), 1.5, MIN_SHARED_HOST_SPREAD)
    assert found is not None
    loss_ms, step_ms, shown, slowest = found
    assert loss_ms >= 0.1 * step_ms and shown >= 5
    assert np.bincount(slowest).max() <= 5
