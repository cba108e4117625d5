"""Prediction files are named after their samples: a sign or an equals sign is kept (``aoa+02``
stays ``aoa+02.vtu``, it used to become ``aoa_02``), and --force recognises such files as its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshshard.run._pred_folder import check_prediction_folder, file_stem


@pytest.mark.parametrize(("name", "stem"), [
    ("aoa+02", "aoa+02"), ("aoa-02", "aoa-02"), ("case 0 (Re=1e5)", "case_0_Re=1e5"), ("user@host", "user@host"),
    ("../../etc/passwd", "etc_passwd"), ("..", "sample"), ("a/b\\c", "a_b_c"), ("π-case", "case"),
])
def test_file_stems(name: str, stem: str) -> None:
    assert file_stem(name) == stem


def test_force_replaces_files_named_with_a_sign(tmp_path: Path) -> None:
    (tmp_path / "aoa+02.vtu").write_text("x")
    (tmp_path / "aoa+02.png").write_text("x")
    (tmp_path / "metrics.json").write_text(json.dumps({"format": "meshshard-predictions", "samples": [],
                                                       "files": ["aoa+02.vtu", "aoa+02.png"], "complete": True}))
    assert {p.name for p in check_prediction_folder(tmp_path, force=True)} == {"aoa+02.vtu", "aoa+02.png",
                                                                              "metrics.json"}
