"""The OpenAI API of byoc_hetero.serve (issue 40 item 4), driven by the ``openai`` client package against a
served tiny random Llama: completions and chat, streamed and not, with a tokenizer and with token ids only,
continuous batching (a request's tokens the same alone and among others), bad input, metrics, the docs' calls.

The references are independent of the server: ``Generator.generate`` run directly in this process (greedy) and
the tokenizer's own encode / decode / chat template. Skipped where Ray Serve or openai is not installed.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import byoc_hetero as bh  # noqa: E402
from conftest import HANG_GUARD_S, docs_blocks, start_serving, until  # noqa: E402
from byoc_hetero import serve as bs  # noqa: E402
from byoc_hetero.llm import Sampler  # noqa: E402
from byoc_hetero.serve.scheduler import Event, Scheduler, Sequence  # noqa: E402

MAX_LENGTH = 40
SLOTS = 4
WORDS = ["<unk>", "<s>", "</s>", ":", "user", "assistant", "system", "hello", "world", "the", "cat", "sat", "on",
         "mat", "a", "dog", "ran", "far", "away", "and", "then", "slept", "under", "tree"]


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                                eos_token="</s>")
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
                          "{% if add_generation_prompt %}assistant :{% endif %}")
    return fast


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    """A tiny random Llama (vocab = the tokenizer's words and a few more), saved twice: "tiny" with the
    tokenizer next to it, "tiny_ids" without one."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.4)
    gen = bh.llm.from_hf(transformers.LlamaForCausalLM(config).eval(), max_length=MAX_LENGTH)
    tmp = tmp_path_factory.mktemp("llm")
    gen.save(tmp / "tiny")
    _tokenizer().save_pretrained(str(tmp / "tiny"))
    gen.save(tmp / "tiny_ids")
    return gen, tmp


@pytest.fixture(scope="module")
def served(generator):
    from test_serve import _free_port

    _, tmp = generator
    port = _free_port()
    application = bs.app([str(tmp / "tiny"), str(tmp / "tiny_ids")], replicas=1, cpus=1, llm_slots=SLOTS)
    start_serving(application, port, num_cpus=2)
    yield f"http://127.0.0.1:{port}"
    bs.shutdown()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served + "/v1", api_key="none", timeout=HANG_GUARD_S, max_retries=0)


def _greedy(gen, ids: list[int], max_tokens: int, stop: int | None = 2) -> list[int]:
    """The direct reference: ``Generator.generate`` in this process, greedy, up to the stop token."""
    out = gen.generate([np.array(ids)], max_new_tokens=max_tokens, stop=stop)[0]
    return out[len(ids):].tolist()


# -- the scheduler and the generator's slot views, without Ray -----------------------------------------------

def test_slot_cache_prefills_one_sequence_and_leaves_the_others(generator):
    gen, _ = generator
    cache = gen.new_cache(3)
    prompt = np.array([[7, 8, 9, 10]])
    alone = gen.new_cache(1)
    want = gen.step(prompt, np.zeros(1, "int64"), np.array([4]), alone)
    got = gen.step(prompt, np.zeros(1, "int64"), np.array([4]), gen.slot_cache(cache, 1))
    np.testing.assert_array_equal(got, want)
    for c, a in zip(cache, alone):
        np.testing.assert_array_equal(c.numpy()[1], a.numpy()[0])
        assert not c.numpy()[[0, 2]].any()  # the other sequences' rows untouched
    with pytest.raises(bh.InputError, match="slot 3 is not a sequence of this cache of 3"):
        gen.slot_cache(cache, 3)


def _submit(scheduler, prompt, max_tokens, sampler):
    events, done = [], threading.Event()

    def deliver(event: Event) -> None:
        events.append(event)
        done.set() if event.finish else None

    scheduler.submit(Sequence(np.array(prompt), max_tokens, sampler, frozenset(), deliver))
    return events, done


