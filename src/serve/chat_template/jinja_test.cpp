// The Jinja subset construct by construct. The expected strings are what python3-jinja2 3.1 renders in
// transformers' environment (checked with it when written); chat_template_test.cpp compares whole real
// templates against the oracle file.
#include "serve/chat_template/jinja.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace nextn::serve::jinja {
namespace {

Variables vars_of(const std::string& json) {
  const nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(json);
  Variables vars;
  for (const auto& [key, value] : parsed.items()) vars.emplace_back(key, Value::from_json(value));
  return vars;
}

std::string render(const std::string& source, const std::string& json = "{}", const Limits& limits = {}) {
  return Template::parse(source, "t", limits).render(vars_of(json));
}

// The message of the render failure (what jinja2's exception says), or "(no error)".
std::string render_error(const std::string& source, const std::string& json = "{}", const Limits& limits = {}) {
  const Template t = Template::parse(source, "t", limits);
  try {
    t.render(vars_of(json));
  } catch (const RenderError& e) {
    return e.detail();
  }
  return "(no error)";
}

// The full parse error ("t, line N: ..."), or "(parsed)".
std::string parse_error(const std::string& source, const Limits& limits = {}) {
  try {
    Template::parse(source, "t", limits);
  } catch (const Error& e) {
    return e.what();
  }
  return "(parsed)";
}

// ---- whitespace ------------------------------------------------------------------------------------------

TEST(JinjaWhitespace, TrimBlocksDropsTheNewlineAfterABlockTag) {
  EXPECT_EQ(render("{% if true %}\nyes\n{% endif %}\nafter"), "yes\nafter");
  EXPECT_EQ(render("{{ 'v' }}\nafter"), "v\nafter");  // not after a {{ }}
  EXPECT_EQ(render("{# c #}\nafter"), "after");        // comments too
  EXPECT_EQ(render("{% if true +%}\nkept{% endif %}"), "\nkept");
}

TEST(JinjaWhitespace, LstripBlocksStripsIndentationBeforeABlockTag) {
  EXPECT_EQ(render("  {% if true %}\n    x\n  {% endif %}\ny"), "    x\ny");
  EXPECT_EQ(render("a  {% if true %}b{% endif %}"), "a  b");  // text before the tag on its line: kept
  EXPECT_EQ(render("  {{ 'v' }}"), "  v");                    // not before a {{ }}
  EXPECT_EQ(render("  {%+ if true %}k{% endif %}"), "  k");
}

TEST(JinjaWhitespace, MinusStripsAllWhitespaceOnThatSide) {
  EXPECT_EQ(render("a \n {%- if true -%} \n b \n {%- endif -%} \n c"), "abc");
  EXPECT_EQ(render("{{- 'a' -}}  \n\t {{ 'b' }} {{- 'c' }}"), "abc");
  EXPECT_EQ(render("x\u00a0 {{- 'y' }}"), "xy");  // Python's whitespace, not only ASCII
  EXPECT_EQ(render("a {#- c -#} b"), "ab");
}

TEST(JinjaWhitespace, NewlinesAreNormalizedAndOneTrailingNewlineDropped) {
  EXPECT_EQ(render("a\r\nb\rc\n"), "a\nb\nc");
  EXPECT_EQ(render("a\n\n"), "a\n");
}

// ---- values and expressions ------------------------------------------------------------------------------

TEST(JinjaExpressions, ValuesPrintAsPythonStr) {
  EXPECT_EQ(render("{{ 1 }} {{ 1.0 }} {{ 2.5e-7 }} {{ 1e16 }} {{ 0.1 + 0.2 }} {{ -0.0 }}"),
            "1 1.0 2.5e-07 1e+16 0.30000000000000004 -0.0");
  EXPECT_EQ(render("{{ true }} {{ False }} {{ none }} {{ None }} {{ x }}|"), "True False None None |");
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.5, {'k': \"it's\"}, (1,), ()] }}"),
            "[1, 'a', None, True, 1.5, {'k': \"it's\"}, (1,), ()]");
  EXPECT_EQ(render("{{ ['\\n', '\\\\', 'é', '\\x01', '\\u00a0'] }}"), "['\\n', '\\\\', 'é', '\\x01', '\\xa0']");
  EXPECT_EQ(render("{{ m }}", R"({"m": {"role": "user", "n": [1, 2.0]}})"), "{'role': 'user', 'n': [1, 2.0]}");
}

