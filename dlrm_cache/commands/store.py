"""Hydra's side of the configs: where the YAML files are, the schemas registered with Hydra's
ConfigStore (under names the YAML files' defaults lists refer to, outside every config group, so
`--help` offers only the YAML options) and the resolvers the YAML files use.  Only the command
dispatcher (cli.py) and tests that compose configs import this module."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from ..after.config import ExportConfig, PredictConfig
from ..config.schemas import (
    EMBEDDING_SCHEMAS,
    BenchConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    PlanConfig,
    ReportConfig,
    TrainConfig,
)
from ..data.config import PreprocessConfig, SchemaConfig, SynthConfig
from ..data.verify import VerifyConfig


def config_dir() -> str:
    """Absolute path of the shipped configs, whatever the working directory or install mode.

    In a source tree (a checkout on PYTHONPATH, as the GPU machine's offline bundle runs it, or
    installed editable) they are ``configs/`` next to the package: the tree's own, even when
    another checkout is installed in the same environment.  Installed from a wheel they are the
    package ``dlrm_cache.configs``.
    """
    tree = Path(__file__).resolve().parents[2] / "configs"
    if (tree / "train.yaml").is_file():
        return str(tree)
    import dlrm_cache.configs as pkg

    return str(Path(pkg.__file__).resolve().parent)


def _run_id() -> str:
    """One id per job: torchrun's run id when set, else a timestamp.

    Each torchrun rank composes its own config, so a per-process ``${now:}`` would split one job
    over several run directories.
    """
    rid = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if rid and rid != "none":
        return f"{time.strftime('%Y-%m-%d')}/{rid}"
    if "MASTER_PORT" in os.environ and "LOCAL_WORLD_SIZE" in os.environ:
        # torchrun without --rdzv-id: every rank sees the same master address/port and group.
        key = "|".join(
            os.environ.get(k, "") for k in ("MASTER_ADDR", "MASTER_PORT", "GROUP_WORLD_SIZE")
        )
        return f"{time.strftime('%Y-%m-%d')}/torchrun-{hashlib.sha1(key.encode()).hexdigest()[:10]}"
    return time.strftime("%Y-%m-%d/%H-%M-%S")


def _checked_run_dir(run_dir: str, *, _root_: DictConfig) -> str:
    from ..train.claim import checked_run_dir

    data_path = OmegaConf.select(_root_, "data.path", default=None, throw_on_missing=False)
    return checked_run_dir(run_dir, None if data_path is None else str(data_path))


def _is_rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def register_configs() -> None:
    """Register the schemas and resolvers (idempotent)."""
    if not OmegaConf.has_resolver("dlrm_run_id"):
        OmegaConf.register_new_resolver("dlrm_run_id", _run_id, use_cache=True)
        # Only rank 0 writes Hydra's .hydra/ snapshot into the shared run directory, and not over
        # the snapshot of a run already there (train.claim.hydra_subdir)
        from ..train.claim import hydra_subdir, output_dir

        # train's output directory: the run resume= names (continued in place), else a new one
        OmegaConf.register_new_resolver("dlrm_output_dir", output_dir, use_cache=False)

        OmegaConf.register_new_resolver(
            "dlrm_hydra_subdir", lambda: hydra_subdir() if _is_rank0() else None, use_cache=False
        )
        # the run directory, checked by the outputs rule before Hydra writes its log file there
        OmegaConf.register_new_resolver("dlrm_run_dir", _checked_run_dir, use_cache=False)
        # ...and every rank logs to its own file there: train.log, train-rank1.log, ...
        OmegaConf.register_new_resolver(
            "dlrm_rank_suffix",
            lambda: "" if _is_rank0() else f"-rank{os.environ['RANK']}",
            use_cache=True,
        )
    cs = ConfigStore.instance()
    # a command's YAML names <command>_schema; a group option's names /<group>_schema@_here_
    for name, node in [
        ("train_schema", TrainConfig),
        ("plan_schema", PlanConfig),
        ("bench_schema", BenchConfig),
        ("report_schema", ReportConfig),
        ("synth_schema", SynthConfig),
        ("preprocess_schema", PreprocessConfig),
        ("schema_schema", SchemaConfig),
        ("data_schema", DataConfig),
        ("model_schema", ModelConfig),
        ("optim_schema", OptimConfig),
        ("verify_schema", VerifyConfig),
        ("predict_schema", PredictConfig),
        ("export_schema", ExportConfig),
    ]:
        cs.store(name=name, node=node)
    for backend, schema in EMBEDDING_SCHEMAS.items():
        cs.store(name=f"{backend.value}_schema", node=schema)
