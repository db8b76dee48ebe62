"""Training-loop helpers: a progress bar with rate and ETA (tqdm when installed, the
`examples` extra; a plain-text fallback otherwise) and a loss-curve PNG (matplotlib,
optional). Both libraries load only when used.

Example:
    >>> from fflow.progress import progress
    >>> bar = progress(range(3), desc="train", disable=True)
    >>> for step in bar:
    ...     bar.set_postfix(loss=1.0 / (step + 1))
    >>> bar.close()
"""

import sys
import time


class _TextBar:
    """What tqdm shows (count, rate, ETA, postfix), printed a few times per run."""

    def __init__(self, iterable=None, total=None, desc="", disable=False, initial=0, file=None):
        self.iterable = iterable
        self.total = total if total is not None else _len(iterable)
        self.desc, self.disable, self.n = desc, disable, initial
        self.file = file or sys.stderr
        self.start = time.perf_counter()
        self.postfix = ""
        self._last = -1.0

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.update(1)

    def update(self, n=1):
        self.n += n
        now = time.perf_counter()
        if not self.disable and (now - self._last > 5.0 or self.n == self.total):
            self._last = now
            print(self._line(now), file=self.file, flush=True)

    def set_postfix(self, **kw):
        self.postfix = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                 for k, v in kw.items())  # fmt: skip

    def _line(self, now):
        elapsed = now - self.start
        rate = self.n / elapsed if elapsed > 0 else 0.0
        total = f"/{self.total}" if self.total else ""
        eta = ""
        if self.total and rate > 0:
            eta = f", ETA {(self.total - self.n) / rate:.0f}s"
        return f"{self.desc}: {self.n}{total} [{elapsed:.0f}s, {rate:.2f} it/s{eta}] {self.postfix}"

    def close(self):
        pass


def _len(iterable):
    try:
        return len(iterable)
    except TypeError:
        return None


def progress(iterable=None, total=None, desc="", disable=False, initial=0):
    """A progress bar over `iterable` (tqdm's interface: `update`, `set_postfix`, `close`)."""
    try:
        from tqdm.auto import tqdm  # optional (examples extra)
    except ImportError:
        return _TextBar(iterable, total, desc, disable, initial)
    return tqdm(iterable, total=total, desc=desc, disable=disable, initial=initial,
                dynamic_ncols=True, mininterval=1.0)  # fmt: skip


def plot_losses(path, curves, title="loss", xlabel="step", ylabel="loss", hlines=None):
    """Write a PNG of loss curves.

    Args:
        path: the PNG file.
        curves: dict name -> list of (step, value).
        hlines: optional dict name -> constant value (e.g. a baseline) drawn dashed.

    Returns:
        True if written; False (with a note on stderr) when matplotlib is missing.
    """
    try:
        import matplotlib  # optional: plotting only

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_losses: matplotlib is not installed; no PNG written", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for name, points in curves.items():
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, label=name)
    for name, value in (hlines or {}).items():
        ax.axhline(value, linestyle="--", linewidth=1, color="gray", label=name)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
