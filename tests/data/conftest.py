"""The dataset layer's tests use the partition tests' small meshes."""

from tests.partition.conftest import grid_mesh, grid_triangles, mesh_file, rewrite_metadata  # noqa: F401
