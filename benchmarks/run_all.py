"""Run every benchmark script and collect their tables (optionally into a Markdown file).

python benchmarks/run_all.py                 # full sizes
python benchmarks/run_all.py --tiny          # tiny sizes (what the tests run)
python benchmarks/run_all.py --load 2        # each script quiet, then beside 2 CPU hogs
python benchmarks/run_all.py --load 2 --example mlp_digits.py   # + an example's wall time
python benchmarks/run_all.py --markdown docs/benchmarks.md
python benchmarks/run_all.py --rounds 1      # faster: one process per framework, once

Every framework is measured in its own process (`--only NAME`), as a user runs one
framework: the others' threads (torch's OpenMP workers spin ~20 ms after each call,
XLA's pool a few ms) and their work on the main thread never share a process with
the one measured. The processes run in `--rounds` rounds, the frameworks' order
rotating each round, and each cell is the median over the rounds; the notes give
fflow/JAX round by round.

With `--load N`, N busy-looping processes (started and stopped by this script, and
bounded by `--load-seconds` even if it dies) share the machine while the "loaded"
rounds of each script measure; between those they are paused (SIGSTOP), so the
quiet and loaded rounds of one script are back to back. Both tables are printed side
by side: every framework's time quiet and loaded, and the ratios within each.

Why rounds of processes: beside busy processes, where the scheduler puts a process's
threads (sharing a core with a hog or not) is decided when it starts and tends to
stay for its whole run, so one process's median is one draw: `bench_mlp.py` with all
four frameworks in one process gave fflow/JAX 0.87-2.09x under load 2 from one run
to the next (fflow's main thread, which also ran the NumPy and torch steps, shared a
core with a hog in the slow runs: the NumPy step was descheduled on 100 % of its calls).
Five rounds by default: even on a quiet machine the shared host's speed drifts over
seconds (the same process measured 1.3 ms per MLP step, then 1.8 ms), so two
processes measured a few seconds apart differ by that much; the MLP step's fflow/JAX
ran 0.73-1.02x round by round in one 5-round run whose median was 0.83x.
"""

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
SCRIPTS = [
    "bench_dispatch.py",
    "bench_mlp.py",
    "bench_elementwise.py",
    "bench_transformer.py",
    "bench_import.py",
]
FRAMEWORKS = ["fflow", "jax.jit", "torch eager", "numpy"]
ONLY = {"fflow": "fflow", "jax.jit": "jax", "torch eager": "torch", "numpy": "numpy"}
HOG = "import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"


class Hogs:
    """N busy-looping processes, each ending by itself after `seconds`."""

    def __init__(self, n, seconds):
        self.procs = [
            subprocess.Popen([sys.executable, "-c", HOG.format(seconds=seconds)]) for _ in range(n)
        ]
        self.pause()

    def _signal(self, sig):
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, sig)

    def pause(self):
        self._signal(signal.SIGSTOP)

    def resume(self):
        self._signal(signal.SIGCONT)

    def stop(self):
        self._signal(signal.SIGCONT)  # a stopped process does not act on SIGTERM
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            p.wait()


def run_script(script, args, env, only=None):
    cmd = [sys.executable, os.path.join(HERE, script)]
    if args.tiny:
        cmd.append("--tiny")
    if only or args.only:
        cmd += ["--only", only or args.only]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, env=env)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"{script} failed")
    return proc.stdout.strip()


def frameworks(only):
    """The table columns to measure (`--only` names them as the scripts do)."""
    if not only:
        return list(FRAMEWORKS)
    names = only.split(",")
    return [f for f in FRAMEWORKS if ONLY[f] in names]


