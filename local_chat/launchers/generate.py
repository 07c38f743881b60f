"""local-chat-generate --prompts "What is the capital of France?" [flags] (or python demos/generate.py ...): generation
without the browser.

Prompts come from --prompts, or --data (a .txt file, one prompt per line, or a .jsonl file with a "prompt" key);
answers are printed (and written to --output as jsonl), then the batch figures: tokens, encode / generate /
decode latency, ms per output token and output tokens/s. With --api_base URL the prompts go to that engine instead,
--batch_size of them at once. --config run.yaml may hold any of the flags.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from local_chat.errors import UserError

from .flags import FlagParser, add_model_flags, fail
from .loading import check_serving_flags, compile_before_answering, load_engine, lora_adapters
from .settings import LaunchSettings


def build_parser() -> argparse.ArgumentParser:
    p = FlagParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_flags(p)
    p.add_argument("--name_or_path", dest="pretrained_path", nargs="+", help="alias of --pretrained_path")
    p.add_argument("--prompts", nargs="+", default=None, help="the prompts themselves")
    p.add_argument("--data", type=Path, default=None, help="a .txt (one prompt per line) or .jsonl ('prompt' key) file")
    p.add_argument("--limit", type=int, default=None, help="only the first N prompts of --data (default: all)")
    p.add_argument(
        "--template",
        default=None,
        help="None (the raw prompt), a single-turn template (alpaca, ...), a conversation template, or "
        "chat_template (default: the model's chat template where it has one, else None)",
    )
    p.add_argument(
        "--system", default=None, help="the system prompt of a conversation template (default: the template's own)"
    )
    p.add_argument(
        "--max_new_tokens",
        "--max_gen_len",
        "--max_tokens_to_generate",
        dest="max_new_tokens",
        type=int,
        default=256,
        help="the longest answer, in tokens (default: 256)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: 0, greedy)")
    p.add_argument("--top_p", type=float, default=0.95, help="nucleus sampling's top p (default: 0.95)")
    p.add_argument("--top_k", type=int, default=0, help="sample among the k likeliest tokens only (default: 0, off)")
    p.add_argument("--repetition_penalty", type=float, default=1.0, help="above 1, less repetition (default: 1.0, off)")
    p.add_argument(
        "--seed", type=int, default=None, help="seed of the sampling, for answers that repeat (default: none)"
    )
    p.add_argument("--batch_size", type=int, default=1, help="prompts per left-padded batch (default: 1)")
    p.add_argument(
        "--json_schema",
        type=Path,
        default=None,
        help="a JSON schema file: every answer is JSON valid against it (held to it token by token)",
    )
    p.add_argument(
        "--tools",
        type=Path,
        default=None,
        help='a JSON file of tools the model may call (OpenAI\'s list of {"type": "function", ...}): calls are '
        "printed and written as tool_calls, and only of these tools",
    )
    p.add_argument(
        "--adapter", default=None, metavar="NAME", help="the --lora adapter that answers (default: the model alone)"
    )
    p.add_argument("--output", type=Path, default=None, help="write one json object per prompt to this .jsonl file")
    p.add_argument("--config", type=Path, default=None, help="a YAML file holding any of these flags")
    return p


def parse_args(argv=None) -> LaunchSettings:
    """The flags, with --config's values as defaults that the command line overrides."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.config is not None:
        import yaml

        if not args.config.exists():
            raise UserError(f"The config file {args.config} does not exist; check --config.")
        values = yaml.safe_load(args.config.read_text()) or {}
        dest_of = {option.lstrip("-"): action.dest for action in p._actions for option in action.option_strings}
        unknown = sorted(set(values) - set(dest_of))
        if unknown:
            raise UserError(f"{args.config} sets unknown flags ({', '.join(unknown)}); see --help for their names.")
        p.set_defaults(**{dest_of[name]: value for name, value in values.items()})
        args = p.parse_args(argv)
    return args


def read_prompts(args: LaunchSettings) -> list[str]:
    if args.data is not None:
        if not args.data.exists():
            raise UserError(f"The prompts file {args.data} does not exist; check --data.")
        lines = [line for line in args.data.read_text().splitlines() if line.strip()]
        if args.data.suffix == ".jsonl":
            prompts = []
            for number, line in enumerate(lines, 1):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    raise UserError(
                        f"Line {number} of {args.data} is not valid json; each line must be a json "
                        'object like {"prompt": "..."}.'
                    )
                if not isinstance(record, dict) or "prompt" not in record:
                    raise UserError(
                        f'Line {number} of {args.data} has no "prompt" key; each line must be a json '
                        'object like {"prompt": "..."}.'
                    )
                prompts.append(str(record["prompt"]))
        else:
            prompts = lines
        prompts = prompts[: args.limit] if args.limit else prompts
    else:
        prompts = args.prompts or []
    if not prompts:
        raise UserError('There are no prompts; pass --prompts "..." or --data prompts.txt.')
    return prompts