def test_scheduler_tokens_do_not_depend_on_the_batch(generator):
    """Greedy and seeded sampling: each request alone, then all at once (more requests than slots, so some
    wait for a slot and join mid-run); the same tokens, greedy equal to Generator.generate."""
    gen, _ = generator
    prompts = [[7, 8, 9], [10], [11, 12, 13, 14, 15, 16, 17], [18, 19], [20, 21, 22, 23], [9, 9]]
    samplers = [Sampler() if i % 2 else Sampler(True, 0.9, 0, 0.95, 100 + i) for i in range(len(prompts))]
    lengths = [12, 5, 9, 14, 3, 10]
    scheduler = Scheduler(gen, slots=SLOTS)
    try:
        alone = []
        for p, s, n in zip(prompts, samplers, lengths):
            events, done = _submit(scheduler, p, n, s)
            assert done.wait(HANG_GUARD_S)
            alone.append([e.token for e in events])
        runs = [_submit(scheduler, p, n, s) for p, s, n in zip(prompts, samplers, lengths)]
        for _, done in runs:
            assert done.wait(HANG_GUARD_S)
    finally:
        scheduler.close()
    for (events, _), want, n in zip(runs, alone, lengths):
        assert [e.token for e in events] == want and len(want) == n and events[-1].finish == "length"
    assert max(e.batch for events, _ in runs for e in events) == SLOTS
    for i in (1, 3, 5):
        assert alone[i] == _greedy(gen, prompts[i], lengths[i], stop=None)


# -- the OpenAI API -------------------------------------------------------------------------------------------

def test_models_are_listed(client):
    assert sorted(m.id for m in client.models.list().data) == ["tiny", "tiny_ids"]
    assert client.models.retrieve("tiny").id == "tiny"


def test_completion_with_a_tokenizer(generator, client):
    gen, tmp = generator
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp / "tiny"))
    ids = tok("the cat sat on the mat")["input_ids"]
    want = _greedy(gen, ids, 10)
    answer = client.completions.create(model="tiny", prompt="the cat sat on the mat", max_tokens=10, temperature=0)
    choice = answer.choices[0]
    assert choice.token_ids == want
    assert choice.text == tok.decode(want, skip_special_tokens=True)
    assert choice.finish_reason == ("stop" if want[-1] == 2 else "length")
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (len(ids), len(want))

    streamed = list(client.completions.create(model="tiny", prompt="the cat sat on the mat", max_tokens=10,
                                              temperature=0, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == choice.text
    assert [t for c in streamed if c.choices for t in c.choices[0].token_ids] == want
    assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == choice.finish_reason
    assert streamed[-1].usage.completion_tokens == len(want)


def test_chat_uses_the_chat_template(generator, client):
    gen, tmp = generator
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp / "tiny"))
    messages = [{"role": "system", "content": "a dog"}, {"role": "user", "content": "hello world"}]
    ids = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])
    want = _greedy(gen, ids, 8)
    answer = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == tok.decode(want, skip_special_tokens=True)
    assert answer.usage.prompt_tokens == len(ids)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == answer.choices[0].message.content


def test_stop_strings_and_stop_token_ids(generator, client):
    gen, tmp = generator
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp / "tiny"))
    prompt = tok("hello world the cat")["input_ids"]
    free = _greedy(gen, prompt, 12)
    words = [t for t in free[1:] if 3 <= t < len(WORDS)]
    assert words, free  # the continuation has a word after its first token
    stop = WORDS[words[0]]
    cut = next(k for k in range(len(free)) if stop in tok.decode(free[:k + 1], skip_special_tokens=True))
    text = tok.decode(free[:cut + 1], skip_special_tokens=True)
    answer = client.completions.create(model="tiny", prompt="hello world the cat", max_tokens=12, temperature=0,
                                       stop=[stop])
    assert answer.choices[0].text == text[:text.find(stop)]
    assert answer.choices[0].finish_reason == "stop" and answer.usage.completion_tokens == cut + 1
    streamed = list(client.completions.create(model="tiny", prompt="hello world the cat", max_tokens=12,
                                              temperature=0, stop=[stop], stream=True))
    assert "".join(c.choices[0].text for c in streamed) == answer.choices[0].text
    by_id = client.completions.create(model="tiny_ids", prompt=prompt, max_tokens=12, temperature=0,
                                      extra_body={"stop_token_ids": [words[0]]})
    want = _greedy(gen, prompt, 12, stop=words[0])
    assert by_id.choices[0].token_ids == want and by_id.choices[0].finish_reason == "stop"


