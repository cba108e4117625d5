"""``meshshard dataset --mean-field mean|knn:K|linear`` on many meshes and on the nearest cases: each
training case mapped onto the sample's own mesh (exact for a linear field), a training sample's
prior never made of its own mesh's cases (of itself, on one mesh), inverse-distance weights of
the nearest cases, the affine least-squares fit, new shapes with ``--mean-field-from``, the record in ``meshshard info``, and
every refusal in one line, leaving nothing behind."""

from __future__ import annotations

from pathlib import Path

import meshio
import numpy as np
import pytest
from scipy.spatial import Delaunay

from meshshard.cli import main
from meshshard.data import build_dataset, linear_cases, node_map, open_dataset
from tests._refusals import assert_refused_in_one_line

#: Shapes, each on a mesh of its own, with its shape parameter t.
SHAPES = {"A": 0.1, "B": 0.2, "C": 0.45}  # no two distances tie (a tie would be up to round-off)
SPEEDS = (1.0, 2.0)
CORNERS = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])


def _points(seed: int, n: int = 40) -> np.ndarray:
    """``n`` points of the unit square, its corners among them: every mesh has the same hull, so
    every node of one lies inside every other's triangulation."""
    return np.concatenate([CORNERS, 0.05 + 0.9 * np.random.default_rng(seed).random((n - 4, 2))])


def _fields(xy: np.ndarray, speed: float, t: float) -> tuple[np.ndarray, np.ndarray]:
    """A case's targets: linear in x and y, with coefficients of its parameters."""
    x, y = xy[:, 0], xy[:, 1]
    p = speed * (1 + 10 * t * t * x) + (1 + t) * y  # not linear in t: a mean of t's neighbours is not t's
    u = np.c_[speed * x - t * t, 3 * t * y + speed]
    return p, u


def _coefficients(speed: float, t: float) -> np.ndarray:
    """``(3, 3)``: the fields above as ``[1, x, y] @ coefficients`` (columns p, u[0], u[1])."""
    return np.array([[speed, -t * t, speed], [10 * speed * t * t, speed, 0.0], [1 + t, 0.0, 3 * t]])


def _write(folder: Path, shapes: dict[str, float], speeds: tuple[float, ...] = SPEEDS, seed: int = 0,
           targets: bool = True) -> list[tuple[str, float, float]]:
    """One ``.vtu`` per (shape, speed), named ``<shape>-<speed>``, and ``params.csv``; returns the cases."""
    (folder / "cases").mkdir(parents=True)
    cases, rows = [], ["sample,speed,t"]
    for k, (shape, t) in enumerate(shapes.items()):
        xy = _points(seed + k)
        tri = Delaunay(xy).simplices
        for speed in speeds:
            name = f"{shape}-{speed:g}"
            p, u = _fields(xy, speed, t)
            data = {"p": p, "U": u, "q": np.zeros(len(xy))} if targets else {"q": np.zeros(len(xy))}
            meshio.write(folder / "cases" / f"{name}.vtu", meshio.Mesh(np.c_[xy, np.zeros(len(xy))], [("triangle", tri)], point_data=data))
            cases.append((name, speed, t))
            rows.append(f"{name},{speed},{t}")
    (folder / "params.csv").write_text("\n".join(rows) + "\n")
    return cases


def _dataset(root: Path, method: str, *extra: str, out: str = "data") -> list[str]:
    return ["dataset", str(root / "cases"), "--out", str(root / out), "--inputs", "pos[0],pos[1]", "--targets",
            "p,U", "--params", str(root / "params.csv"), "--val-samples", "C-2", "--dtype", "float64",
            "--mean-field", method, *extra]


def _prior_of(data, s: int) -> np.ndarray:
    """Sample ``s``'s stored prior, ``(N, 3)``: the last input channels."""
    x, _ = data.rows(s, np.arange(data.num_nodes(s)))
    return x[:, -3:]


def _expected(xy: np.ndarray, weights: dict[str, float], cases: dict[str, tuple[float, float]]) -> np.ndarray:
    """``sum_c w_c * field_c`` at ``xy``, from the cases' coefficients (the analytic prior)."""
    coef = sum(w * _coefficients(*cases[c]) for c, w in weights.items())
    return np.c_[np.ones(len(xy)), xy] @ coef


