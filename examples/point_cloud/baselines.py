"""Baselines for the point-cloud example: what a model has to beat, on the held-out cases.

For every validation case of a meshshard dataset (its ``val`` split, read through
``meshshard.partition.open_dataset``) this prints, for the target field (``--field``, default
``p``) and the forces it integrates to, the errors of:

- **mean field**: the training cases' mean field. The bodies differ, so their points do too; the
  field is carried between bodies by a common parametrisation that needs no knowledge of the
  shapes: each cloud is centred on its centroid and scaled per axis by its bounding box's
  half-extents (the axes stay the world's, so the stream's direction is kept), and every point is
  represented by its direction from the centre (a point on the unit sphere). The mean field at a
  held-out point is the mean, over the training cases, of each one's value at its point of nearest
  direction.
- **nearest case**: the training case nearest in its parameters (the ``--params`` of the dataset,
  each scaled by its standard deviation over the training cases; without parameters, the bounding
  box's half-extents), its field carried over the same way.
- **model** (``--pred FOLDER``, a ``meshshard predict`` output): the predicted field ``<field>_pred``
  of each case's file, and the ``rel_l2`` that ``metrics.json`` recorded for it.

Errors per case: relative L2 ``|f - f_true| / |f_true|`` over the points, the area-weighted
relative L2 (each point weighted by its lumped area), and the force coefficients
``C = -sum(f * A) / S_ref`` with ``A`` the points' area vectors (outward normal times area) and the
moment coefficient about the body's centroid ``C_m = -sum((x - c) x f A) / (S_ref L_ref)`` (its y
component; its error also relative, pooled: the mean error over the mean true ``|C_m|``). With
``f = Cp`` these are the usual coefficients. Force components: x along the stream (drag), y across
it (side force), z across it (lift).

Potential flow gives zero net force on a closed body (d'Alembert's paradox: no drag, and without
circulation no lift or side force either): the true forces here are zero up to discretisation, so
their errors are absolute (in coefficient units) and measure spurious forces. What potential flow
does give an inclined body is a pitching moment (the Munk moment, y component): its error is the
force-integral figure that is meaningful for this example.

    python examples/point_cloud/baselines.py data/ --pred pred/
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy.spatial import cKDTree

from meshshard.data import open_dataset


def directions(points: np.ndarray) -> np.ndarray:
    """Each point's direction from the cloud's centroid after scaling by the bounding box: (N, 3) unit vectors."""
    centred = points - points.mean(0)
    half = np.maximum((points.max(0) - points.min(0)) / 2, 1e-12)
    scaled = centred / half
    return scaled / np.maximum(np.linalg.norm(scaled, axis=1, keepdims=True), 1e-12)


def carry(values: np.ndarray, source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``values`` at the ``source`` points, read at the ``target`` points of nearest direction."""
    _, nearest = cKDTree(directions(source)).query(directions(target))
    return values[nearest]


def errors(pred: np.ndarray, true: np.ndarray, points: np.ndarray, area: np.ndarray, s_ref: float,
           l_ref: float) -> dict[str, float]:
    """Relative L2, area-weighted relative L2, and the force and moment coefficients' errors."""
    weight = np.linalg.norm(area, axis=1)
    centre = points.mean(0)

    def coefficients(f: np.ndarray) -> np.ndarray:
        force = -(f[:, None] * area).sum(0) / s_ref
        moment = -np.cross(points - centre, f[:, None] * area).sum(0) / (s_ref * l_ref)
        return np.concatenate([force, moment])

    c_pred, c_true = coefficients(pred), coefficients(true)
    return {
        "rel_l2": float(np.linalg.norm(pred - true) / np.linalg.norm(true)),
        "area_rel_l2": float(np.sqrt((weight * (pred - true) ** 2).sum() / (weight * true**2).sum())),
        "cd_abs": float(abs(c_pred[0] - c_true[0])),
        "cs_abs": float(abs(c_pred[1] - c_true[1])),
        "cl_abs": float(abs(c_pred[2] - c_true[2])),
        "cm_true": float(c_true[4]),
        "cm_pred": float(c_pred[4]),
        "cm_abs": float(abs(c_pred[4] - c_true[4])),
        "force_true_max": float(np.abs(c_true[:3]).max()),
    }


