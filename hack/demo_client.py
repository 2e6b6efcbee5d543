"""`make demo`'s client: one completion and one streamed chat with the official `openai` client, then the
speculation figures from the pod's /metrics. Usage: demo_client.py BASE_URL (e.g. http://127.0.0.1:PORT)."""

from __future__ import annotations

import sys
import urllib.request

from openai import OpenAI

PROMPT = "Speculative decoding"
QUESTION = "What does the draft model do?"
_FIGURES = (
    "specdeploy_draft_tokens_total",
    "specdeploy_accepted_draft_tokens_total",
    "specdeploy_speculative_steps_total",
    "specdeploy_generation_tokens_total",
    "specdeploy_server_config_info",
)


def main(base: str) -> int:
    client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=48, temperature=0)
    print(f"   completion ({model}): {PROMPT!r} -> {completion.choices[0].text!r}")
    print(f"   usage: {completion.usage}")
    print(f"   streamed chat: {QUESTION!r} -> ", end="", flush=True)
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=48,
        temperature=0,
        stream=True,
    )
    chunks = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            chunks += 1
            print(chunk.choices[0].delta.content, end="", flush=True)
    print(f"  [{chunks} chunks]")
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    values: dict[str, float] = {}
    for line in metrics.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in _FIGURES and not line.startswith("#"):
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            if name == "specdeploy_server_config_info":
                print(f"   {line}")
    drafted = values.get("specdeploy_draft_tokens_total", 0.0)
    accepted = values.get("specdeploy_accepted_draft_tokens_total", 0.0)
    steps = values.get("specdeploy_speculative_steps_total", 0.0)
    if drafted and steps:
        print(
            f"   /metrics: {accepted:.0f} of {drafted:.0f} draft tokens accepted ({accepted / drafted:.0%}), "
            f"{(accepted + steps) / steps:.2f} tokens per target step"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
