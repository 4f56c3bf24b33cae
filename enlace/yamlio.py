"""Reading YAML files the way config and hosts files need: a key given twice is an error (plain YAML
keeps the last silently), a file that is not UTF-8 or not YAML is one clear ConfigError. Aliases (`*name`)
are refused (nested, they expand a few lines into gigabytes: the "YAML bomb"), and a file over MAX_BYTES is
refused before it is parsed (every driver command reads the hosts files)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from enlace.errors import ConfigError

MAX_BYTES = 1 << 20  # 1 MiB: a hosts file or run config is a few KB


class AliasRefused(yaml.YAMLError):
    def __init__(self, alias: str, line: int):
        super().__init__(f"an alias (*{alias}) at line {line}")
        self.alias, self.line = alias, line
        self.fix = "enlace's YAML files take no aliases (&anchor / *alias): write the value out"


class TooLarge(yaml.YAMLError):
    def __init__(self, size: int):
        super().__init__(f"{size:,} bytes, over the {MAX_BYTES:,}-byte limit")
        self.fix = "a hosts file or run config is a few KB: is this the right file?"


class TooDeep(yaml.YAMLError):
    def __init__(self):
        super().__init__("nested deeper than YAML can be read here")
        self.fix = "a hosts file or run config is a few levels deep: is this the right file?"


class NotRegular(yaml.YAMLError):
    def __init__(self):
        super().__init__("not a regular file (a device, a fifo, or a link to one)")
        self.fix = "name a .yaml file"


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: str, first: int, again: int):
        super().__init__(f"{key!r} given twice")
        self.key, self.first, self.again = key, first, again


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (plain YAML silently keeps the last)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise AliasRefused(event.anchor, event.start_mark.line + 1)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                continue  # an odd key: the schema check names it later
            if key in seen:
                raise DuplicateKey(str(key), seen[key], line)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


# YAML 1.2's floats: PyYAML reads YAML 1.1, whose floats need a dot, so `learning_rate: 3e-4` (as people write
# it, and as --set takes it) was the string '3e-4' and refused as "expected a number"
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+|\.[0-9_]+(?:[eE][-+]?[0-9]+)?)$"
    ),
    list("-+0123456789."),
)


# YAML 1.2's numbers have no base 60 either: YAML 1.1 read an unquoted Slurm `time: 4:00:00` as the integer
# 14400 (minutes to Slurm: ten days). Such a value stays the string it was written as.
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if not (tag in _NUMBER_TAGS and (rx.match("1:30") or rx.match("1:3.5")))]
    for first, resolvers in _UniqueKeyLoader.yaml_implicit_resolvers.items()
}
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+."),
)


def load_yaml_unique(text: str) -> Any:
    """yaml.safe_load, but a key given twice in one mapping raises DuplicateKey (with both lines), an alias
    AliasRefused, and a text over MAX_BYTES TooLarge. Config files and hosts files are read with it."""
    if len(text) > MAX_BYTES:
        raise TooLarge(len(text))
    loader = _UniqueKeyLoader(text)
    try:
        return loader.get_single_data()
    except RecursionError:  # `[[[[…` a few thousand deep: a few KB, past Python's stack
        raise TooDeep() from None
    finally:
        loader.dispose()


def read_yaml(path: Path, what: str, shown: str | None = None) -> dict[str, Any]:
    """The mapping in the YAML file at `path`; its errors name it as `shown` (a path relative to the project)."""
    name = shown or str(path)
    try:
        raw = read_bounded(path)
    except TooLarge as e:
        raise ConfigError(name, "", f"is {e}", e.fix) from None
    except NotRegular as e:
        raise ConfigError(name, "", f"is {e}", e.fix) from None
    except FileNotFoundError:
        raise ConfigError(name, "", f"{what} file not found", "create it or check the name") from None
    except IsADirectoryError:
        raise ConfigError(name, "", f"{what} file is a directory", "name a .yaml file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            name,
            "",
            f"is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})",
            "save the file as UTF-8",
        ) from None
    try:
        data = load_yaml_unique(text)
    except DuplicateKey as e:
        raise ConfigError(
            name,
            e.key,
            f"given twice (lines {e.first} and {e.again}); YAML would silently keep only the last",
            "merge the two entries into one",
        ) from None
    except (AliasRefused, TooDeep) as e:
        raise ConfigError(name, "", str(e), e.fix) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        line = text.splitlines()[mark.line] if mark and mark.line < len(text.splitlines()) else ""
        tab = "\t" in line[: len(line) - len(line.lstrip())]  # YAML indents with spaces only
        fix = "indent with spaces: YAML refuses a tab there" if tab else "fix the syntax"
        raise ConfigError(name, "", f"not valid YAML{where}", fix) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(name, "", "expected a mapping of keys at the top level")
    return data


def read_bounded(path: Path) -> bytes:
    """The file's bytes; TooLarge past MAX_BYTES (checked by its size first: a 50 MB file is not read), and
    NotRegular for a device or fifo (a config linked to /dev/zero would be read forever)."""
    import stat

    st = path.stat()
    if not stat.S_ISREG(st.st_mode):
        raise NotRegular()
    if st.st_size > MAX_BYTES:
        raise TooLarge(st.st_size)
    with open(path, "rb") as fh:
        raw = fh.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise TooLarge(len(raw))
    return raw
