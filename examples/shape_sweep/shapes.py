"""The shape family of the shape-sweep example and its meshes: aerofoil-like bodies, a C-grid each.

A body of chord 1 has three shape parameters:

- ``thickness`` ``t``: the largest thickness (0.08 to 0.20 of the chord by default);
- ``camber`` ``m``: the largest height of the camber line, at 40% of the chord (0 to 0.05);
- ``nose``: the bluntness of the leading edge, a factor on the ``sqrt(x)`` term of the thickness
  (0.6 to 1.4; 1 is a NACA four-digit section). The leading-edge radius is ``(5 t' a0 nose)^2 / 2``,
  with ``t'`` the factor that keeps the largest thickness at ``t``, so it grows as ``nose^2``.

The half-thickness is ``y_t(x) = s (a0 nose sqrt(x) + a1 x + a2 x^2 + a3 x^3 + a4 x^4)``: NACA's
four-digit polynomial (``a0 = 0.2969``, ``a2 = -0.3516``, ``a3 = 0.2843``, ``a4 = -0.1036``, the
closed trailing edge) with ``a1`` set so that the trailing edge stays closed (``y_t(1) = 0``) for any
``nose``, and ``s`` so that ``2 max y_t = t``. The camber line is NACA's (two parabolas meeting at
``x = 0.4``); the surfaces are the thickness laid off normal to it. The outline runs from the
trailing edge over the upper surface to the leading edge and back along the lower one.

The angle of attack turns the body (and its whole mesh) nose up about the quarter chord, so the
free stream is ``(speed, 0, 0)`` in every case: drag is the force along x, lift along y.

The mesh (:func:`block_mesh_dict`) is a C-grid of six hexahedral blocks, one cell thick (a 2-D
case for OpenFOAM): around the body from the trailing edge over the nose and back, split at 30% of
the chord, then a wake block above and below the line from the trailing edge to the outlet, out to
``radius`` chords. The cells are graded from ``first_cell`` at the wall out to the far field; the
body's edges are ``polyLine`` edges through the outline. Every cell at the trailing edge is a
quadrilateral with right angles at the wall, as a C-grid gives. The patches are ``body`` (a wall),
``inlet`` (the C-shaped far field), ``outlet`` (the plane downstream) and ``frontAndBack`` (empty).

:func:`design` picks the shapes of a sweep: the eight corners of the box of parameters and points
of a Halton sequence inside it; held out are interior points (inside the convex hull of the shapes
trained on), so that every held-out shape is an interpolation within the family.

This module needs numpy alone (and scipy for :func:`inside_hull`), not OpenFOAM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: The shape parameters, their ranges in the default sweep.
RANGES = {"thickness": (0.08, 0.20), "camber": (0.0, 0.05), "nose": (0.6, 1.4)}
NACA = (0.2969, -0.1260, -0.3516, 0.2843, -0.1036)
CAMBER_AT = 0.4  # where the camber line is highest, as a fraction of the chord
SPLIT_AT = 0.3  # where the blocks around the body are split, as a fraction of the chord
LEAN_FRONT = 110.0  # the far end of the line from the split station, degrees on the C's arc (90: straight up)
LEAN_BACK = 0.35  # the far end of the line from the trailing edge is this many radii downstream of it
PIVOT = (0.25, 0.0)  # the angle of attack turns the body about the quarter chord


@dataclass(frozen=True)
class Shape:
    """One body of the family (chord 1)."""

    thickness: float
    camber: float
    nose: float

    @property
    def name(self) -> str:
        """``t0.140_m0.025_n1.00``: readable, sortable, a safe file name."""
        return f"t{self.thickness:.3f}_m{self.camber:.3f}_n{self.nose:.2f}"

    def half_thickness(self, x: np.ndarray) -> np.ndarray:
        """``y_t(x)`` for ``0 <= x <= 1``: zero at both ends, largest ``thickness / 2``."""
        return self._scale() * _poly(self.nose, np.asarray(x, dtype=np.float64))

    def _scale(self) -> float:
        dense = np.linspace(0.0, 1.0, 2001)
        return 0.5 * self.thickness / float(_poly(self.nose, dense).max())

    def camber_line(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(``y_c``, ``dy_c/dx``) of NACA's camber line, highest at ``x = 0.4``."""
        x = np.asarray(x, dtype=np.float64)
        m, p = self.camber, CAMBER_AT
        front = x < p
        y = np.where(front, m / p**2 * (2 * p * x - x**2), m / (1 - p) ** 2 * (1 - 2 * p + 2 * p * x - x**2))
        dy = np.where(front, 2 * m / p**2 * (p - x), 2 * m / (1 - p) ** 2 * (p - x))
        return y, dy

    def surfaces(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The upper and lower surfaces at the camber-line stations ``x``: two (len(x), 2) arrays."""
        x = np.asarray(x, dtype=np.float64)
        yt = self.half_thickness(x)
        yc, dy = self.camber_line(x)
        theta = np.arctan(dy)
        upper = np.stack([x - yt * np.sin(theta), yc + yt * np.cos(theta)], axis=1)
        lower = np.stack([x + yt * np.sin(theta), yc - yt * np.cos(theta)], axis=1)
        return upper, lower

    def outline(self, points: int = 201) -> np.ndarray:
        """The closed outline, (2 points - 2, 2): trailing edge, upper surface, nose, lower surface
        (the trailing edge not repeated), stations clustered at both ends (cosine spacing)."""
        x = 0.5 * (1 - np.cos(np.linspace(0.0, math.pi, points)))
        upper, lower = self.surfaces(x)
        return np.concatenate([upper[::-1], lower[1:-1]])

    def leading_edge_radius(self) -> float:
        """The radius of curvature at the nose, ``(s a0 nose)^2 / 2`` (``s`` the thickness factor)."""
        return 0.5 * (self._scale() * NACA[0] * self.nose) ** 2


def _poly(nose: float, x: np.ndarray) -> np.ndarray:
    a0, _, a2, a3, a4 = NACA
    a1 = -(a0 * nose + a2 + a3 + a4)  # closes the trailing edge for any nose factor
    return a0 * nose * np.sqrt(np.clip(x, 0.0, None)) + a1 * x + a2 * x**2 + a3 * x**3 + a4 * x**4


def rotate(points: np.ndarray, aoa_deg: float) -> np.ndarray:
    """``points`` (n, 2) turned nose up by ``aoa_deg`` degrees about :data:`PIVOT` (clockwise)."""
    a = math.radians(aoa_deg)
    c, s = math.cos(a), math.sin(a)
    rel = np.asarray(points, dtype=np.float64) - PIVOT
    return np.stack([c * rel[:, 0] + s * rel[:, 1], -s * rel[:, 0] + c * rel[:, 1]], axis=1) + PIVOT


def self_intersects(outline: np.ndarray) -> bool:
    """Whether two non-adjacent segments of the closed polygon ``outline`` (n, 2) cross."""
    a, b = outline, np.roll(outline, -1, axis=0)
    n = len(a)
    for i in range(n):
        j = np.arange(i + 2, n if i else n - 1)  # neither the segment itself nor its neighbours
        if not len(j):
            continue
        p, r = a[i], b[i] - a[i]
        q, s = a[j], b[j] - a[j]
        cross = r[0] * s[:, 1] - r[1] * s[:, 0]
        ok = np.abs(cross) > 1e-300
        qp = q - p
        t = np.where(ok, (qp[:, 0] * s[:, 1] - qp[:, 1] * s[:, 0]) / np.where(ok, cross, 1), -1)
        u = np.where(ok, (qp[:, 0] * r[1] - qp[:, 1] * r[0]) / np.where(ok, cross, 1), -1)
        if np.any(ok & (t >= 0) & (t <= 1) & (u >= 0) & (u <= 1)):
            return True
    return False


def signed_area(outline: np.ndarray) -> float:
    """The shoelace area of ``outline``: positive when it runs anticlockwise."""
    x, y = outline[:, 0], outline[:, 1]
    return 0.5 * float(np.sum(x * np.roll(y, -1) - np.roll(x, -1) * y))


# --- the design of a sweep -----------------------------------------------------------------------

def halton(n: int, dim: int, skip: int = 1) -> np.ndarray:
    """The first ``n`` points of the Halton sequence in ``[0, 1)^dim`` (bases 2, 3, 5, ...), from index ``skip``."""
    bases = [2, 3, 5, 7, 11, 13][:dim]
    out = np.zeros((n, dim))
    for k, base in enumerate(bases):
        for i in range(n):
            f, r, m = 1.0, 0.0, i + skip
            while m:
                f /= base
                r += f * (m % base)
                m //= base
            out[i, k] = r
    return out


def inside_hull(point: np.ndarray, others: np.ndarray) -> bool:
    """Whether ``point`` lies strictly inside the convex hull of ``others`` (scaled coordinates)."""
    from scipy.spatial import Delaunay

    if len(others) <= others.shape[1]:
        return False
    try:
        hull = Delaunay(others)
    except Exception:  # a degenerate set (all on a plane): nothing is strictly inside
        return False
    return bool(hull.find_simplex(point) >= 0)


def design(shapes: int, ranges: dict[str, tuple[float, float]] | None = None,
           held: int | None = None) -> tuple[list[Shape], list[Shape]]:
    """(every shape, the held-out ones). With ``shapes >= 12``: the 8 corners of the box of
    ``ranges`` and ``shapes - 8`` Halton points in its middle (``[0.2, 0.8]`` of each range); held
    out are ``held`` (default ``(shapes - 8) // 2``) of those, the nearest the centre first, each
    inside the convex hull of the shapes trained on. Fewer shapes (a reduced size, for a test):
    Halton points only, the one nearest the centre held out (not necessarily inside the hull)."""
    ranges = ranges or RANGES
    lo = np.array([ranges[k][0] for k in ("thickness", "camber", "nose")])
    hi = np.array([ranges[k][1] for k in ("thickness", "camber", "nose")])
    if shapes >= 12:
        corners = np.array([[(c >> k) & 1 for k in range(3)] for c in range(8)], dtype=np.float64)
        unit = np.concatenate([corners, 0.2 + 0.6 * halton(shapes - 8, 3)])
        candidates = list(range(8, shapes))
        held = (shapes - 8) // 2 if held is None else held
    else:
        unit = 0.2 + 0.6 * halton(shapes, 3)
        candidates = list(range(shapes))
        held = 1 if held is None else held
    centre = np.full(3, 0.5)
    candidates.sort(key=lambda i: float(np.linalg.norm(unit[i] - centre)))
    out: list[int] = []
    for i in candidates:
        if len(out) == held:
            break
        rest = [j for j in range(shapes) if j not in out and j != i]
        if shapes < 12 or inside_hull(unit[i], unit[rest]):
            out.append(i)
    family = [Shape(*(round(float(v), 4) for v in lo + u * (hi - lo))) for u in unit]
    return family, [family[i] for i in sorted(out)]


# --- the mesh --------------------------------------------------------------------------------------

def cells_between(length: float, first: float, last: float) -> tuple[int, float]:
    """(cells, blockMesh's grading: last / first) of a geometric series over ``length`` that starts
    at ``first`` and ends near ``last``."""
    if abs(last - first) < 1e-12 * length:
        return max(1, round(length / first)), 1.0
    ratio = (length - first) / (length - last)  # sum of the series = length
    cells = 1 + math.log(last / first) / math.log(ratio)
    return max(1, round(cells)), last / first


@dataclass(frozen=True)
class MeshSizes:
    """The sizes of a C-grid, in chords."""

    radius: float = 12.0  # the far field, from the split station
    wake: float = 12.0  # the outlet, downstream of the trailing edge
    first_cell: float = 2e-3  # at the wall
    far_cell: float = 2.5  # at the far field
    nose_cell: float = 4e-3  # along the surface at the leading edge
    split_cell: float = 0.03  # along the surface at the split station
    tail_cell: float = 6e-3  # along the surface at the trailing edge
    outlet_cell: float = 1.5  # along the wake at the outlet
    depth: float = 0.1  # the one cell's thickness (z)
    scale: float = 1.0  # every cell size times this (coarser above 1)


def _polar(x0: float, r: float, angle_deg: float) -> list[float]:
    """The point at ``angle_deg`` on the circle of radius ``r`` about ``(x0, 0)``."""
    a = math.radians(angle_deg)
    return [x0 + r * math.cos(a), r * math.sin(a)]


def _arc_length(points: np.ndarray) -> float:
    return float(np.sum(np.linalg.norm(np.diff(points, axis=0), axis=1)))


def block_mesh_dict(shape: Shape, aoa_deg: float, sizes: MeshSizes | None = None) -> tuple[str, int]:
    """(``system/blockMeshDict``'s text, its number of cells) of ``shape``'s C-grid at ``aoa_deg``."""
    z = sizes or MeshSizes()
    f = z.scale
    x = 0.5 * (1 - np.cos(np.linspace(0.0, math.pi, 161)))
    upper, lower = shape.surfaces(x)
    k = int(np.argmin(np.abs(x - SPLIT_AT)))
    xs, r, te = float(x[k]), z.radius, 1.0
    # vertices in the body's frame: the nose, the trailing edge, the split stations, the far field
    v = np.array([
        upper[0], [te, 0.0], upper[k], lower[k],  # 0 nose, 1 trailing edge, 2 upper split, 3 lower split
        [xs - r, 0.0], _polar(xs, r, LEAN_FRONT), _polar(xs, r, -LEAN_FRONT),  # 4 front of the C, 5 and 6 the split's
        [te + LEAN_BACK * r, r], [te + LEAN_BACK * r, -r],  # 7 and 8, the trailing edge's, leaning downstream
        [te + z.wake, 0.0], [te + z.wake, r], [te + z.wake, -r],  # 9-11 the outlet
    ])
    # the cells: along the surface (front, rear), away from the wall, along the wake
    n_front, g_front = cells_between(_arc_length(upper[: k + 1]), z.nose_cell * f, z.split_cell * f)
    n_rear, g_rear = cells_between(_arc_length(upper[k:]), z.split_cell * f, z.tail_cell * f)
    n_wall, g_wall = cells_between(r, z.first_cell * f, z.far_cell * f)
    n_wake, g_wake = cells_between(z.wake, z.tail_cell * f, z.outlet_cell * f)
    blocks = [  # (vertices anticlockwise seen from +z, cells, grading)
        ((0, 2, 5, 4), (n_front, n_wall), (g_front, g_wall)),  # upper front
        ((2, 1, 7, 5), (n_rear, n_wall), (g_rear, g_wall)),  # upper rear
        ((3, 0, 4, 6), (n_front, n_wall), (1 / g_front, g_wall)),  # lower front
        ((1, 3, 6, 8), (n_rear, n_wall), (1 / g_rear, g_wall)),  # lower rear
        ((1, 9, 10, 7), (n_wake, n_wall), (g_wake, g_wall)),  # wake, above
        ((1, 8, 11, 9), (n_wall, n_wake), (g_wall, g_wake)),  # wake, below
    ]
    v = rotate(v, aoa_deg)
    polylines = [  # the body's edges, through the outline (interior points only)
        (0, 2, upper[1:k]), (2, 1, upper[k + 1:-1]), (3, 0, lower[k - 1:0:-1]), (1, 3, lower[-2:k:-1]),
    ]
    mid = 0.5 * (180.0 + LEAN_FRONT)
    arcs = [(4, 5, _polar(xs, r, mid)), (6, 4, _polar(xs, r, -mid))]

    def pt(p: np.ndarray, zz: float) -> str:
        return f"({p[0]:.9g} {p[1]:.9g} {zz:g})"

    lines = ["FoamFile { version 2.0; format ascii; class dictionary; object blockMeshDict; }",
             "scale 1;", "vertices", "("]
    lines += [f"    {pt(p, zz)}" for zz in (0.0, z.depth) for p in v]
    lines += [");", "blocks", "("]
    nv = len(v)
    for verts, (n1, n2), (g1, g2) in blocks:
        ids = " ".join(str(i) for i in verts) + " " + " ".join(str(i + nv) for i in verts)
        lines.append(f"    hex ({ids}) ({n1} {n2} 1) simpleGrading ({g1:.6g} {g2:.6g} 1)")
    lines += [");", "edges", "("]
    for a, b, through in polylines:
        for off, zz in ((0, 0.0), (nv, z.depth)):
            inner = " ".join(pt(p, zz) for p in rotate(through, aoa_deg))
            lines.append(f"    polyLine {a + off} {b + off} ({inner})")
    for a, b, mid in arcs:
        for off, zz in ((0, 0.0), (nv, z.depth)):
            lines.append(f"    arc {a + off} {b + off} {pt(rotate(np.array([mid]), aoa_deg)[0], zz)}")
    lines += [");", "boundary", "("]

    def faces(pairs: list[tuple[int, int]]) -> str:
        return " ".join(f"({a} {b} {b + nv} {a + nv})" for a, b in pairs)

    patches = {
        "body": ("wall", [(0, 2), (2, 1), (3, 0), (1, 3)]),
        "inlet": ("patch", [(4, 5), (5, 7), (7, 10), (6, 4), (8, 6), (11, 8)]),
        "outlet": ("patch", [(9, 10), (11, 9)]),
    }
    for name, (kind, pairs) in patches.items():
        lines.append(f"    {name} {{ type {kind}; faces ({faces(pairs)}); }}")
    sides = " ".join(f"({' '.join(str(i) for i in reversed(b[0]))})" for b in blocks) + " " + \
        " ".join(f"({' '.join(str(i + nv) for i in b[0])})" for b in blocks)
    lines += [f"    frontAndBack {{ type empty; faces ({sides}); }}", ");", "mergePatchPairs ();"]
    cells = sum(n1 * n2 for _, (n1, n2), _ in blocks)
    return "\n".join(lines) + "\n", cells
