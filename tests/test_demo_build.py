"""The demo model's build script still runs end to end (a few training steps, then the evaluation)."""
import subprocess
import sys
from pathlib import Path

from model import MetaModel

ROOT = Path(__file__).resolve().parent.parent


def test_build_script_quick_mode_still_runs(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "assets" / "build_demo_model.py"), "--quick",
                             "--out", str(tmp_path / "demo")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| arithmetic |" in result.stdout
    assert MetaModel.from_pretrained(str(tmp_path / "demo"), with_visual=True).sees_images
