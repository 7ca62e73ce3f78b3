"""recovery's support counts on hand-built students (false negatives = teacher weights the student dropped).

Gap: false_negative counted as kept & ~true (the false positives) passed the suite."""

import numpy as np
from sqs_theory.recovery import recovery

T1, T2 = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[1.0, 1.0]])


def test_a_dropped_output_weight_is_one_false_negative():
    r = recovery(T1, T2, T1.copy(), np.array([[1.0, 0.0]]), levels=[1.0])
    assert (r["true_positive"], r["false_positive"], r["false_negative"]) == (3, 0, 1)
    assert r["support_exact"] is False


def test_a_spurious_weight_and_two_dropped():
    s1 = np.array([[1.0, 0.5], [0.0, 0.0]])  # unit 1 adds a weight, unit 2 loses its input
    r = recovery(T1, T2, s1, np.array([[1.0, 0.0]]), levels=[1.0, 0.5])
    assert (r["true_positive"], r["false_positive"], r["false_negative"]) == (2, 1, 2)