def read_prediction(pred: Path, name: str, field: str, n: int) -> tuple[np.ndarray | None, float | None]:
    """The predicted field of case ``name`` from a ``meshshard predict`` folder, and its recorded rel_l2."""
    metrics = json.loads((pred / "metrics.json").read_text())
    entry = next((s for s in metrics["samples"] if s["name"] == name), None)
    if entry is None:
        return None, None
    recorded = entry["fields"].get(field, {}).get("rel_l2")
    file = pred / entry["file"]
    if file.suffix == ".vtp":
        from meshshard.data import read_vtk  # .vtp, through the vtk package

        point_data = read_vtk(file).point_data
    else:
        import meshio

        point_data = meshio.read(file).point_data
    values = point_data.get(f"{field}_pred")
    if values is None or len(values) != n:
        return None, recorded
    return np.asarray(values, np.float64).reshape(n), recorded


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", type=Path, help="the meshshard dataset folder (its val split is scored)")
    p.add_argument("--field", default="p", help="the target field to score (default p)")
    p.add_argument("--pred", type=Path, help="a meshshard predict folder, to add the model's errors")
    p.add_argument("--reference-area", type=float, default=np.pi / 4,
                   help="S_ref of the coefficients (default pi/4: a disc of diameter 1)")
    p.add_argument("--reference-length", type=float, default=1.0, help="L_ref of the moment (default 1)")
    p.add_argument("--json", type=Path, help="also write the table as JSON here")
    args = p.parse_args()
    try:
        data = open_dataset(args.data)
    except (OSError, ValueError) as err:
        p.error(f"{args.data}: not a meshshard dataset ({err})")
    if args.field not in data.target_channels:
        p.error(f"--field: expected one of the dataset's targets {', '.join(data.target_channels)}, got {args.field!r}")
    if args.pred is not None and not (args.pred / "metrics.json").is_file():
        p.error(f"--pred: expected a meshshard predict folder with metrics.json, got {args.pred}")
    if not len(data.val) or not len(data.train):
        p.error(f"{args.data}: expected training and validation cases (split {len(data.train)} / {len(data.val)})")
    column = data.target_channels.index(args.field)
    names = [s["name"] for s in data.meta["samples"]]

    def case(sample: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        mesh = data.sample_mesh(sample)
        points = data.mesh_points(mesh).astype(np.float64)
        area = data.surface_area(mesh)
        if area is None:
            raise SystemExit(f"{args.data}: sample {names[sample]} is not a surface (no area vectors)")
        _, targets = data.rows(sample, np.arange(len(points)))
        return points, area, targets[:, column]

    def descriptor(sample: int, points: np.ndarray) -> np.ndarray:
        params = data.parameters(sample)
        return np.array(list(params.values())) if params else (points.max(0) - points.min(0)) / 2

    train = [case(int(s)) for s in data.train]
    keys = np.stack([descriptor(int(s), c[0]) for s, c in zip(data.train, train)])
    scale = np.where(keys.std(0) > 0, keys.std(0), 1.0)
    rows = []
    for sample in data.val:
        points, area, true = case(int(sample))
        mean = np.mean([carry(f, q, points) for q, _, f in train], axis=0)
        nearest = int(np.argmin((((keys - descriptor(int(sample), points)) / scale) ** 2).sum(1)))
        near = carry(train[nearest][2], train[nearest][0], points)
        row = {"case": names[sample], "points": len(points), "nearest_case": names[int(data.train[nearest])],
               "mean_field": errors(mean, true, points, area, args.reference_area, args.reference_length),
               "nearest_case_errors": errors(near, true, points, area, args.reference_area, args.reference_length)}
        if args.pred is not None:
            pred, recorded = read_prediction(args.pred, names[sample], args.field, len(points))
            if pred is not None:
                row["model"] = errors(pred, true, points, area, args.reference_area, args.reference_length)
                row["model"]["recorded_rel_l2"] = recorded
        rows.append(row)
    methods = [("mean field", "mean_field"), ("nearest case", "nearest_case_errors")]
    if any("model" in r for r in rows):
        methods.append(("model", "model"))
    summary = {}
    print(f"{len(rows)} held-out case(s) of {args.data}, field {args.field}; S_ref {args.reference_area:.4g}, "
          f"L_ref {args.reference_length:.4g}")
    print(f"{'method':<14}{'rel L2':>9}{'area rel L2':>13}{'|dC_D|':>9}{'|dC_S|':>9}{'|dC_L|':>9}{'|dC_m|':>9}{'rel':>8}")
    for label, key in methods:
        scored = [r[key] for r in rows if key in r]
        mean = {k: float(np.mean([s[k] for s in scored])) for k in ("rel_l2", "area_rel_l2", "cd_abs", "cs_abs",
                                                                     "cl_abs", "cm_abs")}
        # pooled: a case near zero pitch has a near-zero moment, whose own relative error means little
        mean["cm_rel"] = mean["cm_abs"] / max(float(np.mean([abs(s["cm_true"]) for s in scored])), 1e-12)
        summary[key] = mean | {"cases": len(scored)}
        print(f"{label:<14}{mean['rel_l2']:>9.2%}{mean['area_rel_l2']:>13.2%}{mean['cd_abs']:>9.4f}"
              f"{mean['cs_abs']:>9.4f}{mean['cl_abs']:>9.4f}{mean['cm_abs']:>9.4f}{mean['cm_rel']:>8.1%}")
    truth = max(r["mean_field"]["force_true_max"] for r in rows)
    print(f"(means over the cases; the true force coefficients are at most {truth:.4f} in size: zero in potential "
          "flow up to discretisation, so their errors are absolute; C_m is the pitching moment about the centroid, rel: mean |dC_m| over mean |C_m|)")
    if args.json:
        args.json.write_text(json.dumps({"cases": rows, "mean": summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