TEST(JinjaExpressions, StringLiteralsDecodePythonEscapes) {
  EXPECT_EQ(render(R"({{ "a\tb\x41\u00e9\101\q" }}|{{ 'a' "b" }})"), "a\tbAéA\\q|ab");
}

TEST(JinjaExpressions, ArithmeticFollowsPython) {
  EXPECT_EQ(render("{{ 7 / 2 }} {{ 10 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7.5 // 2 }}"),
            "3.5 5.0 3 -4 2 -2 3.0");
  EXPECT_EQ(render("{{ 2 ** 10 }} {{ 2 ** -1 }} {{ true + 1 }} {{ 'ab' * 2 }} {{ [1] * 3 }} {{ [1] + [2] }}"),
            "1024 0.5 2 abab [1, 1, 1] [1, 2]");
  // jinja2's precedence: unary minus before **, ~ between + and *.
  EXPECT_EQ(render("{{ -2 ** 2 }} {{ 2 ** 3 ** 2 }} {{ 2 * 3 ~ 4 }} {{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }}"), "4 64 64 14 20");
  EXPECT_EQ(render_error("{{ 1 ~ 2 + 3 }}"), "can only concatenate str (not \"int\") to str");  // ('1' ~ '2') + 3
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none ~ x ~ [1] }}"), "a1None[1]");
}

TEST(JinjaExpressions, ComparisonsAndLogic) {
  EXPECT_EQ(render("{{ 1 == 1.0 }} {{ true == 1 }} {{ (1,) == [1] }} {{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }}"),
            "True True False True");
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'abc' < 'abd' }} {{ [1, 2] < [1, 3] }}"), "True False True True");
  EXPECT_EQ(render("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ 1 in x }}"),
            "True True True True False");
  EXPECT_EQ(render("{{ none or 'x' }} {{ 0 and 'y' }} {{ 'a' and 'b' }} {{ not [] }} {{ not x is defined }}"),
            "x 0 b True True");
  EXPECT_EQ(render("{{ 1 if true else 2 }} {{ 'a' if '' else 'b' }} [{{ 1 if false }}]"), "1 b []");
}

TEST(JinjaExpressions, SubscriptsAndSlices) {
  const char* vars = R"({"xs": [1, 2, 3, 4, 5], "s": "héllo", "d": {"a": {"b": 7}}})";
  EXPECT_EQ(render("{{ xs[0] }} {{ xs[-1] }} {{ xs[1:3] }} {{ xs[::-1] }} {{ xs[::2] }} {{ xs[-2:] }} {{ xs[9:] }}", vars),
            "1 5 [2, 3] [5, 4, 3, 2, 1] [1, 3, 5] [4, 5] []");
  EXPECT_EQ(render("{{ s[1] }} {{ s[1:3] }} {{ s[::-1] }} {{ s|length }}", vars), "é él olléh 5");
  EXPECT_EQ(render("{{ d.a.b }} {{ d['a']['b'] }} {{ d.a.missing }}| {{ xs[10] }}|", vars), "7 7 | |");
  EXPECT_EQ(render("{{ xs.0 }}", vars), "1");
}

TEST(JinjaExpressions, UndefinedPrintsEmptyButRaisesWhenUsed) {
  EXPECT_EQ(render("[{{ x }}{{ x|length }}{{ x is defined }}{{ {'a': 1}.b is defined }}]"), "[0FalseFalse]");
  EXPECT_EQ(render_error("{{ x.y }}"), "'x' is undefined");
  EXPECT_EQ(render_error("{{ {'a': 1}.b.c }}"), "'dict object' has no attribute 'b'");
  EXPECT_EQ(render_error("{{ [1][5].x }}"), "list object has no element 5");
  EXPECT_EQ(render_error("{{ none.x.y }}"), "'None' has no attribute 'x'");
  EXPECT_EQ(render_error("{{ 'a' + x }}"), "'x' is undefined");
  EXPECT_EQ(render_error("{{ x < 1 }}"), "'x' is undefined");
  EXPECT_EQ(render_error("{{ (1 if false).x }}"),
            "the inline if-expression on line 1 evaluated to false and no else section was defined.");
}

