"""A Ctrl-C that lands while the last task's result is taken is not lost (a whole-suite run
saw ``import-wds`` publish and exit 0 after its Ctrl-C)."""

from __future__ import annotations

import signal
import threading

import pytest

from shardlake.executors.tasks import Task, run_tasks
from shardlake.progress.bar import Progress


class CtrlCOnLastUpdate(Progress):
    """Progress whose count of the last task comes with a Ctrl-C: the signal lands after the
    wait loop's last look at it, with nothing left pending."""

    def update(self, n: int = 1, *, groups: int = 0) -> None:
        super().update(n, groups=groups)
        signal.raise_signal(signal.SIGINT)


@pytest.mark.parametrize("executor", ["thread", "inline"])
def test_a_ctrl_c_as_the_last_task_ends_interrupts_the_run(executor: str) -> None:
    assert threading.current_thread() is threading.main_thread()
    progress = CtrlCOnLastUpdate(1, "test", unit="tasks", enabled=False)
    with pytest.raises(KeyboardInterrupt):
        run_tasks([Task("last", str, (1,))], executor, 1, progress)
