"""tfgpu/_internal/helpers/processes.py: children that die with their parent, however it ends.

Real processes: a parent that starts a child, then is killed with SIGKILL (it runs no code
after that); the child must end, by Linux's parent-death signal or by its own check of its
parent (as on a POSIX system without the signal). Each waits for an outcome, never a time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [
    pytest.mark.slow,  # spawns processes
    pytest.mark.skipif(os.name != "posix", reason="parent-death handling: POSIX"),
]


def ended(pid: int) -> bool:
    """Whether process `pid` has ended: gone, or a zombie nobody reaps (as under a container's
    init that does not reap) whose other threads have all exited too."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state == "Z" and len(os.listdir(f"/proc/{pid}/task")) <= 1
    except (OSError, IndexError):
        return False


def ended_within(pid: int, polls: int = 1200) -> bool:
    """Whether `pid` ends within `polls` checks, 50 ms apart (a bound for a failure, not a
    timing claim)."""
    for _ in range(polls):
        if ended(pid):
            return True
        time.sleep(0.05)
    return False


def _wait_for(path: Path, proc: subprocess.Popen, polls: int = 1200) -> None:
    for _ in range(polls):
        if path.exists() or proc.poll() is not None:
            break
        time.sleep(0.05)
    assert path.exists(), f"{path.name} never written (exit status {proc.poll()})"


_CHILD = """
import os, sys, time
from tfgpu._internal.helpers import processes
if sys.argv[2] == "watch":  # as on a POSIX system without Linux's parent-death signal
    processes._parent_death_signal = lambda: False
    processes._WATCH_INTERVAL_S = 0.05
processes.die_with_parent(os.getppid())
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""

_PARENT = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", *sys.argv[1:]])
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["death signal", "watch"])
def test_a_child_ends_when_its_parent_is_killed(tmp_path, how):
    pid_file = tmp_path / "child.pid"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, _CHILD, str(pid_file), how.split()[0]], env=env
    )
    child = None
    try:
        _wait_for(pid_file, parent)
        child = int(pid_file.read_text())
        assert not ended(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert ended_within(child)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child is not None and not ended(child):
            os.kill(child, signal.SIGKILL)


def test_a_child_whose_parent_is_already_gone_ends_at_once():
    code = (
        "import os; from tfgpu._internal.helpers.processes import die_with_parent; "
        "die_with_parent(os.getppid() + 1); print('still running')"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1 and "still running" not in proc.stdout, proc.stderr
