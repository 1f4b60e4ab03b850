"""The `gcompile` command: help works in-process and, where gcompile is installed, as a console script."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gcompile.cli import COMMANDS, main


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: gcompile")
    for name in COMMANDS:
        assert f"    {name} " in out


def test_data_needs_a_dataset(capsys):
    with pytest.raises(SystemExit) as done:
        main(["data"])
    assert done.value.code == 2
    assert "required: DATASET" in capsys.readouterr().err


def installed_command():
    beside_python = Path(sys.executable).parent / "gcompile"
    return str(beside_python) if beside_python.exists() else shutil.which("gcompile")


def test_installed_console_script(tmp_path):
    command = installed_command()
    if command is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("CI installs gcompile, so the `gcompile` command must exist")
        pytest.skip("gcompile is not installed (make install)")
    done = subprocess.run([command, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "data" in done.stdout and "usage: gcompile" in done.stdout
