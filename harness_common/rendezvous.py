"""Where the ranks of a locally launched process group meet: a store the launcher listens on, before any rank starts.

Why not a free port handed to rank 0: a port picked, released and bound later can be taken in between by anything
on the machine, the ephemeral ports of another world's gloo connections included (EADDRINUSE, or two worlds joining
each other). Here a ``TCPStore`` the launcher starts binds port 0 and keeps listening until every rank has gone; each
rank joins it as a client (``join``) and starts its process group on it. Lightning's DDP strategy keeps a process
group it finds, so the Trainer a rank builds afterwards runs in that world.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Iterator
from datetime import timedelta
from multiprocessing.connection import Connection

HOST = "127.0.0.1"
STARTUP_TIMEOUT_S = 60


@contextlib.contextmanager
def stores(count: int) -> Iterator[list[int]]:
    """Start ``count`` stores listening on ports the system picks; yields their ports, closes them on exit. Start
    the ranks inside the ``with`` block.

    The stores live in a process of their own, forked before them. Why: a store serves its clients on threads, and
    a rank forked from a process whose thread holds a lock (the allocator's, say) inherits it held and hangs.
    """
    context = multiprocessing.get_context("fork")
    launcher_end, host_end = context.Pipe()
    host = context.Process(target=_host, args=(count, host_end), daemon=True)
    host.start()
    host_end.close()
    try:
        if not launcher_end.poll(STARTUP_TIMEOUT_S):
            raise RuntimeError(f"the rendezvous stores did not start within {STARTUP_TIMEOUT_S} s")
        yield launcher_end.recv()
    finally:
        with contextlib.suppress(OSError):
            launcher_end.send("stop")
        launcher_end.close()
        host.join(STARTUP_TIMEOUT_S)
        if host.is_alive():
            host.kill()
            host.join()


def _host(count: int, launcher: Connection) -> None:
    """The stores' process: listens until the launcher says stop (or is gone)."""
    import torch.distributed as dist

    listening = [dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False) for _ in range(count)]
    launcher.send([store.port for store in listening])
    with contextlib.suppress(EOFError):
        launcher.recv()
    os._exit(0)  # Why: a forked child of the launcher must not run its exit handlers


def join(port: int, rank: int, world: int, timeout_s: float) -> None:
    """Start this process's default (gloo) process group as ``rank`` of ``world`` on the store at ``port``, and set
    the environment a launcher such as ``torchrun`` sets, so Lightning takes the processes as launched externally."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR=HOST, MASTER_PORT=str(port), WORLD_SIZE=str(world), NODE_RANK="0",
                      LOCAL_RANK=str(rank), RANK=str(rank), GLOO_SOCKET_IFNAME="lo")
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(HOST, port, world, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
