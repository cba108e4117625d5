"""The model recipe of a run: which model, with which settings, built for which channel counts.

:class:`ModelRecipe` is what a run records and rebuilds: the built-in MeshGraphNet (its settings,
with the defaults of :data:`MESHGRAPHNET_DEFAULTS`, stated here once) or your own model
(``--model FILE.py:NAME`` and its ``--model-args``). ``recipe.build(node_in, edge_in, node_out)``
makes the module; :func:`build_model` rebuilds a run's trained model from its checkpoint.

Your own model: ``--model FILE.py:NAME``.

``--model`` names a callable in a Python file (``models/gnn.py:build``) or in an importable module
(``mypackage.models:build``); ``--model-args`` gives it keyword arguments as a JSON object. It is
called as ``NAME(node_in, edge_in, node_out, **model_args)`` with the dataset's channel counts and
must return a ``torch.nn.Module`` whose ``forward(x, graph, edge_attr)`` maps

- on shards (training, ``predict`` on R ranks): a ``ShardTensor`` ``x`` of the owned rows
  ``(N_own, node_in)``, a ``ShardGraph`` and the normalised edge features of the graph's local
  edges ``(E_local, edge_in)`` to a ``ShardTensor`` ``(N_own, node_out)``;
- on a whole mesh (``predict`` on one process): ``x`` ``(N, node_in)``, ``edge_index`` ``(2, E)``
  and ``edge_attr`` ``(E, edge_in)`` to a tensor ``(N, node_out)``.

A model built from ``meshshard.nn.ShardConv`` around PyG layers and row-wise operations does both
(see ``docs/training.md``). The module is wrapped in ``DomainParallel`` for training.

Safety: code is imported only from a ``--model`` given on the command line. A checkpoint records
the ``--model`` string (``model_spec`` here: ``spec`` alone always means a ``ShardSpec``) and its
arguments as plain text, so a run can be resumed and checked; ``predict`` asks for ``--model``
again rather than import whatever a checkpoint someone sent you names.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from meshshard.partition import loads_json

__all__ = [
    "BUILTIN_MODELS",
    "MESHGRAPHNET_DEFAULTS",
    "TRANSOLVER_DEFAULTS",
    "ModelRecipe",
    "build_model",
    "normalise_spec",
    "model_digest",
    "parse_model_args",
    "load_factory",
    "build_user_model",
    "check_model_output",
    "ModelOutputError",
    "unwrapped_pyg_layers",
    "shard_hint",
    "first_line",
    "NodeModel",
    "transolver_args",
    "BALL_ATTENTION_DEFAULTS",
    "ball_attention_args",
    "builtin_args",
    "PointModel",
    "model_radii",
    "check_model_radius",
]

#: The built-in MeshGraphNet's settings in ``meshshard train`` (a run's config keys) and their
#: defaults: smaller than the paper's 128 / 15 (``MeshGraphNet``'s own constructor defaults), so
#: that a first run on a CPU takes minutes.
MESHGRAPHNET_DEFAULTS: dict[str, Any] = {"latent_size": 64, "hidden_layers": 2, "message_passing_steps": 6,
                                         "activation": "relu", "checkpoint_steps": False, "keep_activations": False,
                                         "global_attention": 0, "attention_heads": 4, "attention_slices": 32}

#: The built-in models ``--model NAME`` selects (nothing is imported for them), and what each is.
BUILTIN_MODELS: dict[str, str] = {
    "meshgraphnet": "MeshGraphNet: encoder, message passing on the mesh's edges, decoder (the default); "
                    "--global-attention K adds a Transolver physics-attention block every K steps",
    "transolver": "Transolver: physics attention over the whole sample, no graph (--model-args width, layers, "
                  "heads, slices, mlp_ratio, checkpoint)",
    "ball-attention": "BallAttentionNet: encoder, ball-query attention blocks over the points within a radius, "
                      "decoder; no graph (--model-args width, layers, heads, radius, max_neighbors, mlp_ratio, "
                      "checkpoint)",
}
#: ``--model transolver``'s settings (``--model-args``) and their defaults.
TRANSOLVER_DEFAULTS: dict[str, Any] = {"width": 128, "layers": 4, "heads": 8, "slices": 32, "mlp_ratio": 4,
                                       "checkpoint": False}
#: ``--model ball-attention``'s settings (``--model-args``) and their defaults. ``radius`` is in the
#: dataset's coordinate units (a number, or a list of radii the blocks take in turn): set it to
#: the spacing of a few points of your clouds.
BALL_ATTENTION_DEFAULTS: dict[str, Any] = {"width": 64, "layers": 4, "heads": 4, "radius": 0.1,
                                           "max_neighbors": 32, "mlp_ratio": 2, "checkpoint": False}

_PLAIN = (str, int, float, bool, type(None))


def _split(model_spec: str) -> tuple[str, str]:
    target, sep, name = model_spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise ValueError(f"Expected --model FILE.py:NAME or MODULE:NAME, NAME a function or class (got {model_spec!r})")
    return target, name


def _is_file(target: str) -> bool:
    return target.endswith(".py") or os.sep in target or "/" in target


def normalise_spec(model_spec: str) -> str:
    """``model_spec`` (a ``--model`` string) with a file path made absolute (a module's is returned
    as given), so a run records which file it trained with, wherever it is resumed from."""
    if not model_spec:
        return ""
    target, name = _split(model_spec)
    return f"{Path(target).resolve()}:{name}" if _is_file(target) else model_spec


def model_digest(model_spec: str) -> str | None:
    """SHA-256 of the source file ``model_spec`` names (a file, or a module's file), for a resumed
    run to notice that the model's code changed; ``None`` when there is no such file to read."""
    target, _ = _split(model_spec)
    if _is_file(target):
        path: Path | None = Path(target)
    else:
        try:
            found = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            found = None
        path = Path(found.origin) if found is not None and found.origin and found.origin.endswith(".py") else None
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path is not None else None
    except OSError:
        return None


def parse_model_args(text: str | None) -> dict[str, Any]:
    """``--model-args``: a JSON object of plain values (strings, numbers, booleans, null and lists of them)."""
    if not text:
        return {}
    try:
        value = loads_json(text, "--model-args")  # strict: no NaN, no nest that exhausts recursion
    except ValueError as err:
        shown = text if len(text) <= 200 else f"{text[:200]}..."
        raise ValueError(f"Expected --model-args to be a JSON object such as '{{\"hidden\": 64}}' "
                         f"(got {shown!r}: {str(err).removeprefix('--model-args: ')})") from None
    if not isinstance(value, dict) or not all(isinstance(k, str) and k.isidentifier() for k in value):
        raise ValueError(f"Expected --model-args to be a JSON object of keyword arguments (got {text!r})")
    for key, v in value.items():
        items = v if isinstance(v, list) else [v]
        if not all(isinstance(i, _PLAIN) for i in items):
            raise ValueError(f"Expected --model-args values to be strings, numbers, booleans or lists of them "
                             f"(got {key}={v!r})")
    return value


def _import(target: str, model_spec: str) -> Any:
    if _is_file(target):
        path = Path(target).resolve()
        if not path.is_file():
            raise ValueError(f"{target}: no such file (--model {model_spec})")
        if path.suffix != ".py":
            raise ValueError(f"Expected --model to name a .py file (got {target})")
        name = f"_meshshard_model_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
        if name in sys.modules:
            return sys.modules[name]
        loader_spec = importlib.util.spec_from_file_location(name, path)
        assert loader_spec is not None and loader_spec.loader is not None
        module = importlib.util.module_from_spec(loader_spec)
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))  # the file may import its neighbours, as when run as a script
        sys.modules[name] = module
        try:
            loader_spec.loader.exec_module(module)
        except SystemExit as err:  # the file's own exit (a script's main run on import): never the command's
            del sys.modules[name]
            raise ValueError(f"--model {model_spec}: importing {target} called sys.exit({err.code!r})") from None
        except Exception as err:
            del sys.modules[name]
            raise ValueError(f"--model {model_spec}: importing {target} failed: "
                             f"{type(err).__name__}: {first_line(err)}") from err
        return module
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # a module of the current folder, as python -m would find it
    try:
        return importlib.import_module(target)
    except SystemExit as err:
        raise ValueError(f"--model {model_spec}: importing {target} called sys.exit({err.code!r})") from None
    except ModuleNotFoundError as err:
        raise ValueError(f"--model {model_spec}: no module {err.name!r} "
                         f"(a file needs its path, e.g. ./{target.replace('.', '/')}.py)") from None
    except Exception as err:
        raise ValueError(f"--model {model_spec}: importing {target} failed: "
                         f"{type(err).__name__}: {first_line(err)}") from err


