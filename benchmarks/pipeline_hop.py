"""One pipeline hop: a transfer's end to the task waiting on it starting, with the
transfer's waiting thread against the stage's own thread waiting when it is idle.

    .venv/bin/python benchmarks/pipeline_hop.py [--rounds 8] [--steps 400]

Two ranks on CPU over gloo play ping-pong through one TaskGraph each, as a pipeline
stage's step does: per exchange a detached receive (``irecv``, completed through
:class:`~dagtrain.training.rank.transfers.Transfers`), a tiny compute task on what came,
and a detached send (``isend``) of its result; rank 0 starts, so each of a run's 16
exchanges is one hop, each on the run's critical path. The two ways to wait are timed
in the same job pairs' way, alternating, round after round:

  thread   a thread of the receives' own waits for each and completes its task, then
           wakes the stage's thread (the pipeline's way on a middle stage)
  idle     the stage's thread waits for the oldest receive itself when it has nothing
           to start (``TaskGraph.run(idle=Transfers.wait_next)``: a first or last
           stage's way since b30fe97): one wake-up per hop, not two

Per way: the median of a round's runs (after 50 untimed), that over the rounds divided
by 16 (a run's start and end and the ranks' skew after the barrier included: an upper
bound of a hop), and the ratio thread / idle round by round (above 1: idle faster).
Both ways build the same graph, with a pipeline rank's GIL switch interval, and time
the same thing (``run()`` from a barrier). Writes benchmarks/results/pipeline_hop.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

HOPS = 16  # per run: rank 0's 8 sends and rank 1's 8 replies
WARMUP = 50


def rank_main(rank: int, way: str, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from dagtrain.training.rank.pipelining import SWITCH_INTERVAL

    sys.setswitchinterval(SWITCH_INTERVAL)  # as a pipeline rank's step sets it

    from dagtrain.sync import Handle
    from dagtrain.taskgraph import Event, TaskGraph
    from dagtrain.training.rank.transfers import Transfers

    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    peer, n = 1 - rank, HOPS // 2
    recvs = Transfers("recv", rank, 30.0, thread=way == "thread")
    sends = Transfers("send", rank, 30.0)
    got = [torch.zeros(1024) for _ in range(n + 1)]
    made = [torch.ones(1024) for _ in range(n)]

    def recv(k: int, tag: int, event: Event) -> None:
        work = dist.irecv(got[k], src=peer, tag=tag)
        recvs.post(Handle(f"recv {tag}", block=work.wait), event, got[k])

    def compute(k: int) -> None:
        made[k].mul_(1.0001)

    def send(k: int, tag: int, event: Event) -> None:
        work = dist.isend(made[k], dst=peer, tag=tag)
        sends.post(Handle(f"send {tag}", block=work.wait), event, made[k])

    # rank 0 sends tag k and waits for rank 1's reply to exchange k - 1 (tag 1000 + k - 1)
    g = TaskGraph(f"hop-{way}")
    for k in range(n):
        ins: tuple[str, ...] = ()
        if rank == 1 or k > 0:
            ev = Event()
            tag = k if rank == 1 else 1000 + k - 1
            g.add(recv, k, tag, ev, name=f"recv{k}", out=f"in{k}", detach=ev, priority=300 - k)
            ins = (f"in{k}",)
        g.add(compute, k, name=f"compute{k}", in_=ins, out=f"out{k}", priority=100 - k)
        ev = Event()
        tag = k if rank == 0 else 1000 + k
        g.add(send, k, tag, ev, name=f"send{k}", in_=f"out{k}", detach=ev, priority=200 - k)
    if rank == 0:  # rank 1's last reply
        ev = Event()
        g.add(recv, n, 1000 + n - 1, ev, name="recv-last", detach=ev, priority=0)
    idle = recvs.wait_next if way == "idle" else None
    times = []
    for _ in range(steps + WARMUP):
        dist.barrier()
        t0 = time.perf_counter()
        g.run(workers=1, idle=idle)
        times.append(time.perf_counter() - t0)
    recvs.close()
    sends.close()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(times[WARMUP:]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job(way: str, steps: int, tmp: Path) -> list[float]:
    """One 2-rank job of one way: rank 0's run times."""
    out = tmp / f"{way}.json"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")])
    argv = [sys.executable, __file__, "--rank-of", way, str(steps), str(out)]
    procs = [subprocess.Popen([*argv, str(r)], env=env, stdout=subprocess.DEVNULL) for r in (0, 1)]
    try:
        for p in procs:
            if p.wait(timeout=300) != 0:
                raise RuntimeError(f"a rank of the {way!r} job exited with {p.returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=400, help="timed runs per job")
    ap.add_argument("--out", default=str(HERE / "results" / "pipeline_hop.json"))
    ap.add_argument("--rank-of", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_of:
        way, steps, out, rank = args.rank_of
        rank_main(int(rank), way, int(steps), out)
        return
    import tempfile

    ways = ("thread", "idle")
    rounds: dict[str, list[float]] = {w: [] for w in ways}
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="dagtrain-hop-") as tmp:
        for r in range(args.rounds):
            for way in ways if r % 2 == 0 else ways[::-1]:
                times = job(way, args.steps, Path(tmp))
                rounds[way].append(statistics.median(times))
                print(f"round {r}: {way:6} {1e6 * rounds[way][-1] / HOPS:7.1f} us a hop")
    per_hop = {w: 1e6 * statistics.median(v) / HOPS for w, v in rounds.items()}
    by_round = [round(a / b, 3) for a, b in zip(rounds["thread"], rounds["idle"])]
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cpus": os.cpu_count(),
        "hops_per_run": HOPS,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "seconds": round(time.time() - start, 1),
        "us_per_hop": {w: round(v, 1) for w, v in per_hop.items()},
        "round_medians_ms": {w: [round(1e3 * x, 3) for x in v] for w, v in rounds.items()},
        "thread_vs_idle": round(per_hop["thread"] / per_hop["idle"], 3),
        "thread_vs_idle_rounds": by_round,
    }
    print(json.dumps({k: result[k] for k in ("us_per_hop", "thread_vs_idle")}))
    print("round by round (thread / idle):", by_round)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
