"""``meshshard.run.baseline``: each method against an independent numpy computation, on one mesh and
on a mesh per sample (fields mapped between meshes), the mapping itself on analytic fields, the
refusals, the metrics over samples (MAE, R², Spearman) and the comparison table."""

from __future__ import annotations

import json
from pathlib import Path

import meshio
import numpy as np
import pytest

from meshshard.data import SourceCache, boundary_force, linear_cases, node_map, open_dataset
from meshshard.run import BaselineConfig, baseline, comparison_table, over_samples, parse_method
from meshshard.run._boundaries import BoundaryScoring, boundary_record, boundary_summary
from tests.meshshard.run._sweeps import PARAMS, TRAIN, fields, grid, write_sweep

N_TRAIN = len(TRAIN)
VAL = list(range(N_TRAIN, len(PARAMS)))


def _expected_weights(method: str, case: int) -> dict[int, float]:
    """The training samples and weights of each method, computed here from the rules in plain numpy."""
    train = PARAMS[:N_TRAIN]
    z = train / train.std(0)
    zs = PARAMS[case] / train.std(0)
    d = np.sqrt(((z - zs) ** 2).sum(1))
    if method == "mean":
        return {i: 1 / N_TRAIN for i in range(N_TRAIN)}
    if method == "nearest":
        return {int(np.argmin(d)): 1.0}
    if method == "knn:3":
        near = np.argsort(d)[:3]
        return {int(i): (1 / d[i]) / (1 / d[near]).sum() for i in near}
    if method == "linear":  # the hat matrix's row of the affine least-squares fit in (a, b)
        design = np.c_[np.ones(N_TRAIN), train]
        row = design @ np.linalg.solve(design.T @ design, np.r_[1.0, PARAMS[case]])
        return dict(enumerate(row.tolist()))
    if method == "linear,bound=1":  # the fit damped to weights all >= 0 (how: tests/data/test_neighbours.py)
        return dict(linear_cases(train, PARAMS[case], train.std(0), bound=1.0))
    # interp:a: the training samples whose b is nearest the sample's, bracketing its a
    a, b = PARAMS[case]
    line = [i for i in range(N_TRAIN) if abs(train[i, 1] - b) == np.abs(train[:, 1] - b).min()]
    lo = [i for i in line if train[i, 0] <= a]
    hi = [i for i in line if train[i, 0] >= a]
    if not hi:
        return {max(lo, key=lambda i: train[i, 0]): 1.0}
    lo_i, hi_i = max(lo, key=lambda i: train[i, 0]), min(hi, key=lambda i: train[i, 0])
    t = (a - train[lo_i, 0]) / (train[hi_i, 0] - train[lo_i, 0])
    return {lo_i: 1 - t, hi_i: t}


@pytest.fixture(scope="module")
def one_mesh(tmp_path_factory) -> dict:
    return write_sweep(tmp_path_factory.mktemp("sweep") / "data")


