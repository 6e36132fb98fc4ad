"""Building blocks of the analyzer: robust statistics, thresholds, wording."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfdiag.analyzer.compare.features import is_collective_wait
from perfdiag.analyzer.compare.stats import LEAVE_ONE_OUT_MAX, peer_reference, robust_scale
from perfdiag.analyzer.text import MAX_NAME, format_ranks, pct, ranks_phrase, short, what
from perfdiag.api.thresholds import ExpectedRanges, Thresholds


def test_leave_one_out_keeps_a_single_outlier_from_hiding_itself() -> None:
    values = np.array([[10.0], [10.5], [11.0], [50.0]])
    ref = peer_reference(values)
    # The outlier is compared with the other three only.
    assert ref.median[3, 0] == 10.5
    assert ref.mad[3, 0] == 0.5
    assert ref.best[3, 0] == 10.0
    # A normal rank's peers include the outlier, whose pull the median resists.
    assert ref.median[0, 0] == 11.0


def test_two_ranks_compare_with_each_other() -> None:
    ref = peer_reference(np.array([[5.0, 1.0], [45.0, 1.0]]))
    assert ref.median[:, 0].tolist() == [45.0, 5.0]
    assert ref.mad[:, 0].tolist() == [0.0, 0.0]


def test_one_rank_has_no_peers() -> None:
    ref = peer_reference(np.array([[5.0, 1.0]]))
    assert np.isnan(ref.median).all()


def test_large_groups_use_the_group_median() -> None:
    n = LEAVE_ONE_OUT_MAX + 1
    values = np.arange(n, dtype=float)[:, None]
    ref = peer_reference(values)
    assert (ref.median == np.median(values)).all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1e4, allow_nan=False), min_size=2, max_size=12))
def test_leave_one_out_median_matches_the_definition(values: list[float]) -> None:
    matrix = np.array(values)[:, None]
    ref = peer_reference(matrix)
    for i in range(len(values)):
        others = np.delete(matrix[:, 0], i)
        assert ref.median[i, 0] == pytest.approx(np.median(others))
        assert ref.best[i, 0] == pytest.approx(others.min())


def test_scale_never_drops_below_the_noise_floor() -> None:
    ref = peer_reference(np.array([[10.0], [10.0], [10.0], [10.0]]))
    scale = robust_scale(ref, noise_floor=0.1, absolute_floor=np.full((4, 1), 0.2))
    assert (scale == 1.0).all()  # MAD 0 → 10% of the median
    scale = robust_scale(ref, noise_floor=0.0, absolute_floor=np.full((4, 1), 0.2))
    assert (scale == 0.2).all()


def test_thresholds_accept_the_crd_spelling_and_round_trip() -> None:
    t = Thresholds.model_validate(
        {"reportSeverity": 0.1, "expectedRangesCpu": {"communication": 0.5, "python": None}}
    )
    assert t.report_severity == 0.1
    assert t.expected_ranges_cpu.communication == 0.5
    assert "python" not in t.expected_ranges_cpu.bounds()
    assert Thresholds.model_validate(t.model_dump(by_alias=True)) == t
    assert Thresholds(min_ratio=2.0).min_ratio == 2.0


def test_thresholds_reject_unknown_fields_and_bad_values() -> None:
    with pytest.raises(ValueError):
        Thresholds.model_validate({"reportSeverty": 0.1})
    with pytest.raises(ValueError):
        Thresholds(report_severity=1.5)
    with pytest.raises(ValueError):
        ExpectedRanges(python=-0.1)


def test_gpu_defaults_follow_the_design() -> None:
    bounds = Thresholds().expected_ranges_gpu.bounds()
    assert bounds == {
        "python": 0.01,
        "gc": 0.01,
        "dataloader": 0.01,
        "cuda_runtime": 0.01,
        "communication": 0.30,
    }


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([3], "3"),
        ([0, 1], "0,1"),
        ([0, 1, 2, 3, 7], "0-3,7"),
        ([5, 1, 2, 3], "1-3,5"),
        (list(range(0, 60, 2)), ",".join(str(r) for r in range(0, 24, 2)) + ",… (30 ranks)"),
    ],
)
def test_format_ranks(ranks: list[int], text: str) -> None:
    assert format_ranks(ranks) == text


def test_wording() -> None:
    assert ranks_phrase([2], capital=True) == "Rank 2"
    assert ranks_phrase([0, 1, 3]) == "ranks 0,1,3"
    assert pct(0.381) == "38%" and pct(0.052) == "5.2%" and pct(0.05) == "5%"


def test_collective_waits_are_recognised() -> None:
    name = "<built-in method wait of pybind11_builtins.pybind11_detail_function_record_v1 object>"
    assert is_collective_wait(name)
    assert not is_collective_wait("threading.py(320): wait")
    assert not is_collective_wait(None)


KERNEL = (
    "void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1"
    "<float, float, float, 5ul>("
    + ", ".join(["at::GenericPackedTensorAccessor<float, 2ul, at::RestrictPtrTraits, int>"] * 20)
    + ", bool, at::PhiloxCudaState, FixedDivisor, float, float, float, long)"
)


def test_a_kernels_template_arguments_and_parameters_are_folded_in_sentences() -> None:
    name = short(KERNEL)
    assert name == (
        "void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1<…>(…)"
    )
    assert what(KERNEL, "gpu_compute") == f"{name} (gpu_compute)"
    assert short("aten::mm") == "aten::mm"  # short names stay whole
    assert len(short("x" * 500)) == MAX_NAME
