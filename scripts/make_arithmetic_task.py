#!/usr/bin/env python3
"""Makes a small arithmetic RLHF task: data, a tokenizer and a random model.

This is the learning example of docs/data-and-rewards.md: a workload shaped
like a real one (chat conversations, GSM8K-style "#### answer" rewards, a
byte-level BPE tokenizer with a ChatML template, a Qwen2 checkpoint) but small
enough for a CPU learning run. A real tokenizer such as Qwen3's, with 151k
tokens, is too slow for that: its embedding and LM head alone would be
hundreds of times the size of the rest of the model. So this script trains
its own ~512-token vocabulary on the generated problems and pairs it with a
~0.85M-parameter model.

    make_arithmetic_task.py --out DIR [--seed 1] [--train 4000] [--test 200]
                            [--vocab 512] [--system TEXT]
                            [--hidden 128] [--intermediate 384] [--layers 4]
                            [--heads 4] [--kv-heads 2] [--max-positions 256]
                            [--init-std 0.02]

writes

    DIR/train.jsonl, DIR/test.jsonl
        {"messages": [{"role": "system", ...}, {"role": "user", ...},
                      {"role": "assistant", "content": "12 + 7 = 19.\n#### 19"}]}
        per line: templated word problems with +, -, ×, "twice" and "half",
        every number at most two digits, every answer a non-negative
        integer. The test problems are drawn first; no train problem is
        solved by the same equations as a test problem.
    DIR/model/tokenizer.json, DIR/model/tokenizer_config.json
        a GPT-2/Qwen2-style byte-level BPE (NFC, Qwen2's split regex, merges
        learned on the rendered training conversations) with the special
        tokens <|endoftext|> (pad), <|im_start|> and <|im_end|> (eos), and a
        ChatML chat template. --vocab counts the special tokens; the problem
        grammar has merges for about 790 tokens, and a larger --vocab stops
        there (with a note).
    DIR/model/config.json, DIR/model/model.safetensors
        a Qwen2ForCausalLM with tied embeddings and float32 weights drawn
        from normal(0, --init-std) (norms one, q/k/v biases zero).

and prints the vocabulary and parameter counts and the longest conversation,
prompt and response in tokens (the model's context must hold them).

The output is the same bytes for the same flags. Only the standard library
is used (run it with /usr/bin/python3).
"""

import argparse
import json
import os
import random
import re
import struct
import sys
import unicodedata
from array import array
from collections import Counter

# ---- the problems -------------------------------------------------------------

NAMES = ["Ava", "Ben", "Cara", "Dan", "Eli", "Fay", "Gus", "Hana", "Ivan", "Jo", "Kim", "Leo",
         "Mia", "Ned", "Omar", "Pia", "Raj", "Sam", "Tia", "Uma", "Vic", "Wes", "Xia", "Yara",
         "Zoe", "Amir", "Bea", "Cole", "Dina", "Emil", "Finn", "Gia", "Hugo", "Iris", "Jack",
         "Kai", "Lena", "Max", "Nora", "Otto", "Paul", "Rosa", "Seth", "Tom", "Vera", "Will",
         "Yuki", "Zane"]
OBJECTS = ["apples", "pears", "plums", "lemons", "oranges", "grapes", "books", "coins", "pens",
           "pencils", "cards", "eggs", "shells", "stickers", "marbles", "cookies", "stamps",
           "buttons", "beads", "candles", "cups", "plates", "rocks", "leaves", "feathers",
           "balloons", "flowers", "toys", "blocks", "bottles", "socks", "hats", "tickets",
           "ribbons", "crayons", "muffins", "cupcakes", "seeds", "nuts", "keys"]
CONTAINERS = [("box", "boxes"), ("bag", "bags"), ("pack", "packs"), ("jar", "jars"),
              ("basket", "baskets"), ("crate", "crates"), ("tray", "trays"), ("bowl", "bowls")]
