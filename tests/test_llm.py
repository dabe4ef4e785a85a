"""engine.operators.llm through the real openai client against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys

import openai_server  # tests/openai_server.py (tests/ is on pythonpath)
import pytest

from engine.config import LLMConfig
from engine.operators.llm import LLM_REF_PREFIX, LLMClient, LLMError, recorded_calls

SCHEMA = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "integer"}}}
KEY = "sk-test-SECRET-0123456789abcdef"


def client(server, archive=None, replay=False, **kw):
    cfg = LLMConfig(
        model="gpt-4o-mini",
        base_url=server.base_url if server else "",
        api_key_env="POISE_TEST_KEY",
        max_retries=kw.pop("max_retries", 3),
        timeout_s=kw.pop("timeout_s", 10),
    )
    return LLMClient(cfg, archive, replay=replay, backoff_s=0.01, **kw)


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("POISE_TEST_KEY", KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


MSGS = [{"role": "user", "content": "what is six times seven? reply as JSON"}]


def test_malformed_reply_is_reasked():
    S = openai_server
    with S.ScriptedOpenAI(
        ["this is not json", '{"answer": "forty-two"}', '```json\n{"answer": 42}\n```']
    ) as srv:
        reply = client(srv).chat_json(MSGS, SCHEMA)
    assert reply.data == {"answer": 42}
    assert len(srv.requests) == 3
    second, third = srv.requests[1]["messages"], srv.requests[2]["messages"]
    assert second[-1]["role"] == "user" and "not valid JSON" in second[-1]["content"]
    assert "answer" in third[-1]["content"] and third[-2]["content"] == '{"answer": "forty-two"}'
    assert srv.auth[0] == f"Bearer {KEY}"


def test_reask_is_bounded():
    S = openai_server
    with S.ScriptedOpenAI(["nope"] * 5) as srv:
        with pytest.raises(LLMError, match="malformed after 2 re-asks"):
            client(srv, reask=2).chat_json(MSGS, SCHEMA)
    assert len(srv.requests) == 3


def test_429_then_success_is_retried():
    S = openai_server
    script = [
        {"status": 429, "headers": {"retry-after-ms": "20"}},
        {"status": 503},
        '{"answer": 42}',
    ]
    with S.ScriptedOpenAI(script) as srv:
        c = client(srv)
        reply = c.chat_json(MSGS, SCHEMA)
    assert reply.data["answer"] == 42
    assert len(srv.requests) == 3
    assert c.usage.calls == 1 and c.usage.completion_tokens == 2


def test_persistent_5xx_gives_one_clear_error():
    S = openai_server
    with S.ScriptedOpenAI([{"status": 500}] * 10) as srv:
        with pytest.raises(LLMError, match="failed after 3 attempts"):
            client(srv, max_retries=2).chat(MSGS)
    assert len(srv.requests) == 3


def test_4xx_is_not_retried():
    S = openai_server
    with S.ScriptedOpenAI([{"status": 400, "message": "bad model"}, "ok"]) as srv:
        with pytest.raises(LLMError, match="refused"):
            client(srv).chat(MSGS)
    assert len(srv.requests) == 1


def test_records_replay_and_secrecy(archive):
    S = openai_server
    with S.ScriptedOpenAI(['{"answer": 1}', '{"answer": 2}', "free text"]) as srv:
        c = client(srv, archive)
        a = c.chat_json(MSGS, SCHEMA, node="n1").data
        b = c.chat_json(
            MSGS, SCHEMA, node="n1"
        ).data  # the same request twice: two records, in order
        t = c.chat([{"role": "user", "content": "hello"}], node="n2").text
    assert (a, b, t) == ({"answer": 1}, {"answer": 2}, "free text")
    assert recorded_calls(archive) == 3
    assert c.usage_by_node["n1"].calls == 2 and c.usage_by_node["n2"].calls == 1
    assert c.usage.cost_usd > 0  # gpt-4o-mini is priced
    # replay: the server is gone, the answers come from the archive in the same order
    r = client(None, archive, replay=True)
    assert r.chat_json(MSGS, SCHEMA).data == {"answer": 1}
    assert r.chat_json(MSGS, SCHEMA).data == {"answer": 2}
    assert r.chat([{"role": "user", "content": "hello"}]).text == "free text"
    assert r.usage.replayed == 3
    with pytest.raises(LLMError, match="no recorded reply"):
        r.chat([{"role": "user", "content": "never asked"}])
    # the key never reaches git
    objs = subprocess.run(
        ["git", "-C", str(archive.path), "cat-file", "--batch-all-objects", "--batch"],
        capture_output=True,
    ).stdout
    assert KEY.encode() not in objs
    refs = subprocess.run(
        ["git", "-C", str(archive.path), "for-each-ref", LLM_REF_PREFIX],
        capture_output=True,
        text=True,
    ).stdout
    assert refs.count(LLM_REF_PREFIX) == 3
    assert archive.fsck()


def test_a_second_process_asking_the_same_records_after_the_first(archive):
    # two clients stand for two processes (a run and its --resume, two `propose` calls): each
    # counts identical requests from 0, but no reply is lost to a key the other already holds
    S = openai_server
    with S.ScriptedOpenAI(['{"answer": 1}', '{"answer": 2}', '{"answer": 3}']) as srv:
        first = client(srv, archive)
        assert first.chat_json(MSGS, SCHEMA).data == {"answer": 1}
        second = client(srv, archive)
        assert second.chat_json(MSGS, SCHEMA).data == {"answer": 2}
        assert second.chat_json(MSGS, SCHEMA).data == {"answer": 3}
    assert recorded_calls(archive) == 3
    replay = client(None, archive, replay=True)  # in the order they were made
    assert [replay.chat_json(MSGS, SCHEMA).data["answer"] for _ in range(3)] == [1, 2, 3]
    assert archive.fsck()


def test_an_oversized_reply_is_refused_and_not_recorded(archive):
    from engine.operators.llm import MAX_REPLY_CHARS

    S = openai_server
    with S.ScriptedOpenAI(["x" * (MAX_REPLY_CHARS + 1)]) as srv:
        with pytest.raises(LLMError, match="characters; at most"):
            client(srv, archive).chat(MSGS)
    assert recorded_calls(archive) == 0


def _completion(text: str) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-4o-mini",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def test_timeout_bounds_the_whole_reply_not_each_read():
    """A server that keeps sending (16 bytes every 0.05 s: about 7 s for this reply) never lets a
    per-read timeout fire; ``timeout_s`` = 0.4 cuts it off all the same, as a timeout, long
    before the body would have ended."""
    import time

    S = openai_server
    slow = {"status": 200, "json": _completion('{"answer": 42}' + " " * 2000), "trickle_s": 0.05}
    assert len(json.dumps(slow["json"])) > 140 * 16  # more than 140 pieces: 7 s at least
    with S.ScriptedOpenAI([slow]) as srv:
        t = time.monotonic()
        with pytest.raises(LLMError, match="failed after 1 attempts: APITimeoutError"):
            client(srv, max_retries=0, timeout_s=0.4).chat(MSGS)
        took = time.monotonic() - t
    assert took < 4.0, took  # cut at the deadline, not when the body ended
    short = {"status": 200, "json": _completion('{"answer": 42}'), "trickle_s": 0.05}
    with S.ScriptedOpenAI([short]) as srv:  # a trickled reply within the limit is read whole
        assert client(srv, max_retries=0, timeout_s=10).chat_json(MSGS, SCHEMA).data == {
            "answer": 42
        }


def test_missing_key_is_one_clear_error(monkeypatch):
    monkeypatch.delenv("POISE_TEST_KEY")
    with pytest.raises(LLMError, match="POISE_TEST_KEY"):
        client(None).chat(MSGS)


HTML = {
    "status": 200,
    "body": "<html><body>502 Bad Gateway</body></html>",
    "content_type": "text/html",
}


def test_non_json_body_is_retried_then_answered():
    S = openai_server
    no_choices = {"status": 200, "json": {"id": "x", "object": "chat.completion"}}
    with S.ScriptedOpenAI([HTML, no_choices, '{"answer": 42}']) as srv:
        c = client(srv)
        assert c.chat_json(MSGS, SCHEMA).data == {"answer": 42}
    assert len(srv.requests) == 3 and c.usage.calls == 1


def test_persistent_non_json_body_names_endpoint_and_status():
    S = openai_server
    with S.ScriptedOpenAI([HTML] * 10) as srv:
        with pytest.raises(LLMError) as info:
            client(srv, max_retries=2).chat(MSGS)
    msg = str(info.value)
    assert len(srv.requests) == 3 and "\n" not in msg
    assert f"{srv.base_url}/chat/completions failed after 3 attempts" in msg
    assert "not JSON (HTTP 200, text/html)" in msg and "502 Bad Gateway" in msg


def test_json_error_object_in_a_200_reply():
    S = openai_server
    overloaded = {"status": 200, "json": {"error": {"message": "upstream overloaded", "code": 503}}}
    with S.ScriptedOpenAI([overloaded, '{"answer": 7}']) as srv:
        assert client(srv).chat_json(MSGS, SCHEMA).data == {"answer": 7}  # transient: retried
    assert len(srv.requests) == 2
    bad = {
        "status": 200,
        "json": {
            "error": {
                "message": "model 'x' does not exist",
                "type": "invalid_request_error",
                "code": 404,
            }
        },
    }
    with S.ScriptedOpenAI([bad, '{"answer": 7}']) as srv:
        with pytest.raises(LLMError) as info:
            client(srv).chat(MSGS)
    assert len(srv.requests) == 1  # not transient: no retry
    assert str(info.value) == (
        f"the LLM endpoint {srv.base_url}/chat/completions answered HTTP 200 with an error object "
        "(code 404, invalid_request_error): model 'x' does not exist"
    )


def test_cli_gives_one_line_not_a_traceback(tmp_path, cli):
    from engine.archive.store import Archive

    toml = '[propose]\nproposer = "llm"\n[llm]\napi_key_env = "POISE_TEST_KEY"\nmax_retries = 1\n'
    arch = Archive.init(tmp_path / "exp", config_toml=toml)
    S = openai_server
    with S.ScriptedOpenAI([HTML] * 5) as srv:
        env = {"OPENAI_BASE_URL": srv.base_url, "POISE_TEST_KEY": KEY}
        r = cli("propose", "grpo", "-C", str(arch.path), env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"error: the LLM endpoint {srv.base_url}/chat/completions failed")
    assert "HTTP 200, text/html" in line and KEY not in line


def test_a_reply_nested_past_the_parser_is_reasked():
    """JSON nested deeper than the parser recurses (a few kilobytes of brackets) is a malformed
    reply: re-asked, never a crash."""
    S = openai_server
    with S.ScriptedOpenAI(["[" * 100_000, '{"answer": 1}']) as srv:
        reply = client(srv).chat_json(MSGS, SCHEMA)
    assert reply.data == {"answer": 1} and len(srv.requests) == 2
    assert "nested too deeply" in srv.requests[1]["messages"][-1]["content"]


def test_json_nested_near_the_parsers_limit_gives_data_or_a_reason():
    """Just inside the parser's depth, the schema's validation (its message quotes the value) may
    recurse past the limit instead: a reason as well, at every depth."""
    from engine.operators.llm import parse_json_reply, validate_json
    from engine.operators.proposers.llm import proposals_schema

    head = '{"proposals": [{"name": "x", "mechanism": "m", "motivation": "", "code": "", '
    head += '"expected_effect": "", "hyperparameters": '
    reasons = set()
    raised = sys.getrecursionlimit()  # reading a deep lineage raises it (engine.archive.store)
    sys.setrecursionlimit(1_000)  # Python's default: the depths below are near it, and quick
    try:
        for depth in range(900, 1_000):
            text = head + '{"a": ' * depth + "1" + "}" * depth + "}]}"
            try:
                problem = validate_json(parse_json_reply(text), proposals_schema())
            except ValueError as exc:
                problem = str(exc)
            reasons.add(problem.split(":")[0])
    finally:
        sys.setrecursionlimit(raised)
    assert "nested too deeply to validate" in reasons and "nested too deeply" in reasons


def test_a_reply_holding_an_unpaired_surrogate_is_reasked():
    """A string holding "\\ud800" is valid JSON but no character: it cannot be written as
    UTF-8 anywhere (a PROPOSAL.md, a commit), so the reply is malformed; a proper pair is a
    character."""
    schema = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}
    S = openai_server
    with S.ScriptedOpenAI(['{"name": "bad \\ud800 text"}', '{"name": "ok \\ud83d\\ude00"}']) as srv:
        reply = client(srv).chat_json(MSGS, schema)
    assert reply.data == {"name": "ok \U0001f600"} and len(srv.requests) == 2
    assert "unpaired surrogate" in srv.requests[1]["messages"][-1]["content"]