TEST(JinjaExpressions, TypeErrorsCarryPythonsMessages) {
  EXPECT_EQ(render_error("{{ 'a' + none }}"), "can only concatenate str (not \"NoneType\") to str");
  EXPECT_EQ(render_error("{{ 1 + 'a' }}"), "unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_EQ(render_error("{{ 'a' in none }}"), "argument of type 'NoneType' is not iterable");
  EXPECT_EQ(render_error("{{ 1 in 'abc' }}"), "'in <string>' requires string as left operand, not int");
  EXPECT_EQ(render_error("{{ 'a' < 1 }}"), "'<' not supported between instances of 'str' and 'int'");
  EXPECT_EQ(render_error("{{ 1 / 0 }}"), "division by zero");
  EXPECT_EQ(render_error("{{ 5 % 0 }}"), "integer modulo by zero");
  EXPECT_EQ(render_error("{{ none|length }}"), "object of type 'NoneType' has no len()");
  EXPECT_EQ(render_error("{{ 2 ** 63 }}"), "integer overflow (the result does not fit in 64 bits)");
}

// ---- statements ------------------------------------------------------------------------------------------

TEST(JinjaStatements, IfElifElse) {
  const char* source = "{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %}";
  EXPECT_EQ(render(source, R"({"n": 1})"), "one");
  EXPECT_EQ(render(source, R"({"n": 2})"), "two");
  EXPECT_EQ(render(source, R"({"n": 3})"), "many");
}

TEST(JinjaStatements, ForLoopVariables) {
  EXPECT_EQ(render("{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
                   "{{ loop.first }}{{ loop.last }}{{ loop.length }} {% endfor %}"),
            "1032TrueFalse3 2121FalseFalse3 3210FalseTrue3 ");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.previtem|d('-') }}{{ loop.nextitem|d('-') }}"
                   "{{ loop.cycle('a', 'b') }} {% endfor %}"),
            "-2a 13b 2-a ");
  // `loop` is the innermost loop's, and the outer one's again after the inner loop.
  EXPECT_EQ(render("{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %}"),
            "121|122|");
}

TEST(JinjaStatements, ForElseFilterUnpackingBreakContinue) {
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  // jinja2's quirk: the else block also runs when no iteration reached the end of the body.
  EXPECT_EQ(render("{% for i in [1, 2] %}{{ i }}{% break %}{% else %}E{% endfor %}"), "1E");
  EXPECT_EQ(render("{% for i in [1, 2] %}{{ i }}{% continue %}{% else %}E{% endfor %}"), "12E");
  EXPECT_EQ(render("{% for i in [1, 2] %}{{ i }}{% if i == 2 %}{% break %}{% endif %}{% else %}E{% endfor %}"), "12");
  EXPECT_EQ(render("{% for x in [1, 2, 3] if x > 1 %}{{ x }}/{{ loop.length }} {% else %}E{% endfor %}"), "2/2 3/2 ");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
  EXPECT_EQ(render("{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}"), "ab");
  EXPECT_EQ(render("{% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}"
                   "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "13");
  EXPECT_EQ(render_error("{% for a, b in [[1]] %}{% endfor %}"), "not enough values to unpack (expected 2, got 1)");
  EXPECT_EQ(render_error("{% for x in none %}{% endfor %}"), "'NoneType' object is not iterable");
  EXPECT_EQ(render("{% for x in missing %}x{% endfor %}"), "");
}

TEST(JinjaStatements, ScopesAreJinjas) {
  // Each iteration starts from the enclosing scope; nothing set inside a loop survives it.
  EXPECT_EQ(render("{% set x = 1 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{{ x }} {% endfor %}{{ x }}"),
            "12 12 12 1");
  // An if-block shares its scope.
  EXPECT_EQ(render("{% if true %}{% set z = 3 %}{% endif %}{{ z }}"), "3");
  // A namespace is how a loop hands values out.
  EXPECT_EQ(render("{% set ns = namespace(total=0, seen=[]) %}{% for i in range(4) %}{% set ns.total = ns.total + i %}"
                   "{% set ns.seen = ns.seen + [i] %}{% endfor %}{{ ns.total }} {{ ns.seen }}"),
            "6 [0, 1, 2, 3]");
  EXPECT_EQ(render_error("{% set x = 5 %}{% set x.y = 1 %}"), "cannot assign attribute on non-namespace object");
}

TEST(JinjaStatements, SetForms) {
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set a, b = b, a %}{{ a }}{{ b }}"), "1221");
  EXPECT_EQ(render("{% set x %}  hi {{ 1 }}{% endset %}[{{ x }}]"), "[  hi 1]");
  EXPECT_EQ(render("{% for i in [1, 2] %}{% set x %}{{ i }}{% if i == 2 %}{% break %}{% endif %}{% endset %}"
                   "{{ x }}{% endfor %}"),
            "1");  // a break inside leaves the loop
  EXPECT_EQ(render("{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns }}"), "12<Namespace {'a': 1, 'b': 2}>");
  EXPECT_EQ(render("{% if not agp is defined %}{% set agp = false %}{% endif %}{{ agp }}"), "False");
}

TEST(JinjaStatements, Macros) {
  EXPECT_EQ(render("{% macro m(a, b=2) %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }} {{ m(1, b=3) }} {{ m() }}|{{ m }}"),
            "12 13 2|<Macro 'm'>");
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(4) }}"), "4321");
  // A macro sees the scope it was defined in as it is when called.
  EXPECT_EQ(render("{% macro m() %}{{ q }}{% endmacro %}{% set q = 7 %}{{ m() }}"), "7");
  EXPECT_EQ(render_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}"), "macro 'm' takes not more than 1 argument(s)");
  EXPECT_EQ(render_error("{% macro m(a) %}{% endmacro %}{{ m(c=2) }}"), "macro 'm' takes no keyword argument 'c'");
}

