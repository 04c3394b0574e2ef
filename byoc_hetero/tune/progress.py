"""The tuner's progress on stderr: one updating line on a terminal, plain lines otherwise.

``bh.tune(progress=True)`` and ``byoc-hetero tune`` draw it. On a terminal the line is rewritten in
place (carriage return, padded to the previous length, cut to the terminal's width); piped into a
file or a CI log, where a carriage return would pile everything into one unreadable line, each
step is its own line.
"""

from __future__ import annotations

import shutil
import sys
from typing import TextIO

BAR = 20
"""Width of the bar, in characters."""


class ProgressBar:
    """``bar(level, done, total, what)``: ``level`` is the tuning level ("codegen", "algorithm",
    "end to end"), ``done`` of ``total`` its steps finished, ``what`` the step now measured."""

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.tty = tty if tty is not None else bool(isatty and isatty())
        self._shown = 0  # length of the line now on the terminal

    def line(self, level: str, done: int, total: int, what: str) -> str:
        """The text drawn for one update (without the carriage return)."""
        filled = BAR * done // total if total else BAR
        return f"tune [{'#' * filled}{'.' * (BAR - filled)}] {level} {done}/{total} {what}"

    def __call__(self, level: str, done: int, total: int, what: str) -> None:
        text = self.line(level, done, total, what)
        if not self.tty:
            print(text, file=self.stream, flush=True)
            return
        width = shutil.get_terminal_size((100, 20)).columns - 1
        text = text[:width]
        self.stream.write("\r" + text.ljust(self._shown))
        self.stream.flush()
        self._shown = len(text)

    def close(self) -> None:
        """End the updating line (nothing to do for plain lines)."""
        if self.tty and self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = 0


__all__ = ["ProgressBar"]
