"""How Tulip's launcher reads its flags: every flag is also an environment
variable (``--max-batch-tokens`` ↔ ``TULIP_MAX_BATCH_TOKENS``), and a
boolean reads the way Ivy's do (clap's boolish values), so one habit works
for both binaries: ``--flag`` alone is true, and ``--flag VALUE`` or the
variable takes true/false, yes/no, on/off, 1/0 (also y/n, t/f; any case)."""

from __future__ import annotations

import argparse
import os

TRUE = ("true", "yes", "on", "1", "y", "t")
FALSE = ("false", "no", "off", "0", "n", "f")


def env_name(flag: str) -> str:
    return "TULIP_" + flag.lstrip("-").replace("-", "_").upper()


def parse_bool(s: str) -> bool:
    value = s.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise argparse.ArgumentTypeError(f"{s!r} is not a boolean: use true or false (or yes/no, on/off, 1/0)")


def parse_auto_bool(s: str) -> bool | None:
    """A boolean, or None for ``auto`` (decided once the device is known)."""
    if s.strip().lower() == "auto":
        return None
    try:
        return parse_bool(s)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{s!r} is not auto or a boolean: use auto, true or false") from None


def parse_loras(s: str) -> list[tuple[str, str]]:
    """``NAME=PATH[,NAME=PATH...]``: LoRA adapters to load at start."""
    out = []
    for item in filter(None, (part.strip() for part in s.split(","))):
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise argparse.ArgumentTypeError(f"{item!r} is not NAME=PATH")
        out.append((name.strip(), path.strip()))
    return out


_KINDS = {int: "an integer", float: "a number", str: "a string"}


def _shown(default) -> str:
    """A default as --help prints it: booleans as true/false, nothing as none."""
    if isinstance(default, bool):
        return str(default).lower()
    return "none" if default in (None, "") else str(default)


class Parser(argparse.ArgumentParser):
    def flag(self, name: str, *, type=str, default=None, help: str, shown: str | None = None, **kw):
        """Adds ``name`` with its environment variable as the default.
        ``shown`` is the default as ``--help`` prints it, where the stored
        default is a sentinel (``-1``, ``0``, ``None``) for a value decided
        at start (by the device): the help says what it becomes."""
        env = env_name(name)
        raw = os.environ.get(env)
        if raw is not None:
            try:
                default = type(raw)
            except argparse.ArgumentTypeError as e:
                self.error(f"{env}={raw!r}: {e}")
            except ValueError:
                self.error(f"{env}={raw!r} is not {_KINDS.get(type, 'valid')}")
        if type in (parse_bool, parse_auto_bool):
            # `--flag` alone means true, as with Ivy's boolean flags.
            kw.setdefault("nargs", "?")
            kw.setdefault("const", True)
            kw.setdefault("metavar", "BOOL" if type is parse_bool else "auto|BOOL")
        if shown is None:
            shown = _shown(default)
        self.add_argument(name, type=type, default=default, help=f"{help} [env {env}, default {shown}]", **kw)
