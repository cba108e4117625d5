"""Shards and halo plans: invariants on random graphs and partitions (hypothesis), k-hop
exactness of message passing, and the halo exchange against the whole graph."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.sparse.csgraph import shortest_path

from meshshard.partition import Graph, build_partitions, check_partitions, partition_graph

from .conftest import grid_triangles, halo_exchange, message_passing, random_graph


@st.composite
def graphs_and_parts(draw: st.DrawFn) -> tuple[Graph, np.ndarray, int, int]:
    """A random graph (isolated nodes and empty ranks allowed), an arbitrary assignment."""
    n = draw(st.integers(1, 40))
    m = draw(st.integers(0, 3 * n))
    seed = draw(st.integers(0, 2**31))
    num_parts = draw(st.integers(1, 5))
    rng = np.random.default_rng(seed)
    graph = random_graph(rng, n, m)
    parts = rng.integers(0, num_parts, size=n)
    return graph, parts, num_parts, draw(st.integers(1, 3))


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(graphs_and_parts())
def test_invariants_hold(case) -> None:
    graph, parts, num_parts, hops = case
    partitions = build_partitions(graph, parts, num_parts, halo_hops=hops)
    assert check_partitions(partitions) == []


@SETTINGS
@given(graphs_and_parts())
def test_halo_is_the_k_hop_neighbourhood(case) -> None:
    """Against scipy's shortest paths: ghosts are the non-owned nodes within k hops, with their
    distance; local edges are exactly those whose dst is within k - 1 hops."""
    graph, parts, num_parts, hops = case
    import scipy.sparse as sp

    adjacency = sp.csr_array((np.ones(graph.num_edges), graph.indices, graph.indptr),
                            shape=(graph.num_nodes, graph.num_nodes))
    distance = shortest_path(adjacency, unweighted=True)
    src, dst = graph.edge_index()
    for p in build_partitions(graph, parts, num_parts, halo_hops=hops):
        owned = parts == p.rank
        to_owned = distance[:, owned].min(axis=1) if owned.any() else np.full(graph.num_nodes,
                                                                              np.inf)
        ghosts = np.flatnonzero((to_owned >= 1) & (to_owned <= hops))
        assert sorted(p.ghost_ids.tolist()) == ghosts.tolist()
        np.testing.assert_array_equal(p.node_hops[p.num_owned:], to_owned[p.ghost_ids])
        stored = np.flatnonzero(to_owned[dst] <= hops - 1)
        np.testing.assert_array_equal(np.sort(p.global_edge_ids), stored)
        g = p.local_to_global[p.edge_index]
        np.testing.assert_array_equal(g[0], src[p.global_edge_ids])
        np.testing.assert_array_equal(g[1], dst[p.global_edge_ids])


@SETTINGS
@given(graphs_and_parts())
def test_k_layers_need_no_exchange(case) -> None:
    """k rounds of message passing on the local graph give the exact owned rows, and after
    layer l the rows with node_hops <= k - l are exact."""
    graph, parts, num_parts, hops = case
    x = np.random.default_rng(0).standard_normal(graph.num_nodes)
    whole = graph.edge_index()
    for p in build_partitions(graph, parts, num_parts, halo_hops=hops):
        local = x[p.local_to_global]
        for layer in range(1, hops + 1):
            local = message_passing(p.edge_index, local, 1)
            exact = p.node_hops <= hops - layer
            expected = message_passing(whole, x, layer)[p.local_to_global]
            np.testing.assert_allclose(local[exact], expected[exact], rtol=1e-12)


@SETTINGS
@given(graphs_and_parts())
def test_halo_exchange_fills_the_ghost_rows(case) -> None:
    """Send rows by the plan, receive by source rank: exactly the ghost rows in local order."""
    graph, parts, num_parts, _ = case
    partitions = build_partitions(graph, parts, num_parts, halo_hops=1)
    x = np.random.default_rng(1).standard_normal(graph.num_nodes)
    for p, received in zip(partitions, halo_exchange(partitions, x)):
        np.testing.assert_array_equal(received, x[p.ghost_ids])


def test_layers_with_one_exchange_each() -> None:
    """1-hop mode: one exchange per layer reproduces the whole-graph layers on owned rows."""
    points, triangles = grid_triangles(15, 11)
    edges = np.concatenate([triangles[:, [0, 1]], triangles[:, [1, 2]], triangles[:, [2, 0]]]).T
    graph = Graph.from_edge_index(edges, len(points), pos=points)
    partitions = partition_graph(graph, 4)
    x0 = np.random.default_rng(2).standard_normal(graph.num_nodes)
    owned = [x0[p.owned_ids] for p in partitions]
    for _ in range(3):
        full = np.empty(graph.num_nodes)
        for p, rows in zip(partitions, owned):
            full[p.owned_ids] = rows
        ghosts = halo_exchange(partitions, full)
        owned = [message_passing(p.edge_index, np.concatenate([rows, g]), 1)[:p.num_owned]
                 for p, rows, g in zip(partitions, owned, ghosts)]
    expected = message_passing(graph.edge_index(), x0, 3)
    for p, rows in zip(partitions, owned):
        np.testing.assert_allclose(rows, expected[p.owned_ids], rtol=1e-12)


def test_one_hop_stores_each_edge_once_and_khop_flags_copies() -> None:
    points, triangles = grid_triangles(20, 14)
    edges = np.concatenate([triangles[:, [0, 1]], triangles[:, [1, 2]], triangles[:, [2, 0]]]).T
    graph = Graph.from_edge_index(edges, len(points), pos=points)
    for hops in (1, 2, 3):
        partitions = partition_graph(graph, 5, halo_hops=hops)
        owned_ids = np.concatenate([p.global_edge_ids[:p.num_owned_edges] for p in partitions])
        np.testing.assert_array_equal(np.sort(owned_ids), np.arange(graph.num_edges))
        for p in partitions:
            assert (p.edge_index[1, :p.num_owned_edges] < p.num_owned).all()
            assert (p.edge_index[1, p.num_owned_edges:] >= p.num_owned).all()
            assert p.metadata["parts"][p.rank]["num_owned_edges"] == p.num_owned_edges
            if hops == 1:
                assert p.num_owned_edges == p.num_edges
                sources = np.unique(p.edge_index[0][p.edge_index[0] >= p.num_owned])
                np.testing.assert_array_equal(sources, np.arange(p.num_owned, p.num_local))


def test_empty_rank_and_rank_without_ghosts() -> None:
    graph = Graph.from_edge_index(np.array([[0, 1, 3], [1, 2, 4]]), 5)
    parts = np.array([0, 0, 0, 2, 2])  # rank 1 empty; no edge crosses ranks
    partitions = build_partitions(graph, parts, 3)
    assert check_partitions(partitions) == []
    assert [p.num_owned for p in partitions] == [3, 0, 2]
    assert [p.num_ghost for p in partitions] == [0, 0, 0]
    assert partitions[1].edge_index.shape == (2, 0)
    assert partitions[0].num_owned_per_part.tolist() == [3, 0, 2]


@pytest.mark.parametrize("hops", [1, 3])
def test_threads_do_not_change_the_plans(monkeypatch: pytest.MonkeyPatch, hops: int) -> None:
    """Two threads find the halos of two parts at once, each with its own scratch array."""
    from meshshard.partition import _plan

    graph = random_graph(np.random.default_rng(5), 300, 900)
    parts = np.random.default_rng(6).integers(0, 7, size=300)
    found = []
    for workers in (1, 2):
        monkeypatch.setattr(_plan, "PLAN_WORKERS", workers)
        found.append(build_partitions(graph, parts, 7, halo_hops=hops))
    for one, two in zip(*found):
        assert one.arrays().keys() == two.arrays().keys()
        for name, array in one.arrays().items():
            np.testing.assert_array_equal(array, two.arrays()[name], err_msg=name)
    assert found[0][0].metadata == found[1][0].metadata


@pytest.mark.parametrize(("parts", "hops", "match"), [
    (np.array([0, 1]), 1, r"Expected 'parts' of shape \(3,\) \(got \(2,\)\)"),
    (np.array([0, 1, 5]), 1, r"Expected 'parts' in \[0, 2\) \(got range \[0, 5\]\)"),
    (np.array([0.0, 1.0, 1.0]), 1, "Expected integer 'parts'"),
    (np.array([0, 1, 1]), 0, r"Expected 1 <= --halo-hops <= 100 \(got 0\)"),
])
def test_bad_assignments(parts: np.ndarray, hops: int, match: str) -> None:
    graph = Graph.from_edge_index(np.array([[0, 1], [1, 2]]), 3)
    with pytest.raises(ValueError, match=match):
        build_partitions(graph, parts, 2, halo_hops=hops)


def test_torch_geometric_data_is_duck_typed() -> None:
    torch = pytest.importorskip("torch")
    data_mod = pytest.importorskip("torch_geometric.data")
    points, triangles = grid_triangles(6, 5)
    edges = torch.from_numpy(np.concatenate([triangles[:, [0, 1]], triangles[:, [1, 2]]]).T)
    data = data_mod.Data(pos=torch.from_numpy(points), edge_index=edges.contiguous(),
                         num_nodes=len(points))
    partitions = partition_graph(data, 3, method="rcb")
    assert check_partitions(partitions) == []
    assert partitions[0].pos.shape[1] == 2