def _knn_weights(cases: dict[str, tuple[float, float]], train: list[str], name: str, k: int,
                 allowed: list[str]) -> dict[str, float]:
    """By hand: parameters over the training cases' std, the k nearest allowed, weights 1/d."""
    values = np.array([cases[c] for c in train])
    std = values.std(0)
    d = {c: float(np.linalg.norm((np.array(cases[c]) - np.array(cases[name])) / std)) for c in allowed}
    nearest = sorted(allowed, key=lambda c: (d[c], train.index(c)))[:k]
    total = sum(1 / d[c] for c in nearest)
    return {c: (1 / d[c]) / total for c in nearest}


def _linear_weights(cases: dict[str, tuple[float, float]], train: list[str], name: str,
                    allowed: list[str]) -> dict[str, float]:
    """By hand: the hat matrix's row of the affine least-squares fit in the parameters (each over
    its std over the training cases) of the allowed cases, at the sample's parameters."""
    std = np.array([cases[c] for c in train]).std(0)
    design = np.array([[1.0, *(np.array(cases[c]) / std)] for c in allowed])
    row = design @ np.linalg.solve(design.T @ design, np.r_[1.0, np.array(cases[name]) / std])
    return dict(zip(allowed, row.tolist()))


def _bounded_weights(cases: dict[str, tuple[float, float]], train: list[str], name: str, allowed: list[str],
                     bound: float) -> dict[str, float]:
    """The fit's weights damped to ``bound`` (how: meshshard.data.linear_cases, checked in test_neighbours)."""
    std = np.array([cases[c] for c in train]).std(0)
    w = dict(linear_cases(np.array([cases[c] for c in allowed]), np.array(cases[name]), std, bound=bound))
    return {c: w[i] for i, c in enumerate(allowed)}


@pytest.mark.parametrize("method", ["mean", "knn:2", "linear", "linear,bound=1.05"])
def test_a_linear_field_maps_exactly_and_a_shape_never_sees_its_own_mesh(tmp_path: Path, method: str,
                                                                         capsys: pytest.CaptureFixture) -> None:
    _write(tmp_path, SHAPES)
    assert main(_dataset(tmp_path, method)) == 0
    data = open_dataset(tmp_path / "data")
    assert data.kind == "many-meshes" and data.num_meshes == 3
    names = [s["name"] for s in data.meta["samples"]]
    cases = {n: (float(n.split("-")[1]), SHAPES[n[0]]) for n in names}
    train = [names[i] for i in data.train]
    assert train == ["A-1", "A-2", "B-1", "B-2", "C-1"]
    record = data.meta["mean_field"]
    assert record["method"] == method and record["left_out"] == "mesh" and record["samples"] == 5
    assert (record.get("k") == 2) == (method == "knn:2")
    assert data.normalisation.offset_sha256 == record["sha256"]
    for s, name in enumerate(names):
        own = name[0]
        allowed = [c for c in train if c[0] != own] if name in train else train  # validation: every training case
        weights = ({c: 1 / len(allowed) for c in allowed} if method == "mean"
                   else _linear_weights(cases, train, name, allowed) if method == "linear"
                   else _bounded_weights(cases, train, name, allowed, 1.05) if method.startswith("linear")
                   else _knn_weights(cases, train, name, 2, allowed))
        xy = np.asarray(data.mesh_points(data.sample_mesh(s)))[:, :2]
        np.testing.assert_allclose(_prior_of(data, s), _expected(xy, weights, cases), rtol=1e-12, atol=1e-12)
        if name in train:  # the check can fail: a prior with one of its own mesh's cases in it is another
            leaked = {c: w / 2 for c, w in weights.items()} | {[c for c in train if c[0] == own][0]: 0.5}
            assert not np.allclose(_prior_of(data, s), _expected(xy, leaked, cases))
    if method.startswith("linear"):  # how far the fits extrapolate, recorded: the largest sum of |weights|
        sums = {n: sum(abs(w) for w in _linear_weights(cases, train, n, [c for c in train if c[0] != n[0]]
                                                        if n in train else train).values()) for n in names}
        bound = 1.05 if "," in method else np.inf
        for side, chosen in (("training", train), ("other", [n for n in names if n not in train])):
            value, name = record["largest_weights"][side]
            top = max(sums[n] for n in chosen)
            assert abs(value - min(top, bound)) < 1e-3 and sums[name] >= min(top, bound) - 1e-3, (side, value, name)
    else:
        assert "largest_weights" not in record
    if method.startswith("linear,"):  # the bound damped at least one sample's fit: applied, not only passed on
        assert any(sum(abs(w) for w in _linear_weights(cases, train, n, [c for c in train if c[0] != n[0]]).values())
                   > 1.05 + 1e-9 for n in train)
    # the targets are normalised about the prior: their statistics are of the difference
    resid = np.concatenate([data.rows(s, np.arange(data.num_nodes(s)))[1] - _prior_of(data, s) for s in data.train])
    np.testing.assert_allclose(data.normalisation.targets.mean, resid.mean(0), atol=1e-12)
    capsys.readouterr()
    assert main(["info", str(tmp_path / "data")]) == 0
    line = [t for t in capsys.readouterr().out.splitlines() if t.startswith("  prior")]
    assert len(line) == 1 and f"p_mean, U_mean ({method})" in line[0] and "leave-one-mesh-out" in line[0], line
    said = {"mean": "the mean of the targets over", "knn:2": "inverse-distance-weighted mean of the targets of the 2 "
            "nearest", "linear": "affine least-squares fit in the parameters of the targets of every case",
            "linear,bound=1.05": "damped where its weights would sum to more than 1.05 in absolute value"}[method]
    assert said in line[0] and (("inverse-distance" in line[0]) == (method == "knn:2")), line
    assert ("its weights sum in absolute value to at most: training " in line[0]) == method.startswith("linear")


