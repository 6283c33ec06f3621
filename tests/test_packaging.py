"""One distribution; the folders install under mnemoflow.*; the .avsc files ship in the wheel."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_the_schemas_and_no_bare_top_level_packages(tmp_path) -> None:
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps",
                            "--no-build-isolation", "-w", str(tmp_path), str(ROOT)], check=True,
                           capture_output=True, text=True)
    # setuptools warns (about 35 lines each) for data folders missing from `packages`
    assert "absent from the `packages` configuration" not in build.stdout + build.stderr
    (wheel,) = tmp_path.glob("mnemoflow-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("mnemoflow-")}
    assert tops == {"mnemoflow"}  # never bare `agents`, `streams`, ...
    avsc = {Path(n).name for n in names if n.endswith(".avsc")}
    shipped = {p.name for p in (ROOT / "schemas").rglob("*.avsc")}
    assert avsc == shipped
    assert len(avsc) == 21
    assert "mnemoflow/agents/tuning.json" in names
    pages = {Path(n).name for n in names if n.startswith("mnemoflow/streams/console_templates/")}
    assert pages == {p.name for p in (ROOT / "streams" / "console_templates").glob("*.html")}
    assert any(n.endswith("entry_points.txt") for n in names)
