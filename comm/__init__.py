"""Process groups and differentiable variable-size collectives.

Everything that talks between ranks lives here: set-up from torchrun or SLURM
(:func:`init_distributed`), the data x domain device mesh (:func:`init_device_mesh_2d`), and the
collectives, all autograd-aware, any dtype, any ``dim``, zero counts and empty ranks allowed, on
gloo (CPU) and NCCL (GPU):

- :class:`HaloPlan`: the halo plan (what to send to whom), checked across ranks once, when built;
- :func:`indexed_all_to_all_v`: the halo exchange (select rows, send them, return what arrives);
- :func:`append_halo`: the same, fused with appending the ghost rows to the owned rows;
- :func:`all_to_all_v`, :func:`all_gather_v`, :func:`gather_v`, :func:`scatter_v`;
- :func:`sum_to_replicated`: a global sum held by every rank as one logical value;
- :func:`sum_of_parts`: a global sum of partial sums that each rank uses on its own rows;
- :func:`sum_gradients`: the gradients of replicated parameters, summed over a group;
- :func:`count_collectives`: record what a block of code sends, forward and backward;
- :func:`sum_across`, :func:`max_across`, :func:`gather_rows`, :func:`directory_lookup`: numpy
  arrays across ranks (reports, prediction files); :class:`ArrayExchange`: numpy arrays of any dtype
  between ranks for offline work (the ``Exchange`` a distributed ``meshshard partition`` takes), and
  :class:`MPIExchange`, the same over MPI (mpi4py; what ``--engine ptscotch`` runs on);
- :func:`launch_local`: start R local ranks as torchrun would (commands run without torchrun);
  :func:`is_peer_failure`: whether an error came from a dead or stopped peer;
- the process group itself, plain (not autograd-aware) calls for bookkeeping:
  :func:`is_distributed`, :func:`backend_name`, :func:`group_ranks`, :func:`all_reduce_sum`,
  :func:`all_reduce_max`, :func:`broadcast_tensor`, :func:`all_gather_stacked`,
  :func:`all_gather_objects`, :func:`barrier`, :func:`agree_on_first_error` (one rank's error
  raised on every rank), :func:`shutdown`; :func:`torch_device_mesh` (the ``("domain", "data")``
  mesh FSDP2 takes);
- process-wide switches and counters: :func:`set_debug` / :func:`debug_enabled` (the cross-rank
  argument checks), :func:`note_replicated_result` / :func:`replicated_results` (how many values
  made by global reductions), :func:`record_collective` (count a call under a name of one's own).

Groups: ``group=None`` means the default (world) group, everywhere. A group of one rank inside a
larger world is a real single-rank group (``init_device_mesh_2d`` makes one for pure data or pure
domain parallelism), on which every collective returns at once without communicating.

This layer never imports :mod:`meshshard.partition` nor the top-level layer.
"""

from __future__ import annotations

from ._arrays import directory_lookup, exchange_counts, gather_rows, max_across, sum_across
from ._collectives import (
    all_gather_v,
    all_to_all_v,
    communication_device,
    debug_enabled,
    gather_v,
    group_rank_and_size,
    indexed_all_to_all_v,
    release_workspace,
    scatter_v,
    set_debug,
)
from ._context import (
    DeviceMesh2D,
    DistributedContext,
    init_device_mesh_2d,
    init_distributed,
    is_peer_failure,
    local_ranks_backend,
    torch_device_mesh,
)
from ._counter import CollectiveCall, CollectiveLog, count_collectives, record_collective
from ._exchange import ArrayExchange
from ._group import (
    agree_on_first_error,
    all_gather_objects,
    all_gather_stacked,
    all_reduce_max,
    all_reduce_sum,
    backend_name,
    barrier,
    broadcast_tensor,
    group_ranks,
    is_distributed,
    shutdown,
)
from ._halo import HaloPlan
from ._halo_room import append_halo
from ._launch import (
    RankFailed,
    Terminated,
    check_local_ranks,
    fix_mmap_threshold,
    free_port,
    launch_local,
    max_local_ranks,
)
from ._mpi_exchange import MPIExchange
from ._reductions import (
    note_replicated_result,
    replicated_results,
    sum_gradients,
    sum_of_parts,
    sum_to_replicated,
)
from ._slurm import expand_hostlist, first_slurm_host

__all__ = [
    "agree_on_first_error",
    "all_gather_objects",
    "all_gather_stacked",
    "all_gather_v",
    "all_reduce_max",
    "all_reduce_sum",
    "all_to_all_v",
    "append_halo",
    "ArrayExchange",
    "backend_name",
    "barrier",
    "broadcast_tensor",
    "CollectiveCall",
    "CollectiveLog",
    "communication_device",
    "count_collectives",
    "debug_enabled",
    "DeviceMesh2D",
    "directory_lookup",
    "DistributedContext",
    "exchange_counts",
    "expand_hostlist",
    "first_slurm_host",
    "fix_mmap_threshold",
    "free_port",
    "check_local_ranks",
    "max_local_ranks",
    "gather_rows",
    "gather_v",
    "group_rank_and_size",
    "group_ranks",
    "HaloPlan",
    "indexed_all_to_all_v",
    "init_device_mesh_2d",
    "init_distributed",
    "is_distributed",
    "is_peer_failure",
    "launch_local",
    "local_ranks_backend",
    "max_across",
    "MPIExchange",
    "note_replicated_result",
    "RankFailed",
    "record_collective",
    "release_workspace",
    "replicated_results",
    "scatter_v",
    "set_debug",
    "shutdown",
    "sum_across",
    "sum_gradients",
    "sum_of_parts",
    "sum_to_replicated",
    "Terminated",
    "torch_device_mesh",
]
