"""The run: training a model on a dataset's partitions, and what a trained run is.

A run is a folder (``RUN/``, :mod:`meshshard.run._folder` defines its files) that
:func:`train` fills and :func:`predict` and :func:`load_run` read. Everything about it lives here,
as library code that the ``meshshard train / predict / info`` commands only call:

- :class:`TrainConfig`, :func:`train`, :func:`check_training`: the one training loop (data x
  domain parallel, exact resume); the workload (:mod:`meshshard.tasks`) plugs into it;
- :class:`PredictConfig`, :func:`predict`: the one prediction writer (ParaView files, metrics,
  pictures), on whole meshes or on shards; :class:`MeanOf`, :func:`parse_ensemble`: several runs'
  predictions averaged (``predict --ensemble``); :class:`MirrorMean`: a prediction averaged with the
  mirror of its mirrored sample's (``predict --mirror-average``);
- :class:`BaselineConfig`, :func:`baseline`: what a model must beat (the training mean, the
  nearest cases, interpolation), made of the training samples and written as predict writes;
  :func:`comparison_table`: a prediction beside a baseline, from their ``metrics.json``;
- :class:`ModelRecipe`, :data:`BUILTIN_MODELS`, :data:`MESHGRAPHNET_DEFAULTS`, :data:`TRANSOLVER_DEFAULTS`:
  which model a run trains, with its
  defaults stated once, built for the dataset's channel counts;
- :func:`check_model_exact`, :class:`ExactnessReport`: your model on R ranks against one process,
  output and every gradient (``meshshard selftest --model``);
- :func:`load_run`, :class:`TrainedRun`, :class:`TransientRun` (its rollout): a trained run's
  model, weights and normalisation for code of your own;
- recipes as files: :func:`recipe_text` (TOML), :func:`read_recipe` (checked), :func:`write_recipe`;
- the run folder: :data:`CHECKPOINT`, :data:`LOG`, :data:`CONFIG`, :data:`RUN_FILES`, :func:`read_run`,
  :func:`load_checkpoint` (tensors and plain values only, checksum checked), :func:`run_summary`,
  :func:`resume_hint`; a prediction folder: :func:`prediction_summary`.
"""

from __future__ import annotations

from ._baseline import BaselineConfig, BaselineMethod, baseline, baseline_sources, parse_method
from ._boundaries import over_samples, parse_direction
from ._checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from ._compare import comparison_table
from ._ensemble import MeanOf, parse_ensemble
from ._exactness import ExactnessReport, check_model_exact
from ._folder import (
                      CHECKPOINT,
                      CONFIG,
                      FIRST_STEP,
                      LOG,
                      LOSS_PLOT,
                      RUN_FILES,
                      check_run_folder,
                      read_log,
                      read_run,
                      resume_hint,
                      run_summary,
)
from ._mirror_average import MirrorMean
from ._pred_folder import METRICS_FILE, prediction_summary
from ._prediction import predict
from ._recipe import (
                      BALL_ATTENTION_DEFAULTS,
                      BUILTIN_MODELS,
                      MESHGRAPHNET_DEFAULTS,
                      TRANSOLVER_DEFAULTS,
                      ModelRecipe,
                      build_model,
                      builtin_args,
                      check_model_radius,
                      load_factory,
                      model_radii,
                      normalise_spec,
                      parse_model_args,
                      transolver_args,
)
from ._recipe_file import read_recipe, recipe_text, write_recipe
from ._request import PredictConfig, check_prediction_request, parse_view
from ._schedule import AUTO_STEPS, AUTO_WARMUP
from ._subsample import POINT_MODELS, keep_points
from ._trained_run import TrainedRun, TransientRun, load_run
from ._training import TrainConfig, check_max_points, check_training, sample_index, train
from ._vtk import COMPRESSIONS
from ._writer import GATHER_MAX_NODES

__all__ = [
    "CHECKPOINT",
    "CONFIG",
    "FIRST_STEP",
    "GATHER_MAX_NODES",
    "COMPRESSIONS",
    "LOG",
    "LOSS_PLOT",
    "BUILTIN_MODELS",
    "MESHGRAPHNET_DEFAULTS",
    "TRANSOLVER_DEFAULTS",
    "BALL_ATTENTION_DEFAULTS",
    "builtin_args",
    "model_radii",
    "check_model_radius",
    "METRICS_FILE",
    "RUN_FILES",
    "BaselineConfig",
    "BaselineMethod",
    "baseline",
    "baseline_sources",
    "comparison_table",
    "over_samples",
    "parse_method",
    "CheckpointError",
    "ExactnessReport",
    "ModelRecipe",
    "PredictConfig",
    "AUTO_STEPS",
    "AUTO_WARMUP",
    "TrainConfig",
    "TrainedRun",
    "TransientRun",
    "build_model",
    "check_model_exact",
    "check_prediction_request",
    "check_run_folder",
    "check_training",
    "load_checkpoint",
    "load_factory",
    "load_run",
    "normalise_spec",
    "parse_model_args",
    "parse_view",
    "parse_ensemble",
    "MirrorMean",
    "MeanOf",
    "parse_direction",
    "transolver_args",
    "predict",
    "prediction_summary",
    "read_log",
    "read_recipe",
    "recipe_text",
    "write_recipe",
    "read_run",
    "resume_hint",
    "run_summary",
    "sample_index",
    "POINT_MODELS",
    "keep_points",
    "check_max_points",
    "save_checkpoint",
    "train",
]
