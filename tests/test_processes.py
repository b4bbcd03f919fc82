"""tfgpu/_internal/helpers/processes.py: children that die with their parent, however it ends,
and `run_python`, which ends a child with what it started.

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
from tfgpu._internal.helpers.processes import run_python

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


def _kill_the_parent_and_see_the_child_end(
    parent: subprocess.Popen, pid_file: Path, polls: int = 1200
) -> None:
    """Once the child wrote its pid to `pid_file`, SIGKILLs `parent` and asserts the child
    ends too; neither outlives the test."""
    child = None
    try:
        _wait_for(pid_file, parent, polls=polls)
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
    _kill_the_parent_and_see_the_child_end(parent, pid_file)


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


def test_run_python_returns_the_status_and_what_the_child_wrote():
    code = (
        "import sys; print('out', repr(sys.stdin.read())); print('err', file=sys.stderr); "
        "sys.exit(3)"
    )
    assert run_python(["-c", code], os.environ, 120.0) == (3, "out ''\n", "err\n")


def test_run_python_hands_stdout_lines_to_on_line_as_they_come():
    lines: list[str] = []
    code = "print('one'); print('two', flush=True); print('three', end='')"
    status, out, _ = run_python(["-c", code], os.environ, 120.0, lines.append)
    assert (status, lines, out) == (0, ["one\n", "two\n", "three"], "one\ntwo\nthree")


# Starts a process of its own, prints both pids, and waits.
_STARTS_ONE = """
import os, subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(os.getpid(), helper.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("on_line", [False, True], ids=["files", "on_line"])
def test_a_child_past_its_timeout_is_ended_with_what_it_started(on_line):
    lines: list[str] = []
    status, out, _ = run_python(
        ["-c", _STARTS_ONE], os.environ, 5.0, lines.append if on_line else None
    )
    assert status is None  # timed out
    if on_line:
        assert lines == [out]
    child, helper = map(int, out.split())
    assert ended(child) and ended_within(helper)  # the group is killed before run_python returns


class _Stop(Exception):
    pass


@pytest.mark.parametrize("error", [KeyboardInterrupt, _Stop])
def test_an_exception_in_the_wait_ends_the_child_with_what_it_started(error):
    pids: list[int] = []

    def stop(line: str) -> None:
        pids.extend(map(int, line.split()))
        raise error

    with pytest.raises(error):
        run_python(["-c", _STARTS_ONE], os.environ, None, stop)
    child, helper = pids
    assert ended(child) and ended_within(helper)


# A custom layer in an importable module; in find_batch_size's child (which imports the modules
# of the model's classes) the module writes the child's pid and waits.
_WAITS = """
import os, time
import keras

@keras.saving.register_keras_serializable("tfgpu_tests")
class Waits(keras.layers.Layer):
    def call(self, x):
        return x

if os.environ.get("TFGPU_TEST_PID_FILE"):
    path = os.environ["TFGPU_TEST_PID_FILE"]
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    time.sleep(600)
"""

_FINDER = """
import os, sys
import numpy as np
import keras
import tfgpu
import waits  # imported before the variable is set: only the child waits

model = keras.Sequential([keras.Input((4,)), waits.Waits(), keras.layers.Dense(1)])
model.compile("sgd", "mse")
os.environ["TFGPU_TEST_PID_FILE"] = sys.argv[1]
x, y = np.zeros((64, 4), "float32"), np.zeros((64, 1), "float32")
tfgpu.find_batch_size(model, (x, y), in_subprocess=True, verbose=0)
"""


def test_the_find_batch_size_child_ends_when_its_parent_is_killed(tmp_path):
    (tmp_path / "waits.py").write_text(_WAITS)
    pid_file = tmp_path / "child.pid"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)]),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    with open(tmp_path / "parent.log", "wb") as log:
        parent = subprocess.Popen(
            [sys.executable, "-c", _FINDER, str(pid_file)], env=env, stdout=log, stderr=log
        )
    # both processes import TensorFlow first; the death signal ends the child: the parent
    # runs no code once killed
    _kill_the_parent_and_see_the_child_end(parent, pid_file, polls=3600)