def run_rounds(script, args, env, columns):
    """Each framework of `columns` in its own process, `args.rounds` times, the order
    rotating each round. Returns (title, {workload: {column: cell}}, notes): each cell
    the median over the rounds; notes from every framework's last process, then
    fflow/JAX round by round."""
    times = {}  # workload -> column -> seconds per round
    title, notes = None, {}
    for r in range(args.rounds):
        k = r % len(columns)
        for col in columns[k:] + columns[:k]:
            text = run_script(script, args, env, only=ONLY[col])
            title = title or text.splitlines()[0].lstrip("# ").strip()
            for workload, cells in parse_rows(text).items():
                t = _seconds(cells.get(col))
                times.setdefault(workload, {}).setdefault(col, [None] * args.rounds)[r] = t
            notes[col] = [n for n in text.splitlines()[1:] if n.strip() and n[0] not in "|#"]
    rows, per_round = merge_rounds(times)
    lines = [n for col in columns for n in notes.get(col, [])]
    if args.rounds > 1 and per_round:
        lines.append(
            f"fflow/jax in each of {args.rounds} rounds: "
            + "; ".join(f"{w}: {rs}" for w, rs in per_round.items())
            + "."
        )
    return title, rows, lines


def merge_rounds(times):
    """{workload: {column: [seconds or None per round]}} -> ({workload: {column: cell,
    "fflow/jax": ratio of the medians}}, {workload: "r1, r2, ..." fflow/jax per round})."""
    from common import fmt_time

    rows, per_round = {}, {}
    for workload, cols in times.items():
        medians = {}
        for col, ts in cols.items():
            ts = [t for t in ts if t is not None]
            if ts:
                medians[col] = statistics.median(ts)
        row = {col: fmt_time(t) for col, t in medians.items()}
        f, j = medians.get("fflow"), medians.get("jax.jit")
        row["fflow/jax"] = f"{f / j:.2f}×" if f and j else "n/a"
        rows[workload] = row
        pairs = zip(cols.get("fflow", []), cols.get("jax.jit", []))
        ratios = [f"{a / b:.2f}×" for a, b in pairs if a and b]
        if len(ratios) > 1:
            per_round[workload] = ", ".join(ratios)
    return rows, per_round


