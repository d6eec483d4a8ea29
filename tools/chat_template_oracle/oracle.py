#!/usr/bin/python3
"""The chat-template oracle: renders generated conversations with python3-jinja2 exactly as transformers'
apply_chat_template does, and writes tests/chat_template/oracle.jsonl, which chat_template_test.cpp renders with
nextn's Jinja subset (src/serve/chat_template) and compares byte for byte.

Run with Debian's /usr/bin/python3 (python3-jinja2, jinja2 3.1):

    /usr/bin/python3 tools/chat_template_oracle/oracle.py                 # rewrite the golden file
    /usr/bin/python3 tools/chat_template_oracle/oracle.py --check FILE    # exit 1 (with a summary) if FILE differs

The environment is transformers' (chat_template_utils._compile_jinja_template): ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, the loopcontrols extension and the {% generation %} tag; globals raise_exception and
strftime_now; tojson replaced by json.dumps with ensure_ascii=False. The variables are transformers': messages,
tools (None when absent), documents (None), add_generation_prompt, the tokenizer's special tokens, then the extra
keyword arguments (e.g. enable_thinking). A message's content given as a list of {"type": "text"} parts is joined
with "\\n" first, as vLLM does; everything else reaches the template as given, as in transformers.

Each line: {"template": checkpoint dir relative to the repository, "messages", "tools", "add_generation_prompt",
"extra", and "expected" (the rendered text) or "error" (the message the template's exception carries)}.
The conversations are generated from fixed seeds, so a run reproduces the file exactly.
"""
import argparse
import datetime
import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_OUTPUT = os.path.join(ROOT, "tests", "chat_template", "oracle.jsonl")
SKIP = 77  # ctest's SKIP_RETURN_CODE: jinja2 is not installed
SPECIAL_TOKENS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


# ---- transformers' environment ---------------------------------------------------------------------------

def compile_template(source):
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        # transformers' AssistantTracker, reduced to what rendering a prompt does: the body as it is.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def token_text(token):
    return token["content"] if isinstance(token, dict) else token


def load_checkpoint(rel_dir):
    """The template and special tokens, found as ChatTemplate::from_checkpoint finds them."""
    directory = os.path.join(ROOT, rel_dir)
    config_path = os.path.join(directory, "tokenizer_config.json")
    config = {}
    if os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    special = {}
    for name in SPECIAL_TOKENS:
        if config.get(name) is not None:
            special[name] = token_text(config[name])
    extra_tokens = [token_text(t) for t in config.get("additional_special_tokens") or [] if t is not None]
    if extra_tokens:
        special["additional_special_tokens"] = extra_tokens
    jinja_path = os.path.join(directory, "chat_template.jinja")
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            source = f.read()
    else:
        source = config["chat_template"]
        if isinstance(source, list):
            source = next(t["template"] for t in source if t["name"] == "default")
    return compile_template(source), special


def joined_content(message):
    content = message.get("content")
    if not isinstance(content, list):
        return message
    return dict(message, content="\n".join(part["text"] for part in content))


def render(compiled, special, case):
    messages = [joined_content(m) for m in case["messages"]]
    kwargs = dict(special)
    kwargs.update(case["extra"])
    try:
        case["expected"] = compiled.render(messages=messages, tools=case["tools"], documents=None,
                                           add_generation_prompt=case["add_generation_prompt"], **kwargs)
    except Exception as e:  # the template's own error: raise_exception, a TypeError, an undefined value used
        case["error"] = str(e)
    return case


# ---- conversation material -------------------------------------------------------------------------------

TEXTS = [
    "Hello!",
    "What is 2 + 2?",
    "Write a function that reverses a list.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "Ünïcödé: café, naïve, 日本語, 中文, Ελληνικά, русский, emoji 😀🚀",
    "",
    "  leading and trailing spaces  ",
    "\n\nnewlines around\n\n",
    "tabs\tand\tmore\ttabs",
    "quotes ' and \" and backslash \\ and {{ braces }} {% not a tag %}",
    "Windows line\r\nendings\r\n",
    "non-breaking\u00a0space and ideographic\u3000space",
    "```python\nprint('hi')\n```",
    "A longer paragraph. " * 3,
    "<tool_response>\nnot really a tool response",
    "mentions </think> in the middle",
    "x",
    "Explain recursion in one sentence.",
    "1. first\n2. second\n3. third",
    "trailing newline\n",
]

REASONINGS = [
    "The user wants a sum. 2 + 2 = 4.",
    "\nLet me think step by step.\nFirst...\nThen...\n",
    "",
    "Unicode reasoning: 思考中…",
    "  padded reasoning  ",
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50},
            "score": {"type": "number", "minimum": 0.5},
            "safe": {"type": "boolean", "default": True},
            "filters": {"type": "array", "items": {"type": "string"}}},
            "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "run_python", "description": "Run Python code; returns stdout. Quotes \" and \\ work.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}},
    {"type": "function", "function": {"name": "now", "description": "", "parameters": {"type": "object", "properties": {}}}},
]

