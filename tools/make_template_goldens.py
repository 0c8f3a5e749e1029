#!/usr/bin/env python3
"""Golden chat-template renders from transformers, for tests/test_chat_template.c.

For every template (tests/templates/<name>.jinja, or the chat_template field of a
tokenizer_config.json in ../shared/tokenizers) and every conversation of
tests/templates/conversations.json, with and without add_generation_prompt, this writes
what transformers' own chat-template renderer (render_jinja_template: a sandboxed Jinja
environment with trim_blocks and lstrip_blocks) produces, or the message of the
exception the template raised (and its type: TemplateError for raise_exception), to
tests/templates/golden_<name>.json.
strftime_now is pinned to 2024-07-26 so the goldens do not depend on the day.

Run: build/venv/bin/python tools/make_template_goldens.py [--shared ../shared]
"""
import argparse
import datetime
import json
from pathlib import Path

import transformers
from transformers.utils import chat_template_utils as ctu

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "tests" / "templates"

# name -> (source, bos_token, eos_token); a source "shared:<dir>" is that tokenizer's config
TABLE = {
    "llama3_1": ("shared:llama3_1", None, None),
    "qwen3": ("shared:qwen3", None, None),
    "smollm2": ("smollm2.jinja", "<|im_start|>", "<|im_end|>"),
    "llama3_2": ("llama3_2.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    "qwen2_5": ("qwen2_5.jinja", None, "<|im_end|>"),
    "mistral_v1": ("mistral_v1.jinja", "<s>", "</s>"),
    "mistral_v3": ("mistral_v3.jinja", "<s>", "</s>"),
    "cohere2": ("cohere2.jinja", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    "gemma2": ("gemma2.jinja", "<bos>", "<eos>"),
    "gemma3": ("gemma3.jinja", "<bos>", "<eos>"),
    "phi3": ("phi3.jinja", "<s>", "<|endoftext|>"),
    "phi3_5": ("phi3_5.jinja", "<s>", "<|endoftext|>"),
    "phi4_mini": ("phi4_mini.jinja", "<|endoftext|>", "<|endoftext|>"),
    "phi4": ("phi4.jinja", "<|endoftext|>", "<|im_end|>"),
    "qwen3_1_7b": ("qwen3_1_7b.jinja", None, "<|im_end|>"),
}


def token(v):
    return v.get("content") if isinstance(v, dict) else v


def load(name, shared):
    src, bos, eos = TABLE[name]
    if src.startswith("shared:"):
        cfg = json.loads((shared / "tokenizers" / src[7:] / "tokenizer_config.json").read_text())
        return cfg["chat_template"], token(cfg.get("bos_token")), token(cfg.get("eos_token")), src
    return (TEMPLATES / src).read_text(), bos, eos, src


def render(template, conv, agp, bos, eos):
    compiled = ctu._compile_jinja_template(template)
    compiled.environment.globals["strftime_now"] = lambda fmt: datetime.datetime(2024, 7, 26).strftime(fmt)
    kwargs = dict(conv.get("vars", {}))
    if bos is not None:
        kwargs["bos_token"] = bos
    if eos is not None:
        kwargs["eos_token"] = eos
    try:
        out, _ = ctu.render_jinja_template(
            conversations=[conv["messages"]], tools=conv.get("tools"), chat_template=template,
            add_generation_prompt=agp, **kwargs)
        return {"output": out[0]}
    except Exception as e:  # a template's raise_exception, or anything else it rejects
        # raise_exception raises jinja2's TemplateError itself; anything else (TypeError, UndefinedError,
        # ...) is the template failing on input it does not handle, whose wording is Python's
        return {"error": str(e), "error_type": type(e).__name__}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"))
    args = ap.parse_args()
    shared = Path(args.shared)
    convs = json.loads((TEMPLATES / "conversations.json").read_text())
    for name in TABLE:
        template, bos, eos, src = load(name, shared)
        cases = []
        for i, conv in enumerate(convs):
            for agp in (False, True):
                case = {"conversation": i, "add_generation_prompt": agp}
                case.update(render(template, conv, agp, bos, eos))
                cases.append(case)
        golden = {"template": src, "bos_token": bos, "eos_token": eos,
                  "transformers": transformers.__version__, "cases": cases}
        path = TEMPLATES / f"golden_{name}.json"
        path.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")
        errs = sum("error" in c for c in cases)
        print(f"{path.relative_to(ROOT)}: {len(cases)} cases, {errs} errors")


if __name__ == "__main__":
    main()
