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
* the two ``args.json`` disagree on a setting that shifts the losses themselves (validation worker
  count, batch sizes, world size, model, optimizer, epochs, ...): then a difference in loss could be
  the setting's doing, not the data path's.
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

ARGS_FILE = "args.json"
LOG_FILE = "train_log.tsv"
EPOCH_COLUMN = "epoch"
DEFAULT_PLATEAU = 5
DEFAULT_K = 2.0

# Settings that change what a loss *is* (which samples are averaged, in which batches, by which
# model), so two runs disagreeing on any of them cannot be compared. Data-path settings
# (dataset root, npz list, keyset names, train worker count) are deliberately absent: comparing
# data paths is the point.
LOSS_SHIFTING_ARGS: tuple[str, ...] = (
    "valid_num_workers",
    "valid_batch_size",
    "valid_samples",
    "train_samples",
    "batch_size",
    "world_size",
    "epochs",
    "max_steps",
    "model",
    "hidden",
    "lr",
    "weight_decay",
    "optimizer",
    "loss",
    "inputs",
    "targets",
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
            f"plateau:   last {self.plateau} epochs of the baseline: epochs "
            f"{self.epoch_first}..{self.epoch_last}; band = mean ± {self.k:g}·sd (sample sd)",
            f"rows used: baseline data rows {_ranges(self.baseline_rows)}, "
            f"candidate data rows {_ranges(self.candidate_rows)} (1 = first row after the header)",
            f"settings checked equal: {', '.join(self.checked_args) or '(none present)'}",
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
                f"{path}:{lineno}: {len(cells)} cells but the header has {len(columns)} columns"
            )
        epochs.append(epoch)
        rows.append(cells)
    if not rows:
        raise ComparisonRefusedError(f"{path}: no epoch rows after the header")
    return RunLog(path=path, columns=columns, epochs=tuple(epochs), rows=tuple(rows))


def effective_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """``args`` with inherited settings resolved (``valid_num_workers`` None → ``num_workers``)."""
    out = dict(args)
    if out.get("valid_num_workers") is None and "num_workers" in out:
        out["valid_num_workers"] = out["num_workers"]
    return out


def check_args(
    baseline: Mapping[str, Any],
    candidate: Mapping[str, Any],
    keys: Iterable[str],
) -> list[str]:
    """Refuse when the two runs disagree on any of ``keys``; return the keys compared."""
    base, cand = effective_args(baseline), effective_args(candidate)
    checked, problems = [], []
    for key in keys:
        in_b, in_c = key in base, key in cand
        if not in_b and not in_c:
            continue
        checked.append(key)
        if not in_b or not in_c:
            have, lack = ("baseline", "candidate") if in_b else ("candidate", "baseline")
            value = base[key] if in_b else cand[key]
            problems.append(f"{key}: {have} has {value!r}, {lack} does not record it")
        elif base[key] != cand[key]:
            problems.append(f"{key}: baseline {base[key]!r} != candidate {cand[key]!r}")
    if problems:
        raise ComparisonRefusedError(
            "the runs disagree on settings that shift the losses themselves, so a loss difference "
            "could be theirs, not the data path's: " + "; ".join(problems)
        )
    return checked


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
    check_keys: Sequence[str] = LOSS_SHIFTING_ARGS,
) -> Comparison:
    """Compare ``candidate_dir`` against ``baseline_dir``; refuse when it would mean nothing."""
    if not math.isfinite(k) or k <= 0:
        raise ComparisonRefusedError(f"--k must be a positive number, got {k:g}")
    if plateau < 2:
        raise ComparisonRefusedError(
            f"--plateau must be at least 2 epochs (a standard deviation needs two), got {plateau}"
        )
    bdir, cdir = Path(baseline_dir), Path(candidate_dir)
    for d in (bdir, cdir):
        if not d.is_dir():
            raise ComparisonRefusedError(f"{d}: not a directory")
    checked = check_args(read_args(bdir), read_args(cdir), check_keys)
    blog, clog = read_log(bdir), read_log(cdir)

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
            f"{len(blog.epochs)} rows, candidate {clog.path}: {len(clog.epochs)} rows)"
        )
    if len(blog.epochs) < plateau:
        raise ComparisonRefusedError(
            f"--plateau {plateau} needs {plateau} epochs but the baseline has {len(blog.epochs)}"
        )
    window = blog.epochs[-plateau:]
    if list(window) != list(range(window[0], window[0] + plateau)):
        raise ComparisonRefusedError(
            f"the plateau epochs {list(window)} are not consecutive: both runs skip an epoch there"
        )

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
    )
    for m in metrics:
        bvals = [_numeric(blog, r, m) for r in b_rows]
        cvals = [_numeric(clog, r, m) for r in c_rows]
        bmean, bsd = statistics.fmean(bvals), statistics.stdev(bvals)
        cmean, csd = statistics.fmean(cvals), statistics.stdev(cvals)
        low, high = bmean - k * bsd, bmean + k * bsd
        result.metrics.append(
            MetricResult(
                metric=m,
                baseline_mean=bmean,
                baseline_sd=bsd,
                band_low=low,
                band_high=high,
                candidate_mean=cmean,
                candidate_sd=csd,
                passed=low <= cmean <= high,
            )
        )
    return result
