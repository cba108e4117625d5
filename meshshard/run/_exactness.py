"""Is your model exact on shards? :func:`check_model_exact` runs it on R ranks and on one process.

The check we run on our own layers, for a model of yours (``meshshard selftest --model
FILE.py:NAME``): a model that reads a statistic of a rank's rows only (``x - x.mean(0)`` on
``x.to_local()``), or a PyG layer declared ``ShardConv(layer, local=True)`` that in fact reads its
sources' degrees, runs without an error on shards and trains another model than the one you
wrote. Here it is built exactly as ``meshshard train --model`` builds it (:class:`ModelRecipe`:
``NAME(node_in, edge_in, node_out, **model_args)``, seeded), then

1. on one process, on the whole mesh: ``model(x, edge_index, edge_attr)`` with plain tensors;
2. on ``R`` local ranks (:func:`meshshard.comm.launch_local`, gloo on the CPU), each holding one
   METIS part of the same mesh: ``DomainParallel(model)(x_shard, graph, edge_attr_shard)`` with the
   same weights, as training runs it. Each rank reads only its part and its rows, from a temporary
   folder (a partition folder, ``.npy`` arrays, the weights; its rows and gradients come back as
   tensors, read with ``weights_only=True``);

and the two are compared: the output, the gradient of the node features ``x`` and of the edge
features ``edge_attr`` (each edge's gradient from the rank that stores it) and of every parameter
(summed over the ranks, by ``DomainParallel``). The loss is ``sum(output * w)``, ``w`` fixed random
weights, so every output element reaches every gradient.

The mesh is a small generated one (a jittered lattice of tetrahedra, :data:`SMALL_MESH_SHAPE`
points) unless you name a file (any mesh :func:`meshshard.partition.read_input` reads). The node
features are seeded normal numbers; the edge features are those training gives the model
(``pos[src] - pos[dst]`` and its length, ``D + 1`` channels), standardised per channel.

The model runs in training mode (BatchNorm with batch statistics, as in training), with its
``nn.Dropout`` modules switched off: dropout draws each rank's own mask, the same distribution as
one process but not the same numbers. Dropout inside a layer (``GATConv(dropout=...)``) must be 0
for the check.

An error is ``max |shards - one process|`` over a tensor, divided by the tensor's largest value on
one process (at least 1, so that a gradient that vanishes up to rounding is not a failure). The
tolerance is :data:`TOLERANCES`: 1e-10 in float64, 1e-5 in float32.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._recipe import ModelOutputError, ModelRecipe, check_model_output, first_line, normalise_spec, parse_model_args

__all__ = ["SMALL_MESH_SHAPE", "TOLERANCES", "ExactnessReport", "TensorError", "check_model_exact", "small_mesh"]

#: Largest relative error accepted, by dtype.
TOLERANCES: dict[str, float] = {"float64": 1e-10, "float32": 1e-5}

#: Points per axis of the generated mesh (:func:`small_mesh`): 210 nodes, 720 tetrahedra.
SMALL_MESH_SHAPE = (7, 6, 5)


@dataclass(frozen=True)
class TensorError:
    """One compared tensor: ``name`` (``output``, ``grad of x``, ``grad of edge_attr``, ``grad of
    <parameter>``), its ``shape``, and ``error`` (relative, see the module docstring)."""

    name: str
    shape: tuple[int, ...]
    error: float


@dataclass(frozen=True)
class ExactnessReport:
    """What :func:`check_model_exact` found: the model, the setting, and every tensor's error."""

    model: str
    model_args: dict[str, Any]
    ranks: int
    dtype: str
    mesh: str
    num_nodes: int
    num_edges: int
    owned_per_rank: tuple[int, ...]
    errors: tuple[TensorError, ...]

    @property
    def tolerance(self) -> float:
        """The largest error accepted in this dtype (:data:`TOLERANCES`)."""
        return TOLERANCES[self.dtype]

    @property
    def worst(self) -> TensorError:
        """The tensor with the largest error (a NaN error counts as the largest)."""
        return max(self.errors, key=lambda e: math.inf if math.isnan(e.error) else e.error)

    @property
    def passed(self) -> bool:
        """Every error within :attr:`tolerance`."""
        return all(e.error <= self.tolerance for e in self.errors)

    @property
    def verdict(self) -> str:
        """One line: exact, or which tensor differs and by how much."""
        where = (f"on {self.ranks} rank{'s' if self.ranks > 1 else ''} (METIS parts of {self.num_nodes} nodes: "
                 f"{', '.join(map(str, self.owned_per_rank))}), {self.dtype}")
        worst = self.worst
        if self.passed:
            return (f"exact {where}: the output and all {len(self.errors) - 1} gradients equal one process within "
                    f"{self.tolerance:g} (worst {worst.error:.1e}, {worst.name})")
        bad = sum(not e.error <= self.tolerance for e in self.errors)
        return (f"NOT exact {where}: {worst.name} differs from one process by {worst.error:.1e} "
                f"(tolerance {self.tolerance:g}; {bad} of {len(self.errors)} tensors differ)")


