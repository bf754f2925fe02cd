"""Reading a config file's YAML within bounds: a hostile ConfigMap is refused fast, before
anything grows (:mod:`vfio_dp.model.config` then says what the document means).

The steps: bytes → text (UTF-8, at most :data:`MAX_CONFIG_BYTES`); text → the node graph
PyYAML composes, refused when it nests deeper than :data:`MAX_CONFIG_DEPTH`, would have more
than :data:`MAX_CONFIG_NODES` nodes with every alias expanded, has an alias that refers to
itself, or holds more than one document; graph → Python values through the safe constructors
only. An unquoted number remembers how it was written, so the error for ``vendor: 8086``
(the decimal 8086, not the hex ID) can say what to quote (:func:`unquoted_text`)::

    /etc/vfio_dp/config.yaml: (file): refused at line 3, column 9: nested deeper than 20 levels

Every refusal is a :class:`~vfio_dp.errors.ConfigError` naming the file.
"""

from __future__ import annotations

from typing import Any

from vfio_dp.errors import ConfigError

#: Bounds on a config file (a hostile ConfigMap must be refused fast, before anything grows):
#: its size (a real one with hundreds of selectors is a few KiB; a ConfigMap holds 1 MiB),
#: how deep it nests (a valid one is 5 deep), and how many nodes it would have with every
#: YAML alias expanded (a 372-byte "billion laughs" file expands to 10**9).
MAX_CONFIG_BYTES = 256 * 1024
MAX_CONFIG_DEPTH = 20
MAX_CONFIG_NODES = 20_000


def decode(data: bytes, source: str) -> str:
    """A config file's bytes as text: at most :data:`MAX_CONFIG_BYTES`, UTF-8."""
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            source,
            [("(file)", None, f"{len(data)} bytes: larger than the {MAX_CONFIG_BYTES} allowed")],
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            source,
            [
                (
                    "(file)",
                    None,
                    f"not UTF-8 text (byte {e.start} is {data[e.start]:#04x}); save it as UTF-8",
                )
            ],
        ) from None


def load(text: str, source: str) -> object:
    """The YAML document in ``text`` as Python values, within the bounds above."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(
            source,
            [
                (
                    "(file)",
                    None,
                    f"{len(text)} characters: larger than the {MAX_CONFIG_BYTES} allowed",
                )
            ],
        )
    return _bounded_yaml(text, source)


class _IdInt(int):
    """An int YAML read from an unquoted scalar, remembering the text (``8086``, ``0x10de``)
    so the error can show what to quote."""

    text = ""


class _IdFloat(float):
    """A float YAML read from an unquoted scalar (``1.0``, or ``0000:05:00.0``, which YAML 1.1
    reads as a base-60 number), remembering the text."""

    text = ""


def unquoted_text(value: object) -> str:
    """The text an unquoted scalar was written as (``8086`` for the int YAML made of it)."""
    if isinstance(value, _IdInt | _IdFloat):
        return value.text
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _bounded_yaml(text: str, source: str) -> object:
    """``yaml.safe_load`` that refuses, before building any Python object, a document nested
    deeper than :data:`MAX_CONFIG_DEPTH`, one whose aliases would expand it past
    :data:`MAX_CONFIG_NODES` nodes, a recursive alias, and more than one document.

    PyYAML composes a node graph first (an alias is a second reference to the anchored node,
    nothing is copied), so the graph's expanded size is counted there, each node once.
    """
    import yaml

    def too_much(why: str, mark: Any) -> ConfigError:
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return ConfigError(source, [("(file)", None, f"refused{where}: {why}")])

    class Loader(yaml.SafeLoader):
        depth = 0
        nodes = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self.depth += 1
            self.nodes += 1
            try:
                if self.depth > MAX_CONFIG_DEPTH or self.nodes > MAX_CONFIG_NODES:
                    mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                    if self.depth > MAX_CONFIG_DEPTH:
                        raise too_much(f"nested deeper than {MAX_CONFIG_DEPTH} levels", mark)
                    raise too_much(f"more than {MAX_CONFIG_NODES} values", mark)
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    def construct_int(loader: Any, node: Any) -> _IdInt:
        v = _IdInt(yaml.SafeLoader.construct_yaml_int(loader, node))
        v.text = str(node.value)
        return v

    def construct_float(loader: Any, node: Any) -> _IdFloat:
        v = _IdFloat(yaml.SafeLoader.construct_yaml_float(loader, node))
        v.text = str(node.value)
        return v

    Loader.add_constructor("tag:yaml.org,2002:int", construct_int)
    Loader.add_constructor("tag:yaml.org,2002:float", construct_float)

    loader = None
    try:
        loader = Loader(text)  # the reader refuses control characters (NUL) right here
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, too_much)
        return loader.construct_document(node)  # safe constructors only: unknown tags raise
    except yaml.YAMLError as e:
        raise ConfigError(source, [("(file)", None, f"not valid YAML: {e}")]) from None
    finally:
        if loader is not None:
            loader.dispose()


def _expanded_size(top: Any, too_much: Any) -> int:
    """Nodes the document would have with every alias expanded; raise past the bound or on a
    cycle. Iterative and memoised: each distinct node is visited once."""
    import yaml

    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(top, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node, yaml)
            total = 1 + sum(sizes[id(c)] for c in children)
            sizes[key] = min(total, MAX_CONFIG_NODES + 1)
            if total > MAX_CONFIG_NODES:
                raise too_much(
                    f"more than {MAX_CONFIG_NODES} values once its YAML aliases (*name) are "
                    "expanded; write the values out instead of repeating anchors",
                    node.start_mark,
                )
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise too_much("a YAML alias refers to itself", node.start_mark)
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node, yaml) if id(c) not in sizes)
    return sizes[id(top)]


def _children(node: Any, yaml: Any) -> list[Any]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []
