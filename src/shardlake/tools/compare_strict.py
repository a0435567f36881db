"""``compare-runs --strict``: two runs' logs equal cell by cell (a bit-for-bit reproduction),
after the same argument check as the banded comparison.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..progress.bar import plural
from .compare_runs import (
    LOG_FILE,
    ArgDifference,
    ComparisonRefusedError,
    _metrics_of,
    _refuse_unignored,
    diff_args,
    read_args,
    read_log,
)

__all__ = ["StrictComparison", "compare_runs_strict"]


@dataclass
class CellDifference:
    epoch: int
    column: str
    baseline: str
    candidate: str


@dataclass
class StrictComparison:
    """Whether two runs' ``train_log.tsv`` are equal cell for cell (see the module docs)."""

    baseline: str
    candidate: str
    columns: list[str]
    epochs: list[int]
    checked_args: list[str]
    arg_differences: list[ArgDifference] = field(default_factory=list)
    differences: list[CellDifference] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.differences

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["identical"] = doc["passed"] = self.passed
        return doc

    def report(self) -> str:
        lines = [
            f"baseline:  {self.baseline}",
            f"candidate: {self.candidate}",
            f"settings checked equal: {len(self.checked_args)} argument(s) of args.json",
            *(f"settings differ: {d.describe()}" for d in self.arg_differences),
            f"compared: {plural(len(self.epochs), 'epoch row')} x {plural(len(self.columns), 'column')} of "
            f"{LOG_FILE}, as written",
        ]
        shown = self.differences[:20]
        lines += [
            f"differs: epoch {d.epoch}, {d.column}: baseline {d.baseline} != candidate {d.candidate}"
            for d in shown
        ]
        if len(self.differences) > len(shown):
            lines.append(f"... and {plural(len(self.differences) - len(shown), 'more cell')}")
        lines.append("")
        if self.passed:
            lines.append(f"identical: every cell of the two {LOG_FILE} is equal")
        else:
            lines.append(f"DIFFERENT: {len(self.differences)} cell(s) of {LOG_FILE} differ")
        return "\n".join(lines)


def compare_runs_strict(
    baseline_dir: str | Path,
    candidate_dir: str | Path,
    *,
    metrics: Sequence[str] | None = None,
    ignore_args: Sequence[str] = (),
    check_args: Sequence[str] = (),
) -> StrictComparison:
    """Compare two runs cell for cell (every column, or ``metrics``); refused as
    :func:`compare_runs` is when their settings differ, or when the logs' epochs or columns
    differ (nothing to compare cell by cell)."""
    bdir, cdir = Path(baseline_dir), Path(candidate_dir)
    for d in (bdir, cdir):
        if not d.is_dir():
            raise ComparisonRefusedError(f"{d}: not a directory")
    checked, arg_differences = diff_args(
        read_args(bdir), read_args(cdir), ignore_args=ignore_args, check_args=check_args
    )
    _refuse_unignored(arg_differences)
    blog, clog = read_log(bdir), read_log(cdir)
    if not metrics and blog.columns != clog.columns:
        raise ComparisonRefusedError(
            f"the logs' columns differ: baseline {', '.join(blog.columns)}; candidate "
            f"{', '.join(clog.columns)}"
        )
    if blog.epochs != clog.epochs:
        raise ComparisonRefusedError(
            f"the logs' epochs differ: baseline {list(blog.epochs)}, candidate {list(clog.epochs)}"
        )
    columns = _metrics_of(blog, clog, metrics) if metrics else list(blog.columns[1:])
    result = StrictComparison(
        baseline=str(bdir),
        candidate=str(cdir),
        columns=columns,
        epochs=list(blog.epochs),
        checked_args=checked,
        arg_differences=arg_differences,
    )
    for row, epoch in enumerate(blog.epochs):
        for column in columns:
            b, c = blog.cell(row, column), clog.cell(row, column)
            if b != c:
                result.differences.append(CellDifference(epoch, column, b, c))
    return result