def small_mesh(shape: tuple[int, int, int] = SMALL_MESH_SHAPE, seed: int = 0) -> Any:
    """A generated tetrahedral mesh (:class:`meshshard.partition.InputData`): a lattice of
    ``shape`` points, jittered (seeded), each cube cut into 6 tetrahedra around its main diagonal."""
    from meshshard.partition import InputData

    axes = np.meshgrid(*[np.arange(n, dtype=np.float64) for n in shape], indexing="ij")
    pos = np.stack(axes, -1).reshape(-1, 3) + np.random.default_rng(seed).uniform(-0.2, 0.2, (math.prod(shape), 3))
    ids = np.arange(len(pos)).reshape(shape)
    nx, ny, nz = (n - 1 for n in shape)
    corner = {c: ids[c[0]: c[0] + nx, c[1]: c[1] + ny, c[2]: c[2] + nz].ravel()
              for c in np.ndindex(2, 2, 2)}
    tets = []
    for order in ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)):
        at = [0, 0, 0]
        path = [corner[(0, 0, 0)]]
        for axis in order:  # from corner 000 to 111, one axis at a time
            at[axis] = 1
            path.append(corner[(at[0], at[1], at[2])])
        tets.append(np.stack(path, 1))
    cells = np.concatenate(tets)
    return InputData(f"generated {'x'.join(map(str, shape))} lattice", "", "mesh", len(pos), pos, [("tetra", cells)])


def _check_arguments(model_args: Mapping[str, Any] | str | None, ranks: int, dtype: str, node_in: int,
                     node_out: int) -> dict[str, Any]:
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"Expected --nproc to be 1 or more (got {ranks!r})")
    if dtype not in TOLERANCES:
        raise ValueError(f"Expected --dtype float64 or float32 (got {dtype!r})")
    for flag, value in (("--node-in", node_in), ("--node-out", node_out)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"Expected {flag} to be a positive integer (got {value!r})")
    if model_args is None or isinstance(model_args, str):
        return parse_model_args(model_args)
    try:
        text = json.dumps(dict(model_args))
    except (TypeError, ValueError):
        raise ValueError(f"Expected model_args to be plain values, as JSON holds them (got {model_args!r})") from None
    return parse_model_args(text)


def _read_mesh(mesh: str | Path | None, ranks: int) -> tuple[str, Any]:
    """(its name, its graph): the generated mesh, or the file's nodal graph; checked to split into ``ranks``."""
    from meshshard.partition import build_graph, read_input

    if mesh is None:
        data = small_mesh()
        name = data.name
    else:
        name = str(mesh)
        try:
            data = read_input(mesh)
        except (ValueError, OSError) as err:
            raise ValueError(f"--mesh {mesh}: {' '.join(str(err).split())}") from None
    graph = build_graph(data)
    if graph.pos is None:
        raise ValueError(f"--mesh {name}: Expected coordinates (the edge features are made from them; "
                         "the file has none)")
    if graph.num_nodes < 2 * ranks or graph.num_edges == 0:
        raise ValueError(f"--mesh {name}: {graph.num_nodes} nodes and {graph.num_edges} edges, too small for "
                         f"{ranks} parts (at least 2 nodes per rank and some edges)")
    return name, graph


def _inputs(graph: Any, node_in: int, node_out: int, dtype: Any, seed: int) -> dict[str, Any]:
    """The whole mesh's tensors: ``x`` (N, node_in), ``edge_index`` (2, E), ``edge_attr`` (E, D + 1)
    standardised, ``weights`` (N, node_out) of the loss."""
    import torch

    from .._graph import edge_features

    g = torch.Generator().manual_seed(seed)
    edge_index = torch.as_tensor(graph.edge_index())
    e = edge_features(torch.as_tensor(graph.pos, dtype=torch.float64), edge_index)
    e = (e - e.mean(0)) / e.std(0).clamp_min(1e-12)
    return {"x": torch.randn(graph.num_nodes, node_in, generator=g, dtype=torch.float64).to(dtype),
            "edge_index": edge_index, "edge_attr": e.to(dtype),
            "weights": torch.randn(graph.num_nodes, node_out, generator=g, dtype=torch.float64).to(dtype)}


def _build(model_spec: str, model_args: dict[str, Any], sizes: tuple[int, int, int], dtype: Any, seed: int) -> Any:
    """The model as ``meshshard train`` builds it (seeded), in training mode with dropout off."""
    import torch

    with torch.random.fork_rng(devices=[]):  # seeded as training seeds it, the caller's generator left alone
        torch.manual_seed(seed)
        model = ModelRecipe(model_spec, model_args).build(*sizes).to(dtype)
    model.train()
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.eval()
    return model


def _grads(model: Any) -> dict[str, Any]:
    import torch

    return {name: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
            for name, p in model.named_parameters() if p.requires_grad}


def _whole(model: Any, t: dict[str, Any], model_spec: str) -> dict[str, Any]:
    """Forward and backward on one process, the whole mesh: the output and every gradient."""
    x = t["x"].clone().requires_grad_()
    e = t["edge_attr"].clone().requires_grad_()
    step = "forward"
    try:
        out = model(x, t["edge_index"], e)
        check_model_output(out, x.shape[0], t["weights"].shape[1], model_spec, sharded=False)
        step = "backward"
        (out * t["weights"]).sum().backward()
    except ModelOutputError:
        raise
    except Exception as err:
        raise ValueError(f"--model {model_spec}: its {step} on one process (x {tuple(x.shape)}, edge_index "
                         f"{tuple(t['edge_index'].shape)}, edge_attr {tuple(e.shape)}) failed: "
                         f"{type(err).__name__}: {first_line(err)}") from err
    return {"output": out.detach(), "grad of x": _grad(x), "grad of edge_attr": _grad(e), "params": _grads(model)}


def _grad(t: Any) -> Any:
    import torch

    return t.grad.detach() if t.grad is not None else torch.zeros_like(t).detach()


def _on_rank(job: dict[str, Any]) -> None:
    """One rank of the check (started by ``launch_local``): the model on this rank's part, its
    owned output rows and gradients written to ``job["folder"]/rank-R.pt``."""
    import torch

    from meshshard.comm import init_distributed, shutdown
    from meshshard.partition import load_partition

    from .._graph import ShardGraph
    from .._tensor import ShardTensor
    from ..nn import DomainParallel

    ctx = init_distributed()
    folder = Path(job["folder"])
    dtype = getattr(torch, job["dtype"])
    graph = ShardGraph.from_partition(load_partition(folder / "parts", ctx.rank), device=ctx.device, dtype=dtype)
    model = _build(job["model"], job["model_args"], job["sizes"], dtype, job["seed"]).to(ctx.device)
    model.load_state_dict(torch.load(folder / "state.pt", weights_only=True))
    wrapped = DomainParallel(model)
    ids, edge_ids = torch.as_tensor(graph.spec.owned_ids).cpu(), graph.global_edge_ids.cpu()

    def rows(name: str, index: Any) -> Any:  # this rank's rows of a whole-mesh array, read from its file
        return torch.from_numpy(np.load(folder / f"{name}.npy", mmap_mode="r")[index.numpy()]).to(ctx.device)

    xs = rows("x", ids).requires_grad_()
    es = rows("edge_attr", edge_ids).requires_grad_()
    out = wrapped(ShardTensor.from_local(xs, graph.spec), graph, es)
    check_model_output(out, graph.num_owned, job["sizes"][2], job["model"], sharded=True)
    (out.to_local() * rows("weights", ids)).sum().backward()  # this rank's part of the loss
    result = {"ids": ids, "output": out.to_local().detach().cpu(), "grad of x": _grad(xs).cpu(),
              "edge_ids": edge_ids, "grad of edge_attr": _grad(es).cpu()}
    if ctx.rank == 0:  # DomainParallel has summed the parameters' gradients on every rank
        result["params"] = {k: v.cpu() for k, v in _grads(model).items()}
    torch.save(result, Path(job["folder"]) / f"rank-{ctx.rank}.pt")
    shutdown()


def _error(actual: Any, expected: Any) -> float:
    if expected.numel() == 0:
        return 0.0
    diff = float((actual.double() - expected.double()).abs().max())
    return diff / max(1.0, float(expected.double().abs().max()))