def first_line(err: BaseException) -> str:
    """The first line of an error's message (empty if it has none)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


def load_factory(model_spec: str) -> Callable[..., Any]:
    """The callable ``--model`` names; a one-line ``ValueError`` for anything that is not one."""
    target, name = _split(model_spec)
    module = _import(target, model_spec)
    factory = getattr(module, name, None)
    if factory is None:
        offered = sorted(k for k, v in vars(module).items()
                         if callable(v) and not k.startswith("_") and getattr(v, "__module__", None) == module.__name__)
        raise ValueError(f"--model {model_spec}: {target} defines no {name!r} "
                         f"(it defines: {', '.join(offered) or 'nothing callable'})")
    if not callable(factory):
        raise ValueError(f"--model {model_spec}: {name} is a {type(factory).__name__}, not a function or class")
    return factory


def build_user_model(model_spec: str, model_args: Mapping[str, Any], node_in: int, edge_in: int, node_out: int) -> Any:
    """``NAME(node_in, edge_in, node_out, **model_args)``, checked to be a ``torch.nn.Module``."""
    import torch

    factory = load_factory(model_spec)
    keywords = "".join(f", {k}={v!r}" for k, v in model_args.items())
    call = f"{_split(model_spec)[1]}({node_in}, {edge_in}, {node_out}{keywords})"
    try:  # does the call fit the signature? (a TypeError from inside, a ShardConv refusal say, is another matter)
        inspect.signature(factory).bind(node_in, edge_in, node_out, **model_args)
        fits = True
    except TypeError:
        fits = False
    except ValueError:  # no signature to read
        fits = True
    try:
        model = factory(node_in, edge_in, node_out, **model_args)
    except SystemExit as err:  # would end the command with the model's exit code, nothing trained
        raise ValueError(f"--model {model_spec}: {call} called sys.exit({err.code!r}) instead of returning a "
                         "model") from None
    except Exception as err:
        hint = (" (it is called with the dataset's input, edge and target channel counts, "
                "then --model-args as keywords)"
                if isinstance(err, TypeError) and not fits else "")
        raise ValueError(f"--model {model_spec}: {call} failed: {type(err).__name__}: {first_line(err)}{hint}") from err
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"--model {model_spec}: {call} returned a {type(model).__name__}, not a torch.nn.Module")
    from torch.distributed.fsdp import FSDPModule  # a class to refuse, as DDP's below; sends nothing
    from torch.nn.parallel import DistributedDataParallel

    from ..nn import DomainParallel

    if isinstance(model, DomainParallel | DistributedDataParallel | FSDPModule):
        raise ValueError(f"--model {model_spec}: {call} returned a {type(model).__name__}; return the bare model "
                         "(meshshard train wraps it in DomainParallel itself)")
    return model


class ModelOutputError(ValueError):
    """The model ran, but returned something other than one row of target values per node."""


def unwrapped_pyg_layers(model: Any) -> list[str]:
    """Names of the PyG ``MessagePassing`` layers in ``model`` that no ``ShardConv`` wraps: on shards
    they are handed a ``ShardTensor`` and a ``ShardGraph``, which they cannot read."""
    pyg = sys.modules.get("torch_geometric.nn")
    if pyg is None:  # a model without PyG layers never imported it
        return []
    from ..nn import ShardConv

    wrappers = [name for name, m in model.named_modules() if isinstance(m, ShardConv)]
    return [name for name, m in model.named_modules() if isinstance(m, pyg.MessagePassing)
            and not any(name.startswith(f"{w}.") or w == "" for w in wrappers)]


def shard_hint(model: Any) -> str:
    """A hint to add to an error raised by ``model`` on shards: its unwrapped PyG layers, if any."""
    names = unwrapped_pyg_layers(model)
    if not names:
        return ""
    from meshshard.partition import listed

    shown = listed(names, limit=3)
    return (f"; the model's PyG layer(s) {shown} are not wrapped in meshshard.nn.ShardConv, which makes them work on a "
            "ShardTensor and a ShardGraph: write ShardConv(SAGEConv(...)) (docs/training.md, \"Your own model\")")


def check_model_output(out: Any, rows: int, node_out: int, model_spec: str, sharded: bool, group: Any = None) -> None:
    """Raise a one-line ``ValueError`` unless the model returned one row of ``node_out`` values per
    node (a ``ShardTensor`` of the owned rows on shards).

    On shards in a process group, the ranks of ``group`` (the ranks sharing the sample; default the
    world) agree first: when the output is wrong on any of them, every one raises the same error,
    naming the lowest such rank, instead of the others going on into a collective that waits for a
    rank that stopped. This costs one small all-reduce.
    """
    problem = _output_problem(out, rows, node_out, model_spec, sharded)
    if sharded:
        from meshshard.comm import agree_on_first_error

        problem = agree_on_first_error(problem, group)
    if problem:
        raise ModelOutputError(problem)


def _output_problem(out: Any, rows: int, node_out: int, model_spec: str, sharded: bool) -> str | None:
    from .._tensor import ShardTensor

    want = f"a ShardTensor ({rows}, {node_out}) of this rank's rows" if sharded else f"a tensor ({rows}, {node_out})"
    if sharded and not isinstance(out, ShardTensor):
        got = f"a {type(out).__name__}" + (f" {tuple(out.shape)}" if hasattr(out, "shape") else "")
        return (f"Expected the model of --model {model_spec} to return {want} on shards (got {got}); keep the "
                "ShardTensor from ShardConv layers and row-wise operations, do not call to_local() at the end")
    local = out.to_local() if isinstance(out, ShardTensor) else out
    if not hasattr(local, "shape") or tuple(local.shape) != (rows, node_out):
        got = tuple(local.shape) if hasattr(local, "shape") else type(out).__name__
        return (f"Expected the model of --model {model_spec} to return {want}, one row per node and one column per "
                f"target channel (got {got})")
    return None


class PointModel(torch.nn.Module):
    """A model of the node rows and their coordinates (``BallAttentionNet``) called as the loop
    calls every model, ``model(x, graph, edge_attr)``; the edge features are not used.

    ``needs_pos`` tells a caller with a whole mesh to pass the coordinates: ``model(x, edge_index,
    edge_attr, pos=pos)`` (``(N, D)``). On shards the coordinates are the owned rows of the
    ``ShardGraph``'s ``pos`` (its first ``num_owned`` rows), and ``pos`` is not needed; the graph
    (one per mesh in the reader, a new one per step under ``--max-points``) keys the model's plan
    cache, so a sample's ball-query plans are built once, not at every step.
    """

    needs_pos = True

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Any, graph: Any = None, edge_attr: Any = None, *, pos: Any = None) -> Any:
        """``inner(x, pos)`` (a ``ShardTensor`` on shards, a tensor on a whole mesh)."""
        from .._graph import ShardGraph

        if pos is None and isinstance(graph, ShardGraph):
            if graph.pos is None:
                raise ValueError("Expected a ShardGraph with coordinates (pos) for a point model")
            pos = graph.pos[: graph.num_owned]
            if hasattr(self.inner, "plan_cache"):  # the graph holds the points: their plans are built once
                return self.inner(x, pos, plan_owner=graph)
        if pos is None:
            raise ValueError("Expected pos=, the (N, D) coordinates of the points, for a point model on a whole mesh")
        return self.inner(x, pos)


class NodeModel(torch.nn.Module):
    """A model of the node rows alone (Transolver) called as the loop calls every model,
    ``model(x, graph, edge_attr)``: the graph and the edge features are not used."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Any, graph: Any = None, edge_attr: Any = None) -> Any:
        """``inner(x)`` (a ``ShardTensor`` on shards, a tensor on a whole mesh)."""
        return self.inner(x)


