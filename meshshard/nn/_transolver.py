"""Transolver (Wu et al. 2024, "Transolver: A Fast Transformer Solver for PDEs on General Geometries").

Physics attention lets every point see every other point of the sample at a cost linear in the
number of points: the points are softly assigned to ``S`` learned slices, each slice is summarised
by one token (a weighted mean over *all* points), attention runs among the ``S`` tokens, and each
point reads the attended tokens back with its own slice weights. Per head ``h``::

    w_i   = softmax_s( (W_w x_i + b_w)_h / tau_h )              slice weights, (S,) per point
    f_i   = (W_f x_i + b_f)_h                                   the features a head slices, (D,)
    z_s   = sum_i w_is f_i / (sum_i w_is + eps)                 slice tokens, (S, D)
    z'    = softmax(q k^T / sqrt(D)) v,  [q, k, v] = z W_qkv     attention among the tokens
    y_i   = W_o concat_h( sum_s w_is z'_s ) + b_o               deslice, then the output projection

``tau_h`` is a temperature per head (learned by default, kept positive as ``exp(log_temperature)``).

Exact on shards by construction. Everything but the slice tokens is row-wise (each point's slice
weights, features, read-back and output depend on that point's row and on the tokens), and the
tokens are ratios of two sums over the points, which split into per-rank partial sums: each rank
sums its owned rows, one all-reduce adds the numerators and denominators of every rank, and every
rank then holds the tokens of the whole sample (to rounding: float addition in another order) and
runs the same attention among them. The backward is the adjoint: each rank's read-back gives its
rows' part of the tokens' gradient, and the all-reduce of the gradient (:func:`meshshard.comm.sum_of_parts`)
hands every rank the whole of it, so inputs and every parameter get the single-process gradient
(parameters: each rank's part, summed over the domain group as for any layer).

One module, one ``state_dict``, two inputs: a plain tensor ``(N, F)`` (the whole sample, no
communication, even inside a process group), or a :class:`~meshshard.ShardTensor` of owned rows
``(N_own, F)`` (any layout, uneven shards and ranks with no rows included). One sample per call:
a batch of samples goes through one at a time (the training loop's ``--batch`` is micro-steps), and
a three-dimensional input is refused, since slices must not mix samples.

Shapes (glossary): ``N`` points, ``N_own`` owned rows, ``F`` width, ``H`` heads, ``S`` slices,
``D`` the width of a head.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from meshshard.comm import sum_of_parts

from .._spec import ShardSpec
from .._tensor import ShardTensor

__all__ = ["PhysicsAttention", "TransolverBlock", "Transolver"]

_HALF = (torch.float16, torch.bfloat16)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Expected '{name}' to be a positive integer (got {value!r})")
    return value


def _local_rows(x: Any) -> tuple[Tensor, ShardSpec | None]:
    """The rows a layer works on, and the layout they come from (``None``: a whole sample)."""
    if isinstance(x, ShardTensor):
        return x.to_local(), x.spec
    if not isinstance(x, Tensor):
        raise TypeError(f"Expected 'x' to be a torch.Tensor or a ShardTensor (got {type(x).__name__})")
    return x, None


def _check_rows(x: Tensor, width: int, spec: ShardSpec | None, layer: str) -> None:
    if x.dim() != 2:
        raise ValueError(
            f"{layer} takes one sample, x of shape (N, {width}) (got {x.dim()} dimensions); run the samples of a "
            "batch one at a time, so that slices never mix samples"
        )
    if x.shape[1] != width:
        raise ValueError(f"Expected 'x' to have {width} features (got {x.shape[1]})")
    if spec is not None and x.shape[0] < spec.num_owned:
        raise ValueError(f"Expected 'x' to hold at least spec.num_owned = {spec.num_owned} rows (got {x.shape[0]})")


class PhysicsAttention(nn.Module):
    """Transolver's physics attention: slice, attend among the slice tokens, deslice (module docstring).

    Args:
        width: features in and out (``F``).
        heads: attention heads (``H``); each has its own slices.
        slices: slices per head (``S``).
        head_dim: features a head slices (``D``); default ``width // heads``.
        temperature: initial (or fixed) softmax temperature of the slice weights, every head.
        learn_temperature: learn one temperature per head (a parameter ``log_temperature``); else a
            buffer of the same name.
        eps: added to each slice's total weight before dividing (an empty slice gives zeros).

    Shapes:
        whole sample: ``(N, F) -> (N, F)``; shard: ``ShardTensor (N_own, F) -> ShardTensor (N_own, F)``.

    Communication (shards): one ``all_reduce`` of ``H * S * (D + 1)`` values forward (every slice's
    weighted feature sum and total weight, in one tensor: :func:`meshshard.comm.sum_of_parts`), and
    one of as many backward; none on a whole sample.
    """

    def __init__(
        self,
        width: int,
        heads: int = 8,
        slices: int = 32,
        *,
        head_dim: int | None = None,
        temperature: float = 0.5,
        learn_temperature: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        width, heads = _positive_int("width", width), _positive_int("heads", heads)
        slices = _positive_int("slices", slices)
        if head_dim is None:
            if width % heads:
                raise ValueError(f"Expected 'width' ({width}) to be a multiple of 'heads' ({heads}), or a 'head_dim'")
            head_dim = width // heads
        head_dim = _positive_int("head_dim", head_dim)
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"Expected 'temperature' to be a positive number (got {temperature!r})")
        if not eps >= 0:
            raise ValueError(f"Expected 'eps' >= 0 (got {eps!r})")
        self.width, self.heads, self.slices, self.head_dim, self.eps = width, heads, slices, head_dim, float(eps)
        self.features = nn.Linear(width, heads * head_dim)
        self.slice_logits = nn.Linear(width, heads * slices)
        log_temperature = torch.full((heads,), math.log(temperature))
        if learn_temperature:
            self.log_temperature = nn.Parameter(log_temperature)
        else:
            self.register_buffer("log_temperature", log_temperature)
        self.qkv = nn.Linear(head_dim, 3 * head_dim, bias=False)
        self.out = nn.Linear(heads * head_dim, width)

    def forward(self, x: Any) -> Any:
        """The layer on a whole sample ``(N, F)`` or on a shard's owned rows (``ShardTensor``)."""
        local, spec = _local_rows(x)
        y = self.forward_local(local, spec)
        return y if spec is None else ShardTensor(y, spec)

    def slice_weights(self, x: Tensor) -> Tensor:
        """Each row's soft assignment to the slices of every head, ``(N_rows, F) -> (N_rows, H, S)``
        (summing to one over ``S``). Row-wise."""
        logits = self.slice_logits(x).view(x.shape[0], self.heads, self.slices)
        return torch.softmax(logits / self.log_temperature.exp().to(logits.dtype)[:, None], dim=-1)

    def forward_local(self, x: Tensor, spec: ShardSpec | None = None) -> Tensor:
        """The layer on local rows: with ``spec``, the first ``spec.num_owned`` rows of ``x`` are
        this rank's owned rows, the only ones that count in the slice tokens; later rows (ghosts
        that a k-hop layout updates too) are read back like any row. Without ``spec``, ``x`` is the
        whole sample and nothing is sent.

        Shapes:
            x: ``(N_rows, F)``, ``N_rows >= N_own``; returns ``(N_rows, F)``.
        """
        _check_rows(x, self.width, spec, type(self).__name__)
        rows, heads, dim = x.shape[0], self.heads, self.head_dim
        weights = self.slice_weights(x)  # (N_rows, H, S)
        features = self.features(x).view(rows, heads, dim)
        owned = rows if spec is None else spec.num_owned
        if owned < rows:
            parts = _slice_sums(weights[:owned], features[:owned])
        else:
            parts = _slice_sums(weights, features)
        if spec is not None:
            parts = sum_of_parts(parts, group=spec.group)  # the layer's one exchange
        tokens = parts[..., :dim] / (parts[..., dim:] + self.eps)  # (H, S, D)
        q, k, v = self.qkv(tokens.to(x.dtype)).chunk(3, dim=-1)
        attended = torch.softmax(q @ k.transpose(-1, -2) * dim**-0.5, dim=-1) @ v  # (H, S, D)
        read_back = torch.einsum("nhs,hsd->nhd", weights, attended.to(weights.dtype))
        return self.out(read_back.reshape(rows, heads * dim))


