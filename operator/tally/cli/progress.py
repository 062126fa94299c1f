"""Progress on stderr while the plugin lists many objects: one line, rewritten in place.

Only on a terminal: piped or redirected, stderr gets nothing but errors, so a script that
captures it sees exactly the one-line error or nothing. The line is cleared before any output,
so it never mixes with the report on stdout when both go to the same terminal.
"""

from __future__ import annotations

from typing import Final, TextIO

__all__ = ["Progress"]

_CLEAR_LINE: Final = "\r\x1b[K"


class Progress:
    """``listing pods in a: 1500``; a no-op unless ``stream`` is a terminal."""

    def __init__(self, stream: TextIO, enabled: bool | None = None) -> None:
        self._stream = stream
        self.enabled = stream.isatty() if enabled is None else enabled
        self._shown = False

    def update(self, what: str, count: int) -> None:
        if not self.enabled:
            return
        self._stream.write(f"{_CLEAR_LINE}{what}: {count}")
        self._stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            self._stream.write(_CLEAR_LINE)
            self._stream.flush()
            self._shown = False