@dataclass(frozen=True)
class ModelRecipe:
    """Which model a run trains: a built-in one (``model_spec`` empty; ``architecture`` one of
    :data:`BUILTIN_MODELS`: MeshGraphNet's settings in ``settings``, Transolver's in ``args``) or
    your own (``model_spec`` ``FILE.py:NAME``, its keyword arguments in ``args``).

    Built from a run's config (:meth:`from_config`: the keys of ``TrainConfig``, what a checkpoint
    records), so training and every rebuild of the run make the same module.
    """

    model_spec: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=lambda: dict(MESHGRAPHNET_DEFAULTS))
    architecture: str = "meshgraphnet"

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelRecipe:
        """The recipe of a run's config; settings it leaves out take :data:`MESHGRAPHNET_DEFAULTS`
        (a run from before a setting existed trained without it: the default is its value)."""
        settings = {key: config.get(key, default) if config.get(key) is not None else default
                    for key, default in MESHGRAPHNET_DEFAULTS.items()}
        architecture = str(config.get("architecture") or "meshgraphnet")
        if architecture not in BUILTIN_MODELS:
            raise ValueError(f"Expected a built-in model, {', '.join(BUILTIN_MODELS)} (got {architecture!r})")
        return cls(str(config.get("model") or ""), dict(config.get("model_args") or {}), settings, architecture)

    @property
    def name(self) -> str:
        """``MeshGraphNet``, ``Transolver``, or the ``--model`` string."""
        return self.model_spec or {"meshgraphnet": "MeshGraphNet", "transolver": "Transolver",
                                   "ball-attention": "BallAttentionNet"}[self.architecture]

    def build(self, node_in: int, edge_in: int, node_out: int) -> Any:
        """The module for these channel counts (input, edge, target), with fresh weights."""
        if self.model_spec:
            return build_user_model(self.model_spec, self.args, node_in, edge_in, node_out)
        if self.architecture == "transolver":
            from ..nn import Transolver

            return NodeModel(Transolver(node_in, node_out, **transolver_args(self.args)))
        if self.architecture == "ball-attention":
            from ..nn import BallAttentionNet

            a = ball_attention_args(self.args)
            return PointModel(BallAttentionNet(node_in, node_out, pos_dim=max(edge_in - 1, 1), **a))
        from ..nn import MeshGraphNet

        s = self.settings
        return MeshGraphNet(node_in, edge_in, node_out, latent_size=int(s["latent_size"]),
                            hidden_layers=int(s["hidden_layers"]),
                            message_passing_steps=int(s["message_passing_steps"]), activation=str(s["activation"]),
                            checkpoint_steps=bool(s["checkpoint_steps"]), recompute=not s["keep_activations"],
                            global_attention=int(s["global_attention"]), attention_heads=int(s["attention_heads"]),
                            attention_slices=int(s["attention_slices"]))


