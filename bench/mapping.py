"""Benchmark of the maps between meshes (``meshshard.data.node_map``): each source mesh triangulated
once for all its maps (a ``SourceCache``), against each map built afresh.

What ``meshshard baseline`` and the priors of ``meshshard dataset --mean-field`` on many meshes do:
``--sources`` training meshes mapped onto each of ``--targets`` other meshes (a shape sweep's meshes:
2-D point sets of about ``--nodes`` points each, a body-like hole in the middle whose size changes
from mesh to mesh, so that some target nodes fall outside a source's hull). Both ways map the same
field and must give the same values, bit for bit (checked); the figure is the time of all the maps.

    python bench/mapping.py [--sources 12] [--targets 12] [--nodes 5000] [--json FILE]

Prints a table, then one JSON object.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _runner import emit


def mesh_points(nodes: int, seed: int) -> np.ndarray:
    """About ``nodes`` points in [-2, 3] x [-2, 2], graded towards an elliptic hole (a body) of a
    thickness set by ``seed``, jittered."""
    rng = np.random.default_rng(seed)
    thickness = 0.08 + 0.12 * rng.random()
    side = int(np.sqrt(nodes * 1.3))
    u, v = np.meshgrid(np.linspace(-1, 1, side), np.linspace(-1, 1, side))
    x = np.sign(u) * np.abs(u) ** 1.5 * 2.5 + 0.5
    y = np.sign(v) * np.abs(v) ** 1.5 * 2.0
    pts = np.c_[x.ravel(), y.ravel()] + rng.normal(scale=0.004, size=(side * side, 2))
    inside = ((pts[:, 0] - 0.5) / 0.5) ** 2 + (pts[:, 1] / (thickness / 2)) ** 2 < 1
    return pts[~inside][:nodes]


def run(sources: int, targets: int, nodes: int) -> dict:
    from meshshard.data import SourceCache, node_map

    src = [mesh_points(nodes, s) for s in range(sources)]
    tgt = [mesh_points(nodes, 1000 + t) for t in range(targets)]
    fields = [np.c_[np.sin(3 * p[:, 0]) * np.cos(2 * p[:, 1]), p[:, 1]] for p in src]
    times, mapped = {}, {}
    for way in ("afresh", "cached"):
        cache = SourceCache() if way == "cached" else None
        start = time.perf_counter()
        out = [sum(node_map(s, t, cache=cache, key=k).apply(f) for k, (s, f) in enumerate(zip(src, fields)))
               for t in tgt]
        times[way] = time.perf_counter() - start
        mapped[way] = out
        if cache is not None:
            built = cache.built
    same = all(np.array_equal(a, b) for a, b in zip(mapped["afresh"], mapped["cached"]))
    maps = sources * targets
    return {"sources": sources, "targets": targets, "nodes": nodes, "maps": maps, "built_cached": built,
            "afresh_s": round(times["afresh"], 4), "cached_s": round(times["cached"], 4),
            "afresh_ms_per_map": round(1000 * times["afresh"] / maps, 3),
            "cached_ms_per_map": round(1000 * times["cached"] / maps, 3),
            "speedup": round(times["afresh"] / times["cached"], 2), "identical": same}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sources", type=int, default=12, help="source meshes (default 12)")
    p.add_argument("--targets", type=int, default=12, help="target meshes (default 12)")
    p.add_argument("--nodes", type=int, default=5000, help="points per mesh, about (default 5000)")
    p.add_argument("--json", help="also write the result here")
    args = p.parse_args()
    r = run(args.sources, args.targets, args.nodes)
    print("| maps | nodes | afresh ms/map | cached ms/map | speedup | triangulations + trees built (cached) | identical |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {r['maps']} ({r['sources']} x {r['targets']}) | {r['nodes']:,} | {r['afresh_ms_per_map']:.1f} | "
          f"{r['cached_ms_per_map']:.1f} | {r['speedup']:.1f}x | {r['built_cached']} | {r['identical']} |")
    if not r["identical"]:
        raise SystemExit("bench/mapping.py: the cached maps differ from the maps built afresh")
    emit(r, args.json)


if __name__ == "__main__":
    main()
