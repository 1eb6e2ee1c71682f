"""The two tools of the examples' environment and agent, in the standard
library only: `calculator` (integers with + - * and parentheses, exact at
any length, read by a small parser, never eval) and `lookup` (named
constants). tool_env_server.py serves them as an environment's tools;
openai_agent.py runs them itself, as agent code does.
"""
import json

CALCULATOR = {"type": "function", "function": {
    "name": "calculator",
    "description": "Evaluates an integer expression exactly (+, -, *, parentheses).",
    "parameters": {"type": "object",
                   "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}
LOOKUP = {"type": "function", "function": {
    "name": "lookup",
    "description": "The value of a named constant.",
    "parameters": {"type": "object",
                   "properties": {"key": {"type": "string", "enum": ["pi", "e", "c", "answer"]}},
                   "required": ["key"]}}}
TABLE = {"pi": "3.14159", "e": "2.71828", "c": "299792458", "answer": "42"}


# ---- the calculator: a reader of integer expressions (never eval) -------------------

class Expression:
    def __init__(self, text):
        self.s, self.at = text, 0

    def value(self):
        v = self.expr(0)
        self.skip()
        if self.at != len(self.s):
            raise ValueError(f"byte {self.at}: unexpected {self.s[self.at]!r}")
        return v

    def skip(self):
        while self.at < len(self.s) and self.s[self.at] in " \t\n":
            self.at += 1

    def expr(self, depth):
        v = self.term(depth)
        self.skip()
        while self.at < len(self.s) and self.s[self.at] in "+-":
            op = self.s[self.at]
            self.at += 1
            r = self.term(depth)
            v = v + r if op == "+" else v - r
            self.skip()
        return v

    def term(self, depth):
        v = self.factor(depth)
        self.skip()
        while self.at < len(self.s) and self.s[self.at] == "*":
            self.at += 1
            v *= self.factor(depth)
            self.skip()
        return v

    def factor(self, depth):
        if depth > 64:
            raise ValueError("more than 64 nested terms")
        self.skip()
        if self.at == len(self.s):
            raise ValueError("a number was expected, the expression ended")
        c = self.s[self.at]
        if c == "-":
            self.at += 1
            return -self.factor(depth + 1)
        if c == "(":
            self.at += 1
            v = self.expr(depth + 1)
            self.skip()
            if self.at == len(self.s) or self.s[self.at] != ")":
                raise ValueError(f"byte {self.at}: ')' was expected")
            self.at += 1
            return v
        begin = self.at
        while self.at < len(self.s) and self.s[self.at].isdigit():
            self.at += 1
        if begin == self.at:
            raise ValueError(f"byte {self.at}: a number was expected, found {c!r}")
        return int(self.s[begin:self.at])


def run_tool(name, arguments):
    """The result text of one call (errors are results too: the model reads them)."""
    try:
        args = json.loads(arguments)
        if name == "calculator":
            expression = str(args.get("expression", ""))
            if len(expression) > 4096:
                return "error: the expression is longer than 4096 bytes"
            return str(Expression(expression).value())
        if name == "lookup":
            return TABLE.get(str(args.get("key", "")), "error: no such key")
        return f"error: no tool {name!r}"
    except (ValueError, json.JSONDecodeError) as e:
        return f"error: {e}"