def _checked_args(model: str, args: Mapping[str, Any], defaults: Mapping[str, Any],
                  zero_ok: tuple[str, ...] = ()) -> dict[str, Any]:
    """A built-in model's ``--model-args`` over its ``defaults``; a one-line ``ValueError`` for a
    name it does not take or a value out of range: ``checkpoint`` true or false, ``radius`` a
    positive number or a list of them, those of ``zero_ok`` integers >= 0, the rest positive integers,
    ``width`` a multiple of ``heads``."""
    unknown = sorted(set(args) - set(defaults))
    if unknown:
        raise ValueError(f"Expected --model-args of --model {model} among {', '.join(defaults)} "
                         f"(got {', '.join(unknown)})")
    out = {**defaults, **args}
    for key, value in out.items():
        if key == "checkpoint":
            if not isinstance(value, bool):
                raise ValueError(f"Expected --model-args checkpoint of --model {model} to be true or false "
                                 f"(got {value!r})")
        elif key == "radius":
            radii = value if isinstance(value, list) else [value]
            if not radii or not all(isinstance(r, (int, float)) and not isinstance(r, bool) and 0 < r < float("inf")
                                    for r in radii):
                raise ValueError(f"Expected --model-args radius of --model {model} to be a positive number or "
                                 f"a list of them (got {value!r})")
        elif isinstance(value, bool) or not isinstance(value, int) or value < (0 if key in zero_ok else 1):
            raise ValueError(f"Expected --model-args {key} of --model {model} to be a positive integer "
                             f"(got {value!r})")
    if out["width"] % out["heads"]:
        raise ValueError(f"Expected --model-args width ({out['width']}) of --model {model} to be a multiple "
                         f"of heads ({out['heads']})")
    return out


