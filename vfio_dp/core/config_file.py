"""The node core's ``--config`` file: has it changed, and what does it say now.

A ConfigMap mounted as a volume swaps its ``..data`` symlink, so the file behind ``--config``
changes identity (:func:`vfio_dp.host.files.file_id`: device, inode, size, mtime) without a
write to the path itself. :class:`vfio_dp.core.node.NodeCore` looks whenever the config's
directories change (:class:`vfio_dp.host.inotify.DirWatcher` on
:func:`vfio_dp.host.inotify.config_dirs`) and asks :meth:`ConfigFile.changed`; a new config is
parsed in a worker thread (``/healthz`` and the kubelet's calls keep being answered) and
handed back for the core to check against the inventory and apply. An unreadable file, or
the same bytes under a new identity, keeps the current configuration.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from vfio_dp.errors import ConfigError
from vfio_dp.host.files import FileId, file_id, load_config, read_config_bytes
from vfio_dp.model.config import Config, load_config_bytes

log = logging.getLogger("vfio_dp.core")


class ConfigFile:
    """``--config`` (or none: the default config), and what was last read from it."""

    def __init__(self, path: str | None, node_name: str | None) -> None:
        self.path = path
        self.node_name = node_name
        #: the identity and bytes of the file last taken (None: not read, or unreadable)
        self.id: FileId | None = None
        self.text: bytes | None = None

    def load(self) -> Config:
        """The config at start, for this node (raises :class:`ConfigError` listing every
        problem; without ``--config``: :data:`vfio_dp.model.config.DEFAULT_CONFIG`)."""
        config = load_config(self.path).for_node(self.node_name)
        if self.path is not None:
            self.id = file_id(self.path)
            try:
                self.text = read_config_bytes(self.path)
            except ConfigError:
                self.text = None
        return config

    async def changed(self, run: Callable[..., Awaitable[Any]]) -> Config | None:
        """The new config for this node when the file behind ``--config`` changed, else None.
        Raises :class:`ConfigError` when the new file is not a valid config; an unreadable
        one is logged and the current configuration kept (None)."""
        path = self.path
        if path is None:
            return None
        now = file_id(path)
        if now is None or now == self.id:
            return None
        self.id = now
        try:
            text: bytes = await run(read_config_bytes, path)
        except ConfigError as e:
            log.warning("%s\nkeeping the current configuration", e)
            return None
        if text == self.text:
            return None
        self.text = text
        new: Config = await run(load_config_bytes, text, path)
        return new.for_node(self.node_name)
