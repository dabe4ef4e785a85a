"""Generation backends: transformers end to end on a tiny local model, the OpenAI-compatible backend
against a real HTTP server on 127.0.0.1 through the openai client, vLLM request construction, the
suite recorded on a node and in MLflow, and the CLI."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine.errors import EvaluationError
from evaluators.benchmarks import SUITES, load_problems
from evaluators.errors import SuiteError
from evaluators.generation import (
    QWEN25_MATH_COT,
    SYSTEM_PROMPT,
    OpenAIBackend,
    Sampling,
    TransformersBackend,
    VLLMBackend,
    render_prompt,
    vllm_sampling_kwargs,
)
from evaluators.metrics import MATH6_WEIGHTS
from evaluators.tiny import make_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def tiny_backend(tiny):
    return TransformersBackend(str(tiny), batch_size=4)


# ------------------------------------------------------------------------------------ transformers
def test_transformers_backend_samples_and_greedy(tiny_backend):
    problems = ["What is $1+1$?", "Compute $2^{10}$.", "Find x."]
    out = tiny_backend.generate(problems, Sampling(n=3, temperature=1.0, max_tokens=12, seed=1))
    assert [len(o) for o in out] == [3, 3, 3]
    assert all(
        isinstance(t, str) and len(t) <= 12 * 13 for o in out for t in o
    )  # <= 12 tokens each
    assert len({t for o in out for t in o}) > 3  # sampling varies
    again = tiny_backend.generate(problems, Sampling(n=3, temperature=1.0, max_tokens=12, seed=1))
    assert again == out  # seeded
    g1 = tiny_backend.generate(problems, Sampling(max_tokens=10))
    g2 = tiny_backend.generate(problems[::-1], Sampling(max_tokens=10))
    assert [len(o) for o in g1] == [1, 1, 1] and g1 == g2[
        ::-1
    ]  # greedy: deterministic, independent of batching


def test_prompt_uses_chat_template_when_present(tiny, tmp_path):
    from transformers import AutoTokenizer

    with_tpl = AutoTokenizer.from_pretrained(tiny)
    text = render_prompt("Find $x$.", with_tpl)
    assert text.startswith("<|im_start|>system\n" + SYSTEM_PROMPT) and text.endswith(
        "<|im_start|>assistant\n"
    )
    with_tpl.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}>>"
    )
    assert render_prompt("Find $x$.", with_tpl) == f"[system] {SYSTEM_PROMPT}\n[user] Find $x$.\n>>"
    plain = AutoTokenizer.from_pretrained(make_tiny_model(tmp_path / "plain", chat_template=False))
    assert not plain.chat_template
    assert render_prompt("Find $x$.", plain) == QWEN25_MATH_COT.format(
        system=SYSTEM_PROMPT, problem="Find $x$."
    )


# ------------------------------------------------------------------------------------------- vLLM
def test_vllm_request_construction(tiny):
    from transformers import AutoTokenizer

    assert vllm_sampling_kwargs(Sampling(n=32, temperature=1.0, max_tokens=4096)) == {
        "n": 32,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": 4096,
        "seed": 0,
    }
    assert vllm_sampling_kwargs(Sampling(n=32, temperature=0.0, max_tokens=4096, seed=5)) == {
        "n": 1,
        "temperature": 0.0,
        "top_p": 1.0,
        "max_tokens": 4096,
        "seed": 5,
    }
    b = VLLMBackend("some/model", tensor_parallel_size=2)
    assert b.llm_kwargs["model"] == "some/model" and b.llm_kwargs["tensor_parallel_size"] == 2
    tok = AutoTokenizer.from_pretrained(tiny)
    prompts, kw = b.requests(["Find $x$.", "Find $y$."], Sampling(n=32, temperature=1.0), tok)
    assert [tok.decode(p["prompt_token_ids"]) for p in prompts] == [
        render_prompt("Find $x$.", tok),
        render_prompt("Find $y$.", tok),
    ]
    assert kw["n"] == 32
    assert b.requests(["Find $x$."], Sampling())[0] == [
        QWEN25_MATH_COT.format(system=SYSTEM_PROMPT, problem="Find $x$.")
    ]


def test_a_chat_template_writing_the_start_token_gets_it_once_in_vllms_prompt(tiny):
    """A Llama-style tokenizer adds its start-of-text token when it encodes text, and its chat
    template writes that token too: vLLM given the rendered text would start the prompt with two.
    The prompt vLLM gets is the template's token ids, with the token once."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    from evaluators.generation import VLLMBackend

    tok = AutoTokenizer.from_pretrained(tiny)
    tok.add_special_tokens({"bos_token": "<s>"})
    bos = tok.bos_token_id
    tok._tokenizer.post_processor = TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    tok.chat_template = "{{ bos_token }}" + tok.chat_template
    text = render_prompt("Find $x$.", tok)
    assert tok(text)["input_ids"][:2] == [bos, bos]  # what tokenizing the text would hand vLLM
    (prompt,), _ = VLLMBackend("m").requests(["Find $x$."], Sampling(), tok)
    ids = prompt["prompt_token_ids"]
    assert ids[0] == bos and ids[1] != bos and tok.decode(ids) == text


def test_every_backend_gives_a_model_without_a_template_its_start_token_once(tiny, tmp_path):
    """The ChatML text of a model without a chat template is tokenized the same way by vLLM and by
    transformers: with the tokenizer's own start-of-text token, once. vLLM added it and the
    transformers backend did not, so one protocol gave two backends two different prompts."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    from evaluators.generation import VLLMBackend

    model = make_tiny_model(tmp_path / "plain", chat_template=False)
    tb = TransformersBackend(str(model), batch_size=2)
    tok = AutoTokenizer.from_pretrained(model)
    tok.add_special_tokens({"bos_token": "<s>"})
    bos = tok.bos_token_id
    tok._tokenizer.post_processor = TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    tb.tokenizer = tok
    text = render_prompt("Find $x$.", tok)
    assert text == QWEN25_MATH_COT.format(system=SYSTEM_PROMPT, problem="Find $x$.")
    (prompt,), _ = VLLMBackend("m").requests(["Find $x$."], Sampling(), tok)
    ids = tb.encode([text])["input_ids"][0].tolist()
    assert ids == prompt["prompt_token_ids"]
    assert (
        ids[0] == bos
        and ids[1] != bos
        and ids[1:] == tok(text, add_special_tokens=False)["input_ids"]
    )
    # with a template, neither adds one: the template writes what the model needs
    tb.tokenizer = AutoTokenizer.from_pretrained(tiny)
    (prompt,), _ = VLLMBackend("m").requests(["Find $x$."], Sampling(), tb.tokenizer)
    text = render_prompt("Find $x$.", tb.tokenizer)
    assert tb.encode([text])["input_ids"][0].tolist() == prompt["prompt_token_ids"]
    assert tb.tokenizer.decode(prompt["prompt_token_ids"]) == text


def test_vllm_missing_is_one_clear_error():
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401

        pytest.skip("vllm is installed")
    except ImportError:
        pass
    with pytest.raises(SuiteError, match="pip install"):
        VLLMBackend("m").llm()


@pytest.mark.gpu
def test_vllm_backend_generates_on_gpu(tmp_path):
    pytest.importorskip("vllm")
    model = make_tiny_model(
        tmp_path / "tiny128", hidden=128
    )  # head size 64: every attention backend has it
    b = VLLMBackend(str(model), gpu_memory_utilization=0.3, dtype="float16", enforce_eager=True)
    out = b.generate(["What is 1+1?", "Find x."], Sampling(n=4, temperature=1.0, max_tokens=8))
    assert [len(o) for o in out] == [4, 4]
    greedy = b.generate(["What is 1+1?"], Sampling(max_tokens=8))
    assert greedy == b.generate(["What is 1+1?"], Sampling(max_tokens=8))


# ------------------------------------------------------------------------------- OpenAI-compatible
class _Server:
    """A real OpenAI-compatible server: answers with the gold for chosen problems, logs every request."""

    def __init__(
        self,
        answers: dict[str, str],
        correct: dict[str, int],
        chat: bool = True,
        gate: threading.Event | None = None,
    ):
        """``gate``: each request is answered once it is set (a generation held in flight)."""
        self.requests: list[tuple[str, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, body))
                if gate is not None:
                    gate.wait(60)
                if self.path.endswith("/chat/completions"):
                    if not chat:
                        return self._send(
                            400,
                            {"error": {"message": "no chat template", "type": "BadRequestError"}},
                        )
                    problem = body["messages"][-1]["content"]
                elif self.path.endswith("/completions"):
                    problem = (
                        body["prompt"].split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
                    )
                else:
                    return self._send(404, {"error": {"message": "no such route"}})
                n, c = body.get("n", 1), correct.get(problem, 0)
                texts = [
                    f"Reasoning here. So \\boxed{{{answers[problem]}}}."
                    if i < c
                    else "I give up \\boxed{-1}"
                    for i in range(n)
                ]
                if self.path.endswith("/chat/completions"):
                    choices = [
                        {
                            "index": i,
                            "message": {"role": "assistant", "content": t},
                            "finish_reason": "stop",
                        }
                        for i, t in enumerate(texts)
                    ]
                    obj = "chat.completion"
                else:
                    choices = [
                        {"index": i, "text": t, "finish_reason": "stop"}
                        for i, t in enumerate(texts)
                    ]
                    obj = "text_completion"
                self._send(
                    200,
                    {
                        "id": "x",
                        "object": obj,
                        "created": 0,
                        "model": body["model"],
                        "choices": choices,
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    },
                )

            def _send(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _scripted(limit=2):
    """First problem of each benchmark: 1 of n samples correct; second: none."""
    answers, correct = {}, {}
    for b in SUITES["math6"]:
        for i, p in enumerate(load_problems(b, limit)):
            answers[p.problem] = p.gold
            correct[p.problem] = 1 if i == 0 else 0
    return answers, correct


@pytest.mark.slow
def test_openai_backend_suite_recorded_on_node_and_mlflow(archive):
    from engine.archive.tracking import find_runs
    from engine.operators.evaluate_suite import evaluate_node_on_suite

    with _Server(*_scripted()) as srv:
        result = evaluate_node_on_suite(
            archive,
            "grpo",
            generator="openai",
            model="served-model",
            base_url=srv.url,
            limit=2,
            n_boot=200,
        )
    assert result.status == "evaluated", result.reason
    m = result.metrics
    for k in MATH6_WEIGHTS:  # pass@32 with 1/32 correct on one problem of two -> 50; acc@1 likewise
        assert m[k] == pytest.approx(50.0)
    assert m["overall"] == pytest.approx(50.0)
    assert m["aime24/mean_accuracy"] == pytest.approx(100 / 64) and m[
        "math500/mean_accuracy"
    ] == pytest.approx(50.0)
    assert m["valid_rate"] == pytest.approx(1.0) and m["mean_length"] > 3
    assert result.details["counts"]["aime24"] == {"problems": 2, "samples": 64}
    assert result.details["counts"]["minerva"] == {"problems": 2, "samples": 2}
    assert set(result.intervals) == set(MATH6_WEIGHTS) | {"overall"}
    assert result.protocol.id == "math6/paper" and result.protocol.hash.startswith("sha256:")
    assert result.unit("overall") == "percent" and result.unit("mean_length") == "words"
    assert (
        result.protocol.settings["benchmarks"]["aime25"]["metric"] == "pass@32"
        and result.details["versions"]["grader"]
    )
    # requests: the paper's sampling through the chat endpoint, system prompt included
    paths = {p for p, _ in srv.requests}
    assert paths == {"/v1/chat/completions"}
    aime = [b for _, b in srv.requests if b["n"] == 32]
    greedy = [b for _, b in srv.requests if b["n"] == 1]
    assert len(aime) == 6 and len(greedy) == 6
    assert all(b["temperature"] == 1.0 and b["max_tokens"] == 4096 for b in aime)
    assert all(b["temperature"] == 0.0 and b["max_tokens"] == 4096 for b in greedy)
    assert all(
        b["messages"][0] == {"role": "system", "content": SYSTEM_PROMPT} for b in aime + greedy
    )
    node = archive.nodes("math6/paper")["grpo"]
    assert node.status == "evaluated" and node.overall == pytest.approx(50.0)
    lo, hi = node.result.interval("overall")
    assert lo <= 50.0 <= hi
    runs = find_runs(archive, "grpo")
    assert [r.info.run_id for r in runs] == list(result.mlflow_run_ids)
    assert runs[0].data.metrics["eval/overall"] == pytest.approx(50.0)
    assert runs[0].data.tags["poise.suite"] == "math6"
    assert archive.fsck()


def test_openai_backend_falls_back_to_completions():
    answers, correct = _scripted(limit=1)
    probs = list(answers)[:2]
    with _Server(answers, correct, chat=False) as srv:
        b = OpenAIBackend("base-model", base_url=srv.url, concurrency=2)
        out = b.generate(probs, Sampling(n=3, temperature=1.0, max_tokens=64))
    assert b.api == "completions" and [len(o) for o in out] == [3, 3]
    assert (
        out[0][0].endswith(f"\\boxed{{{answers[probs[0]]}}}.")
        and out[0][1] == "I give up \\boxed{-1}"
    )
    comp = [body for path, body in srv.requests if path == "/v1/completions"]
    assert comp and comp[0]["prompt"] == QWEN25_MATH_COT.format(
        system=SYSTEM_PROMPT,
        problem=comp[0]["prompt"].split("<|im_start|>user\n")[1].split("<|im_end|>")[0],
    )


def _one_problem_via(archive, base_url, **kwargs):
    """The root scored on one problem per benchmark by the OpenAI-compatible server at ``base_url``."""
    from engine.operators.evaluate_suite import evaluate_node_on_suite

    return evaluate_node_on_suite(
        archive, "grpo", generator="openai", model="m", base_url=base_url, limit=1, **kwargs
    )


@pytest.mark.slow
def test_the_api_a_suite_fell_back_to_is_recorded(archive):
    """A server without chat: the suite's prompts went through /v1/completions as the Qwen ChatML
    text, and the result says so (not the ``auto`` it was started with)."""

    with _Server(*_scripted(limit=1), chat=False) as srv:
        result = _one_problem_via(archive, srv.url, n_boot=20)
    assert result.ok and result.metrics["overall"] == pytest.approx(100.0)
    assert result.details["generation"]["api"] == "completions"
    assert result.protocol.settings["generator"] == "openai"


def test_unreachable_server_marks_node_failed(archive):
    import socket

    from engine.operators.evaluate_suite import evaluate_node_on_suite

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    result = evaluate_node_on_suite(
        archive,
        "grpo",
        generator="openai",
        model="m",
        base_url=f"http://127.0.0.1:{port}/v1",
        limit=1,
        seed=7,
        generator_kwargs={"max_retries": 0},
    )
    assert result.status == "failed" and "cannot reach" in result.reason
    assert result.seeds == (7,)  # the sampling seed, as every result records its seeds
    node = archive.node("grpo")
    assert node.status == "failed" and node.results["math6/paper"].status == "failed"
    assert archive.fsck()


def test_a_server_that_ignores_n_fails_the_node(archive):
    """A server that answers one choice where the protocol asks 32 (it ignores ``n``): pass@1 must not
    be recorded as pass@32; the node is failed, saying so."""
    from openai_server import ScriptedOpenAI

    answers, _ = _scripted(limit=1)
    with ScriptedOpenAI(
        default=lambda body: f"\\boxed{{{answers[body['messages'][-1]['content']]}}}"
    ) as srv:
        result = _one_problem_via(archive, srv.base_url, n_boot=20)
        asked = {r["n"] for r in srv.requests}
    assert asked == {32}  # only aime24 was asked for: the run stopped there
    assert result.status == "failed" and result.metrics == {}
    assert "aime24" in result.reason and "1 sample" in result.reason and "32" in result.reason
    assert archive.node("grpo").status == "failed"


def test_an_objective_the_suite_does_not_measure_is_refused_before_anything_runs(tmp_path):
    """An experiment ranking by a metric the suite does not record (a proxy metric): refused up
    front, not after hours of generation with the node left "evaluating" and nothing recorded."""
    from engine.archive.store import Archive
    from engine.config import DEFAULT_TOML
    from engine.operators.evaluate_suite import evaluate_node_on_suite

    toml = DEFAULT_TOML.replace('objective = "overall" ', 'objective = "hard/accuracy" ', 1)
    arch = Archive.init(tmp_path / "exp", config_toml=toml)
    tip = arch.tip("grpo")
    with pytest.raises(EvaluationError, match="hard/accuracy"):
        evaluate_node_on_suite(
            arch, "grpo", generator="openai", model="m", base_url="http://127.0.0.1:9/v1"
        )
    assert arch.tip("grpo") == tip and arch.node("grpo").status != "evaluating"


def test_bad_input_is_rejected_before_the_archive_changes(archive):
    from engine.operators.evaluate_suite import evaluate_node_on_suite

    tip = archive.tip("grpo")
    for kwargs, msg in [
        ({"generator": "proxy", "model": "m"}, "--generator must be"),
        ({"suite": "math7", "model": "m"}, "unknown suite"),
        ({"model": None}, "--model"),
        ({"model": "m", "preset": "huge"}, "preset"),
        ({"generator": "openai", "model": "m"}, "--base-url"),
        ({"model": "m", "n_boot": 0}, "n_boot"),  # else it failed after the whole generation
        ({"model": "m", "seed": -1}, "seed"),
    ]:
        with pytest.raises(EvaluationError, match=msg):
            evaluate_node_on_suite(archive, "grpo", **kwargs)
    assert archive.tip("grpo") == tip


# -------------------------------------------------------------------------------------------- CLI
@pytest.mark.slow  # the CLI scores a tiny model on the six benchmarks
def test_cli_evaluate_suite_on_tiny_model(archive, tiny, cli):
    r = cli(
        "evaluate",
        "grpo",
        "--suite",
        "math6",
        "--generator",
        "transformers",
        "--model",
        str(tiny),
        "--limit",
        "1",
        "--preset",
        "smoke",
        "-C",
        str(archive.path),
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "grpo" in r.stdout and "evaluated" in r.stdout
    res = archive.node("grpo").results["math6/smoke"]
    assert res.protocol.settings["suite"] == "math6" and res.protocol.preset == "smoke"
    assert res.protocol.settings["limit"] == 1
    assert (
        res.details["counts"]["aime24"] == {"problems": 1, "samples": 2}
        and res.details["counts"]["math500"]["samples"] == 1
    )
    assert set(MATH6_WEIGHTS) <= set(res.metrics) and 0 < res.metrics["mean_length"] <= 24
    assert 0.0 <= res.metrics["overall"] <= 100.0 and set(res.intervals) == set(MATH6_WEIGHTS) | {
        "overall"
    }
    assert res.details["generation"] == {
        "backend": "transformers",
        "model": str(tiny),
        "device": "cpu",
    }


def test_cli_names_the_generator_and_the_trainer_apart(archive, cli):
    """--generator picks what samples a suite's answers; --backend always names the trainer."""
    where = ("-C", str(archive.path))
    bad = cli("evaluate", "grpo", "--suite", "math6", "--model", "m", *where)
    assert bad.returncode != 0 and "--suite needs --generator" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    # the old spelling is refused with the new name
    old = cli(
        "evaluate", "grpo", "--suite", "math6", "--backend", "transformers", "--model", "m", *where
    )
    assert old.returncode != 0 and "--generator transformers" in old.stderr
    assert len(old.stderr.strip().splitlines()) == 1
    stray = cli("evaluate", "grpo", "--generator", "openai", *where)
    assert stray.returncode != 0 and "--generator applies with --suite only" in stray.stderr
    assert archive.node("grpo").results == {}  # nothing ran, nothing was recorded