def transolver_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """``--model transolver``'s ``--model-args`` over :data:`TRANSOLVER_DEFAULTS` (see :func:`_checked_args`;
    ``mlp_ratio`` 0: no MLP)."""
    return _checked_args("transolver", args, TRANSOLVER_DEFAULTS, zero_ok=("mlp_ratio",))


def ball_attention_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """``--model ball-attention``'s ``--model-args`` over :data:`BALL_ATTENTION_DEFAULTS`
    (see :func:`_checked_args`)."""
    return _checked_args("ball-attention", args, BALL_ATTENTION_DEFAULTS)


def builtin_args(architecture: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """A built-in model's ``--model-args`` checked and over its defaults (MeshGraphNet: none taken)."""
    if architecture == "transolver":
        return transolver_args(args)
    if architecture == "ball-attention":
        return ball_attention_args(args)
    if args:
        raise ValueError("Expected --model-args only with --model")
    return {}


def model_radii(config: Mapping[str, Any]) -> list[float]:
    """The ball radii of a run's model (``--model ball-attention``); none for other models."""
    if config.get("model") or config.get("architecture") != "ball-attention":
        return []
    radius = ball_attention_args(dict(config.get("model_args") or {}))["radius"]
    return [float(r) for r in (radius if isinstance(radius, list) else [radius])]


def check_model_radius(config: Mapping[str, Any], partition: Any) -> None:
    """Raise a one-line ``ValueError`` (naming the partition folder) when the run's model has a ball
    radius larger than the halo radius ``partition`` was made for (``meshshard partition DATA
    --radius R``). A partition that records no radius is accepted: the geometric halo is built at
    run time for the model's radius, so the model is exact on any partition."""
    radii = model_radii(config)
    if not radii:
        return
    from meshshard.data import read_partitions_metadata
    from meshshard.partition import check_radius

    try:
        check_radius(read_partitions_metadata(partition), max(radii))
    except ValueError as err:
        raise ValueError(f"{partition}: {err}") from None


def build_model(ckpt: dict[str, Any], sizes: tuple[int, int, int], dtype: Any, model_spec: Any,
                model_args: dict[str, Any] | None, source: str) -> Any:
    """The run's model with its trained weights, in eval mode, for ``sizes`` = (input, edge,
    target) channels, which come from ``source`` (named in the one-line error when they do not fit
    it): MeshGraphNet (``model_spec`` None), yours built from ``model_spec`` (``file.py:name``), or
    yours already built (``model_spec`` an ``nn.Module``, whose weights are replaced)."""
    from torch import nn

    cfg = ckpt.get("config", {})
    recipe = ModelRecipe.from_config(cfg)
    args = model_args if model_args is not None else recipe.args
    if isinstance(model_spec, nn.Module):
        model, given = model_spec.to(dtype), "the model given"
    elif model_spec:
        model = ModelRecipe(model_spec, args).build(*sizes).to(dtype)
        given = f"--model {model_spec} with --model-args {json.dumps(args)}"
    else:
        model, given = (ModelRecipe(args=recipe.args, settings={**recipe.settings, "checkpoint_steps": False},
                                    architecture=recipe.architecture).build(*sizes).to(dtype), None)
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as err:
        first = str(err).splitlines()[1].strip() if len(str(err).splitlines()) > 1 else str(err)
        if given:
            raise ValueError(
                f"Expected {given} to rebuild the run's model (it "
                f"trained --model {cfg.get('model')} with --model-args {json.dumps(cfg.get('model_args') or {})}), "
                f"with {sizes[0]} input, {sizes[1]} edge and {sizes[2]} target channels from {source}: {first}"
            ) from None
        raise ValueError(
            f"Expected {source} to fit the run's model ({sizes[0]} input, {sizes[2]} target, "
            f"{sizes[1]} edge channels here): {first}"
        ) from None
    model.eval()
    return model