ARGUMENTS = {
    "get_weather": [{"city": "Zürich"}, {"city": "Paris", "unit": "fahrenheit"}],
    "search": [{"query": "nextn speculative decoding", "limit": 5}, {"query": "jinja", "score": 0.75, "safe": False,
                                                                     "filters": ["docs", "code"]}],
    "run_python": [{"code": "print(1 + 1)\nprint('é')"}],
    "now": [{}],
}

TOOL_RESULTS = ['{"temperature": 21.5, "unit": "celsius"}', "2", "no results", "", "Ergebnis: ✓\nline two"]


class Generator:
    def __init__(self, seed):
        self.rng = random.Random(seed)

    def text(self):
        return self.rng.choice(TEXTS)

    def content(self):
        """A string, or now and then a list of text parts (joined with "\\n" before rendering)."""
        if self.rng.random() < 0.12:
            return [{"type": "text", "text": self.text()} for _ in range(self.rng.randint(1, 3))]
        return self.text()

    def tools(self, p):
        if self.rng.random() >= p:
            return None
        return self.rng.sample(TOOLS, self.rng.randint(1, 3))

    def tool_call(self, tools, as_string):
        tool = self.rng.choice(tools)["function"]
        arguments = self.rng.choice(ARGUMENTS[tool["name"]])
        if as_string:
            arguments = json.dumps(arguments, ensure_ascii=self.rng.random() < 0.5)
        return {"id": "call_%d" % self.rng.randint(1000, 9999), "type": "function",
                "function": {"name": tool["name"], "arguments": arguments}}

    def tool_messages(self):
        return [{"role": "tool", "tool_call_id": "call_%d" % self.rng.randint(1000, 9999),
                 "content": self.rng.choice(TOOL_RESULTS)} for _ in range(self.rng.randint(1, 3))]


def case(template, messages, tools, add_generation_prompt, extra=None):
    return {"template": template, "messages": messages, "tools": tools,
            "add_generation_prompt": add_generation_prompt, "extra": extra or {}}


# ---- Qwen3: tools, reasoning_content and <think>, multi-step tool use ----------------------------------------

def qwen3_assistant(g, tools):
    message = {"role": "assistant"}
    style = g.rng.random()
    if style < 0.25:
        message["content"] = g.text()
        message["reasoning_content"] = g.rng.choice(REASONINGS + [None])
    elif style < 0.45:
        message["content"] = "<think>\n%s\n</think>\n\n%s" % (g.rng.choice(REASONINGS), g.text())
    else:
        message["content"] = g.content()
    return message


def qwen3_conversation(g, template):
    tools = g.tools(0.4)
    messages = []
    if g.rng.random() < 0.5:
        messages.append({"role": "system", "content": g.content()})
    for turn in range(g.rng.randint(1, 5 if tools else 6)):
        user = g.content()
        if g.rng.random() < 0.08:
            user = "<tool_response>\n%s\n</tool_response>" % g.text()  # looks like a tool turn to the template
        messages.append({"role": "user", "content": user})
        if g.rng.random() < 0.08:
            messages.append({"role": "system", "content": g.text()})  # a system message that is not first
        last = turn == 0 or g.rng.random() < 0.3
        if tools and g.rng.random() < 0.45:
            calls = [g.tool_call(tools, g.rng.random() < 0.5) for _ in range(g.rng.randint(1, 2))]
            call_message = {"role": "assistant", "content": g.rng.choice(["", "Let me check.", "\n"]),
                            "tool_calls": calls}
            if g.rng.random() < 0.3:
                call_message["reasoning_content"] = g.rng.choice(REASONINGS)
            messages.append(call_message)
            messages.extend(g.tool_messages())
            if g.rng.random() < 0.7:
                messages.append(qwen3_assistant(g, tools))
        elif not (last and g.rng.random() < 0.5):
            messages.append(qwen3_assistant(g, tools))
    extra = g.rng.choice([{}, {}, {"enable_thinking": False}, {"enable_thinking": True}])
    return case(template, messages, tools, g.rng.random() < 0.6, extra)


def qwen3_errors(template):
    return [
        case(template, [], None, True),  # messages[0] of an empty list
        case(template, [{"role": "user", "content": None}], None, True),
        case(template, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}], None, False),
        case(template, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None,
                                                             "tool_calls": [{"type": "function", "function": {
                                                                 "name": "now", "arguments": {}}}]}],
             [TOOLS[3]], False),
        case(template, [{"role": "user", "content": "hi"}], [TOOLS[0]], True, {"enable_thinking": False}),
    ]


# ---- DeepSeek-V3: system prompts gathered first, tool calls (content none) and tool outputs ---------------------

