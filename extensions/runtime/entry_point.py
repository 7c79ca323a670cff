"""How every stage script starts and ends: config flags resolved and shown, errors as one line.

    def main(argv=None) -> int:
        return run_entry_point("train_integrated", _run, argv)

Exit statuses shared by the scripts: 2 for a config or usage problem (with the nearest valid key),
a stale or missing stage result, a missing input (prepared data, a model path); 73 when another
process holds the run (``extensions.runtime.run_lock``); 74 when a path cannot be written (a read-only run
root, an output directory without permission, a full disk); 130 after a Ctrl-C that aborted. A
script's own statuses (75: stopped after saving) pass through. Each is one line on stderr, never a
traceback (``KERNEL_RL_DEBUG=1`` re-raises, for the traceback).
"""
from __future__ import annotations

import errno
import os
import sys
from typing import Callable, Iterable, Optional

from ..config import ConfigError, ConfigHelpRequested, announce_config, config_from_args, config_yaml
from .freshness import StageCheckError
from .run_lock import EXIT_LOCKED, RunLockHeld, is_secondary_rank

EXIT_USAGE = 2
EXIT_CANNOT_WRITE = 74  # sysexits' EX_IOERR
EXIT_INTERRUPTED = 130
_WRITE_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR}


def start_config(args, prog: str, extra_overrides: Iterable[str] = (), *, announce: bool = True):
    """The config the flags describe, announced on stderr; ``--print-config`` prints it and ends (exit 0)."""
    cfg = config_from_args(args, extra_overrides, machine_default=True)
    if getattr(args, "print_config", False):
        raise ConfigHelpRequested(config_yaml(cfg).rstrip("\n"))
    if announce and not is_secondary_rank():  # one announcement per data-parallel job
        announce_config(cfg, prog)
    return cfg


def run_entry_point(prog: str, run: Callable[[Optional[list]], int], argv: Optional[list] = None,
                    interrupted_hint: str = "") -> int:
    try:
        return run(argv)
    except ConfigHelpRequested as text:
        try:
            print(text, flush=True)
        except BrokenPipeError:  # `--print-config | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except ConfigError as exc:
        print(f"{prog}: config error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except StageCheckError as exc:
        print(f"{prog}: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except RunLockHeld as exc:
        print(f"{prog}: {exc}", file=sys.stderr, flush=True)
        return EXIT_LOCKED
    except FileNotFoundError as exc:
        if os.environ.get("KERNEL_RL_DEBUG"):
            raise
        print(f"{prog}: {_one_line(exc)}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except OSError as exc:
        if os.environ.get("KERNEL_RL_DEBUG") or exc.errno not in _WRITE_ERRNOS:
            raise
        where = f" {exc.filename}" if exc.filename else ""
        print(f"{prog}: cannot write{where}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return EXIT_CANNOT_WRITE
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted (Ctrl-C){'; ' + interrupted_hint if interrupted_hint else ''}",
              file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