def _slice_sums(weights: Tensor, features: Tensor) -> Tensor:
    """Every slice's weighted feature sum and total weight over the rows given, ``(H, S, D + 1)``;
    in float32 for half-precision inputs (sums over many points)."""
    if weights.dtype in _HALF or features.dtype in _HALF:
        with torch.autocast(weights.device.type, enabled=False):
            return _slice_sums(weights.float(), features.float())
    numerator = torch.einsum("nhs,nhd->hsd", weights, features)
    return torch.cat([numerator, weights.sum(0).unsqueeze(-1)], dim=-1)


class TransolverBlock(nn.Module):
    """``x + attention(norm1(x))``, then ``x + mlp(norm2(x))`` (pre-norm, residuals).

    The LayerNorms and the MLP are row-wise; the attention is :class:`PhysicsAttention`, so the
    block is exact on shards with that layer's one all-reduce forward and one backward.

    Args:
        width, heads, slices: as :class:`PhysicsAttention` (which takes the keywords in
            ``attention``: ``head_dim``, ``temperature``, ``learn_temperature``, ``eps``).
        mlp_ratio: the MLP's hidden width is ``mlp_ratio * width`` (GELU); ``0``: no MLP half (the
            attention sub-block alone, as :class:`~meshshard.nn.MeshGraphNet` inserts it).

    Shapes:
        as :class:`PhysicsAttention`: ``(N, F) -> (N, F)``, or ``ShardTensor (N_own, F)`` to the same.
    """

    def __init__(self, width: int, heads: int = 8, slices: int = 32, mlp_ratio: int = 4, **attention: Any) -> None:
        super().__init__()
        if isinstance(mlp_ratio, bool) or not isinstance(mlp_ratio, int) or mlp_ratio < 0:
            raise ValueError(f"Expected 'mlp_ratio' to be a non-negative integer (got {mlp_ratio!r})")
        self.norm1 = nn.LayerNorm(width)
        self.attention = PhysicsAttention(width, heads, slices, **attention)
        self.width = width
        if mlp_ratio:
            self.norm2 = nn.LayerNorm(width)
            hidden = mlp_ratio * width
            self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
        else:
            self.norm2 = self.mlp = None

    def forward(self, x: Any) -> Any:
        """The block on a whole sample ``(N, F)`` or on a shard's owned rows (``ShardTensor``)."""
        local, spec = _local_rows(x)
        y = self.forward_local(local, spec)
        return y if spec is None else ShardTensor(y, spec)

    def forward_local(self, x: Tensor, spec: ShardSpec | None = None) -> Tensor:
        """The block on local rows, ``(N_rows, F) -> (N_rows, F)``; ``spec`` as in
        :meth:`PhysicsAttention.forward_local`."""
        _check_rows(x, self.width, spec, type(self).__name__)
        x = x + self.attention.forward_local(self.norm1(x), spec)
        if self.mlp is not None:
            x = x + self.mlp(self.norm2(x))
        return x