@pytest.mark.parametrize("method", ["mean", "nearest", "knn:3", "linear", "linear,bound=1", "interp:a"])
def test_each_method_on_one_mesh_equals_numpy_with_rescaled_targets(one_mesh: dict, method: str,
                                                                    tmp_path: Path) -> None:
    out = tmp_path / "pred"
    metrics = baseline(BaselineConfig(data=one_mesh["data"], out=str(out), method=method, quiet=True, plots=False,
                                      boundary="bottom", force_reference="b**2", direction=(1.0, 0.0),
                                      lift_direction=(0.0, 1.0)))
    truth = one_mesh["truth"]
    data = open_dataset(one_mesh["data"])
    ids, area = data.boundary(0, "bottom")
    assert [r["name"] for r in metrics["samples"]] == ["v0", "v1", "v2"]
    for record, case in zip(metrics["samples"], VAL):
        weights = _expected_weights(method, case)
        b = PARAMS[case, 1]
        # p was stored divided by b**2: combined non-dimensional, multiplied by the sample's own b**2
        p = sum(w * truth[i][:, 0] / PARAMS[i, 1] ** 2 for i, w in weights.items()) * b ** 2
        u = sum(w * truth[i][:, 1:] for i, w in weights.items())
        written = meshio.read(out / record["file"])
        np.testing.assert_allclose(written.point_data["p_pred"], p, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(written.point_data["U_pred"], u, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(written.point_data["p"], truth[case][:, 0], rtol=1e-12)
        np.testing.assert_allclose(written.point_data["p_error"], p - truth[case][:, 0], rtol=1e-10, atol=1e-12)
        rel = np.linalg.norm(u - truth[case][:, 1:]) / np.linalg.norm(truth[case][:, 1:])
        assert record["fields"]["U"]["rel_l2"] == pytest.approx(rel, rel=1e-10, abs=1e-14)
        assert {s["sample"]: s["weight"] for s in record["baseline"]["sources"]} == pytest.approx(
            {f"t{i}": w for i, w in weights.items()}, rel=1e-12)
        force = boundary_force(p[ids], area)
        np.testing.assert_allclose(record["boundaries"]["bottom"]["force"]["pred"], force, rtol=1e-10, atol=1e-12)
        assert record["boundaries"]["bottom"]["coefficients"]["lift"]["pred"] == pytest.approx(force[1] / b ** 2,
                                                                                                  rel=1e-10)
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk["complete"] and on_disk["baseline"]["method"] == method and on_disk["run"] is None
    lift = on_disk["boundaries"]["bottom"]["coefficients"]["lift"]
    assert set(lift) >= {"mae", "r2", "spearman"}
    if method == "linear":  # stored p = p / b**2 and U are affine in (a, b): the fit is the truth, v1 (a = 4) too
        for record, case in zip(metrics["samples"], VAL):
            written = meshio.read(out / record["file"])
            np.testing.assert_allclose(written.point_data["p_pred"], truth[case][:, 0], rtol=1e-9, atol=1e-10)
            np.testing.assert_allclose(written.point_data["U_pred"], truth[case][:, 1:], rtol=1e-9, atol=1e-10)
    if method == "linear,bound=1":  # v1 (a = 4) is beyond the trained range: its fit damped, no weight negative
        plain = _expected_weights("linear", VAL[1])
        assert min(plain.values()) < 0 and sum(abs(w) for w in plain.values()) > 1.01
        sources = metrics["samples"][1]["baseline"]["sources"]
        assert min(s["weight"] for s in sources) > -1e-9
    if method == "interp:a":  # v1 (a = 4) is beyond the trained range: the nearest end, said
        assert "the nearest end, a = 3" in metrics["samples"][1]["baseline"]["note"]


def test_many_meshes_map_a_linear_field_exactly(tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path / "data", meshes="many", scale=False)
    for method in ("mean", "knn:3", "linear", "linear:99", "interp:a"):  # linear:99: every case (K > cases)
        out = tmp_path / method.replace(":", "-")
        metrics = baseline(BaselineConfig(data=sweep["data"], out=str(out), method=method, quiet=True, plots=False))
        for record, case in zip(metrics["samples"], VAL):
            pts = sweep["points"][case]
            # each training field is linear, so mapped onto this mesh it is that field at these points
            rule = "linear" if method == "linear:99" else method
            want = sum(w * fields(pts, *PARAMS[i]) for i, w in _expected_weights(rule, case).items())
            got = meshio.read(out / record["file"])
            np.testing.assert_allclose(got.point_data["p_pred"], want[:, 0], rtol=1e-10, atol=1e-10)
            np.testing.assert_allclose(got.point_data["U_pred"], want[:, 1:], rtol=1e-10, atol=1e-10)


def test_node_map_linear_exact_smooth_converges_outside_nearest() -> None:
    rng = np.random.default_rng(0)
    target = rng.random((200, 2)) * 0.98 + 0.01
    source = np.concatenate([[[0, 0], [1, 0], [0, 1], [1, 1]], rng.random((150, 2))])
    linear = np.stack([2 * source[:, 0] - 3 * source[:, 1] + 0.5, source[:, 1]], 1)
    got = node_map(source, target).apply(linear)
    np.testing.assert_allclose(got, np.stack([2 * target[:, 0] - 3 * target[:, 1] + 0.5, target[:, 1]], 1),
                               rtol=1e-10, atol=1e-10)

    def smooth(p: np.ndarray) -> np.ndarray:
        return np.sin(3 * p[:, 0]) * np.cos(2 * p[:, 1])

    errors = []
    for n in (8, 16, 32):
        pts, _ = grid(n)
        errors.append(np.abs(node_map(pts, target).apply(smooth(pts)) - smooth(target)).max())
    assert errors[0] > errors[1] > errors[2] and errors[1] / errors[2] > 3  # second order: about 4x per halving
    # outside the source's hull: the nearest source node; the same points: the identity
    m = node_map(np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]), np.array([[2.0, 0.1], [0.25, 0.25]]))
    np.testing.assert_allclose(m.apply(np.array([1.0, 2.0, 3.0])), [2.0, 1.0 + 0.25 + 0.5])
    assert m.outside.tolist() == [True, False]
    same = node_map(source, source)
    assert np.array_equal(same.apply(linear), linear)
    # a 2-D mesh written with z = 0, and a line
    flat = node_map(np.c_[source, np.zeros(len(source))], np.c_[target, np.zeros(len(target))]).apply(linear)
    np.testing.assert_allclose(flat, got, rtol=1e-12, atol=1e-12)
    line = node_map(np.array([[0.0], [2.0], [1.0]]), np.array([[0.5], [-1.0], [3.0]])).apply(np.array([0.0, 4.0, 2.0]))
    np.testing.assert_allclose(line, [1.0, 0.0, 4.0])