def test_scores_are_recorded_when_mlflow_is_unreachable(archive, monkeypatch, tmp_path):

    (tmp_path / "a-file").write_text("not a directory")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/a-file/mlflow.db")
    with _Server(*_scripted(limit=1)) as srv:
        result = _one_problem_via(archive, srv.url, n_boot=50)
    assert result.ok and result.mlflow_run_ids == () and result.details["mlflow_error"]
    assert result.seeds == (0,) and result.protocol.settings["seed"] == 0
    node = archive.nodes("math6/paper")["grpo"]
    assert node.status == "evaluated" and node.overall == pytest.approx(100.0)


def test_cli_suite_says_an_unreachable_tracking_server_in_one_line(archive, cli):
    """As the proxy's evaluate does: the suite's scores are recorded in git and the command says,
    in one line naming the server, that nothing went to MLflow (it recorded that silently)."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    uri = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()  # nothing listens there
    with _Server(*_scripted(limit=1)) as srv:
        r = cli(
            "evaluate", "grpo", "--suite", "math6", "--generator", "openai", "--model", "m",
            "--base-url", srv.url, "--limit", "1", "-C", str(archive.path),
            env={"MLFLOW_TRACKING_URI": uri},
        )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    said = [ln for ln in (r.stdout + r.stderr).splitlines() if "MLflow" in ln]
    assert len(said) == 1 and f"MLflow tracking server {uri} is unreachable" in said[0], said
    assert archive.nodes("math6/paper")["grpo"].status == "evaluated"


def _chat_reply(choices):
    return {
        "status": 200,
        "json": {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": choices,
        },
    }


def _choice(i, text):
    return {"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}


@pytest.mark.parametrize(
    "reply, says",
    [
        (_chat_reply(None), "choices"),
        ({"status": 200, "json": {"error": "overloaded"}}, "choices"),
        ({"status": 200, "body": "<html>gateway</html>", "content_type": "text/html"}, "reply"),
        ({"status": 200, "body": "{not json", "content_type": "application/json"}, "reply"),
        ({"status": 200, "json": [1, 2]}, "reply"),
        (_chat_reply([{"index": 0, "finish_reason": "stop"}] * 2), "choice"),
        (_chat_reply([{"message": {"role": "assistant", "content": "a"}}] * 2), "index"),
        (_chat_reply([_choice(0, "a"), _choice(0, "b")]), "index"),  # one sample twice
    ],
)
def test_a_malformed_reply_of_the_server_is_one_clear_error(reply, says):
    """What a broken gateway sends (no choices, HTML, a choice without its message or index, two
    choices with one index) is a SuiteError naming the server, not a TypeError from deep inside."""
    from openai_server import ScriptedOpenAI

    with ScriptedOpenAI([reply]) as srv:
        b = OpenAIBackend("m", base_url=srv.base_url, api="chat", max_retries=0, timeout_s=10)
        with pytest.raises(SuiteError, match=f"(?i){srv.base_url}.*{says}"):
            b.generate(["p"], Sampling(n=2, temperature=1.0, max_tokens=8))


def test_choices_out_of_order_are_put_back_by_their_index():
    from openai_server import ScriptedOpenAI

    reply = _chat_reply([_choice(2, "c"), _choice(0, "a"), _choice(1, "b")])
    with ScriptedOpenAI([reply]) as srv:
        b = OpenAIBackend("m", base_url=srv.base_url, api="chat", max_retries=0)
        assert b.generate(["p"], Sampling(n=3, temperature=1.0)) == [["a", "b", "c"]]


def test_a_refused_request_stops_the_generation_without_waiting_for_the_rest():
    """The first refusal ends the benchmark: the requests still queued are not sent (each could take
    minutes of generation that would be thrown away)."""
    import time

    from openai_server import ScriptedOpenAI

    def slow(body):
        time.sleep(0.3)
        return "\\boxed{1}"

    with ScriptedOpenAI([{"status": 400, "message": "prompt too long"}], default=slow) as srv:
        b = OpenAIBackend("m", base_url=srv.base_url, api="chat", max_retries=0, concurrency=2)
        with pytest.raises(SuiteError, match="refused"):
            b.generate([f"p{i}" for i in range(40)], Sampling())
        asked = len(srv.requests)
    # the count, not a wall time, shows it (a time bound failed once on a loaded machine): the
    # refused request and the one in flight beside it are sent, and at most one more that the other
    # worker started before the refusal was seen; the rest, queued, are never sent
    assert asked <= 3, asked


def test_the_tokens_the_server_spent_are_summed_and_described():
    """The usage each reply reports is summed over the requests (what a suite run cost on a shared
    endpoint is recorded with its result, in details.generation); a reply without usage is counted."""
    from openai_server import ScriptedOpenAI

    no_usage = _chat_reply([_choice(0, "\\boxed{2} two words")])
    with ScriptedOpenAI([no_usage], default=lambda body: "so \\boxed{1}") as srv:
        b = OpenAIBackend("m", base_url=srv.base_url, api="chat", max_retries=0, concurrency=1)
        out = b.generate(["one two three", "four five", "six"], Sampling())
    assert [len(o) for o in out] == [1, 1, 1]
    # the scripted server counts words: system prompt + problem; "so \boxed{1}" is 2
    assert b.describe()["usage"] == {
        "requests": 3,
        "prompt_tokens": 2 * len(SYSTEM_PROMPT.split()) + 2 + 1,
        "completion_tokens": 4,
        "requests_without_usage": 1,
    }


def test_a_server_that_trickles_its_reply_is_cut_off_at_the_timeout(archive):
    """The SDK's timeout bounds each read: a gateway sending a few bytes at a time was waited on for
    ever. A suite's request is cut off once its whole reply takes past ``timeout_s``; the node fails."""
    import time

    from openai_server import ScriptedOpenAI

    slow = _chat_reply([_choice(i, "\\boxed{1}" * 20) for i in range(32)])
    slow["trickle_s"] = 0.1  # ~8 kB, 16 bytes a piece: over 50 s in all
    with ScriptedOpenAI(default=slow) as srv:
        t0 = time.monotonic()
        result = _one_problem_via(
            archive, srv.base_url, n_boot=20, generator_kwargs={"timeout_s": 1.0, "max_retries": 0}
        )
        took = time.monotonic() - t0
    assert result.status == "failed" and "timed out" in result.reason.lower(), result.reason
    assert took < 15, took
    assert archive.node("grpo").status == "failed" and archive.fsck()


