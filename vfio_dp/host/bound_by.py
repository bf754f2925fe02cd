"""Who holds a binding: the ``bound_by`` words of a bind record
(``<root>/var/lib/vfio_dp/original/<bdf>.json``, see :mod:`.state`) and the one rule of each::

    "bound_by": "operator" | "device-plugin" | "dra-plugin" | "daemon"
              | "claim:<uid>" | "pool:<driver>"

The words are stored, so they never change (every release reads every other's records).
"""

from __future__ import annotations

from vfio_dp.model.address import PciAddress

BOUND_BY_OPERATOR = "operator"
BOUND_BY_DEVICE_PLUGIN = "device-plugin"
BOUND_BY_DRA_PLUGIN = "dra-plugin"
#: what both front-ends recorded before each had its own name (still read: upgrades)
BOUND_BY_DAEMON = "daemon"
FRONT_ENDS = (BOUND_BY_DEVICE_PLUGIN, BOUND_BY_DRA_PLUGIN)
_CLAIM_PREFIX = "claim:"
_POOL_PREFIX = "pool:"


def recovers(runner: str, recorded: str) -> bool:
    """Does ``runner`` finish the interrupted operations whose journals name ``recorded`` as
    their runner? Its own, and a front-end also those an older version recorded as
    ``daemon``."""
    return recorded == runner or (recorded == BOUND_BY_DAEMON and runner in FRONT_ENDS)


def bound_by_claim(uid: str) -> str:
    """``claim:<uid>``: the ``bound_by`` of a device a DRA claim's Prepare bound."""
    return _CLAIM_PREFIX + uid


def claim_of(bound_by: str) -> str | None:
    """The claim UID in ``claim:<uid>``, None for every other holder."""
    return bound_by[len(_CLAIM_PREFIX) :] if bound_by.startswith(_CLAIM_PREFIX) else None


def bound_by_pool(driver: str) -> str:
    """``pool:<driver>``: the ``bound_by`` of a device a claim's switch ahead left on its VFIO
    driver when the claim went away before its pod (the DRA driver's pool holds it)."""
    return _POOL_PREFIX + driver


def pool_of(bound_by: str) -> str | None:
    """The DRA driver in ``pool:<driver>``, None for every other holder."""
    return bound_by[len(_POOL_PREFIX) :] if bound_by.startswith(_POOL_PREFIX) else None


def claim_takes(recorded: str, driver: str) -> bool:
    """Does a claim of the DRA driver ``driver`` take over a binding whose record names
    ``recorded``? Another claim's (a stale one, not yet reconciled) and its own pool's hold;
    never the operator's, a front-end's, or another driver's pool."""
    return claim_of(recorded) is not None or recorded == bound_by_pool(driver)


def pool_refusal(
    address: PciAddress, recorded: str, holder: str, driver: str | None = None
) -> str | None:
    """Why ``holder`` may not take ``address``, whose bind record names ``recorded``, or
    None. The one rule of a pool hold (``pool:<driver>``): only that pool's claims take it
    over (``driver``: the claim's DRA driver; None for a bind, whose ``claim:<uid>`` holder
    comes from a claim's Prepare); the device plugin, ``vfioctl bind``, a front-end's
    ``bind: true`` and another driver's claims are refused, with the fix."""
    pool = pool_of(recorded)
    if pool is None or holder == recorded:
        return None
    if claim_of(holder) is not None and driver in (None, pool):
        return None
    return (
        f"{address} is held by the DRA pool of {pool} (its bind record says bound_by "
        f"{recorded}: a claim switched it to VFIO ahead of its pod and went away; that pool's "
        f"next claim takes it over); to use it otherwise, give it back to its native driver "
        f"first: vfioctl unbind {address}"
    )
