"""The old ``meshshard.partition`` paths of the dataset layer's names forward to ``meshshard.data``
for one release: the very same object, with a DeprecationWarning that says where it went."""

from __future__ import annotations

import pytest

import meshshard.data
import meshshard.partition
from meshshard.partition import _MOVED


@pytest.mark.parametrize("name", _MOVED)
def test_an_old_path_is_the_new_object_and_warns(name: str) -> None:
    new = getattr(meshshard.data, name)
    with pytest.warns(DeprecationWarning, match=rf"meshshard\.partition\.{name} moved to meshshard\.data\.{name}"):
        old = getattr(meshshard.partition, name)
    assert old is new


def test_every_moved_name_is_a_public_name_of_meshshard_data_and_warns_on_every_access() -> None:
    assert _MOVED and set(_MOVED) <= set(meshshard.data.__all__)
    for _ in range(2):  # never cached in meshshard.partition: the second access warns too
        with pytest.warns(DeprecationWarning, match=r"use|import it from there"):
            assert meshshard.partition.open_dataset is meshshard.data.open_dataset
