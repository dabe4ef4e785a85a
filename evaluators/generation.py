"""Generation backends behind one interface: ``backend.generate(problems, sampling) -> [[text] * n]``.

- ``vllm``: offline ``LLM.generate`` (the GPU scale path; ``pip install 'poise-git[vllm]'``);
- ``openai``: an OpenAI-compatible server (``vllm serve``, a shared inference cluster);
- ``transformers``: ``model.generate`` (the CPU path).
Prompts are the Qwen2.5-Math chain-of-thought prompt, rendered through the model's chat template when
it has one, else as the Qwen ChatML text of that prompt; vLLM and transformers tokenize it by one rule
(:func:`encode_prompts`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass

from evaluators.errors import SuiteError

SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
# The Qwen2.5-Math "qwen25-math-cot" prompt, for models and endpoints without a chat template.
QWEN25_MATH_COT = (
    "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{problem}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
BACKENDS = ("vllm", "openai", "transformers")
Progress = Callable[[int], None]


@dataclass(frozen=True)
class Sampling:
    """``n`` samples per prompt; temperature 0 means greedy; ``max_tokens`` new tokens at most."""

    n: int = 1
    temperature: float = 0.0
    max_tokens: int = 4096
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def messages(problem: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": problem}]


def has_chat_template(tokenizer) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def encode_prompts(texts: Sequence[str], tokenizer, **kwargs):
    """The rendered prompts' token ids, one rule for every backend that tokenizes: a chat template
    writes the special tokens the model needs, so nothing is added to its text; the ChatML text of a
    model without one gets the tokenizer's own (a Llama-style start-of-text token), as any plain
    prompt does, and as an OpenAI-compatible server's completions endpoint gives it."""
    return tokenizer(list(texts), add_special_tokens=not has_chat_template(tokenizer), **kwargs)


def render_prompt(problem: str, tokenizer=None) -> str:
    """The prompt text: the tokenizer's chat template when it has one, else :data:`QWEN25_MATH_COT`."""
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(
            messages(problem), tokenize=False, add_generation_prompt=True
        )
    return QWEN25_MATH_COT.format(system=SYSTEM_PROMPT, problem=problem)


class Backend:
    name = "base"

    def generate(
        self, problems: Sequence[str], sampling: Sampling, progress: Progress | None = None
    ) -> list[list[str]]:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"backend": self.name}

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------- vLLM
def vllm_sampling_kwargs(sampling: Sampling) -> dict:
    """Keyword arguments of ``vllm.SamplingParams``: n=32, T=1.0 for pass@k; n=1, T=0 for greedy."""
    if sampling.greedy:
        return {
            "n": 1,
            "temperature": 0.0,
            "top_p": 1.0,
            "max_tokens": sampling.max_tokens,
            "seed": sampling.seed,
        }
    return {
        "n": sampling.n,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_tokens,
        "seed": sampling.seed,
    }


class VLLMBackend(Backend):
    """Offline vLLM: ``LLM(model).generate(prompts, SamplingParams(...))``; vllm is imported lazily."""

    name = "vllm"

    def __init__(
        self,
        model: str,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        dtype: str = "auto",
        seed: int = 0,
        **llm_kwargs,
    ):
        self.model = model
        self.llm_kwargs = dict(
            model=model,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            **llm_kwargs,
        )
        self._llm = None

    def llm(self):
        if self._llm is None:
            try:
                from vllm import LLM  # lazy: optional dependency (vllm extra)
            except ImportError as exc:
                raise SuiteError(
                    "the vllm backend needs vllm on a GPU machine: pip install 'poise-git[vllm]'"
                ) from exc
            self._llm = LLM(**self.llm_kwargs)
        return self._llm

    def requests(
        self, problems: Sequence[str], sampling: Sampling, tokenizer=None
    ) -> tuple[list, dict]:
        """(prompts, SamplingParams kwargs) for one call of ``LLM.generate``.

        Each prompt is handed over as its token ids (``{"prompt_token_ids": [...]}``), tokenized by
        :func:`encode_prompts`, the rule the transformers backend follows too: vLLM tokenizing a
        chat template's text would add its start-of-text token a second time (Llama-style models).
        Without a tokenizer the prompts go as text."""
        texts = [render_prompt(p, tokenizer) for p in problems]
        if tokenizer is None:
            return texts, vllm_sampling_kwargs(sampling)
        ids = encode_prompts(texts, tokenizer)["input_ids"]
        return [{"prompt_token_ids": list(i)} for i in ids], vllm_sampling_kwargs(sampling)

    def generate(self, problems, sampling, progress=None):
        from vllm import SamplingParams  # lazy: optional dependency (vllm extra)

        llm = self.llm()
        prompts, kwargs = self.requests(problems, sampling, llm.get_tokenizer())
        outs = llm.generate(prompts, SamplingParams(**kwargs), use_tqdm=False)
        if progress:
            progress(len(prompts))
        return [[o.text for o in out.outputs] for out in outs]

    def describe(self):
        return {
            "backend": self.name,
            "model": self.model,
            "tensor_parallel_size": self.llm_kwargs["tensor_parallel_size"],
        }