def test_node_map_of_clouds_takes_a_coincident_point_alone() -> None:
    rng = np.random.default_rng(1)
    source = rng.random((30, 3))
    target = np.concatenate([source[:5], rng.random((4, 3))])
    values = rng.random(30)
    got = node_map(source, target, cloud=True).apply(values)
    np.testing.assert_allclose(got[:5], values[:5], rtol=1e-12)
    assert ((got[5:] >= values.min()) & (got[5:] <= values.max())).all()  # a convex combination


def test_a_source_kept_in_a_cache_maps_as_one_built_afresh_and_is_built_once() -> None:
    """``node_map(..., cache=, key=)``: the same map (inside the hull, outside it, a 2-D mesh with
    z = 0, a cloud), each source's triangulation and k-d tree built once for any number of targets,
    the least recently used let go beyond the cache's bytes."""
    rng = np.random.default_rng(2)
    sources = {name: rng.random((120 + 10 * k, 2)) for k, name in enumerate("abc")}
    targets = [rng.random((90, 2)) * 1.2 - 0.1 for _ in range(4)]  # some nodes outside every source's hull
    cache = SourceCache()
    for target in targets:
        for name, source in sources.items():
            for lift in (False, True):  # a 2-D mesh written with z = 0 is triangulated in 2-D
                src = np.c_[source, np.zeros(len(source))] if lift else source
                tgt = np.c_[target, np.zeros(len(target))] if lift else target
                kept, fresh = node_map(src, tgt, cache=cache, key=name), node_map(src, tgt)
                assert kept.outside.any()
                for a, b in ((kept.index, fresh.index), (kept.weights, fresh.weights), (kept.outside, fresh.outside)):
                    assert np.array_equal(a, b)
    assert cache.built == 2 * len(sources)  # a triangulation and a k-d tree per source, not per target
    clouds = SourceCache()
    cloud = rng.random((50, 3))
    for target in (rng.random((20, 3)), rng.random((30, 3))):
        kept, fresh = node_map(cloud, target, cloud=True, cache=clouds, key="cloud"), node_map(cloud, target, cloud=True)
        assert np.array_equal(kept.index, fresh.index) and np.array_equal(kept.weights, fresh.weights)
    assert clouds.built == 1
    inner = targets[0][:10] * 0.5 + 0.25  # inside every source's hull: triangulations alone
    sizes = {name: _triangulation_bytes(source) for name, source in sources.items()}
    room = SourceCache(max_bytes=max(sizes.values()) + min(sizes.values()) - 1)  # never room for two
    for _ in range(2):
        for name, source in sources.items():
            node_map(source, inner, cache=room, key=name)
    assert room.built == 2 * len(sources) and len(room._items) == 1 and room._bytes <= room.max_bytes
    none = SourceCache(max_bytes=min(sizes.values()) - 1)  # none fits: each built for its map, not kept
    for name, source in sources.items():
        node_map(source, inner, cache=none, key=name)
    assert none.built == len(sources) and not none._items


def _triangulation_bytes(points: np.ndarray) -> int:
    from meshshard.data._mapping import _triangulation

    return _triangulation(points, "points")[1]


@pytest.mark.parametrize(("kwargs", "method", "message"), [
    ({"parameters": False}, "nearest", "Expected parameters (meshshard dataset --params) for --method nearest"),
    ({}, "interp:c", "Expected --method interp:PARAM to name a parameter of"),
    ({}, "knn:0", "Expected --method knn:K with K a whole number >= 1 (got 'knn:0')"),
    ({}, "knn:9", "Expected --method knn:K with K at most the 8 training samples of"),
    ({}, "median", "Expected --method mean, nearest, knn:K, linear, linear:K, linear:K,bound=B or interp:PARAM (got 'median')"),
    ({"targets": False}, "mean", "Expected a dataset with targets (it holds inputs only)"),
])
def test_refusals_are_one_line_before_anything_is_written(tmp_path: Path, kwargs: dict, method: str,
                                                          message: str) -> None:
    sweep = write_sweep(tmp_path / "data", **kwargs)
    with pytest.raises(ValueError) as err:
        baseline(BaselineConfig(data=sweep["data"], out=str(tmp_path / "pred"), method=method, quiet=True))
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "pred").exists()


def test_parse_method() -> None:
    assert str(parse_method("knn:4")) == "knn:4" and parse_method("interp:speed").param == "speed"
    assert parse_method("nearest").kind == "nearest"
    assert str(parse_method("linear")) == "linear" and parse_method("linear:6").k == 6
    for bad in ("linear:1", "linear:x"):
        with pytest.raises(ValueError, match="Expected --method linear, linear:K or linear:K,bound=B, with K a whole number >= 2"):
            parse_method(bad)