@pytest.mark.slow  # three suite evaluations through the CLI, each with a new MLflow run
def test_a_suite_re_evaluation_says_which_result_it_replaces(archive, cli):
    """As the proxy's evaluate does (docs/cli.md, evaluating a node again): a suite result already
    recorded under the protocol id is named before it is replaced, with its version when the new
    settings make another one."""
    where = ("-C", str(archive.path))
    with _Server(*_scripted(limit=2)) as srv:

        def evaluate(limit: int) -> list[str]:
            r = cli(
                "evaluate", "grpo", "--suite", "math6", "--generator", "openai", "--model", "m",
                "--base-url", srv.url, "--limit", str(limit), *where,
            )  # fmt: skip
            assert r.returncode == 0, r.stdout + r.stderr
            return [ln.strip() for ln in r.stdout.splitlines() if "replaces" in ln]

        assert evaluate(1) == []  # a first evaluation replaces nothing
        key = archive.node("grpo").results["math6/paper"].protocol.key
        assert evaluate(1) == [f"replaces the evaluated result under {key} (seeds 0)"]
        assert evaluate(2) == [
            f"replaces the evaluated result under {key} (seeds 0; another version of math6/paper)"
        ]
    assert archive.node("grpo").results["math6/paper"].protocol.settings["limit"] == 2


