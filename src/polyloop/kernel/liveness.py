"""Leases and heartbeats (durability.md, "Leases"): the lease renewed every third of its
duration while a run is driven, and no action started with less than a third of it left."""

from __future__ import annotations

import asyncio
import functools
import logging
import time

from ..types import LeaseLost
from .driver import Driver

__all__ = [
    "arm_heartbeat",
    "heartbeat",
    "heartbeat_due",
    "keep_lease_margin",
    "stop_heartbeat",
]

log = logging.getLogger("polyloop")


def arm_heartbeat(d: Driver) -> None:
    loop = asyncio.get_running_loop()
    d._beat = loop.call_later(d.cfg.lease_ttl_s / 3, functools.partial(heartbeat_due, d))


def heartbeat_due(d: Driver) -> None:
    d._beat = None
    d._renewal = asyncio.ensure_future(heartbeat(d))


def stop_heartbeat(d: Driver) -> None:
    if d._beat is not None:
        d._beat.cancel()
        d._beat = None
    if d._renewal is not None:
        d._renewal.cancel()
        d._renewal = None


async def heartbeat(d: Driver) -> None:
    ttl = d.cfg.lease_ttl_s
    try:
        d.lease = await d.cfg.journal.renew(d.lease, ttl_s=ttl)
        if d.lease.request is not None:  # how a request from elsewhere arrives
            d.take_request(d.lease.request)
        if d.lease.limits:
            d.take_limits(d.lease.limits)
    except LeaseLost:
        if not d._ended:  # an end record releases the lease: nothing was lost
            log.error("run %s lost its lease; its next write is refused", d.run_id)
        return
    except Exception:
        log.warning("run %s: lease renewal failed", d.run_id, exc_info=True)
    if d._renewal is asyncio.current_task():  # not stopped meanwhile
        d._renewal = None
        arm_heartbeat(d)


async def keep_lease_margin(d: Driver) -> None:
    """No action starts with less than a third of the lease left."""
    ttl = d.cfg.lease_ttl_s
    if d.lease.expires_at - time.time() < ttl / 3:
        d.lease = await d.cfg.journal.renew(d.lease, ttl_s=ttl)
        if d.lease.request is not None:
            d.take_request(d.lease.request)
        if d.lease.limits:
            d.take_limits(d.lease.limits)