# ------------------------------------------------------------------------------- OpenAI-compatible
OPENAI_TIMEOUT_S = 600.0  # the OpenAI backend's default request timeout


class OpenAIBackend(Backend):
    """An OpenAI-compatible server. ``api``: ``chat`` (the server applies the model's chat template),
    ``completions`` (the Qwen ChatML prompt text), or ``auto`` (chat, falling back to completions when
    the server refuses chat, e.g. a base model without a chat template). Key: ``$OPENAI_API_KEY``.
    ``http_client``: the SDK's HTTP client (the engine passes one that bounds a whole reply)."""

    name = "openai"

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api: str = "auto",
        concurrency: int = 8,
        timeout_s: float = OPENAI_TIMEOUT_S,
        max_retries: int = 2,
        http_client=None,
    ):
        if api not in ("auto", "chat", "completions"):
            raise SuiteError(f"unknown OpenAI api {api!r}: chat | completions | auto")
        base_url = base_url or os.environ.get("OPENAI_BASE_URL")
        if not base_url:
            raise SuiteError(
                "the openai backend needs --base-url (or $OPENAI_BASE_URL), e.g. http://127.0.0.1:8000/v1"
            )
        from openai import OpenAI  # lazy: openai is heavy (only this path needs it)

        self.model, self.base_url, self.api, self.concurrency = (
            model,
            base_url,
            api,
            max(1, concurrency),
        )
        self.client = OpenAI(
            base_url=base_url,
            api_key=os.environ.get("OPENAI_API_KEY") or "EMPTY",
            timeout=timeout_s,
            max_retries=max_retries,
            http_client=http_client,
        )
        self._lock = threading.Lock()
        # tokens the server says it spent, summed over the requests answered
        self.usage = {
            "requests": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "requests_without_usage": 0,
        }

    def _params(self, sampling: Sampling) -> dict:
        if sampling.greedy:
            return {
                "n": 1,
                "temperature": 0.0,
                "max_tokens": sampling.max_tokens,
                "seed": sampling.seed,
            }
        return {
            "n": sampling.n,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "seed": sampling.seed,
        }

    def _one(self, problem: str, sampling: Sampling) -> list[str]:
        import openai  # lazy: openai is heavy (only this path needs it)

        params = self._params(sampling)
        if self.api in ("auto", "chat"):
            try:
                r = self.client.chat.completions.create(
                    model=self.model, messages=messages(problem), **params
                )
                return self._texts(r, chat=True)
            except (openai.BadRequestError, openai.NotFoundError):
                if self.api == "chat":
                    raise
                self.api = "completions"
        r = self.client.completions.create(
            model=self.model, prompt=render_prompt(problem), **params
        )
        return self._texts(r, chat=False)

    def _texts(self, reply, chat: bool) -> list[str]:
        """The reply's sample texts in the order of their ``index`` (0..n-1, each once); its token
        usage is added to :attr:`usage`. A reply of another shape is a SuiteError."""
        choices = getattr(reply, "choices", None)
        if not isinstance(choices, list):
            raise SuiteError(
                f"the server at {self.base_url} sent a reply without choices: {str(reply)[:200]!r}"
            )
        texts: list[str] = []
        for c in choices:
            if chat:
                message = getattr(c, "message", None)
                if message is None:
                    raise SuiteError(
                        f"the server at {self.base_url} sent a choice without its message"
                    )
                texts.append(getattr(message, "content", None) or "")
            else:
                texts.append(getattr(c, "text", None) or "")
        indices = [getattr(c, "index", None) for c in choices]
        if not all(isinstance(i, int) for i in indices) or sorted(indices) != list(
            range(len(choices))
        ):
            raise SuiteError(
                f"the server at {self.base_url} sent choices with index {indices}, not "
                f"0..{len(choices) - 1} once each"
            )
        usage = getattr(reply, "usage", None)
        with self._lock:
            self.usage["requests"] += 1
            for key in ("prompt_tokens", "completion_tokens"):
                value = getattr(usage, key, None)
                if isinstance(value, int):
                    self.usage[key] += value
            if not isinstance(getattr(usage, "prompt_tokens", None), int):
                self.usage["requests_without_usage"] += 1  # the sums are lower bounds
        return [text for _, text in sorted(zip(indices, texts, strict=True))]

    def generate(self, problems, sampling, progress=None):
        import openai  # lazy: openai is heavy (only this path needs it)

        stop = threading.Event()  # set by the first failure: no request starts after it

        def job(p):
            if stop.is_set():
                return None  # never sent: the generation has already failed
            try:
                out = self._one(p, sampling)
            except BaseException:
                stop.set()
                raise
            if progress:
                progress(1)
            return out

        def one(p):
            try:
                return job(p)
            except openai.APIConnectionError as exc:
                raise SuiteError(
                    f"cannot reach the OpenAI-compatible server at {self.base_url}: {exc}"
                ) from None
            except openai.APIError as exc:
                raise SuiteError(
                    f"the server at {self.base_url} refused a request: {exc}"
                ) from None
            except ValueError as exc:  # a body that is not JSON
                raise SuiteError(
                    f"the server at {self.base_url} sent a reply that is not JSON: {exc}"
                ) from None

        # the first failure, in whichever order the requests end, stops the rest: the queued ones
        # are cancelled and any a worker picks up after it is not sent
        with ThreadPoolExecutor(self.concurrency) as ex:
            futures = [ex.submit(one, p) for p in problems]
            wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((f for f in futures if f.done() and f.exception()), None)
            if failed is not None:
                for f in futures:
                    f.cancel()
                raise failed.exception()
            return [f.result() for f in futures]

    def describe(self):
        return {
            "backend": self.name,
            "model": self.model,
            "base_url": self.base_url,
            "api": self.api,
            "usage": dict(self.usage),
        }