def plain_table(title, rows):
    """One Markdown table of merged rows (the columns of common.print_table)."""
    header = ["workload"] + FRAMEWORKS + ["fflow/jax", "fflow/torch", "fflow/numpy"]
    lines = [f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, row in rows.items():
        f = _seconds(row.get("fflow"))
        cells = [name] + [row.get(c, "n/a") for c in FRAMEWORKS]
        for other in ("jax.jit", "torch eager", "numpy"):
            o = _seconds(row.get(other))
            cells.append(f"{f / o:.2f}×" if f and o else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_rows(text):
    """{workload: {framework: cell}} from a table printed by common.print_table."""
    rows = {}
    header = None
    for line in text.splitlines():
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == "workload":
            header = cells
            continue
        if header is not None:
            rows[cells[0]] = dict(zip(header[1:], cells[1:]))
    return rows


def side_by_side(title, quiet, loaded, n):
    """One Markdown table: each framework quiet and loaded, and fflow/JAX in each."""
    header = ["workload"]
    header += [f"{f} quiet" for f in FRAMEWORKS] + ["fflow/jax quiet"]
    header += [f"{f} load {n}" for f in FRAMEWORKS] + ["fflow/jax load", "fflow load/quiet"]
    lines = [f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, q in quiet.items():
        l = loaded.get(name, {})
        cells = [name] + [q.get(f, "n/a") for f in FRAMEWORKS] + [q.get("fflow/jax", "n/a")]
        cells += [l.get(f, "n/a") for f in FRAMEWORKS] + [l.get("fflow/jax", "n/a")]
        tq, tl = _seconds(q.get("fflow")), _seconds(l.get("fflow"))
        cells.append(f"{tl / tq:.2f}×" if tq and tl else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _seconds(cell):
    if not cell or cell == "n/a":
        return None
    value, unit = cell.split()
    return float(value) * {"s": 1.0, "ms": 1e-3, "µs": 1e-6}[unit]


def time_example(example, hogs, reps, tiny):
    """Median wall time of `examples/<example>` quiet and with the hogs running."""
    cmd = [sys.executable, os.path.join(os.path.dirname(HERE), "examples", example)]
    if tiny:
        cmd.append("--tiny")
    times = {"quiet": [], "loaded": []}
    for _ in range(reps):
        for mode in ("quiet", "loaded"):
            (hogs.resume if mode == "loaded" else hogs.pause)()
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=os.path.dirname(cmd[1]))
            times[mode].append(time.perf_counter() - t0)
            if proc.returncode != 0:
                sys.stderr.write(proc.stderr)
                raise SystemExit(f"{example} failed")
    hogs.pause()
    q, l = sorted(times["quiet"])[reps // 2], sorted(times["loaded"])[reps // 2]
    n = len(hogs.procs)
    return "\n".join(
        [
            f"## examples/{example}: wall time quiet vs {n} busy processes",
            "",
            f"| workload | quiet | load {n} | load/quiet |",
            "|---|---|---|---|",
            f"| examples/{example} (median of {reps}) | {q:.2f} s | {l:.2f} s | {l / q:.2f}× |",
        ]
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--markdown", default=None, help="write the tables to this file")
    parser.add_argument("--only", default=None, help="frameworks subset, passed through")
    parser.add_argument("--scripts", default=None, help="comma-separated subset of scripts")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="limit every framework to N threads (BLAS, OpenMP, torch, XLA/Eigen)",
    )
    parser.add_argument("--load", type=int, default=0, help="N background CPU hogs")
    parser.add_argument(
        "--load-seconds", type=int, default=1800, help="the hogs end by themselves after this"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="processes per framework (medians over rounds)"
    )
    parser.add_argument("--example", default=None, help="also time examples/<EXAMPLE>")
    parser.add_argument("--example-reps", type=int, default=3)
    args = parser.parse_args()
    env = dict(os.environ)
    if args.threads:
        n = str(args.threads)
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = n
        env["XLA_FLAGS"] = (
            env.get("XLA_FLAGS", "")
            + (" --xla_cpu_multi_thread_eigen=false" if args.threads == 1 else "")
            + f" intra_op_parallelism_threads={n}"
        ).strip()
    scripts = args.scripts.split(",") if args.scripts else SCRIPTS
    hogs = Hogs(args.load, args.load_seconds) if args.load or args.example else None
    outputs = []
    started = time.strftime("%Y-%m-%d %H:%M")
    try:
        columns = frameworks(args.only)
        for script in scripts:
            title, quiet, quiet_notes = run_rounds(script, args, env, columns)
            if not args.load:
                table = plain_table(title, quiet)
                if quiet_notes:
                    table += "\n\n" + " ".join(quiet_notes)
                print(table, flush=True)
                outputs.append(table)
                continue
            hogs.resume()
            try:
                _, loaded, loaded_notes = run_rounds(script, args, env, columns)
            finally:
                hogs.pause()
            table = side_by_side(title, quiet, loaded, args.load)
            for label, notes in (("quiet", quiet_notes), (f"load {args.load}", loaded_notes)):
                if notes:
                    table += f"\n\n{label}: " + " ".join(notes)
            print(table, flush=True)
            outputs.append(table)
        if args.example:
            table = time_example(args.example, hogs, args.example_reps, args.tiny)
            print(table, flush=True)
            outputs.append(table)
    finally:
        if hogs is not None:
            hogs.stop()
    if args.markdown:
        load = os.getloadavg() if hasattr(os, "getloadavg") else None
        header = (
            "# Benchmarks\n\n"
            f"Measured by `python benchmarks/run_all.py` on {started} "
            f"UTC, {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
            f"Python {platform.python_version()}"
            + (f", load average {load[0]:.1f} at the end" if load else "")
            + (f", every framework limited to {args.threads} thread(s)" if args.threads else "")
            + (f", loaded columns beside {args.load} busy processes" if args.load else "")
            + f". Each framework in its own process, {args.rounds} round(s); medians "
            "after warm-up, then over the rounds; ratios are fflow time / other time "
            "(below 1 means fflow is faster).\n\n"
        )
        with open(args.markdown, "w") as f:
            f.write(header + "\n\n".join(outputs) + "\n")


if __name__ == "__main__":
    main()
