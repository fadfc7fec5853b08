"""Metric arithmetic: pass@k against brute-force enumeration, mean@n, AES, length split."""
import itertools
import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_replay.eval import aes, evaluate_correctness, length_split, mean_at_n, pass_at_k, relative_change


def brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Fraction of all k-subsets of n samples (the first c correct) that contain a correct sample."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(samples[i] for i in s) for s in subsets), len(subsets))


def test_pass_at_k_matches_brute_force_for_all_small_cases():
    for n in range(1, 11):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(float(brute_force_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


def test_pass_at_k_independent_of_sample_order():
    # Every arrangement of c correct among n samples gives the same subset fraction, and pass_at_k only sees (n, c, k).
    n, c, k = 6, 2, 3
    values = set()
    for correct_idx in itertools.combinations(range(n), c):
        samples = [i in correct_idx for i in range(n)]
        subsets = list(itertools.combinations(range(n), k))
        values.add(Fraction(sum(any(samples[i] for i in s) for s in subsets), len(subsets)))
    assert len(values) == 1 and pass_at_k(n, c, k) == pytest.approx(float(values.pop()))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 200).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_properties(nck):
    n, c, k = nck
    p = pass_at_k(n, c, k)
    assert 0.0 <= p <= 1.0
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert p == pytest.approx(float(exact), abs=1e-9)
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)  # pass@1 is the fraction correct
    if k < n:
        assert pass_at_k(n, c, k + 1) >= p - 1e-12  # monotone in k
    if c < n:
        assert pass_at_k(n, c + 1, k) >= p - 1e-12  # monotone in c
    assert (p == 0.0) == (c == 0)
    if n - c < k:  # every k-subset holds a correct sample
        assert p == 1.0


def test_pass_at_k_stable_for_large_n():
    # The binomials would overflow floats; the product form does not.
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5)
    assert 0 < pass_at_k(5000, 3, 2) < 1


@pytest.mark.parametrize(
    "n, c, k, match",
    [(4, 0, 5, "n >= k"), (4, 5, 2, "0 <= c <= n"), (4, -1, 2, "0 <= c <= n"), (0, 0, 1, "n .* >= 1"), (4, 1, 0, "k must be")],
)
def test_pass_at_k_rejects_invalid(n, c, k, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(n, c, k)


def test_mean_at_n_and_evaluate_correctness():
    counts = [(4, 0), (4, 1), (4, 4), (8, 2)]
    assert mean_at_n(counts) == pytest.approx((0 + 0.25 + 1 + 0.25) / 4)
    res = evaluate_correctness(counts, ks=[4, 1, 2])
    assert res["num_problems"] == 4 and res["num_samples"] == 20 and res["num_correct"] == 7
    assert list(res["pass@k"]) == [1, 2, 4]
    assert res["pass@k"][1] == pytest.approx(res["mean@n"])
    assert res["pass@k"][4] == pytest.approx((0 + 1 + 1 + pass_at_k(8, 2, 4)) / 4)
    assert math.isnan(mean_at_n([]))
    with pytest.raises(ValueError, match="n >= k"):
        evaluate_correctness([(2, 1)], ks=[4])


def test_aes_o1_pruner_form():
    # Shorter and more accurate: alpha*dL + beta*dAcc.
    assert aes(acc=0.6, length=800, base_acc=0.5, base_length=1000) == pytest.approx(0.2 + 3 * 0.2)
    # Shorter but less accurate: alpha*dL - gamma*|dAcc|.
    assert aes(acc=0.4, length=800, base_acc=0.5, base_length=1000) == pytest.approx(0.2 - 5 * 0.2)
    # Custom weights, longer and equal accuracy.
    assert aes(0.5, 1100, 0.5, 1000, alpha=2, beta=1, gamma=1) == pytest.approx(-0.2)
    with pytest.raises(ValueError, match="zero accuracy"):
        aes(0.5, 100, 0.0, 100)


def test_length_split_and_relative_change():
    res = length_split([10, 20, 30, 40], [True, False, True, False])
    assert res == {"all": 25.0, "correct": 20.0, "incorrect": 30.0, "num_correct": 2, "num_incorrect": 2}
    assert length_split([5], [False])["correct"] is None
    with pytest.raises(ValueError, match="same length"):
        length_split([1, 2], [True])
    assert relative_change(90, 100) == pytest.approx(-0.1)
    assert relative_change(1, 0) is None and relative_change(None, 3) is None