def test_token_ids_without_a_tokenizer(generator, client):
    gen, _ = generator
    prompt = [30, 7, 8, 31]
    want = _greedy(gen, prompt, 9, stop=None)
    answer = client.completions.create(model="tiny_ids", prompt=prompt, max_tokens=9, temperature=0)
    assert answer.choices[0].text == "" and answer.choices[0].token_ids == want
    assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 9
    streamed = list(client.completions.create(model="tiny_ids", prompt=prompt, max_tokens=9, temperature=0,
                                              stream=True))
    assert [t for c in streamed for t in c.choices[0].token_ids] == want
    with pytest.raises(openai.BadRequestError, match="chat needs a tokenizer and this model has none"):
        client.chat.completions.create(model="tiny_ids", messages=[{"role": "user", "content": "hello"}])
    with pytest.raises(openai.BadRequestError, match="this model has no tokenizer"):
        client.completions.create(model="tiny_ids", prompt="hello world")


def test_concurrent_requests_get_the_tokens_they_get_alone(client):
    """Greedy and seeded sampling, prompts and lengths that differ, more requests than slots: each request's
    tokens are those it gets alone, and the decode steps did hold several requests at once."""
    prompts = [[7, 8, 9], [10], [11, 12, 13, 14, 15, 16, 17], [18, 19], [20, 21, 22, 23], [9, 9], [25, 3]]

    def ask(i: int):
        seeded = {"temperature": 0.8, "top_p": 0.9, "seed": 7 * i} if i % 2 else {"temperature": 0}
        answer = client.completions.create(model="tiny_ids", prompt=prompts[i], max_tokens=6 + 3 * i, **seeded)
        return answer.choices[0].token_ids, answer.model_extra["batch_sequences_max"]

    alone = [ask(i) for i in range(len(prompts))]
    assert all(b == 1 for _, b in alone)
    for _volley in range(3):  # the batch's make-up depends on arrival times: a few volleys, bounded
        with ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(ask, range(len(prompts))))
        assert [t for t, _ in together] == [t for t, _ in alone]
        if max(b for _, b in together) > 1:
            return
    pytest.fail("7 concurrent requests never shared a decode step")


@pytest.mark.parametrize("body, status, needle", [
    ({"model": "nope", "prompt": [1, 2]}, 404, "no generator model 'nope' here"),
    (b"{not json", 400, "the body is not JSON"),
    ({"prompt": [1, 2]}, 400, "model must be a string"),
    ({"model": "tiny_ids"}, 400, "prompt must be a non-empty string or array of token ids"),
    ({"model": "tiny_ids", "prompt": [1] * (MAX_LENGTH + 1)}, 400, "longer than the cache's max_length 40"),
    ({"model": "tiny_ids", "prompt": [1, 2], "max_tokens": MAX_LENGTH}, 400, "longer than the cache's max_length"),
    ({"model": "tiny_ids", "prompt": [1, 99]}, 400, "token id 99, outside the vocabulary [0, 32)"),
    ({"model": "tiny_ids", "prompt": [1, 2], "n": 2}, 400, "n=2: one choice per request"),
    ({"model": "tiny_ids", "prompt": [1, 2], "temperature": 0.5, "top_p": 0}, 400, "top_p must be in (0, 1]"),
    ({"model": "tiny_ids", "prompt": [1, 2], "max_tokens": 0}, 400, "max_tokens must be an integer >= 1"),
    ({"model": "tiny_ids", "prompt": [1, 2], "logprobs": 3}, 400, "logprobs=3 is not supported"),
    ({"model": "tiny", "messages": "hello"}, 400, "messages must be a non-empty list"),
])
def test_bad_requests_are_answered_and_the_replica_goes_on(served, client, body, status, needle):
    import httpx

    path = "/v1/chat/completions" if isinstance(body, dict) and "messages" in body else "/v1/completions"
    reply = httpx.post(served + path, content=body if isinstance(body, bytes) else json.dumps(body),
                       timeout=HANG_GUARD_S)
    assert reply.status_code == status, reply.text
    assert needle in reply.json()["error"]["message"], reply.text
    ok = client.completions.create(model="tiny_ids", prompt=[1, 2], max_tokens=2, temperature=0)
    assert len(ok.choices[0].token_ids) == 2


def test_unknown_model_is_404_for_the_client(client):
    with pytest.raises(openai.NotFoundError, match="no generator model 'gpt-4'"):
        client.completions.create(model="gpt-4", prompt="hello")