TEST(JinjaStatements, GenerationTagRendersItsBody) {
  EXPECT_EQ(render("{% generation %}gen {{ 1 }}{% endgeneration %}"), "gen 1");
}

TEST(JinjaStatements, GlobalsRaiseExceptionRangeStrftime) {
  EXPECT_EQ(render_error("{{ raise_exception('Conversation roles must alternate') }}"),
            "Conversation roles must alternate");
  EXPECT_EQ(render("{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }}"),
            "[0, 1, 2] [1, 4, 7] [5, 3, 1]");
  EXPECT_EQ(render_error("{{ range(200000) }}"),
            "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  const std::string year = render("{{ strftime_now('%Y') }}");
  EXPECT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
  EXPECT_EQ(render("{{ dict(a=1, b=[1]) }}"), "{'a': 1, 'b': [1]}");
}

// ---- filters ---------------------------------------------------------------------------------------------

TEST(JinjaFilters, Strings) {
  EXPECT_EQ(render("{{ '  x  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 'aB'|upper }}{{ 'aB'|lower }}|{{ 'hello world'|title }}"
                   "|{{ 'hELLO'|capitalize }}|{{ 'abc'|replace('b', 'X') }}|{{ 'aaa'|replace('a', 'b', 2) }}"),
            "x|a|ABab|Hello World|Hello|aXc|bba");
  EXPECT_EQ(render("{{ 5|string }} {{ none|string }} {{ [1]|string }} {{ 'a'|safe }}"), "5 None [1] a");
  EXPECT_EQ(render("{{ 'a\\nb\\n\\nc'|indent }}|{{ 'x'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(1, blank=true) }}"),
            "a\n    b\n\n    c|  x|a\n \n b");
}

TEST(JinjaFilters, Sequences) {
  EXPECT_EQ(render("{{ 'ab'|length }} {{ [1, 2]|count }} {{ x|length }} {{ 'ab'|list }} {{ {'b': 1, 'a': 2}|list }}"),
            "2 2 0 ['a', 'b'] ['b', 'a']");
  EXPECT_EQ(render("{{ [1, 2]|first }}{{ [1, 2]|last }}{{ 'abc'|first }}{{ 'abc'|reverse }} {{ [1, 2]|reverse|list }}"),
            "12acba [2, 1]");
  EXPECT_EQ(render("{{ [1, 2, 3]|join(', ') }} {{ [{'a': 'x'}, {'a': 'y'}]|join('-', attribute='a') }}"), "1, 2, 3 x-y");
  EXPECT_EQ(render("{{ ['b', 'A', 'a']|sort }} {{ ['b', 'a']|sort(reverse=true) }} "
                   "{{ [{'n': 2}, {'n': 1}]|sort(attribute='n')|map(attribute='n')|list }}"),
            "['A', 'a', 'b'] ['b', 'a'] [1, 2]");
  EXPECT_EQ(render("{{ ['A', 'b', 'a']|unique|list }} {{ [3, 1, 2]|max }} {{ ['b', 'A']|min }} {{ [1, 2]|sum }}"),
            "['A', 'b'] 3 A 3");
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2}|dictsort }} {{ {'b': 1}|items|list }}"), "[('a', 2), ('b', 1)] [('b', 1)]");
  EXPECT_EQ(render("{{ x|default('d') }} {{ none|default('d') }} {{ ''|d('d', true) }}"), "d None d");
}

