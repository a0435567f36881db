"""Compare two training runs: does the candidate's plateau lie inside the baseline's own noise band?

A run directory holds ``args.json`` (the run's settings) and ``train_log.tsv`` (one row per epoch,
tab-separated, a header row whose first column is ``epoch``, then one column per metric, e.g.
``train_loss`` and ``valid_loss``). ``examples/train_ddp.py`` writes both.

For each metric the *band* is the baseline's plateau mean ± k·sd, taken over the baseline's last
``plateau`` epochs (sample sd, ddof=1). The candidate passes a metric when its own mean over the
same epochs lies inside the band; it passes the comparison when it passes every metric.

The comparison is *refused* (:class:`ComparisonRefusedError`, CLI exit 1) instead of returning a
verdict whenever a verdict would mean nothing:

* ``k <= 0`` (or not finite), or a plateau shorter than 2 epochs (no sd);
* the two logs do not cover the same epochs (the candidate stopped early, ran longer, skipped or
  repeated an epoch);
* a cell in the plateau range is empty, NaN, infinite or not a number;
* the two ``args.json`` disagree on any setting that is not in :data:`IGNORED_ARGS`: then a
  difference in loss could be the setting's doing, not the data path's.

**Every** argument of the two ``args.json`` is compared (a key recorded by one run only is a
difference too). Only :data:`IGNORED_ARGS`, settings that cannot shift a loss, may differ:

* output paths (``save_dir``, ``out``, ...): where a run writes, not what it computes;
* experiment names and tracking labels (``exp_name``, ``notes``, ``wandb_*``, ...);
* the data-path arguments of the two data paths (npz lists ``train_set_list``/``npz_list``...,
  ``dataset_root``, keysets, selections, the loader's run record): comparing them is the point;
* loader worker counts other than the validation ones (``num_workers``, ``pin_mem``): they
  change throughput, not the batches; ``valid_num_workers`` (inheriting ``num_workers`` when
  unset) stays checked because it changes which samples a validation pass averages;
* logging, checkpoint and rendering cadence (``save_utd``, ``log_every``, ...) and the DDP
  rendezvous port.

``ignore_args`` adds names to that list, ``check_args`` takes names off it. The report lists every
difference, whether it was ignored and why.

**Strict mode** (:func:`compare_runs_strict`, ``compare-runs --strict``) is for a switch that
must change nothing, e.g. a loader with ``order="torch"`` against the DistributedSampler run it
replaces: the same settings check, then every cell of the two ``train_log.tsv`` (every column,
every epoch, as written) must be equal. It says "identical", or names each cell that differs.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ShardlakeError
from ..progress.bar import plural

__all__ = [
    "ArgDifference",
    "ComparisonRefusedError",
    "LOG_FILE",
    "_metrics_of",
    "_refuse_unignored",
    "compare_runs",
    "diff_args",
    "read_args",
    "read_log",
]


ARGS_FILE = "args.json"
LOG_FILE = "train_log.tsv"
EPOCH_COLUMN = "epoch"
DEFAULT_PLATEAU = 5
DEFAULT_K = 2.0

_OUTPUT = "output path: where the run writes, not what it computes"
_NAME = "experiment name / tracking label"
_DATA = "data-path argument: the two runs' data paths are what is being compared"
_WORKERS = "training-loader throughput setting (validation workers stay checked)"
_CADENCE = "logging / checkpoint / rendering cadence"
_RENDEZVOUS = "DDP rendezvous address"

# The documented allowlist: settings that cannot shift a loss, name -> why it may differ.
IGNORED_ARGS: dict[str, str] = {
    **dict.fromkeys(
        ("save_dir", "out", "out_dir", "output_dir", "log_dir", "run_dir", "checkpoint_dir"),
        _OUTPUT,
    ),
    **dict.fromkeys(
        ("exp_name", "run_name", "notes", "use_wandb", "wandb_run_id", "wandb_project_name"),
        _NAME,
    ),
    **dict.fromkeys(
        (
            "train_set_list",
            "valid_set_list",
            "npz_list",
            "valid_npz_list",
            "dataset_root",
            "dataset_version",
            "train_keyset",
            "valid_keyset",
            "train_where",
            "valid_where",
            "run_record",
            "data_path",
            "loader_order",
            "loader_engine",
            "train_subsample_step",
        ),
        _DATA,
    ),
    **dict.fromkeys(("num_workers", "train_num_workers", "pin_mem", "pin_memory"), _WORKERS),
    **dict.fromkeys(
        ("save_utd", "log_every", "log_interval", "print_freq", "save_every"), _CADENCE
    ),
    **dict.fromkeys(("closed_loop_draw_every", "closed_loop_fps"), _CADENCE),
    **dict.fromkeys(("port", "master_port", "master_addr"), _RENDEZVOUS),
}

NOT_RECORDED = "(not recorded)"


@dataclass(frozen=True)
class ArgDifference:
    """One argument on which the runs' ``args.json`` differ, and whether it was ignored."""

    name: str
    baseline: Any
    candidate: Any
    ignored: bool
    reason: str

    def describe(self) -> str:
        verdict = f"ignored: {self.reason}" if self.ignored else self.reason
        return (
            f"{self.name}: baseline {self.baseline!r} != candidate {self.candidate!r} ({verdict})"
        )


