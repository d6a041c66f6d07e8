"""`gemtrain launch --nproc-per-node N CONFIG [--section.key=value ...]`: `gemtrain train` under torchrun."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from train.cli import Command


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="a run config (YAML), passed on to `gemtrain train`")
    p.add_argument("--nproc-per-node", type=int, default=None,
                   help="processes on this node (default: the number of GPUs, or 1 without CUDA)")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's rank when --nnodes > 1")
    p.add_argument("--master-addr", default="127.0.0.1", help="rank 0's host when --nnodes > 1")
    p.add_argument("--master-port", type=int, default=29500, help="rank 0's port when --nnodes > 1")
    p.add_argument("--dry-run", action="store_true", help="print the torchrun command and exit")


def torchrun_argv(args: argparse.Namespace, overrides: list[str]) -> list[str]:
    """The torchrun command line that runs `gemtrain train CONFIG overrides` on every rank."""
    from features.errors import GemtrainError

    nproc = args.nproc_per_node
    if nproc is None:
        import torch

        nproc = max(torch.cuda.device_count(), 1)
    if nproc < 1:
        raise GemtrainError(f"--nproc-per-node must be at least 1, got {nproc}")
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        raise GemtrainError(f"--node-rank {args.node_rank} must be in [0, --nnodes={args.nnodes})")
    if not os.path.exists(args.config):
        raise GemtrainError(f"{args.config}: run config not found")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if args.nnodes == 1:
        cmd.append("--standalone")
    else:
        cmd += [f"--nnodes={args.nnodes}", f"--node-rank={args.node_rank}",
                f"--master-addr={args.master_addr}", f"--master-port={args.master_port}"]
    cmd += ["-m", "train.cli", "train", args.config, *overrides]
    return cmd


def _run(args: argparse.Namespace) -> int:
    cmd = torchrun_argv(args, list(args.overrides))
    print("gemtrain launch: " + " ".join(cmd), file=sys.stderr, flush=True)
    if args.dry_run:
        return 0
    # torchrun forwards signals to the ranks and stops all of them when one fails.
    return subprocess.call(cmd)


COMMANDS = [Command(None, "launch", "run `gemtrain train CONFIG` on several processes (torchrun)", _add, _run,
                    allow_unknown=True)]