TEST(JinjaFilters, MapSelectReject) {
  EXPECT_EQ(render("{{ ['a', 'B']|map('upper')|list }} {{ [{'a': {'b': 1}}, {}]|map(attribute='a.b', default=0)|list }}"),
            "['A', 'B'] [1, 0]");
  EXPECT_EQ(render("{{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('even')|list }} "
                   "{{ [1, none, 0, 'x']|select|list }}"),
            "[1, 3] [1, 3] [1, 'x']");
  EXPECT_EQ(render("{{ ms|selectattr('role', 'equalto', 's')|list }} {{ ms|rejectattr('role', 'eq', 's')|list }}",
                   R"({"ms": [{"role": "u"}, {"role": "s"}]})"),
            "[{'role': 's'}] [{'role': 'u'}]");
}

TEST(JinjaFilters, Numbers) {
  EXPECT_EQ(render("{{ '42'|int }} {{ '42.7'|int }} {{ 'x'|int }} {{ 3.9|int }} {{ none|int }} {{ '0x1A'|int(base=16) }}"),
            "42 42 0 3 0 26");
  EXPECT_EQ(render("{{ '3.5'|float }} {{ 'x'|float }} {{ 2|float }} {{ -3|abs }}"), "3.5 0.0 2.0 3");
  EXPECT_EQ(render("{{ 2.5|round }} {{ 3.5|round }} {{ 5|round }} {{ 2.567|round(2) }} {{ -2.5|round(0, 'floor') }}"),
            "2.0 4.0 5 2.57 -3.0");
}

TEST(JinjaFilters, TojsonIsTransformersJsonDumps) {
  EXPECT_EQ(render("{{ {'a': [1, 'é', 1.5, none, true]}|tojson }}"), "{\"a\": [1, \"é\", 1.5, null, true]}");
  EXPECT_EQ(render("{{ {'a': [1, 2], 'b': {}}|tojson(indent=2) }}"), "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {}\n}");
  EXPECT_EQ(render("{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }} {{ [1, 2]|tojson(separators=(',', ':')) }}"),
            "{\"a\": 2, \"b\": 1} [1,2]");
  EXPECT_EQ(render("{{ '😀é\\n\\u0001'|tojson }} {{ '😀é'|tojson(ensure_ascii=true) }}"),
            "\"😀é\\n\\u0001\" \"\\ud83d\\ude00\\u00e9\"");
  EXPECT_EQ(render("{{ t|tojson }}", R"({"t": {"z": 1, "a": {"y": 2.0, "b": 3}}})"), "{\"z\": 1, \"a\": {\"y\": 2.0, \"b\": 3}}");
  EXPECT_EQ(render_error("{{ x|tojson }}"), "Object of type Undefined is not JSON serializable");
}

// ---- tests -----------------------------------------------------------------------------------------------

TEST(JinjaTests, TypeAndValueTests) {
  EXPECT_EQ(render("{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 'a' is string }}{{ 1 is string }}"),
            "FalseTrueTrueTrueFalse");
  EXPECT_EQ(render("{{ 1 is number }}{{ true is number }}{{ true is integer }}{{ 1 is integer }}{{ 1.0 is float }}"
                   "{{ true is boolean }}{{ true is true }}{{ 1 is true }}{{ false is false }}"),
            "TrueTrueFalseTrueTrueTrueTrueFalseTrue");
  EXPECT_EQ(render("{{ {} is mapping }}{{ [] is mapping }}{{ 'a' is sequence }}{{ {} is sequence }}{{ none is sequence }}"
                   "{{ 'a' is iterable }}{{ 1 is iterable }}{{ range is callable }}"),
            "TrueFalseTrueTrueFalseTrueFalseTrue");
  EXPECT_EQ(render("{{ 3 is odd }}{{ 3 is even }}{{ 6 is divisibleby 3 }}{{ 'ab' is lower }}{{ 'AB' is upper }}"
                   "{{ 2 is in [1, 2] }}{{ 1 is eq 1 }}{{ 1 is equalto 2 }}{{ 5 is gt 3 }}{{ 5 is lt(3) }}"
                   "{{ none is sameas none }}{{ x is not defined }}"),
            "TrueFalseTrueTrueTrueTrueTrueFalseTrueFalseTrueTrue");
}

