"""The Ray cluster of a Ray command (deploy/ray/*.py): join ``--address`` or start a local one.

Shared by the ``ray_batch``, ``ray_serve`` and ``ray_store`` commands, which run under
``ppvarlen.cli.run_command`` (one error policy: a bad config, data or export prints one line and
exits 2).  Ray itself is imported when the cluster starts (the ``ray`` extra).
"""
import contextlib

from ppvarlen.config import ConfigError


def add_cluster_args(parser):
    """``--address`` and ``--num-cpus`` on ``parser``."""
    parser.add_argument("--address", default=None,
                        help="Ray cluster to join ('auto': the one `ray start` runs here); "
                        "default: start a local one")
    parser.add_argument("--num-cpus", type=int, default=None,
                        help="CPUs of the local cluster (not with --address)")
    return parser


@contextlib.contextmanager
def ray_cluster(args):
    """Ray connected to ``args.address`` (or a local cluster of ``args.num_cpus``) for the block,
    shut down after it."""
    if args.address and args.num_cpus is not None:
        raise ConfigError(f"--num-cpus sizes a local cluster; the cluster at --address "
                          f"{args.address} has its own CPUs: drop --num-cpus")
    import ray

    ray.init(address=args.address, num_cpus=args.num_cpus, include_dashboard=False)
    try:
        yield
    finally:
        ray.shutdown()
