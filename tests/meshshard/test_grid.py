"""Grid tensors and grid layers on 1-4 ranks, exact against one process in float64.

One spawn per world size runs every check: Conv1d/2d/3d (kernels 1-5, even kernels, dilation,
groups, all four padding modes), max and average pools, nearest and linear upsampling and a
two-level UNet, on slabs and boxes with uneven shards (and an empty rank), forward, input
gradient and weight gradients summed over ranks, plus the collectives each layer runs; and the
ShardTensor and DTensor views of a grid tensor.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from meshshard import GridTensor, grid_layout
from meshshard.nn import GridConv, GridPool, GridUpsample, shard_grid_layers
from tests._dist import run_ranks
from tests._tolerance import assert_max_relative

TOL = 1e-10


class SmallUNet(nn.Module):
    """Two levels: conv-conv, pool, conv-conv, upsample, skip concatenation, conv-conv, 1x1 head."""

    def __init__(self, c_in: int = 2, width: int = 4, c_out: int = 1, mode: str = "bilinear") -> None:
        super().__init__()
        self.enc1 = nn.Sequential(nn.Conv2d(c_in, width, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(width, width, 3, padding=1, padding_mode="reflect"), nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.enc2 = nn.Sequential(nn.Conv2d(width, 2 * width, 3, padding=1), nn.Tanh(),
                                  nn.Conv2d(2 * width, 2 * width, 5, padding=2), nn.Tanh())
        self.up = nn.Upsample(scale_factor=2, mode=mode)
        self.dec = nn.Sequential(nn.Conv2d(3 * width, width, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(width, width, 3, padding=1))
        self.head = nn.Conv2d(width, c_out, 1)

    def forward(self, x):
        a = self.enc1(x)
        b = self.enc2(self.pool(a))
        return self.head(self.dec(torch.cat([a, self.up(b)], dim=1)))


def _check(name, make, x_full, layout, exchanges=None, tol=TOL):
    """Forward, input gradient and summed weight gradients of a layer on shards vs whole."""
    import torch.distributed as dist

    from meshshard.comm import count_collectives

    torch.manual_seed(1)
    ref = nn.Sequential(make()).to(x_full.dtype)
    mine = shard_grid_layers(copy.deepcopy(ref))
    xr = x_full.clone().requires_grad_(True)
    y_ref = ref(xr)
    w_out = torch.randn(y_ref.shape, dtype=x_full.dtype, generator=torch.Generator().manual_seed(2))
    (y_ref * w_out).sum().backward()

    xs = x_full.clone().requires_grad_(True)
    g = GridTensor.distribute(xs, layout)
    with count_collectives() as log:
        y = mine(g)
        w_box = GridTensor.distribute(w_out, y.layout).to_local()
        (y.to_local() * w_box).sum().backward()
    assert_max_relative(y.full_tensor().detach(), y_ref.detach(), tol, f"{name}: forward")
    box = GridTensor.distribute(xr.grad, layout).to_local()
    assert_max_relative(GridTensor.distribute(xs.grad, layout).to_local(), box, tol, f"{name}: input gradient")
    for (pname, p_ref), p in zip(ref.named_parameters(), mine.parameters()):
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        dist.all_reduce(grad)
        assert_max_relative(grad, p_ref.grad, tol, f"{name}: gradient of {pname}")
    if exchanges is not None:
        got = (log.count("indexed_all_to_all_v", "forward"), log.count("indexed_all_to_all_v", "backward"))
        if got != (exchanges, exchanges):
            raise AssertionError(f"{name}: expected {exchanges} exchanges each way (got {got})")
    assert list(ref.state_dict()) == list(mine.state_dict()), name


def _layouts(world):
    """(layout of a 2-D grid of shape (9, 8) and of one with even sizes, for pools)."""
    return {
        1: [((9, 8), (1, 1), None, (8, 6), None)],
        2: [((9, 8), (2, 1), [[3, 6], None], (8, 6), [[2, 6], None]),
            ((9, 8), (1, 2), [None, [5, 3]], (8, 6), [None, [4, 2]])],
        3: [((9, 8), (3, 1), [[2, 4, 3], None], (8, 6), [[2, 4, 2], None])],
        4: [((9, 8), (2, 2), [[4, 5], [3, 5]], (8, 6), [[4, 4], [2, 4]]),
            ((9, 8), (4, 1), [[3, 0, 3, 3], None], (8, 6), [[2, 2, 2, 2], None])],
    }[world]


def _rank_checks(rank, world):
    warnings.filterwarnings("ignore", "Using padding='same' with even kernel")
    if world in (2, 3):
        _dtensor_checks(rank, world)
    if world == 4:
        box = GridTensor.distribute(torch.zeros(1, 1, 7, 5), grid_layout((7, 5), proc_grid=(2, 2)))
        with pytest.raises(ValueError, match="DTensor interop needs slabs"):
            box.to_dtensor()
    torch.manual_seed(0)
    for shape, proc, splits, even_shape, even_splits in _layouts(world):
        lay = grid_layout(shape, proc_grid=proc, splits=splits)
        x = torch.randn(2, 3, *shape, dtype=torch.float64)
        tag = f"{world} ranks {proc} {lay.splits}"
        for mode in ("zeros", "reflect", "replicate", "circular"):
            for k in (1, 3, 5):
                _check(f"Conv2d k={k} {mode} {tag}",
                       lambda: nn.Conv2d(3, 4, k, padding=k // 2, padding_mode=mode), x, lay,
                       exchanges=0 if k == 1 or world == 1 else 1)
        _check(f"Conv2d k=(3,5) dilation 2 {tag}",
               lambda: nn.Conv2d(3, 2, (3, 5), padding=(2, 4), dilation=2, padding_mode="circular"), x, lay)
        _check(f"Conv2d even k=4 'same' {tag}", lambda: nn.Conv2d(3, 2, 4, padding="same"), x, lay)
        _check(f"Conv2d k=2 valid {tag}", lambda: nn.Conv2d(3, 2, 2), x, lay)
        _check(f"Conv2d groups {tag}", lambda: nn.Conv2d(3, 6, 3, padding=1, groups=3, bias=False), x, lay)
        _check(f"Conv2d float32 {tag}", lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="circular"),
               x.float(), lay, tol=1e-5)
        _check(f"Upsample nearest {tag}", lambda: nn.Upsample(scale_factor=2), x, lay, exchanges=0)
        _check(f"Upsample bilinear x3 {tag}", lambda: nn.Upsample(scale_factor=3, mode="bilinear"), x, lay)

        ev = grid_layout(even_shape, proc_grid=proc, splits=even_splits)
        xe = torch.randn(2, 3, *even_shape, dtype=torch.float64)
        tag = f"{world} ranks {proc} {ev.splits}"
        _check(f"MaxPool2d(2) {tag}", lambda: nn.MaxPool2d(2), xe, ev, exchanges=0)
        _check(f"AvgPool2d(2) {tag}", lambda: nn.AvgPool2d(2), xe, ev, exchanges=0)
        _check(f"MaxPool2d(3, 2, 1) {tag}", lambda: nn.MaxPool2d(3, 2, 1), xe, ev)
        _check(f"AvgPool2d(3, 1, 1) {tag}", lambda: nn.AvgPool2d(3, 1, 1), xe, ev)
        _check(f"UNet bilinear {tag}", lambda: SmallUNet(3), xe, ev)
        _check(f"UNet nearest {tag}", lambda: SmallUNet(3, mode="nearest"), xe, ev)

    # 1-D and 3-D, slabs (and a 2 x 2 x 1 box layout on 4 ranks)
    splits1 = {1: [11], 2: [4, 7], 3: [3, 5, 3], 4: [2, 3, 3, 3]}[world]
    lay1 = grid_layout((11,), proc_grid=(world,), splits=[splits1])
    x1 = torch.randn(2, 3, 11, dtype=torch.float64)
    for mode in ("zeros", "reflect", "circular"):
        for k in (1, 3, 5):
            _check(f"Conv1d k={k} {mode} {lay1.splits}",
                   lambda: nn.Conv1d(3, 2, k, padding=k // 2, padding_mode=mode), x1, lay1)
    _check(f"Upsample linear {lay1.splits}", lambda: nn.Upsample(scale_factor=2, mode="linear"), x1, lay1)
    proc3 = {1: (1, 1, 1), 2: (2, 1, 1), 3: (1, 3, 1), 4: (2, 2, 1)}[world]
    lay3 = grid_layout((8, 6, 4), proc_grid=proc3, splits=[None, [2, 4], None] if world == 4 else None)
    x3 = torch.randn(1, 2, 8, 6, 4, dtype=torch.float64)
    for mode in ("zeros", "reflect", "circular"):
        _check(f"Conv3d k=3 {mode} {proc3}", lambda: nn.Conv3d(2, 3, 3, padding=1, padding_mode=mode), x3, lay3)
    _check(f"Conv3d k=5 {proc3}", lambda: nn.Conv3d(2, 1, 5, padding=2), x3, lay3)
    _check(f"Upsample trilinear {proc3}", lambda: nn.Upsample(scale_factor=2, mode="trilinear"), x3, lay3)
    _check(f"MaxPool3d(2) {proc3}", lambda: nn.MaxPool3d(2), x3, lay3)
    _check(f"AvgPool3d(2) {proc3}", lambda: nn.AvgPool3d(2), x3, lay3)

    # ShardTensor interop: the grid's ShardTensor with_halo() holds the partition's ghost rows.
    from meshshard.partition._grid import partition_grid

    lay = grid_layout((9, 8), proc_grid=_layouts(world)[0][1], splits=_layouts(world)[0][2])
    x = torch.randn(2, 3, 9, 8, dtype=torch.float64)
    st = GridTensor.distribute(x, lay).to_shard_tensor(halo_width=2)
    part = partition_grid((9, 8), proc_grid=lay.proc_grid, splits=lay.splits, halo_width=2)[rank]
    rows = x.reshape(2, 3, -1).permute(2, 0, 1)
    local_ids = torch.cat([torch.from_numpy(part.owned_ids), torch.from_numpy(part.ghost_ids)])
    torch.testing.assert_close(st.with_halo(), rows[local_ids], rtol=0, atol=0)
    back = GridTensor.from_shard_tensor(st, lay)
    torch.testing.assert_close(back.to_local(), GridTensor.distribute(x, lay).to_local(), rtol=0, atol=0)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_grid_layers_exact(world):
    run_ranks(_rank_checks, world, timeout=240)


def _dtensor_checks(rank, world):
    from torch.distributed.tensor import Shard

    x = torch.randn(2, 3, 7, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    chunk = grid_layout((7, 5), proc_grid=(world, 1), splits=[[4, 3] if world == 2 else [3, 3, 1], None])
    dt = GridTensor.distribute(x, chunk).to_dtensor()
    assert dt.placements == (Shard(2),) and tuple(dt.shape) == (2, 3, 7, 5)
    torch.testing.assert_close(dt.full_tensor(), x)
    back = GridTensor.from_dtensor(dt)
    assert back.layout == chunk
    uneven = grid_layout((7, 5), proc_grid=(world, 1), splits=[[2, 5] if world == 2 else [1, 3, 3], None])
    with pytest.raises(ValueError, match=r"Expected slabs of torch.chunk sizes .* for DTensor's Shard\(2\)"):
        GridTensor.distribute(x, uneven).to_dtensor()


def test_errors_before_any_exchange():
    x = GridTensor.distribute(torch.randn(1, 2, 9, 6), grid_layout((9, 6), 1))
    with pytest.raises(ValueError, match="Expected MaxPool2d's stride 2 to divide every shard size along spatial dim 0"):
        GridPool(nn.MaxPool2d(2))(x)
    with pytest.raises(ValueError, match=r"Expected stride 1 for a sharded convolution \(got stride \(2, 2\)\)"):
        GridConv(nn.Conv2d(2, 2, 3, stride=2))
    with pytest.raises(ValueError, match="Expected a GridTensor with 3 spatial dims for Conv3d"):
        GridConv(nn.Conv3d(2, 2, 3))(x)
    with pytest.raises(ValueError, match="Expected align_corners=False"):
        GridUpsample(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True))
    with pytest.raises(ValueError, match=r"Expected nn.Upsample\(scale_factor=<positive integers>\)"):
        GridUpsample(nn.Upsample(scale_factor=1.5))
    with pytest.raises(ValueError, match="Expected ceil_mode=False"):
        GridPool(nn.MaxPool2d(2, ceil_mode=True))
    with pytest.raises(TypeError, match="would be wrong at the box borders of a GridTensor"):
        torch.sum(x)
    with pytest.raises(TypeError, match="would be wrong at the box borders of a GridTensor"):
        x.sum()  # a Tensor method goes the same way as the torch function
    for method in ("relu", "tanh", "sigmoid"):  # element-wise methods run on the box, as the functions do
        torch.testing.assert_close(getattr(x, method)().to_local(), getattr(torch, method)(x).to_local(), rtol=0, atol=0)
    with pytest.raises(AttributeError, match="'GridTensor' object has no attribute 'no_such_method'"):
        x.no_such_method()
    with pytest.raises(TypeError, match="torch.cat along a spatial dim changes the layout"):
        torch.cat([x, x], dim=2)
    with pytest.raises(ValueError, match=r"Expected a local tensor of shape \(B, C, 9, 6\)"):
        GridTensor.from_local(torch.randn(1, 2, 8, 6), grid_layout((9, 6), 1))


def test_state_dict_unchanged_and_plain_tensors_still_work():
    torch.manual_seed(0)
    net = SmallUNet(2)
    keys = list(net.state_dict())
    x = torch.randn(1, 2, 8, 8)
    y = net(x)
    shard_grid_layers(net)
    assert list(net.state_dict()) == keys
    assert isinstance(net.enc1[0], GridConv) and isinstance(net.pool, GridPool)
    torch.testing.assert_close(net(x), y, rtol=0, atol=0)
    net.load_state_dict(SmallUNet(2).state_dict())  # a checkpoint of the plain model loads