// ---- Python methods --------------------------------------------------------------------------------------

TEST(JinjaMethods, StringMethods) {
  EXPECT_EQ(render("{{ 'ab'.startswith('a') }}{{ 'ab'.startswith(('x', 'a')) }}{{ 'ab'.endswith('b') }}"
                   "{{ 'abc'.startswith('b', 1) }}"),
            "TrueTrueTrueTrue");
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a-b-c'.rsplit('-', 1) }}"),
            "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] ['a-b', 'c']");
  EXPECT_EQ(render("[{{ '  x '.strip() }}|{{ '  x '.lstrip() }}|{{ '  x '.rstrip() }}|{{ '\\nx\\n\\n'.strip('\\n') }}"
                   "|{{ '\\u00a0x\\u3000'.strip() }}]"),
            "[x|x |  x|x|x]");
  EXPECT_EQ(render("{{ 'aBc'.upper() }}{{ 'aBc'.lower() }} {{ \"they're\".title() }} {{ 'hELLO'.capitalize() }}"),
            "ABCabc They'Re Hello");
  EXPECT_EQ(render("{{ 'héllo'.find('l') }} {{ 'abcb'.rfind('b') }} {{ 'aaa'.count('a') }} {{ 'ab'.replace('', '-') }} "
                   "{{ '-'.join(['a', 'b']) }} {{ 'a\\nb\\r\\nc'.splitlines() }} {{ ' '.isspace() }}"),
            "2 3 3 -a-b- a-b ['a', 'b', 'c'] True");
  EXPECT_EQ(render_error("{{ 'abc'.index('z') }}"), "substring not found");
  EXPECT_EQ(render_error("{{ ','.join([1]) }}"), "sequence item 0: expected str instance, int found");
}

TEST(JinjaMethods, DictAndListMethods) {
  EXPECT_EQ(render("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d.items() }} {{ d.keys() }} {{ d.values() }}",
                   R"({"d": {"a": 1}})"),
            "1 None 5 dict_items([('a', 1)]) dict_keys(['a']) dict_values([1])");
  EXPECT_EQ(render("{{ [1, 2, 1].count(1) }} {{ [1, 2].index(2) }}"), "2 1");
  EXPECT_EQ(render_error("{{ [1, 2].append(3) }}"), "access to attribute 'append' of 'list' object is unsafe.");
  EXPECT_EQ(render_error("{{ {'a': 1}.update({}) }}"), "access to attribute 'update' of 'dict' object is unsafe.");
  // A dict method wins over a key of the same name, as Python's attribute lookup does; [] finds the key.
  EXPECT_EQ(render("{{ d['items'] }} {{ d.items() }}", R"({"d": {"items": 5}})"), "5 dict_items([('items', 5)])");
}

// ---- what is refused when a template is loaded -------------------------------------------------------------

