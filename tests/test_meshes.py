"""The test meshes: with ../shared/data hidden (MESHSHARD_TEST_NO_SHARED=1), tests that only need
*a* mesh get a generated one of the same dimension, and only exact-file tests skip, saying why."""

from __future__ import annotations

import numpy as np
import pytest

from tests import _meshes
from tests._meshes import data_file, mesh_input, shared_data_dir, synthetic_mesh


def test_hidden_shared_data_gives_generated_meshes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESHSHARD_TEST_NO_SHARED", "1")
    assert shared_data_dir() is None
    flat, solid = mesh_input("sfepy/big.mesh"), mesh_input("sfepy/wheelset.vtk")
    assert flat.name == "synthetic-big.mesh" and flat.pos.shape[1] == 2 and flat.cells[0][0] == "triangle"
    assert solid.pos.shape[1] == 3 and solid.cells[0][0] == "tetra"
    # every rank builds the same mesh: deterministic, and a valid mesh (every node used, no flat cell)
    again = synthetic_mesh("sfepy/wheelset.vtk")
    assert np.array_equal(again.pos, solid.pos) and np.array_equal(again.cells[0][1], solid.cells[0][1])
    for data in (flat, solid):
        cells = data.cells[0][1]
        assert np.array_equal(np.unique(cells), np.arange(data.num_nodes))
        corners = data.pos[cells]
        volume = np.linalg.det(corners[:, 1:] - corners[:, :1])
        assert (np.abs(volume) > 1e-3).all()
    with pytest.raises(pytest.skip.Exception, match=r"needs the real test data .*wheelset.vtk \(MESHSHARD_TEST_NO_SHARED is set"):
        data_file("sfepy/wheelset.vtk")


def test_generated_mesh_cases_are_partitioned_like_real_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESHSHARD_TEST_NO_SHARED", "1")
    monkeypatch.setattr(_meshes, "mesh_case", _meshes.mesh_case.__wrapped__)  # no cache across env settings
    case = _meshes.mesh_case("sfepy/big.mesh", 3, "special")
    owned = [len(p.owned_ids) for p in case.parts]
    assert sum(owned) == case.num_nodes == 2 * synthetic_mesh("sfepy/big.mesh").num_nodes
    assert owned[1] == 0 and case.parts[0].num_ghost == 0  # an empty rank, and a rank without ghosts