def test_knn_weights_on_one_mesh_leave_the_sample_itself_out(tmp_path: Path) -> None:
    _write(tmp_path, {"A": 0.1}, speeds=(1.0, 2.0, 3.0, 6.0))
    assert main(["dataset", str(tmp_path / "cases"), "--out", str(tmp_path / "data"), "--inputs", "pos[0]",
                 "--targets", "p,U", "--params", str(tmp_path / "params.csv"), "--val-samples", "A-3",
                 "--dtype", "float64", "--mean-field", "knn:2", "--quiet"]) == 0
    data = open_dataset(tmp_path / "data")
    assert data.kind == "one-mesh" and data.meta["mean_field"]["left_out"] == "sample"
    names = [s["name"] for s in data.meta["samples"]]
    cases = {n: (float(n.split("-")[1]), 0.1) for n in names}
    # speed alone varies (t is scaled by 1): A-1's neighbours are A-2 (d = 1 / std) and A-6 (5 / std), never
    # itself; weights 1 / d normalised. A-3 (validation) takes every training case: A-2 (1 / std), A-1 (2 / std)
    want = {"A-1": {"A-2": 5 / 6, "A-6": 1 / 6}, "A-2": {"A-1": 0.8, "A-6": 0.2}, "A-6": {"A-2": 5 / 9, "A-1": 4 / 9},
            "A-3": {"A-2": 2 / 3, "A-1": 1 / 3}}
    assert _knn_weights(cases, ["A-1", "A-2", "A-6"], "A-1", 2, ["A-2", "A-6"]) == pytest.approx(want["A-1"])
    xy = np.asarray(data.mesh_points(0))[:, :2]
    for s, name in enumerate(names):
        np.testing.assert_allclose(_prior_of(data, s), _expected(xy, want[name], cases), rtol=1e-12, atol=1e-12)