TEST(JinjaParseErrors, UnsupportedStatementsFiltersTestsFunctionsMethods) {
  EXPECT_EQ(parse_error("a\n{% include 'other.jinja' %}"), "t, line 2: unsupported statement 'include'");
  for (const char* statement : {"import", "extends", "block", "call", "filter", "with", "autoescape", "do"})
    EXPECT_EQ(parse_error(std::string("{% ") + statement + " x %}"),
              std::string("t, line 1: unsupported statement '") + statement + "'");
  EXPECT_EQ(parse_error("{% raw %}{{ x }}{% endraw %}"), "t, line 1: unsupported statement 'raw'");
  EXPECT_EQ(parse_error("\n\n{{ x | wordwrap }}"), "t, line 3: unknown filter 'wordwrap'");
  EXPECT_EQ(parse_error("{{ xs | map('nope') }}"), "t, line 1: unknown filter 'nope'");
  EXPECT_EQ(parse_error("{{ xs | selectattr('a', 'nope') }}"), "t, line 1: unknown test 'nope'");
  EXPECT_EQ(parse_error("{% if x is prime %}{% endif %}"), "t, line 1: unknown test 'prime'");
  EXPECT_EQ(parse_error("{{ lipsum(2) }}"), "t, line 1: unsupported function 'lipsum'");
  EXPECT_EQ(parse_error("{{ 'x {}'.format(1) }}"), "t, line 1: unsupported method 'format'");
  EXPECT_EQ(parse_error("{{ '%s' % x }}"), "t, line 1: unsupported: printf-style string formatting ('%' on a string)");
  EXPECT_EQ(parse_error("{% for x in xs recursive %}{% endfor %}"), "t, line 1: unsupported: recursive for loops");
  // Functions the template defines, or may hold in a variable or namespace, are fine.
  EXPECT_EQ(parse_error("{% macro m() %}{% endmacro %}{% set ns = namespace(f=m) %}{{ m() }}{{ ns.f() }}"), "(parsed)");
}

TEST(JinjaParseErrors, UnterminatedAndMismatchedBlocks) {
  EXPECT_EQ(parse_error("x\n{% if a %}\nyes"), "t, line 2: the 'if' block opened on this line is never closed (expected 'endif')");
  EXPECT_EQ(parse_error("{% for x in xs %}\n{% if x %}{% endif %}"),
            "t, line 1: the 'for' block opened on this line is never closed (expected 'endfor')");
  EXPECT_EQ(parse_error("{% macro m() %}"), "t, line 1: the 'macro' block opened on this line is never closed (expected 'endmacro')");
  EXPECT_EQ(parse_error("{% for x in xs %}\n{% endif %}"),
            "t, line 2: unexpected 'endif' (the innermost open block is 'for' from line 1, closed by 'endfor')");
  EXPECT_EQ(parse_error("{% endfor %}"), "t, line 1: unexpected 'endfor' (no block is open)");
  EXPECT_EQ(parse_error("{% if a %}{% else %}{% else %}{% endif %}"),
            "t, line 1: unexpected 'else' (the innermost open block is 'if' from line 1, closed by 'endif')");
  EXPECT_EQ(parse_error("a\n\n{{ x"), "t, line 3: the tag opened here is never closed (expected '}}')");
  EXPECT_EQ(parse_error("{% if x"), "t, line 1: the tag opened here is never closed (expected '%}')");
  EXPECT_EQ(parse_error("\n{# no end"), "t, line 2: the comment opened here is never closed ('#}')");
  EXPECT_EQ(parse_error("{{ 'abc }}"), "t, line 1: unterminated string literal");
}

TEST(JinjaParseErrors, BadSyntax) {
  EXPECT_EQ(parse_error("{{ }}"), "t, line 1: expected an expression, got end of print statement '}}'");
  EXPECT_EQ(parse_error("{{ a b }}"), "t, line 1: expected end of print statement '}}', got 'b'");
  EXPECT_EQ(parse_error("{{ 1 ! 2 }}"), "t, line 1: unexpected character '!'");
  EXPECT_EQ(parse_error("{{ (1 }}"), "t, line 1: unexpected '}', expected ')'");
  EXPECT_EQ(parse_error("{{ 1) }}"), "t, line 1: unexpected ')'");
  EXPECT_EQ(parse_error("{% break %}"), "t, line 1: 'break' outside of a loop");
  EXPECT_EQ(parse_error("{% for x in xs %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}"),
            "t, line 1: 'continue' outside of a loop");
  EXPECT_EQ(parse_error("{% macro m(a=1, b) %}{% endmacro %}"), "t, line 1: non-default argument 'b' follows default argument");
  EXPECT_EQ(parse_error("{% set 1 = 2 %}"), "t, line 1: expected a variable name to assign to, got '1'");
  EXPECT_EQ(parse_error("{% for x %}{% endfor %}"), "t, line 1: expected 'in' in the for loop, got end of statement '%}'");
  EXPECT_EQ(parse_error("{{ f(a=1, 2) }}"), "t, line 1: a positional argument follows a keyword argument");
  EXPECT_EQ(parse_error("{{ f(*xs) }}"), "t, line 1: unsupported: *args / **kwargs in a call");
  EXPECT_EQ(parse_error("{{ 'a' is string if true else 'b' }}"), "t, line 1: expected end of print statement '}}', got 'true'");
}

