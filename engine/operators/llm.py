"""An OpenAI-compatible chat client with retries, JSON-schema replies, usage accounting and replay.

Model and endpoint come from ``poise.toml`` ``[llm]`` (``base_url`` empty: ``$OPENAI_BASE_URL``, then
the OpenAI default); the key comes ONLY from the environment variable ``[llm].api_key_env`` names and
is never written anywhere. Every call is recorded inside the archive as a blob under the ref
``refs/poise-llm/<sha256 of the request>-<n>`` (``n``: the n-th identical request of a run), written
with compare-and-swap, so ``replay=True`` re-runs a search deterministically with no endpoint at all.
Clone those refs with ``git fetch origin 'refs/poise-llm/*:refs/poise-llm/*'``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema

from engine import secrets
from engine.errors import PoiseError

LLM_REF_PREFIX = "refs/poise-llm/"
# USD per million tokens (input, output); unknown models cost 0 and are reported as unpriced.
PRICES = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.0),
    "gpt-4.1": (2.0, 8.0),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "gemini-2.0-flash": (0.10, 0.40),
    "gemini-2.5-flash": (0.30, 2.50),
}


log = logging.getLogger(__name__)
MAX_REPLY_CHARS = 1_000_000
"""the longest reply read (a proposal batch is a few thousand characters): a longer one is an error of
that call, never recorded in the archive nor sent back in a re-ask"""


class LLMError(PoiseError):
    """The endpoint failed, the key is missing, a reply stayed malformed, or a replay has no record."""


class LLMEndpointError(LLMError):
    """The endpoint is unusable (no key, a refused request, every retry failed) or a replay has no
    record: no later call would fare better, so a run stops (resumable) instead of going on
    without proposals. A malformed reply is an :class:`LLMError` of that one call."""


@dataclass
class Usage:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    replayed: int = 0

    def add(self, prompt: int, completion: int, cost: float, replayed: bool) -> None:
        self.calls += 1
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.cost_usd += cost
        self.replayed += int(replayed)

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": round(self.cost_usd, 6),
            "replayed": self.replayed,
        }


@dataclass
class Reply:
    text: str
    data: Any = None
    """the parsed, schema-valid JSON (when a schema was given)"""
    key: str = ""
    """the record key of the final call"""
    replayed: bool = False


def request_hash(request: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of a request (model, messages, temperature, response format)."""
    canon = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def price(model: str, prompt: int, completion: int) -> float:
    base = model.split("/")[-1]
    for name in sorted(PRICES, key=len, reverse=True):
        if base.startswith(name):
            p_in, p_out = PRICES[name]
            return (prompt * p_in + completion * p_out) / 1e6
    return 0.0


def validate_json(data: Any, schema: Mapping[str, Any]) -> str | None:
    """None when ``data`` satisfies the JSON schema, else a one-line reason."""
    try:
        jsonschema.validate(data, schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        return f"at {where}: {exc.message[:300]}"
    except RecursionError:
        return "nested too deeply to validate"
    return None


def parse_json_reply(text: str) -> Any:
    """The JSON object in a reply, tolerating a ```json fence around it. Raises ValueError, also for
    JSON nested deeper than the parser recurses and for text holding an unpaired surrogate
    (``"\\ud800"``: valid JSON, but no character, and not writable as UTF-8)."""
    t = text.strip()
    if t.startswith("```"):
        t = t.split("\n", 1)[1] if "\n" in t else ""
        t = t.rsplit("```", 1)[0]
    try:
        try:
            data = json.loads(t)
        except json.JSONDecodeError:
            start, end = t.find("{"), t.rfind("}")
            if not 0 <= start < end:
                raise
            data = json.loads(t[start : end + 1])
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end].encode("unicode_escape").decode("ascii")
        raise ValueError(
            f"a string holds an unpaired surrogate ({bad}); write the character itself"
        ) from None
    return data