def deepseek_conversation(g, template):
    tools = g.tools(0.5)
    messages = []
    if g.rng.random() < 0.6:
        messages.append({"role": "system", "content": g.content()})
    for turn in range(g.rng.randint(1, 5)):
        messages.append({"role": "user", "content": g.content()})
        if g.rng.random() < 0.1:
            messages.append({"role": "system", "content": g.text()})
        if tools and g.rng.random() < 0.5:
            calls = [g.tool_call(tools, True) for _ in range(g.rng.randint(1, 3))]
            messages.append({"role": "assistant", "content": None, "tool_calls": calls})
            messages.extend(g.tool_messages())
            if g.rng.random() < 0.7:
                messages.append({"role": "assistant", "content": g.content()})
        elif turn == 0 or g.rng.random() < 0.7:
            messages.append({"role": "assistant", "content": g.content()})
    # The template never prints `tools` (only the calls), so most cases leave them out to keep the file small.
    given_tools = tools if g.rng.random() < 0.25 else None
    return case(template, messages, given_tools, g.rng.random() < 0.6)


def deepseek_errors(template):
    return [
        # arguments as a dict: the template concatenates them as a string
        case(template, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "now", "arguments": {}}}]}], [TOOLS[3]], False),
        case(template, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}], None, False),
        case(template, [{"role": "user", "content": None}], None, True),
        case(template, [], None, True),
    ]


# ---- the bundled models' template ------------------------------------------------------------------------

def bundled_conversation(g, template):
    messages = []
    if g.rng.random() < 0.5:
        messages.append({"role": "system", "content": g.content()})
    for turn in range(g.rng.randint(1, 6)):
        messages.append({"role": "user", "content": g.content()})
        if turn == 0 or g.rng.random() < 0.75:
            messages.append({"role": "assistant", "content": g.content()})
    return case(template, messages, None, g.rng.random() < 0.6)


def bundled_errors(g, template):
    cases = []
    for role in ["tool", "developer", "function", "User"]:
        cases.append(case(template, [{"role": "user", "content": "hi"}, {"role": role, "content": "x"}], None, True))
    cases.append(case(template, [{"role": "user", "content": None}], None, True))
    cases.append(case(template, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None,
                                                                      "tool_calls": [g.tool_call(TOOLS, True)]}],
                      None, False))
    cases.append(case(template, [], None, True))
    cases.append(case(template, [], None, False))
    return cases


def generate():
    cases = []
    g = Generator(3)
    cases += [qwen3_conversation(g, "tests/tokenizer/qwen3") for _ in range(120)] + qwen3_errors("tests/tokenizer/qwen3")
    g = Generator(5)
    cases += [deepseek_conversation(g, "tests/tokenizer/deepseek_v3") for _ in range(75)]
    cases += deepseek_errors("tests/tokenizer/deepseek_v3")
    for seed, template in [(7, "models/nextn-hy4-tiny"), (11, "models/nextn-qwen4exp-tiny")]:
        g = Generator(seed)
        cases += [bundled_conversation(g, template) for _ in range(40)] + bundled_errors(g, template)
    compiled = {}
    for c in cases:
        if c["template"] not in compiled:
            compiled[c["template"]] = load_checkpoint(c["template"])
        render(*compiled[c["template"]], c)
    return [json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in cases]


# ---- command line ----------------------------------------------------------------------------------------

def describe_difference(fresh, committed):
    a, b = json.loads(fresh), json.loads(committed)
    fields = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return "%s: %s differ" % (a.get("template"), ", ".join(fields))


def check(path, lines):
    try:
        with open(path, encoding="utf-8") as f:
            committed = f.read().splitlines()
    except OSError as e:
        print("oracle: cannot read %s: %s" % (path, e))
        return 1
    differing = [i for i in range(min(len(lines), len(committed))) if lines[i] != committed[i]]
    if not differing and len(lines) == len(committed):
        print("oracle: %s is current (%d cases)" % (path, len(lines)))
        return 0
    print("oracle: %s is NOT what the generator makes now; regenerate it with\n"
          "  /usr/bin/python3 tools/chat_template_oracle/oracle.py" % path)
    print("  cases: %d generated, %d committed; %d differ" % (len(lines), len(committed), len(differing)))
    for i in differing[:10]:
        print("  case %d (line %d): %s" % (i, i + 1, describe_difference(lines[i], committed[i])))
    return 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", metavar="FILE", help="compare with FILE instead of writing it")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="where to write the cases (default: %(default)s)")
    args = parser.parse_args()
    try:
        import jinja2  # noqa: F401
    except ImportError:
        print("oracle: jinja2 is not installed for %s (Debian: apt-get install python3-jinja2)" % sys.executable)
        return SKIP if args.check else 1
    lines = generate()
    if args.check:
        return check(args.check, lines)
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(line + "\n" for line in lines))
    print("oracle: wrote %d cases to %s" % (len(lines), args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