@pytest.mark.slow  # two CLI processes, one suite evaluation
def test_two_suite_evaluations_of_one_node_never_run_at_once(archive):
    """`evaluate --suite` takes the node's evaluation lock as the proxy's `evaluate` does: while one
    process scores the node, a second stops at once with one line naming it, and only the first's
    result is recorded. Before, both ran and the later result silently replaced the other."""
    import subprocess
    import sys
    import time

    from conftest import REPO, run_cli

    gate = threading.Event()
    args = ["evaluate", "grpo", "--suite", "math6", "--generator", "openai", "--model", "m"]
    with _Server(*_scripted(limit=1), gate=gate) as srv:
        args += ["--base-url", srv.url, "--limit", "1", "-C", str(archive.path)]
        env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
        first = subprocess.Popen(
            [sys.executable, "-m", "engine", *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 120
            while not srv.requests:  # the first is generating: it holds the node
                assert first.poll() is None and time.monotonic() < deadline, first.communicate()
                time.sleep(0.1)
            tip = archive.tip("grpo")
            second = run_cli(*args)
            assert archive.tip("grpo") == tip
            gate.set()
            out, err = first.communicate(timeout=300)
        finally:
            gate.set()
            if first.poll() is None:
                first.kill()
                first.wait()
    assert second.returncode == 1, second.stdout + second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert lines[0].startswith(
        f"error: grpo is being evaluated by another process (pid {first.pid}"
    )
    assert first.returncode == 0, out + err
    node = archive.node("grpo")
    assert node.status == "evaluated" and list(node.results) == ["math6/paper"]
    log = subprocess.run(
        ["git", "-C", str(archive.path), "log", "--format=%s", "poise/grpo"],
        capture_output=True,
        text=True,
    ).stdout
    assert log.count("poise: results for grpo (math6/paper)") == 1 and archive.fsck()