class LLMClient:
    """Chat completions against one endpoint; records every call in ``archive`` (when given).

    ``replay=True`` answers from the records only (no endpoint, no key); a missing record is an error.
    Usage is counted per run (``usage``) and per node (``usage_by_node``, keyed by the ``node`` passed
    to :meth:`chat`).
    """

    def __init__(
        self, cfg, archive=None, *, replay: bool = False, backoff_s: float = 1.0, reask: int = 2
    ):
        self.cfg = cfg
        self.archive = archive
        self.replay = replay
        self.backoff_s = backoff_s
        self.reask = reask
        self.model = cfg.model
        self.base_url = cfg.base_url or os.environ.get("OPENAI_BASE_URL", "")
        self.usage = Usage()
        self.usage_by_node: dict[str, Usage] = {}
        self._seen: dict[str, int] = {}
        self._client = None

    # -- endpoint ------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise :class:`LLMEndpointError` now (no call is made) where no call could be: no key and
        no local endpoint. A replay needs neither."""
        if not self.replay:
            self._openai()

    def _openai(self):
        if self._client is None:
            import openai  # lazy: openai is heavy (only this path needs it)

            secrets.register_env(self.cfg.api_key_env)
            key = os.environ.get(self.cfg.api_key_env, "")
            if not key:
                if not self.base_url:
                    raise LLMEndpointError(
                        f"no API key: set the environment variable {self.cfg.api_key_env} "
                        "(or point [llm].base_url / OPENAI_BASE_URL at a local server), or use --proposer offline"
                    )
                key = "not-needed"  # local OpenAI-compatible servers (vllm serve) accept any key
            from engine.operators.llm_deadline import whole_reply_client  # lazy: needs openai

            self._client = openai.OpenAI(
                api_key=key,
                base_url=self.base_url or None,
                timeout=self.cfg.timeout_s,
                max_retries=0,
                http_client=whole_reply_client(openai, self.cfg.timeout_s),
            )
        return self._client

    @property
    def endpoint(self) -> str:
        """The chat-completions URL calls go to (for messages; never holds the key)."""
        base = (self.base_url or "https://api.openai.com/v1").rstrip("/")
        return f"{base}/chat/completions"

    def _call(self, request: dict[str, Any]) -> tuple[str, int, int]:
        """One completion, retried with backoff on transient failures: timeouts, connection errors,
        HTTP 429 and 5xx, and 200 replies that are not a completion (a non-JSON body from a
        gateway, a JSON error object, no choices). Anything else fails at once. Every failure is
        one LLMError naming the endpoint and the HTTP status."""
        import openai  # lazy: openai is heavy (only this path needs it)

        client = self._openai()
        attempts = max(1, int(self.cfg.max_retries) + 1)
        last = ""
        for attempt in range(attempts):
            wait = None
            try:
                raw = client.chat.completions.with_raw_response.create(**request)
                return parse_completion(raw.http_response)
            except BadReply as exc:
                if not exc.transient:
                    raise LLMEndpointError(f"the LLM endpoint {self.endpoint} {exc}") from None
                last = str(exc)
            except (
                openai.APITimeoutError,
                openai.APIConnectionError,
                openai.RateLimitError,
                openai.InternalServerError,
            ) as exc:
                last = _describe(exc)
                wait = _retry_after(exc)
            except openai.APIStatusError as exc:  # 4xx other than 429: retrying will not help
                raise LLMEndpointError(
                    f"the LLM endpoint {self.endpoint} refused the request: {_describe(exc)}"
                ) from None
            if wait is None:
                wait = self.backoff_s * (2**attempt) * (0.5 + random.random() / 2)
            if attempt + 1 < attempts:
                time.sleep(min(wait, 60.0))
        raise LLMEndpointError(
            f"the LLM endpoint {self.endpoint} failed after {attempts} attempts: {last}"
        )

    # -- records -------------------------------------------------------------------------------
    def _load(self, key: str) -> dict | None:
        if self.archive is None:
            return None
        blob = self.archive.git.cat_blobs([LLM_REF_PREFIX + key])[0]
        return None if blob is None else json.loads(blob)

    def _store(self, h: str, n: int, record: dict) -> str:
        """Record under ``<h>-<n>``, or the next free number where an earlier process (a resumed
        run, a second ``propose``) recorded the same request: no reply is lost, and a replay meets
        them in the order they were made. Returns the key."""
        key = f"{h}-{n}"
        if self.archive is None:
            return key
        git = self.archive.git
        oid = git.write_blobs([json.dumps(record, indent=1, sort_keys=True).encode("utf-8")])[0]
        misses = 0
        while misses < 3:
            key = f"{h}-{n}"
            if git.update_ref(LLM_REF_PREFIX + key, oid, None, "poise llm record"):
                self._seen[h] = max(self._seen.get(h, 0), n + 1)
                return key
            if git.ok("rev-parse", "--verify", "-q", LLM_REF_PREFIX + key):
                n += 1  # taken: the next identical request's number
            else:
                misses += 1  # lost for another reason (a lock): try the same number again
        log.warning("could not record LLM reply %s (git update-ref kept failing)", key)
        return key

    # -- the call ------------------------------------------------------------------------------
    def complete(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        node: str | None = None,
        json_mode: bool = False,
        purpose: str = "",
    ) -> tuple[str, str, bool]:
        """One recorded call; returns (text, record key, replayed)."""
        request: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(m) for m in messages],
            "temperature": float(self.cfg.temperature),
        }
        if json_mode:
            request["response_format"] = {"type": "json_object"}
        h = request_hash(request)
        n = self._seen.get(h, 0)
        self._seen[h] = n + 1
        key = f"{h}-{n}"
        rec = self._load(key) if self.replay else None
        if self.replay:
            if rec is None:
                raise LLMEndpointError(
                    f"--replay: no recorded reply for request {key[:16]}… ({purpose or 'chat'}); "
                    "the run diverged from the recorded one or the records were not fetched"
                )
            text, p, c, replayed = (
                rec["reply"],
                int(rec.get("prompt_tokens", 0)),
                int(rec.get("completion_tokens", 0)),
                True,
            )
        else:
            text, p, c = self._call(request)
            if len(text) > MAX_REPLY_CHARS:
                raise LLMError(
                    f"the LLM's reply is {len(text):,} characters; at most {MAX_REPLY_CHARS:,} "
                    f"are read ({purpose or 'chat'})"
                )
            replayed = False
            key = self._store(
                h,
                n,
                {
                    "request": request,
                    "reply": text,
                    "prompt_tokens": p,
                    "completion_tokens": c,
                    "purpose": purpose,
                    "node": node or "",
                    "time": time.time(),
                },
            )
        cost = price(self.model, p, c)
        self.usage.add(p, c, cost, replayed)
        if node:
            self.usage_by_node.setdefault(node, Usage()).add(p, c, cost, replayed)
        return text, key, replayed

    def chat_json(
        self,
        messages: Sequence[Mapping[str, str]],
        schema: Mapping[str, Any],
        *,
        node: str | None = None,
        purpose: str = "",
    ) -> Reply:
        """A JSON reply valid under ``schema``; malformed replies are re-asked at most ``reask`` times."""
        msgs = [dict(m) for m in messages]
        problem = ""
        for _ in range(self.reask + 1):
            text, key, replayed = self.complete(msgs, node=node, json_mode=True, purpose=purpose)
            try:
                data = parse_json_reply(text)
                problem = validate_json(data, schema) or ""
            except ValueError as exc:
                problem = f"not valid JSON ({exc})"
            if not problem:
                return Reply(text=text, data=data, key=key, replayed=replayed)
            msgs += [
                {"role": "assistant", "content": text},
                {
                    "role": "user",
                    "content": f"Your reply was rejected: {problem}. Reply again with ONLY one JSON object "
                    f"that satisfies this JSON schema:\n{json.dumps(schema)}",
                },
            ]
        raise LLMError(f"the LLM's reply stayed malformed after {self.reask} re-asks: {problem}")

    def chat(
        self, messages: Sequence[Mapping[str, str]], *, node: str | None = None, purpose: str = ""
    ) -> Reply:
        text, key, replayed = self.complete(messages, node=node, purpose=purpose)
        return Reply(text=text, key=key, replayed=replayed)

    def node_usage(self, node: str) -> dict[str, Any]:
        return self.usage_by_node.get(node, Usage()).as_dict()

    def assign_usage(self, src: str, dst: str) -> None:
        """Move the usage counted under ``src`` (e.g. a parent while proposing) onto node ``dst``."""
        if src in self.usage_by_node:
            u = self.usage_by_node.pop(src)
            d = self.usage_by_node.setdefault(dst, Usage())
            for k in ("calls", "prompt_tokens", "completion_tokens", "cost_usd", "replayed"):
                setattr(d, k, getattr(d, k) + getattr(u, k))


class BadReply(Exception):
    """A 2xx HTTP reply that is not a chat completion; ``transient`` when a retry may help."""

    def __init__(self, message: str, transient: bool):
        super().__init__(message)
        self.transient = transient


_TRANSIENT_ERRORS = (
    "overload",
    "rate_limit",
    "rate limit",
    "timeout",
    "timed out",
    "unavailable",
    "server_error",
    "server error",
    "capacity",
    "try again",
)


def parse_completion(http) -> tuple[str, int, int]:
    """``(text, prompt_tokens, completion_tokens)`` of an httpx response holding a completion.

    Raises :class:`BadReply` for a non-JSON body, a JSON error object (transient when its code is
    429 / 5xx or its type says overloaded, rate limit, timeout...) or a reply without choices."""
    status = http.status_code
    ctype = http.headers.get("content-type", "?").split(";")[0]
    try:
        data = json.loads(http.text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        snippet = " ".join(http.text.split())[:120]
        raise BadReply(
            f"returned a body that is not JSON (HTTP {status}, {ctype}): {snippet!r}",
            transient=True,
        ) from None
    if not isinstance(data, dict):
        raise BadReply(f"returned JSON that is not an object (HTTP {status})", transient=True)
    err = data.get("error")
    if err and not data.get("choices"):
        err = err if isinstance(err, dict) else {"message": str(err)}
        code = err.get("code") or err.get("status")
        kind = str(err.get("type") or "")
        msg = " ".join(str(err.get("message") or "no message").split())[:200]
        try:
            numeric = int(code)
        except (TypeError, ValueError):
            numeric = None
        transient = (numeric is not None and (numeric == 429 or numeric >= 500)) or any(
            w in (kind + " " + msg).lower() for w in _TRANSIENT_ERRORS
        )
        detail = ", ".join(x for x in (f"code {code}" if code else "", kind) if x)
        raise BadReply(
            f"answered HTTP {status} with an error object ({detail or 'no code'}): {msg}",
            transient=transient,
        )
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise BadReply(f"answered HTTP {status} without choices", transient=True)
    message = choices[0].get("message") or {}
    text = message.get("content") if isinstance(message, dict) else None
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}

    def count(key: str) -> int:
        try:
            return int(usage.get(key) or 0)
        except (TypeError, ValueError):
            return 0

    return (
        (text if isinstance(text, str) else ""),
        count("prompt_tokens"),
        count("completion_tokens"),
    )


def recorded_calls(archive) -> int:
    """How many LLM calls the archive holds records of."""
    out = archive.git.text("for-each-ref", "--format=%(refname)", LLM_REF_PREFIX)
    return len([ln for ln in out.splitlines() if ln.strip()])


def make_client(cfg, archive=None, *, replay: bool = False) -> LLMClient:
    """A client for ``cfg.llm``; ``cfg`` may be the whole Config or its LLMConfig."""
    return LLMClient(getattr(cfg, "llm", cfg), archive, replay=replay)


def _describe(exc: Exception) -> str:
    status = getattr(exc, "status_code", None)
    msg = (
        str(getattr(exc, "message", "") or exc).splitlines()[0][:200]
        if str(exc)
        else type(exc).__name__
    )
    return (
        f"{type(exc).__name__}"
        + (f" (HTTP {status})" if status else "")
        + (f": {msg}" if msg else "")
    )


def _retry_after(exc: Exception) -> float | None:
    resp = getattr(exc, "response", None)
    headers = getattr(resp, "headers", None)
    if not headers:
        return None
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        v = headers.get(name)
        if v is not None:
            try:
                return max(0.0, float(v) * scale)
            except ValueError:
                return None
    return None