# ------------------------------------------------------------------------------------ transformers
class TransformersBackend(Backend):
    """``AutoModelForCausalLM.generate`` in batches (left padding); the CPU path."""

    name = "transformers"

    def __init__(
        self, model: str, device: str | None = None, batch_size: int = 8, dtype: str | None = None
    ):
        self.model_path, self.batch_size = model, max(1, batch_size)
        try:
            import torch  # lazy: optional dependency (its ImportError is handled here)

            # lazy: optional dependency (its ImportError is handled here)
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:  # pragma: no cover
            raise SuiteError(
                "the transformers backend needs torch and transformers installed"
            ) from exc
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model)
            kw = {"dtype": getattr(torch, dtype)} if dtype else {}
            self.model = AutoModelForCausalLM.from_pretrained(model, **kw)
        except (OSError, ValueError) as exc:
            raise SuiteError(f"cannot load model {model!r}: {str(exc).splitlines()[0]}") from None
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model.to(self.device).eval()
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token or self.tokenizer.unk_token

    def encode(self, texts: Sequence[str]):
        """The rendered prompts as the model's left-padded input tensors (:func:`encode_prompts`)."""
        return encode_prompts(texts, self.tokenizer, return_tensors="pt", padding=True).to(
            self.device
        )

    def generate(self, problems, sampling, progress=None):
        import torch  # lazy: torch is heavy (only this path needs it)

        torch.manual_seed(sampling.seed)
        out: list[list[str]] = []
        n = 1 if sampling.greedy else sampling.n
        for start in range(0, len(problems), self.batch_size):
            batch = [
                render_prompt(p, self.tokenizer) for p in problems[start : start + self.batch_size]
            ]
            enc = self.encode(batch)
            kw = dict(
                max_new_tokens=sampling.max_tokens,
                num_return_sequences=n,
                pad_token_id=self.tokenizer.pad_token_id,
            )
            if self.tokenizer.eos_token_id is not None:
                kw["eos_token_id"] = self.tokenizer.eos_token_id
            if sampling.greedy:
                kw.update(do_sample=False)
            else:
                kw.update(
                    do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0
                )
            with torch.no_grad():
                seqs = self.model.generate(**enc, **kw)
            texts = self.tokenizer.batch_decode(
                seqs[:, enc["input_ids"].shape[1] :], skip_special_tokens=True
            )
            for i in range(len(batch)):
                out.append(texts[i * n : (i + 1) * n])
            if progress:
                progress(len(batch))
        return out

    def describe(self):
        return {"backend": self.name, "model": self.model_path, "device": self.device}


def make_backend(name: str, model: str, base_url: str | None = None, **kwargs) -> Backend:
    """The backend ``name`` (vllm | openai | transformers) for ``model``."""
    if name == "vllm":
        return VLLMBackend(model, **kwargs)
    if name == "openai":
        return OpenAIBackend(model, base_url=base_url, **kwargs)
    if name == "transformers":
        return TransformersBackend(model, **kwargs)
    raise SuiteError(
        f"unknown generation backend {name!r}; with --suite use --generator {' | '.join(BACKENDS)}"
    )