// ---- bounds on hostile templates ---------------------------------------------------------------------------

TEST(JinjaLimits, RecursionDepthIsBounded) {
  Limits limits;
  limits.max_call_depth = 20;
  EXPECT_EQ(render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "{}", limits),
            "macro calls nest deeper than 20 levels (runaway recursion?)");
  // The default bound stops unbounded recursion well before the C++ stack does.
  EXPECT_NE(render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("deeper than"), std::string::npos);
}

TEST(JinjaLimits, OutputAndStringSizesAreBounded) {
  Limits limits;
  limits.max_output_bytes = 1000;
  EXPECT_EQ(render_error("{% for i in range(2000) %}x{% endfor %}", "{}", limits),
            "the rendered output is larger than 1000 bytes");
  EXPECT_EQ(render_error("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                         "{}", limits),
            "the template built a string or list larger than 1000 bytes/items");
  EXPECT_EQ(render_error("{{ 'ab' * 100000 }}", "{}", limits), "the template built a string or list larger than 1000 bytes/items");
  EXPECT_EQ(render("{% for i in range(500) %}x{% endfor %}", "{}", limits).size(), 500u);
  // Sizes are checked before a filter builds its result, so a huge argument cannot exhaust memory first.
  const char* too_big = "the template built a string or list larger than 1000 bytes/items";
  EXPECT_EQ(render_error("{{ 'a\nb'|indent(1000000000000) }}", "{}", limits), too_big);
  EXPECT_EQ(render_error("{{ ('x' * 500)|replace('', 'yyyy') }}", "{}", limits), too_big);
  EXPECT_EQ(render_error("{{ ('x' * 500).replace('x', 'yy') }}", "{}", limits), too_big);
  EXPECT_EQ(render_error("{{ [1, 2]|tojson(indent=1000000000000) }}", "{}", limits), too_big);
  EXPECT_EQ(render_error("{{ [[[[1]]]]|tojson(indent='" + std::string(300, ' ') + "') }}", "{}", limits),
            "the JSON text is larger than 1000 bytes");
}

TEST(JinjaLimits, WorkIsBounded) {
  Limits limits;
  limits.max_steps = 100000;
  EXPECT_EQ(render_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "{}", limits),
            "the template did more than 100000 steps of work (a runaway loop?)");
}

TEST(JinjaLimits, NestingIsBoundedWhenParsing) {
  std::string deep = "{{ ";
  for (int i = 0; i < 300; ++i) deep += "(";
  deep += "1";
  for (int i = 0; i < 300; ++i) deep += ")";
  EXPECT_EQ(parse_error(deep + " }}"), "t, line 1: blocks or expressions nest deeper than 100 levels");
  std::string long_sum = "{{ 1";
  for (int i = 0; i < 300; ++i) long_sum += " + 1";
  EXPECT_EQ(parse_error(long_sum + " }}"), "t, line 1: an expression nests deeper than 100 levels");
  std::string blocks;
  for (int i = 0; i < 300; ++i) blocks += "{% if true %}";
  EXPECT_EQ(parse_error(blocks), "t, line 1: blocks or expressions nest deeper than 100 levels");
}

TEST(JinjaRender, ErrorsNameTheOriginAndLine) {
  const Template t = Template::parse("a\n\n{{ 'x' + none }}", "chat template (here.jinja)");
  try {
    t.render({});
    FAIL() << "must throw";
  } catch (const RenderError& e) {
    EXPECT_EQ(std::string(e.what()), "chat template (here.jinja), line 3: can only concatenate str (not \"NoneType\") to str");
    EXPECT_EQ(e.line(), 3);
  }
}

TEST(JinjaRender, ATemplateRendersManyTimes) {
  const Template t = Template::parse("{% set ns = namespace(n=0) %}{% for m in ms %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
                                     "t");
  EXPECT_EQ(t.render(vars_of(R"({"ms": [1, 2, 3]})")), "3");
  EXPECT_EQ(t.render(vars_of(R"({"ms": [1]})")), "1");  // no state kept between renders
}

}  // namespace
}  // namespace nextn::serve::jinja