def _gather(folder: Path, ranks: int, whole: dict[str, Any]) -> dict[str, Any]:
    """The ranks' rows and gradients put together in the whole mesh's numbering."""
    import torch

    found = [torch.load(folder / f"rank-{r}.pt", weights_only=True) for r in range(ranks)]
    shards: dict[str, Any] = {key: torch.zeros_like(whole[key]) for key in ("output", "grad of x", "grad of edge_attr")}
    for f in found:
        shards["output"][f["ids"]] = f["output"]
        shards["grad of x"][f["ids"]] = f["grad of x"]
        shards["grad of edge_attr"].index_add_(0, f["edge_ids"], f["grad of edge_attr"])
    shards["params"] = found[0]["params"]
    return shards


def check_model_exact(model_spec: str, model_args: Mapping[str, Any] | str | None = None, *, ranks: int = 3,
                      mesh: str | Path | None = None, dtype: str = "float64", node_in: int = 3, node_out: int = 2,
                      seed: int = 0, on_start: Callable[[str], None] | None = None) -> ExactnessReport:
    """Run ``--model`` on ``ranks`` local ranks and on one process, and compare (module docstring).

    Args:
        model_spec: ``FILE.py:NAME`` or ``MODULE:NAME``, as ``meshshard train --model`` takes it.
        model_args: its keyword arguments (``--model-args``): a mapping, or the JSON text.
        ranks: how many METIS parts, and local ranks (gloo on the CPU, or NCCL with a GPU each).
        mesh: a mesh file; default a generated one (:func:`small_mesh`).
        dtype: ``"float64"`` (tolerance 1e-10) or ``"float32"`` (1e-5).
        node_in, node_out: the model's input and output channels (``edge_in`` is the mesh's
            dimension + 1, as in training).
        seed: seeds the weights, the features and the loss weights.
        on_start: called with a one-line description once the arguments, the model and the
            mesh are checked, just before the ranks start (a command prints it).

    Returns:
        An :class:`ExactnessReport`; ``report.passed`` says whether it is exact.

    Raises:
        ValueError: bad arguments, a model that cannot be loaded or built, a mesh too small for
            ``ranks`` parts, or an output of the wrong shape on the whole mesh: one line, before
            any rank starts.
        meshshard.comm.RankFailed: the model failed on a rank (its error, on one line).
    """
    import torch

    from meshshard.comm import launch_local
    from meshshard.partition import partition_graph, save_partition

    args = _check_arguments(model_args, ranks, dtype, node_in, node_out)
    model_spec = normalise_spec(model_spec)
    torch_dtype = getattr(torch, dtype)
    name, graph = _read_mesh(mesh, ranks)
    tensors = _inputs(graph, node_in, node_out, torch_dtype, seed)
    sizes = (node_in, int(tensors["edge_attr"].shape[1]), node_out)
    model = _build(model_spec, args, sizes, torch_dtype, seed)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}  # before a forward moves BatchNorm's stats
    whole = _whole(model, tensors, model_spec)
    parts = partition_graph(graph, ranks, seed=seed)
    with tempfile.TemporaryDirectory(prefix="meshshard-exactness-") as folder:
        # what the ranks read, each its own part and rows: the partition folder, the arrays, the weights
        save_partition(parts, Path(folder) / "parts")
        for key in ("x", "edge_attr", "weights"):
            np.save(Path(folder) / f"{key}.npy", tensors[key].numpy())
        torch.save(state, Path(folder) / "state.pt")
        job = {"model": model_spec, "model_args": args, "sizes": sizes, "dtype": dtype, "seed": seed,
               "folder": folder}
        if on_start is not None:
            on_start(f"{ranks} local rank{'s' if ranks > 1 else ''} and one process, {name} ({graph.num_nodes} nodes), "
                     f"{dtype}")
        launch_local(_on_rank, ranks, job)
        shards = _gather(Path(folder), ranks, whole)
    errors = [TensorError(key, tuple(whole[key].shape), _error(shards[key], whole[key]))
              for key in ("output", "grad of x", "grad of edge_attr")]
    errors += [TensorError(f"grad of {p}", tuple(g.shape), _error(shards["params"][p], g))
               for p, g in whole["params"].items()]
    return ExactnessReport(model_spec, args, ranks, dtype, name, graph.num_nodes, graph.num_edges,
                           tuple(int(len(p.owned_ids)) for p in parts), tuple(errors))