def test_mae_r2_and_spearman_over_samples_by_hand() -> None:
    true = np.array([[1.0, 5.0], [2.0, 5.0], [3.0, 5.0], [4.0, 5.0]])
    pred = np.array([[2.0, 1.0], [1.0, 2.0], [3.0, 3.0], [5.0, 4.0]])
    got = over_samples(true, pred)
    assert got["mae"] == pytest.approx([(1 + 1 + 0 + 1) / 4, (4 + 3 + 2 + 1) / 4])
    assert got["r2"][0] == pytest.approx(1 - 3 / 5.0)  # sum (pred - true)^2 = 3, sum (true - 2.5)^2 = 5
    d = np.array([2, 1, 3, 4]) - np.array([1, 2, 3, 4])  # the rank differences
    assert got["spearman"][0] == pytest.approx(1 - 6 * (d ** 2).sum() / (4 * (16 - 1)))
    assert got["r2"][1] is None and got["spearman"][1] is None  # a true column that does not vary
    tied = over_samples(np.array([[1.0], [2.0], [2.0], [3.0]]), np.array([[1.0], [3.0], [2.0], [4.0]]))
    rt, rp = np.array([1, 2.5, 2.5, 4]) - 2.5, np.array([1, 3, 2, 4]) - 2.5
    assert tied["spearman"][0] == pytest.approx(rt @ rp / np.sqrt((rt @ rt) * (rp @ rp)))
    # fewer than three samples: null, with a note in the boundary summary
    scoring = BoundaryScoring(("wall",), (("p", slice(0, 1)),), slice(0, 1), None, None, 2, drag=(1.0, 0.0))
    records = [{"boundaries": boundary_record(np.array([[1.0, 4.0, t, 0.0, p, 0.0]]), scoring, {}, truth=True)}
               for t, p in ((1.0, 1.5), (2.0, 1.0))]
    summary = boundary_summary(records, scoring)["wall"]
    assert summary["coefficients"]["drag"]["spearman"] is None and summary["force"]["spearman"] == [None, None]
    assert summary["coefficients"]["drag"]["mae"] == pytest.approx(0.75)
    assert "needs at least 3 samples (got 2)" in summary["note"]


def test_the_comparison_table(one_mesh: dict, tmp_path: Path) -> None:
    for method in ("mean", "interp:a"):
        baseline(BaselineConfig(data=one_mesh["data"], out=str(tmp_path / method.replace(":", "-")), method=method,
                                quiet=True, plots=False, boundary="bottom", direction=(1.0, 0.0),
                                lift_direction=(0.0, 1.0)))
    table = comparison_table(tmp_path / "interp-a", tmp_path / "mean")
    lines = table.splitlines()
    assert "interp-a (baseline interp:a)" in lines[0] and "mean (baseline mean)" in lines[0]
    mine = json.loads((tmp_path / "interp-a" / "metrics.json").read_text())
    theirs = json.loads((tmp_path / "mean" / "metrics.json").read_text())
    p_row = next(line for line in lines if line.startswith("p rel L2"))
    a, b = mine["mean"]["p"]["rel_l2"], theirs["mean"]["p"]["rel_l2"]
    assert f"{a:.3%}" in p_row and f"{b:.3%}" in p_row and f"{b / a:.3g}x" in p_row
    lift = next(line for line in lines if line.startswith("bottom: lift Spearman"))
    assert format(mine["boundaries"]["bottom"]["coefficients"]["lift"]["spearman"], ".4g") in lift
    assert any(line.startswith("bottom: U rel L2") for line in lines)


def test_a_trajectory_dataset_is_refused_in_one_line(tmp_path: Path) -> None:
    from meshshard.data import Trajectory, write_trajectories

    pts, tri = grid(3)
    runs = [Trajectory(f"r{k}", pts, [("triangle", tri)], np.arange(3) * 0.1, iter(np.ones((3, len(pts), 1)) * k),
                       np.zeros((len(pts), 1)), np.zeros(len(pts), np.int64)) for k in range(2)]
    write_trajectories(tmp_path / "data", iter(runs), ["r0", "r1"], state_fields=[{"name": "u", "components": 1}],
                       input_fields=[{"name": "c", "components": 1}], node_type_source="test", val_samples=["r1"],
                       dtype="float64")
    with pytest.raises(ValueError, match=r"Expected a dataset of steady samples \(it holds trajectories"):
        baseline(BaselineConfig(data=str(tmp_path / "data"), out=str(tmp_path / "pred"), quiet=True))
    assert not (tmp_path / "pred").exists()