def test_new_shapes_take_their_prior_from_the_training_cases_of_data(tmp_path: Path) -> None:
    _write(tmp_path, SHAPES)
    assert main(_dataset(tmp_path, "knn:2", "--quiet")) == 0
    data = open_dataset(tmp_path / "data")
    new = tmp_path / "new"
    _write(new, {"D": 0.25, "A": 0.1}, speeds=(1.5,), seed=10, targets=False)  # a new shape, and A on a new mesh
    args = ["dataset", str(new / "cases"), "--out", str(new / "data"), "--inputs", "pos[0],pos[1]", "--params",
            str(new / "params.csv"), "--dtype", "float64", "--mean-field-from", str(tmp_path / "data"), "--quiet"]
    assert main(args) == 0
    made = open_dataset(new / "data")
    assert made.target_channels == [] and made.input_channels[-3:] == ["p_mean", "U_mean[0]", "U_mean[1]"]
    assert made.meta["mean_field"] | {"sha256": ""} == {"of": "another dataset (--mean-field-from)",
                                                        "method": "knn:2", "k": 2, "left_out": "none",
                                                        "samples": 5, "sha256": ""}
    assert made.meta["mean_field"]["sha256"] == data.meta["mean_field"]["sha256"]  # a run of data predicts on it
    names = [s["name"] for s in data.meta["samples"]]
    cases = {n: (float(n.split("-")[1]), SHAPES[n[0]]) for n in names} | {"D-1.5": (1.5, 0.25), "A-1.5": (1.5, 0.1)}
    train = [names[i] for i in data.train]
    assert [e["name"] for e in made.meta["samples"]] == ["A-1.5", "D-1.5"]
    for s, name in enumerate(["A-1.5", "D-1.5"]):
        xy = np.asarray(made.mesh_points(made.sample_mesh(s)))[:, :2]
        weights = _knn_weights(cases, train, name, 2, train)  # every training case, A's own included
        np.testing.assert_allclose(_prior_of(made, s), _expected(xy, weights, cases), rtol=1e-12, atol=1e-12)


def test_the_one_mesh_mean_goes_onto_a_new_mesh_mapped(tmp_path: Path) -> None:
    _write(tmp_path, {"A": 0.1}, speeds=(1.0, 2.0, 4.0))
    assert main(["dataset", str(tmp_path / "cases"), "--out", str(tmp_path / "data"), "--inputs", "pos[0]",
                 "--targets", "p", "--val-samples", "A-4", "--mean-field", "--quiet"]) == 0
    data = open_dataset(tmp_path / "data")
    assert data.meta["mean_field"]["left_out"] == "none"  # one mesh, mean: as before, one field for all
    stored = _prior_of(data, 0)[:, -1]
    new = tmp_path / "new"
    _write(new, {"B": 0.2}, speeds=(3.0,), seed=5, targets=False)
    assert main(["dataset", str(new / "cases"), "--out", str(new / "data"), "--inputs", "pos[0]",
                 "--mean-field-from", str(tmp_path / "data"), "--quiet"]) == 0
    made = open_dataset(new / "data")
    want = node_map(data.mesh_points(0), made.mesh_points(0)).apply(stored)
    np.testing.assert_allclose(made.rows(0, np.arange(made.num_nodes(0)))[0][:, -1], want.astype(np.float32),
                               rtol=0, atol=0)
    assert made.meta["mean_field"]["sha256"] == data.meta["mean_field"]["sha256"]


