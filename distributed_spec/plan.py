"""Where the Ray runtime's actors would go, without loading a model (parallel.plan_only).

    python -m distributed_spec.plan model=llama3_70b_1b parallel=ray parallel.tp_size=8 \
        parallel.device=cuda parallel.plan_gpus_per_node=8          # an 8-GPU node, described
    python -m distributed_spec.plan parallel=ray parallel.ray_address=auto parallel.tp_size=4   # the live cluster

Reads the same Hydra config as distributed_spec.generate (conf/generate.yaml), so the command line of
a job with `-m distributed_spec.plan` instead of `-m distributed_spec.generate` shows that job's
placement: one line per node with the shards and the draft on it. A plan that does not fit exits 2 with
one line naming the keys to change. parallel.plan_num_nodes / plan_gpus_per_node / plan_cpus_per_node
describe a cluster; without plan_gpus_per_node the live one (parallel.ray_address, or a local Ray) is used.
With parallel.num_replicas (a number or auto) it also shows how many replicas the cluster holds at once
and the nodes of each (distributed/replica_placement.py).
"""

from __future__ import annotations

import logging
import sys

from hydra import compose, initialize_config_dir

from distributed_spec.config import ConfigError, JobConfig, ParallelConfig

# Importing the job registers its ${ds.*} resolvers and names its config directory.
from distributed_spec.hydra_config import CONF_DIR

logger = logging.getLogger(__name__)


def compose_job(overrides: list[str]) -> JobConfig:
    """The job that `python -m distributed_spec.generate <overrides>` would run (no run directory)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return JobConfig.from_dictconfig(compose(config_name="generate", overrides=overrides))


def plan_text(job: JobConfig) -> str:
    """The job's placement (see the module docstring); raises ConfigError when it cannot be placed."""
    parallel = job.parallel
    if parallel.runtime != "ray":
        return f"parallel.runtime={parallel.runtime}: one process on this machine ({parallel.resolve().device})"
    from distributed_spec.distributed.placement import PlacementError, described_nodes, plan_report

    # A described cluster is planned as described (device auto decided from its GPUs, not this machine's).
    config = parallel.resolve(described_nodes(parallel))
    try:
        if config.num_replicas != 1:
            return _replicas_text(config)
        return plan_report(config)
    except PlacementError as err:
        raise ConfigError(str(err)) from err


def _replicas_text(config: ParallelConfig) -> str:
    """parallel.num_replicas (auto: as many as fit) and where each replica goes."""
    from distributed_spec.distributed.placement import cluster_nodes, connect, described_nodes
    from distributed_spec.distributed.replica_placement import replicas_report

    nodes = described_nodes(config)
    if nodes is None:
        connect(config.ray_address)
        nodes = cluster_nodes()
    return replicas_report(config.num_replicas, config, nodes)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        print(plan_text(compose_job(sys.argv[1:] if argv is None else argv)))
    except ConfigError as err:
        # One clear line, no traceback: the message names the key to change.
        print(f"configuration error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
