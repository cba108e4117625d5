"""``meshshard dataset`` under torchrun: the options a distributed dataset does not take are refused
in one line, by the first process alone (the run itself: tests/comm/test_dataset_ranks.py and the
block of docs/partition.md)."""

from __future__ import annotations

import pytest

from meshshard.cli import main


@pytest.mark.parametrize("option", [["--mean-field"], ["--graph", "knn:4"], ["--collapse-2d"], ["--same-mesh"],
                                    ["--state", "u"], ["--target-scale", "p=2"]])
def test_options_of_one_process_are_refused_under_torchrun(option: list[str], monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    argv = ["dataset", "a.vtkhdf", "--inputs", "pos", "--targets", "T", "--out", str(tmp_path / "d"), *option]
    assert main(argv) == 2
    flag = option[0]
    assert capsys.readouterr().err == (f"meshshard dataset: error: {flag} is not taken by a distributed dataset (run "
                                       "meshshard dataset in one process); under torchrun: --inputs, --targets, "
                                       "--params, --val-fraction, --val-samples, --dtype, --force\n")
    monkeypatch.setenv("RANK", "1")  # the other processes exit alike, silently
    assert main(argv) == 2
    assert capsys.readouterr().err == ""
    assert not (tmp_path / "d").exists()
