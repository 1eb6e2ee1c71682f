#!/usr/bin/python3
"""The reference renderer of chat templates for troupe's chat-template tests.

Usage: /usr/bin/python3 chat_template_reference.py REQUEST.json OUTPUT.json
REQUEST: {"cases": [{"template": source, "variables": {name: value, ...}}, ...]}
OUTPUT:  [{"text": rendered} or {"error": "ExceptionType: message"}, ...]
         (one entry per case, in order)

Renders with Python's jinja2 configured the way Hugging Face transformers
configures it for apply_chat_template (chat_template_utils.py,
_compile_jinja_template): an ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks and the loopcontrols extension; `tojson` replaced by
json.dumps without HTML escaping (ensure_ascii=False by default); the globals
raise_exception (raises TemplateError with its message) and strftime_now
(local time); and the `{% generation %}` block transformers adds, which
renders its body unchanged. Variables are passed as keyword arguments to
render(), as transformers passes messages, tools, documents,
add_generation_prompt, the special tokens and the caller's extra kwargs.
"""
import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: renders the body as is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def make_environment():
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_case(env, case):
    try:
        template = env.from_string(case["template"])
        return {"text": template.render(**case.get("variables", {}))}
    except Exception as e:  # every failure is an answer: the C++ side must fail too
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    request_path, output_path = sys.argv[1:3]
    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)
    env = make_environment()
    out = [render_case(env, case) for case in request["cases"]]
    with open(output_path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
