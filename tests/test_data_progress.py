"""Progress bar and loss-curve PNG helpers (tqdm / matplotlib are optional)."""

import io

import pytest

from fflow import progress


def test_text_bar_reports_count_rate_and_postfix():
    out = io.StringIO()
    bar = progress._TextBar(range(4), desc="train", file=out)
    for i in bar:
        bar.set_postfix(loss=1.0 / (i + 1))
    text = out.getvalue()
    assert "train: 4/4" in text and "it/s" in text and "loss=0.25" in text


def test_progress_uses_tqdm_when_installed():
    tqdm = pytest.importorskip("tqdm")
    bar = progress.progress(range(2), disable=True)
    assert isinstance(bar, tqdm.tqdm) and list(bar) == [0, 1]


def test_plot_losses_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "loss.png"
    assert progress.plot_losses(path, {"train": [(1, 2.0), (2, 1.5)]}, hlines={"bigram": 1.8})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