class Transolver(nn.Module):
    """Transolver: an encoder MLP, ``layers`` :class:`TransolverBlock` s, a decoder.

    Args:
        in_channels, out_channels: features per point in and out (positions go in as features).
        width: the latent width (paper: 128 to 256).
        layers: blocks, weights not shared (paper: 8).
        heads, slices: per block, as :class:`PhysicsAttention` (paper: 8 heads, 32 to 64 slices).
        mlp_ratio: each block's MLP hidden width over ``width``.
        temperature, learn_temperature: the slice weights' temperature (see :class:`PhysicsAttention`).
        checkpoint: recompute each block in the backward instead of keeping its activations
            (activation checkpointing: the same result and gradients, less memory; the block's
            all-reduce runs again in the recomputation, on every rank alike).

    Shapes:
        whole sample: ``(N, in_channels) -> (N, out_channels)``; shard:
        ``ShardTensor (N_own, in_channels) -> ShardTensor (N_own, out_channels)``.

    Communication (shards): per block one ``all_reduce`` of ``heads * slices * (width / heads + 1)``
    values forward and one of as many backward; nothing else (encoder and decoder are row-wise).
    The result and every gradient equal the single-process model's (parameter gradients once
    summed over the domain group, as :class:`~meshshard.nn.DomainParallel` does).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        width: int = 128,
        layers: int = 4,
        heads: int = 8,
        slices: int = 32,
        *,
        mlp_ratio: int = 4,
        temperature: float = 0.5,
        learn_temperature: bool = True,
        checkpoint: bool = False,
    ) -> None:
        super().__init__()
        self.checkpoint = bool(checkpoint)
        in_channels = _positive_int("in_channels", in_channels)
        out_channels = _positive_int("out_channels", out_channels)
        width, layers = _positive_int("width", width), _positive_int("layers", layers)
        self.in_channels = in_channels
        self.encoder = nn.Sequential(nn.Linear(in_channels, width), nn.GELU(), nn.Linear(width, width))
        self.blocks = nn.ModuleList(
            TransolverBlock(width, heads, slices, mlp_ratio, temperature=temperature,
                            learn_temperature=learn_temperature)
            for _ in range(layers)
        )
        self.decoder = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, out_channels))

    def forward(self, x: Any) -> Any:
        """The model on a whole sample ``(N, in_channels)`` or on a shard's owned rows (``ShardTensor``)."""
        local, spec = _local_rows(x)
        y = self.forward_local(local, spec)
        return y if spec is None else ShardTensor(y, spec)

    def forward_local(self, x: Tensor, spec: ShardSpec | None = None) -> Tensor:
        """The model on local rows, ``(N_rows, in_channels) -> (N_rows, out_channels)``; ``spec`` as
        in :meth:`PhysicsAttention.forward_local`."""
        _check_rows(x, self.in_channels, spec, type(self).__name__)
        h = self.encoder(x)
        for block in self.blocks:
            if self.checkpoint and torch.is_grad_enabled():
                h = checkpoint(block.forward_local, h, spec, use_reentrant=False)
            else:
                h = block.forward_local(h, spec)
        return self.decoder(h)
