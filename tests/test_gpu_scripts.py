"""The GPU check's shell scripts parse (they run only on a GPU machine, or with the internet for the payload)."""
import shutil
import subprocess
from pathlib import Path

import pytest

BENCH = Path(__file__).parent.parent / "bench"


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash here")
@pytest.mark.parametrize("script", ["gpu_check.sh", "gpu_prepare.sh", "gpu_device.sh"])
def test_script_parses(script):
    done = subprocess.run(["bash", "-n", str(BENCH / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
