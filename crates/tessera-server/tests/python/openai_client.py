"""The real `openai` client against `tessera serve` (started by tests/openai_client.rs, which
passes its address in TESSERA_BASE_URL): chat, streaming, stop sequences, usage, errors."""

import os
import sys

import openai

base = os.environ["TESSERA_BASE_URL"]
client = openai.OpenAI(base_url=base, api_key="test-key", max_retries=0, timeout=120)

models = client.models.list()
model = models.data[0].id
assert model == "SmolLM2-135M-Instruct.Q4_1", model

msgs = [{"role": "user", "content": "What is the capital of France?"}]

# chat, whole
r = client.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=8)
whole = r.choices[0].message.content
assert r.object == "chat.completion"
assert r.choices[0].message.role == "assistant"
assert whole, r
assert r.usage.completion_tokens == 8 and r.choices[0].finish_reason == "length", r
assert r.usage.prompt_tokens > 10 and r.usage.total_tokens == r.usage.prompt_tokens + 8, r.usage

# chat, streamed: the same text, usage in the last chunk
chunks = list(client.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=8,
                                             stream=True, stream_options={"include_usage": True}))
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
assert text == whole, (text, whole)
assert chunks[0].choices[0].delta.role == "assistant"
finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
assert finish == ["length"], finish
assert chunks[-1].usage.completion_tokens == 8, chunks[-1]

# stop sequences: the text ends before the first stop sequence
words = whole.split()
assert len(words) >= 2, whole
stop = " " + words[1]
r = client.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=8, stop=[stop])
assert r.choices[0].finish_reason == "stop", r
assert r.choices[0].message.content == whole[: whole.index(stop)], (r.choices[0].message.content, whole, stop)
assert r.usage.completion_tokens < 8, r.usage

# text completions, whole and streamed, with a stop sequence
r = client.completions.create(model=model, prompt="Once upon a time", temperature=0, max_tokens=6)
assert r.choices[0].text == ", the city of New Haven", r
assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (4, 6), r.usage
s = "".join(c.choices[0].text for c in client.completions.create(
    model=model, prompt="Once upon a time", temperature=0, max_tokens=6, stream=True, stop="New"))
assert s == ", the city of ", s

# errors come back as the client's exception types
try:
    client.chat.completions.create(model="no-such-model", messages=msgs, max_tokens=2)
    raise AssertionError("unknown model accepted")
except openai.NotFoundError as e:
    assert e.body["code"] == "model_not_found", e.body
try:
    client.chat.completions.create(model=model, messages=msgs, max_tokens=2, temperature=5)
    raise AssertionError("temperature 5 accepted")
except openai.BadRequestError as e:
    assert e.body["param"] == "temperature", e.body
try:
    client.chat.completions.create(model=model, messages=msgs, max_tokens=2, n=2)
    raise AssertionError("n=2 accepted")
except openai.BadRequestError as e:
    assert e.body["param"] == "n", e.body

bad = openai.OpenAI(base_url=base, api_key="wrong", max_retries=0)
try:
    bad.models.list()
    raise AssertionError("wrong key accepted")
except openai.AuthenticationError:
    pass

print("openai", openai.__version__, ": 11 checks passed")
sys.exit(0)
