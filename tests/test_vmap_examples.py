"""The vmap / scan examples at a small size: per-example gradients equal the Python
loop, and the scan RNN's loss goes down."""

import pathlib
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def examples_path():
    sys.path.insert(0, str(EXAMPLES))
    yield
    sys.path.remove(str(EXAMPLES))


def test_per_example_grads_match_loop_and_train(examples_path):
    import per_example_grads

    diff, acc = per_example_grads.main(steps=40, check_examples=8, log_every=40)
    assert diff < 1e-5
    assert acc > 0.5  # DP-SGD learns something in 40 noisy steps (chance is 0.1)


def test_rnn_scan_loss_goes_down(examples_path):
    import rnn_scan

    losses = rnn_scan.main(steps=30, seq_len=16, batch_size=8, hidden=32, lr=1e-2, log_every=10)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.5, (first, last)
