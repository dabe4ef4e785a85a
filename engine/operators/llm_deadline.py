"""An HTTP client for the openai SDK whose ``[llm].timeout_s`` bounds a whole reply, not each read.

The SDK's own timeout is the HTTP library's: it bounds each wait for data, so a server that keeps
sending a byte every few seconds is never cut off and a run waits on it for ever. The client made
here reads the body itself and gives up, with the HTTP library's ``ReadTimeout`` (which the SDK
turns into ``APITimeoutError``, retried like any timeout), once the reply has taken longer than
``seconds`` since the request was sent. A server that stops sending altogether is still cut off by
the per-read timeout, so no call waits longer than twice ``seconds``.

The SDK is passed in (it is imported lazily by its one caller): its ``DefaultHttpxClient`` is
subclassed, so the client keeps the SDK's defaults and works with whichever HTTP library the
installed SDK is built on (``httpx``, or ``httpx2`` from openai 3).
"""

from __future__ import annotations

import sys
import time
from types import ModuleType
from typing import Any


def _http_library(base: type) -> ModuleType:
    """The HTTP library (``httpx`` / ``httpx2``) ``base``, the SDK's client class, is built on."""
    for cls in base.__mro__[1:]:
        top = cls.__module__.partition(".")[0]
        mod = sys.modules.get(top)
        if mod is not None and hasattr(mod, "ReadTimeout") and hasattr(mod, "SyncByteStream"):
            return mod
    raise RuntimeError(f"cannot tell which HTTP library {base!r} is built on")


def whole_reply_client(openai: ModuleType, seconds: float, setting: str = "[llm].timeout_s") -> Any:
    """An ``openai.DefaultHttpxClient`` that cuts off a reply still arriving ``seconds`` after its
    request was sent (and, as usual, one silent for ``seconds``); ``setting`` names what sets it."""
    base = openai.DefaultHttpxClient
    http = _http_library(base)

    def check(end: float, request) -> None:
        """The HTTP library's ``ReadTimeout`` once the reply has taken past ``end``."""
        if time.monotonic() > end:
            raise http.ReadTimeout(
                f"the reply took longer than {seconds:g} s ({setting})", request=request
            )

    class _Deadline(http.SyncByteStream):
        def __init__(self, inner, end: float, request) -> None:
            self.inner, self.end, self.request = inner, end, request

        def __iter__(self):
            for chunk in self.inner:
                check(self.end, self.request)
                yield chunk

        def close(self) -> None:
            self.inner.close()

    class WholeReplyClient(base):
        def send(self, request, *, stream: bool = False, **kwargs):
            end = time.monotonic() + seconds
            response = super().send(request, stream=True, **kwargs)
            if stream:  # the caller reads the body itself (the engine never streams)
                return response
            response.stream = _Deadline(response.stream, end, request)
            try:
                check(end, request)  # the headers alone took that long
                response.read()
            except BaseException:
                response.close()
                raise
            return response

    return WholeReplyClient(timeout=seconds)
