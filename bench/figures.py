"""Every figure the CPU suite writes: what it measures and its goal."""

from __future__ import annotations

import importlib.util

from bench.settings import Settings

# name: (what it is, goal as (comparison, value) or None for a figure reported beside a goal)
FIGURES = {
    "stream_vs_generate": ("tokens/s of stream_generate over bare model.generate, ~100M random Llama", (">=", 0.97)),
    "stream_vs_generate_demo": ("the same on the demo model", (">=", 0.97)),
    "textiteratorstreamer_vs_generate": (
        "transformers' TextIteratorStreamer + thread over bare generate (the peers' way), ~100M random Llama",
        None,
    ),
    "quant4_footprint": (
        "transformer blocks' bytes with --quant 4 over bf16 on the CPU (int4, groups of 64; llama.cpp's Q4_0: 0.281), "
        "~0.5B random Llama",
        ("<=", 0.29),
    ),
    "quant8_footprint": ("the same with --quant 8 (int8; Q8_0: 0.531)", ("<=", 0.53)),
    "quant4_footprint_whole": ("whole model with --quant 4 over bf16 (embeddings, lm_head stay 16-bit)", None),
    "quant8_footprint_whole": ("whole model with --quant 8 over bf16", None),
    "ui_ttft_overhead_ms": (
        "the app's extra time to first piece over HTTP (Gradio's /call stream), minus a bare Gradio "
        "endpoint's (300-token answers of a random Llama the demo model's size)",
        ("<=", 20),
    ),
    "ui_token_rate_ratio": (
        "answer tokens/s a gradio_client sees from the app over from the bare endpoint",
        (">=", 0.97),
    ),
    "gradio_ttft_overhead_ms": ("Gradio alone: time to first piece over HTTP over the endpoint's own", None),
    "gradio_rate_ratio": ("Gradio + gradio_client alone: tokens/s seen over tokens/s yielded", None),
    "ttft_history_ratio": (
        "time to first piece at a turn with a long history over turn 1, KV cache kept between "
        "turns, ~100M random Llama",
        ("<=", 1.5),
    ),
    "ttft_history_ratio_compile": (
        "the same with --compile (the session's keys and values copied into the static cache)",
        ("<=", 1.5),
    ),
    "ttft_history_ratio_naive": ("the same, the whole history prefilled again (what the peers do)", None),
    "ttft_history_ratio_batch": (
        "the same in the continuous batch, beside another answer (the history's pages of the paged cache reused)",
        ("<=", 1.5),
    ),
    "cache_history_tokens": ("tokens in the prompt of that turn", None),
    "compile_decode_ratio": (
        "turn 1's answer tokens/s with --compile over without (the CPU; a compiled step attends "
        "over its whole static cache)",
        None,
    ),
    "load_clients_over_one_client": (
        "8 clients at once, 3-turn conversations each, demo app (batching, its default): wall time over one "
        "client asking the same conversations one after another",
        None,
    ),
    "load_one_at_a_time_over_one_client": ("the same with --concurrency 1 (one answer at a time)", None),
    "load_wait_p90_over_alone": (
        "time to first piece of the slowest tenth of those requests over a request's alone",
        None,
    ),
    "load_wait_p90_over_alone_one_at_a_time": ("the same with --concurrency 1 (queued)", None),
    "api_ttft_overhead_ms": (
        "the /v1 API's extra time to first text through the openai client, over the engine's own stream "
        "(200-token answers of a random Llama the demo model's size)",
        ("<=", 10),
    ),
    "api_token_rate_ratio": ("tokens/s the openai client sees from /v1 over the engine's own stream", (">=", 0.97)),
    "api_over_serve_ttft": (
        "time to first token, /v1 over `transformers serve` on the same folder, one client (lower is faster)",
        ("<=", 1.0),
    ),
    "api_over_serve_token_rate": ("tokens/s, /v1 over `transformers serve`, one client", (">=", 1.0)),
    "api_ttft_ms": ("/v1's time to first token, one client", None),
    "serve_ttft_ms": ("`transformers serve`'s", None),
    "api_crowd_tokens_per_s": ("8 clients at once: /v1's aggregate answer tokens/s", None),
    "serve_crowd_tokens_per_s": ("the same for `transformers serve` (without --continuous-batching)", None),
    "api_over_serve_crowd": ("the two over each other", None),
    "batching_crowd_over_alone": (
        "8 clients at once over one client alone, total answer tokens/s through the openai client, the app with "
        "batching (its default), a random Llama the demo model's size, 200-token answers",
        (">=", 3.0),
    ),
    "batching_over_serve_cb": (
        "its 8 clients' tokens/s over `transformers serve --continuous-batching`'s",
        (">=", 1.0),
    ),
    "batching_alone_over_one_at_a_time": (
        "one client alone: the app with batching over the app with --concurrency 1",
        (">=", 0.97),
    ),
    "batching_wait_p90_over_alone": (
        "time to first token of the slowest tenth of the 8 clients' requests over a request's alone",
        ("<=", 3.0),
    ),
    "batching_crowd_tokens_per_s": ("the app's 8 clients, total answer tokens/s", None),
    "serve_cb_crowd_tokens_per_s": ("`transformers serve --continuous-batching`'s", None),
    "serve_cb_crowd_over_alone": ("its 8 clients over its one client alone", None),
    "serve_cb_wait_p90_over_alone": ("its slowest tenth's time to first token over its one client's", None),
    "batching_crowd_over_alone_100m": ("the same four on a ~100M random Llama", (">=", 3.0)),
    "batching_over_serve_cb_100m": ("", (">=", 1.0)),
    "batching_alone_over_one_at_a_time_100m": ("", (">=", 0.97)),
    "batching_wait_p90_over_alone_100m": ("", ("<=", 3.0)),
    "batching_crowd_tokens_per_s_100m": ("", None),
    "serve_cb_crowd_tokens_per_s_100m": ("", None),
    "serve_cb_crowd_over_alone_100m": ("", None),
    "serve_cb_wait_p90_over_alone_100m": ("", None),
    "batching_mla_crowd_over_alone": (
        "8 answers at once over one alone, total answer tokens/s in the model's process (200-token greedy answers), "
        "tiny random DeepSeek V3.1 (multi-head latent attention: the step batch)",
        (">=", 2.5),
    ),
    "batching_mamba_crowd_over_alone": ("the same, tiny random Granite 4 (Mamba layers: the step batch)", (">=", 2.5)),
    "batching_conv_crowd_over_alone": ("the same, tiny random LFM2 (convolution layers: the step batch)", (">=", 2.5)),
    "batching_linear_crowd_over_alone": (
        "the same, tiny random Qwen3.5 (linear attention: the step batch)",
        (">=", 2.5),
    ),
    "batching_plain_crowd_over_alone": ("the same, tiny random Llama 3.1 (transformers' continuous batching)", None),
    "batching_plain_step_over_paged": (
        "tiny Llama 3.1, 8 at once: the step batch's tokens/s over transformers' continuous batching's",
        None,
    ),
    "batching_mla_crowd_tokens_per_s": ("total answer tokens/s of the 8 at once, per kind", None),
    "batching_mamba_crowd_tokens_per_s": ("", None),
    "batching_conv_crowd_tokens_per_s": ("", None),
    "batching_linear_crowd_tokens_per_s": ("", None),
    "batching_plain_crowd_tokens_per_s": ("", None),
    "remote_ttft_overhead_ms": (
        "the app in front of an engine (--api_base): its /v1's extra time to first text over the engine's own stream, "
        "through the openai client; the engine our own app on a random Llama the demo model's size, 200-token answers",
        ("<=", 15),
    ),
    "remote_token_rate_ratio": ("tokens/s through the front over the engine's own", (">=", 0.97)),
    "remote_ttft_overhead_ms_serve": ("the same in front of `transformers serve`", ("<=", 15)),
    "remote_token_rate_ratio_serve": ("", (">=", 0.97)),
    "reasoning_parse_token_rate_ratio": (
        "tokens/s of a /v1 chat stream of a forced 256-token reasoning + answer, parsed into reasoning and answer, "
        "over the same tokens streamed unparsed (a completion of the same prompt); a random Qwen3 the demo model's "
        "size with Qwen3's template",
        (">=", 0.97),
    ),
    "front_start_s": (
        "seconds from `python app.py --api_base URL` (no model here; a stub engine) starting to its first 200 on `/`, "
        "alone; the goal is met by this or the next",
        ("<=", 3),
    ),
    "front_start_over_gradio_import_s": (
        'the same minus `python -c "import gradio"`\'s seconds, measured in turns with it',
        ("<=", 1),
    ),
    "structured_one_over_free": (
        "answer tokens/s held to a JSON schema (llguidance's mask each step) over free, one request, greedy, a random "
        "Llama the demo model's size, 64-token answers",
        (">=", 0.9),
    ),
    "structured_eight_over_free": (
        "the same, 8 requests at once: the free ones in transformers' continuous batch, the held ones in the step "
        "batch beside it, each row with its own grammar",
        (">=", 0.9),
    ),
    "step_batch_forward_ms": ("ms of the model's forward pass in a step of those 8 held answers (median)", None),
    "step_batch_own_ms": (
        "ms the step batch adds to that step: each row's mask, sampling and stop checks, the step's inputs (median)",
        None,
    ),
    "structured_one_over_free_100m": ("the same as the first, ~100M random Llama", (">=", 0.9)),
    "structured_eight_over_free_100m": ("the same as the second, ~100M random Llama", (">=", 0.9)),
    "step_batch_forward_ms_100m": ("the forward pass of a step of 8 held answers, ~100M random Llama", None),
    "step_batch_own_ms_100m": ("what the step batch adds to it, ~100M random Llama", None),
    "structured_compile_20_fields_ms": (
        "ms to compile a 20-field JSON schema for the demo model's tokenizer (absolute, this machine)",
        ("<=", 50),
    ),
    "structured_compile_cached_ms": ("the same schema again, from the cache of 64 compiled grammars", None),
    "llguidance_mask_us_small_vocab": ("microseconds of llguidance's mask per token, 1,024-token vocabulary", None),
    "llguidance_mask_us_qwen_vocab": ("the same, 151,936-token vocabulary (Qwen's size)", None),
    "xgrammar_mask_us_small_vocab": ("xgrammar's, the same walk (only where xgrammar is installed)", None),
    "xgrammar_mask_us_qwen_vocab": ("xgrammar's, 151,936-token vocabulary", None),
    "xgrammar_compile_20_fields_ms": ("xgrammar's compile of the 20-field schema (ms, this machine)", None),
    "models_switch_cold_s": (
        "--models_dir: seconds from asking for the demo model while another is loaded (--max_loaded_models 1) to its "
        "answer's first text: the other unloaded, the demo model loaded in a fresh process (absolute, this machine)",
        None,
    ),
    "models_ttft_after_switch_ms_more": (
        "two models loaded: ms more to the first text of an answer right after one from the other model than right "
        "after one from the same model",
        ("<=", 50),
    ),
    "tools_round_page_ms": (
        "--mcp_config: ms from the model's last token of a tool call to the first token of the answer after its "
        "result, minus the tool's own time (the cards, saves, the request rendered again and prefilled); a random "
        "Qwen3 the demo model's size, a stdio MCP server, the call always allowed",
        ("<=", 50),
    ),
    "documents_pdf_ms_per_page": (
        "ms to read a page of a 50-page PDF with pypdfium2 (the app's), best of the repeats",
        None,
    ),
    "documents_pypdf_ms_per_page": ("the same with pypdf (only where it is installed: the tests' tools)", None),
    "documents_docx_ms_per_page": ("ms per page (3,000 characters) of the same text as a .docx, python-docx", None),
    "documents_index_500_pages_ms": ("ms to cut a 500-page text into passages and index them (SQLite FTS5)", None),
    "documents_search_500_pages_ms": (
        "ms to find the passages of those 500 pages that answer a question (BM25), the needle's first",
        ("<=", 100),
    ),
    "documents_ttft_attached_over_typed": (
        "time to first piece of a question with a 5-page PDF attached (read, put in whole) over the same text typed "
        "in, demo model",
        None,
    ),
    "web_send_to_first_token_s": (
        "seconds from Send to the first token with Search the web on (a local SearXNG API, real pages on 127.0.0.1), "
        "demo model",
        None,
    ),
    "web_search_and_fetch_s": ("of which the search and the pages' fetches (read with trafilatura)", None),
    "web_typed_to_first_token_s": ("the same prompt, the passages typed in: Send to first token, no search", None),
    "web_own_ms": (
        "the app's own ms of Send to first token with the web on, beyond the search, the fetches and the model's "
        "prefill of the passages (the query, ranking, the prompt built, the Sources)",
        ("<=", 300),
    ),
    "web_rank_50_pages_ms": (
        "ms to rank the passages of 50 fetched pages for a question (BM25) and keep the best within the budget",
        ("<=", 100),
    ),
    "voice_first_sentence_to_audio_ms": (
        "Speak answers: ms from the page's update whose answer first holds a whole sentence to the update that "
        "carries its clip (espeak-ng, demo model)",
        ("<=", 300),
    ),
    "voice_espeak_sentence_ms": ("espeak-ng speaking that sentence alone, ms", None),
    "voice_whisper_tiny_rtf": (
        "transcription's real-time factor (seconds over the recording's), a random Whisper of openai/whisper-tiny's "
        "shape (30 s window), greedy",
        None,
    ),
    "voice_pipeline_whisper_tiny_rtf": ("the same through transformers' pipeline, greedy", None),
    "voice_transcribe_over_pipeline": (
        "transformers' pipeline's seconds over ours, both greedy (>1: ours faster)",
        None,
    ),
    "voice_transcribe_over_pipeline_default": (
        "the pipeline's seconds with its default (five beams) over ours (greedy)",
        None,
    ),
    "history_fill_s": ("seconds to save those conversations (three turns each, one at a time)", None),
    "history_search_ms": (
        "the sidebar's search over 10,000 saved conversations of one login (three turns each): ms, the median of the "
        "slowest kind of query (a rare word or a common one, each whole or its first letters as typed, two words)",
        ("<=", 50),
    ),
    "history_search_rare_ms": ("the same for a word of one conversation only", None),
    "history_open_200_handler_ms": (
        "opening a conversation of 200 messages with 20 branches: ms of the page's handler (read, entries, view, "
        "list, the controls under the messages)",
        None,
    ),
    "history_open_200_paint_ms": (
        "the same in Chromium: ms from the click in the sidebar to its last message painted, the first paint "
        "(where Chromium is installed)",
        ("<=", 100),
    ),
    "history_open_200_all_ms": ("the same to all its 200 messages painted (the rest comes right after)", None),
    "adapters_switch_ms_more": (
        "switching LoRA adapters on a loaded base: ms more to the first token of an answer with adapter a right "
        "after one with b than after one with a (~100M random Llama, two rank-16 adapters on every linear layer)",
        None,
    ),
    "adapters_decode_unmerged_over_base": (
        "decode tokens/s with an adapter (--lora, PEFT's pairs beside the layers) over the base alone",
        (">=", 0.8),
    ),
    "adapters_decode_merged_over_base": ("the same with the adapter merged (--merge_lora)", (">=", 0.97)),
    "speculative_quote_over_plain": (
        "--speculative ngram over off: decode tokens/s of a 200-token answer quoting a 1,600-token document of the "
        "question (the demo model, its choice forced to quote: its forward passes whole)",
        (">=", 1.8),
    ),
    "speculative_quote_accepted": ("the share of guessed tokens taken in that answer", None),
    "speculative_chat_over_plain": (
        "the same for the demo model's own answers to eight chat questions (nothing forced)",
        (">=", 0.97),
    ),
    "speculative_chat_accepted": ("the share of guessed tokens taken in those answers", None),
    "speculative_draft_chat_over_plain": (
        "--draft_model over none: the same chat answers from the demo model deepened 10 times (its added layers "
        "adding nothing: its answers at 10x the compute), the demo model its draft",
        (">=", 1.5),
    ),
    "speculative_draft_accepted": ("the share of the draft's guesses taken", None),
    "cpu_copy_gbs": (
        "this machine's memory bandwidth: GB/s torch's copy of 512 MiB reads and writes (2 threads)",
        None,
    ),
    "cpu_default_over_llamacpp_bf16": (
        "the default launch's decode tokens/s over llama.cpp's on the same weights as GGUF bf16 (bench/cpu.py: "
        "/v1/completions of each server, greedy 161-token answers; a random Llama of Qwen2.5-0.5B's shape, 32k "
        "vocabulary; ours --speculative off)",
        (">=", 0.8),
    ),
    "cpu_bf16_over_llamacpp_bf16": ("--dtype bf16 over llama.cpp's GGUF bf16", (">=", 1.0)),
    "cpu_quant8_over_llamacpp_q8_0": ("--quant 8 over llama.cpp's GGUF Q8_0", (">=", 1.0)),
    "cpu_quant4_over_llamacpp_q4_0": ("--quant 4 over llama.cpp's GGUF Q4_0", (">=", 1.0)),
    "cpu_first_token_1000_over_llamacpp": (
        "time to the first token of a new 1,000-token prompt, the default launch over llama.cpp bf16",
        ("<=", 1.0),
    ),
    "cpu_default_tok_s": ("the default launch's decode tokens/s", None),
    "cpu_bf16_tok_s": ("--dtype bf16's", None),
    "cpu_quant8_tok_s": ("--quant 8's", None),
    "cpu_quant4_tok_s": ("--quant 4's", None),
    "cpu_llamacpp_bf16_tok_s": ("llama.cpp's, GGUF bf16", None),
    "cpu_llamacpp_q8_0_tok_s": ("llama.cpp's, GGUF Q8_0", None),
    "cpu_llamacpp_q4_0_tok_s": ("llama.cpp's, GGUF Q4_0", None),
    "cpu_default_read_gbs": ("GB/s of weights the default launch reads (bf16 weights x tokens/s)", None),
    "cpu_llamacpp_bf16_read_gbs": ("GB/s of weights llama.cpp reads from its bf16 file", None),
    "cpu_page_ms_idle": ("ms to GET our page, idle", None),
    "cpu_page_ms_decoding": ("ms to GET our page while an answer decodes (the model's threads on every core)", None),
    "gguf_bf16_over_llamacpp": (
        "a GGUF bf16 file served by our app (--pretrained_path FILE.gguf: llama.cpp inside it) over llama.cpp's own "
        "server on the same file: decode tokens/s through /v1/completions (bench/gguf.py; bench/cpu.py's 0.5B shape)",
        (">=", 0.97),
    ),
    "gguf_q8_0_over_llamacpp": ("the same for the file in Q8_0", (">=", 0.97)),
    "gguf_bf16_first_token_extra_ms": (
        "ms our app adds to the first token of a new 32-token prompt, the bf16 file",
        ("<=", 20.0),
    ),
    "gguf_q8_0_first_token_extra_ms": ("the same, the Q8_0 file", ("<=", 20.0)),
    "gguf_bf16_tok_s": ("our app's decode tokens/s, the bf16 file", None),
    "gguf_llamacpp_bf16_tok_s": ("llama.cpp's server's, the bf16 file", None),
    "gguf_q8_0_tok_s": ("our app's, the Q8_0 file", None),
    "gguf_llamacpp_q8_0_tok_s": ("llama.cpp's server's, the Q8_0 file", None),
    "models_memory_after_unload_ratio": (
        "memory (RSS) of the app's processes once its models are unloaded over before any loaded",
        ("<=", 1.05),
    ),
}
CPU_SECOND_SHAPE = "_1.5b"  # bench/cpu.py's figures at its second shape end so: the shape's own, not the machine's
FIGURES.update(
    {
        f"{name}{CPU_SECOND_SHAPE}": ("the same at Qwen2.5-1.5B's shape", goal)
        for name, (_, goal) in list(FIGURES.items())
        if name.startswith("cpu_") and ("_over_" in name or name.endswith("_tok_s"))
    }
)
SECOND_SHAPE = "_100m"  # the batching figures of its second shape end so


def expected_figures(settings: Settings) -> set[str]:
    """The figures a run of every benchmark with `settings` writes (--smoke batches one shape only)."""
    with_xgrammar = importlib.util.find_spec("xgrammar") is not None  # bench/structured.py compares it if installed
    with_pypdf = importlib.util.find_spec("pypdf") is not None  # and bench/documents.py pypdf
    from bench.history import chromium_path

    with_chromium = chromium_path() is not None  # bench/history.py's page figure
    with_llamacpp = importlib.util.find_spec("xllamacpp") is not None  # bench/cpu.py's peer
    return {
        name
        for name in FIGURES
        if (len(settings.batching_shapes) > 1 or not name.endswith(SECOND_SHAPE))
        and (with_llamacpp or not name.startswith(("cpu_", "gguf_")))
        and (len(settings.cpu_shapes) > 1 or not name.endswith(CPU_SECOND_SHAPE))
        and (with_xgrammar or not name.startswith("xgrammar_"))
        and (with_pypdf or name != "documents_pypdf_ms_per_page")
        and (with_chromium or name not in ("history_open_200_paint_ms", "history_open_200_all_ms"))
    }
