"""torchdata.nodes plumbing of the loader's pipeline: worker errors carried to the consumer, an
end-of-epoch marker, releasing thread pools off the consumer's path (and closing live streams at exit),
and the ranks' agreement on a count from a pipeline thread."""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Raised:
    """An exception from a pipeline thread, carried to the consumer and raised there as itself.

    (torchdata re-raises worker exceptions by type and message, which fails for exceptions with
    keyword constructors; carrying the object keeps the original type, fields and message.)
    """

    error: BaseException


@dataclass(frozen=True)
class End:
    """The last item of an epoch's pipeline: the consumer stops on it at once, instead of waiting
    for torchdata's thread pools to notice the end (their queues are polled every 0.1 s)."""


def catching(fn):
    def run(item):
        if isinstance(item, (Raised, End)):
            return item
        try:
            return fn(item)
        except Exception as e:  # noqa: BLE001 - re-raised unchanged in the consumer
            return Raised(e)

    return run


# Epoch streams not yet finished. A stream abandoned mid-epoch (a trainer that reached its step count)
# still has pool threads inside pyarrow; left running into interpreter teardown they abort the process
# ("terminate called without an active exception"), so exit closes every live stream first, and waits for
# the releases already under way (a stream dropped just before exit releases its pools in the background).
LIVE_STREAMS: weakref.WeakSet = weakref.WeakSet()
_RELEASING: set[threading.Thread] = set()
_EXITING = False
EXIT_RELEASE_TIMEOUT_S = 30.0  # each release joins its pools' threads, up to a 0.1 s poll each


@atexit.register
def _close_live_streams() -> None:
    global _EXITING
    _EXITING = True
    for stream in list(LIVE_STREAMS):
        stream.close()
    for thread in list(_RELEASING):
        thread.join(EXIT_RELEASE_TIMEOUT_S)


def _release(objs: list) -> None:
    try:
        objs.clear()
    finally:
        _RELEASING.discard(threading.current_thread())


def release_in_background(objs: list) -> None:
    if _EXITING:  # no new thread at exit: release in place, which joins the pools' threads
        objs.clear()
        return
    thread = threading.Thread(target=_release, args=(objs,), daemon=True, name="gemtrain-loader-release")
    _RELEASING.add(thread)
    thread.start()


def ended(items):
    yield from items
    yield End()


def distributed_max(world_size: int) -> Callable[[int], int] | None:
    """All-reduce (MAX) of an int over a gloo group of its own: the loader calls it from its pipeline
    thread, which must not share a communicator with the training step's collectives."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() != world_size:
        return None
    group = dist.new_group(backend="gloo")

    def agree(n: int) -> int:
        t = torch.tensor([n], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return int(t.item())

    return agree