def test_llm_metrics(served, client):
    """One request of 3 prompt and 5 new tokens moves the LLM metrics by what it did: a request that ended
    on its length, 3 prompt tokens, 5 generated, one time to first token, 4 times between tokens, 4 decode
    steps at least. The names are in docs/serving.md."""
    from test_serve import _scrape, _total

    names = {"requests": "byoc_hetero_llm_requests_total", "prompt": "byoc_hetero_llm_prompt_tokens_total",
             "generated": "byoc_hetero_llm_generated_tokens_total",
             "first": "byoc_hetero_llm_time_to_first_token_seconds_count",
             "gaps": "byoc_hetero_llm_time_per_output_token_seconds_count",
             "steps": "byoc_hetero_llm_decode_sequences_count"}

    def counts() -> dict[str, float]:
        samples = _scrape(served + "/")
        return {k: _total(samples, n, model="tiny_ids") for k, n in names.items()}

    before = counts()
    client.completions.create(model="tiny_ids", prompt=[1, 2, 3], max_tokens=5, temperature=0)
    want = {"requests": 1, "prompt": 3, "generated": 5, "first": 1, "gaps": 4, "steps": 4}
    delta: dict[str, float] = {}

    def recorded() -> bool:  # the event waited for: every record of the request reached the exporter
        after = counts()
        delta.update({k: after[k] - before[k] for k in names})
        return all(delta[k] >= n for k, n in want.items())

    until(recorded, "the metrics of one completion", 0.5, lambda: dict(delta))
    assert {k: delta[k] for k in ("requests", "prompt", "generated", "first", "gaps")} == \
        {"requests": 1, "prompt": 3, "generated": 5, "first": 1, "gaps": 4}
    assert delta["steps"] >= 4
    assert _total(_scrape(served + "/"), "byoc_hetero_requests_total", protocol="openai", code="404") >= 1
    doc = (Path(__file__).resolve().parent.parent / "docs" / "serving.md").read_text()
    from byoc_hetero.serve.metrics import LLM_METRICS

    for name in LLM_METRICS:
        assert f"`{name}" in doc, f"docs/serving.md does not name {name}"


def test_the_docs_llm_calls_run(generator, served, tmp_path):
    """docs/serving.md's openai and curl calls, against this deployment (its model is "tiny" here)."""
    import subprocess

    gen, tmp = generator
    py, sh = docs_blocks("serving.md", "LLMs")
    host = served.split("//")[1]
    namespace: dict = {}
    exec(compile(py.replace("127.0.0.1:8000", host).replace('"smollm"', '"tiny"'), "serving_md_llm.py", "exec"),
         namespace)  # noqa: S102
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp / "tiny"))
    assert namespace["text"] == tok.decode(_greedy(gen, tok(namespace["prompt"])["input_ids"], 16),
                                           skip_special_tokens=True)
    out = subprocess.run(["bash", "-c", sh.replace("127.0.0.1:8000", host).replace('"smollm"', '"tiny"')],
                         capture_output=True, text=True, timeout=HANG_GUARD_S, check=True).stdout
    events = [line[len("data: "):] for line in out.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    tokens = [t for e in events[:-1] for t in json.loads(e)["choices"][0]["token_ids"]]
    assert tokens == _greedy(gen, [1, 7, 8], 5)


def test_a_generator_folder_is_a_model_spec(generator, tmp_path):
    _, tmp = generator
    spec = bs.model_spec(str(tmp / "tiny"))
    assert (spec.name, spec.version, spec.engine) == ("tiny", "1", "llm")
    assert bs.model_spec(f"chat:3={tmp / 'tiny'}").engine == "llm"
    with pytest.raises(bh.ModelFileError, match="a folder without generator.json"):
        bs.model_spec(str(tmp_path))


def test_chat_without_a_template_uses_the_plain_one():
    """A tokenizer without a chat template: each message as "role: content" and a newline, then "assistant:"
    (docs/serving.md), here with token ids a word-level tokenizer gives for that text."""
    from types import SimpleNamespace

    from byoc_hetero.serve import openai as endpoint

    tok = _tokenizer()
    tok.chat_template = None
    messages = [{"role": "system", "content": "a dog"},
                {"role": "user", "content": [{"type": "text", "text": "hello"}]}]  # content parts: their text
    ids = endpoint._messages({"messages": messages}, SimpleNamespace(tokenizer=tok))
    words = ["system", ":", "a", "dog", "user", ":", "hello", "assistant", ":"]
    assert ids == [WORDS.index(w) for w in words]