class ComparisonRefusedError(ShardlakeError, ValueError):
    """Two runs cannot be compared meaningfully; the message says why."""


@dataclass(frozen=True)
class RunLog:
    """A parsed ``train_log.tsv``: epochs in file order and every column as raw strings."""

    path: Path
    columns: tuple[str, ...]
    epochs: tuple[int, ...]
    rows: tuple[tuple[str, ...], ...]

    def cell(self, row: int, column: str) -> str:
        idx = self.columns.index(column)
        cells = self.rows[row]
        return cells[idx] if idx < len(cells) else ""


@dataclass
class MetricResult:
    metric: str
    baseline_mean: float
    baseline_sd: float
    band_low: float
    band_high: float
    candidate_mean: float
    candidate_sd: float
    passed: bool

    @property
    def z(self) -> float:
        """How many baseline sds the candidate's mean is away (inf when sd is 0 and they differ)."""
        diff = abs(self.candidate_mean - self.baseline_mean)
        if self.baseline_sd == 0:
            return 0.0 if diff == 0 else math.inf
        return diff / self.baseline_sd


@dataclass
class Comparison:
    baseline: str
    candidate: str
    plateau: int
    k: float
    epoch_first: int
    epoch_last: int
    baseline_rows: list[int]
    candidate_rows: list[int]
    checked_args: list[str]
    arg_differences: list[ArgDifference] = field(default_factory=list)
    metrics: list[MetricResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(m.passed for m in self.metrics)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["passed"] = self.passed
        for m, out in zip(self.metrics, doc["metrics"], strict=True):
            out["z"] = m.z if math.isfinite(m.z) else None
        return doc

    def report(self) -> str:
        """The human-readable table the CLI prints."""
        lines = [
            f"baseline:  {self.baseline}",
            f"candidate: {self.candidate}",
            f"plateau:   last {plural(self.plateau, 'epoch')} of the baseline: epochs "
            f"{self.epoch_first}..{self.epoch_last}; band = mean ± {self.k:g}·sd (sample sd)",
            f"rows used: baseline data rows {_ranges(self.baseline_rows)}, "
            f"candidate data rows {_ranges(self.candidate_rows)} (1 = first row after the header)",
            f"settings checked equal: {len(self.checked_args)} argument(s) of args.json",
            *(f"settings differ: {d.describe()}" for d in self.arg_differences),
            "",
            f"{'metric':<20} {'base mean':>12} {'base sd':>10} {'band low':>12} {'band high':>12} "
            f"{'cand mean':>12} {'cand sd':>10} {'|z|':>6}  verdict",
        ]
        for m in self.metrics:
            z = f"{m.z:.2f}" if math.isfinite(m.z) else "inf"
            lines.append(
                f"{m.metric:<20} {m.baseline_mean:>12.6g} {m.baseline_sd:>10.4g} "
                f"{m.band_low:>12.6g} {m.band_high:>12.6g} {m.candidate_mean:>12.6g} "
                f"{m.candidate_sd:>10.4g} {z:>6}  {'PASS' if m.passed else 'FAIL'}"
            )
        failed = [m.metric for m in self.metrics if not m.passed]
        lines.append("")
        if failed:
            lines.append(
                f"FAIL: candidate plateau mean outside the baseline band for {', '.join(failed)}"
            )
        else:
            lines.append(f"PASS: all {len(self.metrics)} metric(s) inside the baseline band")
        return "\n".join(lines)


def _ranges(rows: Sequence[int]) -> str:
    if not rows:
        return "(none)"
    return f"{rows[0]}..{rows[-1]}" if rows == list(range(rows[0], rows[-1] + 1)) else str(rows)


def read_args(run_dir: Path) -> dict[str, Any]:
    path = run_dir / ARGS_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ComparisonRefusedError(
            f"{path}: missing; without the run's settings the comparison cannot check that "
            "validation settings match"
        ) from None
    except (OSError, ValueError) as exc:
        raise ComparisonRefusedError(f"{path}: unreadable: {exc}") from None
    if not isinstance(doc, dict):
        raise ComparisonRefusedError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    return doc


def read_log(run_dir: Path) -> RunLog:
    path = run_dir / LOG_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ComparisonRefusedError(f"{path}: missing") from None
    except OSError as exc:
        raise ComparisonRefusedError(f"{path}: unreadable: {exc}") from None
    lines = [ln.rstrip("\r\n") for ln in text.splitlines()]
    # Trailing blank lines are harmless; a blank line between rows is an empty row (refused below).
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise ComparisonRefusedError(f"{path}: empty")
    columns = tuple(c.strip() for c in lines[0].split("\t"))
    if columns[0] != EPOCH_COLUMN:
        raise ComparisonRefusedError(
            f"{path}: the first header column must be {EPOCH_COLUMN!r}, got {columns[0]!r}"
        )
    if len(set(columns)) != len(columns):
        raise ComparisonRefusedError(f"{path}: duplicate column names in the header")
    epochs: list[int] = []
    rows: list[tuple[str, ...]] = []
    for lineno, line in enumerate(lines[1:], start=2):
        cells = tuple(c.strip() for c in line.split("\t"))
        try:
            epoch = int(cells[0])
        except ValueError:
            raise ComparisonRefusedError(
                f"{path}:{lineno}: epoch {cells[0]!r} is not an integer"
            ) from None
        if len(cells) > len(columns):
            raise ComparisonRefusedError(
                f"{path}:{lineno}: {len(cells)} cells but the header has {plural(len(columns), 'column')}"
            )
        epochs.append(epoch)
        rows.append(cells)
    if not rows:
        raise ComparisonRefusedError(f"{path}: no epoch rows after the header")
    return RunLog(path=path, columns=columns, epochs=tuple(epochs), rows=tuple(rows))


def effective_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """``args`` with inherited settings resolved (``valid_num_workers`` None → ``num_workers``,
    ``valid_batch_size`` None → ``batch_size``)."""
    out = dict(args)
    for valid, train in (("valid_num_workers", "num_workers"), ("valid_batch_size", "batch_size")):
        if out.get(valid) is None and train in out:
            out[valid] = out[train]
    return out


def diff_args(
    baseline: Mapping[str, Any],
    candidate: Mapping[str, Any],
    *,
    ignore_args: Iterable[str] = (),
    check_args: Iterable[str] = (),
) -> tuple[list[str], list[ArgDifference]]:
    """Compare every argument: ``(names checked equal, differences)``.

    A difference is ignored when its name is in :data:`IGNORED_ARGS` or ``ignore_args`` and not
    in ``check_args``.
    """
    base, cand = effective_args(baseline), effective_args(candidate)
    extra_ignored, checked_anyway = set(ignore_args), set(check_args)
    equal: list[str] = []
    differences: list[ArgDifference] = []
    for name in sorted(set(base) | set(cand)):
        b, c = base.get(name, NOT_RECORDED), cand.get(name, NOT_RECORDED)
        if name in checked_anyway:
            ignored, reason = False, "checked by --check-arg; may shift the losses"
        elif name in extra_ignored:
            ignored, reason = True, "--ignore-arg"
        elif name in IGNORED_ARGS:
            ignored, reason = True, IGNORED_ARGS[name]
        else:
            ignored, reason = False, "may shift the losses"
        if b == c and name in base and name in cand:
            if not ignored:
                equal.append(name)
            continue
        differences.append(ArgDifference(name, b, c, ignored, reason))
    return equal, differences


def _refuse_unignored(differences: Sequence[ArgDifference]) -> None:
    """Raise :class:`ComparisonRefusedError` when a difference of :func:`diff_args` is not
    ignored."""
    problems = [d for d in differences if not d.ignored]
    if problems:
        ignored = len(differences) - len(problems)
        raise ComparisonRefusedError(
            "the runs disagree on settings that may shift the losses themselves, so a loss "
            "difference could be theirs, not the data path's: "
            + "; ".join(_short(d) for d in problems)
            + (
                f" ({plural(ignored, 'other difference')} ignored as unable to shift a loss)"
                if ignored
                else ""
            )
            + ". If a setting truly cannot shift the loss, pass --ignore-arg NAME"
        )


def _short(d: ArgDifference) -> str:
    if d.baseline is NOT_RECORDED or d.candidate is NOT_RECORDED:
        have, lack = (
            ("baseline", "candidate") if d.candidate is NOT_RECORDED else ("candidate", "baseline")
        )
        value = d.baseline if d.candidate is NOT_RECORDED else d.candidate
        return f"{d.name}: {have} has {value!r}, {lack} does not record it"
    return f"{d.name}: baseline {d.baseline!r} != candidate {d.candidate!r}"


def _numeric(log: RunLog, row: int, column: str) -> float:
    raw = log.cell(row, column)
    where = f"{log.path}: epoch {log.epochs[row]}, column {column!r}"
    if raw == "":
        raise ComparisonRefusedError(f"{where}: empty cell")
    try:
        value = float(raw)
    except ValueError:
        raise ComparisonRefusedError(f"{where}: {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise ComparisonRefusedError(f"{where}: {raw!r} is not a finite number")
    return value


def default_metrics(columns: Sequence[str]) -> list[str]:
    """Every loss column: the numbers the comparison is about (timings and counts are not)."""
    return [c for c in columns[1:] if "loss" in c]


def compare_runs(
    baseline_dir: str | Path,
    candidate_dir: str | Path,
    *,
    plateau: int = DEFAULT_PLATEAU,
    k: float = DEFAULT_K,
    metrics: Sequence[str] | None = None,
    ignore_args: Sequence[str] = (),
    check_args: Sequence[str] = (),
) -> Comparison:
    """Compare ``candidate_dir`` against ``baseline_dir``; refuse when it would mean nothing.

    Every argument of the two ``args.json`` must be equal except those in :data:`IGNORED_ARGS`
    or ``ignore_args`` (and not in ``check_args``); see the module docs.
    """
    _check_band(plateau, k)
    bdir, cdir = Path(baseline_dir), Path(candidate_dir)
    for d in (bdir, cdir):
        if not d.is_dir():
            raise ComparisonRefusedError(f"{d}: not a directory")
    checked, differences = diff_args(
        read_args(bdir), read_args(cdir), ignore_args=ignore_args, check_args=check_args
    )
    _refuse_unignored(differences)
    blog, clog = read_log(bdir), read_log(cdir)
    window = _plateau_window(blog, clog, plateau)
    metrics = _metrics_of(blog, clog, metrics)
    b_rows = [blog.epochs.index(e) for e in window]
    c_rows = [clog.epochs.index(e) for e in window]
    result = Comparison(
        baseline=str(bdir),
        candidate=str(cdir),
        plateau=plateau,
        k=k,
        epoch_first=window[0],
        epoch_last=window[-1],
        baseline_rows=[r + 1 for r in b_rows],
        candidate_rows=[r + 1 for r in c_rows],
        checked_args=checked,
        arg_differences=differences,
    )
    for m in metrics:
        bvals = [_numeric(blog, r, m) for r in b_rows]
        cvals = [_numeric(clog, r, m) for r in c_rows]
        result.metrics.append(_metric_result(m, bvals, cvals, k))
    return result


def _check_band(plateau: int, k: float) -> None:
    if not math.isfinite(k) or k <= 0:
        raise ComparisonRefusedError(f"--k must be a positive number, got {k:g}")
    if plateau < 2:
        raise ComparisonRefusedError(
            f"--plateau must be at least 2 epochs (a standard deviation needs two), got {plateau}"
        )


def _plateau_window(blog: RunLog, clog: RunLog, plateau: int) -> list[int]:
    """The last ``plateau`` epochs, refused unless both logs cover the same, unique, increasing
    epochs and the window is consecutive."""
    for log in (blog, clog):
        dups = sorted({e for e in log.epochs if log.epochs.count(e) > 1})
        if dups:
            raise ComparisonRefusedError(
                f"{log.path}: epoch(s) {dups} appear more than once (a resumed run appended rows?)"
            )
    if list(blog.epochs) != sorted(blog.epochs) or list(clog.epochs) != sorted(clog.epochs):
        raise ComparisonRefusedError("epochs must be in increasing order in both logs")
    if set(blog.epochs) != set(clog.epochs):
        missing = sorted(set(blog.epochs) - set(clog.epochs))
        extra = sorted(set(clog.epochs) - set(blog.epochs))
        parts = []
        if missing:
            parts.append(f"candidate lacks epoch(s) {missing}")
        if extra:
            parts.append(f"candidate has extra epoch(s) {extra}")
        raise ComparisonRefusedError(
            "epoch coverage differs: " + "; ".join(parts) + f" (baseline {blog.path}: "
            f"{plural(len(blog.epochs), 'row')}, candidate {clog.path}: {plural(len(clog.epochs), 'row')})"
        )
    if len(blog.epochs) < plateau:
        raise ComparisonRefusedError(
            f"--plateau {plateau} needs {plural(plateau, 'epoch')} but the baseline has {len(blog.epochs)}"
        )
    window = list(blog.epochs[-plateau:])
    if window != list(range(window[0], window[0] + plateau)):
        raise ComparisonRefusedError(
            f"the plateau epochs {window} are not consecutive: both runs skip an epoch there"
        )
    return window


def _metrics_of(blog: RunLog, clog: RunLog, metrics: Sequence[str] | None) -> list[str]:
    """The metrics asked for (default: every loss column), refused unless both logs have them."""
    if metrics is None or len(metrics) == 0:
        metrics = default_metrics(blog.columns)
        if not metrics:
            raise ComparisonRefusedError(
                f"{blog.path}: no loss columns; name the metrics with --metric"
            )
    for m in metrics:
        for log in (blog, clog):
            if m not in log.columns[1:]:
                raise ComparisonRefusedError(
                    f"{log.path}: no column {m!r} (columns: {', '.join(log.columns[1:])})"
                )
    return list(metrics)


def _metric_result(metric: str, bvals: list[float], cvals: list[float], k: float) -> MetricResult:
    """Whether the candidate's plateau mean lies within ``k`` baseline SDs of the baseline's."""
    bmean, bsd = statistics.fmean(bvals), statistics.stdev(bvals)
    cmean, csd = statistics.fmean(cvals), statistics.stdev(cvals)
    low, high = bmean - k * bsd, bmean + k * bsd
    return MetricResult(
        metric=metric,
        baseline_mean=bmean,
        baseline_sd=bsd,
        band_low=low,
        band_high=high,
        candidate_mean=cmean,
        candidate_sd=csd,
        passed=low <= cmean <= high,
    )
