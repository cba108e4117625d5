"""MeshGraphNet (Pfaff et al., 2021, "Learning Mesh-Based Simulation with Graph Networks").

Encoder, processor, decoder::

    h = node_mlp_enc(x)                       e = edge_mlp_enc(edge_attr)
    for each of the `message_passing_steps` processor blocks (weights not shared):
        e' = edge_mlp([e, h[src], h[dst]])    a = sum over edges into each node of e'
        h  = h + node_mlp([h, a])             e = e + e'
    y = decoder(h)

Every MLP has ``hidden_layers`` hidden layers of width ``latent_size`` and ends in a LayerNorm,
except the decoder. Aggregation is ``index_add_`` (sum at ``dst``) in the tensors' dtype (float32
for half-precision messages).

Mixed precision (``torch.autocast`` to bfloat16 or float16): the linear layers run in half
precision; the LayerNorms run in float32 on every device (:class:`FloatLayerNorm`; CUDA's
autocast does so for ``layer_norm``, CPU's would not), so the latent streams ``h`` and ``e``, the
messages and their sums stay float32. On a 50k-node mesh, LayerNorm in bfloat16 put the gradients
of the edge MLPs' LayerNorm parameters (sums over 700k edges that nearly cancel) 80% off float32's;
in float32 the worst tensor is 16% off and all gradients together 8%
(``bench/meshgraphnet_peers.py --only meshshard,meshshard-bf16``). The fused edge MLPs (below) keep
only ``e`` cast to half precision for their backward: a step's peak memory is 0.80x float32's.

Memory: the edge MLP's first layer is applied to ``h`` once per node and gathered per edge (never
the ``(E, 3L)`` concatenation), and by default the MLPs on edges (the edge encoder and every edge
MLP) are recomputed in the backward from their inputs, so a processor step keeps about
``E L + 8 N L`` values for the backward instead of about ``6 E L`` (see :class:`ProcessorBlock`).
The ``state_dict`` is that of the concatenated form.

One module, one ``state_dict``, two inputs:

- the whole graph: ``model(x, edge_index, edge_attr)`` with plain tensors ``x (N, F)``,
  ``edge_index (2, E)``, ``edge_attr (E, F_e)``; returns ``(N, F_out)``;
- a shard: ``model(x, graph, edge_attr)`` with ``x`` a :class:`ShardTensor` of owned rows
  ``(N_own, F)``, ``graph`` a :class:`ShardGraph` and ``edge_attr (E_local, F_e)`` for its local
  edges; returns a ``ShardTensor`` ``(N_own, F_out)``. Forward and every gradient equal the
  whole-graph computation (parameter gradients once summed over the domain group).

Communication on a shard:

- 1-hop partition (``halo_hops=1``): one ``indexed_all_to_all_v`` (``with_halo``) per processor
  step, forward and backward, of the source products ``W_s h`` (``(N_ghost, L)``, as many values
  as ``h``): the node update needs owned rows only;
- k-hop partition (``halo_hops=k >= message_passing_steps``): one ``indexed_all_to_all_v`` of the
  encoded node features before the first step, then none: each step also updates the ghosts, and
  the region where values are exact shrinks by one hop per step (redundant compute, XAeroNet style).

Global reach (``global_attention=k``, off by default): message passing sees as many hops as it has
steps; a :class:`~meshshard.nn.TransolverBlock` without its MLP half (``h + attention(norm(h))``,
Transolver's physics attention over every node of the mesh) after every ``k`` processor steps lets
every node see the whole mesh. On a shard each such block adds one ``all_reduce`` of
``heads * slices * (latent_size / heads + 1)`` values forward and one backward, and stays exact
(the slice tokens sum the owned rows only; in k-hop mode the ghost rows read them back too).
Without it, the model and its ``state_dict`` are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .._graph import ShardGraph, segment_lengths
from .._spec import ShardSpec
from .._tensor import ShardTensor
from ._edge_mlp import Scratch, edge_mlp, edge_step, scatter_sum
from ._transolver import TransolverBlock

__all__ = ["MLP", "MeshGraphNet", "ProcessorBlock"]

_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU, "silu": nn.SiLU, "gelu": nn.GELU, "tanh": nn.Tanh, "elu": nn.ELU,
}


class FloatLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (same parameters, same ``state_dict``) that runs in float32 under autocast.

    Its input, output, weight and bias are float32 whenever the input is half precision (a linear
    layer's output under autocast): the statistics of a row and the output that feeds a residual
    sum keep float32's precision. Outside autocast it is ``nn.LayerNorm``."""

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype not in (torch.float16, torch.bfloat16) or not torch.is_autocast_enabled(x.device.type):
            return super().forward(x)
        with torch.autocast(x.device.type, enabled=False):
            weight = None if self.weight is None else self.weight.float()
            bias = None if self.bias is None else self.bias.float()
            return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps)


