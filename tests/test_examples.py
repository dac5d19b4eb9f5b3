"""The runnable examples run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ledger_example_lands_every_charge_once_under_kills() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples/ledger/run.py"), "--orders", "150", "--workers", "3",
         "--kills", "5"],
        capture_output=True, text=True, timeout=240, check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "doubles=0 lost=0" in out.stdout and "kills=5" in out.stdout