COLORS = ["red", "blue", "green", "yellow", "white", "black", "pink", "brown", "purple"]
GAIN_VERBS = [("buys", "bought"), ("finds", "found"), ("gets", "got"), ("wins", "won"),
              ("picks", "picked"), ("collects", "collected"), ("makes", "made"),
              ("receives", "received")]
LOSS_VERBS = ["lost", "sold", "used", "dropped", "traded", "donated"]
MAX_NUMBER = 99  # every number of a problem and its solution has at most two digits
MIN_COUNT = 2  # a count before a plural noun ("1 apples" is not English)

DEFAULT_SYSTEM = "Solve the problem. End with #### and the answer."


def _pick(rng, items):
    return items[rng.randrange(len(items))]


def _sum_operands(rng):
    a = rng.randint(MIN_COUNT, MAX_NUMBER - MIN_COUNT)
    return a, rng.randint(MIN_COUNT, MAX_NUMBER - a)


def _add(rng, a_name, b_name, obj):
    a, b = _sum_operands(rng)
    gain, gained = _pick(rng, GAIN_VERBS)
    first, second = rng.sample(COLORS, 2)
    text = _pick(rng, [
        f"{a_name} has {a} {obj}. {a_name} {gain} {b} more. "
        f"How many {obj} does {a_name} have now?",
        f"{a_name} had {a} {obj} and then {gained} {b} more. "
        f"How many {obj} does {a_name} have in total?",
        f"{a_name} has {a} {obj} and {b_name} has {b} {obj}. "
        f"How many {obj} do they have together?",
        f"{a_name} counts {a} {first} {obj} and {b} {second} {obj}. "
        f"How many {obj} does {a_name} count?",
    ])
    return text, [f"{a} + {b} = {a + b}."], a + b


def _subtract(rng, a_name, b_name, obj):
    a = rng.randint(MIN_COUNT, MAX_NUMBER)
    b = rng.randint(1, a)
    text = _pick(rng, [
        f"{a_name} has {a} {obj} and gives {b} to {b_name}. "
        f"How many {obj} does {a_name} have left?",
        f"{a_name} had {a} {obj} and {_pick(rng, LOSS_VERBS)} {b} of them. "
        f"How many {obj} are left?",
        f"{a_name} has {a} {obj} and {b_name} has {b}. "
        f"How many more {obj} does {a_name} have than {b_name}?",
        f"{a_name} needs {a} {obj} and already has {b}. "
        f"How many more {obj} does {a_name} need?",
    ])
    return text, [f"{a} - {b} = {a - b}."], a - b