@pytest.mark.parametrize(("case", "message"), [
    ("bad-method", "Expected --mean-field mean, knn:K (K >= 1), linear, linear:K (K >= 2) or linear:K,bound=B (got 'knn:0'"),
    ("knn-no-params", "Expected --params for --mean-field knn:2"),
    ("knn-too-many", "Expected --mean-field knn:4 to find 4 cases among the training cases on other meshes than "
                     "A-1's (leave-one-mesh-out) (got 3)"),
    ("one-shape", "Expected --mean-field mean to find 1 case among the training cases on other meshes than A-1's"),
    ("one-mesh-knn", "Expected --mean-field knn:1 to find 1 case among the training cases other than A-1"),
    ("no-targets", "Expected --targets for --mean-field"),
    ("from-plain", "Expected a dataset made with --mean-field"),
    ("from-other-targets", "Expected the targets of the --mean-field-from dataset"),
    ("from-other-dtype", "Expected --dtype float64, the precision of the --mean-field-from dataset"),
    ("from-knn-no-params", "Expected --params with speed, t for these cases"),
    ("from-a-from", "Expected a dataset whose own training cases made its prior"),
])
def test_a_prior_that_cannot_be_made_is_refused_in_one_line_leaving_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture, case: str, message: str) -> None:
    root = str(tmp_path)
    _write(tmp_path, {"A": 0.1} if case in ("one-shape", "one-mesh-knn") else SHAPES)
    new = tmp_path / "new"
    _write(new, {"D": 0.25}, speeds=(1.5,), seed=10, targets=case == "from-other-targets")
    plain = ["dataset", str(new / "cases"), "--out", f"{root}/out", "--inputs", "pos[0]", "--quiet"]
    if case.startswith("from-"):
        made = _dataset(tmp_path, "knn:2", "--quiet")
        assert main(made[:-3] + ["--quiet"] if case == "from-plain" else made) == 0
        if case == "from-a-from":
            assert main([*plain[:3], f"{root}/mid", *plain[4:], "--params", str(new / "params.csv"), "--dtype",
                         "float64", "--mean-field-from", f"{root}/data"]) == 0
        source = f"{root}/mid" if case == "from-a-from" else f"{root}/data"
        args = [*plain, "--mean-field-from", source]
        args += {"from-other-targets": ["--targets", "q", "--dtype", "float64", "--params", str(new / "params.csv")],
                 "from-other-dtype": ["--params", str(new / "params.csv")],
                 "from-knn-no-params": ["--dtype", "float64"]}.get(case, [])
    elif case == "no-targets":
        args = ["dataset", f"{root}/cases", "--out", f"{root}/out", "--inputs", "pos[0]", "--mean-field", "knn:2"]
    else:
        method = {"bad-method": "knn:0", "knn-too-many": "knn:4", "one-shape": "mean", "one-mesh-knn": "knn:1"}
        args = _dataset(tmp_path, method.get(case, "knn:2"), out="out")
        if case == "knn-no-params":
            args = [a for a in args if a not in ("--params", str(tmp_path / "params.csv"))]
        if case in ("one-shape", "one-mesh-knn"):
            args[args.index("C-2")] = "A-2"
            if case == "one-shape":  # two meshes, every training case on one of them
                _write(tmp_path / "more", {"B": 0.2}, speeds=(2.0,), seed=3)
                args[1:2] = [f"{root}/cases/A-1.vtu", f"{root}/more/cases/B-2.vtu"]
                args[args.index("--params") + 1] = str(tmp_path / "both.csv")
                (tmp_path / "both.csv").write_text("sample,speed,t\nA-1,1,0.1\nB-2,2,0.2\n")
                args[args.index("A-2")] = "B-2"
    assert_refused_in_one_line(args, message, capsys, tmp_path / "out")


def test_both_mean_field_options_are_refused_from_python(tmp_path: Path) -> None:
    _write(tmp_path, SHAPES)
    with pytest.raises(ValueError, match="Expected --mean-field or --mean-field-from, not both"):
        build_dataset([tmp_path / "cases"], tmp_path / "out", inputs="pos[0]", targets="p", mean_field="knn:2",
                      mean_field_from=tmp_path)
    assert not (tmp_path / "out").exists()


def test_train_and_predict_on_many_meshes_add_the_knn_prior_back(tmp_path: Path) -> None:
    import torch

    from meshshard.run import load_run

    _write(tmp_path, SHAPES)
    root = str(tmp_path)
    assert main(_dataset(tmp_path, "knn:2", "--quiet")) == 0
    assert main(["partition", f"{root}/data", "--parts", "2", "--out", f"{root}/parts", "--quiet"]) == 0
    assert main(["train", f"{root}/parts", "--data", f"{root}/data", "--out", f"{root}/run", "--nproc", "2",
                 "--steps", "3", "--latent", "8", "--mp-steps", "1", "--dtype", "float64", "--quiet"]) == 0
    assert main(["predict", f"{root}/run", "--data", f"{root}/data", "--out", f"{root}/pred", "--samples", "all",
                 "--nproc", "2", "--no-plots", "--quiet"]) == 0
    data = open_dataset(tmp_path / "data")
    run = load_run(tmp_path / "run")
    norm, stats = run._normaliser, data.normalisation.targets
    assert run._normaliser.normalisation.target_offset == (4, 5, 6)
    for s, entry in enumerate(data.meta["samples"]):
        mesh = data.mesh(data.sample_mesh(s))
        ei = torch.as_tensor(mesh.graph().edge_index())
        written = meshio.read(tmp_path / "pred" / f"{entry['name']}.vtu")
        order = np.asarray(written.point_data["global_id"], np.int64)
        x, _ = data.rows(s, np.arange(data.num_nodes(s)))
        with torch.no_grad():  # independently: the model's output, de-normalised, then the sample's own prior
            out = run.model(norm.normalise_inputs(torch.as_tensor(x)), ei,
                            norm.edge_attr(torch.as_tensor(mesh.points), ei)).numpy()
        learnt = out * stats.output_scale + stats.mean
        pred = np.c_[written.point_data["p_pred"], written.point_data["U_pred"][:, :2]]
        np.testing.assert_allclose(pred - _prior_of(data, s)[order], learnt[order], rtol=1e-10, atol=1e-10)
        assert np.abs(_prior_of(data, s)).max() > 1  # the prior added back is no small part of the prediction


