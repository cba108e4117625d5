"""The table of folder kinds: one marker file each, taken from the format that owns it."""

from __future__ import annotations

from pathlib import Path

from meshshard.data import FOLDER_KINDS, PARTITIONS_FILE, FolderKind, kinds_of


def test_every_kind_has_its_marker_and_a_one_line_description() -> None:
    from meshshard.data import _dataset
    from meshshard.partition import _format

    assert {name: kind.marker for name, kind in FOLDER_KINDS.items()} == {
        "partition": "partition.json", "dataset": "dataset.json", "partitions": "partitions.json",
        "run": "checkpoint.pt", "prediction": "metrics.json"}
    assert FOLDER_KINDS["partition"].marker == _format.METADATA_FILE
    assert FOLDER_KINDS["dataset"].marker == _dataset.METADATA_FILE
    assert FOLDER_KINDS["partitions"].marker == PARTITIONS_FILE
    for name, kind in FOLDER_KINDS.items():
        assert isinstance(kind, FolderKind) and kind.name == name
        assert kind.description and "\n" not in kind.description


def test_kinds_of_a_folder_are_those_whose_marker_it_holds(tmp_path: Path) -> None:
    assert kinds_of(tmp_path) == [] and kinds_of(tmp_path / "missing") == []
    (tmp_path / "metrics.json").write_text("{}")
    (tmp_path / "checkpoint.pt").mkdir()  # by name only: whether it is sound is for its reader to say
    assert [kind.name for kind in kinds_of(tmp_path)] == ["run", "prediction"]
