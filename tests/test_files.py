"""Files written under a temporary name and renamed: the content whole or the old file, and the mode of any new
file, whatever the writer (safetensors creates its files readable by their owner only)."""
import os
import stat

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec.files import write_atomic, write_text_atomic


def umask_mode() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def test_a_safetensors_file_and_a_text_file_get_the_mode_of_any_new_file(tmp_path):
    write_atomic(tmp_path / "t.safetensors", lambda tmp: save_file({"a": torch.arange(3.0)}, str(tmp)))
    write_text_atomic(tmp_path / "c.json", "{}")
    with open(tmp_path / "plain", "w") as f:  # what open() gives under this umask
        f.write("x")
    for name in ("t.safetensors", "c.json", "plain"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == umask_mode(), name
    assert torch.equal(load_file(str(tmp_path / "t.safetensors"))["a"], torch.arange(3.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json", "plain", "t.safetensors"]  # no temporary left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    write_text_atomic(tmp_path / "c.json", "old")

    def failing(tmp):
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(tmp_path / "c.json", failing)
    assert (tmp_path / "c.json").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]