def _multiply(rng, a_name, b_name, obj):
    a = rng.randint(2, MAX_NUMBER // 2)
    b = rng.randint(2, MAX_NUMBER // a)
    one, many = _pick(rng, CONTAINERS)
    text = _pick(rng, [
        f"{a_name} buys {a} {many} of {obj}. Each {one} holds {b} {obj}. "
        f"How many {obj} does {a_name} buy?",
        f"There are {a} {many} with {b} {obj} in each. How many {obj} are there?",
    ])
    return text, [f"{a} × {b} = {a * b}."], a * b


def _twice(rng, a_name, b_name, obj):
    a = rng.randint(MIN_COUNT, MAX_NUMBER // 2)
    text = _pick(rng, [
        f"{a_name} has {a} {obj}. {b_name} has twice as many. "
        f"How many {obj} does {b_name} have?",
        f"{a_name} has {a} {obj}. {b_name} has double that number. "
        f"How many {obj} does {b_name} have?",
    ])
    return text, [f"2 × {a} = {2 * a}."], 2 * a


def _half(rng, a_name, b_name, obj):
    a = 2 * rng.randint(1, MAX_NUMBER // 2)
    text = _pick(rng, [
        f"{a_name} has {a} {obj} and gives half of them to {b_name}. "
        f"How many {obj} does {b_name} get?",
        f"{a_name} has {a} {obj}. {b_name} has half as many. "
        f"How many {obj} does {b_name} have?",
    ])
    return text, [f"{a} / 2 = {a // 2}."], a // 2


def _two_steps(rng, a_name, b_name, obj):
    gain, _ = _pick(rng, GAIN_VERBS)
    if rng.randrange(2) == 0:
        a, b = _sum_operands(rng)
        c = rng.randint(1, a + b)
        text = (f"{a_name} has {a} {obj}. {a_name} {gain} {b} more, then gives {c} "
                f"to {b_name}. How many {obj} does {a_name} have now?")
        return text, [f"{a} + {b} = {a + b}.", f"{a + b} - {c} = {a + b - c}."], a + b - c
    a = rng.randint(MIN_COUNT, MAX_NUMBER)
    b = rng.randint(1, a)
    c = rng.randint(1, MAX_NUMBER - (a - b))
    text = (f"{a_name} has {a} {obj}, gives {b} to {b_name}, then {gain} {c} more. "
            f"How many {obj} does {a_name} have now?")
    return text, [f"{a} - {b} = {a - b}.", f"{a - b} + {c} = {a - b + c}."], a - b + c


# Each kind: rng, two distinct names, an object -> (problem text, reasoning
# steps, answer).
PROBLEM_KINDS = [_add, _subtract, _multiply, _twice, _half, _two_steps]


def make_problem(rng):
    """One random problem: (problem text, reasoning, solution text). The
    reasoning (its equations) identifies the problem's arithmetic."""
    make = _pick(rng, PROBLEM_KINDS)
    a_name, b_name = rng.sample(NAMES, 2)
    text, steps, answer = make(rng, a_name, b_name, _pick(rng, OBJECTS))
    assert 0 <= answer <= MAX_NUMBER
    reasoning = " ".join(steps)
    return text, reasoning, f"{reasoning}\n#### {answer}"


def sample_problems(rng, count, seen_texts, banned, used):
    """`count` problems whose texts are not in seen_texts and whose
    reasoning is not in banned; adds what it takes to seen_texts and used."""
    out = []
    attempts = 0
    while len(out) < count:
        attempts += 1
        if attempts > 100 * count + 10000:
            sys.exit(f"error: could not draw {count} distinct problems "
                     f"(got {len(out)}); ask for fewer")
        text, reasoning, solution = make_problem(rng)
        if text in seen_texts or reasoning in banned:
            continue
        seen_texts.add(text)
        used.add(reasoning)
        out.append((text, solution))
    return out


def make_splits(seed, n_train, n_test, shared_equations=False):
    """Train and test problems, all different; unless shared_equations, no
    train problem has the equations of a test problem (test is drawn
    first): the test then asks for arithmetic the model never saw done."""
    rng = random.Random(f"{seed}:data")
    seen_texts = set()
    test_equations = set()
    test = sample_problems(rng, n_test, seen_texts, banned=set(), used=test_equations)
    banned = set() if shared_equations else test_equations
    train = sample_problems(rng, n_train, seen_texts, banned=banned, used=set())
    return train, test


def conversation(system, problem, solution):
    messages = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": problem})
    messages.append({"role": "assistant", "content": solution})
    return messages


# ---- chat template ------------------------------------------------------------

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]

# ChatML as Qwen2 writes it, without Qwen2's default system message.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def render_chat(messages, add_generation_prompt=False):
    """What CHAT_TEMPLATE renders."""
    text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    if add_generation_prompt:
        text += f"{IM_START}assistant\n"
    return text


# ---- byte-level BPE -----------------------------------------------------------

# Qwen2's split regex, as its tokenizer.json writes it; split_words below is
# the same pattern written out by hand (Python's re has no \p{L}).
SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")
# Unicode's White_Space property (what \s matches in the Rust regex crate).
WHITESPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
                       "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


def _is_letter(ch):
    return unicodedata.category(ch)[0] == "L"


def _is_number(ch):
    return unicodedata.category(ch)[0] == "N"


def _is_other(ch):
    """[^\\s\\p{L}\\p{N}]"""
    return ch not in WHITESPACE and not _is_letter(ch) and not _is_number(ch)


def _run_end(text, i, pred):
    while i < len(text) and pred(text[i]):
        i += 1
    return i


def _match_at(text, i):
    """The end of SPLIT_REGEX's match at text[i] (alternatives tried in order)."""
    n = len(text)
    ch = text[i]
    # (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if ch == "'":
        for c in CONTRACTIONS:
            if text[i + 1:i + 1 + len(c)].lower() == c:
                return i + 1 + len(c)
    # [^\r\n\p{L}\p{N}]?\p{L}+
    if ch not in "\r\n" and not _is_letter(ch) and not _is_number(ch) \
            and i + 1 < n and _is_letter(text[i + 1]):
        return _run_end(text, i + 1, _is_letter)
    if _is_letter(ch):
        return _run_end(text, i, _is_letter)
    # \p{N}
    if _is_number(ch):
        return i + 1
    # ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    start = i + 1 if ch == " " and i + 1 < n and _is_other(text[i + 1]) else i
    if _is_other(text[start]):
        end = _run_end(text, start, _is_other)
        return _run_end(text, end, lambda c: c in "\r\n")
    # Whitespace from here on: the three alternatives see the same run.
    run_end = _run_end(text, i, lambda c: c in WHITESPACE)
    # \s*[\r\n]+ ends after the run's last line break
    last_break = max(text.rfind("\r", i, run_end), text.rfind("\n", i, run_end))
    if last_break >= 0:
        return last_break + 1
    # \s+(?!\S): the whole run at the end of the text, else all but its last
    if run_end == n:
        return run_end
    if run_end - 1 > i:
        return run_end - 1
    # \s+
    return run_end


def split_words(text):
    """The pieces Qwen2's Split pre-tokenizer cuts text into."""
    words = []
    i = 0
    while i < len(text):
        end = _match_at(text, i)
        words.append(text[i:end])
        i = end
    return words


def bytes_to_unicode():
    """GPT-2's map from bytes to printable characters, in its vocabulary order."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    order = printable[:]
    chars = printable[:]
    for b in range(256):
        if b not in printable:
            order.append(b)
            chars.append(256 + len(chars) - len(printable))
    return {b: chr(c) for b, c in zip(order, chars)}


BYTE_CHARS = bytes_to_unicode()


def byte_level(word):
    return "".join(BYTE_CHARS[b] for b in word.encode("utf-8"))


_SPECIAL_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL_TOKENS) + ")")


def pre_tokenize(text):
    """Byte-level words of text, with the special tokens as they are."""
    out = []
    for piece in _SPECIAL_SPLIT.split(text):
        if piece in SPECIAL_TOKENS:
            out.append(piece)
        elif piece:
            out.extend(byte_level(w) for w in split_words(unicodedata.normalize("NFC", piece)))
    return out


def train_bpe(word_counts, vocab_size):
    """Learns merges until the vocabulary (256 bytes + merged tokens) has
    vocab_size tokens or no pair is left. Pairs are taken by count, ties by
    the pair's text. A pair whose merged text is already a token is skipped,
    so each merge makes a token of its own. Answers (vocab list, merges)."""
    vocab = list(BYTE_CHARS.values())
    known = set(vocab)
    words = [(list(w), c) for w, c in word_counts.items()]
    merges = []
    skipped = set()
    while len(vocab) < vocab_size:
        pairs = Counter()
        for symbols, count in words:
            for pair in zip(symbols, symbols[1:]):
                if pair not in skipped:
                    pairs[pair] += count
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        merged = best[0] + best[1]
        if merged in known:
            skipped.add(best)
            continue
        merges.append(best)
        vocab.append(merged)
        known.add(merged)
        for symbols, _ in words:
            _merge_in_place(symbols, best, merged)
    return vocab, merges


def _merge_in_place(symbols, pair, merged):
    i = 0
    while i < len(symbols) - 1:
        if symbols[i] == pair[0] and symbols[i + 1] == pair[1]:
            symbols[i:i + 2] = [merged]
        i += 1


class BpeTokenizer:
    """Encodes as Hugging Face tokenizers does with the tokenizer.json below."""

    def __init__(self, vocab, merges):
        self.ids = {tok: i for i, tok in enumerate(vocab)}
        for tok in SPECIAL_TOKENS:
            self.ids[tok] = len(self.ids)
        self.ranks = {pair: r for r, pair in enumerate(merges)}
        self.vocab = vocab
        self.merges = merges
        self._cache = {}

    def __len__(self):
        return len(self.ids)

    def _bpe(self, word):
        symbols = list(word)
        while len(symbols) > 1:
            ranked = [(self.ranks.get(p, len(self.ranks)), p) for p in zip(symbols, symbols[1:])]
            rank, pair = min(ranked)
            if rank == len(self.ranks):
                break
            _merge_in_place(symbols, pair, pair[0] + pair[1])
        return [self.ids[s] for s in symbols]

    def encode(self, text):
        out = []
        for word in pre_tokenize(text):
            if word in SPECIAL_TOKENS:
                out.append(self.ids[word])
                continue
            if word not in self._cache:
                self._cache[word] = self._bpe(word)
            out.extend(self._cache[word])
        return out

    def tokenizer_json(self):
        byte_level_step = {"type": "ByteLevel", "add_prefix_space": False,
                           "trim_offsets": False, "use_regex": False}
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [
                {"id": self.ids[t], "content": t, "single_word": False, "lstrip": False,
                 "rstrip": False, "normalized": False, "special": True}
                for t in SPECIAL_TOKENS
            ],
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": SPLIT_REGEX},
                 "behavior": "Isolated", "invert": False},
                byte_level_step,
            ]},
            "post_processor": byte_level_step,
            "decoder": byte_level_step,
            "model": {
                "type": "BPE", "dropout": None, "unk_token": None,
                "continuing_subword_prefix": "", "end_of_word_suffix": "",
                "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                "vocab": {tok: i for i, tok in enumerate(self.vocab)},
                "merges": [list(p) for p in self.merges],
            },
        }

    def tokenizer_config_json(self, max_length):
        return {
            "add_bos_token": False,
            "add_prefix_space": False,
            "added_tokens_decoder": {
                str(self.ids[t]): {"content": t, "lstrip": False, "normalized": False,
                                   "rstrip": False, "single_word": False, "special": True}
                for t in SPECIAL_TOKENS
            },
            "additional_special_tokens": [IM_START, IM_END],
            "bos_token": None,
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "eos_token": IM_END,
            "errors": "replace",
            "model_max_length": max_length,
            "pad_token": ENDOFTEXT,
            "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
        }


def build_tokenizer(conversations, vocab_size):
    """A BPE trained on the rendered conversations; vocab_size counts the
    special tokens."""
    counts = Counter()
    for messages in conversations:
        for word in pre_tokenize(render_chat(messages)):
            if word not in SPECIAL_TOKENS:
                counts[word] += 1
    vocab, merges = train_bpe(counts, vocab_size - len(SPECIAL_TOKENS))
    return BpeTokenizer(vocab, merges)


# ---- model --------------------------------------------------------------------

def model_config(args, tok):
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": len(tok),
        "hidden_size": args.hidden,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "max_position_embeddings": args.max_positions,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "initializer_range": args.init_std,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": args.layers,
        "attention_dropout": 0.0,
        "use_cache": True,
        "torch_dtype": "float32",
        "bos_token_id": tok.ids[ENDOFTEXT],
        "eos_token_id": tok.ids[IM_END],
        "pad_token_id": tok.ids[ENDOFTEXT],
    }


def parameter_shapes(config):
    """(HF name, shape, init) of every Qwen2ForCausalLM tensor, tied head."""
    d = config["hidden_size"]
    f = config["intermediate_size"]
    head_dim = d // config["num_attention_heads"]
    q = config["num_attention_heads"] * head_dim
    kv = config["num_key_value_heads"] * head_dim
    shapes = [("model.embed_tokens.weight", [config["vocab_size"], d], "normal")]
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes += [
            (p + "input_layernorm.weight", [d], "ones"),
            (p + "self_attn.q_proj.weight", [q, d], "normal"),
            (p + "self_attn.q_proj.bias", [q], "zeros"),
            (p + "self_attn.k_proj.weight", [kv, d], "normal"),
            (p + "self_attn.k_proj.bias", [kv], "zeros"),
            (p + "self_attn.v_proj.weight", [kv, d], "normal"),
            (p + "self_attn.v_proj.bias", [kv], "zeros"),
            (p + "self_attn.o_proj.weight", [d, q], "normal"),
            (p + "post_attention_layernorm.weight", [d], "ones"),
            (p + "mlp.gate_proj.weight", [f, d], "normal"),
            (p + "mlp.up_proj.weight", [f, d], "normal"),
            (p + "mlp.down_proj.weight", [d, f], "normal"),
        ]
    shapes.append(("model.norm.weight", [d], "ones"))
    return shapes


def init_tensor(rng, shape, init, std):
    n = 1
    for s in shape:
        n *= s
    if init == "normal":
        gauss = rng.gauss
        return array("f", [gauss(0.0, std) for _ in range(n)])
    return array("f", [1.0 if init == "ones" else 0.0]) * n


def write_safetensors(path, tensors):
    """tensors: (name, shape, float32 array) in file order."""
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, data in tensors:
        size = len(data) * 4
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, data in tensors:
            if sys.byteorder != "little":
                data = array("f", data)
                data.byteswap()
            f.write(data.tobytes())


def build_model(config, seed, std):
    """Random weights in the order of the file (tensor names sorted)."""
    rng = random.Random(f"{seed}:model")
    tensors = []
    for name, shape, init in sorted(parameter_shapes(config)):
        tensors.append((name, shape, init_tensor(rng, shape, init, std)))
    return tensors


# ---- output -------------------------------------------------------------------

def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=2)
        f.write("\n")


def write_jsonl(path, conversations):
    with open(path, "w", encoding="utf-8") as f:
        for messages in conversations:
            f.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")


def length_stats(tok, conversations):
    """Longest token counts: whole conversation, prompt (with the generation
    prompt), response (the assistant content and its <|im_end|>)."""
    whole = prompt = response = 0
    for messages in conversations:
        p = len(tok.encode(render_chat(messages[:-1], add_generation_prompt=True)))
        r = len(tok.encode(messages[-1]["content"])) + 1
        prompt, response = max(prompt, p), max(response, r)
        whole = max(whole, len(tok.encode(render_chat(messages))))
    return whole, prompt, response


# ---- command line -------------------------------------------------------------

def int_in(low, high):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must lie in [{low}, {high}], got {value}")
        return value
    return parse


def positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Write a small arithmetic RLHF task: train/test JSONL, a byte-level "
                    "BPE tokenizer and a random Qwen2 model directory.")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int_in(0, 2**63 - 1), default=1, help="seed (default 1)")
    p.add_argument("--train", type=int_in(1, 1_000_000), default=4000,
                   help="training conversations (default 4000)")
    p.add_argument("--test", type=int_in(1, 100_000), default=200,
                   help="test conversations, equations not in train (default 200)")
    p.add_argument("--vocab", type=int_in(260, 8192), default=512,
                   help="vocabulary size with the 3 special tokens (default 512; the "
                        "problems have merges for about 790)")
    p.add_argument("--system", default=DEFAULT_SYSTEM,
                   help="system message of every conversation ('' for none; "
                        f"default '{DEFAULT_SYSTEM}')")
    p.add_argument("--max-number", type=int_in(10, 99), default=99,
                   help="the largest number in a problem or its solution (default 99: at "
                        "most two digits; smaller is an easier task)")
    p.add_argument("--shared-equations", action="store_true",
                   help="let training problems use the equations of test problems, in other "
                        "words (the test then measures reliability, not arithmetic never seen)")
    p.add_argument("--hidden", type=int_in(2, 8192), default=128, help="hidden size (default 128)")
    p.add_argument("--intermediate", type=int_in(1, 32768), default=384,
                   help="MLP size (default 384)")
    p.add_argument("--layers", type=int_in(1, 128), default=4, help="layers (default 4)")
    p.add_argument("--heads", type=int_in(1, 256), default=4, help="attention heads (default 4)")
    p.add_argument("--kv-heads", type=int_in(1, 256), default=2,
                   help="key/value heads (default 2)")
    p.add_argument("--max-positions", type=int_in(16, 1 << 20), default=256,
                   help="max_position_embeddings (default 256)")
    p.add_argument("--init-std", type=positive_float, default=0.02,
                   help="standard deviation of the random weights (default 0.02)")
    args = p.parse_args(argv)
    if args.hidden % args.heads != 0:
        p.error(f"--hidden ({args.hidden}) must be divisible by --heads ({args.heads})")
    if (args.hidden // args.heads) % 2 != 0:
        p.error(f"the head size --hidden / --heads ({args.hidden // args.heads}) must be even "
                "(rotary embeddings)")
    if args.heads % args.kv_heads != 0:
        p.error(f"--heads ({args.heads}) must be divisible by --kv-heads ({args.kv_heads})")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        p.error(f"--out {args.out} exists and is not a directory")
    return args


def main(argv=None):
    global MAX_NUMBER
    args = parse_args(sys.argv[1:] if argv is None else argv)
    MAX_NUMBER = args.max_number
    train, test = make_splits(args.seed, args.train, args.test, args.shared_equations)
    train_convs = [conversation(args.system, q, a) for q, a in train]
    test_convs = [conversation(args.system, q, a) for q, a in test]

    tok = build_tokenizer(train_convs, args.vocab)
    if len(tok) < args.vocab:
        print(f"note: the corpus ran out of pairs; the vocabulary has {len(tok)} tokens, "
              f"not {args.vocab}", file=sys.stderr)
    whole, prompt, response = length_stats(tok, train_convs + test_convs)
    if whole > args.max_positions:
        sys.exit(f"error: the longest conversation has {whole} tokens, more than "
                 f"--max-positions {args.max_positions}")

    config = model_config(args, tok)
    tensors = build_model(config, args.seed, args.init_std)

    model_dir = os.path.join(args.out, "model")
    os.makedirs(model_dir, exist_ok=True)
    write_jsonl(os.path.join(args.out, "train.jsonl"), train_convs)
    write_jsonl(os.path.join(args.out, "test.jsonl"), test_convs)
    write_json(os.path.join(model_dir, "tokenizer.json"), tok.tokenizer_json())
    write_json(os.path.join(model_dir, "tokenizer_config.json"),
               tok.tokenizer_config_json(args.max_positions))
    write_json(os.path.join(model_dir, "config.json"), config)
    write_safetensors(os.path.join(model_dir, "model.safetensors"), tensors)

    params = sum(len(data) for _, _, data in tensors)
    print(f"wrote {args.out}: {len(train_convs)} train / {len(test_convs)} test conversations")
    print(f"tokenizer: {len(tok)} tokens ({len(tok.merges)} merges, "
          f"{len(SPECIAL_TOKENS)} special)")
    print(f"model: Qwen2, {params:,} parameters (float32, tied embeddings)")
    print(f"longest in tokens: conversation {whole}, prompt {prompt} "
          f"(with the generation prompt), response {response} (with <|im_end|>)")


if __name__ == "__main__":
    main()
