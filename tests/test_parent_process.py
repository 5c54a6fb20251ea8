"""A process started with its parent named in SPECDEC_PARENT_PID ends soon after that parent dies, however it dies
(SIGKILL included), and only then: what keeps a benchmark's server from outliving the benchmark."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdec.errors import ConfigError
from specdec.parent_process import PARENT_PID_ENV, exit_with_parent

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")

ROOT = Path(__file__).resolve().parents[1]
# the middle process starts a child that names it as its parent, prints the child's id, then waits to be killed
MIDDLE = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env={**os.environ, "%s": str(os.getpid())})
print(child.pid, flush=True)
time.sleep(600)
""" % PARENT_PID_ENV


def ended(pid: int) -> bool:
    """Whether process `pid` has exited (gone, or a zombie nobody has reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def wait_ended(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ended(pid):
            return True
        time.sleep(0.1)
    return ended(pid)


def start_script(*argv: str) -> tuple[subprocess.Popen, int]:
    """`python -c argv...` from the repository, and the process id its first line of output names."""
    process = subprocess.Popen([sys.executable, "-c", *argv], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
    return process, int(process.stdout.readline())


def kill_left(*pids: int) -> None:
    for pid in pids:
        if not ended(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_child_ends_soon_after_its_parent_is_killed_and_not_before():
    middle, child = start_script(MIDDLE, "import time\nfrom specdec.parent_process import exit_with_parent\n"
                                 "exit_with_parent(poll_s=0.1)\ntime.sleep(600)")
    try:
        assert not wait_ended(child, 2.0)  # its parent lives: it keeps running
        middle.send_signal(signal.SIGKILL)
        middle.wait()
        assert wait_ended(child, 10.0)
    finally:
        kill_left(middle.pid, child)


def test_a_child_without_the_variable_is_not_watched():
    assert exit_with_parent({}) is None
    assert exit_with_parent({PARENT_PID_ENV: ""}) is None


def test_a_malformed_parent_id_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=f"{PARENT_PID_ENV} must be a process id"):
        exit_with_parent({PARENT_PID_ENV: "12ab"})


def test_a_server_started_by_server_process_ends_with_the_process_that_started_it(tiny_folder):
    pytest.importorskip("fastapi")
    code = (
        "import time\nfrom specdec.benchmarks.server_process import ServerProcess\n"
        f"server = ServerProcess(['--model', {str(tiny_folder)!r}, '--dtype', 'float32', '--threads', '1']).start()\n"
        "print(server.proc.pid, flush=True)\ntime.sleep(600)"
    )
    starter, server = start_script(code)
    try:
        assert not ended(server)
        starter.send_signal(signal.SIGKILL)  # no clean-up of its own runs
        starter.wait()
        assert wait_ended(server, 30.0)  # drained (nothing in flight) and exited
    finally:
        kill_left(starter.pid, server)