class MLP(nn.Sequential):
    """``hidden_layers`` hidden layers of width ``hidden``, then an output layer, then LayerNorm.

    Shapes:
        input: ``(*, in_features)``; output: ``(*, out_features)``.
    """

    def __init__(
        self, in_features: int, out_features: int, hidden: int, hidden_layers: int, activation: str, layer_norm: bool
    ) -> None:
        if activation not in _ACTIVATIONS:
            raise ValueError(f"Expected 'activation' in {sorted(_ACTIVATIONS)} (got {activation!r})")
        if hidden_layers < 0:
            raise ValueError(f"Expected 'hidden_layers' >= 0 (got {hidden_layers})")
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(hidden_layers):
            layers += [nn.Linear(width, hidden), _ACTIVATIONS[activation]()]
            width = hidden
        layers.append(nn.Linear(width, out_features))
        if layer_norm:
            layers.append(FloatLayerNorm(out_features))
        super().__init__(*layers)


class ProcessorBlock(nn.Module):
    """One message-passing step, in the lean form.

    The edge MLP's first layer acts on ``[e, h[src], h[dst]]``. Its weight ``W = [W_e, W_s, W_d]``
    (the ``state_dict`` layout of the concatenated form, unchanged) is applied in pieces::

        W [e, h[src], h[dst]] + b = (W_s h)[src] + (W_d h + b)[dst] + W_e e

    The node products ``W_s h`` and ``W_d h`` are computed once per node (:meth:`node_projections`)
    and gathered per edge, so the ``(E, 3L)`` concatenation is never built or saved, and the first
    layer costs ``E L^2 + 2 N L^2`` instead of ``3 E L^2``. Equal to the concatenated form to
    rounding (a different summation order). The node MLP's first layer is split the same way over
    ``[h, aggregate]``.

    With ``recompute=True`` (the default) the edge MLP keeps nothing for the backward but its
    inputs (``e`` and the two node products) and the LayerNorm statistics, and is recomputed in the
    backward; the node MLP, on ``N_dst`` rows only, keeps its activations (recomputing it saved
    little memory for its time). On a mesh with ``E ~ 13 N`` a step keeps about ``E L + 8 N L``
    values instead of ``6 E L``. The recomputation repeats the same operations, so gradients are
    bitwise those of ``recompute=False``. The aggregation is ``index_add_`` into a fresh ``(num_dst, L)`` buffer in a
    Function that keeps only ``dst`` (autograd's ``index_add_`` would keep the whole ``(E, L)``
    message), accumulated in float32 when the messages are half precision.

    With ReLU, the edge MLP, the sum at destinations and the residual run as one autograd Function
    (:func:`~meshshard.nn._edge_mlp.edge_step`): autograd's formulas, written into ``(E, H)``
    buffers reused from step to step instead of one fresh tensor per operation (on CPU each fresh
    tensor pays its page faults), the first layer's GEMM accumulating into the gathered node
    products. Under autocast its linear layers run in autocast's dtype, as autograd would run them.
    Other activations run the same equations under autograd.

    Shapes:
        h: ``(N_rows, L)``; e: ``(E, L)``; edge_index: ``(2, E)`` into the rows of ``h`` (sources)
        and its first ``num_dst`` rows (destinations). :meth:`forward` returns ``h`` updated on its
        first ``num_dst`` rows, and ``e``.
    """

    def __init__(self, latent: int, hidden_layers: int, activation: str, recompute: bool = True) -> None:
        super().__init__()
        self.latent = latent
        self.recompute = recompute
        self.edge_mlp = MLP(3 * latent, latent, latent, hidden_layers, activation, layer_norm=True)
        self.node_mlp = MLP(2 * latent, latent, latent, hidden_layers, activation, layer_norm=True)

    def node_projections(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """``(W_s h, W_d h + b)``: the edge MLP's first layer applied to every row of ``h`` as a source
        and as a destination, its bias with the destination (added once per edge, on ``N`` rows).
        Shapes: ``h (N_rows, L)`` -> two ``(N_rows, H)``."""
        first = self.edge_mlp[0]
        latent = self.latent
        return F.linear(h, first.weight[:, latent : 2 * latent]), F.linear(h, first.weight[:, 2 * latent :], first.bias)

    def forward(
        self,
        h: Tensor,
        e: Tensor,
        edge_index: Tensor,
        num_dst: int,
        halo: Callable[[Tensor, Tensor], Tensor] | None = None,
        checkpoint_update: bool = False,
        dst_lengths: Tensor | None = None,
        scratch: Scratch | None = None,
    ) -> tuple[Tensor, Tensor]:
        """One step. ``halo``, on a 1-hop shard, makes the source products with the ghost rows
        appended, ``halo(h, W_s) = append(h W_s^T)`` (``(N_own, L) -> (N_own + N_ghost, H)``, the step's
        one exchange, written into one buffer: :meth:`~meshshard.comm.HaloPlan.linear`); ``checkpoint_update``
        recomputes everything after the exchange in the backward. The whole step runs inside this
        call, so wrappers that act around ``forward`` (FSDP2 units) see every parameter use.
        ``dst_lengths`` (``segment_lengths(edge_index[1], num_dst)``, when ``dst`` is sorted) lets
        the sums at destinations run by segments. ``scratch``: the buffers shared by the edge MLPs
        of one forward and backward (:class:`~meshshard.nn._edge_mlp.Scratch`), given only when the
        returned ``e`` goes to the next step and nowhere else (MeshGraphNet's processor): the
        gradient of ``e`` is then one buffer added into down the chain (see
        :func:`~meshshard.nn._edge_mlp.edge_step`)."""
        if halo is None:
            src_proj, dst_proj = self.node_projections(h)
        else:
            first = self.edge_mlp[0]
            src_proj = halo(h, first.weight[:, self.latent : 2 * self.latent])
            dst_proj = F.linear(h, first.weight[:, 2 * self.latent :], first.bias)
        if num_dst < h.shape[0]:  # (a slice of every row would cost a zero-filled copy in the backward)
            h, dst_proj = h[:num_dst], dst_proj[:num_dst]
        args = (h, e, src_proj, dst_proj, edge_index, dst_lengths, scratch)
        if checkpoint_update and torch.is_grad_enabled():
            return checkpoint(self.update, *args, use_reentrant=False)
        return self.update(*args)

    def update(
        self, h_dst: Tensor, e: Tensor, src_proj: Tensor, dst_proj: Tensor, edge_index: Tensor,
        dst_lengths: Tensor | None = None, scratch: Scratch | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The step from the node products: messages, their sum at each destination, the node update.

        Shapes:
            h_dst: ``(N_dst, L)`` rows that receive messages; e: ``(E, L)``; src_proj: ``(N_rows, H)``
            indexed by ``edge_index[0]``; dst_proj: ``(N_dst, H)`` indexed by ``edge_index[1]``.
            Returns ``(N_dst, L)`` and ``(E, L)``.
        """
        src, dst = edge_index[0], edge_index[1]
        if self._fused(e):
            mlp = self.edge_mlp
            params = _fused_params(mlp, mlp[0].weight[:, : self.latent], None)
            e_next, aggregate = edge_step(e, src_proj, dst_proj, src, dst, h_dst.shape[0], _sum_dtype(e), params,
                                          mlp[-1].eps, self.recompute, dst_lengths, scratch, chain=scratch is not None,
                                          half=_half(e))
        else:
            message = self._run(self._message, e, src_proj, dst_proj, src, dst)  # half precision under autocast
            aggregate = scatter_sum(message, dst, h_dst.shape[0], _sum_dtype(message), dst_lengths)
            # in place: nothing keeps the message for the backward (scatter_sum keeps only dst)
            e_next = message.add_(e) if message.dtype == e.dtype else e + message
        h_new = h_dst + self._node(h_dst, aggregate)  # on N_dst rows: saved, not recomputed
        return h_new, e_next

    def _fused(self, e: Tensor) -> bool:
        """Whether the edge MLP runs as one autograd Function (ReLU; see :func:`_fusable`): same
        operations, fewer fresh ``(E, H)`` buffers (see :func:`edge_mlp`)."""
        return _fusable(self.edge_mlp, e)

    def _run(self, fn: Callable[..., Tensor], *args: Tensor) -> Tensor:
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False)
        return fn(*args)

    def _message(self, e: Tensor, src_proj: Tensor, dst_proj: Tensor, src: Tensor, dst: Tensor) -> Tensor:
        z = F.linear(e, self.edge_mlp[0].weight[:, : self.latent])  # the bias is in dst_proj
        z = z.add_(src_proj.index_select(0, src)).add_(dst_proj.index_select(0, dst))
        return _rest(self.edge_mlp, z)

    def _node(self, h: Tensor, aggregate: Tensor) -> Tensor:
        first = self.node_mlp[0]
        z = F.linear(h, first.weight[:, : self.latent], first.bias)
        z = z.add_(F.linear(aggregate.to(z.dtype), first.weight[:, self.latent :]))
        return _rest(self.node_mlp, z)


def _sum_dtype(message: Tensor) -> torch.dtype:
    """The dtype of the sums at destinations: float32 for half-precision messages."""
    return torch.float32 if message.dtype in (torch.float16, torch.bfloat16) else message.dtype


def _half(x: Tensor) -> torch.dtype | None:
    """Autocast's dtype where it applies to ``x`` (a float32 tensor under autocast), else None."""
    if x.dtype != torch.float32 or not torch.is_autocast_enabled(x.device.type):
        return None
    return torch.get_autocast_dtype(x.device.type)


def _fusable(mlp: MLP, x: Tensor) -> bool:
    """Whether ``mlp`` (ending in LayerNorm) runs as one autograd Function: ReLU, and outside
    autocast or under autocast to bfloat16 / float16 with ``x`` float32 (:func:`_half`)."""
    relu = len(mlp) == 2 or type(mlp[1]) is nn.ReLU
    autocast = torch.is_autocast_enabled(x.device.type)
    return relu and type(mlp[-1]) is FloatLayerNorm and (not autocast or _half(x) in (torch.bfloat16, torch.float16))


def _fused_params(mlp: MLP, first_weight: Tensor, first_bias: Tensor | None) -> list[Tensor | None]:
    """``[W_0, b_0, W_1, b_1, ..., gamma, beta]`` of ``mlp`` for :func:`edge_mlp`."""
    params = [first_weight, first_bias]
    params += [p for layer in list(mlp)[2:-1:2] for p in (layer.weight, layer.bias)]
    return params + [mlp[-1].weight, mlp[-1].bias]


def _rest(mlp: MLP, z: Tensor) -> Tensor:
    """The layers of ``mlp`` after the first, on the first layer's output ``z`` (a fresh tensor that
    nothing saved, so ReLU may overwrite it: the ReLU keeps its output for the backward, which the
    next linear layer keeps anyway)."""
    for layer in list(mlp)[1:]:
        z = torch.relu_(z) if type(layer) is nn.ReLU else layer(z)
    return z


class MeshGraphNet(nn.Module):
    """Encode-process-decode graph network for mesh-based simulation.

    Args:
        node_in, edge_in, node_out: input node features, input edge features, output features.
        latent_size: width of every latent and hidden layer (paper: 128).
        hidden_layers: hidden layers per MLP (paper: 2).
        message_passing_steps: processor blocks, weights not shared (paper: 15).
        activation: ``"relu"`` (paper), ``"silu"``, ``"gelu"``, ``"tanh"`` or ``"elu"``.
        checkpoint_steps: recompute each processor block in the backward (memory for time); the
            block's halo exchange runs before it and is not repeated.
        recompute: recompute the MLPs on edges (edge encoder, edge MLPs) and the node encoder and
            decoder in the backward from their inputs instead of saving their hidden activations
            (the default; see :class:`ProcessorBlock`). Bitwise the same gradients; ``False``
            trades about ``3 E L`` values per step for a quarter less compute in the backward.
        global_attention: ``k > 0``: a physics-attention block (:class:`~meshshard.nn.TransolverBlock`
            with ``mlp_ratio=0``, in ``self.attention``) after every ``k`` processor steps, for
            reach over the whole mesh (module docstring); ``0`` (the default): none.
        attention_heads, attention_slices: those blocks' heads and slices per head.

    Shapes:
        See the module docstring: whole graph ``(N, node_in) -> (N, node_out)``; shard
        ``ShardTensor (N_own, node_in) -> ShardTensor (N_own, node_out)``.
    """

    def __init__(
        self,
        node_in: int,
        edge_in: int,
        node_out: int,
        *,
        latent_size: int = 128,
        hidden_layers: int = 2,
        message_passing_steps: int = 15,
        activation: str = "relu",
        checkpoint_steps: bool = False,
        recompute: bool = True,
        global_attention: int = 0,
        attention_heads: int = 4,
        attention_slices: int = 32,
    ) -> None:
        super().__init__()
        if message_passing_steps < 1:
            raise ValueError(f"Expected 'message_passing_steps' >= 1 (got {message_passing_steps})")
        if isinstance(global_attention, bool) or not isinstance(global_attention, int) or not (
            0 <= global_attention <= message_passing_steps
        ):
            raise ValueError(
                f"Expected 'global_attention' to be 0 (off) or a number of steps in [1, {message_passing_steps}] "
                f"(got {global_attention!r})"
            )
        self.node_encoder = MLP(node_in, latent_size, latent_size, hidden_layers, activation, layer_norm=True)
        self.edge_encoder = MLP(edge_in, latent_size, latent_size, hidden_layers, activation, layer_norm=True)
        self.processor = nn.ModuleList(
            ProcessorBlock(latent_size, hidden_layers, activation, recompute) for _ in range(message_passing_steps)
        )
        self.decoder = MLP(latent_size, node_out, latent_size, hidden_layers, activation, layer_norm=False)
        self.checkpoint_steps = checkpoint_steps
        self.recompute = recompute
        self.global_attention = global_attention
        self.attention: nn.ModuleList | None = None  # (no entry in the state_dict when off)
        if global_attention:
            self.attention = nn.ModuleList(
                TransolverBlock(latent_size, attention_heads, attention_slices, mlp_ratio=0)
                for _ in range(message_passing_steps // global_attention)
            )

    def _attend(self, step: int, h: Tensor, spec: ShardSpec | None) -> Tensor:
        """``h`` after processor step ``step`` (from 0): through an attention block after every
        ``global_attention`` steps, unchanged otherwise. ``spec``: as
        :meth:`~meshshard.nn.PhysicsAttention.forward_local` (``None`` on the whole graph)."""
        k = self.global_attention
        if self.attention is None or (step + 1) % k:
            return h
        return self.attention[(step + 1) // k - 1].forward_local(h, spec)

    def forward(self, x: Any, graph: Any, edge_attr: Tensor) -> Any:
        """Encode, process and decode: the node values at every node.

        Shapes:
            whole graph: ``x`` ``(N, node_in)``, ``graph`` an ``edge_index`` ``(2, E)``,
            ``edge_attr`` ``(E, edge_in)`` -> ``(N, node_out)``;
            on a shard: ``x`` a ``ShardTensor`` ``(N_own, node_in)``, ``graph`` a ``ShardGraph``,
            ``edge_attr`` ``(E_local, edge_in)`` -> a ``ShardTensor`` ``(N_own, node_out)``.

        Communication (shards): per processor step, one halo exchange of the node latents (1-hop
        mode) forward and its adjoint backward; none in k-hop mode. With ``global_attention``, one
        ``all_reduce`` forward and one backward per attention block.
        """
        if isinstance(graph, ShardGraph):
            return self._forward_shard(x, graph, edge_attr)
        if isinstance(x, ShardTensor):
            raise TypeError("Expected a ShardGraph with a ShardTensor input (got a plain edge_index)")
        return self._forward_whole(x, graph, edge_attr)

    def _mlp(self, mlp: MLP, x: Tensor) -> Tensor:
        """An encoder or the decoder on local rows, recomputed in the backward when ``recompute``."""
        if self.recompute and torch.is_grad_enabled():
            return checkpoint(mlp, x, use_reentrant=False, preserve_rng_state=False)
        return mlp(x)

    def _encode_edges(self, edge_attr: Tensor, scratch: Scratch) -> Tensor:
        """The edge encoder: one autograd Function into reused buffers where it fits (ReLU; see
        :func:`_fusable` and :func:`~meshshard.nn._edge_mlp.edge_mlp`), recomputed when ``recompute``.
        Its backward is the last edge MLP's of a backward pass: it lets ``scratch``'s buffers go."""
        mlp = self.edge_encoder
        if not _fusable(mlp, edge_attr):
            return self._mlp(mlp, edge_attr)
        params = _fused_params(mlp, mlp[0].weight, mlp[0].bias)
        return edge_mlp(edge_attr, None, None, None, None, params, mlp[-1].eps,
                        self.recompute and torch.is_grad_enabled(), scratch=scratch, release=True,
                        half=_half(edge_attr))

    def _forward_whole(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        _check_inputs(x, edge_index, edge_attr, x.shape[0] if isinstance(x, Tensor) else None)
        h = self._mlp(self.node_encoder, x)
        scratch = Scratch()
        e = self._encode_edges(edge_attr, scratch)
        lengths = segment_lengths(edge_index[1], h.shape[0])
        for step, block in enumerate(self.processor):
            h, e = block(h, e, edge_index, h.shape[0], None, self.checkpoint_steps, lengths, scratch)
            h = self._attend(step, h, None)
        return self._mlp(self.decoder, h)

    def _forward_shard(self, x: ShardTensor, graph: ShardGraph, edge_attr: Tensor) -> ShardTensor:
        if not isinstance(x, ShardTensor):
            raise TypeError(f"Expected 'x' to be a ShardTensor with a ShardGraph (got {type(x).__name__})")
        if x.spec != graph.spec:
            raise ValueError(f"Expected 'x' laid out by the graph's spec {graph.spec!r} (got {x.spec!r})")
        _check_inputs(x.to_local(), graph.edge_index, edge_attr, graph.num_local)
        steps = len(self.processor)
        scratch = Scratch()
        e = self._encode_edges(edge_attr, scratch)
        spec = graph.spec
        if graph.halo_hops == 1:
            # Only the source products W_s h cross ranks (as many values as h itself): the node
            # MLP and W_d h need owned rows only, so h is never exchanged.
            h = self._mlp(self.node_encoder, x.to_local())

            def halo(rows: Tensor, weight: Tensor) -> Tensor:
                if not spec.has_halo:  # with_halo says what is missing
                    return ShardTensor(F.linear(rows, weight), spec).with_halo()
                return spec.halo.linear(rows, weight)

            lengths = graph.dst_lengths(graph.num_owned)
            for step, block in enumerate(self.processor):
                h, e = block(h, e, graph.edge_index, graph.num_owned, halo, self.checkpoint_steps, lengths, scratch)
                h = self._attend(step, h, spec)
            return ShardTensor(self._mlp(self.decoder, h), spec)
        if graph.halo_hops < steps:
            raise ValueError(
                f"A partition with halo_hops={graph.halo_hops} covers at most {graph.halo_hops} message-passing "
                f"steps without exchange; this model has {steps}. Partition with --halo-hops {steps} or more, "
                "or with --halo-hops 1 (one exchange per step)"
            )
        # the one exchange: every local row, owned and ghost; then every step updates them all
        h = ShardTensor(self._mlp(self.node_encoder, x.to_local()), spec).with_halo()
        lengths = graph.dst_lengths(graph.num_local)
        for step, block in enumerate(self.processor):
            h, e = block(h, e, graph.edge_index, graph.num_local, None, self.checkpoint_steps, lengths, scratch)
            h = self._attend(step, h, spec)  # the tokens count owned rows; every local row reads them back
        return ShardTensor(self._mlp(self.decoder, h[: graph.num_owned]), spec)


def _check_inputs(x: Tensor, edge_index: Tensor, edge_attr: Tensor, num_rows: int | None) -> None:
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
        got = tuple(edge_index.shape) if isinstance(edge_index, Tensor) else type(edge_index).__name__
        raise ValueError(f"Expected 'edge_index' of shape (2, E) (got {got})")
    if edge_attr.dim() != 2 or edge_attr.shape[0] != edge_index.shape[1]:
        raise ValueError(
            f"Expected 'edge_attr' of shape ({edge_index.shape[1]}, F_e), one row per edge "
            f"(got {tuple(edge_attr.shape)})"
        )
    if x.dim() != 2:
        raise ValueError(f"Expected 'x' to be two-dimensional (N, F) (got {x.dim()} dimensions)")