def test_each_pair_of_meshes_is_mapped_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import meshshard.data._mapping as mapping

    built: list[tuple[int, int]] = []

    def counted(source: np.ndarray, target: np.ndarray, **options: object) -> object:
        built.append((len(source), len(target)))
        return node_map(source, target, **options)

    monkeypatch.setattr(mapping, "node_map", counted)
    _write(tmp_path, SHAPES, speeds=(1.0, 2.0, 3.0))
    steps: list[int] = []
    build_dataset([tmp_path / "cases"], tmp_path / "data", inputs="pos[0]", targets="p", val_samples=["C-3"],
                  params=tmp_path / "params.csv", mean_field="mean", prior_progress=steps.append)
    # 9 samples on 3 meshes: each mesh takes the other two (the validation sample's own mesh is the
    # identity), one map per ordered pair, however many samples share it
    assert len(built) == 6 and sum(steps) == 9


def test_shape_params_leave_out_every_case_of_the_samples_shape_when_each_case_has_its_own_mesh(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Each (shape, speed) meshed again (as a body turned to each angle is): leaving out the mesh
    leaves the same shape at the other speed in the prior; --shape-params t leaves it out too."""
    (tmp_path / "cases").mkdir()
    rows, cases = ["sample,speed,t"], {}
    for k, (shape, t) in enumerate(SHAPES.items()):
        for j, speed in enumerate(SPEEDS):
            xy = _points(10 * k + j)
            name = f"{shape}-{speed:g}"
            p, u = _fields(xy, speed, t)
            meshio.write(tmp_path / "cases" / f"{name}.vtu", meshio.Mesh(np.c_[xy, np.zeros(len(xy))],
                         [("triangle", Delaunay(xy).simplices)], point_data={"p": p, "U": u}))
            rows.append(f"{name},{speed},{t}")
            cases[name] = (speed, t)
    (tmp_path / "params.csv").write_text("\n".join(rows) + "\n")
    for shape_params, out in ((None, "by-mesh"), ("t", "by-shape")):
        extra = ("--shape-params", shape_params) if shape_params else ()
        assert main(_dataset(tmp_path, "knn:2", *extra, out=out)) == 0
        data = open_dataset(tmp_path / out)
        assert data.num_meshes == 6
        record = data.meta["mean_field"]
        assert record["left_out"] == ("shape" if shape_params else "mesh")
        assert record.get("shape") == (["t"] if shape_params else None)
        names = [s["name"] for s in data.meta["samples"]]
        train = [names[i] for i in data.train]
        for s, name in enumerate(names):
            if name not in train:
                continue
            allowed = [c for c in train if (c[0] != name[0] if shape_params else c != name)]
            weights = _knn_weights(cases, train, name, 2, allowed)
            xy = np.asarray(data.mesh_points(data.sample_mesh(s)))[:, :2]
            np.testing.assert_allclose(_prior_of(data, s), _expected(xy, weights, cases), rtol=1e-12, atol=1e-12)
    # the sample's own shape at the other speed is its nearest case: the two rules give other priors
    assert not np.allclose(_prior_of(open_dataset(tmp_path / "by-mesh"), 0),
                           _prior_of(open_dataset(tmp_path / "by-shape"), 0))
    capsys.readouterr()
    assert main(["info", str(tmp_path / "by-shape")]) == 0
    assert "every case of its own shape (t)" in capsys.readouterr().out
    for bad, why in ((("--shape-params", "thickness"), "--shape-params among the --params columns speed, t"),):
        assert main(_dataset(tmp_path, "knn:2", *bad, out="bad")) != 0
        assert why in capsys.readouterr().err
        assert not (tmp_path / "bad").exists()
    assert main(["dataset", str(tmp_path / "cases"), "--out", str(tmp_path / "bad"), "--inputs", "pos[0],pos[1]",
                 "--targets", "p,U", "--params", str(tmp_path / "params.csv"), "--shape-params", "t"]) != 0
    assert "Expected --mean-field with --shape-params" in capsys.readouterr().err
