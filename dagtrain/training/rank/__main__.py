"""The rank entry point the launcher starts in every process:

    python -m dagtrain.training.rank CONFIG.json RESULT.json

Under mpirun it runs as ``python -m mpi4py -m dagtrain.training.rank ...`` so that an
uncaught exception on one rank aborts the whole job instead of leaving the others
blocked in a collective. Rank 0 writes the TrainResult (atomically); its ``config`` is
the TrainConfig this rank received. Every rank keeps its status record
(``dagtrain.rank_env``, role ``train``) for the launcher, and writes why it failed
there before it exits on an error; what it prints on stderr is for people.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import traceback
from pathlib import Path

from dagtrain.atomic import atomic_write
from dagtrain.config import TrainConfig
from dagtrain.rank_env import (
    ON_HOST,
    die_with_parent,
    env_rank,
    report_failure,
    start_rank,
    use_code_path,
)

from .trainer import train


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m dagtrain.training.rank CONFIG.json RESULT.json", file=sys.stderr)
        return 2
    # whatever kills the launcher (SIGKILL, the OOM killer, Airflow's supervisor) kills
    # this rank too; a parent already gone (adopted by init) means: do not start
    die_with_parent(signal.SIGKILL)
    if os.getppid() == 1:
        return 1
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    rank = env_rank() or "?"
    # the status record, for the launcher: this rank, where it runs, what it is
    start_rank("train")
    print(f"dagtrain rank {rank} {ON_HOST} {socket.gethostname()}", file=sys.stderr, flush=True)
    pid_dir = os.environ.get("DAGTRAIN_PID_DIR")  # tests and tools find the ranks here
    if pid_dir:
        Path(pid_dir, f"rank{rank}.pid").write_text(str(os.getpid()))
    try:
        use_code_path()  # the DAG author's modules (a model factory), after torch and ours
        cfg = TrainConfig.model_validate_json(Path(args[0]).read_text())
        result = train(cfg)
        rank = str(result.rank)
    except BaseException as e:
        # for the launcher: why, as data, in the status record (its time tells which
        # rank failed first: the others often fail after it, because of it)
        report_failure(rank, e)
        traceback.print_exc()  # for people, as the last line below
        print(f"dagtrain rank {rank} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        raise
    if result.rank == 0:
        atomic_write(Path(args[1]), result.to_json().encode())
    if cfg.distributed.backend == "torch":
        # gloo's threads sometimes abort the interpreter's own exit ("terminate called
        # without an active exception") after all work is done; the process group is
        # already destroyed and the result written, so leave without the teardown
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