def run(args: LaunchSettings) -> tuple[list[dict], dict]:
    """Answer every prompt in batches; returns the per-prompt records and the run's figures."""
    from local_chat.engine import Sampling
    from local_chat.engine.chats import ChatEngine
    from local_chat.prompting import check_system, resolve_template

    prompts = read_prompts(args)  # bad input is told before a model takes minutes to load
    shape, tools = read_schema(args.json_schema), read_tools(args.tools)
    sampling = Sampling(
        args.max_new_tokens, args.temperature, args.top_p, args.top_k, args.repetition_penalty, args.seed
    )
    if args.batch_size < 1:
        raise UserError(f"--batch_size is {args.batch_size}; give 1 or more.")
    check_system(args.template, args.system)  # before the model takes minutes to load, where it can be told
    if args.adapter is not None and args.adapter not in lora_adapters(args.lora):
        raise UserError(f"--adapter {args.adapter!r} names no --lora adapter; load it with --lora {args.adapter}=DIR.")
    engine = load_engine(args)
    batches = range(0, len(prompts), args.batch_size)
    if args.api_base is None:  # so --compile's figures leave the compilation out
        compile_before_answering(engine, {len(prompts[start : start + args.batch_size]) for start in batches})
    template = resolve_template(engine, args.template)
    check_system(template, args.system)  # the default template is the raw prompt for a model without a chat one
    chats = ChatEngine(engine, template)
    records, figures = [], {"encode": 0.0, "generate": 0.0, "decode": 0.0, "input_tokens": 0, "output_tokens": 0}
    started = time.perf_counter()
    for start in progress(batches, len(prompts) > 8 and args.batch_size < len(prompts)):
        batch = prompts[start : start + args.batch_size]
        requests = [prompt_request(template, p, args.system, sampling, shape, tools) for p in batch]
        answers = chats.complete([replace(request, adapter=args.adapter) for request in requests])
        refused = next((a.end.error for a in answers if a.end.caller_error), None)
        if refused:
            raise UserError(refused)
        ends = [answer.end for answer in answers]
        figures["encode"] += ends[0].encode_time
        figures["generate"] += max(end.total_time for end in ends)
        figures["decode"] += sum(end.detokenize_time for end in ends)
        for prompt, answer in zip(batch, answers):
            records.append(
                {
                    "prompt": prompt,
                    "response": answer.text,
                    "reasoning": answer.reasoning,
                    "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in answer.tool_calls],
                    "finish_reason": answer.end.finish_reason,
                    "input_tokens": answer.end.prompt_tokens,
                    "output_tokens": answer.end.completion_tokens,
                }
            )
            figures["input_tokens"] += answer.end.prompt_tokens
            figures["output_tokens"] += answer.end.completion_tokens
    figures["total"] = time.perf_counter() - started
    figures["batch_size"] = args.batch_size
    return records, figures


def read_schema(path: Path | None):
    """--json_schema's file as the `AnswerFormat` every answer follows (None without the flag)."""
    from local_chat.engine import AnswerFormat

    if path is None:
        return None
    try:
        schema = json.loads(path.read_text())
    except OSError as error:
        raise UserError(f"Cannot read the --json_schema file {path} ({error.strerror}); check the path.")
    except ValueError as error:
        raise UserError(f"The --json_schema file {path} is not JSON ({error}); give a JSON schema.")
    if not isinstance(schema, dict):
        raise UserError(f"The --json_schema file {path} holds no JSON object; give a JSON schema.")
    return AnswerFormat("json_schema", schema, path.stem)


def read_tools(path: Path | None) -> list[dict] | None:
    """--tools' file: a list of tools, or an object with one under "tools" (None without the flag)."""
    from local_chat.api.requests import APIError, checked_tools

    if path is None:
        return None
    try:
        tools = json.loads(path.read_text())
        return checked_tools(tools.get("tools") if isinstance(tools, dict) else tools)
    except OSError as error:
        raise UserError(f"Cannot read the --tools file {path} ({error.strerror}); check the path.")
    except ValueError as error:
        raise UserError(f"The --tools file {path} is not JSON ({error}); give a list of tools.")
    except APIError as error:
        raise UserError(f"The --tools file {path}: {error.message}")


def prompt_request(template: str, prompt: str, system: str | None, sampling, answer_format=None, tools=None):
    """The engine request for one prompt: the raw prompt, or a single-turn template's; else one user message (after
    `system`'s) in the conversation `template`, whose answer the engine parses into reasoning, text and calls of
    `tools`. `answer_format`: what the answer must follow (--json_schema's)."""
    from local_chat.engine import ChatOptions, Request
    from local_chat.prompting import single_turn_prompt
    from local_chat.templates.single_turn import TEMPLATE_NAMES

    if template in TEMPLATE_NAMES:
        return Request(single_turn_prompt(prompt, "", template), sampling, answer_format=answer_format)
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": prompt}
    ]
    chat = ChatOptions(template=template, answer_tokens=0, tools=tools)
    return Request(messages=messages, sampling=sampling, chat=chat, answer_format=answer_format)


def progress(items, show: bool):
    if not show:
        return items
    from tqdm import tqdm

    return tqdm(items, desc="batches", file=sys.stderr)


def report(figures: dict) -> str:
    out = figures["output_tokens"]
    return (
        f"batch size {figures['batch_size']} · input tokens {figures['input_tokens']} · output tokens {out}\n"
        f"encode {figures['encode'] * 1000:.1f} ms · generate {figures['generate'] * 1000:.1f} ms · "
        f"decode {figures['decode'] * 1000:.1f} ms · total {figures['total'] * 1000:.1f} ms\n"
        f"{figures['generate'] * 1000 / max(out, 1):.2f} ms per output token · "
        f"{out / figures['generate'] if figures['generate'] > 0 else 0.0:.1f} output tokens/s"
    )


def main(argv=None) -> None:
    try:
        args = parse_args(argv)
        args = check_serving_flags(args)
        records, figures = run(args)
    except UserError as error:
        fail(error)
    for record in records:
        thinking = f"Thinking:\n{record['reasoning']}\n\n" if record["reasoning"] else ""
        calls = "".join(f"Tool call: {c['name']}({c['arguments']})\n" for c in record["tool_calls"])
        print(f"### {record['prompt']}\n{thinking}{record['response']}\n{calls}")
    if args.output is not None:
        args.output.write_text("".join(json.dumps(r) + "\n" for r in records))
    print(report(figures))


if __name__ == "__main__":
    main()
