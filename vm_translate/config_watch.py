"""The webhook's ``--config``, followed across ConfigMap updates (as the daemon does).

A ConfigMap volume is a symlink farm; an update swaps one symlink::

    /etc/vfio_dp/config.yaml -> ..data/config.yaml
    /etc/vfio_dp/..data      -> ..2026_11_23_11_40_00.123456789   (swapped atomically)

So the file's identity (``st_dev``, ``st_ino``, ``st_ctime_ns`` of what the path resolves to)
changes when the content does; an in-place edit changes ``st_ctime_ns``. :meth:`ConfigWatch.check`
re-reads the file only then. A new config that cannot be read or is invalid is logged with
every error and the previous one stays in use; a missing file (mid-swap) is retried next time.

The webhook calls :meth:`ConfigWatch.changed` (a stat) on its event loop whenever inotify
reports a change in the file's directories (:func:`vfio_dp.host.inotify.config_dirs`; every
``--reload-interval`` seconds too, and instead where inotify cannot watch) and
:meth:`ConfigWatch.check` in a worker thread, so reading a big file never stalls answers.
Reading and parsing is the injected ``load`` function (default
:func:`vm_translate.inputs.load_config`), so this module decides WHEN to read, never HOW.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from vfio_dp.errors import ConfigError
from vfio_dp.host.files import file_id
from vfio_dp.host.inotify import DirWatcher, config_dirs
from vfio_dp.model.config import Config
from vm_translate.errors import TranslateError
from vm_translate.tls import ReloadingContext

log = logging.getLogger(__name__)


def _default_load(path: str) -> Config:
    from vm_translate.inputs import load_config

    return load_config(path)


class ConfigWatch:
    """``.config`` is the configuration in use; :meth:`check` follows the file.

    With ``path=None`` the configuration is fixed (``initial``, or the daemon's default).
    """

    def __init__(
        self,
        path: str | None,
        load: Callable[[str], Config] = _default_load,
        initial: Config | None = None,
    ) -> None:
        self.path = path
        self._load = load
        # identity BEFORE the read: a swap after it is seen by the next check
        self._id = file_id(path) if path else None
        if initial is not None:
            self.config = initial
        elif path:
            self.config = load(path)  # a bad config at start is the caller's error (exit 2)
        else:
            from vfio_dp.model.config import DEFAULT_CONFIG

            self.config = DEFAULT_CONFIG
        self.reloads = 0
        self.rejected = 0

    @classmethod
    def fixed(cls, config: Config) -> ConfigWatch:
        return cls(None, initial=config)

    def changed(self) -> bool:
        """Whether the file's identity differs from the one last loaded (a stat, no read)."""
        if not self.path:
            return False
        now = file_id(self.path)
        return now is not None and now != self._id

    def check(self) -> bool:
        """Load the file again if it changed; True when a new configuration is in use."""
        if not self.path:
            return False
        now = file_id(self.path)
        if now is None or now == self._id:
            return False
        self._id = now
        try:
            new = self._load(self.path)
        except (ConfigError, TranslateError) as e:
            self.rejected += 1
            log.error("%s\nkeeping the previous configuration", e)
            return False
        except Exception as e:  # a reload must never take the webhook down
            self.rejected += 1
            log.error(
                "config %s could not be loaded (%s: %s); keeping the previous configuration",
                self.path,
                type(e).__name__,
                str(e)[:500],
            )
            return False
        if new == self.config:
            return False
        self.config = new
        self.reloads += 1
        log.info("configuration reloaded from %s", self.path)
        return True


async def follow(tls: ReloadingContext, configs: ConfigWatch, interval: float) -> None:
    """The webhook's reload loop: re-read the certificate and ``--config`` when their
    directories change (inotify: at once), else every ``interval`` seconds. Runs until
    cancelled."""

    async def look() -> None:
        tls.reload_if_changed()
        if configs.changed():  # a stat; reading and parsing happen off the event loop
            await asyncio.to_thread(configs.check)

    files = DirWatcher(
        lambda: [
            *config_dirs(configs.path),
            *config_dirs(tls.cert_file),
            *config_dirs(tls.key_file),
        ],
        poll=interval,
        safety=interval,
        label="webhook files",
    )
    await files.run(look, log)
