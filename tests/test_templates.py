"""Prompt templates: Accessory's strings byte for byte, and the tokenizer's own chat template."""

import pytest

from local_chat.errors import UserError
from local_chat.templates.multi_turn import (
    ChatTemplateConversation,
    conv_templates,
    default_conversation,
    get_conversation,
    template_names,
)
from local_chat.templates.single_turn import format_prompt

ALPACA = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the "
    "request.\n\n### Instruction:\n{I}\n\n### Response:"
)
ALPACA_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n### Instruction:\n{I}\n\n### Input:\n"
    "{X}\n\n### Response:"
)
DEFAULT_CHAT = (
    "A chat between a curious human and an artificial intelligence assistant. The assistant gives "
    "helpful, detailed, and polite answers to the human's questions.\n\n### Human: Q1\n### Assistant: "
    "A1\n### Human: Q2\n### Assistant:"
)


def test_alpaca_without_input():
    assert format_prompt({"instruction": "Say hi"}, sys_name="alpaca") == ALPACA.format(I="Say hi")
    assert format_prompt({"instruction": "Say hi"}) == ALPACA.format(I="Say hi")


@pytest.mark.parametrize("blank", [None, "", "   ", "\n"])
def test_alpaca_blank_input_is_no_input(blank):
    assert format_prompt({"instruction": "Say hi", "input": blank}, "alpaca") == ALPACA.format(I="Say hi")


def test_alpaca_with_input():
    got = format_prompt({"instruction": "Translate", "input": "Bonjour"}, "alpaca")
    assert got == ALPACA_INPUT.format(I="Translate", X="Bonjour")


def test_other_single_turn_templates():
    assert format_prompt({"instruction": "Paris"}, "shortqa") == ALPACA.format(I="Paris").replace(
        "completes the request.", "completes the request using a single word or phrase."
    )
    assert format_prompt({"instruction": "Paris"}, "qg") == "Generate a question whose answer is:\nParis\n\nQuestion:\n"
    assert format_prompt({"instruction": "Paris"}, "caption") == ""
    assert format_prompt({"instruction": "Paris {x}"}, "None") == "Paris {x}"


def test_unknown_single_turn_template_names_the_known_ones():
    with pytest.raises(UserError, match="alpaca, shortqa, qg, caption, None"):  # a ValueError, as in Accessory
        format_prompt({"instruction": "x"}, "vicuna")


def test_default_conversation_exact():
    conv = default_conversation()
    conv.load_qas([["Q1", "A1"], ["Q2", None]])
    assert conv.get_prompt() == DEFAULT_CHAT
    assert conv.response_end_signal == "\n###"


def test_conv_templates_are_fresh_factories():
    assert set(conv_templates) == {"default", "v1", "simple", "multimodal", "llava_v1", "vicuna_v1_1", "bair_v1"}
    first = conv_templates["default"]()
    first.append_message("Human", "hello")
    assert conv_templates["default"]().messages == []


def test_vicuna_two_separator_style_matches_accessory():
    conv = conv_templates["vicuna_v1_1"]()
    conv.load_qas([["Q1", "A1"], ["Q2", None]])
    system = (
        "A chat between a curious user and an artificial intelligence assistant. The assistant gives "
        "helpful, detailed, and polite answers to the user's questions."
    )
    # Accessory puts the separator after the system prompt and a space before each role: the double space is theirs.
    assert conv.get_prompt() == system + "  USER: Q1  ASSISTANT: A1</s> USER: Q2  ASSISTANT:"
    assert conv.response_end_signal == "</s>"


def test_only_the_last_answer_may_be_missing():
    conv = default_conversation()
    conv.load_qas([["Q1", None], ["Q2", None]])
    with pytest.raises(ValueError, match="last message"):
        conv.get_prompt()


def test_chat_template_conversation_derives_its_stop_from_the_template(byte_tokenizer):
    conv = ChatTemplateConversation(byte_tokenizer, system="Be brief.")
    conv.load_qas([["Q1", "A1"], ["Q2", None]])
    assert conv.get_prompt() == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n"
        "<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert conv.response_end_signal == "<|im_end|>"


def test_chat_template_without_end_marker_stops_at_next_user_header(byte_tokenizer):
    import copy

    tokenizer = copy.deepcopy(byte_tokenizer)
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'user' %}{{ '\\n### Human: ' + m['content'] }}"
        "{% else %}{{ '\\n### Assistant: ' + m['content'] }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '\\n### Assistant:' }}{% endif %}"
    )
    conv = ChatTemplateConversation(tokenizer)
    assert conv.stop_symbols[0] == "\n### Human:"


def test_chat_template_with_accessory_separator_keeps_its_newline(byte_tokenizer):
    import copy

    tokenizer = copy.deepcopy(byte_tokenizer)
    tokenizer.chat_template = (
        "{{ 'SYS\\n\\n###' }}{% for m in messages %}{% if m['role'] == 'user' %}"
        "{{ ' Human: ' + m['content'] + '\\n###' }}{% else %}"
        "{{ ' Assistant: ' + m['content'] + '\\n###' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ ' Assistant:' }}{% endif %}"
    )
    assert ChatTemplateConversation(tokenizer).response_end_signal == "\n###"


def test_template_names_offer_chat_template_only_when_the_tokenizer_has_one(byte_tokenizer):
    assert "chat_template" in template_names(byte_tokenizer)
    assert "chat_template" not in template_names(None)
    with pytest.raises(ValueError, match="default, simple"):
        get_conversation("chatml")
    assert get_conversation("default", system="Short.").get_prompt().startswith("Short.\n\n###")


def test_template_mistakes_are_user_errors_that_accessory_callers_catch_as_value_errors():
    assert issubclass(UserError, ValueError)
    with pytest.raises(UserError, match="Unknown conversation template 'chatml'"):
        get_conversation("chatml")


@pytest.mark.parametrize(
    "name, written",
    [
        ("qwen2_vl", "You are a helpful assistant."),
        ("ministral3", "# HOW YOU SHOULD THINK AND ANSWER"),
        ("smollm3", ""),  # it reads flags in a system prompt: its own, sent as one, would change the prompt
        ("llama3_1", ""),  # its system block holds dates only
        ("qwen3", ""),  # no system block without a system prompt
    ],
)
def test_the_system_prompt_a_chat_template_writes_itself_is_the_pages_default(name, written):
    """The page's system prompt box shows what the template sends where the conversation has none; sent as the
    conversation's own system prompt, it gives the same prompt."""
    from pathlib import Path

    from fixtures import tiny_models

    tokenizer = tiny_models.train_byte_level_tokenizer()
    tokenizer.chat_template = (Path(__file__).parent / "chat_templates" / f"{name}.jinja").read_text()
    shown = ChatTemplateConversation(tokenizer).template_system()
    assert shown.startswith(written) and (shown == "") == (written == "")
    question = [{"role": "user", "content": "Hi"}]
    assert ChatTemplateConversation(tokenizer, shown).render_messages(question) == ChatTemplateConversation(
        tokenizer
    ).render_messages(question)
